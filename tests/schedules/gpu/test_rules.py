"""Our GPU schedule rules (schedules/gpu/): numerics on WebGPU (lavapipe) against the unscheduled
kernel on llvm, CUDA code through nvcc/ptxas for sm_80 and sm_90 (no spills), Metal source
generated, the knob protocol, and the rules declining what they do not handle.

Each target is scheduled in its own subprocess where a module is shared between targets
(TVM breaks the second target otherwise); kernels here are scheduled from fresh copies.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest
import tvm

from mlcpipe.kernel_info import random_args
from mlcpipe.quantization import TOLERANCE
from mlcpipe.runners.webgpu import lavapipe as runner
from mlcpipe.targets import load_target
from mlcpipe.schedules.gpu import CUDA_RULES, METAL_RULES, WEBGPU_RULES
from mlcpipe.backends.cuda import find_nvcc
from mlcpipe.schedules.gpu.gemv_dequant import DOT8, DOT8_SOURCE, GEMVDequant, unpack_by_bits, with_device_functions

from tests.helpers import REPO
from tests.helpers.gpu_kernels import DECODE_GEMV, copy_func, decode_gemvs, fused_kernels, is_static, run_llvm


def check_on_lavapipe(rule, name: str, func: tvm.tirx.PrimFunc, seed: int = 0) -> float:
    """Schedule `func` with `rule` for webgpu, run it on lavapipe, compare with llvm; rel err."""
    target = load_target("webgpu").tvm_target()
    with target:
        sch = rule.apply(copy_func(func), target, False)
    assert sch is not None, f"{type(rule).__name__} declined {name}"
    scheduled = sch.mod["main"]
    assert "thread_binding" in scheduled.script()
    args = random_args(func, {}, seed=seed)
    want = run_llvm(func, [a.copy() for a in args])[-1]
    got = runner.run_primfunc(scheduled, target, [a.copy() for a in args])[-1]
    assert got.shape == want.shape and got.dtype == want.dtype
    scale = np.abs(want.astype(np.float64)).max()
    err = np.abs(got.astype(np.float64) - want.astype(np.float64)).max() / scale
    tol = TOLERANCE[str(want.dtype)]
    assert np.isfinite(got.astype(np.float64)).all() and scale > 0, name
    assert err <= tol, f"{name} {rule}: rel err {err:.2e} > {tol}"
    return err


# ---- GEMVDequant: numerics on lavapipe ----------------------------------------------------------

GEMV_KNOBS = [
    {},  # the webgpu defaults
    dict(threads=32, rows=4, vec=4, unroll=4),  # the CUDA / Metal defaults
    dict(threads=8, rows=2, vec=1, unroll=1),
    dict(threads=4, rows=1, vec=2, unroll=8),
]


@pytest.mark.lavapipe
@pytest.mark.parametrize("quant", ["q4f16_1", "q4f32_1", "q0f16"])
def test_gemv_dequant_tiny_model_on_lavapipe(quant):
    kernels = decode_gemvs(fused_kernels("llama-tiny", quant))
    assert len(kernels) >= 4, sorted(kernels)
    base = GEMVDequant.for_target("webgpu")
    for knobs in GEMV_KNOBS if quant == "q4f16_1" else GEMV_KNOBS[:3:2]:
        rule = dataclasses.replace(base, **knobs)
        for name, func in sorted(kernels.items()):
            check_on_lavapipe(rule, name, func)


FULL_SIZE = [  # (quant, kernel of Llama-3.2-1B): o_proj N=2048 K=2048, gate_up N=16384 K=2048
    ("q4f16_1", "fused_dequantize1_NT_matmul1_cast1_add"),
    ("q4f16_1", "fused_dequantize2_NT_matmul2_cast2"),
    ("q4f32_1", "fused_dequantize1_NT_matmul1_add"),
    ("q0f16", "fused_NT_matmul1_cast1_add"),
]


@pytest.fixture(scope="module")
def full_size_kernels():
    cache: dict[str, dict] = {}

    def get(quant: str) -> dict[str, tvm.tirx.PrimFunc]:
        if quant not in cache:
            cache[quant] = decode_gemvs(fused_kernels("llama-3.2-1b", quant))
        return cache[quant]

    return get


@pytest.mark.lavapipe
@pytest.mark.parametrize("quant, name", FULL_SIZE)
def test_gemv_dequant_full_size_on_lavapipe(full_size_kernels, quant, name):
    func = full_size_kernels(quant)[name]
    check_on_lavapipe(GEMVDequant.for_target("webgpu"), name, func)


# ---- CUDA (nvcc / ptxas, sm_80 + sm_90) and Metal (MSL), each target in its own process ---------

_COMPILE = r"""
import dataclasses, json, sys
import tvm
from tests.helpers.gpu_kernels import decode_gemvs, fused_kernels
from mlcpipe.targets import load_target
from mlcpipe.schedules.gpu.gemv_dequant import GEMVDequant

kind, model = sys.argv[1], sys.argv[2]
target = load_target(kind).tvm_target()
sources, launches = [], {}
for quant in ("q4f16_1", "q4f32_1", "q0f16"):
    variants = (("default", {}), ("alt", dict(threads=16, rows=8, vec=2, unroll=8)))
    for variant, knobs in variants if quant == "q4f16_1" else variants[:1]:
        rule = dataclasses.replace(GEMVDequant.for_target(kind), **knobs)
        for name, func in sorted(decode_gemvs(fused_kernels(model, quant, kind)).items()):
            symbol = f"{quant}_{variant}_{name}"
            with target:
                sch = rule.apply(func, target, False)
                assert sch is not None, symbol
                lib = tvm.compile(tvm.IRModule({symbol: sch.mod["main"].with_attr("global_symbol", symbol)}), target=target)
            sources.append(str(lib.mod.imports[0].inspect_source()))
            launches[symbol] = list(rule._fit(rule._match(func, target), target))
out = {"launches": launches}
if kind == "cuda":
    from mlcpipe.backends.cuda import ptxas_report
    head = sources[0]
    body = [s[s.index('extern "C"'):] for s in sources[1:]]
    out["ptxas"] = ptxas_report("\n".join([head, *body]), ["sm_80", "sm_90"])
else:
    out["source"] = "\n".join(sources)
print("RESULT" + json.dumps(out))
"""


@pytest.fixture(scope="module")
def compiled():
    """Start the CUDA and Metal compiles (Llama-3.2-1B decode GEMVs, three quantizations, two knob
    settings) in parallel subprocesses; tests wait for the one they need."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]), "TVM_NUM_THREADS": "1"}
    procs = {
        kind: subprocess.Popen([sys.executable, "-c", _COMPILE, kind, "llama-3.2-1b"], cwd=REPO, env=env,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for kind in ("cuda", "metal")
    }  # fmt: skip
    results: dict[str, dict] = {}

    def get(kind: str) -> dict:
        if kind not in results:
            out, _ = procs[kind].communicate(timeout=900)
            assert procs[kind].returncode == 0, out[-4000:]
            results[kind] = json.loads(out[out.rindex("RESULT") + len("RESULT"):])
        return results[kind]

    yield get
    for proc in procs.values():
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.mark.nvcc
def test_gemv_dequant_cuda_compiles_without_spills(compiled):
    result = compiled("cuda")
    assert len(result["launches"]) == 4 * 5
    kernels = {k: v for k, v in result["ptxas"].items()}
    for symbol in result["launches"]:
        stats = kernels[f"{symbol}_kernel"]
        for arch in ("sm_80", "sm_90"):
            assert 0 < stats[arch]["registers"] <= 128, (symbol, arch, stats)
            assert stats[arch]["spill_stores"] == 0 and stats[arch]["spill_loads"] == 0, (symbol, arch, stats)


def test_gemv_dequant_metal_source(compiled):
    result = compiled("metal")
    msl = result["source"]
    for symbol in result["launches"]:
        assert re.search(rf"kernel void {symbol}_kernel\(", msl), symbol
    assert "simd_shuffle_down" in msl  # the row reduction uses simdgroup shuffles
    assert "device uint4*" in msl  # 16-byte loads of the packed weights


# ---- what the rule declines, the knob protocol ----------------------------------------------------

from tvm.script import tirx as T  # noqa: E402


@T.prim_func(s_tir=True)
def _symbolic_k(a: T.handle, w: T.handle, c: T.handle):
    k = T.int64()
    A = T.match_buffer(a, (T.int64(1), T.int64(1), k), "float16")
    W = T.match_buffer(w, (T.int64(256), k), "float16")
    C = T.match_buffer(c, (T.int64(1), T.int64(1), T.int64(256)), "float32")
    for i0, i1, i2, kk in T.grid(T.int64(1), T.int64(1), T.int64(256), k):
        with T.sblock("NT_matmul"):
            v0, v1, v2, vk = T.axis.remap("SSSR", [i0, i1, i2, kk])
            with T.init():
                C[v0, v1, v2] = T.float32(0)
            C[v0, v1, v2] = C[v0, v1, v2] + T.Cast("float32", A[v0, v1, vk]) * T.Cast("float32", W[v2, vk])


@T.prim_func(s_tir=True)
def _many_rows(A: T.Buffer((T.int64(1), T.int64(64), T.int64(256)), "float16"), W: T.Buffer((T.int64(128), T.int64(256)), "float16"), C: T.Buffer((T.int64(1), T.int64(64), T.int64(128)), "float32")):
    for i0, i1, i2, k in T.grid(T.int64(1), T.int64(64), T.int64(128), T.int64(256)):
        with T.sblock("NT_matmul"):
            v0, v1, v2, vk = T.axis.remap("SSSR", [i0, i1, i2, k])
            with T.init():
                C[v0, v1, v2] = T.float32(0)
            C[v0, v1, v2] = C[v0, v1, v2] + T.Cast("float32", A[v0, v1, vk]) * T.Cast("float32", W[v2, vk])


@pytest.fixture(scope="module")
def tiny_q4():
    return fused_kernels("llama-tiny", "q4f16_1")


def test_gemv_dequant_declines_what_it_does_not_handle(tiny_q4):
    webgpu = load_target("webgpu").tvm_target()
    rule = GEMVDequant.for_target("webgpu")
    prefill = [n for n, f in tiny_q4.items() if DECODE_GEMV.fullmatch(n) and not is_static(f)]
    others = [n for n in tiny_q4 if re.fullmatch(r"rms_norm\d*|fused_split\d*_silu\d*_multiply\d*|take_dequantize|fused_rope", n)]
    assert prefill and len(others) >= 4
    with webgpu:
        for name in prefill + others:
            assert rule.apply(copy_func(tiny_q4[name]), webgpu, False) is None, name
            assert rule.knob_space(copy_func(tiny_q4[name]), webgpu) == {}, name
        assert rule.apply(_symbolic_k, webgpu, False) is None
        assert rule.apply(_many_rows, webgpu, False) is None
    llvm = load_target("llvm").tvm_target()
    decode = sorted(decode_gemvs(tiny_q4))[0]
    with llvm:
        assert rule.apply(copy_func(tiny_q4[decode]), llvm, False) is None  # not a GPU target


def test_knob_space_values_schedule_as_given(tiny_q4):
    """Every value `knob_space` offers is valid for the kernel, and `valid` is exact."""
    target = load_target("cuda").tvm_target()
    name = "fused_dequantize3_NT_matmul3_cast1_add"  # down_proj: N=128, K=256 (32 words per row)
    func = tiny_q4[name]
    rule = GEMVDequant.for_target("cuda")
    space = rule.knob_space(func, target)
    assert set(space) == {"threads", "rows", "vec", "unroll", "bits_to_float", "half2"}
    assert 64 not in space["threads"] and 32 in space["threads"]
    with target:
        for threads in space["threads"]:
            for vec in space["vec"]:
                candidate = dataclasses.replace(rule, threads=threads, vec=vec, rows=space["rows"][-1])
                fits = 32 % (threads * vec) == 0 and threads * space["rows"][-1] <= 1024
                assert candidate.valid(func, target) == fits, (threads, vec)
                if fits:
                    assert candidate.apply(copy_func(func), target, False) is not None


@pytest.mark.parametrize("quant", ["q4f16_1", "q4f32_1"])
def test_unpack_by_bits_gives_the_same_values(quant):
    """The nibble made a float by its bits computes exactly what the integer-to-float cast did
    (every decode GEMV of the tiny model, run on llvm), and the CUDA source of the default rule
    converts no integer to a float."""
    funcs = decode_gemvs(fused_kernels("llama-tiny", quant, "cuda"))
    assert len(funcs) >= 4
    for seed, (name, func) in enumerate(sorted(funcs.items())):
        unpacked = unpack_by_bits(copy_func(func))
        assert unpacked is not None, name
        assert "reinterpret" in unpacked.script() and "- T.float16(7.0)" not in unpacked.script(), name
        args = random_args(func, {}, seed=seed)
        want = run_llvm(func, [a.copy() for a in args])[-1]
        got = run_llvm(unpacked, [a.copy() for a in args])[-1]
        assert np.array_equal(got, want), name
    assert unpack_by_bits(copy_func(_many_rows)) is None  # no 4-bit field: nothing to rewrite
    target = load_target("cuda").tvm_target()
    name = sorted(funcs)[0]
    sources = []
    with target:
        for flag in (1, 0):
            rule = dataclasses.replace(GEMVDequant.for_target("cuda"), bits_to_float=flag, half2=0)
            sch = rule.apply(copy_func(funcs[name]), target, False)
            mod = tvm.IRModule({"k": sch.mod["main"].with_attr("global_symbol", "k")})
            sources.append(str(tvm.compile(mod, target=target).mod.imports[0].inspect_source()))
    on_src, off_src = sources
    dtype = "half" if quant == "q4f16_1" else "float"
    assert re.search(rf"\(\({dtype}\)\(\(\w+\[\d+\] >>", off_src)  # the cast the rewrite removes is there without it
    assert not re.search(rf"\(\({dtype}\)\(\(\w+\[\d+\] >>", on_src) and "reinterpret" not in on_src


def _dot8_host(cases: list[tuple[int, float, np.ndarray]], tmp_path) -> list[float]:
    """DOT8 (the CUDA device function of half2) run on this CPU: nvcc's host build of it."""
    lines = [f"{{{w}u, {s!r}f, {{{', '.join(f'{float(v)!r}f' for v in a)}}}}}," for w, s, a in cases]
    src = ("#include <cuda_fp16.h>\n#include <cstdio>\n" + DOT8_SOURCE
           + "struct Case { unsigned int w; float s; float a[8]; };\nstatic const Case cases[] = {\n" + "\n".join(lines) + "\n};\n"
           + "int main() { for (const Case& c : cases) { half a[8]; for (int i = 0; i < 8; ++i) a[i] = __float2half(c.a[i]);\n"
           + '  printf("%a\\n", mlcpipe_q4_dot8_f16(0.0f, c.w, __float2half(c.s), a)); } return 0; }\n')
    (tmp_path / "dot8.cu").write_text(src)
    built = subprocess.run([find_nvcc(), "-o", str(tmp_path / "dot8"), str(tmp_path / "dot8.cu")], capture_output=True, text=True)
    assert built.returncode == 0, built.stderr[-2000:]
    ran = subprocess.run([str(tmp_path / "dot8")], capture_output=True, text=True, check=True)
    return [float.fromhex(x) for x in ran.stdout.split()]


@pytest.mark.nvcc
def test_half2_dot8_computes_the_dequantize(tmp_path):
    """DOT8 on the CPU: with one activation 1 and the rest 0 it returns the dequantized weight
    bit for bit, (q - 7) * s rounded to f16 as the dequantize makes it, for every nibble value in
    every position; with random activations it is the f32 dot within the f16 sum's error."""
    rng = np.random.default_rng(0)
    cases, want, exact = [], [], []
    for e in range(8):
        for q in range(16):
            w = int(rng.integers(0, 2**32)) & ~(15 << (4 * e)) | (q << (4 * e))
            s = float(np.float16(rng.uniform(0.01, 0.2)))
            cases.append((w, s, np.eye(8, dtype=np.float32)[e]))
            want.append(float(np.float16(np.float16(q - 7) * np.float16(s))))
            exact.append(True)
    for _ in range(64):
        w, s = int(rng.integers(0, 2**32)), float(np.float16(rng.uniform(0.01, 0.2)))
        a = rng.standard_normal(8).astype(np.float16).astype(np.float32)
        weights = np.array([np.float16(np.float16(((w >> (4 * e)) & 15) - 7) * np.float16(s)) for e in range(8)], np.float32)
        cases.append((w, s, a))
        want.append(float(np.dot(a.astype(np.float64), weights.astype(np.float64))))
        exact.append(False)
    got = _dot8_host(cases, tmp_path)
    for (w, s, a), g, x, e in zip(cases, got, want, exact):
        if e:
            assert g == x, (hex(w), s, a, g, x)
        else:
            assert abs(g - x) <= 2e-3 * max(1.0, float(np.abs(a).sum()) * s * 8), (hex(w), s, g, x)


def test_half2_rule_calls_dot8_where_it_fits():
    """half2 turns every q4f16_1 decode GEMV's words into DOT8 calls, and the CUDA source holds
    DOT8's definition once; q4f32_1 (f32 activations) offers no half2 knob and keeps the plain
    schedule; other targets never get it."""
    target = load_target("cuda").tvm_target()
    assert GEMVDequant.for_target("cuda").half2 == 0  # not the default until a GPU has timed it
    rule = dataclasses.replace(GEMVDequant.for_target("cuda"), half2=1)
    f16 = decode_gemvs(fused_kernels("llama-tiny", "q4f16_1", "cuda"))
    f32 = decode_gemvs(fused_kernels("llama-tiny", "q4f32_1", "cuda"))
    with target:
        for name, func in sorted(f16.items()):
            assert rule.knob_space(func, target)["half2"] == [0, 1], name
            script = rule.apply(copy_func(func), target, False).mod["main"].script()
            assert script.count(f'T.call_pure_extern("float32", "{DOT8}"') == 1, name
        for name, func in sorted(f32.items()):
            assert "half2" not in rule.knob_space(func, target), name
            assert DOT8 not in rule.apply(copy_func(func), target, False).mod["main"].script(), name
        name = sorted(f16)[0]
        mod = tvm.IRModule({"k": rule.apply(copy_func(f16[name]), target, False).mod["main"].with_attr("global_symbol", "k")})
        source = str(tvm.compile(mod, target=target).mod.imports[0].inspect_source())
    assert source.count(f"float {DOT8}(float acc") == 1 and f"= {DOT8}(" in source
    assert with_device_functions(source) == source  # defined once, never twice
    webgpu = load_target("webgpu").tvm_target()
    with webgpu:
        assert "half2" not in GEMVDequant.for_target("webgpu").knob_space(copy_func(f16[name]), webgpu)


def test_rule_lists_per_target():
    for rules, kind in ((CUDA_RULES, "cuda"), (METAL_RULES, "metal"), (WEBGPU_RULES, "webgpu")):
        assert type(rules[0]).__name__ == "SamplerGPU"  # claims only the sampler's kernels (by attribute)
        assert isinstance(rules[1], GEMVDequant) and rules[1] == GEMVDequant.for_target(kind)
        assert type(rules[2]).__name__ == "Matmul" and type(rules[-1]).__name__ == "Fallback"
    from mlcpipe.schedules import RULES

    assert RULES["webgpu"][1] == GEMVDequant.for_target("webgpu")


def test_sampler_gpu_forms_keep_the_reference_signature():
    """One definition per sampler kernel: every GPU form (hand-written body or bound reference
    loop) has the reference's own parameters and attributes, thread-bound, on each GPU target."""
    from mlcpipe.model import sampler

    vocab = 5000  # pads to 8192: 4 sort tiles, a softmax chunk remainder
    refs = [sampler.softmax_chunk_stats(vocab), sampler.softmax_merge(vocab), sampler.softmax_normalize(vocab),
            sampler.argsort_tiles(vocab, sampler.padded_length(vocab)), sampler.argsort_global(vocab),
            sampler.argsort_merge(vocab, False), sampler.argsort_merge(vocab, True), sampler.top_p_chunk_sums(vocab),
            sampler.top_p_pick(vocab), sampler.apply_logit_bias(vocab), sampler.apply_penalty(vocab), sampler.apply_bitmask(vocab)]
    for rules, kind in ((CUDA_RULES, "cuda"), (METAL_RULES, "metal"), (WEBGPU_RULES, "webgpu")):
        target = load_target(kind).tvm_target()
        for ref in refs:
            gpu = rules[0].apply(ref, target, False).mod["main"]
            name = ref.attrs["mlcpipe.sampler"]["kind"]
            assert len(gpu.params) == len(ref.params) and all(a.same_as(b) for a, b in zip(gpu.params, ref.params)), (kind, name)
            assert dict(gpu.attrs) == dict(ref.attrs), (kind, name)
            script = gpu.script()
            assert 'thread="blockIdx.x"' in script and 'thread="threadIdx.x"' in script, (kind, name)

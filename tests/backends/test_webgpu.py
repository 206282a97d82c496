"""WebGPU target: lib.wasm + kernels.wgsl through the real build, the wasm loaded by node, and
TVM's WGSL kernels of the tiny model run on lavapipe (wgpu) against the unscheduled kernels on llvm.

Needs Debian's emscripten, binaryen, nodejs and mesa-vulkan-drivers (scripts/setup-debian.sh) and
the wgpu package. The first run compiles TVM's web runtime (~2 min, cached in ~/.cache/mlcpipe).
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
import tvm
from tvm.script import tirx as T

from mlcpipe.backends import webgpu as backend
from mlcpipe.build import build, export_model
from mlcpipe.kernel_info import random_args
from mlcpipe.passes import run_pipeline
from mlcpipe.roles import ROLES
from mlcpipe.runners.webgpu import lavapipe as runner
from mlcpipe.targets import load_target
from mlcpipe.schedules import RULES
from mlcpipe.quantization import quantization

QUANTS = ["q4f16_1", "q4f32_1"]
INSPECT_WASM = Path(backend.__file__).parent / "web_runtime" / "inspect_wasm.cjs"


@pytest.fixture(scope="module", params=QUANTS)
def artifact(request, tiny_config, tmp_path_factory):
    out = tmp_path_factory.mktemp("webgpu") / f"tiny-{request.param}-webgpu"
    build(tiny_config, quantization(request.param), load_target("webgpu"), output=out, log=lambda *_: None)
    return out


def test_artifact_files(artifact):
    manifest = json.loads((artifact / "manifest.json").read_text())
    assert manifest["library"] == "lib.wasm" and manifest["kernel_source"] == "kernels.wgsl"
    assert (artifact / "lib.wasm").read_bytes()[:4] == b"\0asm"
    wgsl = (artifact / "kernels.wgsl").read_text()
    assert "fused_dequantize" in wgsl
    if manifest["quantization"] == "q4f32_1":
        assert "enable f16" not in wgsl
    else:
        assert "enable f16;" in wgsl
    linear = [k for k in manifest["kernels"] if k["name"].startswith("fused_dequantize")]
    assert len(linear) >= 8
    for kernel in linear + [k for k in manifest["kernels"] if k["role"] in ("norm", "swiglu")]:
        launch = kernel["launch"]
        assert launch and len(launch["grid"]) == 3 and len(launch["block"]) == 3, kernel["name"]


@pytest.mark.dawn
def test_wasm_runtime_deserializes_the_artifact(artifact):
    """node instantiates lib.wasm: TVM's web runtime (built from the wheel's sources and our own
    headers) must read back the VM executable and the WebGPU module that libtvm serialized."""
    manifest = json.loads((artifact / "manifest.json").read_text())
    wgsl = (artifact / "kernels.wgsl").read_text()
    entry_points = sorted(set(re.findall(r"^fn (\w+)\(", wgsl, re.M)))
    assert entry_points
    probe = entry_points[:3]
    node = shutil.which("node") or shutil.which("nodejs")
    assert node, "node is needed: install with scripts/setup-debian.sh"
    proc = subprocess.run([node, str(INSPECT_WASM), str(artifact / "lib.wasm"), *probe], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    seen = json.loads(proc.stdout)
    assert seen["kind"] == "relax.VMExecutable"
    for function in manifest["functions"]:
        assert f"@{function}:" in seen["as_text"], function
    assert sorted(seen["fmap"]) == entry_points
    for name in probe:
        assert seen["shaders"][name] and seen["shaders"][name] in wgsl
        info = seen["fmap"][name]
        assert info["name"] == name and any(t.startswith("paramWriteAccess:") for t in info["launch_param_tags"])


# ---- kernels of the tiny model on lavapipe vs llvm ---------------------------------------------


@pytest.fixture(scope="module", params=QUANTS)
def unscheduled(request, tiny_config):
    """(quant, {name: unscheduled PrimFunc}) after fuse-tir, for the webgpu target."""
    target = load_target("webgpu").tvm_target()
    mod, _ = export_model(tiny_config, quantization(request.param), target)
    mod = run_pipeline(mod, target, until="fuse-tir")
    funcs = {gv.name_hint: f for gv, f in mod.functions_items() if isinstance(f, tvm.tirx.PrimFunc)}
    return request.param, funcs


def _schedule(func: tvm.tirx.PrimFunc, target) -> tvm.tirx.PrimFunc:
    with target:
        for rule in RULES["webgpu"]:
            sch = rule.apply(func, target, False)
            if sch is not None:
                return sch.mod["main"]
    raise AssertionError("no webgpu schedule rule applied")


def _run_llvm(func: tvm.tirx.PrimFunc, args: list[np.ndarray]) -> list[np.ndarray]:
    func = tvm.ir.load_json(tvm.ir.save_json(func))  # a copy: nothing shared with the webgpu module
    lib = tvm.compile(tvm.IRModule({"main": func.with_attr("global_symbol", "main")}), target=load_target("llvm").tvm_target())
    tensors = [tvm.runtime.tensor(a, tvm.cpu()) for a in args]
    lib["main"](*tensors)
    return [t.numpy() for t in tensors]


def _is_symbolic(func) -> bool:
    return any(not isinstance(d, tvm.tirx.IntImm) for p in func.params for d in p.shape)


def _check_kernel(name: str, func: tvm.tirx.PrimFunc, seq_len: int) -> None:
    target = load_target("webgpu").tvm_target()
    scheduled = _schedule(func, target)
    assert "thread_binding" in scheduled.script(), name
    args = random_args(func, {"seq_len": seq_len}, seed=seq_len)
    want = _run_llvm(func, [a.copy() for a in args])[-1]
    got = runner.run_primfunc(scheduled, target, [a.copy() for a in args])[-1]
    assert got.shape == want.shape and got.dtype == want.dtype
    tol = 2e-2 if want.dtype == np.float16 else 1e-4
    scale = np.abs(want.astype(np.float64)).max()
    err = np.abs(got.astype(np.float64) - want.astype(np.float64)).max()
    assert scale > 0 and np.isfinite(got.astype(np.float64)).all(), name
    assert err <= tol * scale, f"{name} (seq_len={seq_len}): max abs err {err:.3e}, max |value| {scale:.3e}"


@pytest.mark.lavapipe
def test_dequantize_matmul_kernels_decode_and_prefill(unscheduled):
    quant, funcs = unscheduled
    matmuls = {n: f for n, f in funcs.items() if re.fullmatch(r"fused_dequantize\d*_NT_matmul\d*(_\w+)?", n)}
    decode = [n for n, f in matmuls.items() if not _is_symbolic(f)]
    prefill = [n for n, f in matmuls.items() if _is_symbolic(f)]
    assert len(decode) >= 4 and len(prefill) >= 4, sorted(matmuls)
    for name in sorted(decode):
        _check_kernel(name, matmuls[name], 1)
    for name in sorted(prefill):
        _check_kernel(name, matmuls[name], 7)


@pytest.mark.lavapipe
@pytest.mark.parametrize("pattern", [r"rms_norm\d*", r"fused_split\d*_silu\d*_multiply\d*"])
def test_norm_and_swiglu_kernels(unscheduled, pattern):
    quant, funcs = unscheduled
    names = sorted(n for n in funcs if re.fullmatch(pattern, n))
    assert len(names) == 2, names  # decode and prefill
    for name in names:
        _check_kernel(name, funcs[name], 7 if _is_symbolic(funcs[name]) else 1)


# ---- runner mechanics on hand-written kernels ---------------------------------------------------


@T.prim_func(s_tir=True)
def _two_kernels(a: T.handle, c: T.handle):
    n = T.int64()
    A = T.match_buffer(a, (n,), "float32")
    C = T.match_buffer(c, (n,), "float32")
    B = T.alloc_buffer((n,), "float32")  # device workspace between the two kernels
    for bx in T.thread_binding((n + 63) // 64, thread="blockIdx.x"):
        for tx in T.thread_binding(64, thread="threadIdx.x"):
            with T.sblock("double"):
                if bx * 64 + tx < n:
                    B[bx * 64 + tx] = A[bx * 64 + tx] * T.float32(2)
    for bx in T.thread_binding((n + 63) // 64, thread="blockIdx.x"):
        for tx in T.thread_binding(64, thread="threadIdx.x"):
            with T.sblock("reverse"):  # reads what other workgroups wrote: needs a second launch
                if bx * 64 + tx < n:
                    C[bx * 64 + tx] = B[n - 1 - (bx * 64 + tx)] + T.float32(1)


@T.prim_func(s_tir=True)
def _one_block_per_element(a: T.handle, c: T.handle):
    n = T.int64()
    A = T.match_buffer(a, (n,), "float16")
    C = T.match_buffer(c, (n + 1,), "float16")  # one element past the kernel's range
    for bx in T.thread_binding(n, thread="blockIdx.x"):
        for tx in T.thread_binding(1, thread="threadIdx.x"):
            with T.sblock("add_one"):
                C[bx] = A[bx] + T.float16(1)


@pytest.mark.lavapipe
def test_several_kernels_launch_in_host_order():
    target = load_target("webgpu").tvm_target()
    a = np.random.default_rng(0).standard_normal(1000).astype(np.float32)
    args = [a, np.zeros_like(a)]
    assert runner.kernel_names(_two_kernels, target, args) == ["main_kernel", "main_kernel_1"]
    got = runner.run_primfunc(_two_kernels, target, args)
    np.testing.assert_array_equal(got[0], a)
    np.testing.assert_allclose(got[1], a[::-1] * 2 + 1, rtol=1e-6)


@pytest.mark.lavapipe
def test_grid_over_65535_is_packed_and_tvm_bound_check_is_patched(monkeypatch):
    """x extents >= 2^16 fold into blockIdx.z (as tvmjs does). TVM's WGSL returns only when the
    packed index is `> packGridDimX`, so with the padding of an odd fold one workgroup writes one
    element past the kernel's range; the runner patches the check to `>=`."""
    target = load_target("webgpu").tvm_target()
    n = 65537  # folds to 32769 x 2 workgroups: one spare
    a = (np.arange(n) % 1000).astype(np.float16)
    c = np.full(n + 1, -5, np.float16)
    got = runner.run_primfunc(_one_block_per_element, target, [a, c])[1]
    np.testing.assert_array_equal(got[:n], a + np.float16(1))
    assert got[n] == -5  # untouched
    monkeypatch.setattr(runner, "PATCH_PACK_GRID_CHECK", False)
    unpatched = runner.run_primfunc(_one_block_per_element, target, [a, c])[1]
    np.testing.assert_array_equal(unpatched[:n], a + np.float16(1))
    assert unpatched[n] != -5, "TVM's `> packGridDimX` check no longer overruns: drop the runner's patch"


@pytest.mark.lavapipe
def test_runner_rejects_wrong_arguments():
    target = load_target("webgpu").tvm_target()
    with pytest.raises(ValueError, match="float32 of rank 1"):
        runner.run_primfunc(_two_kernels, target, [np.zeros(4, np.float16), np.zeros(4, np.float32)])
    with pytest.raises(ValueError, match="2 parameters"):
        runner.run_primfunc(_two_kernels, target, [np.zeros(4, np.float32)])


# ---- toolchain errors ---------------------------------------------------------------------------


def test_missing_emcc_is_a_one_line_error(monkeypatch):
    monkeypatch.setenv("EMCC", "/nonexistent/emcc")
    with pytest.raises(RuntimeError) as info:
        backend.runtime_objects()
    message = str(info.value)
    assert "emcc" in message and "scripts/setup-debian.sh" in message and "\n" not in message


def test_link_failure_is_a_one_line_error(tmp_path):
    bogus = tmp_path / "bogus.o"
    bogus.write_bytes(b"not an object file")
    with pytest.raises(RuntimeError) as info:
        backend.emcc_link(str(tmp_path / "lib.wasm"), [str(bogus)])
    message = str(info.value)
    assert message.startswith("emcc failed to link lib.wasm") and "setup-debian.sh" in message and "\n" not in message


@pytest.mark.dawn
@pytest.mark.lavapipe  # f16 kernels, where no Dawn adapter has shader-f16
def test_mlcpipe_check_passes_every_kernel(artifact):
    """Kernel conformance of the whole tiny artifact: every kernel of lib.wasm executed in Dawn
    (f32), or on lavapipe through wgpu where no Dawn adapter here has shader-f16 (f16)."""
    from mlcpipe.conformance import check_artifact

    report = check_artifact(artifact)
    failures = [r for r in report.results if r.status == "FAIL"]
    assert report.executed and not failures, failures
    passed = {r.kernel for r in report.results if r.status == "pass"}
    roles = {r.role for r in report.results if r.status == "pass"}
    assert set(ROLES) - {"sampler", "other"} <= roles
    assert {"batch_prefill_paged_kv", "batch_decode_paged_kv", "batch_prefill_ragged_kv", "tir_attention_merge_state"} <= passed
    assert report.summary.startswith("webgpu on ")

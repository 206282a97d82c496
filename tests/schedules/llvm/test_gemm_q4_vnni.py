"""PrefillGEMMQ4VNNI (schedules/llvm/gemm_q4_vnni.py): the q4 prefill GEMM on AVX512-VNNI int8
dot products, for CPUs without AMX. Against a NumPy emulation of its arithmetic (int8
activations per token and weight group, exact integer dot products, f32 scales) and against the
exact f16 kernel, at several token counts. Executed where the CPU has AVX512-VNNI; elsewhere
compiled for a VNNI CPU and its assembly checked."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import tvm

from mlcpipe.kernel_info import random_args
from mlcpipe.targets import load_target
from mlcpipe.tuning.knobs import unscheduled_kernels
from mlcpipe.schedules import schedule_func
from mlcpipe.schedules.analysis import match_nt_matmul as match
from mlcpipe.schedules.llvm.gemm_q4_vnni import PrefillGEMMQ4VNNI
from mlcpipe.quantization import quantization

from tests.helpers.cpu_reference import q8_emulate

HOST = load_target("llvm").tvm_target()
HOST_VNNI = tvm.target.codegen.target_has_features("avx512vnni", HOST)
ZEN4 = tvm.target.Target({"kind": "llvm", "mcpu": "znver4"})  # VNNI, no AMX
SPR = tvm.target.Target({"kind": "llvm", "mcpu": "sapphirerapids"})
needs_vnni = pytest.mark.skipif(not HOST_VNNI, reason="this CPU has no AVX512-VNNI")
ZEN3 = tvm.target.Target({"kind": "llvm", "mcpu": "znver3"})  # AVX2 only: VPMADDUBSW + VPMADDWD (compiled, asm checked)
# the same arithmetic run on any AVX2 host (a znver3 build may use AMD-only SSE4A `insertq`: illegal on Intel)
AVX2 = tvm.target.Target({"kind": "llvm", "mcpu": "haswell"})
needs_avx2 = pytest.mark.skipif(not tvm.target.codegen.target_has_features("avx2", HOST), reason="this CPU has no AVX2")


def _outputs(func, args, target=HOST):
    lib = tvm.compile(tvm.IRModule({"main": func.with_attr("global_symbol", "main")}), target=target)
    tensors = [tvm.runtime.tensor(a.copy()) for a in args]
    lib["main"](*tensors)
    return tensors[-1].numpy().astype(np.float32)


def _prefill(kernels):
    return {n: f for n, f in kernels.items() if "NT_matmul" in n and "seq_len" in f.script()}


@pytest.fixture(scope="module")
def kernels(tiny_config):
    return _prefill(unscheduled_kernels(tiny_config, quantization("q4f16_1"), ZEN4))


def test_rule_compiles_to_vpdpbusd_and_is_chosen_without_amx(kernels):
    func = next(iter(kernels.values()))
    sch = PrefillGEMMQ4VNNI().apply(func, ZEN4, False)
    lib = tvm.compile(tvm.IRModule({"main": sch.mod["main"].with_attr("global_symbol", "main")}), target=ZEN4)
    assert "vpdpbusd" in lib.mod.inspect_source("s")
    assert schedule_func(func, ZEN4)[1]["rule"] == "PrefillGEMMQ4VNNI"
    assert schedule_func(func, SPR)[1]["rule"] == "PrefillGEMMAMX"  # the AMX machine keeps its rule
    f32 = _prefill(unscheduled_kernels(dataclasses.replace(_tiny(), name="t"), quantization("q4f32_1"), ZEN4))
    assert all(PrefillGEMMQ4VNNI().apply(f, ZEN4, False) is None for f in f32.values())  # f32 models keep f32


def _tiny():
    from mlcpipe.config import load_model_config

    return load_model_config("llama-tiny")


# the default (one plane, two up to 4 tokens); one plane at every token count; two planes; AVX2's tiles
@pytest.mark.parametrize("knobs, target", [
    pytest.param({}, HOST, marks=needs_vnni), pytest.param({"block_m": 6, "row_vecs": 1, "low_batch": 0}, HOST, marks=needs_vnni),
    pytest.param({"block_m": 2, "row_vecs": 4, "planes": 2}, HOST, marks=needs_vnni),
    pytest.param({}, AVX2, marks=needs_avx2), pytest.param({"block_m": 1, "planes": 2}, AVX2, marks=needs_avx2)])
def test_q4_vnni_prefill_is_its_int8_arithmetic(knobs, target, kernels):
    taken = emulated = 0
    for name, func in kernels.items():
        info = match(func)
        sch = dataclasses.replace(PrefillGEMMQ4VNNI(), **knobs).apply(func, target, False)
        assert sch is not None, name
        for tokens in (1, 7, 40, 130):  # partial token blocks, past 128
            args = random_args(func, {"seq_len": tokens}, seed=tokens)
            exact = _outputs(func, args)
            got = _outputs(sch.mod["main"], args, target)
            # two int8 planes: ~16-bit activations (f16's own rounding); one: ~0.4% of the group's largest value
            rule = dataclasses.replace(PrefillGEMMQ4VNNI(), **knobs)
            planes = 2 if rule.planes == 2 or tokens <= rule.low_batch else 1
            np.testing.assert_allclose(got, exact, atol=(2e-3 if planes == 2 else 1e-2) * np.abs(exact).max(), err_msg=f"{name} {tokens}")
            assert np.abs(got - exact).max() > 0  # the int8 path really ran
            if not info.epilogue:  # a bare matmul: equal to the emulation up to f32 sums
                want = q8_emulate(func, args, tokens, planes)
                np.testing.assert_allclose(got.reshape(tokens, -1), want, rtol=1e-5, atol=1e-5 * np.abs(want).max(), err_msg=f"{name} {tokens}")
                emulated += 1
        taken += 1
    assert taken == 5 and emulated == 4  # qkv, o_proj, gate_up, down, batch_verify's lm_head (bare: emulated)


@pytest.mark.parametrize("target", [pytest.param(HOST, marks=needs_vnni, id="host-vnni"), pytest.param(AVX2, marks=needs_avx2, id="haswell")])
def test_q4_vnni_prefill_full_size_down_proj(target):
    from mlcpipe.config import load_model_config

    funcs = _prefill(unscheduled_kernels(load_model_config("llama-3.2-1b"), quantization("q4f16_1"), HOST))
    name, func = next((n, f) for n, f in funcs.items() if (match(f).n, match(f).k) == (2048, 8192))
    args = random_args(func, {"seq_len": 33}, seed=2)
    want = _outputs(func, args)
    got = _outputs(PrefillGEMMQ4VNNI().apply(func, target, False).mod["main"], args, target)
    np.testing.assert_allclose(got, want, atol=1e-2 * np.abs(want).max(), err_msg=name)


def test_default_row_vectors_keep_a_tasks_repacked_rows_in_l2():
    """Unset row_vecs on AVX512-VNNI: 2 vectors (32 rows x K bytes) up to 128 KiB per task, so 1 for
    the 1B's down_proj (K = 8192); a given row_vecs is kept. Read from the parallel task count."""
    import re

    from mlcpipe.config import load_model_config

    zen4 = tvm.target.Target({"kind": "llvm", "mcpu": "znver4"})
    funcs = _prefill(unscheduled_kernels(load_model_config("llama-3.2-1b"), quantization("q4f16_1"), zen4))
    by_shape = {(match(f).n, match(f).k): f for f in funcs.values()}

    def tasks(func, **knobs):
        script = PrefillGEMMQ4VNNI(**knobs).apply(func, zen4, False).mod["main"].script()
        return max(int(v) for v in re.findall(r"in T.parallel\((\d+)\)", script))

    assert tasks(by_shape[(16384, 2048)]) == 16384 // 32 and tasks(by_shape[(3072, 2048)]) == 3072 // 32
    assert tasks(by_shape[(2048, 8192)]) == 2048 // 16 and tasks(by_shape[(2048, 8192)], row_vecs=2) == 2048 // 32


@pytest.mark.parametrize("isa", ["avxvnni", "arm", "avx2"])
def test_int8_rules_on_avx_vnni_and_aarch64_dotprod(isa):
    """Intel client parts (AVX-VNNI, 256-bit VEX VPDPBUSD), aarch64 with FEAT_DotProd (SDOT) and
    AVX2-only CPUs (Zen 3: VPMADDUBSW + VPMADDWD on 256 bits) take both q4 int8 rules, with
    ISA-sized tiles; checked in the assembly."""
    import re

    from mlcpipe.schedules.llvm.gemv_q4_vnni import DecodeGEMVQ4VNNI

    target, pattern = {
        "avxvnni": (tvm.target.Target({"kind": "llvm", "mcpu": "alderlake"}), r"\{vex\}\s+vpdpbusd\s+[^\n]*%ymm"),
        "arm": (tvm.target.Target({"kind": "llvm", "mtriple": "aarch64-linux-gnu", "mcpu": "generic", "mattr": ["+neon", "+dotprod"]}),
                r"sdot\s+v\d+\.4s, v\d+\.16b, v\d+\.16b"),
        "avx2": (ZEN3, r"vpmaddubsw\s+[^\n]*%ymm"),
    }[isa]
    funcs = {n: f for n, f in unscheduled_kernels(_tiny(), quantization("q4f16_1"), target).items() if "NT_matmul" in n}
    prefill = next(f for f in funcs.values() if "seq_len" in f.script())
    decode = next(f for f in funcs.values() if "seq_len" not in f.script())
    assert schedule_func(prefill, target)[1]["rule"] == "PrefillGEMMQ4VNNI"
    assert schedule_func(decode, target)[1]["rule"] == "DecodeGEMVQ4VNNI"
    assert PrefillGEMMQ4VNNI(block_m=4, row_vecs=2).apply(prefill, target, False) is None  # AVX-512's tile: too many registers
    for rule, func in ((PrefillGEMMQ4VNNI(), prefill), (DecodeGEMVQ4VNNI(), decode)):
        sch = rule.apply(func, target, False)
        lib = tvm.compile(tvm.IRModule({"main": sch.mod["main"].with_attr("global_symbol", "main")}), target=target)
        asm = lib.mod.inspect_source("s")
        assert len(re.findall(pattern, asm)) >= 4, type(rule).__name__
        assert "vpdpbusd\t%zmm" not in asm and "zmm" not in asm  # no AVX-512 on these CPUs
        assert isa != "avx2" or ("vpdpbusd" not in asm and "vpmaddwd" in asm)  # and no VNNI on Zen 3
        if isa == "avx2":  # VPMADDUBSW results added in i16 (VPADDW) before they are widened (VPMADDWD):
            assert re.search(r"\bvpaddw\s", asm), type(rule).__name__  # the GEMV per pair, the GEMM per group
        if isinstance(rule, PrefillGEMMQ4VNNI) and isa == "avx2":
            madds, widens = (len(re.findall(rf"\b{op}\s", asm)) for op in ("vpmaddubsw", "vpmaddwd"))
            assert widens * 4 <= madds, (madds, widens)  # one widening per group of 8 quads, not per quad

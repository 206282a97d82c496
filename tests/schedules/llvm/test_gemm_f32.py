"""PrefillGEMMF32 (schedules/llvm/gemm_f32.py): the prefill GEMM on f32 FMAs in register tiles.
Against the exact kernel and a float64 NumPy reference for f32 (q4f32_1, q0f32) and f16 (q0f16)
models at token counts on both sides of the one-vector branch, at several tiles and at full size,
built for this CPU and for AVX2 + FMA only (Haswell: runs on any x86 host with AVX2)."""

from __future__ import annotations

import numpy as np
import pytest
import tvm

from mlcpipe.config import load_model_config
from mlcpipe.kernel_info import random_args
from mlcpipe.targets import load_target
from mlcpipe.tuning.knobs import unscheduled_kernels
from mlcpipe.schedules import schedule_func
from mlcpipe.schedules.analysis import match_nt_matmul as match
from mlcpipe.schedules.llvm.gemm_f32 import PrefillGEMMF32
from mlcpipe.quantization import quantization

from tests.helpers.cpu_reference import activation_and_weight

HOST = load_target("llvm").tvm_target()
ZEN4 = tvm.target.Target({"kind": "llvm", "mcpu": "znver4"})
SPR = tvm.target.Target({"kind": "llvm", "mcpu": "sapphirerapids"})
SKYLAKE = tvm.target.Target({"kind": "llvm", "mcpu": "skylake-avx512"})  # AVX-512, no VNNI / BF16
HASWELL = tvm.target.Target({"kind": "llvm", "mcpu": "haswell"})  # AVX2 + FMA, no AVX-512
NEHALEM = tvm.target.Target({"kind": "llvm", "mcpu": "nehalem"})  # SSE4.2 only
needs_avx512 = pytest.mark.skipif(not tvm.target.codegen.target_has_features("avx512f", HOST), reason="this CPU has no AVX-512")
needs_avx2 = pytest.mark.skipif(not tvm.target.codegen.target_has_features("avx2", HOST), reason="this CPU has no AVX2")


def _prefill(kernels):
    return {n: f for n, f in kernels.items() if "NT_matmul" in n and "seq_len" in f.script()}


def _outputs(func, args, target=HOST):
    lib = tvm.compile(tvm.IRModule({"main": func.with_attr("global_symbol", "main")}), target=target)
    tensors = [tvm.runtime.tensor(a.copy()) for a in args]
    lib["main"](*tensors)
    return tensors[-1].numpy().astype(np.float64)


def reference(func, args, tokens: int) -> np.ndarray:
    """x @ W^T in float64 (W dequantized as MLC: (q - 7) * s)."""
    x, w = activation_and_weight(func, args, tokens, np.float64)
    return x @ w.T


@pytest.fixture(scope="module", params=["q4f32_1", "q0f32", "q0f16"])
def kernels(request, tiny_config):
    return request.param, _prefill(unscheduled_kernels(tiny_config, quantization(request.param), HOST))


def test_rule_choice_per_cpu(kernels):
    """f32 models take it on every AVX-512 or AVX2 + FMA CPU (the AMX, VNNI and BF16 rules need f16
    activations); f16 models only where no faster dot product exists; never without AVX2 + FMA."""
    quant, funcs = kernels
    func = next(iter(funcs.values()))
    if quant.endswith("f32") or quant.endswith("f32_1"):
        for target in (ZEN4, SPR, SKYLAKE, HASWELL):
            assert schedule_func(func, target)[1]["rule"] == "PrefillGEMMF32", str(target)
    else:
        assert schedule_func(func, ZEN4)[1]["rule"] == "PrefillGEMMBF16"
        assert schedule_func(func, SKYLAKE)[1]["rule"] == "PrefillGEMMF32"
        assert schedule_func(func, HASWELL)[1]["rule"] == "PrefillGEMMF32"
    assert PrefillGEMMF32().apply(func, NEHALEM, False) is None
    assert schedule_func(func, NEHALEM)[1]["rule"] == "PrefillGEMM"
    # AVX2: 16-lane values are two ymm registers: tiles that would spill are declined
    assert PrefillGEMMF32(block_n=4, token_vecs=2).apply(func, HASWELL, False) is None
    assert PrefillGEMMF32(block_n=2, token_vecs=3).apply(func, HASWELL, False) is None
    assert PrefillGEMMF32(block_n=4, token_vecs=2).apply(func, ZEN4, False) is not None
    # k slices: a multiple of the convert chunk (16 k positions; q4: 128) that divides K; tiles divide N
    assert PrefillGEMMF32(k_block=48).apply(func, ZEN4, False) is None
    assert PrefillGEMMF32(k_block=-128).apply(func, ZEN4, False) is None
    assert PrefillGEMMF32(tiles=3).apply(func, ZEN4, False) is None


@needs_avx2
@pytest.mark.parametrize("knobs", [{}, {"block_n": 2, "token_vecs": 2, "k_block": 128, "tiles": 2}])
def test_avx2_tiles_keep_the_kernels_numerics(knobs, kernels):
    """The AVX2 + FMA build (no AVX-512 instructions in its code) against the exact kernel and NumPy."""
    quant, funcs = kernels
    for name, func in funcs.items():
        info = match(func)
        sch = PrefillGEMMF32(**knobs).apply(func, HASWELL, False)
        assert sch is not None, name
        text = tvm.compile(tvm.IRModule({"main": sch.mod["main"].with_attr("global_symbol", "main")}), target=HASWELL).mod.inspect_source("s")
        assert "vfmadd" in text and "zmm" not in text, name
        for tokens in (3, 17, 130):
            args = random_args(func, {"seq_len": tokens}, seed=tokens)
            exact = _outputs(func, args)
            got = _outputs(sch.mod["main"], args, HASWELL)
            tol = 2e-3 if str(func.params[-1].dtype) == "float16" else 1e-5
            np.testing.assert_allclose(got, exact, atol=tol * np.abs(exact).max(), err_msg=f"{name} {tokens}")
            if not info.epilogue:
                want = reference(func, args, tokens)
                np.testing.assert_allclose(got.reshape(tokens, -1), want, atol=tol * np.abs(want).max(), err_msg=f"{name} {tokens}")


@needs_avx512
@pytest.mark.parametrize("knobs", [{}, {"k_block": 128, "tiles": 2, "prefetch": 1}, pytest.param({"block_n": 4, "token_vecs": 4, "k_block": 0, "tiles": 1}, marks=pytest.mark.long),
                                   pytest.param({"block_n": 8, "token_vecs": 2}, marks=pytest.mark.long)])
def test_f32_tiles_keep_the_kernels_numerics(knobs, kernels):
    quant, funcs = kernels
    rule = PrefillGEMMF32(**knobs)
    taken = referenced = 0
    for name, func in funcs.items():
        info = match(func)
        sch = rule.apply(func, HOST, False)
        assert sch is not None, name
        for tokens in (1, 3, 16, 17, 40, 130):  # the one-vector branch, its edge, partial blocks, past 128
            args = random_args(func, {"seq_len": tokens}, seed=tokens)
            exact = _outputs(func, args)
            got = _outputs(sch.mod["main"], args)
            # f32 sums in another order; f16 outputs round to f16
            tol = 2e-3 if str(func.params[-1].dtype) == "float16" else 1e-5
            np.testing.assert_allclose(got, exact, atol=tol * np.abs(exact).max(), err_msg=f"{name} {tokens}")
            if not info.epilogue:
                want = reference(func, args, tokens)
                np.testing.assert_allclose(got.reshape(tokens, -1), want, atol=tol * np.abs(want).max(), err_msg=f"{name} {tokens}")
                referenced += 1
        taken += 1
    assert taken == len(funcs) >= 4 and referenced >= 6  # qkv, o_proj, gate_up, down (+ lm_head); bare ones against NumPy


@needs_avx512
def test_f32_tiles_full_size_gate_up_and_down():
    funcs = _prefill(unscheduled_kernels(load_model_config("llama-3.2-1b"), quantization("q4f32_1"), HOST))
    for shape in ((16384, 2048), (2048, 8192)):
        name, func = next((n, f) for n, f in funcs.items() if (match(f).n, match(f).k) == shape)
        for tokens in (7, 70):
            args = random_args(func, {"seq_len": tokens}, seed=2)
            want = _outputs(func, args)
            got = _outputs(PrefillGEMMF32().apply(func, HOST, False).mod["main"], args)
            np.testing.assert_allclose(got, want, atol=1e-5 * np.abs(want).max(), err_msg=f"{name} {tokens}")


@needs_avx2
def test_avx2_tiles_full_size_gate_up():
    """1B gate_up (q4f32_1) at 70 tokens, built for AVX2 + FMA."""
    funcs = _prefill(unscheduled_kernels(load_model_config("llama-3.2-1b"), quantization("q4f32_1"), HASWELL))
    name, func = next((n, f) for n, f in funcs.items() if (match(f).n, match(f).k) == (16384, 2048))
    args = random_args(func, {"seq_len": 70}, seed=2)
    want = _outputs(func, args)
    got = _outputs(PrefillGEMMF32().apply(func, HASWELL, False).mod["main"], args, HASWELL)
    np.testing.assert_allclose(got, want, atol=1e-5 * np.abs(want).max(), err_msg=name)

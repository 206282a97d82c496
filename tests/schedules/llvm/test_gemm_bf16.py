"""PrefillGEMMBF16 (schedules/llvm/gemm_bf16.py): the f16-model prefill GEMM on AVX512-BF16 dot
products, for CPUs without AMX. Against a NumPy emulation (both operands rounded to bf16,
exact sums) and the exact kernel, for q0f16 and q4f16_1 at several token counts. Executed where
the CPU has AVX512-BF16; elsewhere compiled for Zen 4 and its assembly checked."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import tvm

from mlcpipe.config import load_model_config
from mlcpipe.kernel_info import random_args
from mlcpipe.targets import load_target
from mlcpipe.tuning.knobs import unscheduled_kernels
from mlcpipe.schedules import schedule_func
from mlcpipe.schedules.analysis import match_nt_matmul as match
from mlcpipe.schedules.llvm.gemm_bf16 import PrefillGEMMBF16
from mlcpipe.quantization import quantization

from tests.helpers.cpu_reference import bf16_emulate

HOST = load_target("llvm").tvm_target()
HOST_BF16 = tvm.target.codegen.target_has_features("avx512bf16", HOST)
ZEN4 = tvm.target.Target({"kind": "llvm", "mcpu": "znver4"})  # AVX512-BF16, no AMX
SPR = tvm.target.Target({"kind": "llvm", "mcpu": "sapphirerapids"})
SKYLAKE = tvm.target.Target({"kind": "llvm", "mcpu": "skylake-avx512"})  # no BF16
needs_bf16 = pytest.mark.skipif(not HOST_BF16, reason="this CPU has no AVX512-BF16")


def _prefill(kernels):
    return {n: f for n, f in kernels.items() if "NT_matmul" in n and "seq_len" in f.script()}


def _outputs(func, args, target=HOST):
    lib = tvm.compile(tvm.IRModule({"main": func.with_attr("global_symbol", "main")}), target=target)
    tensors = [tvm.runtime.tensor(a.copy()) for a in args]
    lib["main"](*tensors)
    return tensors[-1].numpy().astype(np.float32)


@pytest.fixture(scope="module", params=["q0f16", "q4f16_1"])
def kernels(request, tiny_config):
    return request.param, _prefill(unscheduled_kernels(tiny_config, quantization(request.param), ZEN4))


def test_rule_compiles_to_vdpbf16ps_and_is_chosen_without_amx(kernels):
    quant, funcs = kernels
    func = next(iter(funcs.values()))
    sch = PrefillGEMMBF16().apply(func, ZEN4, False)
    lib = tvm.compile(tvm.IRModule({"main": sch.mod["main"].with_attr("global_symbol", "main")}), target=ZEN4)
    assert "vdpbf16ps" in lib.mod.inspect_source("s")
    # q0f16 takes it on Zen 4; q4 keeps the faster VNNI int8 rule; the AMX machine keeps AMX
    assert schedule_func(func, ZEN4)[1]["rule"] == ("PrefillGEMMBF16" if quant == "q0f16" else "PrefillGEMMQ4VNNI")
    assert schedule_func(func, SPR)[1]["rule"] == "PrefillGEMMAMX"
    assert PrefillGEMMBF16().apply(func, SKYLAKE, False) is None  # no BF16 instructions
    f32 = _prefill(unscheduled_kernels(dataclasses.replace(load_model_config("llama-tiny"), name="t"), quantization("q4f32_1"), ZEN4))
    assert all(PrefillGEMMBF16().apply(f, ZEN4, False) is None for f in f32.values())  # f32 models keep f32


@needs_bf16
# the default tile (and up to 4 tokens the f32 GEMV branch for f16 weights); other tiles, no branch
@pytest.mark.parametrize("knobs", [{}, pytest.param({"block_n": 4, "token_vecs": 4, "low_batch": 0}, marks=pytest.mark.long),
                                   pytest.param({"block_n": 8, "token_vecs": 3}, marks=pytest.mark.long)])
def test_bf16_prefill_is_its_bf16_arithmetic(knobs, kernels):
    quant, funcs = kernels
    rule = PrefillGEMMBF16(**knobs)
    taken = emulated = 0
    for name, func in funcs.items():
        info = match(func)
        sch = rule.apply(func, HOST, False)
        assert sch is not None, name
        for tokens in (1, 3, 5, 17, 40, 130):  # the few-token branch, partial token blocks, past 128
            args = random_args(func, {"seq_len": tokens}, seed=tokens)
            exact = _outputs(func, args)
            got = _outputs(sch.mod["main"], args)
            if tokens <= rule.low_batch and quant == "q0f16":  # f32 FMAs: the exact kernel's sums in another order
                np.testing.assert_allclose(got, exact, atol=2e-3 * np.abs(exact).max(), err_msg=f"{name} {tokens}")
                continue
            np.testing.assert_allclose(got, exact, atol=1e-2 * np.abs(exact).max(), err_msg=f"{name} {tokens}")
            assert np.abs(got - exact).max() > 0  # the bf16 path really ran
            if not info.epilogue:  # a bare matmul: equal to the emulation up to f32 sums
                want = bf16_emulate(func, args, tokens)
                np.testing.assert_allclose(got.reshape(tokens, -1), want, rtol=1e-5, atol=1e-5 * np.abs(want).max(), err_msg=f"{name} {tokens}")
                emulated += 1
        taken += 1
    assert taken == 5 and emulated >= 4  # qkv, o_proj, gate_up, down, batch_verify's lm_head (bare)


@needs_bf16
def test_bf16_prefill_full_size_gate_up_and_down():
    funcs = _prefill(unscheduled_kernels(load_model_config("llama-3.2-1b"), quantization("q0f16"), HOST))
    for shape in ((16384, 2048), (2048, 8192)):
        name, func = next((n, f) for n, f in funcs.items() if (match(f).n, match(f).k) == shape)
        args = random_args(func, {"seq_len": 33}, seed=2)
        want = _outputs(func, args)
        got = _outputs(PrefillGEMMBF16().apply(func, HOST, False).mod["main"], args)
        np.testing.assert_allclose(got, want, atol=1e-2 * np.abs(want).max(), err_msg=name)


def test_aarch64_build_uses_bfdot_without_spills(kernels):
    """aarch64 with BF16 (Graviton 3, Apple M2+): four BFDOTs per 16 lanes; checked in the
    assembly only (executing it needs an Arm machine)."""
    import re

    arm = tvm.target.Target({"kind": "llvm", "mtriple": "aarch64-linux-gnu", "mcpu": "generic", "mattr": ["+neon", "+bf16"]})
    plain = tvm.target.Target({"kind": "llvm", "mtriple": "aarch64-linux-gnu", "mcpu": "generic", "mattr": ["+neon"]})
    _, funcs = kernels
    func = next(iter(funcs.values()))
    assert PrefillGEMMBF16().apply(func, plain, False) is None
    sch = PrefillGEMMBF16().apply(func, arm, False)
    lib = tvm.compile(tvm.IRModule({"main": sch.mod["main"].with_attr("global_symbol", "main")}), target=arm)
    asm = lib.mod.inspect_source("s")
    assert len(re.findall(r"bfdot\s+v\d+\.4s, v\d+\.8h, v\d+\.8h", asm)) >= 16  # 4 accumulators x 4 quarters
    assert "mlcpipe_dpbf16ps" not in asm  # the IR wrapper is inlined
    assert not re.findall(r"\bstr\s+q\d+, \[sp", asm)  # accumulators stay in registers
    assert PrefillGEMMBF16(block_n=4, token_vecs=2).apply(func, arm, False) is None  # 8 x 4 NEON registers: too many

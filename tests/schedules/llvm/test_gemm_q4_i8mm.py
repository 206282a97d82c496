"""PrefillGEMMQ4I8MM (schedules/llvm/gemm_q4_i8mm.py): the q4 prefill GEMM on aarch64 SMMLA.
Chosen on aarch64 with i8mm only, SMMLA in its assembly; its aarch64 build executed under
qemu-user (qemu marker) at the 1B's shapes against the NumPy emulation of the int8 rules'
arithmetic, the exact f32 kernel (PrefillGEMM on the host) and, bit for bit, the x86 twin
PrefillGEMMQ4VNNI where the host has AVX512-VNNI."""

from __future__ import annotations

import re

import numpy as np
import pytest
import tvm

from mlcpipe.config import load_model_config
from mlcpipe.kernel_info import random_args
from mlcpipe.runners.qemu_arm import link_aarch64, run_aarch64
from mlcpipe.targets import load_target
from mlcpipe.tuning.knobs import compile_kernel, unscheduled_kernels
from mlcpipe.schedules import schedule_func
from mlcpipe.schedules.analysis import match_nt_matmul as match
from mlcpipe.schedules.llvm.gemm_dequant import PrefillGEMM
from mlcpipe.schedules.llvm.gemm_q4_i8mm import PrefillGEMMQ4I8MM
from mlcpipe.schedules.llvm.gemm_q4_vnni import PrefillGEMMQ4VNNI
from mlcpipe.quantization import quantization

from tests.helpers.cpu_reference import q8_emulate

HOST = load_target("llvm").tvm_target()
HOST_VNNI = tvm.target.codegen.target_has_features("avx512vnni", HOST)
ARM_I8MM = tvm.target.Target({"kind": "llvm", "mtriple": "aarch64-linux-gnu", "mcpu": "generic", "mattr": ["+neon", "+dotprod", "+i8mm"]})
ARM_DOTPROD = tvm.target.Target({"kind": "llvm", "mtriple": "aarch64-linux-gnu", "mcpu": "generic", "mattr": ["+neon", "+dotprod"]})
ZEN4 = tvm.target.Target({"kind": "llvm", "mcpu": "znver4"})
SPR = tvm.target.Target({"kind": "llvm", "mcpu": "sapphirerapids"})


def _prefill(config, quant, target):
    return {n: f for n, f in unscheduled_kernels(config, quantization(quant), target).items() if "NT_matmul" in n and "seq_len" in f.script()}


def test_chosen_on_aarch64_with_i8mm_and_compiles_to_smmla(tiny_config):
    funcs = _prefill(tiny_config, "q4f16_1", ARM_I8MM)
    for name, func in funcs.items():
        assert schedule_func(func, ARM_I8MM)[1]["rule"] == "PrefillGEMMQ4I8MM", name
        assert schedule_func(func, ARM_DOTPROD)[1]["rule"] == "PrefillGEMMQ4VNNI", name  # SDOT without i8mm
    host_funcs = _prefill(tiny_config, "q4f16_1", ZEN4)
    assert all(PrefillGEMMQ4I8MM().apply(f, t, False) is None for f in host_funcs.values() for t in (ZEN4, SPR))  # x86 never
    for quant in ("q4f32_1", "q0f16"):  # f32 activations / no q4 weights: not this rule
        assert all(PrefillGEMMQ4I8MM().apply(f, ARM_I8MM, False) is None for f in _prefill(tiny_config, quant, ARM_I8MM).values())
    func = next(iter(funcs.values()))
    assert PrefillGEMMQ4I8MM(token_pairs=4, row_pairs=4).apply(func, ARM_I8MM, False) is None  # 36 registers: declined
    asm = compile_kernel(PrefillGEMMQ4I8MM().apply(func, ARM_I8MM, False).mod["main"], ARM_I8MM).mod.inspect_source("s")
    assert len(re.findall(r"smmla\s+v\d+\.4s, v\d+\.16b, v\d+\.16b", asm)) >= 2 * 4  # one group's steps of the 2 x 4 tile, unrolled
    assert "sdot" not in asm


@pytest.fixture(scope="module")
def one_b():
    config = load_model_config("llama-3.2-1b")
    by_shape = lambda funcs: {(match(f).n, match(f).k): f for f in funcs.values()}  # noqa: E731
    return by_shape(_prefill(config, "q4f16_1", ARM_I8MM)), by_shape(_prefill(config, "q4f16_1", HOST))


def _host_lib(func, rule):
    return compile_kernel(rule.apply(func, HOST, False).mod["main"], HOST)


def _host_outputs(lib, args):
    tensors = [tvm.runtime.tensor(a.copy()) for a in args]
    lib["main"](*tensors)
    return tensors[-1].numpy().astype(np.float32)


@pytest.mark.qemu
# the default (one plane, two up to 4 tokens); one plane at every token count; two planes
# the default knobs by default; the other tiles (minutes under qemu) with -m long
@pytest.mark.parametrize("knobs", [{}, pytest.param({"token_pairs": 1, "row_pairs": 8, "low_batch": 0}, marks=pytest.mark.long),
                                   pytest.param({"token_pairs": 4, "row_pairs": 2, "planes": 2}, marks=pytest.mark.long)])
def test_i8mm_prefill_runs_its_int8_arithmetic_at_1b_shapes(knobs, one_b, tmp_path):
    """qkv, o_proj, gate_up and down of the 1B (GQA 32/8 heads of 64) at 1, 7, 40 and 130 tokens
    (partial tiles, the two-plane branch, past 128), and batch_verify's lm_head (a bare matmul,
    128256 rows) against the NumPy emulation."""
    arm, host = one_b
    rule = PrefillGEMMQ4I8MM(**knobs)
    twin = PrefillGEMMQ4VNNI(planes=rule.planes, low_batch=rule.low_batch) if HOST_VNNI else None
    for shape, func in arm.items():
        program = link_aarch64(compile_kernel(rule.apply(func, ARM_I8MM, False).mod["main"], ARM_I8MM), tmp_path / f"k{shape[0]}x{shape[1]}")
        bare = not match(func).epilogue
        exact = None if bare else _host_lib(host[shape], PrefillGEMM())  # f32 arithmetic, any host
        twin_lib = None if bare or twin is None else _host_lib(host[shape], twin)
        for tokens in ((33,) if bare else (1, 7, 40, 130) if shape == (2048, 2048) else (7, 130)):
            args = random_args(func, {"seq_len": tokens}, seed=tokens)
            got = run_aarch64(program, [a.copy() for a in args])[-1].astype(np.float32)
            planes = 2 if rule.planes == 2 or tokens <= rule.low_batch else 1
            if bare:
                want = q8_emulate(func, args, tokens, planes)
                np.testing.assert_allclose(got.reshape(tokens, -1), want, rtol=1e-5, atol=1e-5 * np.abs(want).max(), err_msg=f"{shape} {tokens}")
                continue
            if twin_lib is not None:  # the same integer sums and f32 folds as the x86 rule: equal bit for bit
                np.testing.assert_array_equal(got, _host_outputs(twin_lib, args), err_msg=f"{shape} {tokens}")
            want = _host_outputs(exact, args)
            # two int8 planes: ~16-bit activations (f16's own rounding); one: ~0.4% of the group's largest value
            np.testing.assert_allclose(got, want, atol=(2e-3 if planes == 2 else 1e-2) * np.abs(want).max(), err_msg=f"{shape} {tokens}")
            assert np.abs(got - want).max() > 0  # the int8 path really ran

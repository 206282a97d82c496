"""The CPU rules' aarch64 builds executed under qemu-user (pipeline/runners/qemu_arm.py), each
kernel checked against the host's build of the same kernel, as llama.cpp's test-backend-ops checks
every backend against the CPU: every kernel of a model, then the Arm-only arithmetic (SDOT,
BFDOT) at the 1B's shapes against NumPy."""

from __future__ import annotations

import numpy as np
import pytest
import tvm

from mlcpipe.config import load_model_config
from mlcpipe.kernel_info import kernel_args, random_args
from mlcpipe.quantization import QUANTIZATIONS
from mlcpipe.runners.qemu_arm import link_aarch64, run_aarch64
from mlcpipe.targets import load_target
from mlcpipe.tuning.knobs import compile_kernel, unscheduled_kernels
from mlcpipe.schedules import schedule_func
from mlcpipe.schedules.analysis import match_nt_matmul as match
from mlcpipe.schedules.llvm.gemm_bf16 import PrefillGEMMBF16
from mlcpipe.schedules.llvm.gemm_dequant import PrefillGEMM
from mlcpipe.schedules.llvm.gemv_q4 import DecodeGEMVQ4
from mlcpipe.schedules.llvm.gemv_q4_vnni import DecodeGEMVQ4VNNI
from mlcpipe.quantization import quantization

from tests.helpers.cpu_reference import bf16_emulate

pytestmark = pytest.mark.qemu

HOST = load_target("llvm").tvm_target()
# Graviton 3 / Neoverse V1's features (no SVE code: the rules write NEON)
ARM = tvm.target.Target({"kind": "llvm", "mtriple": "aarch64-linux-gnu", "mcpu": "generic", "mattr": ["+neon", "+dotprod", "+i8mm", "+bf16", "+fullfp16"]})
ARM_DOTPROD = tvm.target.Target({"kind": "llvm", "mtriple": "aarch64-linux-gnu", "mcpu": "generic", "mattr": ["+neon", "+dotprod"]})


def _host_lib(func, sch=None):
    """The host's build of `func`: `sch` (a scheduled PrimFunc), else the rules' default."""
    return compile_kernel(sch if sch is not None else schedule_func(func, HOST)[0], HOST)


def _host(lib, args):
    tensors = [tvm.runtime.tensor(a.copy()) if isinstance(a, np.ndarray) else a for a in args]
    lib["main"](*tensors)
    return [t.numpy() if isinstance(t, tvm.runtime.Tensor) else t for t in tensors]


@pytest.mark.parametrize("quant", ["q4f16_1", pytest.param("q0f16", marks=pytest.mark.long), pytest.param("q4f32_1", marks=pytest.mark.long)])
def test_every_kernel_of_a_model_on_aarch64_matches_the_host(quant, tiny_config, tmp_path):
    """Each kernel of the tiny Llama (matmuls, attention, norms, RoPE, sampler, KV cache), built
    for aarch64 with the rules the Arm target picks, against the host's build: every output equal,
    or (the bf16 / int8 GEMMs, other sums) within the quantization's tolerance. 1, 33 and 130 tokens."""
    ours, theirs = (unscheduled_kernels(tiny_config, quantization(quant), t) for t in (ARM, HOST))
    rules, inexact = set(), []
    for name, func in ours.items():
        scheduled, record = schedule_func(func, ARM)
        rules.add(record and record["rule"])
        program = link_aarch64(compile_kernel(scheduled, ARM), tmp_path / name)
        host = _host_lib(theirs[name])
        for tokens in (1, 33, 130):
            args, label = kernel_args(func, tokens, seed=tokens)
            got = run_aarch64(program, [a.copy() if isinstance(a, np.ndarray) else a for a in args])
            want = _host(host, args)
            for i, (g, w) in enumerate(zip(got, want)):
                if not isinstance(g, np.ndarray) or np.array_equal(g, w):
                    continue
                inexact.append(name)
                g, w = g.astype(np.float64), w.astype(np.float64)
                tol = QUANTIZATIONS[quant].tolerance
                np.testing.assert_allclose(g, w, rtol=tol, atol=tol * np.abs(w).max(), err_msg=f"{name} {label} argument {i}")
    assert len(ours) > 40
    # the Arm target takes the Arm rules (quant by quant) and the shared ones
    assert {"PrefillGEMMQ4I8MM", "DecodeGEMVQ4VNNI"} <= rules if quant == "q4f16_1" else True
    assert {"PrefillGEMMBF16", "DecodeGEMVFloat"} <= rules if quant == "q0f16" else True
    assert "DecodeGEMVQ4F32" in rules if quant == "q4f32_1" else True
    assert {"RowNorm", "RopeTable", "Elementwise", "SamplerCPU"} <= rules
    # only sums may differ (bf16 / f32 GEMMs and f32 norms add in another order; the int8 rules equal
    # their x86 twins bit for bit on hosts with AVX512-VNNI): element-wise kernels, RoPE, attention equal
    assert all("NT_matmul" in n or "norm" in n for n in inexact), sorted(set(inexact))


def _one_b(quant, target, decode):
    return {(match(f).n, match(f).k): f for f in unscheduled_kernels(load_model_config("llama-3.2-1b"), quantization(quant), target).values()
            if "NT_matmul" in f.script() and (("seq_len" in f.script()) != decode)}


def test_sdot_rules_at_1b_shapes(tmp_path):
    """aarch64 with dotprod but no i8mm (Graviton 2, Neoverse N1, Apple M1): the decode GEMV and
    the prefill GEMM on SDOT, at the 1B's o_proj / qkv / down shapes; the GEMV against the f32
    GEMV (two int8 planes: ~16-bit), the GEMM at 7 and 130 tokens against the f32 GEMM."""
    for (n, k), func in _one_b("q4f16_1", ARM_DOTPROD, decode=True).items():
        if (n, k) not in ((2048, 2048), (3072, 2048), (2048, 8192)):
            continue
        sch = DecodeGEMVQ4VNNI().apply(func, ARM_DOTPROD, False)
        program = link_aarch64(compile_kernel(sch.mod["main"], ARM_DOTPROD), tmp_path / f"gemv{n}x{k}")
        args = random_args(func, {}, seed=n + k)
        got = run_aarch64(program, [a.copy() for a in args])[-1].astype(np.float32)
        want = _host(_host_lib(func, DecodeGEMVQ4().apply(func, HOST, False).mod["main"]), args)[-1].astype(np.float32)
        np.testing.assert_allclose(got, want, atol=2e-3 * np.abs(want).max(), err_msg=f"GEMV {n}x{k}")
    prefill = _one_b("q4f16_1", ARM_DOTPROD, decode=False)
    for shape in ((2048, 2048), (3072, 2048)):
        func = prefill[shape]
        sch, record = schedule_func(func, ARM_DOTPROD)
        assert record["rule"] == "PrefillGEMMQ4VNNI"
        program = link_aarch64(compile_kernel(sch, ARM_DOTPROD), tmp_path / f"gemm{shape}")
        exact = _host_lib(func, PrefillGEMM().apply(func, HOST, False).mod["main"])
        for tokens in (7, 130):
            args = random_args(func, {"seq_len": tokens}, seed=tokens)
            got = run_aarch64(program, [a.copy() for a in args])[-1].astype(np.float32)
            want = _host(exact, args)[-1].astype(np.float32)
            np.testing.assert_allclose(got, want, atol=1e-2 * np.abs(want).max(), err_msg=f"GEMM {shape} {tokens}")


def test_bfdot_prefill_at_1b_shapes(tiny_config, tmp_path):
    """PrefillGEMMBF16 on BFDOT for q0f16: the 1B's o_proj at 1, 33 and 130 tokens against the f32
    GEMM (bf16 operands: 1%), and a bare matmul against the NumPy bf16 emulation."""
    func = _one_b("q0f16", ARM, decode=False)[(2048, 2048)]
    sch = PrefillGEMMBF16().apply(func, ARM, False)
    program = link_aarch64(compile_kernel(sch.mod["main"], ARM), tmp_path / "o_proj")
    exact = _host_lib(func, PrefillGEMM().apply(func, HOST, False).mod["main"])
    for tokens in (1, 33, 130):
        args = random_args(func, {"seq_len": tokens}, seed=tokens)
        got = run_aarch64(program, [a.copy() for a in args])[-1].astype(np.float32)
        want = _host(exact, args)[-1].astype(np.float32)
        np.testing.assert_allclose(got, want, atol=1e-2 * np.abs(want).max(), err_msg=f"o_proj {tokens}")
        assert np.abs(got - want).max() > 0  # bf16 really ran
    bare = next(f for f in unscheduled_kernels(tiny_config, quantization("q0f16"), ARM).values()
                if "NT_matmul" in f.script() and "seq_len" in f.script() and not match(f).epilogue)
    program = link_aarch64(compile_kernel(PrefillGEMMBF16().apply(bare, ARM, False).mod["main"], ARM), tmp_path / "bare")
    args = random_args(bare, {"seq_len": 37}, seed=1)
    got = run_aarch64(program, [a.copy() for a in args])[-1].astype(np.float64).reshape(37, -1)
    want = bf16_emulate(bare, args, 37)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())


def test_a_kernel_error_under_qemu_is_one_clear_error(tiny_config, tmp_path):
    func = next(f for f in unscheduled_kernels(tiny_config, quantization("q4f16_1"), ARM).values() if "NT_matmul" in f.script())
    program = link_aarch64(compile_kernel(schedule_func(func, ARM)[0], ARM), tmp_path / "k")
    args = random_args(func, {"seq_len": 3}, seed=0)
    args[0] = args[0][..., :-1].copy()  # one column short
    with pytest.raises(RuntimeError, match=r"failed under qemu-aarch64 \(exit 1\): ValueError: .*shape"):
        run_aarch64(program, args)

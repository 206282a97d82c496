"""DecodeGEMVQ4F32 (schedules/llvm/gemv_q4_f32.py): the q4 decode GEMV in f32 on the row-GEMV
skeleton. Against a float64 NumPy reference and the unscheduled kernel, at several knobs, at the
1B's shapes, built for this CPU and for AVX2 + FMA only (Haswell: runs on any x86 host with AVX2);
which CPUs it takes, and the prefetches in its assembly."""

from __future__ import annotations

import re

import numpy as np
import pytest
import tvm

from mlcpipe.config import load_model_config
from mlcpipe.kernel_info import random_args
from mlcpipe.targets import load_target
from mlcpipe.tuning.knobs import unscheduled_kernels
from mlcpipe.schedules import schedule_func
from mlcpipe.schedules.analysis import match_nt_matmul as match
from mlcpipe.schedules.llvm.gemv_q4_f32 import DecodeGEMVQ4F32
from mlcpipe.schedules.llvm.gemv_q4_vnni import DecodeGEMVQ4VNNI
from mlcpipe.quantization import quantization

from tests.helpers.cpu_reference import activation_and_weight

HOST = load_target("llvm").tvm_target()
ZEN5 = tvm.target.Target({"kind": "llvm", "mcpu": "znver5"})
SPR = tvm.target.Target({"kind": "llvm", "mcpu": "sapphirerapids"})
SKYLAKE = tvm.target.Target({"kind": "llvm", "mcpu": "skylake-avx512"})  # AVX-512, no VNNI
HASWELL = tvm.target.Target({"kind": "llvm", "mcpu": "haswell"})  # AVX2 + FMA
# the rule declines on AMX CPUs: there the builds it runs are AVX-512 without AMX
RUN = SKYLAKE if tvm.target.codegen.target_has_features("amx-tile", HOST) else HOST
needs_avx2 = pytest.mark.skipif(not tvm.target.codegen.target_has_features("avx2", HOST), reason="this CPU has no AVX2")


def _decode(kernels):
    return {n: f for n, f in kernels.items() if "NT_matmul" in n and "seq_len" not in f.script()}


def _lib(func, target):
    return tvm.compile(tvm.IRModule({"main": func.with_attr("global_symbol", "main")}), target=target)


def _outputs(func, args, target=HOST):
    tensors = [tvm.runtime.tensor(a.copy()) for a in args]
    _lib(func, target)["main"](*tensors)
    return tensors[-1].numpy().astype(np.float64).reshape(-1)


def reference(func, args) -> np.ndarray:
    """x @ W^T in float64 (W dequantized as MLC), plus the residual where the kernel adds one."""
    x, w = activation_and_weight(func, args, 1, np.float64)
    y = (x @ w.T).reshape(-1)
    if len(func.params) == 5:  # o_proj / down: + residual
        y = y + args[-2].astype(np.float64).reshape(-1)
    return y


def _check(func, args, got, quant, name):
    want = reference(func, args)
    scale = np.abs(want).max()
    # f32 products and sums (f16 models: an f16 output)
    tol = 1e-5 if quant == "q4f32_1" else 2e-3
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol * scale, err_msg=name)


@pytest.mark.parametrize("quant", ["q4f32_1", "q4f16_1"])
@pytest.mark.parametrize("knobs", [{}, {"rows": 1, "prefetch": 0}, {"rows": 4, "prefetch": 16}])
def test_gemv_against_numpy_and_the_exact_kernel(quant, knobs, tiny_config):
    taken = 0
    for name, func in _decode(unscheduled_kernels(tiny_config, quantization(quant), RUN)).items():
        sch = DecodeGEMVQ4F32(**knobs).apply(func, RUN, False)
        assert sch is not None, name
        args = random_args(func, {}, seed=7)
        got = _outputs(sch.mod["main"], args, RUN)
        _check(func, args, got, quant, name)
        exact = _outputs(func, args)
        np.testing.assert_allclose(got, exact, rtol=2e-3, atol=2e-3 * np.abs(exact).max(), err_msg=name)
        taken += 1
    assert taken >= 4  # qkv, o_proj + add, gate_up, down + add, lm_head


@pytest.mark.parametrize("target", [RUN, pytest.param(HASWELL, marks=needs_avx2)], ids=["host", "haswell"])
def test_gemv_at_1b_shapes(target):
    """Llama-3.2-1B q4f32_1 qkv (3072x2048), gate_up (16384x2048) and down (2048x8192, + residual)
    with this CPU's defaults, and built for AVX2 + FMA only (nibble 7 read shifted: no unsigned
    conversion there)."""
    funcs = _decode(unscheduled_kernels(load_model_config("llama-3.2-1b"), quantization("q4f32_1"), target))
    taken = 0
    for name, func in funcs.items():
        info = match(func)
        if (info.n, info.k) not in ((3072, 2048), (16384, 2048), (2048, 8192)):
            continue
        sch = DecodeGEMVQ4F32().apply(func, target, False)
        args = random_args(func, {}, seed=info.n)
        _check(func, args, _outputs(sch.mod["main"], args, target), "q4f32_1", name)
        taken += 1
    assert taken == 3


def test_rule_choice_per_cpu(tiny_config):
    """q4f32_1 decode: this rule on every CPU, AMX ones included (one row per task there too). q4f16_1
    decode: the int8 rule where the CPU has VNNI or is AVX2-only (VPMADDUBSW), this rule on AVX-512
    without VNNI."""
    f32 = next(iter(_decode(unscheduled_kernels(tiny_config, quantization("q4f32_1"), ZEN5)).values()))
    f16 = next(iter(_decode(unscheduled_kernels(tiny_config, quantization("q4f16_1"), ZEN5)).values()))
    for target, f32_rule, f16_rule in ((ZEN5, "DecodeGEMVQ4F32", "DecodeGEMVQ4VNNI"), (HASWELL, "DecodeGEMVQ4F32", "DecodeGEMVQ4VNNI"),
                                       (SKYLAKE, "DecodeGEMVQ4F32", "DecodeGEMVQ4F32"), (SPR, "DecodeGEMVQ4F32", "DecodeGEMVQ4VNNI")):
        assert schedule_func(f32, target)[1]["rule"] == f32_rule, str(target)
        assert schedule_func(f16, target)[1]["rule"] == f16_rule, str(target)
    assert DecodeGEMVQ4F32().default_rows(SPR) == 1 and DecodeGEMVQ4VNNI().default_rows(SPR) == 2  # AMX: only the f32 rule's is 1
    assert DecodeGEMVQ4F32(rows=3).apply(f32, ZEN5, False) is None  # rows must divide N
    assert set(DecodeGEMVQ4F32().knob_space(f32, ZEN5)) == {"rows", "prefetch"}
    prefill = next(f for n, f in unscheduled_kernels(tiny_config, quantization("q4f32_1"), ZEN5).items() if "NT_matmul" in n and "seq_len" in f.script())
    q0 = next(iter(_decode(unscheduled_kernels(tiny_config, quantization("q0f32"), ZEN5)).values()))
    assert DecodeGEMVQ4F32().apply(prefill, ZEN5, False) is None and DecodeGEMVQ4F32().apply(q0, ZEN5, False) is None


def test_prefetch_in_the_assembly():
    """Each row's words and scales are prefetched (into L2 for the 1B's rows: 9 KiB of activation
    planes per row and more) unless prefetch=0; the inner loop has no unsigned conversion."""
    funcs = _decode(unscheduled_kernels(load_model_config("llama-3.2-1b"), quantization("q4f32_1"), ZEN5))
    func = next(f for f in funcs.values() if (match(f).n, match(f).k) == (2048, 8192))
    on = _lib(DecodeGEMVQ4F32().apply(func, ZEN5, False).mod["main"], ZEN5).mod.inspect_source("s")
    off = _lib(DecodeGEMVQ4F32(prefetch=0).apply(func, ZEN5, False).mod["main"], ZEN5).mod.inspect_source("s")
    assert len(re.findall(r"\bprefetcht1\b", on)) >= 2 and "prefetcht0" not in on
    assert not re.search(r"\bprefetch", off)
    assert "vcvtudq2ps" not in on and "vcvtdq2ps" in on

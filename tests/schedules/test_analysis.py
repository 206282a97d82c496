"""The one NT-matmul matcher (schedules/analysis.py): it takes the model's dequantize-matmul kernels
with the constants of their quantization entry, matches the dequantize by its structure (not by
printed TVMScript: other names and index dtypes match alike), and rejects perturbed formats.
A format registered as a quantization entry (here a 3-bit one) is matched with that entry's
constants; the 4-bit rules decline it and the generic rules compute it right."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import tvm
from tvm import te, tirx

from mlcpipe.kernel_info import random_args
from mlcpipe.quantization import QUANTIZATIONS, GroupQuantize
from mlcpipe.quantization.relax_modules import dequantize_te
from mlcpipe.targets import load_target
from mlcpipe.tuning.knobs import unscheduled_kernels
from mlcpipe.schedules import RULES
from mlcpipe.schedules.analysis import match_nt_matmul, registered_patterns
from mlcpipe.schedules.gpu.gemv_dequant import GEMVDequant
from mlcpipe.schedules.llvm.gemm_dequant import PrefillGEMM
from mlcpipe.schedules.llvm.gemv_q4 import DecodeGEMVQ4
from mlcpipe.schedules.llvm.matmul_nt import MatmulNT
from mlcpipe.quantization import quantization

TARGET = load_target("llvm").tvm_target()
Q3 = GroupQuantize(name="q3f16_1", model_dtype="float16", bits=3, group_size=40)  # MLC-LLM's q3f16_1


def nt_matmul_kernel(scheme, n: int, k: int, rows: int = 1, index_dtype: str = "int64", decode=None,
                     names=("q_weight", "q_scale"), scale_groups: int | None = None) -> tirx.PrimFunc:
    """x [1, rows, K] @ dequantize(q_weight, q_scale)^T as the model builds it (`decode`: another
    dequantize body, (q_weight, q_scale, i, j) -> value, for perturbed formats)."""
    ix = (lambda v: tirx.IntImm("int64", v)) if index_dtype == "int64" else int
    per_word, dtype = scheme.elems_per_word, scheme.model_dtype
    groups = scale_groups or k // scheme.group_size
    qw = te.placeholder((ix(n), ix(k // per_word)), "uint32", name=names[0])
    qs = te.placeholder((ix(n), ix(groups)), dtype, name=names[1])
    x = te.placeholder((ix(1), ix(rows), ix(k)), dtype, name="x")
    if decode is None:
        deq = dequantize_te(scheme, qw, qs)
    else:
        deq = te.compute((ix(n), ix(k)), lambda i, j: decode(qw, qs, i, j), name="dequantize")
    r = te.reduce_axis((ix(0), ix(k)), name="k")
    mm = te.compute((ix(1), ix(rows), ix(n)), lambda b, t, o: te.sum(x[b, t, r].astype("float32") * deq[o, r].astype("float32"), axis=r),
                    name="NT_matmul")
    out = te.compute((ix(1), ix(rows), ix(n)), lambda b, t, o: mm[b, t, o].astype(dtype), name="compute")
    return te.create_prim_func([qw, qs, x, out])


def q4_decode(shift_bits=4, zero=7, mask=15, group=32):
    """MLC's q4 dequantize with one constant changed."""

    def decode(qw, qs, i, j):
        value = (qw[i, j // 8] >> ((j % 8) * shift_bits).astype("uint32")) & tirx.const(mask, "uint32")
        return (value.astype("float16") - tirx.const(zero, "float16")) * qs[i, j // group]

    return decode


@pytest.fixture(scope="module")
def model_kernels(tiny_config):
    return {q: unscheduled_kernels(tiny_config, quantization(q), TARGET) for q in ("q4f16_1", "q4f32_1", "q0f32")}


@pytest.mark.parametrize("quant", ["q4f16_1", "q4f32_1"])
def test_model_kernels_match_with_their_entrys_format(quant, model_kernels):
    entry = QUANTIZATIONS[quant]
    fused = {n: f for n, f in model_kernels[quant].items() if n.startswith("fused_dequantize") and "NT_matmul" in n}
    assert len(fused) >= 8  # qkv, o_proj, gate_up, down, lm_head; decode and prefill
    for name, func in fused.items():
        info = match_nt_matmul(func)
        assert info is not None, name
        assert info.dequantize == entry.dequantize_pattern, name
        assert (info.bits, info.group_size, info.dequantize.zero_point, info.dequantize.elems_per_word) == (4, 32, 7, 8)
        assert info.weight.same_as(func.params[0]) and info.scale.same_as(func.params[1])
        assert [int(d) for d in info.weight.shape] == [info.n, info.k // 8]
    plain = [f for n, f in model_kernels["q0f32"].items() if "NT_matmul" in n]
    assert plain and all(match_nt_matmul(f) is not None and not match_nt_matmul(f).quantized for f in plain)
    # what is not an NT matmul: norms, elementwise kernels
    assert match_nt_matmul(model_kernels["q4f16_1"]["rms_norm"]) is None
    assert match_nt_matmul(model_kernels["q4f16_1"]["fused_split_silu_multiply"]) is None


def test_registered_patterns_are_the_entries():
    assert set(registered_patterns()) == {QUANTIZATIONS["q4f16_1"].dequantize_pattern, QUANTIZATIONS["q4f32_1"].dequantize_pattern}


def test_names_and_index_dtypes_do_not_matter():
    """The dequantize is matched by structure: int32 indices (printed `v_j // 8`, not
    `v_j // T.int64(8)`) and parameters printed under other names than their own (two named
    `w`: the printer writes `w` and `w_1`) match alike."""
    q4 = QUANTIZATIONS["q4f16_1"]
    func = nt_matmul_kernel(q4, 64, 128, index_dtype="int32", names=("w", "w"))
    assert "w_1[" in func.script() and "T.int64" not in func.script()
    info = match_nt_matmul(func)
    assert info is not None and info.dequantize == q4.dequantize_pattern and (info.n, info.k) == (64, 128)
    assert info.weight.same_as(func.params[0]) and info.scale.same_as(func.params[1])
    # and the rules take it, with the numerics of the kernel
    sch = DecodeGEMVQ4().apply(func, TARGET, False)
    assert sch is not None
    _same_output(func, sch.mod["main"], {}, q4.tolerance)


@pytest.mark.parametrize("perturbed", [
    dict(shift_bits=3),  # values read at 3-bit offsets of an 8-per-word layout
    dict(zero=8),  # zero point 8: no entry's
    dict(mask=7),  # 3-bit mask of 4-bit values
    dict(group=64),  # groups of 64: no registered entry has them
])
def test_perturbed_dequantize_is_rejected(perturbed):
    q4 = QUANTIZATIONS["q4f16_1"]
    groups = 128 // perturbed.get("group", 32)
    func = nt_matmul_kernel(q4, 64, 128, decode=q4_decode(**perturbed), scale_groups=groups)
    assert match_nt_matmul(func) is None
    assert all(rule.apply(func, TARGET, False) is None for rule in (DecodeGEMVQ4(), PrefillGEMM(), MatmulNT()))
    if perturbed.get("group") == 64:  # a consistent format: matched once an entry has it
        entry = dataclasses.replace(q4, name="q4f16_g64", group_size=64)
        assert match_nt_matmul(func, [entry.dequantize_pattern]).dequantize == entry.dequantize_pattern
    unperturbed = nt_matmul_kernel(q4, 64, 128, decode=q4_decode())
    assert match_nt_matmul(unperturbed).dequantize == q4.dequantize_pattern  # the hand-written q4 is MLC's


def test_a_3bit_entry_is_matched_with_its_constants(monkeypatch):
    """Registered, the 3-bit entry's kernels match with bits 3, 10 values per word, zero point 3;
    the 4-bit rules decline them, the generic ones compute them as the unscheduled kernel."""
    decode, prefill = nt_matmul_kernel(Q3, 32, 160), nt_matmul_kernel(Q3, 32, 160, rows=5)
    assert match_nt_matmul(decode) is None  # not a registered format
    monkeypatch.setitem(QUANTIZATIONS, Q3.name, Q3)
    info = match_nt_matmul(decode)
    assert info.dequantize == Q3.dequantize_pattern
    assert (info.bits, info.dequantize.elems_per_word, info.dequantize.zero_point, info.group_size) == (3, 10, 3, 40)
    assert DecodeGEMVQ4().apply(decode, TARGET, False) is None
    for rule in RULES["llvm"]:
        if type(rule).__name__ in ("DecodeGEMVQ4VNNI", "PrefillGEMMAMX", "PrefillGEMMQ4VNNI"):  # 4-bit only
            assert rule.apply(decode, TARGET, False) is None and rule.apply(prefill, TARGET, False) is None
    _same_output(decode, MatmulNT().apply(decode, TARGET, False).mod["main"], {}, Q3.tolerance)
    _same_output(prefill, PrefillGEMM().apply(prefill, TARGET, False).mod["main"], {}, Q3.tolerance)
    # the GPU GEMV: 10 values per word
    webgpu = load_target("webgpu").tvm_target()
    gpu = GEMVDequant.for_target("webgpu")
    assert gpu._match(decode, webgpu).elems_per_word == 10
    with webgpu:
        assert gpu.apply(decode, webgpu, False) is not None


def _same_output(func, scheduled, sizes, tol):
    args = random_args(func, sizes, seed=7)
    outs = []
    for f in (func, scheduled):
        lib = tvm.compile(tvm.IRModule({"main": f.with_attr("global_symbol", "main")}), target=TARGET)
        tensors = [tvm.runtime.tensor(a.copy()) for a in args]
        lib["main"](*tensors)
        outs.append(tensors[-1].numpy().astype(np.float32))
    want, got = outs
    assert np.abs(want).max() > 0
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol * np.abs(want).max())

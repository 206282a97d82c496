"""Group quantization (q4f16_1 / q4f32_1, and a 3-bit entry: `bits` drives the format) packing
against an element-by-element NumPy reference, and the TVM dequantize kernel against NumPy."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm import te

from mlcpipe.quantization import QUANTIZATIONS, GroupQuantize
from mlcpipe.quantization.group_quant import pack_values, unpack_values
from mlcpipe.quantization.relax_modules import dequantize_te, take_dequantize_te

# MLC-LLM's q3f16_1: 3-bit values, 10 per uint32 word (2 bits unused), zero point 3, groups of 40
Q3 = GroupQuantize(name="q3f16_1", model_dtype="float16", bits=3, group_size=40)


def reference_quantize(w: np.ndarray, dtype: str, bits: int = 4, group: int = 32):
    """Written out element by element from the format's definition (MLC-LLM's: 32 // bits values
    per word, zero point 2^(bits-1) - 1)."""
    per_word, zero = 32 // bits, 2 ** (bits - 1) - 1
    out_f, in_f = w.shape
    q_weight = np.zeros((out_f, in_f // per_word), dtype=np.uint32)
    q_scale = np.zeros((out_f, in_f // group), dtype=dtype)
    for i in range(out_f):
        for g in range(in_f // group):
            values = w[i, g * group : (g + 1) * group].astype(np.float32)
            scale = np.asarray(max(np.abs(values).max() / np.float32(zero), np.finfo(dtype).tiny), dtype=np.float32).astype(dtype)
            q_scale[i, g] = scale
            for j in range(group):
                q = int(np.clip(np.round(values[j] / np.float32(scale)) + zero, 0, 2 * zero))
                col = g * group + j
                q_weight[i, col // per_word] |= np.uint32(q << (bits * (col % per_word)))
    return q_weight, q_scale


@pytest.mark.parametrize("quant", ["q4f16_1", "q4f32_1"])
def test_packing_matches_elementwise_reference(quant):
    scheme = QUANTIZATIONS[quant]
    w = np.random.default_rng(0).standard_normal((6, 96)).astype(np.float32)
    w[0, :32] = 0.0  # an all-zero group must not divide by zero
    q_weight, q_scale = scheme.quantize_weight(w)
    ref_w, ref_s = reference_quantize(w, scheme.model_dtype)
    assert q_weight.dtype == np.uint32 and q_weight.shape == (6, 12)
    assert q_scale.dtype == np.dtype(scheme.model_dtype) and q_scale.shape == (6, 3)
    np.testing.assert_array_equal(q_weight, ref_w)
    np.testing.assert_array_equal(q_scale, ref_s)
    # dequantized = (q - 7) * scale, within half a step of the original
    deq = scheme.dequantize_weight(q_weight, q_scale)
    step = np.repeat(q_scale.astype(np.float32), 32, axis=1)
    assert np.all(np.abs(deq - w) <= 0.5 * step + 1e-3 * np.abs(w) + 1e-6)
    assert np.all(deq[0, :32] == 0)


def test_nibble_order_is_little_endian():
    q = np.arange(8, dtype=np.uint32)[None, :]  # values 0..7 in positions 0..7
    assert pack_values(q, 4)[0, 0] == 0x76543210
    np.testing.assert_array_equal(unpack_values(pack_values(q, 4), 4), q)


def test_constants_derive_from_bits():
    q4 = QUANTIZATIONS["q4f16_1"]
    assert (q4.elems_per_word, q4.zero_point, q4.mask) == (8, 7, 15)
    assert (Q3.elems_per_word, Q3.zero_point, Q3.mask) == (10, 3, 7)
    pattern = Q3.dequantize_pattern
    assert (pattern.bits, pattern.elems_per_word, pattern.zero_point, pattern.group_size) == (3, 10, 3, 40)


def test_3bit_entry_packs_3bit_values():
    """`bits` drives the packing: 10 values per word at 3-bit offsets, zero point 3, against the
    element-by-element reference; NumPy quantize -> dequantize stays within half a step."""
    w = np.random.default_rng(2).standard_normal((6, 80)).astype(np.float32)
    w[1, 40:] = 0.0
    q_weight, q_scale = Q3.quantize_weight(w)
    ref_w, ref_s = reference_quantize(w, "float16", bits=3, group=40)
    assert q_weight.shape == (6, 8) and q_scale.shape == (6, 2)
    np.testing.assert_array_equal(q_weight, ref_w)
    np.testing.assert_array_equal(q_scale, ref_s)
    values = unpack_values(q_weight, 3)
    assert values.max() <= 6 and not np.any(q_weight >> np.uint32(30))  # q in 0..2Z, top 2 bits unused
    deq = Q3.dequantize_weight(q_weight, q_scale)
    step = np.repeat(q_scale.astype(np.float32), 40, axis=1)
    assert np.all(np.abs(deq - w) <= 0.5 * step + 1e-3 * np.abs(w) + 1e-6)
    assert np.all(deq[1, 40:] == 0)


def test_formats_that_do_not_fit_a_word_are_refused():
    with pytest.raises(ValueError, match="group size 32 is not a multiple of the 10 3-bit values per uint32 word"):
        GroupQuantize(name="q3f16_bad", model_dtype="float16", bits=3, group_size=32)
    with pytest.raises(ValueError, match="bits=16"):
        GroupQuantize(name="q16", model_dtype="float16", bits=16)


def test_quantize_param_names_and_passthrough():
    scheme = QUANTIZATIONS["q4f16_1"]
    out = scheme.quantize_param("model.layers.0.mlp.down_proj.weight", np.ones((4, 64), np.float32))
    assert sorted(out) == ["model.layers.0.mlp.down_proj.q_scale", "model.layers.0.mlp.down_proj.q_weight"]
    norm = scheme.quantize_param("model.norm.weight", np.ones(64, np.float32))
    assert norm["model.norm.weight"].dtype == np.float16


@pytest.mark.parametrize("quant", ["q4f16_1", "q4f32_1", "q3f16_1"])
def test_tvm_dequantize_kernel_matches_numpy(quant):
    scheme = QUANTIZATIONS.get(quant, Q3)
    w = np.random.default_rng(1).standard_normal((16, 80 if scheme is Q3 else 64)).astype(np.float32)
    q_weight, q_scale = scheme.quantize_weight(w)
    qw = te.placeholder(q_weight.shape, "uint32", name="q_weight")
    qs = te.placeholder(q_scale.shape, scheme.model_dtype, name="q_scale")
    ids = te.placeholder((3,), "int32", name="ids")
    deq = dequantize_te(scheme, qw, qs)
    taken = take_dequantize_te(scheme, qw, qs, ids)
    target = tvm.target.Target({"kind": "llvm"})
    f_deq = tvm.compile(te.create_prim_func([qw, qs, deq]), target=target)
    f_take = tvm.compile(te.create_prim_func([qw, qs, ids, taken]), target=target)
    dev = tvm.cpu()
    out = tvm.runtime.empty(deq.shape, scheme.model_dtype, dev)
    f_deq(tvm.runtime.tensor(q_weight, dev), tvm.runtime.tensor(q_scale, dev), out)
    expected = scheme.dequantize_weight(q_weight, q_scale)
    np.testing.assert_array_equal(out.numpy().astype(np.float32), expected)
    rows = np.array([5, 0, 15], dtype=np.int32)
    out_take = tvm.runtime.empty((3, w.shape[1]), scheme.model_dtype, dev)
    f_take(tvm.runtime.tensor(q_weight, dev), tvm.runtime.tensor(q_scale, dev), tvm.runtime.tensor(rows, dev), out_take)
    np.testing.assert_array_equal(out_take.numpy().astype(np.float32), expected[rows])

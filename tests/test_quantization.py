"""q4f16_1 / q4f32_1 packing against an element-by-element NumPy reference, and the TVM
dequantize kernel against NumPy."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm import te

from pipeline.quantization import QUANTIZATIONS
from pipeline.quantization.group_quant import pack_nibbles, unpack_nibbles


def reference_quantize(w: np.ndarray, dtype: str):
    """Written out element by element from the format's definition."""
    out_f, in_f = w.shape
    q_weight = np.zeros((out_f, in_f // 8), dtype=np.uint32)
    q_scale = np.zeros((out_f, in_f // 32), dtype=dtype)
    for i in range(out_f):
        for g in range(in_f // 32):
            group = w[i, g * 32 : (g + 1) * 32].astype(np.float32)
            scale = np.asarray(max(np.abs(group).max() / np.float32(7), np.finfo(dtype).tiny), dtype=np.float32).astype(dtype)
            q_scale[i, g] = scale
            for j in range(32):
                q = int(np.clip(np.round(group[j] / np.float32(scale)) + 7, 0, 14))
                col = g * 32 + j
                q_weight[i, col // 8] |= np.uint32(q << (4 * (col % 8)))
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
    assert pack_nibbles(q)[0, 0] == 0x76543210
    np.testing.assert_array_equal(unpack_nibbles(pack_nibbles(q)), q)


def test_quantize_param_names_and_passthrough():
    scheme = QUANTIZATIONS["q4f16_1"]
    out = scheme.quantize_param("model.layers.0.mlp.down_proj.weight", np.ones((4, 64), np.float32))
    assert sorted(out) == ["model.layers.0.mlp.down_proj.q_scale", "model.layers.0.mlp.down_proj.q_weight"]
    norm = scheme.quantize_param("model.norm.weight", np.ones(64, np.float32))
    assert norm["model.norm.weight"].dtype == np.float16


@pytest.mark.parametrize("quant", ["q4f16_1", "q4f32_1"])
def test_tvm_dequantize_kernel_matches_numpy(quant):
    scheme = QUANTIZATIONS[quant]
    w = np.random.default_rng(1).standard_normal((16, 64)).astype(np.float32)
    q_weight, q_scale = scheme.quantize_weight(w)
    qw = te.placeholder(q_weight.shape, "uint32", name="q_weight")
    qs = te.placeholder(q_scale.shape, scheme.model_dtype, name="q_scale")
    ids = te.placeholder((3,), "int32", name="ids")
    deq = scheme.dequantize_te(qw, qs)
    taken = scheme.take_dequantize_te(qw, qs, ids)
    target = tvm.target.Target({"kind": "llvm"})
    f_deq = tvm.compile(te.create_prim_func([qw, qs, deq]), target=target)
    f_take = tvm.compile(te.create_prim_func([qw, qs, ids, taken]), target=target)
    dev = tvm.cpu()
    out = tvm.runtime.empty(deq.shape, scheme.model_dtype, dev)
    f_deq(tvm.runtime.tensor(q_weight, dev), tvm.runtime.tensor(q_scale, dev), out)
    expected = scheme.dequantize_weight(q_weight, q_scale)
    np.testing.assert_array_equal(out.numpy().astype(np.float32), expected)
    rows = np.array([5, 0, 15], dtype=np.int32)
    out_take = tvm.runtime.empty((3, 64), scheme.model_dtype, dev)
    f_take(tvm.runtime.tensor(q_weight, dev), tvm.runtime.tensor(q_scale, dev), tvm.runtime.tensor(rows, dev), out_take)
    np.testing.assert_array_equal(out_take.numpy().astype(np.float32), expected[rows])

"""The compile side of the quantization entries: Relax `nn` modules that replace a model's Linear
and Embedding layers, and the TE dequantize they compute (the format: group_quant.py)."""

from __future__ import annotations

import functools

from tvm import te, tirx
from tvm.relax.frontend import nn
from tvm.relax.frontend.nn import op

from ..model.layers import Embedding, Linear, nt_matmul, with_bias
from .group_quant import STORAGE_DTYPE, GroupQuantize


def quantize_model(model: nn.Module, scheme) -> nn.Module:
    """`model` with its Linear / Embedding layers replaced by `scheme`'s (unquantized schemes
    keep the model, built in their dtype already)."""
    if isinstance(scheme, GroupQuantize):
        _replace_children(model, scheme)
    return model


def _decode(scheme: GroupQuantize, word, j):
    shift = ((j % scheme.elems_per_word) * scheme.bits).astype(STORAGE_DTYPE)
    value = tirx.bitwise_and(tirx.shift_right(word, shift), tirx.const(scheme.mask, STORAGE_DTYPE))
    return value.astype(scheme.model_dtype) - tirx.const(scheme.zero_point, scheme.model_dtype)


def dequantize_te(scheme: GroupQuantize, q_weight: te.Tensor, q_scale: te.Tensor) -> te.Tensor:
    out_f, packed = q_weight.shape
    per_word = scheme.elems_per_word
    return te.compute(
        (out_f, packed * per_word),
        lambda i, j: _decode(scheme, q_weight[i, j // per_word], j) * q_scale[i, j // scheme.group_size],
        name="dequantize",
    )


def take_dequantize_te(scheme: GroupQuantize, q_weight: te.Tensor, q_scale: te.Tensor, ids: te.Tensor) -> te.Tensor:
    (num,) = ids.shape
    _, packed = q_weight.shape
    per_word = scheme.elems_per_word
    return te.compute(
        (num, packed * per_word),
        lambda t, j: _decode(scheme, q_weight[ids[t], j // per_word], j) * q_scale[ids[t], j // scheme.group_size],
        name="take_dequantize",
    )


class GroupQuantLinear(nn.Module):
    """y = x @ dequantize(q_weight, q_scale)^T, accumulated in float32."""

    def __init__(self, in_features: int, out_features: int, scheme: GroupQuantize, bias: bool = False):
        self.in_features, self.out_features, self.scheme = in_features, out_features, scheme
        self.q_weight = nn.Parameter((out_features, in_features // scheme.elems_per_word), STORAGE_DTYPE)
        self.q_scale = nn.Parameter((out_features, in_features // scheme.group_size), scheme.model_dtype)
        self.bias = nn.Parameter((out_features,), scheme.model_dtype) if bias else None  # not quantized

    def forward(self, x: nn.Tensor) -> nn.Tensor:
        w = op.tensor_expr_op(functools.partial(dequantize_te, self.scheme), "dequantize", [self.q_weight, self.q_scale])
        return with_bias(nt_matmul(x, w, self.scheme.model_dtype), self.bias)


class GroupQuantEmbedding(nn.Module):
    """Quantized embedding table; `lm_head_forward` serves a tied lm_head from it."""

    def __init__(self, num: int, dim: int, scheme: GroupQuantize):
        self.num, self.dim, self.scheme = num, dim, scheme
        self.q_weight = nn.Parameter((num, dim // scheme.elems_per_word), STORAGE_DTYPE)
        self.q_scale = nn.Parameter((num, dim // scheme.group_size), scheme.model_dtype)

    def forward(self, ids: nn.Tensor) -> nn.Tensor:
        return op.tensor_expr_op(functools.partial(take_dequantize_te, self.scheme), "take_dequantize",
                                 [self.q_weight, self.q_scale, ids])

    def lm_head_forward(self, x: nn.Tensor) -> nn.Tensor:
        w = op.tensor_expr_op(functools.partial(dequantize_te, self.scheme), "dequantize", [self.q_weight, self.q_scale])
        return nt_matmul(x, w, "float32")


def _replace_children(module: nn.Module, scheme: GroupQuantize) -> None:
    for attr, child in list(vars(module).items()):
        if isinstance(child, Linear):
            setattr(module, attr, GroupQuantLinear(child.in_features, child.out_features, scheme, bias=child.bias is not None))
        elif isinstance(child, Embedding):
            setattr(module, attr, GroupQuantEmbedding(child.num, child.dim, scheme))
        elif isinstance(child, nn.ModuleList):
            for sub in child:
                _replace_children(sub, scheme)
        elif isinstance(child, nn.Module):
            _replace_children(child, scheme)

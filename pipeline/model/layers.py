"""Unquantized building blocks shared by models (quantization swaps Linear / Embedding)."""

from __future__ import annotations

from tvm.relax.frontend import nn
from tvm.relax.frontend.nn import op


def nt_matmul(x: nn.Tensor, weight: nn.Tensor, out_dtype: str) -> nn.Tensor:
    """x @ weight^T with weight in (out, in) layout, accumulated in float32, cast to out_dtype.

    FuseTransposeMatmul turns the permute + matmul into one `NT_matmul`; the cast and any
    elementwise consumer fuse into it as an epilogue.
    """
    y = op.matmul(x, op.permute_dims(weight), out_dtype="float32")
    return y if out_dtype == "float32" else y.astype(out_dtype)


class Linear(nn.Module):
    """Linear layer, weight (out, in), float32 accumulation; with `bias`, a bias (out,) added in the
    model dtype (quantization keeps it unquantized)."""

    def __init__(self, in_features: int, out_features: int, dtype: str, bias: bool = False):
        self.in_features, self.out_features, self.dtype = in_features, out_features, dtype
        self.weight = nn.Parameter((out_features, in_features), dtype)
        self.bias = nn.Parameter((out_features,), dtype) if bias else None

    def forward(self, x: nn.Tensor) -> nn.Tensor:
        return with_bias(nt_matmul(x, self.weight, self.dtype), self.bias)


def with_bias(y: nn.Tensor, bias: nn.Parameter | None) -> nn.Tensor:
    return y if bias is None else y + bias


class Embedding(nn.Module):
    """Token embedding table (num, dim); `lm_head_forward` serves a tied lm_head."""

    def __init__(self, num: int, dim: int, dtype: str):
        self.num, self.dim, self.dtype = num, dim, dtype
        self.weight = nn.Parameter((num, dim), dtype)

    def forward(self, ids: nn.Tensor) -> nn.Tensor:
        return op.take(self.weight, ids, axis=0)

    def lm_head_forward(self, x: nn.Tensor) -> nn.Tensor:
        return nt_matmul(x, self.weight, "float32")

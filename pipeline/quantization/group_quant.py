"""q4f16_1 / q4f32_1: MLC-LLM's group quantization, bit for bit.

Format (identical to MLC-LLM's `GroupQuantize` with linear_weight_layout "NK"):
- int4 symmetric, group size 32 along the input (K) axis;
- `q_weight`: uint32 (out, in/8), 8 values per word, value k of a word in bits [4k, 4k+4)
  (little-endian nibbles);
- `q_scale`: model dtype (out, in/32), scale = max|w| / 7;
- q = clip(round(w / scale) + 7, 0, 14); dequantized w' = (q - 7) * scale.
Embedding tables use the same layout (vocab, hidden/8); a tied lm_head reads them.
"""

from __future__ import annotations

import dataclasses

import numpy as np
from tvm import te, tirx
from tvm.relax.frontend import nn
from tvm.relax.frontend.nn import op

from ..model.layers import Embedding, Linear, nt_matmul

BITS = 4
GROUP_SIZE = 32
STORAGE_DTYPE = "uint32"
PER_STORAGE = 32 // BITS  # 8 nibbles per uint32
MAX_INT = (1 << (BITS - 1)) - 1  # 7
MASK = (1 << BITS) - 1


@dataclasses.dataclass(frozen=True)
class GroupQuantize:
    name: str
    model_dtype: str
    kind: str = "group-quant"
    bits: int = BITS
    group_size: int = GROUP_SIZE

    # ---- shape rules -------------------------------------------------------------------
    def check_shapes(self, config) -> None:
        from ..errors import ConfigError

        fields = {
            "hidden_size": config.hidden_size,
            "intermediate_size": config.intermediate_size,
            "num_attention_heads * head_dim": config.num_attention_heads * config.head_dim,
        }
        for field, value in fields.items():
            if value % self.group_size:
                raise ConfigError(
                    f"{config.source}: field '{field}': got {value}; {self.name} needs a "
                    f"multiple of its group size {self.group_size}"
                )

    # ---- NumPy side: weight conversion and reference -----------------------------------
    def quantize_weight(self, weight: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """float (out, in) -> (q_weight uint32 (out, in/8), q_scale (out, in/32))."""
        out_f, in_f = weight.shape
        if in_f % self.group_size:
            raise ValueError(f"input size {in_f} is not a multiple of group size {self.group_size}")
        w = weight.astype(np.float32).reshape(out_f, in_f // self.group_size, self.group_size)
        max_abs = np.abs(w).max(axis=-1)
        # floor at the dtype's smallest normal number, so an all-zero group gets q = 7, not 0/0
        tiny = np.finfo(self.model_dtype).tiny
        scale = np.maximum(max_abs / np.float32(MAX_INT), tiny).astype(self.model_dtype)
        scale_f32 = scale.astype(np.float32)[..., None]
        q = np.clip(np.round(w / scale_f32) + MAX_INT, 0, 2 * MAX_INT).astype(np.uint32)
        return pack_nibbles(q.reshape(out_f, in_f)), scale

    def dequantize_weight(self, q_weight: np.ndarray, q_scale: np.ndarray) -> np.ndarray:
        """(q_weight, q_scale) -> float32 (out, in), exactly as the kernels compute it."""
        q = unpack_nibbles(q_weight).astype(np.float32) - MAX_INT
        scale = np.repeat(q_scale.astype(np.float32), self.group_size, axis=1)
        return (q.astype(self.model_dtype) * scale.astype(self.model_dtype)).astype(np.float32)

    def quantize_param(self, name: str, weight: np.ndarray) -> dict[str, np.ndarray]:
        """Logical parameter -> stored tensors. 2-D matrices are quantized, the rest cast."""
        if weight.ndim != 2:
            return {name: np.ascontiguousarray(weight.astype(self.model_dtype))}
        base = name[: -len(".weight")]
        q_weight, q_scale = self.quantize_weight(weight)
        return {f"{base}.q_weight": q_weight, f"{base}.q_scale": q_scale}

    def dequantize_param(self, name: str, stored: dict[str, np.ndarray]) -> np.ndarray:
        if name in stored:
            return stored[name].astype(np.float32)
        base = name[: -len(".weight")]
        return self.dequantize_weight(stored[f"{base}.q_weight"], stored[f"{base}.q_scale"])

    # ---- Relax side: replace Linear / Embedding by quantized modules --------------------
    def quantize_model(self, model: nn.Module) -> nn.Module:
        _replace_children(model, self)
        return model

    def dequantize_te(self, q_weight: te.Tensor, q_scale: te.Tensor) -> te.Tensor:
        out_f, packed = q_weight.shape
        return te.compute(
            (out_f, packed * PER_STORAGE),
            lambda i, j: self._decode(q_weight[i, j // PER_STORAGE], j) * q_scale[i, j // self.group_size],
            name="dequantize",
        )

    def take_dequantize_te(self, q_weight: te.Tensor, q_scale: te.Tensor, ids: te.Tensor) -> te.Tensor:
        (num,) = ids.shape
        _, packed = q_weight.shape
        return te.compute(
            (num, packed * PER_STORAGE),
            lambda t, j: self._decode(q_weight[ids[t], j // PER_STORAGE], j)
            * q_scale[ids[t], j // self.group_size],
            name="take_dequantize",
        )

    def _decode(self, word, j):
        shift = ((j % PER_STORAGE) * BITS).astype(STORAGE_DTYPE)
        nibble = tirx.bitwise_and(tirx.shift_right(word, shift), tirx.const(MASK, STORAGE_DTYPE))
        return nibble.astype(self.model_dtype) - tirx.const(MAX_INT, self.model_dtype)


def pack_nibbles(q: np.ndarray) -> np.ndarray:
    """uint values < 16, (out, in) -> uint32 (out, in/8), value k of a word in bits [4k, 4k+4)."""
    out_f, in_f = q.shape
    q = q.astype(np.uint32).reshape(out_f, in_f // PER_STORAGE, PER_STORAGE)
    shifts = (np.arange(PER_STORAGE, dtype=np.uint32) * BITS)
    return np.bitwise_or.reduce(q << shifts, axis=-1).astype(np.uint32)


def unpack_nibbles(words: np.ndarray) -> np.ndarray:
    shifts = (np.arange(PER_STORAGE, dtype=np.uint32) * BITS)
    nibbles = (words[..., None] >> shifts) & MASK
    return nibbles.reshape(words.shape[0], -1).astype(np.uint32)


class GroupQuantLinear(nn.Module):
    """y = x @ dequantize(q_weight, q_scale)^T, accumulated in float32."""

    def __init__(self, in_features: int, out_features: int, scheme: GroupQuantize):
        self.in_features, self.out_features, self.scheme = in_features, out_features, scheme
        self.q_weight = nn.Parameter((out_features, in_features // PER_STORAGE), STORAGE_DTYPE)
        self.q_scale = nn.Parameter((out_features, in_features // scheme.group_size), scheme.model_dtype)

    def forward(self, x: nn.Tensor) -> nn.Tensor:
        w = op.tensor_expr_op(self.scheme.dequantize_te, "dequantize", [self.q_weight, self.q_scale])
        return nt_matmul(x, w, self.scheme.model_dtype)


class GroupQuantEmbedding(nn.Module):
    """Quantized embedding table; `lm_head_forward` serves a tied lm_head from it."""

    def __init__(self, num: int, dim: int, scheme: GroupQuantize):
        self.num, self.dim, self.scheme = num, dim, scheme
        self.q_weight = nn.Parameter((num, dim // PER_STORAGE), STORAGE_DTYPE)
        self.q_scale = nn.Parameter((num, dim // scheme.group_size), scheme.model_dtype)

    def forward(self, ids: nn.Tensor) -> nn.Tensor:
        return op.tensor_expr_op(
            self.scheme.take_dequantize_te, "take_dequantize", [self.q_weight, self.q_scale, ids]
        )

    def lm_head_forward(self, x: nn.Tensor) -> nn.Tensor:
        w = op.tensor_expr_op(self.scheme.dequantize_te, "dequantize", [self.q_weight, self.q_scale])
        return nt_matmul(x, w, "float32")


def _replace_children(module: nn.Module, scheme: GroupQuantize) -> None:
    for attr, child in list(vars(module).items()):
        if isinstance(child, Linear):
            setattr(module, attr, GroupQuantLinear(child.in_features, child.out_features, scheme))
        elif isinstance(child, Embedding):
            setattr(module, attr, GroupQuantEmbedding(child.num, child.dim, scheme))
        elif isinstance(child, nn.ModuleList):
            for sub in child:
                _replace_children(sub, scheme)
        elif isinstance(child, nn.Module):
            _replace_children(child, scheme)

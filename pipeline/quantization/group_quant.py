"""q4f16_1 / q4f32_1: MLC-LLM's group quantization, bit for bit.

Format (identical to MLC-LLM's `GroupQuantize` with linear_weight_layout "NK"); every constant
derives from the entry's `bits` and `group_size`, as MLC-LLM derives them:
- symmetric int`bits` values, one scale per `group_size` consecutive inputs (K axis);
- `q_weight`: uint32 (out, in / E), E = 32 // bits values per word (8 for 4 bits, 10 for 3), value
  e of a word in bits [bits * e, bits * (e + 1)) (little-endian; 32 - E * bits high bits unused);
- `q_scale`: model dtype (out, in / group_size), scale = max|w| / Z with the zero point
  Z = 2^(bits - 1) - 1 (7 for 4 bits);
- q = clip(round(w / scale) + Z, 0, 2 Z); dequantized w' = (q - Z) * scale.
Embedding tables use the same layout (vocab, hidden / E); a tied lm_head reads them.

The entry also says what its dequantize looks like in TIR (`dequantize_pattern`): the schedule
rules match fused dequantize-matmul kernels against it (schedules/analysis.py). This module is
NumPy only (the run side converts and checks with it); the Relax modules are in relax_modules.py.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from .tolerance import TOLERANCE

STORAGE_DTYPE = "uint32"
STORAGE_BITS = 32


@dataclasses.dataclass(frozen=True)
class DequantizePattern:
    """The constants of a group-quantized weight's dequantize, as it appears in a kernel:

        D[n, k] = (cast(model_dtype, (W[n, k // elems_per_word] >> cast(storage_dtype, k % elems_per_word * bits))
                   & mask) - zero_point) * S[n, k // group_size]

    W: `storage_dtype` (N, K / elems_per_word); S, D: `model_dtype`, S (N, K / group_size)."""

    bits: int
    elems_per_word: int
    mask: int
    zero_point: int
    group_size: int
    storage_dtype: str
    model_dtype: str


@dataclasses.dataclass(frozen=True)
class GroupQuantize:
    name: str
    model_dtype: str
    kind: str = "group-quant"
    bits: int = 4
    group_size: int = 32

    def __post_init__(self):
        if not 2 <= self.bits <= 8:
            raise ValueError(f"{self.name}: bits={self.bits}: group quantization stores 2- to 8-bit values")
        if self.group_size % self.elems_per_word:
            raise ValueError(
                f"{self.name}: group size {self.group_size} is not a multiple of the {self.elems_per_word} "
                f"{self.bits}-bit values per {STORAGE_DTYPE} word"
            )

    # ---- the format's constants (MLC-LLM's num_elem_per_storage, max_int_value) -------------
    @property
    def elems_per_word(self) -> int:
        return STORAGE_BITS // self.bits

    @property
    def zero_point(self) -> int:
        return (1 << (self.bits - 1)) - 1

    @property
    def mask(self) -> int:
        return (1 << self.bits) - 1

    @property
    def dequantize_pattern(self) -> DequantizePattern:
        return DequantizePattern(self.bits, self.elems_per_word, self.mask, self.zero_point, self.group_size,
                                 STORAGE_DTYPE, self.model_dtype)

    @property
    def tolerance(self) -> float:
        """Relative error allowed between two computations of one of this model's kernels."""
        return TOLERANCE[self.model_dtype]

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
        """float (out, in) -> (q_weight uint32 (out, in / E), q_scale (out, in / group_size))."""
        out_f, in_f = weight.shape
        if in_f % self.group_size:
            raise ValueError(f"input size {in_f} is not a multiple of group size {self.group_size}")
        w = weight.astype(np.float32).reshape(out_f, in_f // self.group_size, self.group_size)
        max_abs = np.abs(w).max(axis=-1)
        # floor at the dtype's smallest normal number, so an all-zero group gets q = Z, not 0/0
        tiny = np.finfo(self.model_dtype).tiny
        scale = np.maximum(max_abs / np.float32(self.zero_point), tiny).astype(self.model_dtype)
        scale_f32 = scale.astype(np.float32)[..., None]
        q = np.clip(np.round(w / scale_f32) + self.zero_point, 0, 2 * self.zero_point).astype(np.uint32)
        return pack_values(q.reshape(out_f, in_f), self.bits), scale

    def dequantize_weight(self, q_weight: np.ndarray, q_scale: np.ndarray) -> np.ndarray:
        """(q_weight, q_scale) -> float32 (out, in), exactly as the kernels compute it."""
        q = unpack_values(q_weight, self.bits).astype(np.float32) - self.zero_point
        scale = np.repeat(q_scale.astype(np.float32), self.group_size, axis=1)
        return (q.astype(self.model_dtype) * scale.astype(self.model_dtype)).astype(np.float32)

    def quantize_param(self, name: str, weight: np.ndarray) -> dict[str, np.ndarray]:
        """Logical parameter -> stored tensors. 2-D matrices are quantized, the rest cast."""
        if weight.ndim != 2:
            return {name: np.ascontiguousarray(weight.astype(self.model_dtype))}
        base = name[: -len(".weight")]
        q_weight, q_scale = self.quantize_weight(weight)
        return {f"{base}.q_weight": q_weight, f"{base}.q_scale": q_scale}


def pack_values(q: np.ndarray, bits: int) -> np.ndarray:
    """uint values < 2^bits, (out, in) -> uint32 (out, in / E), E = 32 // bits values per word,
    value e of a word in bits [bits * e, bits * (e + 1))."""
    per_word = STORAGE_BITS // bits
    out_f, in_f = q.shape
    q = q.astype(np.uint32).reshape(out_f, in_f // per_word, per_word)
    shifts = np.arange(per_word, dtype=np.uint32) * bits
    return np.bitwise_or.reduce(q << shifts, axis=-1).astype(np.uint32)


def unpack_values(words: np.ndarray, bits: int) -> np.ndarray:
    per_word = STORAGE_BITS // bits
    shifts = np.arange(per_word, dtype=np.uint32) * bits
    values = (words[..., None] >> shifts) & np.uint32((1 << bits) - 1)
    return values.reshape(words.shape[0], -1).astype(np.uint32)

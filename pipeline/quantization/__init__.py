"""Quantization registry: name -> scheme (a plain dict, as MLC-LLM keeps it).

Each scheme owns its format: the constants it derives from its fields (group_quant.py), the
dequantize pattern the schedule rules match, and the tolerance its kernels are checked at
(tolerance.py, one table). The interface turns a name into its scheme once (`ModelConfig.scheme`,
`quantization`); everything below it takes the scheme.
"""

from __future__ import annotations

from typing import Union

from ..errors import ConfigError
from .group_quant import DequantizePattern, GroupQuantize
from .no_quant import NoQuantize
from .tolerance import TOLERANCE

QUANTIZATIONS = {
    "q0f16": NoQuantize(name="q0f16", model_dtype="float16"),
    "q0f32": NoQuantize(name="q0f32", model_dtype="float32"),
    "q4f16_1": GroupQuantize(name="q4f16_1", model_dtype="float16"),
    "q4f32_1": GroupQuantize(name="q4f32_1", model_dtype="float32"),
}

Quantization = Union[GroupQuantize, NoQuantize]


def quantization(name: str, field: str = "--quant") -> Quantization:
    """The scheme called `name` (from a flag or a record's `field`); one line naming the allowed ones otherwise."""
    if name not in QUANTIZATIONS:
        raise ConfigError(f"{field} {name!r}: unknown quantization; allowed: {sorted(QUANTIZATIONS)}")
    return QUANTIZATIONS[name]


__all__ = ["QUANTIZATIONS", "TOLERANCE", "DequantizePattern", "GroupQuantize", "NoQuantize", "Quantization", "quantization"]

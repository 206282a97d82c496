"""Quantization registry: name -> scheme (a plain dict, as MLC-LLM keeps it)."""

from .group_quant import GroupQuantize
from .no_quant import NoQuantize

QUANTIZATIONS = {
    "q0f16": NoQuantize(name="q0f16", model_dtype="float16"),
    "q0f32": NoQuantize(name="q0f32", model_dtype="float32"),
    "q4f16_1": GroupQuantize(name="q4f16_1", model_dtype="float16"),
    "q4f32_1": GroupQuantize(name="q4f32_1", model_dtype="float32"),
}

__all__ = ["QUANTIZATIONS", "GroupQuantize", "NoQuantize"]

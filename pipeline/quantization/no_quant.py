"""q0f16 / q0f32: weights kept unquantized in the model dtype."""

from __future__ import annotations

import dataclasses

import numpy as np


@dataclasses.dataclass(frozen=True)
class NoQuantize:
    name: str
    model_dtype: str
    kind: str = "no-quant"

    def check_shapes(self, config) -> None:  # any shape works unquantized
        del config

    def quantize_model(self, model):
        """The model is built in `model_dtype` already; nothing to replace."""
        return model

    def quantize_param(self, name: str, weight: np.ndarray) -> dict[str, np.ndarray]:
        """Parameter `name` in float -> stored tensors (here: one tensor, cast)."""
        return {name: np.ascontiguousarray(weight.astype(self.model_dtype))}

    def dequantize_param(self, name: str, stored: dict[str, np.ndarray]) -> np.ndarray:
        return stored[name].astype(np.float32)

    def stored_names(self, name: str, quantized: bool) -> list[str]:
        del quantized
        return [name]

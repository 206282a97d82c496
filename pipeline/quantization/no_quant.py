"""q0f16 / q0f32: weights kept unquantized in the model dtype."""

from __future__ import annotations

import dataclasses

import numpy as np

from .tolerance import TOLERANCE


@dataclasses.dataclass(frozen=True)
class NoQuantize:
    name: str
    model_dtype: str
    kind: str = "no-quant"

    @property
    def tolerance(self) -> float:
        """Relative error allowed between two computations of one of this model's kernels."""
        return TOLERANCE[self.model_dtype]

    def check_shapes(self, config) -> None:  # any shape works unquantized
        del config

    def quantize_param(self, name: str, weight: np.ndarray) -> dict[str, np.ndarray]:
        """Parameter `name` in float -> stored tensors (here: one tensor, cast)."""
        return {name: np.ascontiguousarray(weight.astype(self.model_dtype))}

"""Seeded random inputs of a PrimFunc's real shapes, symbolic dims bound to chosen sizes."""

from __future__ import annotations

import numpy as np
import tvm
from tvm.sym.analyzer import Analyzer


def concrete_shape(shape, sizes: dict[str, int]) -> tuple[int, ...]:
    """Evaluate each dim with symbolic vars bound by name (`sizes`)."""
    out = []
    for dim in shape:
        analyzer = Analyzer()
        for var in tvm.tirx.analysis.undefined_vars(dim):
            if var.name not in sizes:
                raise ValueError(f"symbolic dim '{var.name}' has no size; give one of it in sizes")
            analyzer.bind(var, tvm.tirx.const(sizes[var.name], str(var.ty)))
        value = analyzer.simplify(dim)
        out.append(int(value))
    return tuple(out)


def random_array(shape: tuple[int, ...], dtype: str, rng: np.random.Generator) -> np.ndarray:
    if dtype == "uint32":  # packed int4 words: every bit pattern is a valid set of nibbles
        return rng.integers(0, 2**32, size=shape, dtype=np.uint64).astype(np.uint32)
    if dtype.startswith(("int", "uint")):
        return rng.integers(0, 8, size=shape).astype(dtype)
    return (rng.standard_normal(shape) * 0.5).astype(dtype)


def random_args(func: tvm.tirx.PrimFunc, sizes: dict[str, int], seed: int = 0) -> list[np.ndarray]:
    """One array per buffer parameter (inputs random, outputs zero-filled alike)."""
    rng = np.random.default_rng(seed)
    return [random_array(concrete_shape(p.shape, sizes), str(p.dtype), rng) for p in func.params]

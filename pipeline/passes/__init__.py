"""Compiler passes (one per module) and the phased pipeline that runs them."""

from .fuse_dequantize_matmul import FuseDequantizeMatmul
from .pipeline import PHASES, run_pipeline

__all__ = ["FuseDequantizeMatmul", "PHASES", "run_pipeline"]

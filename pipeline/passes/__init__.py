"""Compiler passes (one per module) and the phased pipeline that runs them."""

from .fuse_dequantize_matmul import FuseDequantizeMatmul
from .pipeline import PHASES, phase_passes, run_pipeline

__all__ = ["FuseDequantizeMatmul", "PHASES", "phase_passes", "run_pipeline"]

"""Model registry. The run side needs only how each architecture's weights map onto Hugging Face
tensors (NumPy, `WEIGHT_MAPS`); the Relax modules are the compile side's (create.py)."""

from .llama_weights import llama_hf_sources

WEIGHT_MAPS = {"llama": llama_hf_sources}  # architecture -> config -> [WeightSource]

__all__ = ["WEIGHT_MAPS"]

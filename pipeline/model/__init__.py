"""Model registry. The run side needs only how each architecture's weights map onto Hugging Face
tensors (NumPy, `WEIGHT_MAPS`); the Relax modules, one per family, are the compile side's
(create.py)."""

from .weight_maps import decoder_hf_sources

# architecture -> config -> [WeightSource]
WEIGHT_MAPS = {"llama": decoder_hf_sources, "qwen2": decoder_hf_sources, "qwen3": decoder_hf_sources,
               "gemma3": decoder_hf_sources}

__all__ = ["WEIGHT_MAPS"]

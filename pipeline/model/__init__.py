"""Model registry: architecture name -> (module class, HF weight map)."""

from .llama import LlamaForCausalLM
from .llama_weights import llama_hf_sources

MODELS = {
    "llama": {"module": LlamaForCausalLM, "hf_sources": llama_hf_sources},
}

__all__ = ["MODELS", "LlamaForCausalLM"]

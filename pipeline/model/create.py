"""The Relax nn.Module of a model config, quantized: what the build and the weight converter share."""

from __future__ import annotations

from ..config import ModelConfig
from ..quantization import QUANTIZATIONS
from ..quantization.relax_modules import quantize_model
from .llama import LlamaForCausalLM

MODULES = {"llama": LlamaForCausalLM}  # architecture -> Relax nn.Module class


def create_model(config: ModelConfig, quant: str, target):
    """The Relax nn.Module of `config`, quantized by `quant` (`target`: a tvm.target.Target)."""
    scheme = QUANTIZATIONS[quant]
    model = MODULES[config.architecture](config, scheme.model_dtype, target)
    return quantize_model(model, scheme)

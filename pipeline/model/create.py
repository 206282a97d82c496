"""The Relax nn.Module of a model config, quantized: what the build and the weight converter share."""

from __future__ import annotations

from ..config import ModelConfig
from ..quantization import Quantization
from ..quantization.relax_modules import quantize_model
from .gemma3 import Gemma3ForCausalLM
from .llama import LlamaForCausalLM
from .qwen2 import Qwen2ForCausalLM
from .qwen3 import Qwen3ForCausalLM

# architecture -> Relax nn.Module class (one module per family)
MODULES = {"llama": LlamaForCausalLM, "qwen2": Qwen2ForCausalLM, "qwen3": Qwen3ForCausalLM, "gemma3": Gemma3ForCausalLM}


def create_model(config: ModelConfig, quant: Quantization, target):
    """The Relax nn.Module of `config`, quantized by `quant` (`target`: a tvm.target.Target)."""
    model = MODULES[config.architecture](config, quant.model_dtype, target)
    return quantize_model(model, quant)

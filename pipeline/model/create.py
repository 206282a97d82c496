"""The Relax nn.Module of a model config, quantized: what the build and the weight converter share."""

from __future__ import annotations

from ..config import ModelConfig
from ..quantization import QUANTIZATIONS
from . import MODELS


def create_model(config: ModelConfig, quant: str, target):
    """The Relax nn.Module of `config`, quantized by `quant` (`target`: a tvm.target.Target)."""
    scheme = QUANTIZATIONS[quant]
    model = MODELS[config.architecture]["module"](config, scheme.model_dtype, target)
    return scheme.quantize_model(model)

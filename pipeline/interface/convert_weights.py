"""`mlcpipe convert-weights`: a checkpoint (or synthetic weights) quantized into MLC's tensor cache."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path


def convert_weights(model: str, quant: str, source: str, output: Path, seed: int | None = None,
                    log: Callable[[str], None] = print, allow_unused: bool = False) -> Path:
    """Quantize `source` ('synthetic' or a HF checkpoint dir) into `output`; returns it."""
    from ..config import load_model_config
    from ..errors import OptionError
    from ..weights import convert_weights as run_convert

    if seed is not None and source != "synthetic":
        raise OptionError("--seed applies to --source synthetic only (a checkpoint's weights are read from its files)")
    config = load_model_config(model)
    return run_convert(config, config.scheme(quant), source, output, seed=seed or 0, log=log, allow_unused=allow_unused)

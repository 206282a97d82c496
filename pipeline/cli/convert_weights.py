"""`mlcpipe convert-weights`: arguments only (pipeline/interface/convert_weights.py does the work)."""

from __future__ import annotations

from pathlib import Path

import click

from .common import DEFAULT_MODEL, Command, log


@click.command("convert-weights", cls=Command)
@click.option("--model", default=DEFAULT_MODEL, show_default=True, help="Config name in configs/models/ or a YAML path.")
@click.option("--quant", required=True, help="q0f16, q0f32, q4f16_1 or q4f32_1.")
@click.option("--source", required=True, help="Hugging Face checkpoint dir (config.json + *.safetensors) or 'synthetic'.")
@click.option("--output", type=click.Path(path_type=Path), required=True, help="Output dir for shards + tensor-cache.json.")
@click.option("--seed", type=click.IntRange(min=0), default=None, help="Seed for --source synthetic (default 0).")
@click.option("--allow-unused", is_flag=True, help="Convert a checkpoint holding tensors the model does not use (listed), instead of refusing it.")
def convert_weights(model, quant, source, output, seed, allow_unused):
    """Quantize weights into MLC's tensor-cache format."""
    from ..interface.convert_weights import convert_weights as run_convert

    click.echo(str(run_convert(model, quant, source, output, seed=seed, log=log, allow_unused=allow_unused)))

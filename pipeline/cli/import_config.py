"""`mlcpipe import-config`: arguments only (pipeline/interface/import_config.py does the work)."""

from __future__ import annotations

from pathlib import Path

import click

from .common import Command


@click.command("import-config", cls=Command)
@click.argument("source", type=click.Path(path_type=Path))
@click.option("-o", "--output", type=click.Path(path_type=Path), required=True, help="The model YAML to write (must not exist).")
@click.option("--name", default=None, help="The model's name (default: the YAML file's stem).")
def import_config(source, output, name):
    """Write the model YAML of a Hugging Face checkpoint directory (its config.json, 4.x or 5.x
    form): then `convert-weights --model YAML --source SOURCE` and `build --model YAML`."""
    from ..interface.import_config import import_config as work

    click.echo(str(work(source, output, name)))

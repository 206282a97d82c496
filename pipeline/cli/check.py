"""`mlcpipe check`: arguments only (pipeline/interface/check.py does the work)."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from .common import Command, device_options


@click.command("check", cls=Command)
@click.option("--artifact", type=click.Path(path_type=Path), required=True, help="Artifact directory from `mlcpipe build`.")
@click.option("--sizes", default="1,7", show_default=True, help="Values bound to symbolic dims (tokens).")
@click.option("--kernels", "pattern", default=None, help="Only kernels whose name matches this regex.")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@device_options
def check(artifact, sizes, pattern, as_json, rpc, rpc_tracker, rpc_key, adapter, browser):  # noqa: PLR0913
    """Kernel conformance: every kernel of the shipped library run on its device, compared with llvm / NumPy."""
    from ..interface.check import check as check_kernels

    def progress(i, n, name):
        click.echo(f"[{i + 1}/{n}] {name}", err=True)

    text, ok = check_kernels(artifact, sizes, pattern, as_json=as_json, rpc=rpc, rpc_tracker=rpc_tracker, rpc_key=rpc_key,
                             adapter=adapter, browser=browser, progress=progress)
    click.echo(text)
    sys.exit(0 if ok else 1)

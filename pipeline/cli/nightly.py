"""`mlcpipe nightly` and `mlcpipe verify`: arguments only (pipeline/interface/nightly.py does the work)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from .common import Command, log


@click.command("nightly", cls=Command)
@click.option("--matrix", "matrix_path", type=click.Path(path_type=Path), default=None, help="Nightly matrix YAML (default configs/nightly.yaml).")
@click.option("--out", type=click.Path(path_type=Path), default=None, help="Output directory, e.g. artifacts/nightly/2026-11-21 (required unless --list-cells).")
@click.option("--jobs", type=click.IntRange(min=1), default=None, help="Cells built at once, each in its own processes (default: cores / 2).")
@click.option("--previous", type=click.Path(path_type=Path, file_okay=False), default=None, help="Last nightly's directory: add the regression table.")
@click.option("--cell", "cells", multiple=True, help="Only this cell (repeatable or comma-separated), e.g. one CI job per cell.")
@click.option("--cache", "cache_dir", type=click.Path(path_type=Path, file_okay=False), default=None, help="Content-addressed cell cache (default <out>/../.cache).")
@click.option("--report-only", is_flag=True, help="Build nothing: merge the cell directories in --out into index.json/SUMMARY.md.")
@click.option("--list-cells", is_flag=True, help="Print the matrix's cell ids as a JSON list (for a CI matrix) and exit.")
def nightly(matrix_path, out, jobs, previous, cells, cache_dir, report_only, list_cells):  # noqa: PLR0913
    """Build every model x quant x target cell of a matrix (cached, checked, verified) with a report."""
    from ..interface.nightly import list_cells as matrix_cells
    from ..interface.nightly import nightly as run_nightly

    wanted = [c.strip() for value in cells for c in value.split(",") if c.strip()]
    if cells and not wanted:  # e.g. `--cell "$CELL"` with CELL unset: was every cell of the matrix, in one job
        raise click.BadParameter(f"{cells[0]!r} names no cell; give a cell id (mlcpipe nightly --list-cells)", param_hint="--cell")
    if list_cells:  # with --cell: those cells, each checked (was: --cell ignored, every cell listed)
        click.echo(json.dumps(matrix_cells(matrix_path, wanted)))
        return
    if out is None:
        raise click.UsageError("--out DIR is required")
    sys.exit(run_nightly(matrix_path, out, jobs=jobs, previous=previous, cells=wanted, cache_dir=cache_dir,
                         report_only=report_only, log=log))


@click.command("verify", cls=Command)
@click.argument("directory", type=click.Path(path_type=Path))
def verify(directory):
    """Re-check the SHA-256 of every file of a nightly directory or a single artifact."""
    from ..interface.nightly import verify as run_verify

    result = run_verify(directory)
    for problem in result.problems:
        click.echo(f"error: {problem}", err=True)
    if not result.ok:
        click.echo(f"{directory}: {len(result.problems)} problem(s) in {result.kind} ({result.files} files listed)", err=True)
        sys.exit(1)
    click.echo(f"ok: {directory}: {result.kind}, {result.files} files match their SHA-256")

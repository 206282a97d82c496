"""`mlcpipe nightly` (every cell of a matrix built, checked and reported) and `mlcpipe verify`."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path


def list_cells(matrix_path: Path | None, cells: list[str] | None = None) -> list[str]:
    """The matrix's cell ids (for a CI matrix), or those of `cells` (each must be one)."""
    from ..nightly import list_cells as matrix_cells

    return matrix_cells(matrix_path, cells)


def nightly(matrix_path: Path | None, out: Path, *, jobs: int | None = None, previous: Path | None = None,
            cells: list[str] | None = None, cache_dir: Path | None = None, report_only: bool = False,
            log: Callable[[str], None] = print) -> int:
    """Build, check and report the cells into `out`; returns the exit status (pipeline/nightly)."""
    from ..nightly import run_nightly

    return run_nightly(matrix_path, out, jobs=jobs, previous=previous, cells=cells, cache_dir=cache_dir,
                       report_only=report_only, echo=log)


def verify(directory: Path):
    """The SHA-256 check of every file of a nightly directory or an artifact (nightly.verify)."""
    from ..nightly.verify import verify as run_verify

    return run_verify(directory)

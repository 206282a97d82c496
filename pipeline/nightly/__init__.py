"""Nightly artifact builds: a YAML matrix of model x quantization x target cells, built in parallel
processes through a content-addressed cache, checked, verified and reported.

    matrix.py     configs/nightly.yaml -> validated `Matrix` of `Cell`s
    cache.py      the cache key of a cell (its build inputs) and the cache directory
    worker.py     `python -m pipeline.nightly.worker SPEC`: build / check / profile one cell
    reproduce.py  two builds of one cell compared file by file, differences explained
    runner.py     the cells run in parallel worker processes, progress, one directory per cell
    report.py     index.json, SUMMARY.md and the regression table against a previous nightly
    verify.py     checksums and manifests of a nightly or a single artifact re-checked
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path


def default_jobs() -> int:
    import os

    return max(1, (os.cpu_count() or 2) // 2)


def default_cache(out: Path) -> Path:
    """<out>/../.cache: shared by the nightlies written beside each other (artifacts/nightly/<date>)."""
    return Path(out).resolve().parent / ".cache"


def list_cells(matrix_path: Path | None = None) -> list[str]:
    from .matrix import load_matrix

    return [c.id for c in load_matrix(matrix_path).cells]


def run_nightly(matrix_path: Path | None, out: Path, jobs: int | None = None, previous: Path | None = None,
                cells: list[str] | None = None, cache_dir: Path | None = None, report_only: bool = False,
                echo: Callable[[str], None] = print) -> int:
    """Build, check and report the matrix's cells (or only `cells`) into `out`; returns the exit
    status: 0 when every cell run (with `report_only`: every cell of the matrix) passed, else 1.
    Matrix errors raise ConfigError before anything builds."""
    from .matrix import load_matrix
    from .report import check_previous, load_records, write_reports
    from .runner import Runner

    matrix = load_matrix(matrix_path)
    selected = matrix.select(list(cells or []))
    if previous is not None:
        check_previous(previous)
    out = Path(out)
    if report_only:
        if not out.is_dir():
            from ..errors import ArtifactError

            raise ArtifactError(f"--out {str(out)!r}: no such directory to report on")
        judged = {c.id for c in selected}
    else:
        runner = Runner(selected, out, cache_dir or default_cache(out), jobs or default_jobs(), echo=echo)
        judged = {r["cell"] for r in runner.run()}
    records = load_records(out, matrix)
    index = write_reports(out, matrix, [r for r in records if r["status"] != "missing" or r["cell"] in judged], previous)
    ok = all(r["status"] == "passed" for r in index["cells"] if r["cell"] in judged)
    s = index["summary"]
    echo(f"[nightly] {s['passed']}/{s['cells']} cells passed ({s['cached']} cached, {s['failed']} failed, "
         f"{s['missing']} missing): {out / 'SUMMARY.md'}")
    reg = index.get("regressions")
    if reg:
        flagged = sum((c.get("kernel_times") or {}).get("verdicts", {}).get("regression", 0) for c in reg["cells"])
        echo(f"[nightly] against {reg['previous']}: {flagged} kernel regressions flagged")
    return 0 if ok else 1

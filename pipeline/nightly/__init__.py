"""Nightly artifact builds: a YAML matrix of model x quantization x target cells, built in parallel
processes through a content-addressed cache, checked, verified and reported.

    matrix.py     configs/nightly.yaml -> validated `Matrix` of `Cell`s
    cache.py      the cache key of a cell (its build inputs) and the cache directory
    worker.py     `python -m mlcpipe.nightly.worker SPEC`: build / check / profile one cell
    reproduce.py  two builds of one cell compared file by file, differences explained
    runner.py     the cells run in parallel worker processes, progress, one directory per cell
    report.py     index.json, SUMMARY.md and the regression table against a previous nightly
    verify.py     checksums and manifests of a nightly or a single artifact re-checked
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path


def default_jobs() -> int:
    from ..threads import available

    return max(1, available() // 2)


def default_cache(out: Path) -> Path:
    """<out>/../.cache: shared by the nightlies written beside each other (artifacts/nightly/<date>)."""
    return Path(out).resolve().parent / ".cache"


def list_cells(matrix_path: Path | None = None, cells: list[str] | None = None) -> list[str]:
    from .matrix import load_matrix

    return [c.id for c in load_matrix(matrix_path).select(cells or [])]


def run_nightly(matrix_path: Path | None, out: Path, jobs: int | None = None, previous: Path | None = None,
                cells: list[str] | None = None, cache_dir: Path | None = None, report_only: bool = False,
                echo: Callable[[str], None] = print) -> int:
    """Build, check and report the matrix's cells (or only `cells`) into `out`; returns the exit
    status: 0 when every cell run (with `report_only`: every cell of the matrix) passed, 130 when
    Ctrl-C interrupted the run (reports still written), else 1. Matrix errors raise ConfigError
    before anything builds; `out` (and the cache) must be new, empty or mlcpipe's own
    (`artifact.check_writable`), and `out` is locked for the whole run (a second nightly on it
    gets a one-line error)."""
    from ..artifact import NIGHTLY_MARKER, ArtifactError, check_writable, normalize_output, owner_kind, refusal, write_lock
    from .matrix import load_matrix
    from .report import check_previous, load_records, write_reports
    from .runner import Runner

    matrix = load_matrix(matrix_path)
    selected = matrix.select(list(cells or []))
    out = normalize_output(out)
    if previous is not None:
        check_previous(previous, out)
    interrupted: dict[str, dict] = {}
    if report_only:
        if not out.is_dir():
            raise ArtifactError(f"--out {str(out)!r}: no such directory to report on")
        if owner_kind(out) != "nightly":
            raise refusal(out, "it holds no nightly results (no <cell>/result.json, index.json or "
                          f"{NIGHTLY_MARKER})", " (--out)")
        judged = {c.id for c in selected}
    else:
        check_writable(out, "nightly", " (--out)")
        cache_dir = normalize_output(cache_dir) if cache_dir else default_cache(out)
        if cache_dir == out or out in cache_dir.parents or cache_dir in out.parents:
            raise refusal(cache_dir, f"the cache and --out {out} must be separate directories", " (--cache)")
        check_writable(cache_dir, "cache", " (--cache)")
    with write_lock(out, role=" (--out)"):
        if not report_only:
            out.mkdir(parents=True, exist_ok=True)
            if not (out / NIGHTLY_MARKER).is_file():
                (out / NIGHTLY_MARKER).write_text("mlcpipe nightly output directory\n")
            runner = Runner(selected, out, cache_dir, jobs or default_jobs(), echo=echo)
            results = runner.run()
            judged = {r["cell"] for r in results}
            interrupted = {r["cell"]: r for r in results if r["status"] == "interrupted"}
        records = [_interrupted(r, interrupted[r["cell"]]) if r["cell"] in interrupted else r for r in load_records(out, matrix)]
        index = write_reports(out, matrix, [r for r in records if r["status"] != "missing" or r["cell"] in judged], previous)
    ok = all(r["status"] == "passed" for r in index["cells"] if r["cell"] in judged)
    s = index["summary"]
    echo(f"[nightly] {s['passed']}/{s['cells']} cells passed ({s['cached']} cached, {s['failed']} failed, "
         f"{s['missing']} missing{f', {len(interrupted)} interrupted' if interrupted else ''}): {out / 'SUMMARY.md'}")
    reg = index.get("regressions")
    if reg:
        flagged = sum(((c.get("kernel_times") or {}).get("verdicts") or {}).get("regression", 0) for c in reg["cells"])
        echo(f"[nightly] against {reg['previous']}: {flagged} kernel regressions flagged")
    if interrupted:
        return 130
    return 0 if ok else 1


def _interrupted(previous: dict, record: dict) -> dict:
    """The index record of a cell Ctrl-C stopped: its previous result (kept on disk), marked."""
    log = f"; partial log: {record['interrupted_log']}" if record.get("interrupted_log") else ""
    if previous.get("status") == "missing":
        return {**record, "error": f"interrupted before it finished; no previous result{log}"}
    return {**previous, "status": "interrupted", "previous_status": previous.get("status"),
            "error": f"interrupted before it finished; {record['cell']}/ keeps the previous run's result "
                     f"({previous.get('status')}){log}"}

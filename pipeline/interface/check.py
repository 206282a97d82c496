"""`mlcpipe check`: every kernel of an artifact's library run on its device and compared with
llvm / NumPy (kernel conformance)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from .device import run_options


def parse_sizes(text: str) -> tuple[int, ...]:
    """--sizes: comma-separated token counts >= 1, each once, in the order given (ValueError: one line)."""
    from ..config import short_repr

    try:
        sizes = tuple(int(t) for t in text.replace(" ", "").split(",") if t != "")
    except ValueError:
        sizes = ()
    if not sizes or any(s < 1 for s in sizes):
        raise ValueError(f"--sizes {short_repr(text)}: expected comma-separated token counts >= 1, e.g. 1,7")
    return tuple(dict.fromkeys(sizes))  # a repeated size would check (and report) every kernel twice


def check(artifact: Path, sizes: str = "1,7", pattern: str | None = None, *, as_json: bool = False,
          rpc: str | None = None, rpc_tracker: str | None = None, rpc_key: str | None = None,
          adapter: str | None = None, browser: bool = False,
          progress: Callable[[int, int, str], None] | None = None) -> tuple[str, bool]:
    """Check the artifact's kernels; returns (the report: a table and summary, or JSON; all passed)."""
    from ..artifact import RUN_FIELDS, read_manifest
    from ..conformance import check_artifact, kernel_pattern, report_json

    read_manifest(artifact, RUN_FIELDS)  # a bad --artifact is reported before connecting
    kernel_pattern(pattern)
    size_list = parse_sizes(sizes)
    options = run_options(rpc, rpc_tracker, rpc_key, adapter, browser)
    report = check_artifact(artifact, size_list, pattern, progress=progress, options=options)
    return (report_json(report) if as_json else report.table() + "\n\n" + report.summary), report.ok

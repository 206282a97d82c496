"""Reports of a profile (see `..schema`): pure functions of the profile dict, one module per format.

  md, text  kernel statistics tables, then roles/bandwidth and the run summary (`tables`)
  events    count/total/avg/min/max/p95/p99 per phase, parent/op, kernel, role, matmul shape (`events`)
  phase     per-phase "GPU Profile Report" blocks and TTFT / tok/s / [metrics] lines (`phase`)
  csv       one row per kernel per phase (`csvfmt`)
  trace     Chrome trace JSON for Perfetto (`trace`)
  html      a self-contained page of where the time goes (`html`)
  json      the profile itself
"""

from __future__ import annotations

import json

from ._common import ROLES, matmul_shape, percentile, resolve_peak_gbps
from .csvfmt import render_csv
from .events import render_events
from .html import render_html
from .phase import render_phase
from .tables import parse_table, parse_tables, render_stats
from .trace import render_trace

FORMATS = ("md", "text", "events", "phase", "csv", "trace", "html", "json")

__all__ = ["FORMATS", "ROLES", "matmul_shape", "parse_table", "parse_tables", "percentile", "render", "resolve_peak_gbps"]


def render(profile: dict, fmt: str, peak_gbps: float | None = None) -> str:
    """The report of `profile` in format `fmt` (one of FORMATS). `peak_gbps`: peak memory bandwidth
    for the % of peak columns; default the profile's `peak_gbps`, else the target preset's."""
    if fmt == "json":
        return json.dumps(profile, indent=1) + "\n"
    if fmt not in FORMATS:
        raise ValueError(f"format {fmt!r}: unknown; allowed: {list(FORMATS)}")
    peak = resolve_peak_gbps(profile, peak_gbps)
    if fmt in ("md", "text"):
        text = render_stats(profile, fmt, peak)
    else:
        text = {"events": render_events, "phase": render_phase, "csv": render_csv, "trace": render_trace,
                "html": render_html}[fmt](profile, peak)
    return text if text.endswith("\n") else text + "\n"

"""One CSV row per kernel per phase ("csv"): the statistics columns, machine-readable.

Floats at full precision; empty cells where a value is unknown (bytes, GB/s, % of peak, shape,
GFLOP/s). `pct` / `cum_pct` are of the phase's kernel time.
"""

from __future__ import annotations

import csv
import io

from ._common import phase_rows

COLUMNS = ("phase", "kernel", "device_kernel", "role", "parent", "total_ms", "iterations", "avg_ms", "min_ms",
           "peak_ms", "pct", "cum_pct", "bytes_per_call", "gb_s", "pct_of_peak", "m", "n", "k", "gflop_s")


def render_csv(profile: dict, peak_gbps: float | None = None) -> str:
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(COLUMNS)
    for r in phase_rows(profile, peak_gbps):
        mnk = r["mnk"] or ("", "", "")
        writer.writerow([
            r["phase"], r["kernel"], r["device_kernel"], r["role"], r["parent"], repr(r["total_ms"]), r["iterations"],
            repr(r["avg_ms"]), repr(r["min_ms"]), repr(r["peak_ms"]), repr(r["pct"]), repr(r["cum_pct"]),
            "" if r["bytes"] is None else r["bytes"],
            "" if r["gbps"] is None else repr(r["gbps"]),
            "" if r["pct_peak"] is None else repr(r["pct_peak"]),
            *mnk,
            "" if r["gflops"] is None else repr(r["gflops"]),
        ])
    return buf.getvalue()

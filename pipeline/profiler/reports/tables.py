"""The kernel statistics report ("md" and "text") and a parser that reads its tables back.

`## Profiling Analysis: <display_name> <quantization> on <device>`, the top 10 kernels by total
time, the full statistics (md: GFM; text: fixed width; column widths in docs/profiler.md), then
"Roles and bandwidth" (per kernel and phase: role, bytes per call, GB/s, % of peak, GFLOP/s of
matmuls), "Time by role" and "Run summary".
"""

from __future__ import annotations

import re

from ..schema import device_kernel_name, kernel_stats
from ._common import fmt_opt, phase_rows, role_totals, run_summary

# ---- seed part -------------------------------------------------------------------------------
_MD_TOP = (("Peak Time (ms)", 13),)
_MD_STATS = (("Total Time (ms)", 14), ("Iterations", 10), ("Avg Time (ms)", 12), ("Peak Time (ms)", 13),
             ("% of Total", 10), ("Cumulative %", 12))
_TEXT_TOP = (("Peak_Time_ms", 15),)
_TEXT_STATS = (("Total_Time_ms", 15), ("Iterations", 10), ("Avg_Time_ms", 15), ("Peak_Time_ms", 15),
               ("% of Total", 12), ("Cumulative %", 12))


def _md_table(header: list[str], widths: list[int], rows: list[list[str]]) -> list[str]:
    def line(cells):
        return "| " + " | ".join(c.ljust(w) for c, w in zip(cells, widths)) + " |"

    return [line(header), "|" + "|".join("-" * (w + 2) for w in widths) + "|", *(line(r) for r in rows)]


def _text_table(header: list[str], widths: list[int], rows: list[list[str]]) -> list[str]:
    def line(cells):
        return " | ".join(c.ljust(w) for c, w in zip(cells, widths))

    total = sum(widths) + 3 * (len(widths) - 1)
    return [line(header), "-" * total, *(line(r) for r in rows)]


def _name_width(names: list[str]) -> int:
    return max((len(n) for n in names), default=len("Kernel Name")) + 2


def _table(fmt: str, header: list[str], widths: list[int], rows: list[list[str]]) -> list[str]:
    return (_md_table if fmt == "md" else _text_table)(header, widths, rows)


def _fit(header: list[str], rows: list[list[str]]) -> list[int]:
    """Widths for the added sections: the widest cell of each column (header included)."""
    return [max(len(c) for c in col) for col in zip(header, *rows)]


def render_stats(profile: dict, fmt: str, peak_gbps: float | None) -> str:
    if fmt not in ("md", "text"):
        raise ValueError(f"format {fmt!r}: expected 'md' or 'text'")
    stats = kernel_stats(profile)
    names = [device_kernel_name(profile, s["kernel"]) for s in stats]
    top = list(zip(names, stats))[:10]
    top_cols, stat_cols = (_MD_TOP, _MD_STATS) if fmt == "md" else (_TEXT_TOP, _TEXT_STATS)

    top_rows = [[n, f"{s['peak_ms']:.2f}"] for n, s in top]
    stat_rows = [
        [n, f"{s['total_ms']:.2f}", str(s["iterations"]), f"{s['avg_ms']:.2f}", f"{s['peak_ms']:.2f}",
         f"{s['pct']:.2f}%", f"{s['cum_pct']:.2f}%"]
        for n, s in zip(names, stats)
    ]
    out = [
        f"## Profiling Analysis: {profile.get('display_name', profile['model'])} {profile['quantization']} on {profile['device']}",
        "",
        "<small>",
        "",
        "### Top 10 Most Time-Consuming Kernels",
        "",
        *_table(fmt, ["Kernel Name", *(h for h, _ in top_cols)], [_name_width([n for n, _ in top]), *(w for _, w in top_cols)], top_rows),
        "",
        "---",
        "",
        "### Kernel Execution Statistics (Sorted by Total Time)",
        "",
        *_table(fmt, ["Kernel Name", *(h for h, _ in stat_cols)], [_name_width(names), *(w for _, w in stat_cols)], stat_rows),
        "",
        "</small>",
        "",
        "---",
        "",
    ]
    out += _roles_and_bandwidth(profile, fmt, peak_gbps)
    out += ["### Run summary", ""]
    summary = [list(r) for r in run_summary(profile, peak_gbps)]
    out += _table(fmt, ["Metric", "Value"], _fit(["Metric", "Value"], summary), summary)
    out += ["", "---", ""]
    return "\n".join(out)


def _roles_and_bandwidth(profile: dict, fmt: str, peak_gbps: float | None) -> list[str]:
    rows = phase_rows(profile, peak_gbps)
    header = ["Kernel Name", "Role", "Phase", "Iterations", "Avg Time (ms)", "Bytes/Call", "GB/s", "% of Peak",
              "Shape (M N K)", "GFLOP/s"]
    body = [
        [r["device_kernel"], r["role"], r["phase"], str(r["iterations"]), f"{r['avg_ms']:.4f}",
         "-" if r["bytes"] is None else str(r["bytes"]), fmt_opt(r["gbps"], ".2f"), fmt_opt(r["pct_peak"], ".2f", "%"),
         " ".join(map(str, r["mnk"])) if r["mnk"] else "-", fmt_opt(r["gflops"], ".2f")]
        for r in rows
    ]
    peak = f"{peak_gbps:.1f} GB/s" if peak_gbps else "unknown (no --peak-gbps, no target preset): '-'"
    has_shapes = any(r["mnk"] for r in rows)
    out = [
        "### Roles and bandwidth",
        "",
        f"Bytes/Call: tensor bytes a call reads and writes (the paged KV cache's page pool and embedding tables excluded: calls read only a few pages / rows); "
        f"GB/s = Bytes/Call / Avg Time; peak bandwidth {peak}.",
        "GFLOP/s = 2·M·N·K / Avg Time for matmul kernels"
        + ("." if has_shapes else "; '-': this profile records no matmul shapes."),
        "",
        *_table(fmt, header, _fit(header, body), body),
        "",
        "### Time by role",
        "",
    ]
    role_header = ["Role", "Phase", "Total Time (ms)", "Calls", "% of Phase"]
    role_body = []
    for phase in dict.fromkeys(r["phase"] for r in rows):
        totals = role_totals(profile, phase)
        grand = sum(t for _, t, _ in totals) or 1.0
        role_body += [[role, phase, f"{t:.2f}", str(n), f"{100.0 * t / grand:.2f}%"] for role, t, n in totals]
    out += _table(fmt, role_header, _fit(role_header, role_body), role_body)
    out.append("")
    return out


# ---- reading tables back -----------------------------------------------------------------------
_MD_RULE = re.compile(r"^\|[-:| ]+\|$")
_TEXT_RULE = re.compile(r"^-{4,}$")


def parse_tables(text: str) -> list[tuple[str, list[dict]]]:
    """Every table (GFM or fixed-width) in `text`: (the last `#` heading above it, rows as dicts
    keyed by the header cells, values stripped strings)."""
    lines = text.split("\n")
    tables, heading, i = [], "", 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("#"):
            heading = line.lstrip("#").strip()
        nxt = lines[i + 1] if i + 1 < len(lines) else ""
        md = line.startswith("|") and _MD_RULE.match(nxt)
        fixed = not line.startswith("|") and "|" in line and _TEXT_RULE.match(nxt)
        if md or fixed:
            def cells(row):
                parts = row.split("|")
                if md:
                    parts = parts[1:-1]
                return [p.strip() for p in parts]

            header = cells(line)
            rows = []
            i += 2
            while i < len(lines) and lines[i].strip() and "|" in lines[i]:
                rows.append(dict(zip(header, cells(lines[i]))))
                i += 1
            tables.append((heading, rows))
            continue
        i += 1
    return tables


def parse_table(text: str, heading: str | None = None) -> list[dict]:
    """Rows of the first table in `text` (under a heading containing `heading`, if given)."""
    for title, rows in parse_tables(text):
        if heading is None or heading in title:
            return rows
    raise ValueError(f"no table{' under ' + repr(heading) if heading else ''} in the text")

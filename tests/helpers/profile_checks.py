"""Checks of a profile's reports against its own samples, shared by the llvm profile's tests
(tests/profiler/test_reports.py) and the webgpu profile's (tests/profiler/test_webgpu.py)."""

from __future__ import annotations

import json

from mlcpipe.profiler.reports import parse_table, parse_tables, render
from mlcpipe.profiler.schema import device_kernel_name, measured_samples, validate

COLUMNS = {
    "md": {"total": "Total Time (ms)", "avg": "Avg Time (ms)", "peak": "Peak Time (ms)"},
    "text": {"total": "Total_Time_ms", "avg": "Avg_Time_ms", "peak": "Peak_Time_ms"},
}


def sample_groups(profile, phase=None) -> dict[str, list[float]]:
    """{kernel: [ms of each measured call]} (warm-up left out), of one phase or all."""
    groups: dict[str, list[float]] = {}
    for s in measured_samples(profile, phase):
        groups.setdefault(s["kernel"], []).append(s["ms"])
    return groups


def cell_number(cell: str) -> float:
    """A report cell's number (a percentage without its sign)."""
    return float(cell.rstrip("%"))


def check_kernel_statistics_arithmetic(prof: dict, fmt: str) -> None:
    """The md / text kernel tables: every row's numbers from the profile's samples, sorted by total time."""
    text = render(prof, fmt)
    col = COLUMNS[fmt]
    assert text.startswith(f"## Profiling Analysis: {prof['display_name']} {prof['quantization']} on {prof['device']}\n\n<small>\n")
    stats = parse_table(text, "Kernel Execution Statistics")
    top = parse_table(text, "Top 10 Most Time-Consuming Kernels")
    groups = sample_groups(prof)
    by_total = sorted(groups, key=lambda k: (-sum(groups[k]), k))
    assert [r["Kernel Name"] for r in stats] == [device_kernel_name(prof, k) for k in by_total]
    n = len(stats)
    for row, kernel in zip(stats, by_total):
        times = groups[kernel]
        assert row[col["total"]] == f"{sum(times):.2f}"
        assert int(row["Iterations"]) == len(times)
        assert row[col["avg"]] == f"{sum(times) / len(times):.2f}"
        # avg = total / iterations, within the rounding of both
        assert abs(cell_number(row[col["avg"]]) - cell_number(row[col["total"]]) / len(times)) <= 0.005 + 0.005 / len(times) + 1e-9
        assert row[col["peak"]] == f"{max(times):.2f}"
    grand = sum(sum(v) for v in groups.values())
    assert abs(sum(cell_number(r[col["total"]]) for r in stats) - grand) <= 0.005 * n + 1e-9
    pcts = [cell_number(r["% of Total"]) for r in stats]
    assert abs(sum(pcts) - 100.0) <= 0.005 * n + 1e-9
    running = 0.0
    for i, (pct, row) in enumerate(zip(pcts, stats)):
        running += pct
        assert abs(cell_number(row["Cumulative %"]) - running) <= 0.005 * (i + 2) + 1e-9
    assert stats[-1]["Cumulative %"] == "100.00%"
    totals = [cell_number(r[col["total"]]) for r in stats]
    assert totals == sorted(totals, reverse=True)
    # the top 10: the first ten rows by total time, in that order, with their peak time
    assert [(r["Kernel Name"], r[col["peak"]]) for r in top] == [(r["Kernel Name"], r[col["peak"]]) for r in stats[:10]]
    assert [r for r in parse_tables(text) if r[0] == "Run summary"]


def check_run_summary(prof: dict) -> None:
    """The run summary table shows the profile's metrics."""
    m = prof["metrics"]
    summary = {r["Metric"]: r["Value"] for r in parse_table(render(prof, "text"), "Run summary")}
    assert summary["Load"] == f"{m['load_ms']:.2f} ms"
    assert summary["TTFT"] == f"{m['ttft_ms']:.3f} ms"
    assert summary["Prefill"] == f"{m['prefill_ms']:.3f} ms ({m['prefill_tok_s']:.1f} tok/s)"
    d = m["decode_ms_per_token"]
    assert summary["Decode ms/token p50 / p95 / p99"] == f"{d['p50']:.3f} / {d['p95']:.3f} / {d['p99']:.3f} ms"
    assert summary["Decode"] == f"{m['decode_tok_s']:.1f} tok/s"
    assert str(m["peak_host_memory_bytes"]) in summary["Peak host memory"]
    assert str(m["weight_bytes"]) in summary["Weights"]
    assert summary["Per-kernel overhead vs low-overhead mode"].startswith(f"{m['overhead']['percent']:+.1f}%")


def check_json_round_trips(prof: dict) -> None:
    """The json format is the profile itself, and it validates."""
    text = render(prof, "json")
    back = json.loads(text)
    assert back == prof
    validate(back)

"""`mlcpipe profile compare`: the A/B report (pipeline/profiler/compare.py), on real profiles of the
tiny model. The noise test compares two independent profiles of one artifact: nothing may be
called a regression or an improvement there, while a synthetic x3 slowdown of one kernel must be."""

from __future__ import annotations

import copy
import math
import re

import numpy as np
import pytest

from mlcpipe.profiler import compare as cmp
from mlcpipe.profiler.compare import (
    compare,
    compare_files,
    gfm_table,
    kernel_rows,
    log_mad,
    mann_whitney_u,
    rank_average,
    step_pairs,
    summary_rows,
    welch_z,
)
from mlcpipe.profiler.schema import measured_samples, save_profile
from mlcpipe.quantization import quantization

VERDICTS = {"regression", "improvement", "noise", "unchanged", "new", "removed"}


# ---- fixtures: one artifact, two independent real profiles ---------------------------------------

@pytest.fixture(scope="module")
def artifact(tmp_path_factory):
    from mlcpipe.build import build
    from mlcpipe.config import load_model_config
    from mlcpipe.targets import load_target

    tmp = tmp_path_factory.mktemp("compare")
    return build(load_model_config("llama-tiny"), quantization("q4f16_1"), load_target("llvm"), output=tmp / "art", log=lambda *_: None)


def _profile(artifact):
    from mlcpipe.profiler.core import Workload
    from mlcpipe.profiler.measure import profile
    from mlcpipe.runtime import Engine

    return profile(Engine(artifact, "synthetic"), Workload(prompt_len=16, gen_len=8, runs=3))


@pytest.fixture(scope="module")
def prof_a(artifact):
    return _profile(artifact)


@pytest.fixture(scope="module")
def prof_b(artifact, prof_a):  # a second, independent profile (new Engine, after the first)
    return _profile(artifact)


# ---- report parsing -------------------------------------------------------------------------------

def _section(report: str, number: int) -> str:
    parts = re.split(r"^## ", report, flags=re.M)
    for part in parts:
        if part.startswith(f"{number}. "):
            return part
    raise AssertionError(f"section {number} missing")


def _tables(text: str) -> list[list[str]]:
    """Each GFM table of `text` as its list of lines."""
    tables, current = [], []
    for line in text.splitlines():
        if line.startswith("|"):
            current.append(line)
        elif current:
            tables.append(current)
            current = []
    if current:
        tables.append(current)
    return tables


def _cells(line: str) -> list[str]:
    return [c.strip() for c in line.strip()[1:-1].split("|")]


def _parse(table: list[str]) -> tuple[list[str], list[dict]]:
    headers = _cells(table[0])
    return headers, [dict(zip(headers, _cells(line))) for line in table[2:]]


def _num(cell: str) -> float | None:
    if cell == "-":
        return None
    return float(cell.replace(",", "").rstrip("%"))


def _decimals(cell: str) -> int:
    cell = cell.rstrip("%")
    return len(cell.split(".")[1]) if "." in cell else 0


def _check_table_style(table: list[str]) -> None:
    """pandas `to_markdown` style: aligned pipes, `:---` / `---:` rule, width >= header + 2."""
    assert len({len(line) for line in table}) == 1, "table lines differ in length"
    pipes = [[i for i, ch in enumerate(line) if ch == "|"] for line in table]
    assert all(p == pipes[0] for p in pipes), "column separators are not aligned"
    assert re.fullmatch(r"\|(?:(?::-+|-+:)\|)+", table[1]), table[1]
    for header, segment in zip(_cells(table[0]), table[1][1:-1].split("|")):
        assert len(segment) >= len(header) + 4  # width >= header + 2, plus one space each side


# ---- (d) Mann-Whitney U ---------------------------------------------------------------------------

def test_mann_whitney_known_values():
    # complete separation, 5 vs 5, no ties: U_x = 0, mean 12.5, var 25 * 11 / 12 = 22.9167,
    # z = (12.5 - 0.5) / 4.78714 = 2.50672, p = 2 * (1 - Phi(2.50672)) = 0.0121858
    u, p = mann_whitney_u([1, 2, 3, 4, 5], [6, 7, 8, 9, 10])
    assert u == 0.0
    assert p == pytest.approx(0.0121858, abs=1e-6)
    # ties: x = [1, 2, 2, 3], y = [2, 3, 3, 4]; pooled ranks 1 | 3 3 3 | 6 6 6 | 8, R_x = 1 + 3 + 3 + 6 = 13,
    # U_x = 13 - 10 = 3; tie term sum(t^3 - t) = 24 + 24 = 48, / (8 * 7) = 0.857143;
    # var = 16 / 12 * (9 - 0.857143) = 10.857143, z = (|3 - 8| - 0.5) / 3.295018 = 1.365698, p = 0.172034
    u, p = mann_whitney_u([1, 2, 2, 3], [2, 3, 3, 4])
    assert u == 3.0
    assert p == pytest.approx(0.172034, abs=1e-6)
    # 3 vs 3 complete separation: the normal approximation's smallest p, mean 4.5, var 5.25,
    # z = 4 / 2.291288 = 1.745743, p = 0.080856 (never < 0.05 with 3 calls a side)
    assert mann_whitney_u([1, 2, 3], [4, 5, 6])[1] == pytest.approx(0.080856, abs=1e-6)
    # U statistics of the two orders add up to n_x * n_y; the p-value is symmetric
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=17), rng.normal(0.5, 1.0, size=23)
    ux, pxy = mann_whitney_u(x, y)
    uy, pyx = mann_whitney_u(y, x)
    assert ux + uy == 17 * 23
    assert pxy == pytest.approx(pyx, abs=1e-15)
    assert 0.0 < pxy < 1.0


def test_mann_whitney_degenerate_samples():
    assert mann_whitney_u([1.0, 2.0, 3.0], [1.0, 2.0, 3.0])[1] == 1.0  # identical samples
    assert mann_whitney_u([5.0] * 4, [5.0] * 6)[1] == 1.0  # all values tied: variance 0
    assert mann_whitney_u([1.0], [2.0, 3.0, 4.0])[1] == 1.0  # n < 2
    assert mann_whitney_u([], [1.0, 2.0])[1] == 1.0
    # shifting both samples or scaling them leaves the rank test unchanged
    x, y = [0.3, 0.9, 0.4, 0.7], [1.1, 0.8, 1.5, 1.2, 0.95]
    p = mann_whitney_u(x, y)[1]
    assert mann_whitney_u([v * 1e-3 + 5 for v in x], [v * 1e-3 + 5 for v in y])[1] == pytest.approx(p)


def test_rank_and_z_helpers():
    assert list(rank_average([10, 20, 20, 5, 20])) == [2.0, 4.0, 4.0, 1.0, 4.0]
    assert welch_z([1.0, 1.0], [1.0, 1.0]) == 0.0
    assert welch_z([1.0, 1.0], [2.0, 2.0]) == cmp.Z_CAP  # constant samples, different means
    # (mean_y - mean_x) / sqrt(var_x / n_x + var_y / n_y) = (5 - 2) / sqrt(1 / 3 + 1 / 3)
    assert welch_z([1.0, 2.0, 3.0], [4.0, 5.0, 6.0]) == pytest.approx(3.0 / math.sqrt(2.0 / 3.0))
    assert log_mad([2.0, 2.0, 2.0]) == 0.0
    assert log_mad([1.0, 1.0, 1.0, 1000.0, 1000.0]) == 0.0  # a minority of stalls do not count


# ---- table style ----------------------------------------------------------------------------------

def test_gfm_table_reproduces_the_seed_tables():
    """Lines copied from shared/seeds/004_*.txt, rebuilt with gfm_table (default alignment rule)."""
    seed_summary = [
        "| Metric              | normal_pid_805580   | abnormal_pid_842126   | Δ (abnormal_pid_842126 - normal_pid_805580)   | Change (%)   |",
        "|:--------------------|:--------------------|:----------------------|:----------------------------------------------|:-------------|",
        "| Total Cycles        | 14                  | 238                   | 224                                           | -            |",
        "| Avg Cycle Time (us) | 631,394.91          | 38,515.56             | -592,879.35                                   | -93.90%      |",
    ]
    got = gfm_table(["Metric", "normal_pid_805580", "abnormal_pid_842126", "Δ (abnormal_pid_842126 - normal_pid_805580)", "Change (%)"],
                    [["Total Cycles", "14", "238", "224", "-"], ["Avg Cycle Time (us)", "631,394.91", "38,515.56", "-592,879.35", "-93.90%"]],
                    ["l"] * 5)
    assert got.splitlines() == seed_summary
    seed_ranks = [
        "|   Time Rank | normal_pid_805580 Time (us)   |   abnormal_pid_842126 Time (us) | Δ (us)      | Δ (%)   |",
        "|------------:|:------------------------------|--------------------------------:|:------------|:--------|",
        "|           1 | 645234.25                     |                      278,431.25 | -366,803.00 | -56.85% |",
        "|           2 | 640425.0                      |                      153,320.50 | -487,104.50 | -76.06% |",
        "|          15 | -                             |                       44,267.25 | -           | -       |",
    ]
    got = gfm_table(["Time Rank", "normal_pid_805580 Time (us)", "abnormal_pid_842126 Time (us)", "Δ (us)", "Δ (%)"],
                    [["1", "645234.25", "278,431.25", "-366,803.00", "-56.85%"], ["2", "640425.0", "153,320.50", "-487,104.50", "-76.06%"],
                     ["15", "-", "44,267.25", "-", "-"]])
    assert got.splitlines() == seed_ranks


# ---- (a) a profile against itself -------------------------------------------------------------------

def test_self_comparison_is_unchanged(prof_a):
    rows = kernel_rows(prof_a, prof_a)
    assert rows
    for r in rows:
        assert r["verdict"] == "unchanged", r
        assert r["delta_avg"] == 0.0 and r["change_pct"] == 0.0 and r["delta_beta"] == 0.0
        assert r["p"] == 1.0 and r["suspicion"] == 0.0
    report = compare(prof_a, prof_a, "a", "a2")
    summary = _parse(_tables(_section(report, 1))[0])[1]
    assert all(_num(row["Δ (a2 - a)"]) == 0 for row in summary)
    ranks = _parse(_tables(_section(report, 2))[0])[1]
    assert ranks and all(_num(row["Δ (ms)"]) == 0 and row["a Time (ms)"] == row["a2 Time (ms)"] for row in ranks)
    table = _parse(_tables(_section(report, 3))[0])[1]
    assert {row["Verdict"] for row in table} == {"unchanged"}
    assert all(_num(row["Δ avg (ms)"]) == 0 and _num(row["Change (%)"]) == 0 for row in table)
    assert "No kernel differs" in _section(report, 3)


# ---- (b) a synthetic x3 regression ------------------------------------------------------------------

def _stable_target(profile: dict) -> tuple[str, bool]:
    """A decode kernel for a synthetic regression, and whether its timings are steady: >= 20 calls,
    a median call of >= 2x the timing resolution (so x3 is a clear per-call change), steady timings
    (log-MAD <= 0.1; else the steadiest); among those the one taking the most time by its typical
    call (median x calls)."""
    calls: dict[str, list[float]] = {}
    for s in measured_samples(profile, "decode"):
        calls.setdefault(s["kernel"], []).append(s["ms"])
    many = {k: v for k, v in calls.items() if len(v) >= 20}
    sizable = [k for k, v in many.items() if np.median(v) >= 2 * cmp.MIN_DELTA_MS] or list(many)
    steady = [k for k in sizable if log_mad(many[k]) <= 0.1]
    if not steady:
        return min(sizable, key=lambda k: log_mad(many[k])), False
    return max(steady, key=lambda k: float(np.median(many[k])) * len(many[k])), True


def _scaled(profile: dict, kernel: str, factor: float, phase: str = "decode") -> dict:
    """`kernel`'s calls in `phase` `factor` times slower (a kernel such as the KV append also runs
    in the other phase: those calls stay as they were)."""
    out = copy.deepcopy(profile)
    for s in out["samples"]:
        if s["kernel"] == kernel and s["phase"] == phase:
            s["ms"] *= factor
    return out


def test_synthetic_regression_is_flagged(artifact, prof_a):
    base = prof_a
    target, steady = _stable_target(base)
    for _ in range(3):
        if steady:
            break
        # every decode kernel's calls scattered widely (CPU contention while profiling): a x3 slowdown is
        # not beyond such a baseline's own noise, so measure a clean baseline
        base = _profile(artifact)
        target, steady = _stable_target(base)
    slow = _scaled(base, target, 3.0)
    rows = kernel_rows(base, slow)
    top = rows[0]
    assert (top["kernel"], top["phase"]) == (target, "decode"), [(r["kernel"], r["phase"], r["suspicion"]) for r in rows[:3]]
    assert top["verdict"] == "regression", {k: top[k] for k in ("calls_a", "median_a", "p", "floor_pct", "change_pct")}
    assert top["p"] < 0.05
    assert top["change_pct"] == pytest.approx(200.0) and top["median_change_pct"] == pytest.approx(200.0)
    assert top["delta_beta"] > 0 and top["z_log_mu"] > 0
    for r in rows:
        if (r["kernel"], r["phase"]) != (target, "decode"):  # untouched kernels and phases: identical samples
            assert r["verdict"] == "unchanged" and r["p"] == 1.0, r
    report = compare(base, slow, "before", "after")
    section = _section(report, 3)
    assert f"driven by changes in **`{target}`** (decode)" in section
    first = section.split("### Key Findings:")[1].split("\n- ")[1]
    assert first.startswith(f"**`{target}` in phase `decode`:**")
    assert "**increased**" in first and "which is statistically significant (p-value: " in first
    assert "Verdict: **regression**" in first
    table = _parse(_tables(section)[0])[1]
    assert (table[0]["Kernel"], table[0]["Phase"], table[0]["Verdict"]) == (target, "decode", "regression")
    # the other way round it is an improvement
    back = kernel_rows(slow, base)
    assert (back[0]["kernel"], back[0]["verdict"]) == (target, "improvement")


# ---- (c) two independent profiles of one artifact: noise only ----------------------------------------

def test_independent_profiles_are_not_regressions(prof_a, prof_b):
    rows = kernel_rows(prof_a, prof_b)
    assert {(r["kernel"], r["phase"]) for r in rows} == {(s["kernel"], s["phase"]) for s in measured_samples(prof_a)}
    flagged = [(r["kernel"], r["phase"], r["calls_a"], round(r["change_pct"], 1), round(r["median_change_pct"], 1),
                r["p"], round(r["floor_pct"], 1), r["verdict"])
               for r in rows if r["verdict"] in ("regression", "improvement")]
    assert not flagged, f"run-to-run noise reported as a change: {flagged}"
    assert {r["verdict"] for r in rows} <= {"noise", "unchanged"}
    report = compare(prof_a, prof_b, "run1", "run2")
    assert "No kernel differs between `run1` and `run2` beyond run-to-run noise" in report


# ---- (e) the report's arithmetic ---------------------------------------------------------------------

def test_report_header_sections_and_style(prof_a, prof_b):
    report = compare(prof_a, prof_b, "before", "after")
    lines = report.splitlines()
    assert lines[0] == (f"# Cross Performance Comparison: {prof_a['display_name']} {prof_a['quantization']} on "
                        f"{prof_a['device']} (A: before vs B: after)")
    headings = [line for line in lines if line.startswith("## ")]
    assert headings == ["## 1. High-Level Performance Summary", "## 2. Step Duration Distribution Comparison",
                        "## 3. Per-Kernel Comparison", "## 4. Legend"]
    for sub in ("### Overview", "### Key Findings:", "**Recommendation:**", "### Detailed comparison table"):
        assert sub in _section(report, 3)
    legend = _section(report, 4)
    for term in ("**β (Beta)**", "**Z-Score(β)**", "**Z-Score(log_μ)**", "**U-test p**", "normal approximation",
                 "tie correction", "continuity correction", "**Suspicion Score**", "**Verdict**", "**Floor (%)**"):
        assert term in legend
    tables = [t for n in (1, 2, 3) for t in _tables(_section(report, n))]
    assert len(tables) == 3
    for table in tables:
        _check_table_style(table)
    assert tables[0][1].count(":-") == 5  # summary: all columns left-aligned, as in the seed
    assert tables[1][1].startswith("|----") and tables[1][1].split("|")[1].endswith(":")  # rank column right-aligned


def test_summary_arithmetic(prof_a, prof_b):
    report = compare(prof_a, prof_b, "before", "after")
    headers, rows = _parse(_tables(_section(report, 1))[0])
    assert headers == ["Metric", "before", "after", "Δ (after - before)", "Change (%)"]
    raw = {r["metric"]: r for r in summary_rows(prof_a, prof_b)}
    assert [row["Metric"] for row in rows] == list(raw)
    assert {"Forward steps (count)", "TTFT / prefill (ms)", "Prefill (tok/s)", "Decode p50 (ms/token)", "Decode p95 (ms/token)",
            "Decode p99 (ms/token)", "Decode (tok/s)", "Load (ms)", "Peak host memory (bytes)", "Weights (bytes)",
            "Total kernel time (ms)"} <= set(raw)
    for row in rows:
        r = raw[row["Metric"]]
        assert r["delta"] == r["b"] - r["a"]
        a, b, d = _num(row["before"]), _num(row["after"]), _num(row["Δ (after - before)"])
        ulp = 10.0 ** -_decimals(row["before"])
        assert abs(a - r["a"]) <= ulp / 2 + 1e-12 and abs(b - r["b"]) <= ulp / 2 + 1e-12
        assert abs(d - (b - a)) <= 1.5 * ulp + 1e-12, row
        if r["kind"] == "count":
            assert row["Change (%)"] == "-" and d == b - a
        else:
            assert r["change_pct"] == pytest.approx(100.0 * (r["b"] - r["a"]) / r["a"])
            assert abs(_num(row["Change (%)"]) - r["change_pct"]) <= 0.005 + 1e-9
            # and from the printed numbers, up to their rounding
            assert abs(_num(row["Change (%)"]) - 100.0 * d / a) <= 0.005 + 100.0 * 1.5 * ulp / abs(a) * (1 + abs(b / a)), row
    steps = [s for s in prof_a["steps"] if s["mode"] == "low-overhead" and not s["warmup"]]
    assert raw["Forward steps (count)"]["a"] == len(steps)
    assert raw["TTFT / prefill (ms)"]["a"] == prof_a["metrics"]["ttft_ms"]
    assert raw["Total kernel time (ms)"]["b"] == pytest.approx(sum(s["ms"] for s in measured_samples(prof_b)))


def _check_rank_table(report: str, a: dict, b: dict) -> list[dict]:
    headers, rows = _parse(_tables(_section(report, 2))[0])
    assert headers == ["Time Rank", "before Time (ms)", "after Time (ms)", "Δ (ms)", "Δ (%)"]
    ta = sorted((s["ms"] for s in a["steps"] if s["mode"] == "low-overhead" and not s["warmup"] and s["phase"] == "decode"), reverse=True)
    tb = sorted((s["ms"] for s in b["steps"] if s["mode"] == "low-overhead" and not s["warmup"] and s["phase"] == "decode"), reverse=True)
    assert [int(row["Time Rank"]) for row in rows] == list(range(1, max(len(ta), len(tb)) + 1))
    for i, row in enumerate(rows):
        va, vb, d, pct = (_num(row[h]) for h in headers[1:])
        if i >= len(ta) or i >= len(tb):
            assert d is None and pct is None and row["Δ (ms)"] == "-" and row["Δ (%)"] == "-"
            assert (va is None) == (i >= len(ta)) and (vb is None) == (i >= len(tb))
            continue
        ulp = 10.0 ** -_decimals(row["before Time (ms)"])
        assert abs(va - ta[i]) <= ulp / 2 + 1e-12 and abs(vb - tb[i]) <= ulp / 2 + 1e-12  # i-th slowest with i-th slowest
        assert abs(d - (vb - va)) <= 1.5 * ulp + 1e-12
        assert abs(pct - 100.0 * (tb[i] - ta[i]) / ta[i]) <= 0.005 + 1e-9
    values = [_num(row["before Time (ms)"]) for row in rows if row["before Time (ms)"] != "-"]
    assert values == sorted(values, reverse=True)
    return rows


def test_step_ranks_are_paired(prof_a, prof_b):
    _check_rank_table(compare(prof_a, prof_b, "before", "after"), prof_a, prof_b)
    # B with one measured run fewer: the ranks past B's steps show "-"
    short = copy.deepcopy(prof_b)
    last = max(s["run"] for s in short["steps"])
    short["steps"] = [s for s in short["steps"] if s["run"] != last]
    pairs = step_pairs(prof_a, short)
    assert pairs[-1]["b"] is None and pairs[-1]["delta"] is None and pairs[-1]["a"] is not None
    rows = _check_rank_table(compare(prof_a, short, "before", "after"), prof_a, short)
    assert rows[-1]["after Time (ms)"] == "-"
    table = _tables(_section(compare(prof_a, short, "before", "after"), 2))[0]
    rule = table[1].split("|")
    assert rule[2].endswith(":") and rule[3].startswith(":")  # as in the seed: the column with "-" is left-aligned


def test_kernel_table_arithmetic(prof_a, prof_b):
    report = compare(prof_a, prof_b, "before", "after")
    headers, rows = _parse(_tables(_section(report, 3))[0])
    assert headers[:4] == ["Kernel", "Phase", "Suspicion Score", "Calls before"]
    for h in ("Avg before (ms)", "Avg after (ms)", "Δ avg (ms)", "Change (%)", "β_before(%)", "β_after(%)", "Δβ(%)",
              "Z-Score(β)", "Z-Score(log_μ)", "U-test p", "Verdict", "Floor (%)"):
        assert h in headers
    raw = {(r["kernel"], r["phase"]): r for r in kernel_rows(prof_a, prof_b)}
    assert len(rows) == len(raw)
    counts_a: dict = {}
    for s in measured_samples(prof_a):
        counts_a.setdefault((s["kernel"], s["phase"]), []).append(s["ms"])
    beta_a = beta_b = 0.0
    for row in rows:
        key = (row["Kernel"], row["Phase"])
        r = raw[key]
        assert int(row["Calls before"]) == len(counts_a[key]) == r["calls_a"]
        assert r["total_a"] == pytest.approx(sum(counts_a[key]))
        assert r["avg_a"] == pytest.approx(r["total_a"] / r["calls_a"])
        assert r["delta_avg"] == r["avg_b"] - r["avg_a"]
        assert r["change_pct"] == pytest.approx(100.0 * r["delta_avg"] / r["avg_a"])
        assert r["suspicion"] == pytest.approx(abs(r["delta_beta"]) * (abs(r["z_beta"]) + abs(r["z_log_mu"])))
        a, b, d = _num(row["Avg before (ms)"]), _num(row["Avg after (ms)"]), _num(row["Δ avg (ms)"])
        ulp = 10.0 ** -_decimals(row["Avg before (ms)"])
        assert abs(a - r["avg_a"]) <= ulp / 2 + 1e-12 and abs(d - (b - a)) <= 1.5 * ulp + 1e-12
        assert abs(_num(row["Change (%)"]) - r["change_pct"]) <= 0.005 + 1e-9
        bb_a, bb_b, dbeta = _num(row["β_before(%)"]), _num(row["β_after(%)"]), _num(row["Δβ(%)"])
        assert abs(dbeta - (bb_b - bb_a)) <= 0.0151
        beta_a += r["beta_a"]
        beta_b += r["beta_b"]
        assert 0.0 <= _num(row["U-test p"]) <= 1.0
        assert row["Verdict"] in VERDICTS and row["Verdict"] == r["verdict"]
        assert _num(row["Floor (%)"]) >= cmp.NOISE_FLOOR_PCT - 0.05
    assert beta_a == pytest.approx(100.0) and beta_b == pytest.approx(100.0)
    scores = [_num(row["Suspicion Score"]) for row in rows]
    assert scores == sorted(scores, reverse=True)


def test_new_and_removed_kernels(prof_a):
    renamed = copy.deepcopy(prof_a)
    victim = _stable_target(prof_a)[0]
    for s in renamed["samples"]:
        if s["kernel"] == victim:
            s["kernel"] = victim + "_v2"
    rows = {(r["kernel"], r["phase"]): r for r in kernel_rows(prof_a, renamed)}
    assert rows[(victim, "decode")]["verdict"] == "removed" and rows[(victim, "decode")]["calls_b"] == 0
    assert rows[(victim + "_v2", "decode")]["verdict"] == "new" and rows[(victim + "_v2", "decode")]["p"] is None
    assert rows[(victim, "decode")]["delta_beta"] == pytest.approx(-rows[(victim + "_v2", "decode")]["delta_beta"])
    report = compare(prof_a, renamed)
    table = {(row["Kernel"], row["Phase"]): row for row in _parse(_tables(_section(report, 3))[0])[1]}
    assert table[(victim + "_v2", "decode")]["Avg A (ms)"] == "-" and table[(victim + "_v2", "decode")]["U-test p"] == "-"
    assert table[(victim, "decode")]["Verdict"] == "removed"


def test_compare_files_and_cli(prof_a, prof_b, tmp_path):
    from click.testing import CliRunner

    from mlcpipe.cli import main

    save_profile(prof_a, tmp_path / "before.json")
    save_profile(prof_b, tmp_path / "after.json")
    text = compare_files(tmp_path / "before.json", tmp_path / "after.json")
    assert "(A: before vs B: after)" in text.splitlines()[0]
    result = CliRunner().invoke(main, ["profile", "compare", str(tmp_path / "before.json"), str(tmp_path / "after.json")])
    assert result.exit_code == 0, result.output
    assert result.output.startswith("# Cross Performance Comparison:") and "## 4. Legend" in result.output

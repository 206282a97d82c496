"""A/B comparison of two profiles (`mlcpipe profile compare before.json after.json`).

The report: a summary table with Δ and Change %, rank-paired step durations, a per-kernel table
with a Mann-Whitney U test and a suspicion score, key findings and a legend (GFM tables). A
(kernel, phase) row is a "regression" / "improvement" only when its U test is significant after
Bonferroni, its mean and median moved the same way past the row's noise floor (fixed, common-mode
drift, within-profile spread) and the timing resolution, with enough calls on both sides; else
"unchanged" or "noise". The rule, its constants and how they were chosen: docs/profiler.md.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from ..config import short_repr
from .schema import ProfileError, load_profile, measured_samples

NOISE_FLOOR_PCT = 10.0  # minimal change of the mean and median call time for a regression/improvement
DRIFT_FACTOR = 4.0  # the floor (log scale) is also this times the common-mode drift
DRIFT_QUANTILE = 75.0  # common-mode drift: this percentile of |log median ratio| over the other rows
SPREAD_FACTOR = 2.0  # the floor (log scale) is also this times the larger log-MAD of the call times
MIN_DELTA_MS = 0.002  # per-call change below this (2 µs) is under the timing resolution
MIN_CALLS = 10  # fewer calls on a side: no regression/improvement verdict
Z_CAP = 1000.0  # |Z| when the standard error is zero but the means differ
TOP_FINDINGS = 3


# ---- statistics --------------------------------------------------------------------------------------

def _norm_sf(z: float) -> float:
    """P(Z > z) for a standard normal Z."""
    return 0.5 * math.erfc(z / math.sqrt(2.0))


def rank_average(values: Sequence[float]) -> np.ndarray:
    """1-based ranks; tied values get the average of the ranks they span."""
    arr = np.asarray(values, dtype=float)
    order = np.argsort(arr, kind="mergesort")
    ranks = np.empty(len(arr), dtype=float)
    sorted_vals = arr[order]
    i = 0
    while i < len(arr):
        j = i
        while j + 1 < len(arr) and sorted_vals[j + 1] == sorted_vals[i]:
            j += 1
        ranks[order[i:j + 1]] = (i + j) / 2.0 + 1.0
        i = j + 1
    return ranks


def mann_whitney_u(x: Sequence[float], y: Sequence[float]) -> tuple[float, float]:
    """Two-sided Mann-Whitney U test; returns (U of x, p-value).

    U_x = R_x - n_x (n_x + 1) / 2 with average ranks for ties. The p-value is the normal
    approximation: mean n_x n_y / 2, variance n_x n_y / 12 · ((n + 1) - Σ(t³ - t) / (n (n - 1)))
    (tie correction, t = size of each tie group), and a continuity correction of 0.5:
    z = (|U_x - mean| - 0.5) / sd, p = 2 · P(Z > z), clipped to [0, 1]. The exact distribution
    is not used. With fewer than 2 samples on a side, or all values equal, p = 1.
    """
    x = [float(v) for v in x]
    y = [float(v) for v in y]
    nx, ny = len(x), len(y)
    if nx == 0 or ny == 0:
        return 0.0, 1.0
    ranks = rank_average(x + y)
    u_x = float(ranks[:nx].sum() - nx * (nx + 1) / 2.0)
    if nx < 2 or ny < 2:
        return u_x, 1.0
    n = nx + ny
    _, counts = np.unique(np.asarray(x + y), return_counts=True)
    tie_term = float(np.sum(counts.astype(float) ** 3 - counts)) / (n * (n - 1))
    var = nx * ny / 12.0 * ((n + 1) - tie_term)
    if var <= 0:
        return u_x, 1.0
    mean = nx * ny / 2.0
    z = max(abs(u_x - mean) - 0.5, 0.0) / math.sqrt(var)
    return u_x, min(1.0, max(0.0, 2.0 * _norm_sf(z)))


def welch_z(x: Sequence[float], y: Sequence[float]) -> float:
    """(mean y - mean x) / sqrt(var x / n_x + var y / n_y) (sample variances; one value: variance 0)."""
    if not len(x) or not len(y):
        return 0.0
    ax, ay = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    diff = float(ay.mean() - ax.mean())
    vx = float(ax.var(ddof=1)) if len(ax) > 1 else 0.0
    vy = float(ay.var(ddof=1)) if len(ay) > 1 else 0.0
    se = math.sqrt(vx / len(ax) + vy / len(ay))
    scale = max(abs(float(ax.mean())), abs(float(ay.mean())), 1e-300)
    if se <= 1e-12 * scale:
        return 0.0 if abs(diff) <= 1e-12 * scale else math.copysign(Z_CAP, diff)
    return max(-Z_CAP, min(Z_CAP, diff / se))


def _pct(delta: float, base: float) -> float | None:
    return 100.0 * delta / base if base else None


# ---- data ------------------------------------------------------------------------------------------

def measured_steps(profile: dict, phase: str | None = None, mode: str = "low-overhead") -> list[dict]:
    return [s for s in profile["steps"]
            if s.get("mode") == mode and not s["warmup"] and (phase is None or s["phase"] == phase)]


def summary_rows(a: dict, b: dict) -> list[dict]:
    """Section 1: [{metric, a, b, delta, change_pct, kind}] (kind: "count" | "float" | "int")."""

    def metrics(p: dict) -> dict:
        m = p["metrics"]
        d = m.get("decode_ms_per_token", {})
        samples = measured_samples(p)
        return {
            "Forward steps (count)": (len(measured_steps(p)), "count"),
            "Kernel calls (count)": (len(samples), "count"),
            "TTFT / prefill (ms)": (m.get("ttft_ms", m.get("prefill_ms", 0.0)), "float"),
            "Prefill (tok/s)": (m.get("prefill_tok_s", 0.0), "float"),
            "Decode p50 (ms/token)": (d.get("p50", 0.0), "float"),
            "Decode p95 (ms/token)": (d.get("p95", 0.0), "float"),
            "Decode p99 (ms/token)": (d.get("p99", 0.0), "float"),
            "Decode (tok/s)": (m.get("decode_tok_s", 0.0), "float"),
            "Load (ms)": (m.get("load_ms", 0.0), "float"),
            "Peak host memory (bytes)": (m.get("peak_host_memory_bytes", 0), "int"),
            "Weights (bytes)": (m.get("weight_bytes", 0), "int"),
            "Total kernel time (ms)": (sum(s["ms"] for s in samples), "float"),
        }

    ma, mb = metrics(a), metrics(b)
    rows = []
    for key, (va, kind) in ma.items():
        vb = mb[key][0]
        delta = vb - va
        rows.append({"metric": key, "a": va, "b": vb, "delta": delta,
                     "change_pct": None if kind == "count" else _pct(delta, va), "kind": kind})
    return rows


def step_pairs(a: dict, b: dict) -> list[dict]:
    """Section 2: measured decode step times (low-overhead mode) of A and B, each sorted
    descending and paired by rank: [{rank, a, b, delta, delta_pct}] (None where a side has none)."""
    ta = sorted((s["ms"] for s in measured_steps(a, "decode")), reverse=True)
    tb = sorted((s["ms"] for s in measured_steps(b, "decode")), reverse=True)
    rows = []
    for i in range(max(len(ta), len(tb))):
        va = ta[i] if i < len(ta) else None
        vb = tb[i] if i < len(tb) else None
        delta = vb - va if va is not None and vb is not None else None
        rows.append({"rank": i + 1, "a": va, "b": vb, "delta": delta,
                     "delta_pct": _pct(delta, va) if delta is not None else None})
    return rows


def _groups(profile: dict) -> tuple[dict, dict, dict]:
    """Per (kernel, phase): per-call durations and per-step totals; per phase: step totals."""
    calls: dict[tuple[str, str], list[float]] = {}
    per_step: dict[tuple[str, str], dict[tuple[int, int], float]] = {}
    step_total: dict[str, dict[tuple[int, int], float]] = {}
    for s in measured_samples(profile):
        key = (s["kernel"], s["phase"])
        calls.setdefault(key, []).append(s["ms"])
        step = (s["run"], s["step"])
        mine = per_step.setdefault(key, {})
        mine[step] = mine.get(step, 0.0) + s["ms"]
        totals = step_total.setdefault(s["phase"], {})
        totals[step] = totals.get(step, 0.0) + s["ms"]
    return calls, per_step, step_total


def _log_ratio(new: float, old: float) -> float:
    return math.log(max(new, 1e-12) / max(old, 1e-12))


def log_mad(values: Sequence[float]) -> float:
    """Median absolute deviation of log(values): their spread, scale-free and robust to stalls
    (a minority of calls delayed by preemption or thread-pool waits)."""
    logs = np.log(np.maximum(np.asarray(values, dtype=float), 1e-12))
    return float(np.median(np.abs(logs - np.median(logs))))


def common_mode_drift(log_ratios: Sequence[float]) -> float:
    """The DRIFT_QUANTILE percentile of |log ratio| (0 with fewer than 4 values)."""
    if len(log_ratios) < 4:
        return 0.0
    return float(np.percentile(np.abs(np.asarray(log_ratios, dtype=float)), DRIFT_QUANTILE))


def verdict(row: dict, alpha: float, noise_floor_pct: float) -> str:
    """The noise rule (module docstring) for a row of `kernel_rows` with `floor_log` set."""
    if not row["calls_a"] or not row["calls_b"]:
        return "new" if row["calls_b"] else "removed"
    base = math.log1p(noise_floor_pct / 100.0)
    lr_mean = _log_ratio(row["avg_b"], row["avg_a"])
    lr_med = _log_ratio(row["median_b"], row["median_a"])
    d_mean, d_med = row["avg_b"] - row["avg_a"], row["median_b"] - row["median_a"]
    enough = min(row["calls_a"], row["calls_b"]) >= MIN_CALLS and row["p"] < alpha
    floor = row["floor_log"]
    if enough and min(lr_mean, lr_med) >= floor and min(d_mean, d_med) >= MIN_DELTA_MS:
        return "regression"
    if enough and max(lr_mean, lr_med) <= -floor and max(d_mean, d_med) <= -MIN_DELTA_MS:
        return "improvement"
    if abs(lr_mean) < base and abs(lr_med) < base:
        return "unchanged"
    return "noise"


def kernel_rows(a: dict, b: dict, alpha: float = 0.05, noise_floor_pct: float = NOISE_FLOOR_PCT) -> list[dict]:
    """Section 3: one row per (kernel, phase) in A or B, sorted by suspicion score (descending)."""
    ca, sa, ta = _groups(a)
    cb, sb, tb = _groups(b)
    grand_a = sum(sum(v) for v in ca.values())
    grand_b = sum(sum(v) for v in cb.values())
    rows = []
    for key in sorted(set(ca) | set(cb)):
        kernel, phase = key
        xa, xb = ca.get(key, []), cb.get(key, [])
        total_a, total_b = sum(xa), sum(xb)
        beta_a = 100.0 * total_a / grand_a if grand_a else 0.0
        beta_b = 100.0 * total_b / grand_b if grand_b else 0.0
        # per-step share of the step's kernel time (0 in the phase's steps where the kernel did not run)
        steps_a = [100.0 * sa.get(key, {}).get(st, 0.0) / tot for st, tot in ta.get(phase, {}).items() if tot]
        steps_b = [100.0 * sb.get(key, {}).get(st, 0.0) / tot for st, tot in tb.get(phase, {}).items() if tot]
        row = {
            "kernel": kernel, "phase": phase,
            "role": (b if xb else a)["kernels"].get(kernel, {}).get("role", "other"),
            "calls_a": len(xa), "calls_b": len(xb),
            "total_a": total_a if xa else None, "total_b": total_b if xb else None,
            "avg_a": total_a / len(xa) if xa else None, "avg_b": total_b / len(xb) if xb else None,
            "median_a": float(np.median(xa)) if xa else None, "median_b": float(np.median(xb)) if xb else None,
            "delta_avg": None, "change_pct": None, "median_change_pct": None, "p": None,
            "beta_a": beta_a, "beta_b": beta_b, "delta_beta": beta_b - beta_a,
            "z_beta": welch_z(steps_a, steps_b), "z_log_mu": 0.0, "spread_log": None, "floor_log": None, "floor_pct": None,
        }
        if xa and xb:
            row["spread_log"] = max(log_mad(xa), log_mad(xb))
            row["z_log_mu"] = welch_z(np.log(np.maximum(xa, 1e-12)), np.log(np.maximum(xb, 1e-12)))
            row["p"] = mann_whitney_u(xa, xb)[1]
            row["delta_avg"] = row["avg_b"] - row["avg_a"]
            row["change_pct"] = _pct(row["delta_avg"], row["avg_a"])
            row["median_change_pct"] = _pct(row["median_b"] - row["median_a"], row["median_a"])
        row["suspicion"] = abs(row["delta_beta"]) * (abs(row["z_beta"]) + abs(row["z_log_mu"]))
        rows.append(row)
    both = [r for r in rows if r["calls_a"] and r["calls_b"]]
    ratios = [_log_ratio(r["median_b"], r["median_a"]) for r in both]
    base = math.log1p(noise_floor_pct / 100.0)
    for i, r in enumerate(both):
        drift = common_mode_drift(ratios[:i] + ratios[i + 1:])
        r["floor_log"] = max(base, DRIFT_FACTOR * drift, SPREAD_FACTOR * r["spread_log"])
        r["floor_pct"] = 100.0 * math.expm1(r["floor_log"])
    for r in rows:  # Bonferroni: one test per row with calls on both sides
        r["verdict"] = verdict(r, alpha / max(1, len(both)), noise_floor_pct)
    rows.sort(key=lambda r: (-r["suspicion"], -(r["total_a"] or 0.0) - (r["total_b"] or 0.0), r["kernel"], r["phase"]))
    return rows


def drift_pct(rows: list[dict]) -> float:
    """The common-mode drift of all rows of `kernel_rows`, as a percentage change of the median call time."""
    ratios = [_log_ratio(r["median_b"], r["median_a"]) for r in rows if r["calls_a"] and r["calls_b"]]
    return 100.0 * math.expm1(common_mode_drift(ratios))


# ---- formatting ------------------------------------------------------------------------------------

def _decimals(values) -> int:
    """Decimals that show ~4 significant digits of the smallest non-zero magnitude (2..6)."""
    mags = [abs(v) for v in values if v is not None and v != 0 and math.isfinite(v)]
    if not mags:
        return 2
    return max(2, min(6, 3 - math.floor(math.log10(min(mags)))))


def _num(value, decimals: int = 2) -> str:
    if value is None:
        return "-"
    if isinstance(value, int):
        return f"{value:,}"
    return f"{value:,.{decimals}f}"


def _pct_str(value) -> str:
    return "-" if value is None else f"{value:,.2f}%"


def _p_str(p) -> str:
    if p is None:
        return "-"
    return f"{p:.3f}" if p >= 0.001 or p == 0 else f"{p:.1e}"


def _is_number(cell: str) -> bool:
    try:
        float(cell.replace(",", ""))
        return True
    except ValueError:
        return False


def gfm_table(headers: Sequence[str], rows: Sequence[Sequence[str]], align: Sequence[str] | None = None) -> str:
    """A GFM pipe table like pandas' `to_markdown`. `align` per column: "l" | "r"; by default a
    column is right-aligned when every cell is a number (a "-" placeholder makes it left)."""
    rows = [[str(c) for c in r] for r in rows]
    if align is None:
        align = ["r" if rows and all(_is_number(r[i]) for r in rows) else "l" for i in range(len(headers))]
    # like tabulate: a column is at least its header plus 2 wide (the seed's "| Change (%)   |")
    widths = [max([len(h) + 2] + [len(r[i]) for r in rows]) for i, h in enumerate(headers)]

    def line(cells):
        return "| " + " | ".join(c.rjust(w) if al == "r" else c.ljust(w) for c, w, al in zip(cells, widths, align)) + " |"

    rule = "|" + "|".join(("-" * (w + 1) + ":") if al == "r" else (":" + "-" * (w + 1)) for w, al in zip(widths, align)) + "|"
    return "\n".join([line(headers), rule] + [line(r) for r in rows])


def _same_or_both(va, vb) -> str:
    return str(va) if va == vb else f"{va} / {vb}"


def compare(a: dict, b: dict, name_a: str = "A", name_b: str = "B", alpha: float = 0.05,
            noise_floor_pct: float = NOISE_FLOOR_PCT) -> str:
    """The A/B report (markdown) comparing profile `a` (before) with profile `b` (after)."""
    model = _same_or_both(a.get("display_name", a["model"]), b.get("display_name", b["model"]))
    quant = _same_or_both(a["quantization"], b["quantization"])
    device = _same_or_both(a["device"], b["device"])
    out = [f"# Cross Performance Comparison: {model} {quant} on {device} (A: {name_a} vs B: {name_b})", ""]
    rows = kernel_rows(a, b, alpha, noise_floor_pct)
    m = sum(1 for r in rows if r["calls_a"] and r["calls_b"])
    out += _summary_section(a, b, name_a, name_b)
    out += _steps_section(a, b, name_a, name_b)
    out += _kernels_overview(rows, m, name_a, name_b, alpha, noise_floor_pct)
    out += _key_findings(rows, m, name_a, name_b, alpha)
    out += _detail_table(rows, name_a, name_b)
    out += _legend(name_a, name_b, alpha, noise_floor_pct)
    return "\n".join(out) + "\n"


def _summary_section(a: dict, b: dict, name_a: str, name_b: str) -> list[str]:
    """1. the summary metrics side by side."""
    out: list[str] = []
    # 1. summary
    out.append("## 1. High-Level Performance Summary")
    out.append("")
    body = []
    for r in summary_rows(a, b):
        if r["kind"] in ("count", "int"):
            cells = [_num(int(r["a"])), _num(int(r["b"])), _num(int(r["delta"]))]
        else:
            d = _decimals([r["a"], r["b"]])
            cells = [_num(float(r["a"]), d), _num(float(r["b"]), d), _num(float(r["delta"]), d)]
        body.append([r["metric"], *cells, _pct_str(r["change_pct"])])
    out.append(gfm_table(["Metric", name_a, name_b, f"Δ ({name_b} - {name_a})", "Change (%)"], body, ["l"] * 5))
    out.append("")

    return out


def _steps_section(a: dict, b: dict, name_a: str, name_b: str) -> list[str]:
    """2. the decode steps' times paired by rank."""
    out: list[str] = []
    # 2. step distribution
    out.append("## 2. Step Duration Distribution Comparison")
    out.append("")
    pairs = step_pairs(a, b)
    d = _decimals([v for r in pairs for v in (r["a"], r["b"])])
    body = [[str(r["rank"]), _num(r["a"], d), _num(r["b"], d), _num(r["delta"], d), _pct_str(r["delta_pct"])] for r in pairs]
    if body:
        align = ["r"] + ["r" if all(row[i] != "-" for row in body) else "l" for i in (1, 2)] + ["l", "l"]
        out.append(gfm_table(["Time Rank", f"{name_a} Time (ms)", f"{name_b} Time (ms)", "Δ (ms)", "Δ (%)"], body, align))
    else:
        out.append("*No measured decode steps in either profile.*")
    out.append("")

    return out


def _kernels_overview(rows: list[dict], m: int, name_a: str, name_b: str, alpha: float, noise_floor_pct: float) -> list[str]:
    """3. the per-kernel comparison's overview: the main difference, the verdicts, the drift."""
    out: list[str] = []
    # 3. kernels
    drift = drift_pct(rows)
    out.append("## 3. Per-Kernel Comparison")
    out.append("")
    out.append("### Overview")
    out.append("")
    flagged = [r for r in rows if r["verdict"] in ("regression", "improvement", "new", "removed")]
    if flagged:
        top = flagged[0]
        direction = "increase" if top["delta_beta"] > 0 else "decrease"
        out.append(f"The primary performance difference between `{name_a}` and `{name_b}` appears to be driven by changes in "
                   f"**`{top['kernel']}`** ({top['phase']}). The analysis indicates a notable {direction} in its contribution "
                   f"to total kernel time (verdict: **{top['verdict']}**).")
        counts = {v: sum(1 for r in rows if r["verdict"] == v) for v in ("regression", "improvement", "new", "removed")}
        out.append("")
        out.append("Verdicts: " + ", ".join(f"{n} {v}" for v, n in counts.items() if n) + f" of {len(rows)} (kernel, phase) rows.")
    else:
        out.append(f"No kernel differs between `{name_a}` and `{name_b}` beyond run-to-run noise: no (kernel, phase) has "
                   f"p < {alpha:g}/{m} together with a change of its mean and median call time of at least its noise "
                   "floor (see the Legend).")
    if DRIFT_FACTOR * math.log1p(drift / 100.0) > math.log1p(noise_floor_pct / 100.0):  # the drift raises floors
        out.append("")
        out.append(f"**Common-mode drift:** a quarter of the (kernel, phase) rows moved their median call time by "
                   f"{drift:.1f}% or more. A shift shared by that many kernels usually means the machine's state changed "
                   "between the two profiles (CPU frequency, thread-pool contention, other processes), so the noise floors "
                   "are raised; re-profile both on a quiet machine to confirm a shift of many kernels at once.")
    out.append("")
    return out


def _key_findings(rows: list[dict], m: int, name_a: str, name_b: str, alpha: float) -> list[str]:
    """The most suspicious (kernel, phase) rows, with what moved and the verdict."""
    out: list[str] = []
    threshold = f"p < {alpha / max(1, m):.2g} = {alpha:g}/{m}"
    out.append("### Key Findings:")
    tops = [r for r in rows if r["suspicion"] > 0][:TOP_FINDINGS]
    if not tops:
        out.append("- No kernel's contribution to total kernel time (β) changed.")
    for r in tops:
        out.append(f"- **`{r['kernel']}` in phase `{r['phase']}`:**")
        change = "increased" if r["delta_beta"] > 0 else "decreased"
        if r["p"] is None:
            sig = f"as it runs only in `{name_b if r['verdict'] == 'new' else name_a}` (verdict: **{r['verdict']}**)"
        elif r["p"] < alpha:
            sig = f"which is statistically significant (p-value: {_p_str(r['p'])})"
        else:
            sig = f"though this change may not be statistically significant (p-value: {_p_str(r['p'])})"
        out.append(f"  - Its contribution to total kernel time (β) **{change}** from **{r['beta_a']:.2f}%** to "
                   f"**{r['beta_b']:.2f}%** ({r['delta_beta']:+.2f} ppt), {sig}.")
        if r["p"] is not None:
            dd = _decimals([r["avg_a"], r["avg_b"], r["median_a"], r["median_b"]])
            out.append("  - This change in kernel time contribution correlates with changes in its per-call duration (μ):")
            for label, va, vb, pct in (("avg call time (ms)", r["avg_a"], r["avg_b"], r["change_pct"]),
                                       ("median call time (ms)", r["median_a"], r["median_b"], r["median_change_pct"])):
                if vb == va:
                    out.append(f"    - **`{label}`**: unchanged at {_num(va, dd)}.")
                else:
                    moved = "increased" if vb > va else "decreased"
                    out.append(f"    - **`{label}`**: {moved} from {_num(va, dd)} to {_num(vb, dd)} ({pct:+.2f}%).")
            if r["calls_a"] != r["calls_b"]:
                out.append(f"    - **`calls`**: {r['calls_a']:,} in `{name_a}`, {r['calls_b']:,} in `{name_b}`.")
            out.append(f"  - Verdict: **{r['verdict']}** (noise floor {r['floor_pct']:.1f}%; significance needs {threshold}).")
    out.append("")
    out.append("*Note: β sums to 100% over all rows; a kernel has one row per phase (prefill, decode), since its shapes "
               "and timings differ between them.*")
    out.append("")
    out.append("**Recommendation:** Focus investigation on the kernels listed above, starting with the one with the highest "
               "**Suspicion Score**. Examine the interplay between its share of total kernel time (β) and its per-call "
               "duration (μ) changes to understand the root cause; a kernel marked `noise` or `unchanged` did not move "
               "beyond run-to-run variation.")
    return out


def _detail_table(rows: list[dict], name_a: str, name_b: str) -> list[str]:
    """Every (kernel, phase) row, by suspicion score."""
    out: list[str] = []
    out.append("### Detailed comparison table")
    out.append("This table aggregates the performance of each (kernel, phase) pair across both runs, sorted by "
               "**Suspicion Score** in descending order.")
    out.append("")
    d_tot = _decimals([v for r in rows for v in (r["total_a"], r["total_b"])])
    d_avg = _decimals([v for r in rows for v in (r["avg_a"], r["avg_b"])])
    headers = ["Kernel", "Phase", "Suspicion Score", f"Calls {name_a}", f"Calls {name_b}",
               f"Total {name_a} (ms)", f"Total {name_b} (ms)", f"Avg {name_a} (ms)", f"Avg {name_b} (ms)",
               "Δ avg (ms)", "Change (%)", "Median Change (%)", "Floor (%)", f"β_{name_a}(%)", f"β_{name_b}(%)",
               "Δβ(%)", "Z-Score(β)", "Z-Score(log_μ)", "U-test p", "Verdict"]

    def fixed(value, fmt=".2f"):
        return "-" if value is None else format(value, fmt)

    body = []
    for r in rows:
        body.append([
            r["kernel"], r["phase"], f"{r['suspicion']:.3f}", _num(r["calls_a"]), _num(r["calls_b"]),
            _num(r["total_a"], d_tot), _num(r["total_b"], d_tot), _num(r["avg_a"], d_avg), _num(r["avg_b"], d_avg),
            _num(r["delta_avg"], d_avg), fixed(r["change_pct"]), fixed(r["median_change_pct"]), fixed(r["floor_pct"], ".1f"),
            f"{r['beta_a']:.2f}", f"{r['beta_b']:.2f}", f"{r['delta_beta']:.2f}",
            f"{r['z_beta']:.2f}", f"{r['z_log_mu']:.2f}", _p_str(r["p"]), r["verdict"],
        ])
    if body:
        out.append(gfm_table(headers, body))
    else:
        out.append("*No measured kernel samples in either profile.*")
    out.append("")

    return out


def _legend(name_a: str, name_b: str, alpha: float, noise_floor_pct: float) -> list[str]:
    """4. what every column and verdict means."""
    out: list[str] = []
    # 4. legend
    out.append("## 4. Legend")
    out.append(f"- **A / B**: `{name_a}` is the baseline (before), `{name_b}` the candidate (after); "
               "every Δ is B - A and every Change (%) is Δ / A · 100.")
    out.append("- **Summary**: TTFT, prefill, decode percentiles and tok/s come from the low-overhead mode (whole-step "
               "timing); Total kernel time is the sum of all measured per-kernel samples. Forward steps and kernel "
               "calls count measured steps (low-overhead mode) and kernel calls; warm-up runs are excluded everywhere.")
    out.append("- **Time Rank**: each profile's measured decode step times (low-overhead mode), sorted in descending "
               "order and paired by rank; `-` where one profile has fewer steps.")
    out.append("- **β (Beta)**: The percentage of total kernel time (all measured kernel calls) consumed by this kernel "
               "in this phase; Δβ is in percentage points.")
    out.append("- **μ (Mu)**: The per-call duration of the kernel (ms); Avg is its mean; Change (%) and Median "
               "Change (%) compare the mean and the median call time.")
    out.append("- **Z-Score(β)**: Welch z of the kernel's per-step share of the step's kernel time, "
               "(mean_B - mean_A) / sqrt(s²_A/n_A + s²_B/n_B), over the measured steps of the phase.")
    out.append("- **Z-Score(log_μ)**: the same Welch z on the logarithm of the per-call durations "
               f"(|Z| is capped at {Z_CAP:g} when both samples are constant).")
    out.append("- **U-test p**: two-sided Mann-Whitney U test on the per-call durations (non-warm-up samples): average "
               "ranks for ties, normal approximation with tie correction and continuity correction (not the exact "
               "distribution); p = 1 when a side has fewer than 2 calls or all durations are equal. Lower values "
               "(e.g., < 0.05) suggest the difference is statistically significant.")
    out.append(f"- **Floor (%)**: the noise floor of the row, the largest of (in log scale): {noise_floor_pct:g}%; the "
               f"common-mode drift, {DRIFT_FACTOR:g}× the {DRIFT_QUANTILE:g}th percentile of |log(median_B / median_A)| "
               f"over the other rows (a shift many kernels share is a change of machine state); and {SPREAD_FACTOR:g}× "
               "the larger median absolute deviation of log(call time) in either profile (the kernel's own scatter).")
    out.append(f"- **Verdict**: `regression` / `improvement` only when p < {alpha:g}/m (Bonferroni over the m rows "
               "with calls in both profiles), the mean AND the median call "
               "time both moved by at least the floor in the same direction (B/A ≥ 1 + floor, or A/B ≥ 1 + floor), "
               f"by at least {MIN_DELTA_MS * 1e3:g} µs per call (the timing resolution of per-kernel mode), with at "
               f"least {MIN_CALLS} calls on each side; `unchanged` when mean and median moved less than "
               f"{noise_floor_pct:g}%; `noise` otherwise; `new` / `removed` when the kernel runs in only one profile. "
               "Calls of one profile share the machine's state, so a small p alone is not a regression.")
    out.append("- **Suspicion Score**: A composite score `|Δβ| * (|Z-Score(β)| + |Z-Score(log_μ)|)` to rank potential "
               "issues. **Focus on items with the highest score first.**")
    return out


def check_comparable(a: dict, b: dict, name_a: str, name_b: str) -> None:
    """Profiles of different models or quantizations are refused (ProfileError, one line): their
    kernels differ in shape, so a per-kernel A/B of them reports shape changes as regressions."""
    for field in ("model", "quantization"):
        if a[field] != b[field]:
            raise ProfileError(f"{name_a} and {name_b}: different {field} ({short_repr(a[field])} vs {short_repr(b[field])}); "
                               "compare profiles of one model and quantization, or pass --allow-different")


def compare_files(path_a: str | Path, path_b: str | Path, alpha: float = 0.05,
                  noise_floor_pct: float = NOISE_FLOOR_PCT, allow_different: bool = False) -> str:
    """`compare` of two profile JSON files, named by their file names (refused for different
    models or quantizations unless `allow_different`)."""
    a, b = load_profile(path_a), load_profile(path_b)
    if not allow_different:
        check_comparable(a, b, str(path_a), str(path_b))
    name_a, name_b = Path(path_a).stem, Path(path_b).stem
    if name_a == name_b:
        name_a, name_b = str(path_a), str(path_b)
    return compare(a, b, name_a, name_b, alpha, noise_floor_pct)

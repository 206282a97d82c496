"""What every report format shares: per-kernel/per-phase rows, bandwidth, matmul shapes, run numbers.

Everything here is a pure function of the profile dict (see `..schema`); statistics exclude
warm-up samples.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

from ...roles import ROLES  # noqa: F401  (every role a kernel can have, in report order)
from ..schema import device_kernel_name, kernel_stats, measured_samples

PHASES = ("prefill", "decode")


def percentile(values: Sequence[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default method)."""
    if not values:
        return 0.0
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def median(values: Sequence[float]) -> float:
    return percentile(values, 50.0)


def fmt_bytes(n: float | None) -> str:
    """1024-based, two decimals: '0 B', '812.00 B', '199.25 KB', '2.04 GB'."""
    if n is None:
        return "-"
    if n == 0:
        return "0 B"
    value = float(n)
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(value) < 1024 or unit == "TB":
            return f"{value:.2f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def phases_of(profile: dict) -> list[str]:
    """The phases this profile has measured samples for, prefill first."""
    seen = {s["phase"] for s in measured_samples(profile)}
    return [p for p in PHASES if p in seen] + sorted(seen - set(PHASES))


def resolve_peak_gbps(profile: dict, peak_gbps: float | None) -> float | None:
    """The argument, else the profile's `peak_gbps`, else the target preset's; None when unknown."""
    for value in (peak_gbps, profile.get("peak_gbps")):
        if value:
            return float(value)
    name = profile.get("target_name")
    if not name:
        return None
    from ...targets import preset_peak_gbps

    return preset_peak_gbps(name)


def is_matmul(kernel: str) -> bool:
    return "matmul" in kernel


def matmul_shape(profile: dict, kernel: str, phase: str) -> tuple[int, int, int] | None:
    """(M, N, K) of a matmul kernel's call in `phase`, when the profile records it.

    Read from `kernels[k]["mnk"][phase]` ([M, N, K]) or derived from `kernels[k]["arg_shapes"][phase]`
    (one entry per call argument: a list of dims for a tensor, null otherwise; outputs last, as TVM
    passes them): the output is [..., M, N]; K is the last dim of the first input with the output's
    leading dims (the activation; for a fused residual add that input has K == N, so prefer the
    one whose last dim differs from N). None when neither is recorded.
    """
    if not is_matmul(kernel):
        return None
    info = profile.get("kernels", {}).get(kernel, {})
    mnk = (info.get("mnk") or {}).get(phase)
    if mnk and len(mnk) == 3:
        return int(mnk[0]), int(mnk[1]), int(mnk[2])
    shapes = (info.get("arg_shapes") or {}).get(phase)
    if not shapes:
        return None
    tensors = [list(s) for s in shapes if isinstance(s, list)]
    if len(tensors) < 2 or len(tensors[-1]) < 2:
        return None
    out = tensors[-1]
    n = int(out[-1])
    m = math.prod(int(d) for d in out[:-1])
    candidates = [t for t in tensors[:-1] if len(t) == len(out) and t[:-1] == out[:-1]]
    if not candidates:
        return None
    pick = next((t for t in candidates if t[-1] != n), candidates[0])
    return m, n, int(pick[-1])


def shape_label(mnk: tuple[int, int, int]) -> str:
    return f"M={mnk[0]} N={mnk[1]} K={mnk[2]}"


def kernel_parents(profile: dict) -> dict[str, str]:
    """kernel -> 'vm' / 'kv_cache' (joined with '+' if a kernel ran under both)."""
    parents: dict[str, set[str]] = {}
    for s in profile["samples"]:
        parents.setdefault(s["kernel"], set()).add(s["parent"])
    return {k: "+".join(sorted(v)) for k, v in parents.items()}


def phase_rows(profile: dict, peak_gbps: float | None) -> list[dict]:
    """One row per (phase, kernel), phases in order, kernels by total time; `kernel_stats` columns
    (pct / cum_pct of the phase's total) plus min_ms, device name, parent, bytes per call, GB/s,
    % of peak, (M, N, K) and GFLOP/s (None where unknown)."""
    parents = kernel_parents(profile)
    mins: dict[tuple[str, str], float] = {}
    for s in measured_samples(profile):
        key = (s["phase"], s["kernel"])
        mins[key] = min(mins.get(key, math.inf), s["ms"])
    rows = []
    for phase in phases_of(profile):
        for stat in kernel_stats(profile, phase):
            kernel = stat["kernel"]
            nbytes = profile.get("kernels", {}).get(kernel, {}).get("bytes", {}).get(phase)
            avg_s = stat["avg_ms"] / 1e3
            gbps = nbytes / avg_s / 1e9 if nbytes is not None and avg_s > 0 else None
            mnk = matmul_shape(profile, kernel, phase)
            gflops = 2.0 * mnk[0] * mnk[1] * mnk[2] / avg_s / 1e9 if mnk and avg_s > 0 else None
            rows.append({
                **stat,
                "phase": phase,
                "device_kernel": device_kernel_name(profile, kernel),
                "parent": parents.get(kernel, ""),
                "min_ms": mins[(phase, kernel)],
                "bytes": nbytes,
                "gbps": gbps,
                "pct_peak": 100.0 * gbps / peak_gbps if gbps is not None and peak_gbps else None,
                "mnk": mnk,
                "gflops": gflops,
            })
    return rows


def role_totals(profile: dict, phase: str | None) -> list[tuple[str, float, int]]:
    """(role, total ms, calls) for `phase` (None: all), by total time."""
    totals: dict[str, list] = {}
    for stat in kernel_stats(profile, phase):
        entry = totals.setdefault(stat["role"], [0.0, 0])
        entry[0] += stat["total_ms"]
        entry[1] += stat["iterations"]
    return sorted(((r, t, n) for r, (t, n) in totals.items()), key=lambda x: (-x[1], x[0]))


def measured_steps(profile: dict, mode: str, phase: str | None = None) -> list[dict]:
    return [s for s in profile.get("steps", [])
            if s["mode"] == mode and not s["warmup"] and (phase is None or s["phase"] == phase)]


def measured_runs(profile: dict) -> int:
    """Number of measured (non warm-up) runs: the config's, else counted from the samples."""
    runs = profile.get("config", {}).get("runs")
    if runs:
        return int(runs)
    return len({s["run"] for s in measured_samples(profile)}) or 1


def decode_total_ms(profile: dict) -> float:
    """Median over measured low-overhead runs of the run's summed decode steps (0 if none)."""
    per_run: dict[int, float] = {}
    for s in measured_steps(profile, "low-overhead", "decode"):
        per_run[s["run"]] = per_run.get(s["run"], 0.0) + s["ms"]
    return median(list(per_run.values())) if per_run else 0.0


def run_summary(profile: dict, peak_gbps: float | None) -> list[tuple[str, str]]:
    """(metric, value) rows of the run summary, every value formatted; '-' where unknown."""
    m = profile.get("metrics", {})
    cfg = profile.get("config", {})
    dec = m.get("decode_ms_per_token") or {}
    over = m.get("overhead") or {}

    def num(value, spec: str, unit: str = "") -> str:
        return "-" if value is None else f"{value:{spec}}{unit}"

    pct = over.get("percent")
    return [
        ("Runs", f"{cfg.get('runs', '-')} measured + {cfg.get('warmup_runs', '-')} warm-up, "
                 f"prompt {cfg.get('prompt_len', '-')} tokens, {cfg.get('gen_len', '-')} generated"),
        ("Load", num(m.get("load_ms"), ".2f", " ms")),
        ("TTFT", num(m.get("ttft_ms"), ".3f", " ms")),
        ("Prefill", f"{num(m.get('prefill_ms'), '.3f', ' ms')} ({num(m.get('prefill_tok_s'), '.1f', ' tok/s')})"),
        ("Decode ms/token p50 / p95 / p99",
         " / ".join(num(dec.get(k), ".3f") for k in ("p50", "p95", "p99")) + " ms"),
        ("Decode", num(m.get("decode_tok_s"), ".1f", " tok/s")),
        ("Peak host memory", f"{fmt_bytes(m.get('peak_host_memory_bytes'))} ({m.get('peak_host_memory_bytes', '-')} B)"),
        ("Weights", f"{fmt_bytes(m.get('weight_bytes'))} ({m.get('weight_bytes', '-')} B)"),
        ("Per-kernel overhead vs low-overhead mode",
         f"{num(pct, '+.1f', '%')} ({num(over.get('per_kernel_total_ms'), '.3f', ' ms')} vs "
         f"{num(over.get('low_overhead_total_ms'), '.3f', ' ms')})"),
        ("Peak bandwidth (for % of peak)", num(peak_gbps, ".1f", " GB/s") if peak_gbps else "- (unknown)"),
    ]


def fmt_opt(value: float | None, spec: str, suffix: str = "") -> str:
    return "-" if value is None else f"{value:{spec}}{suffix}"


def group_by(samples: Iterable[dict], key) -> dict:
    out: dict = {}
    for s in samples:
        out.setdefault(key(s), []).append(s["ms"])
    return out

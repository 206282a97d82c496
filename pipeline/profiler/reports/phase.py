"""The per-phase profile report ("phase"): per phase a `[Profile] GPU Profile Report` block of
kernel time per pass (mean over the measured runs), then the `[Perf] TTFT | Prefill | Decode`
line and the `[metrics]` lines from the profile's metrics. Layout: docs/profiler.md.
"""

from __future__ import annotations

from ..schema import device_kernel_name, kernel_stats
from ._common import decode_total_ms, fmt_bytes, measured_runs, phases_of

RULE = "─" * 50
_TITLES = {"prefill": "Prefill (prefill)"}


def _row(label: str, ms: float, pct: float) -> str:
    return f"{label:<25}{ms:>12.2f}{pct:>8.1f}"


def phase_block(profile: dict, phase: str) -> list[str]:
    runs = measured_runs(profile)
    stats = kernel_stats(profile, phase)
    times = [(device_kernel_name(profile, s["kernel"]), s["total_ms"] / runs) for s in stats]
    total = sum(t for _, t in times)
    steps = max(1, int(profile.get("config", {}).get("gen_len", 2)) - 1)
    title = _TITLES.get(phase, f"Decode (N={steps})" if phase == "decode" else phase)
    return [
        f"[Profile] {title}:",
        "[Profile] GPU Profile Report",
        RULE,
        f"{'Kernel':<25}{'Time (ms)':>12}{'%':>8}",
        RULE,
        *(_row(name, t, 100.0 * t / total if total else 0.0) for name, t in times),
        RULE,
        _row("TOTAL", total, 100.0),
        "",
    ]


def render_phase(profile: dict, peak_gbps: float | None = None) -> str:
    del peak_gbps
    out = []
    for phase in phases_of(profile):
        out += phase_block(profile, phase)
    m = profile.get("metrics", {})
    cfg = profile.get("config", {})
    gen_len = int(cfg.get("gen_len", 0))
    prompt_len = int(cfg.get("prompt_len", 0))
    ttft = float(m.get("ttft_ms", 0.0))
    prefill = float(m.get("prefill_ms", ttft))
    decode = decode_total_ms(profile)
    n_decode = max(gen_len - 1, 0)
    decode_tok_s = n_decode / (decode / 1e3) if decode else 0.0
    total = ttft + decode
    out += [
        f"[Perf] TTFT: {ttft:.0f}ms | Prefill: {prefill:.0f}ms | Decode: {decode:.0f}ms ({n_decode} tokens @ {decode_tok_s:.1f} tok/s)",
        f"[Loader] Memory (complete): | Host peak={fmt_bytes(m.get('peak_host_memory_bytes'))}"
        f" | Weights={fmt_bytes(m.get('weight_bytes'))} | Device={profile['device']}",
        f"[metrics] load={float(m.get('load_ms', 0.0)):.1f}ms prefillTokens={prompt_len} decodeTokens={gen_len} maxTokens={gen_len}",
        f"[metrics] ttft={ttft:.1f}ms prefill={prefill:.1f}ms decode={decode:.1f}ms total={total:.1f}ms",
        f"[metrics] tok/s total={gen_len / (total / 1e3) if total else 0.0:.2f} prefill={float(m.get('prefill_tok_s', 0.0)):.2f}"
        f" decode={float(m.get('decode_tok_s', 0.0)):.2f}",
    ]
    return "\n".join(out)

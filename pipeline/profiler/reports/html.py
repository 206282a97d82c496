"""A self-contained HTML page ("html") of where the time goes: inline CSS and SVG, no scripts, no
external assets. Run summary numbers at the top, then stacked bars by phase, by role (per phase)
and by kernel (per phase), each kernel also as a bar in a table. Times are kernel time of one pass
(mean over the measured runs), as in the "phase" report; hovering a segment shows its numbers.
"""

from __future__ import annotations

from html import escape

from ..schema import kernel_stats
from ._common import fmt_bytes, fmt_opt, measured_runs, phase_rows, phases_of, role_totals

ROLE_COLORS = {
    "qkv": "#4e79a7", "o_proj": "#76b7b2", "gate_up": "#f28e2b", "down": "#e15759", "lm_head": "#b07aa1",
    "attention": "#59a14f", "kv append": "#9c755f", "norm": "#edc948", "rope": "#ff9da7", "swiglu": "#bab0ac",
    "embedding": "#86bcb6", "other": "#d4a6c8",
}
PHASE_COLORS = {"prefill": "#4e79a7", "decode": "#f28e2b"}
KERNEL_PALETTE = ("#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1", "#ff9da7",
                  "#9c755f", "#bab0ac", "#86bcb6", "#d37295")
OTHERS_COLOR = "#cccccc"
BAR_W, BAR_H = 860, 30
TOP_KERNELS = 10

CSS = """
body{font:14px/1.45 system-ui,-apple-system,Segoe UI,Roboto,sans-serif;color:#222;margin:24px auto;max-width:900px;padding:0 16px}
h1{font-size:22px;margin:0 0 4px}h2{font-size:17px;margin:28px 0 8px;border-bottom:1px solid #ddd;padding-bottom:4px}
h3{font-size:14px;margin:16px 0 6px;color:#444}.sub{color:#666;margin:0 0 16px}
.cards{display:grid;grid-template-columns:repeat(auto-fill,minmax(160px,1fr));gap:8px}
.card{border:1px solid #ddd;border-radius:6px;padding:8px 10px;background:#fafafa}
.card .v{font-size:18px;font-weight:600}.card .k{color:#666;font-size:12px}
.legend{display:flex;flex-wrap:wrap;gap:4px 14px;margin:6px 0 0;padding:0;list-style:none;font-size:12px}
.sw{display:inline-block;width:10px;height:10px;margin-right:4px;border-radius:2px;vertical-align:-1px}
table{border-collapse:collapse;width:100%;font-size:12px;margin-top:8px}
th,td{text-align:left;padding:2px 6px;border-bottom:1px solid #eee;white-space:nowrap}td.n{text-align:right;font-variant-numeric:tabular-nums}
code{font-size:12px}svg text{font:11px system-ui,sans-serif;fill:#111}
"""


def _stacked_bar(parts: list[tuple[str, float, str]]) -> str:
    """One horizontal bar of segments (label, ms, color), widths proportional to ms."""
    total = sum(ms for _, ms, _ in parts) or 1.0
    x, rects = 0.0, []
    for label, ms, color in parts:
        w = BAR_W * ms / total
        tip = f"{label}: {ms:.3f} ms ({100.0 * ms / total:.1f}%)"
        rects.append(f'<rect x="{x:.2f}" y="0" width="{max(w, 0.0):.2f}" height="{BAR_H}" fill="{color}">'
                     f"<title>{escape(tip)}</title></rect>")
        if w > 70:
            text = label if len(label) * 6 < w - 8 else f"{100.0 * ms / total:.0f}%"
            rects.append(f'<text x="{x + 4:.2f}" y="{BAR_H / 2 + 4:.0f}">{escape(text)}</text>')
        x += w
    return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{BAR_W}" height="{BAR_H}" viewBox="0 0 {BAR_W} {BAR_H}" '
            f'role="img">{"".join(rects)}</svg>')


def _legend(parts: list[tuple[str, float, str]]) -> str:
    total = sum(ms for _, ms, _ in parts) or 1.0
    items = "".join(f'<li><span class="sw" style="background:{c}"></span>{escape(label)} '
                    f"{ms:.3f} ms ({100.0 * ms / total:.1f}%)</li>" for label, ms, c in parts)
    return f'<ul class="legend">{items}</ul>'


def _bar_cell(frac: float, color: str) -> str:
    w = 200
    return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="10"><rect width="{w * frac:.1f}" height="10" '
            f'fill="{color}"/></svg>')


def render_html(profile: dict, peak_gbps: float | None = None) -> str:
    runs = measured_runs(profile)
    m = profile.get("metrics", {})
    dec = m.get("decode_ms_per_token") or {}
    over = m.get("overhead") or {}
    title = f"{profile.get('display_name', profile['model'])} {profile['quantization']} on {profile['device']}"
    cards = [
        ("TTFT", fmt_opt(m.get("ttft_ms"), ".3f", " ms")),
        ("Prefill", fmt_opt(m.get("prefill_tok_s"), ".1f", " tok/s")),
        ("Decode", fmt_opt(m.get("decode_tok_s"), ".1f", " tok/s")),
        ("ms/token p50 / p95 / p99", " / ".join(fmt_opt(dec.get(k), ".3f") for k in ("p50", "p95", "p99"))),
        ("Load", fmt_opt(m.get("load_ms"), ".1f", " ms")),
        ("Peak host memory", fmt_bytes(m.get("peak_host_memory_bytes"))),
        ("Weights", fmt_bytes(m.get("weight_bytes"))),
        ("Per-kernel overhead", fmt_opt(over.get("percent"), "+.1f", "%")),
    ]
    cfg = profile.get("config", {})
    body = [
        f"<h1>{escape(title)}</h1>",
        f'<p class="sub">target {escape(str(profile.get("target_name", profile["target"]["kind"])))} · '
        f"{cfg.get('runs', '-')} measured runs (+{cfg.get('warmup_runs', '-')} warm-up) · prompt {cfg.get('prompt_len', '-')} "
        f"tokens · {cfg.get('gen_len', '-')} generated · times below: kernel time of one pass, mean over runs</p>",
        '<div class="cards">' + "".join(f'<div class="card"><div class="v">{escape(v)}</div><div class="k">{escape(k)}</div></div>'
                                        for k, v in cards) + "</div>",
    ]
    phases = phases_of(profile)
    phase_parts = [(p, sum(s["total_ms"] for s in kernel_stats(profile, p)) / runs, PHASE_COLORS.get(p, OTHERS_COLOR))
                   for p in phases]
    body += ["<h2>By phase</h2>", _stacked_bar(phase_parts), _legend(phase_parts), "<h2>By role</h2>"]
    for phase in phases:
        parts = [(role, t / runs, ROLE_COLORS.get(role, OTHERS_COLOR)) for role, t, _ in role_totals(profile, phase)]
        body += [f"<h3>{escape(phase)}</h3>", _stacked_bar(parts), _legend(parts)]
    body.append("<h2>By kernel</h2>")
    rows_by_phase: dict[str, list[dict]] = {}
    for r in phase_rows(profile, peak_gbps):
        rows_by_phase.setdefault(r["phase"], []).append(r)
    for phase in phases:
        rows = rows_by_phase.get(phase, [])
        parts = [(r["device_kernel"], r["total_ms"] / runs, KERNEL_PALETTE[i % len(KERNEL_PALETTE)])
                 for i, r in enumerate(rows[:TOP_KERNELS])]
        rest = sum(r["total_ms"] for r in rows[TOP_KERNELS:]) / runs
        if rest:
            parts.append((f"{len(rows) - TOP_KERNELS} other kernels", rest, OTHERS_COLOR))
        top = rows[0]["total_ms"] if rows else 1.0
        table = ["<table><tr><th>kernel</th><th>role</th><th>calls/pass</th><th>ms/pass</th><th>%</th><th>GB/s</th>"
                 "<th></th></tr>"]
        for r in rows:
            table.append(
                f"<tr><td><code>{escape(r['device_kernel'])}</code></td><td>{escape(r['role'])}</td>"
                f'<td class="n">{r["iterations"] / runs:g}</td><td class="n">{r["total_ms"] / runs:.3f}</td>'
                f'<td class="n">{r["pct"]:.1f}</td><td class="n">{fmt_opt(r["gbps"], ".2f")}</td>'
                f"<td>{_bar_cell(r['total_ms'] / top if top else 0.0, ROLE_COLORS.get(r['role'], OTHERS_COLOR))}</td></tr>")
        table.append("</table>")
        body += [f"<h3>{escape(phase)}</h3>", _stacked_bar(parts), _legend(parts), "".join(table)]
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<title>Profile: {escape(title)}</title><style>{CSS}</style></head>\n<body>\n"
            + "\n".join(body) + "\n</body></html>\n")

"""Render a benchmark run (the JSON llm_cpu.py writes) as Markdown: the side-by-side table, the
per-kernel GB/s of mlcpipe's decode GEMVs, and the target checklist."""

from __future__ import annotations

import statistics

TARGET_BOUND_PCT = 70.0  # issue 16: q4f16_1 decode at >= 70% of the bandwidth bound
TARGET_BUILD_S = 60.0


def _p50(row: dict) -> float | None:
    return statistics.median(row["decode_ms"]) if row.get("decode_ms") else None


def _fmt(value, spec: str, missing: str = "–") -> str:
    return missing if value is None else format(value, spec)


def _mb(nbytes: int) -> str:
    return f"{nbytes / 1e6:.0f} MB" if nbytes >= 1e7 else f"{nbytes / 1e6:.3g} MB"


def bound_of(run: dict) -> float | None:
    values = [b["bound_gbps"] for b in run.get("bandwidth", []) if b.get("bound_gbps")]
    return max(values) if values else None


def pct_of_bound(row: dict, bound: float | None) -> float | None:
    p50 = _p50(row)
    if not (p50 and bound and row.get("weight_bytes_per_token")):
        return None
    return 100.0 * row["weight_bytes_per_token"] / (p50 / 1e3) / 1e9 / bound


def find(run: dict, engine: str, dtype_prefix: str) -> dict | None:
    for row in run["rows"]:
        if row["engine"] == engine and row["dtype"].startswith(dtype_prefix) and not row.get("error") and row.get("decode_ms"):
            return row
    return None


def reference_tokens(run: dict) -> tuple[str, list[int]] | None:
    """The greedy tokens of the most exact engine that ran (every engine gets the same prompt)."""
    for engine, dtype in (("pytorch", "fp32"), ("mlcpipe", "q0f32"), ("mlcpipe", "q0f16"), ("pytorch", "bf16")):
        row = find(run, engine, dtype)
        if row and row.get("tokens"):
            return f"{'PyTorch' if engine == 'pytorch' else 'mlcpipe'} {dtype}", row["tokens"]
    return None


def agreement(row: dict, ref: tuple[str, list[int]] | None) -> str | None:
    if not ref or not row.get("tokens") or row["tokens"] is ref[1]:
        return None
    n = min(len(row["tokens"]), len(ref[1]))
    same = next((i for i in range(n) if row["tokens"][i] != ref[1][i]), n)
    return f"greedy tokens = {ref[0]}'s for the first {same}/{n}"


def main_table(run: dict) -> list[str]:
    s, bound = run["settings"], bound_of(run)
    ref = reference_tokens(run)
    lines = [
        f"| engine | dtype / quant | prefill {s['prefill']} tok: s (tok/s) | decode ms/token p50 (ctx ~{s['context']}) "
        "| tok/s | weights read / token | % of bandwidth bound | notes |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for row in run["rows"]:
        notes = list(row.get("notes", []))
        if agreement(row, ref):
            notes.append(agreement(row, ref))
        load = row.get("load_average")
        if load:
            notes.append(f"load {load[0]:.2f}")
        if row.get("error"):
            lines.append(f"| {row['engine']} | {row['dtype']} | – | – | – | – | – | FAILED: {row['error']} |")
            continue
        p50 = _p50(row)
        prefill = (f"{row['prefill_s']:.2f} ({row['prefill_tokens'] / row['prefill_s']:.1f})"
                   if row.get("prefill_s") else "–")
        lines.append(
            f"| {row['engine']} | {row['dtype']} | {prefill} | {_fmt(p50, '.1f')} | {_fmt(1e3 / p50 if p50 else None, '.2f')} "
            f"| {_mb(row['weight_bytes_per_token'])} | {_fmt(pct_of_bound(row, bound), '.0f')}% | {'; '.join(notes)} |"
        )
    return lines


def bandwidth_lines(run: dict) -> list[str]:
    out = []
    for label, b in zip(("start of run", "end of run"), run.get("bandwidth", [])):
        if not b.get("methods"):
            out.append(f"- {label}: FAILED {b.get('error', '')}")
            continue
        methods = ", ".join(f"{k} {v:.1f}" for k, v in b["methods"].items())
        out.append(f"- {label}: **{b['bound_gbps']:.1f} GB/s** by `{b['method']}` ({methods} GB/s; "
                   f"{b['bytes'] / 2**30:.3g} GiB float32 read, {b['threads']} threads, best of {b['repeats']}; load {b['load_average'][0]:.2f})")
    bound = bound_of(run)
    if bound:
        out.append(f"- bound used for the % columns: **{bound:.1f} GB/s** (the best of the above)")
    return out


def kernel_tables(run: dict) -> list[str]:
    bound = bound_of(run)
    out = []
    for row in run["rows"]:
        kernels = row.get("extra", {}).get("gemv_kernels") if row["engine"] == "mlcpipe" else None
        if not kernels:
            continue
        out += ["", f"#### mlcpipe {row['dtype']} (decode phase, per-kernel mode)", "",
                "| kernel | role | weight | calls | avg µs | MB / call | GB/s | % of bound | % of decode kernel time |",
                "|---|---|---|---|---|---|---|---|---|"]
        total_bytes = total_ms = 0.0
        for k in kernels:
            gbps = k.get("gbps")
            pct = 100.0 * gbps / bound if gbps and bound else None
            shape = "x".join(str(d) for d in k["weight_shape"]) if k.get("weight_shape") else "–"
            out.append(f"| `{k['kernel']}` | {k['role']} | {shape} | {k['calls']} | {k['avg_ms'] * 1e3:.0f} "
                       f"| {_fmt(k['bytes'] / 1e6 if k.get('bytes') else None, '.2f')} | {_fmt(gbps, '.1f')} | {_fmt(pct, '.0f')}% "
                       f"| {k['pct_decode']:.1f}% |")
            if k.get("bytes"):
                total_bytes += k["bytes"] * k["calls"]
                total_ms += k["total_ms"]
        if total_ms:
            gbps = total_bytes / (total_ms / 1e3) / 1e9
            out.append(f"| all GEMVs | | | | | | **{gbps:.1f}** | **{_fmt(100 * gbps / bound if bound else None, '.0f')}%** "
                       f"| {sum(k['pct_decode'] for k in kernels):.1f}% |")
    return out


def checklist(run: dict) -> list[str]:
    bound = bound_of(run)
    out = []

    def line(ok: bool | None, text: str):
        out.append(f"- [{'x' if ok else ' '}] {'met' if ok else ('not measured' if ok is None else 'MISSED')}: {text}")

    q4 = find(run, "mlcpipe", "q4f16_1")
    q0 = find(run, "mlcpipe", "q0f16")
    # llama.cpp's best 4-bit type of the run (Q4_0 with its repacked kernels, or Q4_K_M)
    ll_q4s = [r for r in (find(run, "llama.cpp", "Q4_0"), find(run, "llama.cpp", "Q4_K_M")) if r and _p50(r)]
    ll_q4 = min(ll_q4s, key=_p50) if ll_q4s else None
    pt_int4, pt_bf16, pt_fp32 = find(run, "pytorch", "int4"), find(run, "pytorch", "bf16"), find(run, "pytorch", "fp32")
    if q4:
        pct = pct_of_bound(q4, bound)
        line(None if pct is None else pct >= TARGET_BOUND_PCT,
             f"mlcpipe q4f16_1 decode ≥ {TARGET_BOUND_PCT:.0f}% of the bandwidth bound: {_fmt(pct, '.0f')}% "
             f"({q4['weight_bytes_per_token'] / 1e6:.0f} MB / {_p50(q4):.1f} ms = "
             f"{q4['weight_bytes_per_token'] / _p50(q4) / 1e6:.1f} GB/s vs {_fmt(bound, '.1f')} GB/s)")
    else:
        line(None, f"mlcpipe q4f16_1 decode ≥ {TARGET_BOUND_PCT:.0f}% of the bandwidth bound (no q4f16_1 row)")
    for peer, label in ((ll_q4, f"llama.cpp's best 4-bit ({ll_q4['dtype'] if ll_q4 else 'Q4_0 / Q4_K_M'})"), (pt_int4, "PyTorch int4 (`_weight_int4pack_mm_for_cpu`)")):
        if q4 and peer:
            line(_p50(q4) < _p50(peer), f"mlcpipe q4f16_1 decode faster than {label}: {_p50(q4):.1f} vs {_p50(peer):.1f} ms/token")
        else:
            line(None, f"mlcpipe q4f16_1 decode faster than {label} (row missing)")
    if q0 and pt_bf16:
        line(_p50(q0) <= _p50(pt_bf16), f"mlcpipe q0f16 decode ≥ PyTorch bf16: {_p50(q0):.1f} vs {_p50(pt_bf16):.1f} ms/token")
    else:
        line(None, "mlcpipe q0f16 decode ≥ PyTorch bf16 (row missing)")
    for row in run["rows"]:  # f32-activation models against PyTorch fp32, the others against bf16 (issue 16)
        peer, name = (pt_fp32, "fp32") if row["dtype"].endswith(("f32", "f32_1")) else (pt_bf16, "bf16")
        if row["engine"] == "mlcpipe" and row.get("prefill_s") and peer and peer.get("prefill_s"):
            ours, theirs = row["prefill_tokens"] / row["prefill_s"], peer["prefill_tokens"] / peer["prefill_s"]
            line(ours >= theirs, f"mlcpipe {row['dtype']} prefill ≥ PyTorch {name} (same threads): {ours:.1f} vs {theirs:.1f} tok/s")
    for row in run["rows"]:
        build_s = row.get("extra", {}).get("build_s") if row["engine"] == "mlcpipe" else None
        if build_s is not None:
            cached = " (cached build from the same sources; time of that build)" if row["extra"].get("build_reused") else ""
            line(build_s <= TARGET_BUILD_S, f"build of the full model, {row['dtype']} llvm ≤ {TARGET_BUILD_S:.0f} s: {build_s:.1f} s{cached}")
    if not any(r["engine"] == "mlcpipe" for r in run["rows"]):
        line(None, "build ≤ 60 s (no mlcpipe rows)")
    return out


def render(run: dict) -> str:
    m, s = run["meta"], run["settings"]
    versions = ", ".join(f"{k} {v}" for k, v in m["versions"].items())
    lines = [
        f"# LLM CPU benchmark: {m['model_display']} on llvm, {s['threads']} threads",
        "",
        "```",
        m["command"],
        "```",
        "",
        f"- date: {m['date']}; commit: {m.get('commit', '?')}",
        f"- CPU: {m['cpu']} ({m['cores']} cores visible); llvm target CPU {m.get('cpu_llvm', 'not recorded')}; threads for every engine: {s['threads']}",
        f"- load average (1/5/15 min) at start {'/'.join(f'{x:.2f}' for x in m['load_start'])}, "
        f"at end {'/'.join(f'{x:.2f}' for x in m['load_end'])}" + (" — the machine was shared: numbers are noisy" if max(m['load_start'][0], m['load_end'][0]) > s['threads'] * 0.75 else ""),
        f"- versions: {versions}",
        f"- shapes: {s['model']} ({m['params'] / 1e9:.2f} B params), same seeded synthetic weights (seed {s['seed']}) in every engine; "
        f"prefill = {s['prefill']} tokens on a fresh sequence (median of {s['prefill_runs']} after a warm-up); "
        f"decode = {s['decode_steps']} greedy steps after a prompt of {s['context']} tokens, p50; each engine in its own process, one at a time"
        + (f"; {m['rounds']} rounds of the engine list, every other one reversed: per engine the median prefill and the p50 of all rounds' decode steps"
           if m.get("rounds", 1) > 1 else ""),
        "- % of bandwidth bound = weight bytes read per decode token / decode p50 / bound (KV cache reads not counted)",
        "- every engine gets the same prompt ids; with random weights the logits are nearly flat, so greedy tokens agree only "
        "between near-exact engines (that the PyTorch peer is the same model is checked on logits in tests/test_benchmarks.py)",
        "",
        "## Side by side",
        "",
        *main_table(run),
        "",
        "## Bandwidth bound (STREAM-like read, same run)",
        "",
        *bandwidth_lines(run),
        "",
        "## mlcpipe decode GEMVs (fused dequantize + matmul): GB/s against the bound",
        "",
        "Bytes per call = every tensor argument (weights, scales, activations, output); times from "
        "`pipeline.profiler.measure.profile()` (per-kernel mode, one generation at ctx ~"
        f"{s['context']}).",
        *kernel_tables(run),
        "",
        "## Targets (issue 5)",
        "",
        *checklist(run),
        "",
    ]
    return "\n".join(lines)

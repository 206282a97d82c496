"""Reports of a real profile (llama-tiny q4f16_1 on llvm, built and profiled here): every format is
parsed back and its arithmetic checked against the profile's samples; md / text layouts are checked
against the seed (shared/seeds/003_cc11731e73870592.txt, copied below)."""

from __future__ import annotations

import copy
import csv
import io
import json
import math
import re
from html.parser import HTMLParser

import pytest

from mlcpipe.profiler.reports import FORMATS, ROLES, matmul_shape, parse_table, percentile, render
from mlcpipe.profiler.schema import device_kernel_name, kernel_stats, measured_samples
from mlcpipe.roles import ROLE_OF_NAME, ROLE_OF_PARAM, WEIGHT_ROLES
from mlcpipe.quantization import quantization

from tests.helpers.profile_checks import (
    COLUMNS,
    cell_number,
    check_json_round_trips,
    check_kernel_statistics_arithmetic,
    check_run_summary,
    sample_groups,
)

PROMPT_LEN, GEN_LEN, RUNS = 16, 8, 2
PER_LAYER_ROLES = (*(r for r in WEIGHT_ROLES if r != "lm_head"), "attention", "rope", "swiglu", "kv append")
ONCE_PER_PASS_ROLES = ("lm_head", "embedding")

STATS_LINE = re.compile(
    r"^(?P<indent> {2,4})(?P<label>.+?): count=(?P<count>\d+) \| total=(?P<total>\d+\.\d{2})ms \| avg=(?P<avg>\d+\.\d{3})ms"
    r" \| min=(?P<min>\d+\.\d{3})ms \| max=(?P<max>\d+\.\d{3})ms \| p95_ms=(?P<p95>\d+\.\d{3})ms, p99_ms=(?P<p99>\d+\.\d{3})ms$"
)
NO_SAMPLES_LINE = re.compile(r"^(?P<indent> {2,4})(?P<label>.+?): no samples$")


# ---- the profile -------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def built(tmp_path_factory):
    from mlcpipe.build import build
    from mlcpipe.config import load_model_config
    from mlcpipe.runtime import Engine
    from mlcpipe.targets import load_target

    tmp = tmp_path_factory.mktemp("reports")
    config = load_model_config("llama-tiny")
    art = build(config, quantization("q4f16_1"), load_target("llvm"), output=tmp / "art", log=lambda *_: None)
    from mlcpipe.profiler.core import Workload
    from mlcpipe.profiler.measure import profile

    prof = profile(Engine(art, "synthetic"), Workload(prompt_len=PROMPT_LEN, gen_len=GEN_LEN, runs=RUNS))
    return config, prof


@pytest.fixture(scope="module")
def prof(built):
    return built[1]


@pytest.fixture(scope="module")
def prof_shapes(built):
    """measure.py records each kernel's argument shapes per phase (`arg_shapes`): matmul shape
    grouping and GFLOP/s use them."""
    assert any(info.get("arg_shapes") for info in built[1]["kernels"].values())
    return built[1]


@pytest.fixture(scope="module")
def prof_no_shapes(built):
    """The same profile without argument shapes (reports must fall back to kernel names)."""
    data = copy.deepcopy(built[1])
    for info in data["kernels"].values():
        info.pop("arg_shapes", None)
    return data


def _passes(phase: str) -> int:
    return RUNS if phase == "prefill" else RUNS * (GEN_LEN - 1)


# ---- md / text -------------------------------------------------------------------------------
@pytest.mark.parametrize("fmt", ["md", "text"])
def test_kernel_statistics_arithmetic(prof, fmt):
    check_kernel_statistics_arithmetic(prof, fmt)


def test_md_and_text_agree(prof):
    md, text = render(prof, "md"), render(prof, "text")
    for heading in ("Top 10", "Kernel Execution Statistics", "Roles and bandwidth", "Time by role", "Run summary"):
        a, b = parse_table(md, heading), parse_table(text, heading)
        assert [list(r.values()) for r in a] == [list(r.values()) for r in b], heading


@pytest.mark.parametrize("fmt", ["md", "text"])
def test_kernel_statistics_widths(prof, fmt):
    """The seed's column widths: name = longest name + 2, fixed widths for the rest."""
    lines = render(prof, fmt).split("\n")
    names = [device_kernel_name(prof, s["kernel"]) for s in kernel_stats(prof)]
    w = max(map(len, names)) + 2
    top_w = max(map(len, names[:10])) + 2
    if fmt == "md":
        assert f"| {'Kernel Name'.ljust(w)} | Total Time (ms) | Iterations | Avg Time (ms) | Peak Time (ms) | % of Total | Cumulative % |" in lines
        assert "|" + "|".join("-" * (x + 2) for x in (w, 14, 10, 12, 13, 10, 12)) + "|" in lines
        assert f"| {'Kernel Name'.ljust(top_w)} | Peak Time (ms) |" in lines
        assert f"|{'-' * (top_w + 2)}|{'-' * 15}|" in lines
    else:
        header = " | ".join(["Kernel Name".ljust(w), "Total_Time_ms".ljust(15), "Iterations", "Avg_Time_ms".ljust(15),
                             "Peak_Time_ms".ljust(15), "% of Total".ljust(12), "Cumulative %"])
        i = lines.index(header)
        assert lines[i + 1] == "-" * len(header)
        assert all(len(line) == len(header) for line in lines[i + 2:i + 2 + len(names)])
        top = f"{'Kernel Name'.ljust(top_w)} | {'Peak_Time_ms'.ljust(15)}"
        assert lines[lines.index(top) + 1] == "-" * len(top)


def test_iterations_of_per_layer_kernels(prof, built):
    """Per-layer kernels run num_layers times per forward pass (prefill: runs; decode: runs x
    (gen_len - 1)); rms_norm twice per layer plus the final norm; lm_head / embedding once."""
    layers = built[0].num_hidden_layers
    assert prof["num_layers"] == layers
    rows = parse_table(render(prof, "md"), "Roles and bandwidth")
    seen = set()
    for row in rows:
        phase, role, calls = row["Phase"], row["Role"], int(row["Iterations"])
        if role in PER_LAYER_ROLES:
            assert calls == layers * _passes(phase), row
        elif role == "norm":
            assert calls == (2 * layers + 1) * _passes(phase), row
        elif role in ONCE_PER_PASS_ROLES:
            assert calls == _passes(phase), row
        seen.add((phase, role))
    for phase in ("prefill", "decode"):
        assert {(phase, r) for r in (*PER_LAYER_ROLES, "norm", *ONCE_PER_PASS_ROLES)} <= seen
    # the rms_norm and fused_dequantize (matmul) kernels, by name, in the statistics table
    stats = {r["Kernel Name"]: int(r["Iterations"]) for r in parse_table(render(prof, "md"), "Kernel Execution Statistics")}
    per_phase = {(r["Phase"], r["Kernel Name"]): int(r["Iterations"]) for r in rows}
    for name, calls in stats.items():
        assert calls == sum(v for (_, k), v in per_phase.items() if k == name)
    assert stats["rms_norm1"] == (2 * layers + 1) * RUNS and stats["rms_norm"] == (2 * layers + 1) * RUNS * (GEN_LEN - 1)
    fused = [k for k in stats if k.startswith("fused_dequantize") and prof["kernels"][k]["role"] in PER_LAYER_ROLES]
    assert len(fused) == 8  # qkv, o_proj, gate_up, down; prefill and decode variants
    assert all(stats[k] in (layers * RUNS, layers * RUNS * (GEN_LEN - 1)) for k in fused)


def test_roles_and_bandwidth(prof_no_shapes):
    prof = prof_no_shapes
    peak = 40.0
    text = render(prof, "md", peak_gbps=peak)
    rows = parse_table(text, "Roles and bandwidth")
    assert len(rows) == sum(len(kernel_stats(prof, p)) for p in ("prefill", "decode"))
    for row in rows:
        kernel, phase = row["Kernel Name"], row["Phase"]
        times = sample_groups(prof, phase)[kernel]
        avg = sum(times) / len(times)
        assert row["Role"] == prof["kernels"][kernel]["role"]
        nbytes = prof["kernels"][kernel]["bytes"][phase]
        assert int(row["Bytes/Call"]) == nbytes
        gbps = nbytes / (avg / 1e3) / 1e9
        assert row["GB/s"] == f"{gbps:.2f}"
        assert row["% of Peak"] == f"{100 * gbps / peak:.2f}%"
        assert row["GFLOP/s"] == "-" and row["Shape (M N K)"] == "-"  # no shapes recorded by measure.py
    # by role: per phase, sums to the phase's kernel time
    roles = parse_table(text, "Time by role")
    for phase in ("prefill", "decode"):
        mine = [r for r in roles if r["Phase"] == phase]
        grand = sum(sum(v) for v in sample_groups(prof, phase).values())
        assert abs(sum(cell_number(r["Total Time (ms)"]) for r in mine) - grand) <= 0.005 * len(mine) + 1e-9
        assert abs(sum(cell_number(r["% of Phase"]) for r in mine) - 100) <= 0.005 * len(mine) + 1e-9
        assert sum(int(r["Calls"]) for r in mine) == len(measured_samples(prof, phase))


def _near_pct_of_peak(row: dict, peak: float) -> bool:
    """% of Peak = GB/s / peak, within the rounding of both printed numbers."""
    return abs(cell_number(row["% of Peak"]) - 100 * cell_number(row["GB/s"]) / peak) <= 100 * 0.005 / peak + 0.005 + 1e-9


def test_peak_bandwidth_default_and_missing(prof):
    from mlcpipe.targets import load_target

    preset = load_target("llvm").peak_gbps
    rows = parse_table(render(prof, "md"), "Roles and bandwidth")  # profile has no peak_gbps: preset
    assert rows and all(_near_pct_of_peak(r, preset) for r in rows)
    summary = {r["Metric"]: r["Value"] for r in parse_table(render(prof, "md"), "Run summary")}
    assert summary["Peak bandwidth (for % of peak)"] == f"{preset:.1f} GB/s"
    unknown = {**prof, "target_name": "no-such-preset"}
    rows = parse_table(render(unknown, "text"), "Roles and bandwidth")
    assert rows and all(r["% of Peak"] == "-" for r in rows)
    assert all(r["pct_of_peak"] == "" for r in csv.DictReader(io.StringIO(render(unknown, "csv"))))
    with_peak = {**unknown, "peak_gbps": 10.0}
    rows = parse_table(render(with_peak, "md"), "Roles and bandwidth")
    assert rows and all(_near_pct_of_peak(r, 10.0) for r in rows)


@pytest.mark.parametrize("value", ["0", "-5", "nan", "inf", "fast"])
def test_peak_bandwidth_flag_is_a_positive_finite_number(value, tmp_path):
    """--peak-gbps 0 fell back to the preset's figure, a negative one printed negative % of peak."""
    from click.testing import CliRunner

    from mlcpipe.cli import main

    saved = tmp_path / "p.json"
    saved.write_text(json.dumps({"schema": "mlcpipe-profile"}))
    for argv in (["profile", "--artifact", str(tmp_path / "none"), "--peak-gbps", value], ["profile", "render", str(saved), "--peak-gbps", value]):
        result = CliRunner().invoke(main, argv)
        assert result.exit_code == 2 and "Invalid value for '--peak-gbps'" in result.output, result.output


def test_profile_needs_one_of_artifact_and_quant(tmp_path):
    from click.testing import CliRunner

    from mlcpipe.cli import main

    both = CliRunner().invoke(main, ["profile", "--artifact", str(tmp_path), "--quant", "q4f16_1"])
    assert both.exit_code == 2 and "--artifact and --quant exclude each other: give --artifact DIR, or --quant" in both.output
    neither = CliRunner().invoke(main, ["profile"])
    assert neither.exit_code == 2 and "Error: give --artifact DIR, or --quant (with --model/--target)" in neither.output


def test_peak_bandwidth_lookup_hides_only_a_preset_that_is_gone(monkeypatch):
    from mlcpipe import targets
    from mlcpipe.profiler.reports import resolve_peak_gbps

    assert resolve_peak_gbps({"target_name": "llvm"}, None) == targets.load_target("llvm").peak_gbps
    assert resolve_peak_gbps({"target_name": "no-such-preset"}, None) is None  # removed since the run

    def broken(path, what="YAML"):
        raise OSError(f"{path}: I/O error")

    with monkeypatch.context() as patch:
        patch.setattr(targets, "load_yaml", broken)  # a real error is not a missing column
        with pytest.raises(OSError, match="I/O error"):
            resolve_peak_gbps({"target_name": "llvm"}, None)
    assert targets.preset_peak_gbps("no-such-preset") is None and targets.preset_peak_gbps("llvm") > 0


def test_run_summary(prof):
    check_run_summary(prof)


# ---- the seed's layout --------------------------------------------------------------------------
def _profile_from_seed(seed: str, fmt: str) -> dict:
    """A profile whose statistics reproduce the seed table's numbers (up to their rounding)."""
    col = COLUMNS[fmt]
    head = seed.split("\n")[0][len("## Profiling Analysis: "):]
    model_quant, _, device = head.partition(" on ")
    display_name, _, quant = model_quant.rpartition(" ")
    samples = []
    for row in parse_table(seed, "Kernel Execution Statistics"):
        total, n, peak = cell_number(row[col["total"]]), int(row["Iterations"]), cell_number(row[col["peak"]])
        rest = (total - peak) / (n - 1) if n > 1 else 0.0
        times = [peak] + [rest] * (n - 1) if rest <= peak else [total / n] * n
        samples += [{"kernel": row["Kernel Name"], "parent": "vm", "phase": "decode", "step": 1, "run": 1,
                     "warmup": False, "start_ms": 0.0, "ms": t} for t in times]
    return {"schema": "mlcpipe-profile", "version": 1, "model": "seed", "display_name": display_name, "quantization": quant,
            "target": {"kind": "llvm"}, "target_name": "llvm", "device": device, "config": {}, "metrics": {},
            "kernels": {}, "steps": [], "samples": samples, "peak_gbps": 1.0}


def _same_layout(mine: str, seed: str) -> bool:
    """Equal, or the same cells at the same widths with numbers within the seed's rounding (the
    seed's percentages come from unrounded totals we do not have); the seed's irregularly trimmed
    last rows compare without their trailing spaces."""
    if mine == seed or mine.rstrip() == seed.rstrip():
        return True
    a, b = mine.split("|"), seed.split("|")
    if len(a) != len(b) or [len(x) for x in a[:-1]] != [len(x) for x in b[:-1]]:
        return False
    for x, y in zip(a, b):
        x, y = x.strip(), y.strip()
        if x != y and not (re.fullmatch(r"[\d.]+%?", x) and re.fullmatch(r"[\d.]+%?", y) and abs(cell_number(x) - cell_number(y)) <= 0.0101):
            return False
    return True


@pytest.mark.parametrize(("seed", "fmt"), [("SEED_Q0F16_MD", "md"), ("SEED_Q4F16_1_TEXT", "text")])
def test_layout_reproduces_seed(seed, fmt):
    expected = globals()[seed].replace("$\n", "\n").removesuffix("\n")
    text = render(_profile_from_seed(expected, fmt), fmt)
    mine = text.split("\n")[: len(expected.split("\n"))]
    assert mine[-1] == "</small>"
    for got, want in zip(mine, expected.split("\n")):
        assert _same_layout(got, want), f"\n got: {got!r}\nseed: {want!r}"


# ---- events ------------------------------------------------------------------------------------
def _event_sections(text: str) -> dict[str, list[str]]:
    sections, title = {}, None
    for line in text.split("\n"):
        if line and not line.startswith(" ") and line.endswith(":"):
            title = line[:-1]
            sections[title] = []
        elif line.startswith(" ") and title:
            sections[title].append(line)
        elif not line:
            title = None
    return sections


def test_events_summary(prof_no_shapes):
    prof = prof_no_shapes
    text = render(prof, "events")
    lines = text.split("\n")
    assert lines[0] == "" and lines[1] == "=== Analyzing llama-tiny-q4f16_1-llvm profile ===" and lines[3] == ""
    assert lines[2] == f"Total events: {len(prof['samples']) + len(prof['steps'])}"
    sections = _event_sections(text)
    samples = measured_samples(prof)
    grand = sum(s["ms"] for s in samples)
    for title, body in sections.items():
        for line in body:
            assert STATS_LINE.match(line) or NO_SAMPLES_LINE.match(line) or re.fullmatch(r"  op=NT_matmul \| .+:", line), line
    types = {STATS_LINE.match(x)["label"]: STATS_LINE.match(x) for x in sections["Event type summary"]}
    assert types[f"KernelCall (count={len(prof['samples'])})"]["count"] == str(len(samples))
    for title in ("Kernel calls by phase", "Kernel calls by parent", "Kernel calls by parent/op", "Kernel calls by phase/op",
                  "Kernel aggregate (all parents)", "Kernel aggregate (by kernel type)", "Kernel aggregate (by phase/kernel type)"):
        matches = [STATS_LINE.match(x) for x in sections[title] if STATS_LINE.match(x)]
        assert sum(int(m["count"]) for m in matches) == len(samples), title
        assert abs(sum(float(m["total"]) for m in matches) - grand) <= 0.005 * len(matches) + 1e-9, title
        totals = [float(m["total"]) for m in matches]
        assert totals == sorted(totals, reverse=True), title
    # each line's statistics, recomputed from the samples
    by_op = {f"{s['parent']} :: {s['kernel']}" for s in samples}
    for line in sections["Kernel calls by parent/op"]:
        m = STATS_LINE.match(line)
        assert m["label"] in by_op
        parent, _, kernel = m["label"].partition(" :: ")
        times = [s["ms"] for s in samples if s["kernel"] == kernel and s["parent"] == parent]
        assert int(m["count"]) == len(times)
        assert m["total"] == f"{sum(times):.2f}" and m["avg"] == f"{sum(times) / len(times):.3f}"
        assert m["min"] == f"{min(times):.3f}" and m["max"] == f"{max(times):.3f}"
        assert m["p95"] == f"{percentile(times, 95):.3f}" and m["p99"] == f"{percentile(times, 99):.3f}"
    assert {m.split(":")[0].strip() for m in sections["Kernel calls by parent"]} == {"vm", "kv_cache"}
    # matmul kernels, grouped by name (this profile has no shapes) and phase
    shape_title = next(t for t in sections if t.startswith("Matmul shape summary"))
    assert "shapes not recorded" in shape_title
    matmul = [STATS_LINE.match(x) for x in sections[shape_title] if STATS_LINE.match(x)]
    assert all(m["indent"] == "    " for m in matmul)
    assert sum(int(m["count"]) for m in matmul) == sum(1 for s in samples if "matmul" in s["kernel"])
    steps = [STATS_LINE.match(x) for x in sections["Forward steps (per-kernel mode)"]]
    assert sum(int(m["count"]) for m in steps) == RUNS * GEN_LEN


def test_events_no_samples_rows(prof):
    """Roles and kernels with no measured calls get `no samples` rows."""
    assert set(ROLES) >= {*WEIGHT_ROLES, "attention", "kv append", "norm", "rope", "swiglu", "embedding", "other"}
    gone = {k for k, v in prof["kernels"].items() if v["role"] == "embedding"}
    pruned = {**prof, "samples": [s for s in prof["samples"] if s["kernel"] not in gone]}
    sections = _event_sections(render(pruned, "events"))
    assert "  embedding: no samples" in sections["Kernel aggregate (by kernel type)"]
    assert {"  prefill :: embedding: no samples", "  decode :: embedding: no samples"} <= set(sections["Kernel aggregate (by phase/kernel type)"])
    assert {f"  {device_kernel_name(prof, k)}: no samples" for k in gone} <= set(sections["Kernel aggregate (all parents)"])
    counts = [int(STATS_LINE.match(x)["count"]) for x in sections["Kernel aggregate (by kernel type)"] if STATS_LINE.match(x)]
    assert sum(counts) == len(measured_samples(pruned))


def test_kernel_roles_vocabulary_is_complete():
    known = {role for _, role in ROLE_OF_PARAM} | {role for _, role in ROLE_OF_NAME} | {"other", "lm_head", "embedding"}
    assert known <= set(ROLES)


# ---- matmul shapes (argument shapes recorded) ----------------------------------------------------
def test_matmul_shapes_and_gflops(prof_shapes, built):
    config = built[0]
    h, inter, hd = config.hidden_size, config.intermediate_size, config.head_dim
    qkv = (config.num_attention_heads + 2 * config.num_key_value_heads) * hd
    expected_nk = {"qkv": (qkv, h), "o_proj": (h, config.num_attention_heads * hd), "gate_up": (2 * inter, h),
                   "down": (h, inter), "lm_head": (config.vocab_size, h)}
    for kernel, info in prof_shapes["kernels"].items():
        if "matmul" not in kernel:
            continue
        for phase in info["bytes"]:
            m, n, k = matmul_shape(prof_shapes, kernel, phase)
            assert (n, k) == expected_nk[info["role"]], kernel
            assert m == (PROMPT_LEN if phase == "prefill" and info["role"] != "lm_head" else 1), kernel
    rows = [r for r in csv.DictReader(io.StringIO(render(prof_shapes, "csv"))) if "matmul" in r["kernel"]]
    assert rows
    for r in rows:
        flops = 2 * int(r["m"]) * int(r["n"]) * int(r["k"])
        assert math.isclose(float(r["gflop_s"]), flops / (float(r["avg_ms"]) / 1e3) / 1e9)
    md = parse_table(render(prof_shapes, "md"), "Roles and bandwidth")
    for r in md:
        if "matmul" in r["Kernel Name"]:
            times = sample_groups(prof_shapes, r["Phase"])[r["Kernel Name"]]
            m, n, k = map(int, r["Shape (M N K)"].split())
            assert r["GFLOP/s"] == f"{2 * m * n * k / (sum(times) / len(times) / 1e3) / 1e9:.2f}"
        else:
            assert r["GFLOP/s"] == "-"
    sections = _event_sections(render(prof_shapes, "events"))
    body = sections["Matmul shape summary"]
    labels = [x.strip()[:-1] for x in body if x.startswith("  op=")]
    assert f"op=NT_matmul | M={PROMPT_LEN} N={2 * inter} K={h}" in labels
    assert f"op=NT_matmul | M=1 N={config.vocab_size} K={h}" in labels
    matches = [STATS_LINE.match(x) for x in body if STATS_LINE.match(x)]
    assert sum(int(m["count"]) for m in matches) == sum(1 for s in measured_samples(prof_shapes) if "matmul" in s["kernel"])


# ---- phase ----------------------------------------------------------------------------------------
PHASE_ROW = re.compile(r"^(?P<name>\S.*?) +(?P<ms>\d+\.\d\d) +(?P<pct>\d+\.\d)$")


def test_phase_report(prof):
    text = render(prof, "phase")
    lines = text.split("\n")
    rule = "─" * 50
    blocks = [i for i, x in enumerate(lines) if x == "[Profile] GPU Profile Report"]
    assert len(blocks) == 2
    assert lines[blocks[0] - 1] == "[Profile] Prefill (prefill):"
    assert lines[blocks[1] - 1] == f"[Profile] Decode (N={GEN_LEN - 1}):"
    for phase, start in zip(("prefill", "decode"), blocks):
        assert lines[start + 1] == rule and lines[start + 3] == rule
        assert lines[start + 2] == "Kernel                      Time (ms)       %"
        end = lines.index(rule, start + 4)
        rows = [PHASE_ROW.match(x) for x in lines[start + 4:end]]
        total = PHASE_ROW.match(lines[end + 1])
        assert all(rows) and total["name"] == "TOTAL" and total["pct"] == "100.0"
        assert all(len(x) == 45 for x in lines[start + 4:end + 2] if len(x.split()[0]) <= 25)
        # TOTAL = sum of the rows (within rounding) = the phase's kernel time per pass
        assert abs(sum(float(r["ms"]) for r in rows) - float(total["ms"])) <= 0.005 * len(rows) + 1e-9
        grand = sum(s["ms"] for s in measured_samples(prof, phase)) / RUNS
        assert total["ms"] == f"{grand:.2f}"
        assert abs(sum(float(r["pct"]) for r in rows) - 100.0) <= 0.05 * len(rows) + 1e-9
        expected = [(device_kernel_name(prof, s["kernel"]), f"{s['total_ms'] / RUNS:.2f}") for s in kernel_stats(prof, phase)]
        assert [(r["name"], r["ms"]) for r in rows] == expected
    m = prof["metrics"]
    perf = next(x for x in lines if x.startswith("[Perf] "))
    match = re.fullmatch(r"\[Perf\] TTFT: (\d+)ms \| Prefill: (\d+)ms \| Decode: (\d+)ms \((\d+) tokens @ (\d+\.\d) tok/s\)", perf)
    assert match and match[1] == f"{m['ttft_ms']:.0f}" and int(match[4]) == GEN_LEN - 1
    decode_runs = {}
    for s in prof["steps"]:
        if s["mode"] == "low-overhead" and not s["warmup"] and s["phase"] == "decode":
            decode_runs[s["run"]] = decode_runs.get(s["run"], 0.0) + s["ms"]
    decode = percentile(list(decode_runs.values()), 50)
    assert match[5] == f"{(GEN_LEN - 1) / (decode / 1e3):.1f}"
    metrics = [x for x in lines if x.startswith("[metrics] ")]
    assert metrics[0] == f"[metrics] load={m['load_ms']:.1f}ms prefillTokens={PROMPT_LEN} decodeTokens={GEN_LEN} maxTokens={GEN_LEN}"
    assert metrics[1] == (f"[metrics] ttft={m['ttft_ms']:.1f}ms prefill={m['prefill_ms']:.1f}ms decode={decode:.1f}ms "
                          f"total={m['ttft_ms'] + decode:.1f}ms")
    assert metrics[2] == (f"[metrics] tok/s total={GEN_LEN / ((m['ttft_ms'] + decode) / 1e3):.2f} "
                          f"prefill={m['prefill_tok_s']:.2f} decode={m['decode_tok_s']:.2f}")
    assert any(x.startswith("[Loader] Memory (complete): | Host peak=") for x in lines)


# ---- csv -------------------------------------------------------------------------------------------
def test_csv(prof):
    rows = list(csv.DictReader(io.StringIO(render(prof, "csv"))))
    assert len(rows) == sum(len(kernel_stats(prof, p)) for p in ("prefill", "decode"))
    for phase in ("prefill", "decode"):
        mine = [r for r in rows if r["phase"] == phase]
        groups = sample_groups(prof, phase)
        assert [r["kernel"] for r in mine] == sorted(groups, key=lambda k: (-sum(groups[k]), k))
        for r in mine:
            times = groups[r["kernel"]]
            assert math.isclose(float(r["total_ms"]), sum(times))
            assert int(r["iterations"]) == len(times)
            assert math.isclose(float(r["avg_ms"]), float(r["total_ms"]) / int(r["iterations"]))
            assert float(r["peak_ms"]) == max(times) and float(r["min_ms"]) == min(times)
            assert r["role"] == prof["kernels"][r["kernel"]]["role"]
            assert int(r["bytes_per_call"]) == prof["kernels"][r["kernel"]]["bytes"][phase]
        assert math.isclose(sum(float(r["pct"]) for r in mine), 100.0)
        assert math.isclose(float(mine[-1]["cum_pct"]), 100.0)
        running = 0.0
        for r in mine:
            running += float(r["pct"])
            assert math.isclose(float(r["cum_pct"]), running)
    assert sum(int(r["iterations"]) for r in rows) == len(measured_samples(prof))


# ---- trace -------------------------------------------------------------------------------------------
def test_trace(prof):
    trace = json.loads(render(prof, "trace"))
    events = trace["traceEvents"]
    complete = [e for e in events if e["ph"] == "X"]
    kernels = [e for e in complete if e["cat"] != "step"]
    steps = [e for e in complete if e["cat"] == "step"]
    assert len(kernels) == len(prof["samples"]) and len(steps) == len(prof["steps"])
    assert all(e["ts"] >= 0 and e["dur"] >= 0 for e in complete)
    assert all({"name", "ph", "pid", "tid", "ts", "dur"} <= set(e) for e in complete)
    for e, s in zip(kernels, prof["samples"]):
        assert e["name"] == device_kernel_name(prof, s["kernel"]) and math.isclose(e["dur"], s["ms"] * 1e3)
    lanes = {(e["pid"], e["tid"]): e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "thread_name"}
    assert {lanes[(e["pid"], e["tid"])] for e in kernels} == {"vm", "kv_cache"}
    assert {lanes[(e["pid"], e["tid"])] for e in steps} == {"steps"}
    # kernel calls keep their spacing; every per-kernel step starts no later than its first call
    first = min(s["start_ms"] for s in prof["samples"])
    for e, s in zip(kernels, prof["samples"]):
        assert math.isclose(e["ts"], (s["start_ms"] - first) * 1e3 + kernels[0]["ts"] - (prof["samples"][0]["start_ms"] - first) * 1e3,
                            abs_tol=1e-3)
    for st in (e for e in steps if e["args"]["mode"] == "per-kernel"):
        a = st["args"]
        calls = [e for e in kernels if (e["args"]["run"], e["args"]["phase"], e["args"]["step"]) == (a["run"], a["phase"], a["step"])]
        assert calls and st["ts"] <= min(e["ts"] for e in calls) + 1e-6


# ---- html / json ----------------------------------------------------------------------------------------
class _Tags(HTMLParser):
    def __init__(self):
        super().__init__()
        self.tags: list[str] = []
        self.attrs: list[tuple[str, str | None]] = []

    def handle_starttag(self, tag, attrs):
        self.tags.append(tag)
        self.attrs += attrs


def test_html(prof):
    page = render(prof, "html")
    parser = _Tags()
    parser.feed(page)
    assert page.startswith("<!DOCTYPE html>") and "svg" in parser.tags and "rect" in parser.tags
    assert "<svg" in page
    top = kernel_stats(prof)[0]["kernel"]
    assert device_kernel_name(prof, top) in page
    assert "script" not in parser.tags and "link" not in parser.tags and "img" not in parser.tags
    assert not [v for k, v in parser.attrs if k in ("src", "href")] and "url(" not in page and "@import" not in page
    assert f"{prof['metrics']['ttft_ms']:.3f} ms" in page and f"{prof['metrics']['decode_tok_s']:.1f} tok/s" in page
    for phase in ("prefill", "decode"):
        assert f"<h3>{phase}</h3>" in page


def test_json_round_trips(prof):
    check_json_round_trips(prof)


def test_every_format_renders_and_unknown_is_refused(prof):
    for fmt in FORMATS:
        assert render(prof, fmt).endswith("\n")
    with pytest.raises(ValueError, match="unknown"):
        render(prof, "pdf")


# ---- the seed's tables (shared/seeds/003_cc11731e73870592.txt), each line ended by '$' ----------------------
SEED_Q0F16_MD = """\
## Profiling Analysis: Llama 3.2 1B q0f16 on Apple M2$
$
<small>$
$
### Top 10 Most Time-Consuming Kernels$
$
| Kernel Name                      | Peak Time (ms) |$
|----------------------------------|---------------|$
| NT_matmul7_kernel_2              | 29.62         |$
| NT_matmul8_kernel_2              | 13.75         |$
| NT_matmul5_kernel_2              | 11.79         |$
| NT_matmul6_kernel_2              | 8.12          |$
| NT_matmul12_kernel               | 1.12          |$
| NT_matmul14_kernel               | 8.41          |$
| batch_prefill_ragged_kv_kernel   | 6.40          |$
| NT_matmul13_kernel               | 0.60          |$
| batch_prefill_paged_kv_kernel    | 1.61          |$
| NT_matmul10_kernel               | 0.25          |$
$
---$
$
### Kernel Execution Statistics (Sorted by Total Time)$
$
| Kernel Name                            | Total Time (ms) | Iterations | Avg Time (ms) | Peak Time (ms) | % of Total | Cumulative % |$
|----------------------------------------|----------------|------------|--------------|---------------|------------|--------------|$
| NT_matmul7_kernel_2                    | 975.35         | 63         | 15.48        | 29.62         | 41.59%     | 41.59%       |$
| NT_matmul8_kernel_2                    | 542.74         | 64         | 8.48         | 13.75         | 23.15%     | 64.74%       |$
| NT_matmul5_kernel_2                    | 198.00         | 64         | 3.09         | 11.79         | 8.44%      | 73.18%       |$
| NT_matmul6_kernel_2                    | 144.76         | 62         | 2.33         | 8.12          | 6.17%      | 79.36%       |$
| NT_matmul12_kernel                     | 133.16         | 126        | 1.06         | 1.12          | 5.68%      | 85.03%       |$
| NT_matmul14_kernel                     | 80.82          | 11         | 7.35         | 8.41          | 3.45%      | 88.48%       |$
| batch_prefill_ragged_kv_kernel         | 79.11          | 63         | 1.26         | 6.40          | 3.37%      | 91.86%       |$
| NT_matmul13_kernel                     | 67.06          | 125        | 0.54         | 0.60          | 2.86%      | 94.71%       |$
| batch_prefill_paged_kv_kernel          | 31.23          | 30         | 1.04         | 1.61          | 1.33%      | 96.05%       |$
| NT_matmul10_kernel                     | 26.83          | 125        | 0.21         | 0.25          | 1.14%      | 97.19%       |$
| batch_decode_paged_kv_kernel           | 24.40          | 126        | 0.19         | 0.21          | 1.04%      | 98.23%       |$
| NT_matmul11_kernel                     | 19.27          | 126        | 0.15         | 0.19          | 0.82%      | 99.05%       |$
| fuse_add_norm_prefill_kernel           | 9.48           | 375        | 0.03         | 0.08          | 0.40%      | 99.46%       |$
| fused_split1_silu1_multiply1_kernel    | 5.11           | 63         | 0.08         | 0.14          | 0.22%      | 99.67%       |$
| fused_rope_kernel                      | 3.91           | 191        | 0.02         | 0.16          | 0.17%      | 99.84%       |$
| tir_kv_cache_transpose_append_kernel   | 1.72           | 189        | 0.01         | 0.02          | 0.07%      | 99.92%       |$
| fused_split2_silu2_multiply2_kernel    | 1.03           | 125        | 0.01         | 0.01          | 0.04%      | 99.96%       |$
| merge_state_inplace_kernel             | 0.32           | 32         | 0.01         | 0.02          | 0.01%      | 99.97%       |$
| rms_norm1_kernel                       | 0.25           | 4          | 0.06         | 0.09          | 0.01%      | 99.98%       |$
| rms_norm2_kernel                       | 0.21           | 8          | 0.03         | 0.03          | 0.01%      | 99.99%       |$
| take1_kernel                           | 0.17           | 12         | 0.01         | 0.04          | 0.01%      | 100.00%      |$
| index_kernel                           | 0.02           | 4          | 0.00         | 0.00          | 0.00%      | 100.00%      |$
$
</small>$
"""

SEED_Q4F16_1_TEXT = """\
## Profiling Analysis: Llama 3.2 1B q4f16_1 on Apple M2$
$
<small>$
$
### Top 10 Most Time-Consuming Kernels$
$
Kernel Name                             | Peak_Time_ms   $
---------------------------------------------------------$
fused_dequantize3_NT_matmul7_kernel_2   | 40.57          $
fused_dequantize4_NT_matmul8_kernel_2   | 10.85          $
fused_dequantize1_NT_matmul5_kernel_2   | 12.42          $
fused_dequantize2_NT_matmul6_kernel_2   | 8.41           $
fused_dequantize3_NT_matmul12_kernel    | 0.78           $
batch_prefill_ragged_kv_kernel          | 5.91           $
fused_dequantize_NT_matmul14_kernel     | 6.46           $
fused_dequantize4_NT_matmul13_kernel    | 0.62           $
batch_prefill_paged_kv_kernel           | 1.61           $
batch_decode_paged_kv_kernel            | 0.20  $
$
---$
$
### Kernel Execution Statistics (Sorted by Total Time)$
$
Kernel Name                             | Total_Time_ms   | Iterations | Avg_Time_ms     | Peak_Time_ms    | % of Total   | Cumulative %$
----------------------------------------------------------------------------------------------------------------------------------------$
fused_dequantize3_NT_matmul7_kernel_2   | 1030.28         | 64         | 16.10           | 40.57           | 45.64%       | 45.64%      $
fused_dequantize4_NT_matmul8_kernel_2   | 518.01          | 62         | 8.36            | 10.85           | 22.95%       | 68.58%      $
fused_dequantize1_NT_matmul5_kernel_2   | 209.64          | 63         | 3.33            | 12.42           | 9.29%        | 77.87%      $
fused_dequantize2_NT_matmul6_kernel_2   | 139.54          | 61         | 2.29            | 8.41            | 6.18%        | 84.05%      $
fused_dequantize3_NT_matmul12_kernel    | 83.42           | 125        | 0.67            | 0.78            | 3.70%        | 87.74%      $
batch_prefill_ragged_kv_kernel          | 80.05           | 64         | 1.25            | 5.91            | 3.55%        | 91.29%      $
fused_dequantize_NT_matmul14_kernel     | 58.71           | 11         | 5.34            | 6.46            | 2.60%        | 93.89%      $
fused_dequantize4_NT_matmul13_kernel    | 36.86           | 121        | 0.30            | 0.62            | 1.63%        | 95.52%      $
batch_prefill_paged_kv_kernel           | 30.56           | 31         | 0.99            | 1.61            | 1.35%        | 96.87%      $
batch_decode_paged_kv_kernel            | 20.95           | 126        | 0.17            | 0.20            | 0.93%        | 97.80%      $
fused_dequantize1_NT_matmul10_kernel    | 16.86           | 126        | 0.13            | 0.16            | 0.75%        | 98.55%      $
fused_dequantize2_NT_matmul11_kernel    | 11.54           | 123        | 0.09            | 0.12            | 0.51%        | 99.06%      $
fuse_add_norm_prefill_kernel            | 8.74            | 373        | 0.02            | 0.08            | 0.39%        | 99.45%      $
fused_split1_silu1_multiply1_kernel     | 5.29            | 62         | 0.09            | 0.16            | 0.23%        | 99.68%      $
fused_rope_kernel                       | 3.60            | 185        | 0.02            | 0.16            | 0.16%        | 99.84%      $
tir_kv_cache_transpose_append_kernel    | 1.70            | 186        | 0.01            | 0.04            | 0.08%        | 99.92%      $
fused_split2_silu2_multiply2_kernel     | 0.92            | 125        | 0.01            | 0.01            | 0.04%        | 99.96%      $
merge_state_inplace_kernel              | 0.30            | 31         | 0.01            | 0.01            | 0.01%        | 99.97%      $
rms_norm1_kernel                        | 0.23            | 4          | 0.06            | 0.08            | 0.01%        | 99.98%      $
rms_norm2_kernel                        | 0.22            | 8          | 0.03            | 0.03            | 0.01%        | 99.99%      $
fused_dequantize_take1_kernel           | 0.20            | 12         | 0.02            | 0.05            | 0.01%        | 100.00%     $
index_kernel                            | 0.02            | 4          | 0.00            | 0.01            | 0.00%        | 100.00%$
$
</small>$
"""


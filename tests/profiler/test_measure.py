"""Profiler measurement on a real run of the tiny model: every kernel call timed (VM-launched and
inside the KV cache), iteration counts match the model, warm-up kept apart."""

from __future__ import annotations

import json
import statistics
import time
from collections import Counter

import numpy as np
import pytest

from mlcpipe.build import build
from mlcpipe.profiler.core import Workload
from mlcpipe.profiler.measure import profile, run_once
from mlcpipe.profiler.schema import kernel_stats
from mlcpipe.runtime import Engine
from mlcpipe.targets import load_target
from mlcpipe.quantization import quantization

from tests.helpers.cli import mlcpipe

PROMPT, GEN, RUNS = 16, 8, 2


@pytest.fixture(scope="module")
def tiny_profile(tiny_config, tmp_path_factory):
    art = build(tiny_config, quantization("q4f16_1"), load_target("llvm"), output=tmp_path_factory.mktemp("prof") / "art", log=lambda *_: None)
    return profile(Engine(art, "synthetic"), Workload(prompt_len=PROMPT, gen_len=GEN, runs=RUNS, warmup=1))


def test_iterations_match_the_model(tiny_profile, tiny_config):
    layers = tiny_config.num_hidden_layers
    counts = Counter((s["kernel"], s["phase"]) for s in tiny_profile["samples"] if not s["warmup"])
    prefill_passes, decode_passes = RUNS, RUNS * (GEN - 1)
    per_layer = {
        "prefill": ["fused_dequantize_NT_matmul4_cast3", "fused_split1_silu1_multiply1", "fused_rope", "tir_kv_cache_transpose_append", "batch_prefill_ragged_kv"],
        "decode": ["fused_dequantize_NT_matmul_cast", "fused_dequantize3_NT_matmul3_cast1_add", "fused_rope", "tir_kv_cache_transpose_append", "batch_decode_paged_kv_cpu"],
    }
    for phase, passes in (("prefill", prefill_passes), ("decode", decode_passes)):
        for kernel in per_layer[phase]:
            assert counts[(kernel, phase)] == layers * passes, (kernel, phase, counts[(kernel, phase)])
    # two norms per layer plus the final one; one embedding lookup and one lm_head per pass
    assert counts[("rms_norm", "decode")] == (2 * layers + 1) * decode_passes
    assert counts[("take_dequantize", "decode")] == decode_passes
    assert counts[("fused_dequantize2_NT_matmul2", "prefill")] == prefill_passes


def test_kv_cache_kernels_are_timed_and_warmup_kept_apart(tiny_profile):
    parents = {s["kernel"]: s["parent"] for s in tiny_profile["samples"]}
    assert parents["batch_decode_paged_kv_cpu"] == "kv_cache" and parents["fused_rope"] == "kv_cache"
    assert parents["fused_dequantize_NT_matmul_cast"] == "vm"
    warm = [s for s in tiny_profile["samples"] if s["warmup"]]
    assert warm and all(s["run"] == 0 for s in warm)
    stats = {r["kernel"]: r for r in kernel_stats(tiny_profile)}
    measured = [s["ms"] for s in tiny_profile["samples"] if s["kernel"] == "rms_norm" and not s["warmup"]]
    assert stats["rms_norm"]["iterations"] == len(measured)
    assert stats["rms_norm"]["peak_ms"] == max(measured)


def test_metrics_are_consistent(tiny_profile):
    m = tiny_profile["metrics"]
    assert m["decode_tok_s"] == pytest.approx(1000.0 / m["decode_ms_per_token"]["p50"])
    assert m["prefill_tok_s"] == pytest.approx(PROMPT / (m["prefill_ms"] / 1000.0))
    assert m["decode_ms_per_token"]["p50"] <= m["decode_ms_per_token"]["p95"] <= m["decode_ms_per_token"]["p99"]
    assert m["weight_bytes"] > 0 and m["peak_host_memory_bytes"] > m["weight_bytes"]
    assert "percent" in m["overhead"] and m["overhead"]["low_overhead_total_ms"] > 0
    # bytes moved by the decode qkv GEMV: q_weight + q_scale + x + out
    qkv = tiny_profile["kernels"]["fused_dequantize_NT_matmul_cast"]["bytes"]["decode"]
    assert qkv == 256 * 16 * 4 + 256 * 4 * 2 + 128 * 2 + 256 * 2
    # an embedding lookup reads its tokens' rows, not the table: one token id + one f16 row
    assert tiny_profile["kernels"]["take_dequantize"]["bytes"]["decode"] == 4 + 128 * 2
    json.dumps(tiny_profile)  # JSON-ready


class _SlowToStart:
    """An engine whose new sequence takes 30 ms and prefill 10 ms."""

    def reset(self):
        time.sleep(0.03)

    def prefill(self, prompt):
        time.sleep(0.01)
        return np.arange(8.0)

    def decode(self, token):
        return np.arange(8.0)


def test_ttft_counts_from_the_request_to_the_first_token():
    steps: list[dict] = []
    assert run_once(_SlowToStart(), [1, 2, 3], 2, None, None, 0, steps) == [7, 7]
    prefill = steps[0]
    assert prefill["phase"] == "prefill" and 10e6 <= prefill["ns"] < 40e6  # without the 30 ms reset
    assert prefill["first_token_ns"] >= 40e6  # the new sequence, then the prefill, then the token


def test_ttft_is_not_the_prefill_time(tiny_profile):
    m = tiny_profile["metrics"]
    low = [s for s in tiny_profile["steps"] if s["mode"] == "low-overhead" and s["phase"] == "prefill" and not s["warmup"]]
    assert len(low) == RUNS and all(s["first_token_ms"] > s["ms"] for s in low)
    assert m["ttft_ms"] == pytest.approx(statistics.median(s["first_token_ms"] for s in low))
    assert m["ttft_ms"] > m["prefill_ms"]


def test_cli_profile_builds_once_then_reuses(tmp_path, monkeypatch):
    env_root = tmp_path / "artifacts"
    monkeypatch.setenv("MLCPIPE_ARTIFACTS", str(env_root))
    args = ("profile", "--model", "llama-tiny", "--quant", "q4f32_1", "--prompt-len", "8", "--gen-len", "4", "--runs", "1", "--format", "json")
    first = mlcpipe(*args, "-o", str(tmp_path / "a.json"))
    assert first.returncode == 0, first.stderr
    (built,) = (env_root / "cache").glob("*/artifact/manifest.json")  # the content-keyed cache
    second = mlcpipe(*args, "-o", str(tmp_path / "b.json"))
    assert second.returncode == 0 and "reusing" in second.stderr
    data = json.loads((tmp_path / "b.json").read_text())
    assert data["schema"] == "mlcpipe-profile" and data["quantization"] == "q4f32_1"
    rendered = mlcpipe("profile", "render", str(tmp_path / "b.json"), "--format", "text")
    assert rendered.returncode == 0, rendered.stderr
    assert rendered.stdout.startswith("## Profiling Analysis: Llama Tiny q4f32_1 on ")
    assert "Total_Time_ms" in rendered.stdout
    bad = mlcpipe("profile", "render", str(built))
    assert bad.returncode == 2 and "not an mlcpipe profile" in bad.stderr

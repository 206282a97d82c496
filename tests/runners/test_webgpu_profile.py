"""Profiles of webgpu artifacts from their real run in Dawn (pipeline/runners/webgpu/profile.py): every
kernel timed by timestamp queries on SwiftShader, in the llvm profile's schema; and the kernel
name map the RPC profiler uses between an llvm build and a GPU build."""

from __future__ import annotations

import dataclasses
import json
from collections import Counter

import numpy as np
import pytest

from mlcpipe.artifact import read_manifest
from mlcpipe.build import build
from mlcpipe.profiler.core import Workload
from mlcpipe.profiler.kernel_map import KernelMapError, map_kernels
from mlcpipe.profiler.reports import FORMATS, render
from mlcpipe.runners.webgpu.profile import profile
from mlcpipe.runners.webgpu.dawn import WebGPUEngine
from mlcpipe.runtime import Engine
from mlcpipe.targets import load_target
from mlcpipe.quantization import quantization

from tests.helpers.cli import mlcpipe
from tests.helpers.profile_checks import check_json_round_trips, check_kernel_statistics_arithmetic, check_run_summary

PROMPT, GEN, RUNS, CHUNK = 20, 5, 2, 16


@pytest.fixture(scope="module")
def f32_artifacts(tiny_config, tmp_path_factory):
    """The tiny model at q4f32_1 (SwiftShader has no shader-f16) with a prefill chunk of 16."""
    root = tmp_path_factory.mktemp("webgpu-profile")
    config = dataclasses.replace(tiny_config, prefill_chunk_size=CHUNK)
    quiet = lambda *_: None  # noqa: E731
    return (build(config, quantization("q4f32_1"), load_target("webgpu"), output=root / "webgpu", log=quiet),
            build(config, quantization("q4f32_1"), load_target("llvm"), output=root / "llvm", log=quiet))  # fmt: skip


@pytest.fixture(scope="module")
def measured(f32_artifacts):
    with WebGPUEngine(f32_artifacts[0], "synthetic", adapter="swiftshader") as engine:
        return profile(engine, Workload(prompt_len=PROMPT, gen_len=GEN, runs=RUNS, warmup=1))


@pytest.mark.dawn
def test_every_kernel_call_of_the_real_run_is_timed(measured, f32_artifacts, tiny_config):
    layers = tiny_config.num_hidden_layers
    counts = Counter((s["kernel"], s["phase"]) for s in measured["samples"] if not s["warmup"])
    chunks = -(-PROMPT // CHUNK)
    passes = {"prefill": RUNS * chunks, "decode": RUNS * (GEN - 1)}
    for phase, attention in (("prefill", "batch_prefill_ragged_kv"), ("decode", "batch_decode_paged_kv")):
        for kernel in ("fused_rope", "tir_kv_cache_transpose_append", attention):
            assert counts[(kernel, phase)] == layers * passes[phase], (kernel, phase, counts[(kernel, phase)])
        assert counts[("take_dequantize", phase)] == passes[phase]
    # the second prefill chunk attends to the first one's pages and merges the two states
    assert counts[("batch_prefill_paged_kv", "prefill")] == layers * RUNS * (chunks - 1)
    assert counts[("tir_attention_merge_state", "prefill")] == layers * RUNS * (chunks - 1)
    assert {s["kernel"] for s in measured["samples"]} <= {k["name"] for k in read_manifest(f32_artifacts[0])["kernels"]}
    # SwiftShader's timestamps tick every 65.536 us: a tiny kernel (index, a few us) may read 0 on
    # every call; the kernels that do the work add up to real time
    assert all(s["ms"] >= 0 for s in measured["samples"]) and all(s["ms"] > 0 for s in measured["steps"])
    totals = Counter()
    for s in measured["samples"]:
        totals[s["kernel"]] += s["ms"]
    heavy = [k for k in totals if "NT_matmul" in k or k.startswith("batch_")]
    assert len(heavy) >= 4 and all(totals[k] > 0 for k in heavy), totals
    assert sum(totals.values()) > 0.5 * sum(s["ms"] for s in measured["steps"] if s["mode"] == "per-kernel"), totals
    assert measured["method"]["kind"] == "real run" and measured["method"]["timer"] == "timestamp-query"
    assert "SwiftShader" in measured["device"]
    steps = Counter((s["mode"], s["phase"]) for s in measured["steps"] if not s["warmup"])
    assert steps == {("low-overhead", "prefill"): RUNS, ("per-kernel", "prefill"): RUNS,
                     ("low-overhead", "decode"): RUNS * (GEN - 1), ("per-kernel", "decode"): RUNS * (GEN - 1)}  # fmt: skip
    # time to first token: from the request (a new sequence) through both prefill chunks to the token
    low = [s for s in measured["steps"] if s["mode"] == "low-overhead" and s["phase"] == "prefill" and not s["warmup"]]
    assert all(s["first_token_ms"] > s["ms"] for s in low)
    assert measured["metrics"]["ttft_ms"] == pytest.approx(float(np.median([s["first_token_ms"] for s in low])))


@pytest.mark.dawn
def test_profiled_run_generates_the_llvm_tokens(measured, f32_artifacts):
    """The profile's run is the real computation: its greedy tokens are the llvm build's."""
    prompt = [int(t) for t in np.random.default_rng(0).integers(0, 512, size=PROMPT)]  # profile()'s prompt for seed 0
    assert measured["generated_tokens"] == Engine(f32_artifacts[1], "synthetic").generate(prompt, GEN)


@pytest.mark.dawn
def test_reports_render_and_add_up(measured):
    check_kernel_statistics_arithmetic(measured, "md")
    check_run_summary(measured)
    check_json_round_trips(measured)
    for fmt in FORMATS:
        assert render(measured, fmt).endswith("\n")
    phase = render(measured, "phase")
    assert "[Profile] Prefill (prefill):" in phase and "GPU Profile Report" in phase


@pytest.mark.dawn
def test_cli_profile_webgpu_and_its_errors(f32_artifacts, tmp_path):
    webgpu, _ = f32_artifacts
    out = tmp_path / "p.json"
    proc = mlcpipe("profile", "--artifact", str(webgpu), "--adapter", "swiftshader", "--prompt-len", "8", "--gen-len", "3",
                   "--runs", "1", "--format", "json", "-o", str(out))
    assert proc.returncode == 0, proc.stderr[-2000:]
    data = json.loads(out.read_text())
    assert data["method"]["kind"] == "real run" and data["config"]["prompt_len"] == 8 and data["samples"]
    proc = mlcpipe("profile", "--artifact", str(webgpu), "--adapter", "gles", "--runs", "1")
    assert proc.returncode == 2 and proc.stderr.strip().splitlines()[-1].startswith("error: --adapter gles: the adapter has no timestamp-query")
    proc = mlcpipe("profile", "--artifact", str(webgpu), "--rpc", "127.0.0.1:9")
    assert proc.returncode == 2 and "error:" in proc.stderr.strip().splitlines()[-1]


@pytest.fixture(scope="module")
def artifacts(tiny_config, tmp_path_factory):
    root = tmp_path_factory.mktemp("kernel-map")
    quiet = lambda *_: None  # noqa: E731
    return (build(tiny_config, quantization("q4f16_1"), load_target("webgpu"), output=root / "webgpu", log=quiet),
            build(tiny_config, quantization("q4f16_1"), load_target("llvm"), output=root / "llvm", log=quiet))  # fmt: skip


def test_unmappable_kernel_is_a_one_line_error(artifacts):
    webgpu, llvm = artifacts
    src, dst = read_manifest(llvm), read_manifest(webgpu)
    dst["kernels"] = [k for k in dst["kernels"] if k["name"] != "batch_decode_paged_kv"]
    with pytest.raises(KernelMapError) as info:
        map_kernels(["batch_decode_paged_kv_cpu"], src, dst)
    assert "batch_decode_paged_kv_cpu" in str(info.value) and "\n" not in str(info.value)
    # a renumbered kernel is found by role and signature
    renamed = read_manifest(webgpu)
    for k in renamed["kernels"]:
        if k["name"] == "fused_dequantize2_NT_matmul6_cast5":
            k["name"] = "fused_dequantize9_NT_matmul9_cast9"
    assert map_kernels(["fused_dequantize2_NT_matmul6_cast5"], src, renamed) == {"fused_dequantize2_NT_matmul6_cast5": "fused_dequantize9_NT_matmul9_cast9"}



"""WebGPU profiling by kernel replay (pipeline/profiler/replay.py) on the tiny model: the llvm
call sequence replayed on lavapipe through wgpu, in the llvm profile's schema.

Skipped only where wgpu or a WebGPU adapter (Mesa lavapipe) is missing."""

from __future__ import annotations

import json
import shutil
from collections import Counter

import numpy as np
import pytest

from pipeline.artifact import read_manifest
from pipeline.build import build
from pipeline.profiler.kernel_map import KernelMapError, map_kernels
from pipeline.profiler.measure import record_calls
from pipeline.profiler.replay import prepare_replay, profile_replay
from pipeline.profiler.reports import FORMATS, render
from pipeline.targets import load_target

from . import test_profiler_reports as report_checks
from .test_errors import mlcpipe

PROMPT, GEN, RUNS = 16, 8, 2


def _lavapipe_missing() -> str | None:
    try:
        from pipeline.runners import webgpu as runner

        runner.get_device()
    except RuntimeError as exc:  # no wgpu package, or no adapter (mesa-vulkan-drivers missing)
        return str(exc)
    return None


pytestmark = pytest.mark.skipif(_lavapipe_missing() is not None, reason=f"WebGPU replay needs wgpu + lavapipe: {_lavapipe_missing()}")


@pytest.fixture(scope="module")
def artifacts(tiny_config, tmp_path_factory):
    root = tmp_path_factory.mktemp("replay")
    quiet = lambda *_: None  # noqa: E731
    return (build(tiny_config, "q4f16_1", load_target("webgpu"), output=root / "webgpu", log=quiet),
            build(tiny_config, "q4f16_1", load_target("llvm"), output=root / "llvm", log=quiet))  # fmt: skip


@pytest.fixture(scope="module")
def replayed(artifacts):
    webgpu, llvm = artifacts
    return profile_replay(webgpu, llvm, prompt_len=PROMPT, gen_len=GEN, runs=RUNS, warmup=1)


def test_iterations_match_the_model(replayed, tiny_config):
    layers = tiny_config.num_hidden_layers
    counts = Counter((s["kernel"], s["phase"]) for s in replayed["samples"] if not s["warmup"])
    passes = {"prefill": RUNS, "decode": RUNS * (GEN - 1)}
    per_layer = {
        "prefill": ["fused_dequantize_NT_matmul4_cast3", "fused_split1_silu1_multiply1", "fused_rope", "tir_kv_cache_transpose_append", "batch_prefill_ragged_kv"],
        "decode": ["fused_dequantize_NT_matmul_cast", "fused_dequantize3_NT_matmul3_cast1_add", "fused_rope", "tir_kv_cache_transpose_append", "batch_decode_paged_kv"],
    }
    for phase, kernels in per_layer.items():
        for kernel in kernels:
            assert counts[(kernel, phase)] == layers * passes[phase], (kernel, phase, counts[(kernel, phase)])
    assert counts[("rms_norm", "decode")] == (2 * layers + 1) * passes["decode"]
    assert counts[("take_dequantize", "decode")] == passes["decode"]
    assert counts[("fused_dequantize2_NT_matmul2", "prefill")] == passes["prefill"]
    steps = Counter((s["mode"], s["phase"]) for s in replayed["steps"] if not s["warmup"])
    assert steps == {("low-overhead", "prefill"): RUNS, ("per-kernel", "prefill"): RUNS,
                     ("low-overhead", "decode"): passes["decode"], ("per-kernel", "decode"): passes["decode"]}  # fmt: skip


def test_every_call_ran_on_lavapipe_under_webgpu_names(replayed, artifacts):
    from pipeline.runners import webgpu as runner

    webgpu_kernels = {k["name"] for k in read_manifest(artifacts[0])["kernels"]}
    assert {s["kernel"] for s in replayed["samples"]} <= webgpu_kernels
    assert not any(s["kernel"].endswith("_cpu") for s in replayed["samples"])
    assert all(s["ms"] > 0 for s in replayed["samples"]) and all(s["ms"] > 0 for s in replayed["steps"])
    assert replayed["target"]["kind"] == "webgpu" and "via wgpu" in replayed["device"] and "kernel replay" in replayed["device"]
    assert replayed["method"]["kind"] == "kernel replay" and replayed["method"]["timer"] == runner.timer_kind()
    assert replayed["method"]["kernel_map"]["batch_decode_paged_kv_cpu"] == "batch_decode_paged_kv"
    per_run = Counter(s["run"] for s in replayed["samples"])
    assert len(set(per_run.values())) == 1 and sorted(per_run) == list(range(RUNS + 1))
    assert all(s["warmup"] == (s["run"] == 0) for s in replayed["samples"])
    # the metrics come from the low-overhead steps, which are sums of replayed kernel time
    m = replayed["metrics"]
    low = [s["ms"] for s in replayed["steps"] if s["mode"] == "low-overhead" and not s["warmup"] and s["phase"] == "prefill"]
    assert m["prefill_ms"] == pytest.approx(float(np.median(low)))
    assert m["decode_tok_s"] == pytest.approx(1000.0 / m["decode_ms_per_token"]["p50"])
    kernel_sum = sum(s["ms"] for s in replayed["samples"] if not s["warmup"])
    assert m["overhead"]["per_kernel_total_ms"] == pytest.approx(kernel_sum)


def test_reports_render_and_add_up(replayed):
    report_checks.test_kernel_statistics_arithmetic(replayed, "md")
    report_checks.test_run_summary(replayed)
    report_checks.test_json_round_trips(replayed)
    for fmt in FORMATS:
        assert render(replayed, fmt).endswith("\n")
    assert render(replayed, "md").splitlines()[0].startswith("## Profiling Analysis: Llama Tiny q4f16_1 on lavapipe")


def test_replayed_gemv_uses_the_recorded_data_and_matches_llvm(artifacts, monkeypatch):
    """The replay feeds the kernels what llvm saw: real weights and activations; the decode qkv
    GEMV replayed on lavapipe gives the llvm kernel's output for them."""
    import tvm

    from pipeline.conformance import _compare, run_on_llvm
    from pipeline.runners import webgpu as runner
    from pipeline.runtime import Engine

    webgpu, llvm = artifacts
    engine = Engine(llvm, "synthetic")
    calls = record_calls(engine, 4, 2)
    index = next(i for i, c in enumerate(calls) if c.kernel == "fused_dequantize_NT_matmul_cast" and c.phase == "decode")
    call = calls[index]
    mapping = map_kernels([call.kernel], read_manifest(llvm), read_manifest(webgpu))
    [prepared] = prepare_replay(webgpu, [call], [mapping[call.kernel]])
    names = [p["name"] for p in engine.manifest["parameters"]]
    q_weight = engine.params[names.index("model.layers.0.self_attn.qkv_proj.q_weight")].numpy()
    inputs = [a.data for a in call.args]
    np.testing.assert_array_equal(inputs[0], q_weight)  # the first layer's real weight
    assert np.abs(inputs[2].astype(np.float32)).max() > 0  # a real activation
    start, ns = runner.time_calls([prepared])
    assert ns > 0
    monkeypatch.setattr(runner, "USE_TIMESTAMP_QUERY", False)  # the synchronised wall-time fallback
    assert runner.timer_kind() == "wall" and runner.time_calls([prepared])[1] > 0
    got = prepared.read()
    np.testing.assert_array_equal(got[0], q_weight)
    scheduled = tvm.ir.load_json((llvm / "tir" / "scheduled.json").read_text())
    want = run_on_llvm(scheduled[call.kernel], [a.copy() for a in inputs])
    err_abs, err_rel, ok = _compare(got[-1:], want[-1:])
    assert ok, (err_abs, err_rel)


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


def test_cli_profile_webgpu_artifact_replays(artifacts, tmp_path, monkeypatch):
    webgpu, llvm = artifacts
    env_root = tmp_path / "artifacts"
    shutil.copytree(llvm, env_root / "llama-tiny-q4f16_1-llvm")  # the llvm counterpart, reused
    monkeypatch.setenv("MLCPIPE_ARTIFACTS", str(env_root))
    out = tmp_path / "p.json"
    proc = mlcpipe("profile", "--artifact", str(webgpu), "--prompt-len", "8", "--gen-len", "3", "--runs", "1", "--format", "json", "-o", str(out))
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "reusing" in proc.stderr
    data = json.loads(out.read_text())
    assert data["method"]["kind"] == "kernel replay" and data["config"]["prompt_len"] == 8
    assert data["samples"] and {s["kernel"] for s in data["samples"]} <= {k["name"] for k in read_manifest(webgpu)["kernels"]}

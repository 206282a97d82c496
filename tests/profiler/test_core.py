"""pipeline/profiler/core.py: the modes alternate run by run, the metrics come from the
low-overhead steps, the document has every field the schema asks."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from mlcpipe.profiler.core import Workload, alternate, document, kernel_table, metrics, weight_bytes


def test_modes_alternate_run_by_run_with_progress():
    calls, ticks = [], []
    alternate(1, 2, [("low-overhead", lambda run: calls.append(("low", run))), ("per-kernel", lambda run: calls.append(("pk", run)))],
              lambda label, done, total: ticks.append((label, done, total)))
    assert calls == [("low", 0), ("pk", 0), ("low", 1), ("pk", 1), ("low", 2), ("pk", 2)]
    assert ticks[0] == ("low-overhead", 1, 6) and ticks[-1] == ("per-kernel", 6, 6)


def test_one_workload_for_every_driver():
    """The prompt (seeded, checked against the engine's context), the document's config and the
    parameters' bytes are the same whichever device profiles."""
    checked = []
    engine = SimpleNamespace(vocab_size=50, check_tokens=lambda tokens, new: checked.append((len(tokens), new)))
    work = Workload(prompt_len=7, gen_len=3, runs=2, warmup=0, seed=4)
    prompt = work.prompt(engine)
    assert prompt == [int(t) for t in np.random.default_rng(4).integers(0, 50, size=7)] and checked == [(7, 3)]
    assert work.prompt(engine) == prompt and Workload(7, 3, seed=5).prompt(engine) != prompt
    assert work.config(2, adapter="gles") == {"prompt_len": 7, "gen_len": 3, "runs": 2, "warmup_runs": 0, "seed": 4, "threads": 2,
                                              "adapter": "gles"}
    manifest = {"parameters": [{"shape": [4, 8], "dtype": "uint32"}, {"shape": [4, 1], "dtype": "float16"}, {"shape": [3], "dtype": "float32"}]}
    assert weight_bytes(manifest) == 4 * 8 * 4 + 4 * 2 + 3 * 4


def _steps(prefill_ns, decode_ns, warmup_prefill_ns):
    steps = [{"run": 0, "phase": "prefill", "step": 0, "ns": warmup_prefill_ns, "first_token_ns": warmup_prefill_ns + 10}]
    for run, (p, ds) in enumerate(zip(prefill_ns, decode_ns), start=1):
        steps.append({"run": run, "phase": "prefill", "step": 0, "ns": p, "first_token_ns": p + 1_000_000})
        steps += [{"run": run, "phase": "decode", "step": i + 1, "ns": d} for i, d in enumerate(ds)]
    return steps


def test_metrics_leave_the_warmup_out():
    engine = SimpleNamespace(load_seconds=0.5)
    low = _steps([4_000_000, 6_000_000], [[1_000_000, 3_000_000], [2_000_000, 2_000_000]], 50_000_000)
    m = metrics(engine, 64, low, per_kernel_total_ms=30.0, warmup=1, weight_bytes=123)
    assert m["load_ms"] == 500.0 and m["prefill_ms"] == 5.0 and m["prefill_tok_s"] == pytest.approx(64 / 0.005)
    assert m["decode_ms_per_token"]["p50"] == 2.0 and m["decode_tok_s"] == 500.0
    assert m["ttft_ms"] == pytest.approx(6.0) and m["warmup_prefill_ms"] == [50.0] and m["weight_bytes"] == 123
    assert m["overhead"]["per_kernel_total_ms"] == 30.0 and m["overhead"]["low_overhead_total_ms"] == pytest.approx(18.0)


def test_document_and_kernel_table():
    manifest = {"model": "m", "quantization": "q4f32_1", "target": {"kind": "llvm"}, "target_name": "llvm", "kernels": []}
    engine = SimpleNamespace(manifest=manifest, config={"model_config": {"num_hidden_layers": 3}})
    kernels = kernel_table({"a", "b"}, {"a": "qkv"}, {("a", "decode"): 10}, {("a", "decode"): [[1, 2]]})
    assert kernels == {"a": {"role": "qkv", "bytes": {"decode": 10}, "arg_shapes": {"decode": [[1, 2]]}},
                       "b": {"role": "other", "bytes": {}, "arg_shapes": {}}}
    doc = document(engine, "cpu", {"runs": 1}, {"x": 1}, [1, 2], kernels, {"steps": [], "samples": []}, {"remote": "r"},
                   method={"kind": "rpc"})
    assert doc["device"] == "cpu" and doc["method"] == {"kind": "rpc"} and doc["num_layers"] == 3
    assert doc["environment"]["remote"] == "r" and len(doc["environment"]["load_average"]) == 3
    assert "method" not in document(engine, "cpu", {}, {}, [], {}, {})
    assert np.isfinite(doc["metrics"]["x"])

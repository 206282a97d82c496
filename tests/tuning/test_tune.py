"""`mlcpipe tune` -> tuning database -> `mlcpipe build` applies it; the tuned model still matches
the NumPy reference; bad databases and untimeable targets give one-line errors."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import tvm
from click.testing import CliRunner

from mlcpipe.build import build
from mlcpipe.cli import main
from mlcpipe.quantization import QUANTIZATIONS
from mlcpipe.runtime import Engine
from mlcpipe.targets import load_target
from mlcpipe.tuning.knobs import unscheduled_kernels
from mlcpipe.tuning import TuningDB
from mlcpipe.weights import convert_weights
from mlcpipe.schedules.signature import kernel_signature
from mlcpipe.quantization import quantization

from tests.helpers.checkpoints import hf_config, random_hf_weights, write_hf_checkpoint
from tests.helpers.reference_checks import PROMPT, as_model_sees_it, check_against_reference
from tests.helpers.reference_llama import ReferenceLlama


def test_tune_writes_winners_that_build_applies(tiny_config, tmp_path):
    db_path = tmp_path / "tuning.json"
    result = CliRunner().invoke(
        main, ["tune", "--model", "llama-tiny", "--quant", "q4f16_1", "--db", str(db_path), "--kernels", "NT_matmul", "--budget", "3"]
    )
    assert result.exit_code == 0, result.output
    assert "| Kernel | Rule |" in result.output
    data = json.loads(db_path.read_text())
    assert data["schema"] == "mlcpipe-tuning"
    (target_key, table), = data["records"].items()
    assert json.loads(target_key)["kind"] == "llvm"
    # 5 decode GEMVs and 5 prefill GEMMs (qkv, o_proj, gate_up, down, and batch_verify's lm_head
    # over every draft token); every rule that takes a kernel competes with 3 candidates
    from mlcpipe.schedules import RULES

    tvm_target = load_target("llvm").tvm_target()
    kernels = {n: f for n, f in unscheduled_kernels(tiny_config, quantization("q4f16_1"), tvm_target).items() if "NT_matmul" in n}
    tuned_count = 10
    assert len(table) == tuned_count
    for record in table.values():
        func = kernels[record["kernel"]]
        takers = [type(r).__name__ for r in RULES["llvm"] if hasattr(r, "knob_space") and r.knob_space(func, tvm_target)
                  and r.apply(func, tvm_target, False) is not None]
        assert [c["rule"] for c in record["candidates"]] == [name for name in takers for _ in range(3)]
        assert record["default_rule"] == takers[0]
        timed = [c for c in record["candidates"] if c["ms"] is not None]
        assert record["ms"] == min(c["ms"] for c in timed)  # the fastest verified candidate won (ms as stored: rounded)
        assert {"rule": record["rule"], "knobs": record["knobs"], "ms": record["ms"], "error": None} in timed
        if "seq_len" in func.script():  # prefill: at least the portable PrefillGEMM and one explicit-vector rule race
            assert len(set(takers)) >= 2 and len({c["rule"] for c in timed}) >= 2, takers

    artifact = build(tiny_config, quantization("q4f16_1"), load_target("llvm"), output=tmp_path / "art", tuning_db=db_path, log=lambda *_: None)
    manifest = json.loads((artifact / "manifest.json").read_text())
    assert manifest["tuning_db"]["tuned_kernels"] == tuned_count
    applied = {k["name"]: k["schedule"] for k in manifest["kernels"] if k.get("schedule") and k["schedule"]["source"] == "tuning"}
    by_name = {r["kernel"]: r for r in table.values()}
    assert set(applied) == set(by_name)
    for name, schedule in applied.items():
        assert {k: schedule["knobs"][k] for k in by_name[name]["knobs"]} == by_name[name]["knobs"]


def test_non_default_knobs_from_the_database_keep_the_model_exact(tiny_config, tmp_path):
    """Write a database with non-default knobs for every matmul, build with it, and compare the
    whole model with the NumPy Llama."""
    quant = "q4f16_1"
    target = load_target("llvm")
    tvm_target = target.tvm_target()
    db = TuningDB(tmp_path / "db.json")
    for name, func in unscheduled_kernels(tiny_config, quantization(quant), tvm_target).items():
        if "NT_matmul" not in name:
            continue
        prefill = "seq_len" in func.script()
        rule, knobs = ("PrefillGEMM", {"tile_n": 16, "block_m": 6, "block_n": 2}) if prefill else ("DecodeGEMVQ4", {"lanes": 8, "rows": 2})
        db.put(target.target, kernel_signature(func), {"kernel": name, "rule": rule, "knobs": knobs})
    db.save()
    weights = random_hf_weights(tiny_config, seed=1)
    hf_dir = write_hf_checkpoint(tmp_path / "hf", tiny_config, weights)
    params = convert_weights(tiny_config, quantization(quant), hf_dir, tmp_path / "weights", log=lambda *_: None)
    artifact = build(tiny_config, quantization(quant), target, output=tmp_path / "art", tuning_db=db.path, log=lambda *_: None)
    manifest = json.loads((artifact / "manifest.json").read_text())
    tuned = [k for k in manifest["kernels"] if (k.get("schedule") or {}).get("source") == "tuning"]
    assert len(tuned) == 10 and all(k["schedule"]["knobs"].get("rows") == 2 or k["schedule"]["knobs"].get("tile_n") == 16 for k in tuned)
    engine = Engine(artifact, params)
    ref = ReferenceLlama(hf_config(tiny_config), as_model_sees_it(quant, weights))
    check_against_reference(engine, ref, QUANTIZATIONS[quant].model_dtype, PROMPT, 4)


def test_bad_database_and_untimed_target_are_one_line_errors(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"schema": "something-else"}))
    runner = CliRunner()
    result = runner.invoke(main, ["build", "--model", "llama-tiny", "--quant", "q4f16_1", "--tuning-db", str(bad), "--output", str(tmp_path / "a")])
    assert result.exit_code == 2
    assert "bad.json: not a tuning database (schema field must be 'mlcpipe-tuning')" in result.output
    assert not (tmp_path / "a").exists()
    bad.write_text("{not json")
    result = runner.invoke(main, ["tune", "--model", "llama-tiny", "--quant", "q4f16_1", "--db", str(bad)])
    assert result.exit_code == 2 and "bad JSON at line 1" in result.output
    result = runner.invoke(main, ["tune", "--model", "llama-tiny", "--quant", "q4f16_1", "--target", "webgpu", "--db", str(tmp_path / "x.json")])
    assert result.exit_code == 2
    assert "cannot time webgpu kernels here (allowed: llvm, cuda)" in result.output
    assert not (tmp_path / "x.json").exists()
    # was: timed (and stored) at a token count the engine never runs: it prefills in chunks of at most 128 here
    result = runner.invoke(main, ["tune", "--model", "llama-tiny", "--quant", "q4f16_1", "--tokens", "129", "--db", str(tmp_path / "x.json")])
    assert result.exit_code == 2, result.output
    assert ("Invalid value for --tokens: 129: past the prefill chunk of llama-tiny (prefill_chunk_size 128): its prefill "
            "kernels never see more tokens in one call") in result.output
    assert not (tmp_path / "x.json").exists()


def test_tune_tokens_default_to_the_prefill_chunk_when_it_is_smaller(monkeypatch, tmp_path):
    """Was: 128 for every model, more than qwen2-tiny's chunk of 64 (and now refused as such)."""
    from mlcpipe.interface.tune import tune
    from mlcpipe.tuning import knobs

    seen = []
    monkeypatch.setattr(knobs, "tune", lambda *args, tokens, **kwargs: seen.append(tokens) or [])
    for model in ("qwen2-tiny", "llama-tiny", "llama-3.2-1b"):
        tune(model, "q4f32_1", "llvm", db_path=tmp_path / "db.json")
    assert seen == [64, 128, 128]


def test_candidates_are_compared_at_the_quantization_entrys_tolerance(monkeypatch):
    """One tolerance table (pipeline/quantization/tolerance.py) by the model's dtype, shared with
    `mlcpipe check`: not a guess from the quantization's name."""
    import numpy as np

    from mlcpipe import conformance
    from mlcpipe.quantization import TOLERANCE, GroupQuantize, NoQuantize
    from mlcpipe.tuning.knobs import output_mismatch

    assert conformance.TOLERANCE is TOLERANCE
    assert {q: e.tolerance for q, e in QUANTIZATIONS.items()} == {"q0f16": 2e-2, "q0f32": 1e-4, "q4f16_1": 2e-2, "q4f32_1": 1e-4}
    want = np.linspace(-1, 1, 64, dtype=np.float32)
    g16 = GroupQuantize(name="q4f32_g16", model_dtype="float32", group_size=16)
    assert output_mismatch(want * np.float32(1 + 1e-3), want, g16)  # an f32 model: 1e-3 is too far
    bf16 = NoQuantize(name="q0bf16", model_dtype="bfloat16")
    assert output_mismatch(want * np.float32(1 + 8e-2), want, bf16) is None  # bf16: 5e-2 of the scale + 5e-2 relative
    assert output_mismatch(want * np.float32(1 + 8e-2), want, QUANTIZATIONS["q4f16_1"])  # f16: 2e-2


def test_signature_is_stable_and_shape_sensitive(tiny_config):
    from mlcpipe.config import load_model_config

    target = load_target("llvm").tvm_target()
    tiny = {n: kernel_signature(f) for n, f in unscheduled_kernels(tiny_config, quantization("q4f16_1"), target).items()}
    assert len(set(tiny.values())) == len(tiny)  # distinct kernels, distinct signatures
    again = {n: kernel_signature(f) for n, f in unscheduled_kernels(load_model_config("llama-tiny"), quantization("q4f16_1"), target).items()}
    assert again == tiny  # a rebuild finds its records
    wider = dataclasses.replace(tiny_config, vocab_size=tiny_config.vocab_size * 2)
    other = {n: kernel_signature(f) for n, f in unscheduled_kernels(wider, quantization("q4f16_1"), target).items()}
    lm_head = [n for n, s in tiny.items() if "NT_matmul" in n and s not in other.values()]
    assert lm_head, "a kernel with another shape must get another signature"
    model = [s for n, s in tiny.items() if not n.startswith("sampler_")]  # the sampler's kernels are vocabulary-sized
    # the rest are shared: all but lm_head (decode GEMV, batch_verify GEMM), the embedding lookup
    # and the logits reshape
    assert sum(s in other.values() for s in model) >= len(model) - 4


def test_metaschedule_search_is_checked_timed_and_its_trace_replayed_by_build(tiny_config, tmp_path):
    """MetaSchedule searches one kernel (a few trials); its best schedule is rebuilt from the trace,
    checked against ours and timed. Its trace, stored in a database, is applied by `mlcpipe build`
    (the whole model still matches the NumPy Llama); the same trace filed under another kernel's
    signature does not fit that kernel, which keeps the rules' schedule."""
    from mlcpipe.tuning.metaschedule import tune_metaschedule

    quant = "q4f16_1"
    target = load_target("llvm")
    db = TuningDB(tmp_path / "ms.json")
    (result,) = tune_metaschedule(tiny_config, quantization(quant), target, db, pattern="^rms_norm$", trials=4, log=lambda *_: None)
    assert result.error is None and result.trace and result.search_ms > 0 and result.ours_rule == "RowNorm"
    stored = db.table(target.target)
    assert bool(stored) == result.kept  # kept only when faster than ours
    if result.kept:
        (record,) = stored.values()
        assert record["rule"] == "MetaSchedule" and record["ms"] < record["default_ms"]

    kernels = unscheduled_kernels(tiny_config, quantization(quant), target.tvm_target())
    forced = TuningDB(tmp_path / "forced.json")
    for name in ("rms_norm", "fused_split_silu_multiply"):
        forced.put(target.target, kernel_signature(kernels[name]), {"kernel": "rms_norm", "rule": "MetaSchedule", "knobs": {}, "trace": result.trace})
    forced.save()
    weights = random_hf_weights(tiny_config, seed=2)
    hf_dir = write_hf_checkpoint(tmp_path / "hf", tiny_config, weights)
    params = convert_weights(tiny_config, quantization(quant), hf_dir, tmp_path / "weights", log=lambda *_: None)
    artifact = build(tiny_config, quantization(quant), target, output=tmp_path / "art", tuning_db=forced.path, log=lambda *_: None)
    schedules = {k["name"]: k["schedule"] for k in json.loads((artifact / "manifest.json").read_text())["kernels"]}
    assert schedules["rms_norm"] == {"rule": "MetaSchedule", "knobs": {}, "source": "tuning"}
    assert schedules["fused_split_silu_multiply"]["source"] == "default"  # the trace does not fit it
    engine = Engine(artifact, params)
    ref = ReferenceLlama(hf_config(tiny_config), as_model_sees_it(quant, weights))
    check_against_reference(engine, ref, QUANTIZATIONS[quant].model_dtype, PROMPT, 4)


def test_trace_replay_falls_back_only_when_the_trace_does_not_fit():
    from tvm import te
    from tvm.s_tir import Schedule

    from mlcpipe.schedules.trace_replay import replay, trace_to_json

    def double(block: str, shape: tuple[int, ...]):
        a = te.placeholder(shape, "float32", name="A")
        return te.create_prim_func([a, te.compute(shape, lambda *i: a[i] * 2, name=block)])

    sch = Schedule(double("B", (64, 64)))
    rows, _ = sch.get_loops(sch.get_sblock("B"))
    sch.parallel(sch.split(rows, [None, 8])[0])
    trace = trace_to_json(sch.trace)
    assert replay(double("B", (64, 64)), trace) is not None
    assert replay(double("C", (64, 64)), trace) is None  # no block B
    assert replay(double("B", (64,)), trace) is None  # one loop where the trace had two
    with pytest.raises(ValueError, match="trace"):  # not a trace at all: a broken database is reported
        replay(double("B", (64, 64)), tvm.ir.save_json(tvm.runtime.convert([1, 2])))


def test_metaschedule_tuner_errors_are_one_line(tmp_path):
    runner = CliRunner()
    result = runner.invoke(main, ["tune", "--tuner", "metaschedule", "--model", "llama-tiny", "--quant", "q4f16_1", "--target", "webgpu",
                                  "--db", str(tmp_path / "x.json")])
    assert result.exit_code == 2
    assert "MetaSchedule cannot tune webgpu here (allowed: llvm, cuda)" in result.output
    assert not (tmp_path / "x.json").exists()
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"schema": "mlcpipe-tuning", "version": 1, "records": {"{}": {"sig": {"rule": "MetaSchedule", "knobs": {}}}}}))
    result = runner.invoke(main, ["build", "--model", "llama-tiny", "--quant", "q4f16_1", "--tuning-db", str(bad), "--output", str(tmp_path / "a")])
    assert result.exit_code == 2
    assert "record sig of target {} has rule 'MetaSchedule' but no 'trace'" in result.output
    assert not (tmp_path / "a").exists()


def test_llvm_timings_rotate_inputs_beyond_the_last_level_cache():
    """A GEMV timed on one input set runs from L3 and ranks knobs wrongly (rows=2 won there, rows=1
    wins with weights from memory on Zen 4): the tuner rotates through 2 x LLC of input copies."""
    import numpy as np

    from mlcpipe.device import device
    from mlcpipe.tuning.knobs import time_kernel_ms, timing_copies

    sizes = []
    for index in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*"):
        text = (index / "size").read_text().strip()
        sizes.append(int(text.rstrip("KM")) << {"K": 10, "M": 20}.get(text[-1], 0))
    cold = device("llvm").timing_cold_bytes()
    assert cold == 2 * (max(sizes) if sizes else 32 << 20)
    assert all(device(k).timing_cold_bytes() == 0 for k in ("cuda", "metal", "webgpu"))

    args = [np.zeros(1 << 20, "uint8"), np.zeros(1 << 18, "float32")]  # 2 MiB
    assert timing_copies(args, 0) == 1 and timing_copies(args, 5 << 20) == 3 and timing_copies(args, 1 << 40) == 64
    assert timing_copies([np.zeros(cold, "uint8")], cold) == 1  # already beyond the cache (whatever this CPU's LLC)

    seen: list[int] = []

    class _Lib:  # records which input copy each call got
        def __getitem__(self, name):
            return lambda *tensors: seen.append(tensors[0].data_ptr() if hasattr(tensors[0], "data_ptr") else id(tensors[0]))

    ms = time_kernel_ms(_Lib(), args, tvm.cpu(), repeat=2, cold_bytes=5 << 20)
    assert ms > 0 and len(set(seen)) == 3 and len(seen) >= 3 * 3


def test_candidates_are_timed_in_interleaved_rounds(monkeypatch):
    """A machine whose speed drifts (twice as fast for the first 4 timings): timed one candidate
    after another (5 each), the first would get the fast phase and win; in rounds, the really
    faster one wins, and each candidate's figure is the median of its rounds."""
    import mlcpipe.tuning.knobs as tune_mod

    cost = {"a": 1.0, "b": 0.8}
    calls: list[str] = []

    def fake_time(lib, sets, device, repeat):
        assert repeat == 1
        calls.append(lib)
        return cost[lib] * (0.5 if len(calls) <= 4 else 1.0)

    monkeypatch.setattr(tune_mod, "time_on_inputs", fake_time)
    times = dict(tune_mod.interleaved_times([("A", "a"), ("B", "b")], [], None, 5))
    assert calls == ["a", "b"] * 5
    assert times == {"A": 1.0, "B": 0.8}  # medians of [0.5, 0.5, 1, 1, 1] and [0.4, 0.4, 0.8, 0.8, 0.8]
    assert min(times, key=times.get) == "B"

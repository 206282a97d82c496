"""The benchmark harness (benchmarks/) on the tiny model: the PyTorch peer is the same model as
mlcpipe's (same synthetic weights -> close logits, same greedy tokens), and one run of
`python -m benchmarks.llm_cpu` (mlcpipe + PyTorch fp32, each in its own process) yields the
table, the per-kernel GEMV table and the target checklist."""

from __future__ import annotations

import json

import numpy as np
import pytest

from benchmarks.common import prompt_tokens
from benchmarks.mlcpipe_side import build_artifact

MODEL = "llama-tiny"
DECODE_STEPS = 6


def _torch():
    import torch  # in the test extra: the PyTorch peer must be checked, not skipped

    return torch


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory):
    """Artifacts (and the harness's build stamps) in a temporary directory, shared by the tests."""
    path = tmp_path_factory.mktemp("bench-artifacts")
    mp = pytest.MonkeyPatch()
    mp.setenv("MLCPIPE_ARTIFACTS", str(path))
    yield path
    mp.undo()


def _compare(engine, model, prompt, steps, tolerance):
    """Prefill + greedy decode through both; max |logit diff| / max |logit| below `tolerance`."""
    engine.reset()
    model.reset()
    ours, theirs = engine.prefill(prompt), model.forward(prompt).numpy()
    tokens_ours, tokens_theirs = [], []
    for _ in range(steps):
        err = np.abs(ours - theirs).max() / np.abs(theirs).max()
        assert err < tolerance, f"step {len(tokens_ours)}: relative logit error {err:.2e}"
        tokens_ours.append(int(np.argmax(ours)))
        tokens_theirs.append(int(np.argmax(theirs)))
        ours, theirs = engine.decode(tokens_theirs[-1]), model.forward([tokens_theirs[-1]]).numpy()
    assert tokens_ours == tokens_theirs


def test_torch_peer_is_the_same_model(artifacts, tiny_config):
    torch = _torch()
    from benchmarks.peers.torch_llama import load
    from mlcpipe.runtime import Engine

    torch.set_num_threads(2)
    art, _, _ = build_artifact(MODEL, "q0f32", log=lambda *_: None)
    engine = Engine(art, "synthetic", seed=0)
    model = load(tiny_config, "fp32", seed=0, max_len=64)
    prompt = prompt_tokens(tiny_config.vocab_size, 20, seed=0)
    _compare(engine, model, prompt, DECODE_STEPS, 1e-4)


@pytest.mark.long
def test_torch_int4_peer_is_mlcpipe_q4(artifacts, tiny_config):
    """The int4 path packs mlcpipe's own q4 values: with fp32 activations it matches q4f32_1."""
    torch = _torch()
    from benchmarks.peers.torch_llama import load
    from mlcpipe.runtime import Engine

    art, _, _ = build_artifact(MODEL, "q4f32_1", log=lambda *_: None)
    model = load(tiny_config, "int4", seed=0, max_len=64, dtype=torch.float32)
    _compare(Engine(art, "synthetic", seed=0), model, prompt_tokens(tiny_config.vocab_size, 20, 0), DECODE_STEPS, 1e-3)


def test_harness_runs_side_by_side(artifacts, tmp_path, tiny_config):
    try:
        import torch  # noqa: F401

        peers = ["--peers", "torch", "--torch-modes", "fp32"]
    except ImportError:
        peers = ["--peers", ""]  # mlcpipe alone; the PyTorch row is checked where torch is installed
    from benchmarks.llm_cpu import main

    out = tmp_path / "bench.md"
    assert main(["--model", MODEL, "--threads", "2", "--quants", "q0f32", *peers, "--context", "24", "--prefill", "8",
                 "--decode-steps", str(DECODE_STEPS - 1), "--prefill-runs", "1", "--bandwidth-gib", "0.05", "-o", str(out)]) == 0
    report = out.read_text()
    run = json.loads(out.with_suffix(".json").read_text())
    rows = {(r["engine"], r["dtype"]): r for r in run["rows"]}
    ours = rows[("mlcpipe", "q0f32")]
    assert not ours.get("error") and len(ours["decode_ms"]) == DECODE_STEPS - 1 and ours["prefill_tokens"] == 8
    assert ours["extra"]["build_s"] > 0 and ours["extra"]["gemv_kernels"]
    # (the tiny model's gate_up and lm_head have the same shape, 512x128: one kernel serves both)
    assert {k["role"] for k in ours["extra"]["gemv_kernels"]} >= {"qkv", "o_proj", "down", "lm_head"}
    assert all(b.get("bound_gbps", 0) > 0 for b in run["bandwidth"]) and len(run["bandwidth"]) == 2
    assert "| mlcpipe | q0f32 |" in report and "GB/s against the bound" in report and "## Targets" in report
    assert "FAILED" not in report and "python -m benchmarks.llm_cpu --model llama-tiny" in report
    if peers[1] == "torch":
        theirs = rows[("pytorch", "fp32")]
        assert not theirs.get("error") and len(theirs["decode_ms"]) == DECODE_STEPS - 1
        # same prompt, same weights: the harness's two engines generate the same greedy tokens
        assert ours["tokens"] == theirs["tokens"] and len(ours["tokens"]) == DECODE_STEPS
        assert f"greedy tokens = PyTorch fp32's for the first {DECODE_STEPS}/{DECODE_STEPS}" in report


@pytest.mark.long  # a benchmark script's own test: two 1B-shaped builds (CI time, docs/tests.md)
def test_short_prefill_benchmark_compares_the_two_builds(monkeypatch, tmp_path):
    """`python -m benchmarks.short_prefill` on the tiny model: both builds run every prompt length;
    past `low_batch` tokens they are the same code (equal logits), below it the GEMV branch (on
    AMX CPUs) gives logits within bf16 precision of the tiles'."""
    import tvm

    from benchmarks import short_prefill
    from mlcpipe.targets import load_target

    monkeypatch.setenv("MLCPIPE_ARTIFACTS", str(tmp_path / "artifacts"))
    out = tmp_path / "short.md"
    assert short_prefill.main(["--model", "llama-tiny", "--tokens", "1,2,6", "--runs", "1", "-o", str(out)]) == 0
    rows = [line.split("|")[1:-1] for line in out.read_text().splitlines() if line.startswith("| ") and line[2].isdigit()]
    assert [int(r[0]) for r in rows] == [1, 2, 6]
    diffs = {int(r[0]): float(r[4]) for r in rows}
    assert all(float(r[1]) > 0 and float(r[2]) > 0 for r in rows)
    assert diffs[6] == 0.0  # 6 > low_batch: the tiles in both builds
    if tvm.target.codegen.target_has_features("amx-bf16", load_target("llvm").tvm_target()):
        assert 0 < diffs[1] < 5e-2 and 0 < diffs[2] < 5e-2  # another arithmetic, same model


def _host_has(feature: str) -> bool:
    import tvm

    from mlcpipe.targets import load_target

    return tvm.target.codegen.target_has_features(feature, load_target("llvm").tvm_target())


@pytest.mark.skipif(not _host_has("avx2"), reason="the Haswell build needs an AVX2 host")
def test_prefill_gemm_benchmark_times_each_rule_on_the_asked_cpu(tmp_path):
    """`python -m benchmarks.prefill_gemm` on the tiny model for Haswell (AVX2 + FMA): every
    prefill matmul but lm_head, both rules' times, their outputs checked to agree; an unknown
    rule name is one error line."""
    from benchmarks import prefill_gemm

    out = tmp_path / "gemm.md"
    assert prefill_gemm.main(["--model", "llama-tiny", "--quants", "q4f32_1", "--tokens", "20", "--repeat", "1", "-o", str(out)]) == 0
    text = out.read_text()
    rows = [line.split("|")[1:-1] for line in text.splitlines() if line.startswith("| q4f32_1")]
    assert sorted(r[2].strip() for r in rows) == ["down", "gate_up", "o_proj", "qkv"]
    assert all(float(r[3].split()[0]) > 0 and float(r[4].split()[0]) > 0 and r[5].strip().endswith("x") for r in rows)
    assert all(r[3].strip().endswith("GB/s)") for r in rows)
    assert "mcpu=haswell" in text and "| PrefillGEMM | PrefillGEMMF32 |" in text
    assert prefill_gemm.main(["--model", "llama-tiny", "--rules", "PrefillGEMM,NoSuchRule"]) == 2
    assert prefill_gemm.main(["--model", "llama-tiny", "--rules", "PrefillGEMM:no_such_knob=1"]) == 2


def test_decode_gemv_benchmark_cold_with_knob_variants(tmp_path, monkeypatch):
    """`--decode --cold` with a knob variant (`Rule:planes=1;rows=2`): each one-token matmul
    (lm_head too), both variants built with their knobs (outputs checked to agree), timed
    interleaved on inputs rotated beyond the last-level cache (the header says how many bytes)."""
    import mlcpipe.device.llvm as llvm
    from benchmarks import prefill_gemm

    monkeypatch.setattr(llvm, "timing_cold_bytes", lambda: 8 << 20)  # a small rotation keeps the test short
    out = tmp_path / "gemv.md"
    argv = ["--model", "llama-tiny", "--decode", "--cold", "--quants", "q4f16_1", "--repeat", "1",
            "--rules", "DecodeGEMVQ4VNNI,DecodeGEMVQ4VNNI:planes=1;rows=2", "-o", str(out)]
    assert prefill_gemm.main(argv) == 0
    text = out.read_text()
    rows = [line.split("|")[1:-1] for line in text.splitlines() if line.startswith("| q4f16_1")]
    assert sorted(r[2].strip() for r in rows) == ["down", "gate_up", "lm_head", "o_proj", "qkv"]
    assert all(float(r[3].split()[0]) > 0 and float(r[4].split()[0]) > 0 for r in rows)
    assert "inputs rotated through 8 MiB, rules interleaved, median of 1" in text
    assert "| DecodeGEMVQ4VNNI | DecodeGEMVQ4VNNI:planes=1;rows=2 |" in text


def test_accuracy_benchmark_finds_the_one_plane_prefill(tmp_path):
    """`python -m benchmarks.accuracy` on the tiny model built for Haswell (the AVX2 int8 rules, on any
    x86 host): the plain build and one whose prefill GEMMs take two activation planes (a tuning
    database given to the build), each against PyTorch's float32 truth; two planes land closer
    than llama.cpp's one (Q8). A variant that names no knob is one error line."""
    from benchmarks import accuracy

    out = tmp_path / "accuracy.md"
    argv = ["--model", "llama-tiny", "--quant", "q4f16_1", "--mcpu", "haswell", "--prompt", "40", "--steps", "3",
            "--variants", "default,PrefillGEMMQ4VNNI:planes=2", "-o", str(out)]
    assert accuracy.main(argv) == 0
    rows = {r[0].strip(): r for r in (line.split("|")[1:-1] for line in out.read_text().splitlines()) if r and r[0].strip() in
            ("default", "PrefillGEMMQ4VNNI:planes=2")}
    (one, two) = (rows["default"], rows["PrefillGEMMQ4VNNI:planes=2"])
    assert int(one[1]) == 0 and int(two[1]) >= 4  # qkv, o_proj, gate_up, down (and batch_verify's lm_head)
    assert 0 < float(two[2]) < float(one[2]) < 0.2, (one, two)
    assert all(float(r[3]) < 0.2 for r in (one, two))
    assert accuracy.main(["--model", "llama-tiny", "--variants", "PrefillGEMMQ4VNNI"]) == 2


def test_rounds_alternate_the_engine_order_and_merge(monkeypatch, tmp_path):
    """`--rounds 3`: the engine list runs forward, reversed, forward (each engine in its own
    worker; faked here), and each row merges its rounds: the median prefill, every round's
    decode steps, the per-round p50s in the notes; a failed round is left out."""
    import benchmarks.llm_cpu as bench

    calls = []

    def fake_worker(engine, variant, settings, rebuild, timeout, log):
        calls.append((engine, variant, rebuild))
        n = len(calls)
        if (engine, variant) == ("pytorch", "bf16") and n > 3:
            return {"engine": engine, "dtype": variant, "error": "worker exited with 1", "decode_ms": [], "notes": [], "extra": {}}
        return {"engine": engine, "dtype": variant, "prefill_s": float(n), "prefill_tokens": 8, "decode_ms": [10.0 * n, 10.0 * n + 1],
                "weight_bytes_per_token": 10**6, "notes": [], "extra": {"build_s": 1.0} if engine == "mlcpipe" else {}, "error": None,
                "tokens": [1, 2]}

    monkeypatch.setattr(bench, "run_worker", fake_worker)
    out = tmp_path / "bench.md"
    assert bench.main(["--model", MODEL, "--quants", "q0f32", "--peers", "torch", "--torch-modes", "fp32,bf16", "--rounds", "3",
                       "--no-bandwidth", "--rebuild", "-o", str(out)]) == 0
    forward = [("mlcpipe", "q0f32"), ("pytorch", "fp32"), ("pytorch", "bf16")]
    assert [c[:2] for c in calls] == forward + forward[::-1] + forward
    assert [c[2] for c in calls] == [True] * 3 + [False] * 6  # --rebuild: the first round only
    run = json.loads(out.with_suffix(".json").read_text())
    rows = {(r["engine"], r["dtype"]): r for r in run["rows"]}
    ours = rows[("mlcpipe", "q0f32")]  # calls 1, 6, 7
    assert ours["prefill_s"] == 6.0 and ours["decode_ms"] == [10.0, 11.0, 60.0, 61.0, 70.0, 71.0]
    assert [r["decode_p50_ms"] for r in ours["extra"]["rounds"]] == [10.5, 60.5, 70.5]
    assert "3 rounds (alternating order): decode p50 per round 10.5 / 60.5 / 70.5 ms" in ours["notes"]
    bf16 = rows[("pytorch", "bf16")]  # call 3 ran; calls 4 and 9 failed
    assert bf16["decode_ms"] == [30.0, 31.0] and not bf16.get("error")
    assert bf16["notes"] == ["1 rounds (alternating order): decode p50 per round 30.5 ms; 2 failed round(s) left out"]
    report = out.read_text()
    assert "3 rounds of the engine list, every other one reversed" in report and "2 failed round(s) left out" in report
    assert bench.merge_rounds([{"error": "x", "decode_ms": []}, {"error": "y", "decode_ms": []}])["error"] == "x"
    with pytest.raises(SystemExit, match="--rounds: got 0; allowed: an integer >= 1"):
        bench.main(["--model", MODEL, "--rounds", "0"])


@pytest.mark.parametrize("model_name", [pytest.param("qwen2-tiny", marks=pytest.mark.long), "gemma3-tiny"])
def test_transformers_peer_is_the_same_model(artifacts, model_name):
    """For the families, the PyTorch peer is transformers' own model with the same synthetic
    weights: its logits are mlcpipe's q0f32 logits (a prompt past the chunk and Gemma's window)."""
    torch = _torch()
    from benchmarks.peers.transformers_model import Session, load
    from mlcpipe.config import load_model_config
    from mlcpipe.runtime import Engine

    torch.set_num_threads(2)
    config = load_model_config(model_name)
    art, _, _ = build_artifact(model_name, "q0f32", log=lambda *_: None)
    session = Session(load(config, "fp32", seed=0))

    class Peer:  # _compare's interface: reset(), forward(tokens) -> logits with a .numpy()
        reset = staticmethod(session.reset)

        def forward(self, tokens):
            return torch.from_numpy(session.forward(tokens))

    _compare(Engine(art, "synthetic", seed=0), Peer(), prompt_tokens(config.vocab_size, 90, seed=0), DECODE_STEPS, 1e-4)


@pytest.mark.parametrize("model_name", ["qwen2.5-0.5b", "qwen3-0.6b", "gemma-3-1b", "smollm2-1.7b", "llama-3.2-1b"])
def test_transformers_peer_config_of_each_shipped_model(model_name):
    """The peer's config of every shipped model is one transformers accepts (its strict fields:
    eos_token_id a list, not a tuple), with the model's own sizes."""
    from transformers import AutoConfig

    from mlcpipe.config import load_model_config
    from mlcpipe.hf_config import transformers_fields

    config = load_model_config(model_name)
    model_type, fields = transformers_fields(config)
    hf = AutoConfig.for_model(model_type, **fields)
    assert (hf.hidden_size, hf.num_hidden_layers, hf.vocab_size) == (config.hidden_size, config.num_hidden_layers, config.vocab_size)
    eos = config.eos_token_id
    assert hf.eos_token_id == (list(eos) if isinstance(eos, tuple) else eos)


def test_build_time_table_per_target(tmp_path, capsys):
    """`python -m benchmarks.build_time`: a fresh CLI build per target, its phases from the build's
    own log, the wall time around them (imports included), the 60 s goal column, written atomically."""
    from benchmarks import build_time

    out = tmp_path / "build-time.md"
    assert build_time.main(["--model", MODEL, "--quant", "q4f32_1", "--targets", "llvm,metal", "-o", str(out)]) == 0
    text = out.read_text()
    header = next(line for line in text.splitlines() if line.startswith("| target |"))
    columns = [c.strip() for c in header.strip("|").split("|")]
    assert columns[:3] == ["target", "parser stack", "wall s"] and columns[-2:] == ["peak MiB", "goal"]
    assert {"export", "schedule", "codegen", "reference"} <= set(columns)
    for target in ("llvm", "metal"):
        row = next(line for line in text.splitlines() if line.startswith(f"| {target} | mlcpipe |"))
        cells = dict(zip(columns, (c.strip() for c in row.strip("|").split("|"))))
        phases = [float(cells[c]) for c in columns[3:-2]]
        assert all(p >= 0 for p in phases) and float(cells["wall s"]) >= sum(phases) > 0
        # the goal column says what the wall time says (a speed figure, not this test's verdict: CI shares its cores)
        assert cells["goal"] == ("met" if float(cells["wall s"]) <= 60 else "missed") and float(cells["peak MiB"]) > 100
    assert not list(tmp_path.glob("*.tmp*")) and "Goal: at most 60 s" in capsys.readouterr().out

"""MLC-LLM's model-library function table in our libraries: `_metadata`, `create_tir_paged_kv_cache`
and the batched `batch_prefill` / `batch_decode` / `batch_verify`, driven through the paged KV cache
as MLC-LLM's engine drives them, against lone single-sequence runs of the same artifact.

The tiny model is built with prefill_chunk_size 16, so one of the three sequences (17 tokens) is
longer than a chunk and is prefilled in two batch_prefill calls.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
import tvm
import yaml

from mlcpipe.backends import webgpu as webgpu_backend
from mlcpipe.build import build
from mlcpipe.config import MODELS_DIR, load_model_config
from mlcpipe.roles import WEIGHT_ROLES
from mlcpipe.runtime import Engine
from mlcpipe.targets import load_target
from mlcpipe.quantization import quantization

QUANT = "q4f32_1"
CHUNK = 16
LENGTHS = (5, 17, 9)
TOLERANCE = 1e-5  # max |logit difference| / max |logit| (f32 activations end to end)
FUNCTION_TABLE = (
    "_metadata", "embed", "prefill", "decode", "batch_prefill", "batch_decode", "batch_verify",
    "create_tir_paged_kv_cache", "create_paged_kv_cache",
)
INSPECT_WASM = Path(webgpu_backend.__file__).parent / "web_runtime" / "inspect_wasm.cjs"


@pytest.fixture(scope="module")
def chunk16_config(tmp_path_factory):
    raw = yaml.safe_load((MODELS_DIR / "llama-tiny.yaml").read_text())
    raw.update(name="llama-tiny-chunk16", prefill_chunk_size=CHUNK)
    path = tmp_path_factory.mktemp("config") / "llama-tiny-chunk16.yaml"
    path.write_text(yaml.safe_dump(raw))
    return load_model_config(str(path))


@pytest.fixture(scope="module")
def artifact(chunk16_config, tmp_path_factory):
    out = tmp_path_factory.mktemp("function-table") / f"tiny-chunk16-{QUANT}-llvm"
    return build(chunk16_config, quantization(QUANT), load_target("llvm"), output=out, log=lambda *_: None)


@pytest.fixture(scope="module")
def engine(artifact):
    return Engine(artifact, weights="synthetic", seed=0)


def _rel(got: np.ndarray, want: np.ndarray) -> float:
    return float(np.abs(got.astype(np.float64) - want).max() / np.abs(want).max())


class _Batch:
    """The VM functions of `engine` driven as MLC-LLM's engine does: several sequences in one
    paged KV cache, tokens of all sequences concatenated in one forward call."""

    def __init__(self, engine: Engine, max_batch: int = 4):
        self.engine, self.vm, self.params = engine, engine.vm, engine._params_arg
        self.hidden = int(engine.config["hidden_size"])
        self._begin = tvm.get_global_func("vm.builtin.kv_state_begin_forward")
        self._end = tvm.get_global_func("vm.builtin.kv_state_end_forward")
        sizes = (max_batch, engine.context_window, CHUNK, int(engine.config["page_size"]), 0)
        self.kv = self.vm["create_tir_paged_kv_cache"](*(tvm.runtime.ShapeTuple([n]) for n in sizes))

    def add(self, *seq_ids: int) -> None:
        for seq_id in seq_ids:
            tvm.get_global_func("vm.builtin.kv_state_add_sequence")(self.kv, seq_id)

    def _embeds(self, tokens: list[int], shape: tuple[int, ...]):
        ids = tvm.runtime.tensor(np.asarray(tokens, dtype="int32"), self.engine.device)
        return self.vm["embed"](ids, self.params)._create_view(shape)

    def _forward(self, name: str, parts: list[tuple[int, list[int]]], shape, *extra) -> np.ndarray:
        tokens = [t for _, chunk in parts for t in chunk]
        self._begin(self.kv, tvm.runtime.ShapeTuple([s for s, _ in parts]), tvm.runtime.ShapeTuple([len(c) for _, c in parts]))
        logits, self.kv = self.vm[name](self._embeds(tokens, shape(len(tokens))), *extra, self.kv, self.params)
        self._end(self.kv)
        return logits.numpy()

    def prefill(self, parts: list[tuple[int, list[int]]]) -> np.ndarray:
        """batch_prefill of (seq_id, tokens) chunks -> logits (batch, vocab) of each chunk's last token."""
        positions = np.cumsum([len(c) for _, c in parts]).astype("int32") - 1
        logits = self._forward("batch_prefill", parts, lambda n: (1, n, self.hidden),
                               tvm.runtime.tensor(positions, self.engine.device))
        assert logits.shape == (1, len(parts), self.engine.vocab_size)
        return logits[0]

    def decode(self, tokens: dict[int, int]) -> np.ndarray:
        """batch_decode of one token per sequence -> logits (batch, vocab)."""
        parts = [(s, [t]) for s, t in tokens.items()]
        logits = self._forward("batch_decode", parts, lambda n: (n, 1, self.hidden))
        assert logits.shape == (len(parts), 1, self.engine.vocab_size)
        return logits[:, 0]

    def verify(self, seq_id: int, tokens: list[int]) -> np.ndarray:
        """batch_verify of draft tokens of one sequence -> logits (tokens, vocab)."""
        logits = self._forward("batch_verify", [(seq_id, tokens)], lambda n: (1, n, self.hidden))
        assert logits.shape == (1, len(tokens), self.engine.vocab_size)
        return logits[0]


def _lone(engine: Engine, prompt: list[int], follow: list[int]) -> list[np.ndarray]:
    """Logits of a lone run (the Engine's prefill / decode, one sequence): after the prompt, then
    after each token of `follow`."""
    engine.reset()
    out = [engine.prefill(prompt)]
    out += [engine.decode(t) for t in follow]
    return out


@pytest.fixture(scope="module")
def sequences(engine):
    rng = np.random.default_rng(7)
    return [rng.integers(0, engine.vocab_size, n).tolist() for n in LENGTHS]


# ---- _metadata ---------------------------------------------------------------------------------


def test_metadata_is_json_matching_the_manifest(artifact, engine, chunk16_config):
    text = engine.vm["_metadata"]()
    assert isinstance(text, str)
    meta = json.loads(text)
    manifest = json.loads((artifact / "manifest.json").read_text())
    assert [{k: p[k] for k in ("name", "shape", "dtype")} for p in meta["params"]] == manifest["parameters"]
    assert all(p["preprocs"] == [] and p["pipeline_stages"] == [0] for p in meta["params"])
    cfg = chunk16_config
    assert meta["kv_cache"] == {
        "num_hidden_layers": cfg.num_hidden_layers, "head_dim": cfg.head_dim,
        "num_attention_heads": cfg.num_attention_heads, "num_key_value_heads": cfg.num_key_value_heads,
    }
    assert meta["model_type"] == "llama" and meta["quantization"] == QUANT == manifest["quantization"]
    assert meta["context_window_size"] == cfg.context_window_size == engine.context_window
    assert meta["prefill_chunk_size"] == CHUNK == engine.prefill_chunk
    assert meta["sliding_window_size"] == -1 and meta["attention_sink_size"] == -1
    assert meta["tensor_parallel_shards"] == 1 and meta["pipeline_parallel_stages"] == 1
    assert meta["kv_state_kind"] == "kv_cache"
    assert meta["max_batch_size"] == getattr(cfg, "max_batch_size", 80) >= len(LENGTHS)
    # memory_usage: every Relax function but _metadata itself, bytes (MLC-LLM reads int64 values)
    usage = meta["memory_usage"]
    assert set(usage) == set(manifest["functions"]) - {"_metadata"}
    assert all(isinstance(v, int) and v >= 0 for v in usage.values())
    hidden, vocab = cfg.hidden_size, cfg.vocab_size
    # the prefill chunk's activations (seq_len at its bound) and batch_verify's logits of every row
    assert usage["prefill"] >= CHUNK * hidden * 4
    assert usage["batch_verify"] >= CHUNK * vocab * 4
    assert usage["batch_decode"] >= CHUNK * hidden * 4  # rows of one forward: at most a prefill chunk


def test_function_table_and_kv_cache_kernels_once(artifact):
    manifest = json.loads((artifact / "manifest.json").read_text())
    assert set(FUNCTION_TABLE) <= set(manifest["functions"])
    names = [k["name"] for k in manifest["kernels"]]
    # the batched functions reuse prefill's kernels, whose token dim keeps its name `seq_len`
    # (tuning records, `mlcpipe check` and the profiler key on it): only the row gather is new
    model_roles = {*WEIGHT_ROLES, "norm", "rope", "swiglu", "embedding"}
    for kernel in manifest["kernels"]:
        dims = {d for arg in kernel["args"] for d in (arg["shape"] or []) if isinstance(d, str)}
        if kernel["role"] in model_roles:
            assert dims <= {"seq_len"}, (kernel["name"], dims)
    assert {d for arg in next(k for k in manifest["kernels"] if k["name"] == "gather_hidden")["args"]
            for d in arg["shape"] if isinstance(d, str)} == {"seq_len", "batch_size"}
    assert len(names) == len(set(names))
    slots = [s for slot in manifest["kv_cache_kernels"] for s in (slot if isinstance(slot, list) else [slot]) if s]
    assert "batch_prefill_paged_kv_cpu" in slots
    for kernel in slots:  # one copy of each KV cache kernel behind both create functions
        assert names.count(kernel) == 1, kernel
        assert not [n for n in names if n != kernel and n.rstrip("0123456789_") == kernel], kernel


# ---- batched functions against lone runs -------------------------------------------------------


def test_batch_prefill_and_decode_match_lone_runs(engine, sequences):
    rng = np.random.default_rng(8)
    following = [int(t) for t in rng.integers(0, engine.vocab_size, len(sequences))]
    lone = [_lone(engine, s, [t]) for s, t in zip(sequences, following)]

    batch = _Batch(engine)
    batch.add(0, 1, 2)
    a, b, c = sequences
    split = CHUNK - len(a)  # sequence 1 runs in two calls: 11 tokens beside seq 0, 6 beside seq 2
    first = batch.prefill([(0, a), (1, b[:split])])
    second = batch.prefill([(1, b[split:]), (2, c)])
    assert len(a) + split <= CHUNK and len(b) - split + len(c) <= CHUNK
    prefill = {0: first[0], 1: second[0], 2: second[1]}
    for seq in range(3):
        err = _rel(prefill[seq], lone[seq][0])
        assert err < TOLERANCE, f"batch_prefill, sequence {seq} ({LENGTHS[seq]} tokens): relative error {err:.2e}"

    decoded = batch.decode({0: following[0], 1: following[1], 2: following[2]})
    for seq in range(3):
        err = _rel(decoded[seq], lone[seq][1])
        assert err < TOLERANCE, f"batch_decode, sequence {seq}: relative error {err:.2e}"
    # a second step with the sequences in another order and one left out
    again = [int(t) for t in rng.integers(0, engine.vocab_size, 2)]
    step2 = batch.decode({2: again[0], 0: again[1]})
    assert _rel(step2[0], _lone(engine, c, [following[2], again[0]])[-1]) < TOLERANCE
    assert _rel(step2[1], _lone(engine, a, [following[0], again[1]])[-1]) < TOLERANCE


def test_batch_verify_matches_per_token_decode(engine, sequences):
    rng = np.random.default_rng(9)
    prompt = sequences[2]
    draft = [int(t) for t in rng.integers(0, engine.vocab_size, 4)]
    lone = _lone(engine, prompt, draft)

    batch = _Batch(engine)
    batch.add(5)
    last = batch.prefill([(5, prompt)])[0]
    assert _rel(last, lone[0]) < TOLERANCE
    verified = batch.verify(5, draft)
    for i in range(len(draft)):
        err = _rel(verified[i], lone[i + 1])
        assert err < TOLERANCE, f"batch_verify row {i}: relative error {err:.2e}"


# ---- webgpu: the function table is in lib.wasm -------------------------------------------------


@pytest.mark.dawn
def test_webgpu_library_exports_the_function_table(tmp_path):
    node = shutil.which("node") or shutil.which("nodejs")
    assert node, "node is needed: install with scripts/setup-debian.sh"
    out = build(load_model_config("llama-tiny"), quantization(QUANT), load_target("webgpu"), output=tmp_path / "tiny-webgpu", log=lambda *_: None)
    manifest = json.loads((out / "manifest.json").read_text())
    assert set(FUNCTION_TABLE) <= set(manifest["functions"])
    proc = subprocess.run([node, str(INSPECT_WASM), str(out / "lib.wasm")], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    text = json.loads(proc.stdout)["as_text"]
    for function in FUNCTION_TABLE:
        assert f"@{function}:" in text, function

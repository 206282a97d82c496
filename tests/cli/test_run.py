"""The user's commands end to end through the CLI: convert-weights, build, run."""

from __future__ import annotations

import json

import ml_dtypes
import numpy as np
import pytest
import yaml

from mlcpipe.build import build
from mlcpipe.config import MODELS_DIR, load_model_config
from mlcpipe.runtime import Engine
from mlcpipe.targets import load_target
from mlcpipe.weights import convert_weights, load_stored_weights
from mlcpipe.quantization import quantization

from tests.helpers.checkpoints import hf_config, random_hf_weights, write_hf_checkpoint
from tests.helpers.cli import mlcpipe
from tests.helpers.reference_checks import as_model_sees_it, check_against_reference
from tests.helpers.reference_llama import ReferenceLlama


@pytest.fixture(scope="module")
def tiny_q4f32(tiny_config, tmp_path_factory):
    root = tmp_path_factory.mktemp("cli")
    weights = random_hf_weights(tiny_config, seed=3)
    hf = write_hf_checkpoint(root / "hf", tiny_config, weights)
    conv = mlcpipe("convert-weights", "--model", "llama-tiny", "--quant", "q4f32_1", "--source", str(hf), "--output", str(root / "w"))
    assert conv.returncode == 0, conv.stderr
    built = mlcpipe("build", "--model", "llama-tiny", "--quant", "q4f32_1", "--target", "llvm", "--output", str(root / "art"))
    assert built.returncode == 0, built.stderr
    return root, hf, weights


def test_cli_convert_build_run(tiny_q4f32, tiny_config):
    root, hf, weights = tiny_q4f32
    cache = json.loads((root / "w" / "tensor-cache.json").read_text())
    assert cache["metadata"]["ParamSize"] == len(cache["records"][0]["records"]) or len(cache["records"]) > 1
    record = {r["name"]: r for shard in cache["records"] for r in shard["records"]}
    assert record["model.layers.0.self_attn.qkv_proj.q_weight"]["dtype"] == "uint32"
    assert record["model.layers.0.self_attn.qkv_proj.q_weight"]["shape"] == [256, 16]
    assert record["model.layers.0.self_attn.qkv_proj.q_scale"]["shape"] == [256, 4]

    manifest = json.loads((root / "art" / "manifest.json").read_text())
    for key in ("model", "quantization", "target", "versions", "config_hash", "kernels", "parameters", "build_seconds"):
        assert key in manifest
    assert manifest["target"]["kind"] == "llvm" and manifest["target"]["mcpu"] not in ("native", "auto")
    assert manifest["versions"]["apache-tvm"] == "0.27.0.post1"
    assert (root / "art" / "lib.so").is_file() and (root / "art" / "mlc-chat-config.json").is_file()

    run = mlcpipe("run", "--artifact", str(root / "art"), "--weights", str(root / "w"), "--prompt-tokens", "1,2,3", "--max-new-tokens", "6")
    assert run.returncode == 0, run.stderr
    tokens = [int(t) for t in run.stdout.strip().splitlines()[-1].split(",")]
    ref = ReferenceLlama(hf_config(tiny_config), as_model_sees_it("q4f32_1", weights))
    logits, expected = ref.forward([1, 2, 3])[-1], []
    for _ in range(6):
        expected.append(int(np.argmax(logits)))
        logits = ref.forward([expected[-1]])[-1]
    assert tokens == expected


def test_run_rejects_bad_tokens_and_long_prompts(tiny_q4f32, tiny_config):
    root, _, _ = tiny_q4f32
    bad = mlcpipe("run", "--artifact", str(root / "art"), "--weights", str(root / "w"), "--prompt-tokens", "1,512,3")
    assert bad.returncode == 2 and "token id 512 is out of range: allowed 0..511" in bad.stderr
    neg = mlcpipe("run", "--artifact", str(root / "art"), "--weights", str(root / "w"), "--prompt-tokens", "-1")
    assert neg.returncode == 2 and "'-1': expected comma-separated non-negative integers" in neg.stderr
    long = ",".join(["1"] * 250)
    too_long = mlcpipe("run", "--artifact", str(root / "art"), "--weights", str(root / "w"), "--prompt-tokens", long, "--max-new-tokens", "10")
    assert too_long.returncode == 2 and "exceeds the context window of 256 tokens" in too_long.stderr
    wrong = mlcpipe("run", "--artifact", str(root / "nope"), "--prompt-tokens", "1")
    assert wrong.returncode == 2 and "not an mlcpipe artifact" in wrong.stderr
    # --weights-seed seeds synthetic weights only: with weights read from files it would do nothing
    seeded = mlcpipe("run", "--artifact", str(root / "art"), "--weights", str(root / "w"), "--prompt-tokens", "1", "--weights-seed", "3")
    assert seeded.returncode == 2 and "--weights-seed applies to --weights synthetic only" in seeded.stderr
    negative = mlcpipe("run", "--artifact", str(root / "art"), "--weights", "synthetic", "--prompt-tokens", "1", "--weights-seed", "-5")
    assert negative.returncode == 2 and "Invalid value for '--weights-seed': -5 is not in the range x>=0" in negative.stderr
    seeded = mlcpipe("convert-weights", "--model", "llama-tiny", "--quant", "q4f32_1", "--source", str(root / "hf"), "--seed", "3",
                     "--output", str(root / "w-seeded"))
    assert seeded.returncode == 2 and "--seed applies to --source synthetic only" in seeded.stderr and not (root / "w-seeded").exists()


def test_long_prompt_is_prefilled_in_chunks(tiny_config, tmp_path):
    """A prompt longer than prefill_chunk_size (128) goes through several prefill calls."""
    weights = random_hf_weights(tiny_config, seed=5)
    hf = write_hf_checkpoint(tmp_path / "hf", tiny_config, weights, dtype=np.float16)
    params = convert_weights(tiny_config, quantization("q0f32"), hf, tmp_path / "w", log=lambda *_: None)
    art = build(tiny_config, quantization("q0f32"), load_target("llvm"), output=tmp_path / "art", log=lambda *_: None)
    prompt = [int(t) for t in np.random.default_rng(0).integers(0, 512, size=150)]
    ref = ReferenceLlama(hf_config(tiny_config), {k: v.astype(np.float16).astype(np.float32) for k, v in weights.items()})
    worst, mismatches = check_against_reference(Engine(art, params), ref, "float32", prompt, 3)
    assert worst < 1e-4 and mismatches == 0


def test_untied_lm_head_and_bf16_checkpoint(tmp_path):
    raw = yaml.safe_load((MODELS_DIR / "llama-tiny.yaml").read_text())
    raw.update(name="llama-tiny-untied", tie_word_embeddings=False)
    path = tmp_path / "untied.yaml"
    path.write_text(yaml.safe_dump(raw))
    cfg = load_model_config(str(path))
    weights = random_hf_weights(cfg, seed=7)
    assert "lm_head.weight" in weights
    hf = write_hf_checkpoint(tmp_path / "hf", cfg, weights, dtype=ml_dtypes.bfloat16)
    params = convert_weights(cfg, quantization("q4f16_1"), hf, tmp_path / "w", log=lambda *_: None)
    stored = load_stored_weights(params)
    assert "lm_head.q_weight" in stored and stored["lm_head.q_weight"].shape == (512, 16)
    art = build(cfg, quantization("q4f16_1"), load_target("llvm"), output=tmp_path / "art", log=lambda *_: None)
    manifest = json.loads((art / "manifest.json").read_text())
    assert any(k["role"] == "lm_head" and k["name"].startswith("fused_dequantize") for k in manifest["kernels"])
    bf16 = {k: v.astype(ml_dtypes.bfloat16).astype(np.float32) for k, v in weights.items()}
    ref = ReferenceLlama(hf_config(cfg), as_model_sees_it("q4f16_1", bf16))
    worst, _ = check_against_reference(Engine(art, params), ref, "float16", [5, 6, 7, 8], 8)
    assert worst < 1e-2  # bf16 AMX prefill: see TOLERANCE in tests/helpers/reference_checks.py


def test_synthetic_weights_and_tokenizer(tiny_config, tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {f"w{i}": i for i in range(512)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="w0"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(str(tmp_path / "tokenizer.json"))

    art = tmp_path / "art"
    built = mlcpipe("build", "--model", "llama-tiny", "--quant", "q4f16_1", "--output", str(art), "--weights", "synthetic")
    assert built.returncode == 0, built.stderr
    assert (art / "params" / "tensor-cache.json").is_file()
    assert f"tensors (0.2 MiB) to {art / 'params'}\n" in built.stderr, built.stderr  # not the temp dir renamed at the end
    by_ids = mlcpipe("run", "--artifact", str(art), "--prompt-tokens", "4,5,6", "--max-new-tokens", "5")
    by_text = mlcpipe("run", "--artifact", str(art), "--prompt", "w4 w5 w6", "--tokenizer", str(tmp_path / "tokenizer.json"), "--max-new-tokens", "5")
    synthetic = mlcpipe("run", "--artifact", str(art), "--weights", "synthetic", "--prompt-tokens", "4,5,6", "--max-new-tokens", "5")
    for result in (by_ids, by_text, synthetic):
        assert result.returncode == 0, result.stderr
    ids = by_ids.stdout.strip().splitlines()[-1]
    assert by_text.stdout.strip().splitlines()[-1] == ids == synthetic.stdout.strip().splitlines()[-1]
    text_lines = by_text.stdout.strip().splitlines()
    assert text_lines[-2] == " ".join(f"w{t}" for t in ids.split(","))

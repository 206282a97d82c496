"""WebLLM 0.2.86 itself (npm @mlc-ai/web-llm, pinned in package.json) loads an mlcpipe webgpu
build in headless Debian Chromium (puppeteer-core, page from 127.0.0.1, SwiftShader) and
completes a prompt at temperature 0 with exactly the NumPy Llama's greedy tokens.

The model: a tiny Llama with the 1B's attention shape (head_dim 64, 8 query / 2 KV heads) and its
own lm_head (tied embeddings make random weights repeat the last prompt token), q4f32_1 (SwiftShader has no shader-f16), a prompt of three prefill chunks. The model directory is
`convert-weights` output of a checkpoint with a word-level tokenizer.json ("w<i>" is token i), so
the prompt's tokens are known exactly and the completion's text names every generated id.
"""

from __future__ import annotations

import dataclasses
import json
import shutil

import numpy as np
import pytest

from mlcpipe.build import build
from mlcpipe.mlc_contract import MLCContractError
from mlcpipe.errors import ArtifactError, RunnerError
from mlcpipe.runners.webgpu.webllm import webllm_complete
from mlcpipe.targets import load_target
from mlcpipe.weights import convert_weights
from mlcpipe.quantization import quantization

from tests.helpers.checkpoints import hf_config, random_hf_weights, write_hf_checkpoint, write_word_tokenizer
from tests.helpers.reference_checks import as_model_sees_it
from tests.helpers.reference_llama import ReferenceLlama

QUANT = "q4f32_1"
CHUNK = 16
PROMPT = [int(t) for t in np.random.default_rng(23).integers(3, 512, size=2 * CHUNK + 9)]  # three chunks
NEW_TOKENS = 8
TOLERANCE = 5e-4  # SwiftShader's f32 (see tests/runners/test_dawn.py)
QUIET = {"log": lambda *_: None}


pytestmark = pytest.mark.browser(skip_if_missing=True)


@pytest.fixture(scope="module")
def webllm_model(tiny_config, tmp_path_factory):
    config = dataclasses.replace(tiny_config, name="llama-tiny-webllm", hidden_size=256, num_attention_heads=8,
                                 head_dim=64, prefill_chunk_size=CHUNK, tie_word_embeddings=False)
    tmp = tmp_path_factory.mktemp("webllm")
    weights = random_hf_weights(config, seed=29)
    hf_dir = write_hf_checkpoint(tmp / "hf", config, weights, shards=1)
    write_word_tokenizer(hf_dir, config)
    model_dir = convert_weights(config, quantization(QUANT), hf_dir, tmp / "model", **QUIET)
    artifact = build(config, quantization(QUANT), load_target("webgpu"), output=tmp / "artifact", **QUIET)
    return config, artifact, model_dir, as_model_sees_it(QUANT, weights)


def numpy_greedy(config, weights, prompt, steps) -> list[int]:
    """Greedy tokens of the NumPy Llama; each step's top-2 margin must exceed the adapter's error."""
    ref = ReferenceLlama(hf_config(config), weights)
    logits, tokens = ref.forward(prompt)[-1], []
    for _ in range(steps):
        top2 = np.sort(logits)[-2:]
        assert top2[1] - top2[0] > 2 * TOLERANCE * np.abs(logits).max(), "near-tie in the reference: pick another seed"
        tokens.append(int(np.argmax(logits)))
        logits = ref.forward([tokens[-1]])[-1]
    return tokens


def test_webllm_generates_numpy_greedy_tokens(webllm_model):
    config, artifact, model_dir, weights = webllm_model
    assert json.loads((model_dir / "mlc-chat-config.json").read_text())["prefill_chunk_size"] == CHUNK
    want = numpy_greedy(config, weights, PROMPT, NEW_TOKENS)
    lines: list[str] = []
    out = webllm_complete(artifact, model_dir, " ".join(f"w{t}" for t in PROMPT), NEW_TOKENS,
                          ignore_eos=True, console=lines.append)
    print(f"WebLLM on {out.adapter} ({out.browser}): {out.text!r}")
    assert out.prompt_tokens == len(PROMPT) > 2 * CHUNK, out
    assert out.completion_tokens == NEW_TOKENS
    got = [int(word[1:]) for word in out.text.split()]
    assert got == want, f"WebLLM {got} vs NumPy {want}"
    assert len(set(want)) > NEW_TOKENS // 2, want  # not a model that repeats one token
    assert out.adapter.get("architecture") == "swiftshader", out.adapter


def test_webllm_refuses_a_model_dir_without_config_field(webllm_model, tmp_path):
    _, artifact, model_dir, _ = webllm_model
    broken = tmp_path / "model"
    shutil.copytree(model_dir, broken)
    data = json.loads((broken / "mlc-chat-config.json").read_text())
    del data["conv_template"]
    (broken / "mlc-chat-config.json").write_text(json.dumps(data))
    with pytest.raises(MLCContractError, match="conv_template"):
        webllm_complete(artifact, broken, "w5", 1)


def test_webllm_refuses_a_model_dir_without_a_tokenizer_it_loads(webllm_model, tmp_path):
    """MLC's format allows no tokenizer (convert-weights of synthetic weights lists none); WebLLM's
    reload throws 'Cannot handle tokenizer files' then (was: that line from inside the browser)."""
    _, artifact, model_dir, _ = webllm_model
    bare = tmp_path / "model"
    shutil.copytree(model_dir, bare)
    data = json.loads((bare / "mlc-chat-config.json").read_text())
    data["tokenizer_files"] = []
    (bare / "mlc-chat-config.json").write_text(json.dumps(data))
    with pytest.raises(RunnerError, match=r"WebLLM needs tokenizer\.json or tokenizer\.model in 'tokenizer_files' \(got \[\]\)"):
        webllm_complete(artifact, bare, "w5", 1)


def test_webllm_refuses_a_non_webgpu_build(webllm_model, tmp_path):
    config, _, model_dir, _ = webllm_model
    llvm = build(config, quantization(QUANT), load_target("llvm"), output=tmp_path / "llvm", **QUIET)
    with pytest.raises(RunnerError, match="webgpu"):
        webllm_complete(llvm, model_dir, "w5", 1)


def test_cli_webllm_and_mlc_check(webllm_model, tmp_path):
    from click.testing import CliRunner

    from mlcpipe.cli import main

    config, artifact, model_dir, weights = webllm_model
    runner = CliRunner()
    result = runner.invoke(main, ["mlc-check", "--artifact", str(artifact), "--model-dir", str(model_dir)])
    assert result.exit_code == 0, result.output
    assert result.output.count("ok: ") == 3 and f"ok: {model_dir}: holds the " in result.output, result.output
    # was: both halves "ok" on their own, though no runtime can bind these weights to this library
    other = convert_weights(config, quantization("q0f32"), "synthetic", tmp_path / "other", log=lambda *_: None)
    result = runner.invoke(main, ["mlc-check", "--artifact", str(artifact), "--model-dir", str(other)])
    assert result.exit_code == 2
    assert result.output.strip().splitlines()[-1] == (f"error: --model-dir {other}: quantization 'q0f32' (mlc-chat-config.json), "
                                                      f"but {artifact} is built for '{QUANT}'")
    shutil.copytree(model_dir, tmp_path / "relabelled")  # its config names the artifact's quantization, its tensors are q0f32's
    (tmp_path / "relabelled" / "tensor-cache.json").write_text((other / "tensor-cache.json").read_text())
    for shard in other.glob("params_shard_*"):
        shutil.copy(shard, tmp_path / "relabelled" / shard.name)
    with pytest.raises(ArtifactError, match=r"--model-dir .*relabelled: parameter 'model\.embed_tokens\.q_weight' is missing$"):
        webllm_complete(artifact, tmp_path / "relabelled", "w5", 1)  # refused before the browser starts
    prompt = PROMPT[:5]
    result = runner.invoke(main, ["webllm", "--artifact", str(artifact), "--model-dir", str(model_dir),
                                  "--prompt", " ".join(f"w{t}" for t in prompt), "--max-new-tokens", "3"])
    assert result.exit_code == 0, result.output
    greedy = numpy_greedy(config, weights, prompt, 3)
    assert result.output.strip().splitlines()[-1] == " ".join(f"w{t}" for t in greedy)
    for seed in ("-1", str(2**53)):  # WebLLM's generator fails on a negative seed; past 2**53 seeds collide in JavaScript
        result = runner.invoke(main, ["webllm", "--artifact", str(artifact), "--model-dir", str(model_dir), "--prompt", "w5",
                                      "--seed", seed])
        assert result.exit_code == 2 and f"{seed} is not in the range 0<=x<=9007199254740991" in result.output, result.output
    broken = tmp_path / "model"
    shutil.copytree(model_dir, broken)
    (broken / "tokenizer.json").unlink()
    result = runner.invoke(main, ["mlc-check", "--model-dir", str(broken)])
    assert result.exit_code == 2
    assert result.output.strip() == f"error: {broken}: tokenizer file(s) 'tokenizer.json' listed in 'tokenizer_files' are missing"


@pytest.mark.parametrize("family, seed", [pytest.param("qwen3-tiny", 3, marks=pytest.mark.long), ("gemma3-tiny", 7)])  # seeds whose greedy tokens vary
def test_webllm_runs_model_families(family, seed, tmp_path):
    """WebLLM generates transformers' greedy tokens for tiny Qwen3 and Gemma 3 builds (q4f32_1:
    no shader-f16 needed), a prompt past the prefill chunk and Gemma's window: a transformers
    checkpoint (own lm_head: tied random weights repeat tokens) through import-config,
    convert-weights and build, a word-level tokenizer beside it."""
    import torch
    import yaml

    from mlcpipe.config import load_model_config
    from tests.helpers.checkpoints import transformers_checkpoint
    from tests.helpers.cli import mlcpipe

    cfg = load_model_config(family)
    hf = tmp_path / "hf"
    model = transformers_checkpoint(hf, cfg, seed=seed, tie_word_embeddings=False)
    write_word_tokenizer(hf, cfg)
    done = mlcpipe("import-config", str(hf), "-o", str(tmp_path / "imported.yaml"), "--name", f"{family}-webllm")
    assert done.returncode == 0, done.stderr
    raw = yaml.safe_load((tmp_path / "imported.yaml").read_text())
    (tmp_path / "model.yaml").write_text(yaml.safe_dump({**raw, "conv_template": "LM"}))  # the prompt as is
    for args in (("convert-weights", "--model", str(tmp_path / "model.yaml"), "--quant", QUANT, "--source", str(hf), "--output", str(tmp_path / "model")),
                 ("build", "--model", str(tmp_path / "model.yaml"), "--quant", QUANT, "--target", "webgpu", "--output", str(tmp_path / "art"))):
        done = mlcpipe(*args)
        assert done.returncode == 0, done.stderr
    from mlcpipe.quantization import QUANTIZATIONS

    scheme = QUANTIZATIONS[QUANT]
    with torch.no_grad():
        for _, param in model.named_parameters():
            if param.ndim == 2:
                param.copy_(torch.from_numpy(scheme.dequantize_weight(*scheme.quantize_weight(param.numpy()))))
    prompt = [int(t) for t in np.random.default_rng(31).integers(3, cfg.vocab_size, size=100)]
    ids, want = list(prompt), []
    with torch.no_grad():
        for _ in range(NEW_TOKENS):
            logits = model(torch.tensor([ids])).logits[0, -1].numpy()
            top2 = np.sort(logits)[-2:]
            assert top2[1] - top2[0] > 2 * TOLERANCE * np.abs(logits).max(), "near-tie in the reference: pick another seed"
            want.append(int(np.argmax(logits)))
            ids.append(want[-1])
    out = webllm_complete(tmp_path / "art", tmp_path / "model", " ".join(f"w{t}" for t in prompt), NEW_TOKENS, ignore_eos=True)
    assert out.prompt_tokens == len(prompt)
    got = [int(word[1:]) for word in out.text.split()]
    assert got == want, f"WebLLM {got} vs transformers {want}"
    assert len(set(want)) > NEW_TOKENS // 2, want

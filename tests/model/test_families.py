"""Every model family end to end on llvm, exact against transformers: a tiny random checkpoint
written by transformers goes through `import-config`, `convert-weights`, `build` and `run
--save-logits`, and the logits of every step match transformers' float64 forward (for q4f32_1:
of the same checkpoint with its matrices quantized and dequantized), with a prompt longer than the
prefill chunk and, for Gemma 3, longer than the sliding window."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import yaml

from mlcpipe.config import load_model_config
from mlcpipe.quantization import QUANTIZATIONS
from tests.helpers.checkpoints import transformers_checkpoint
from tests.helpers.cli import mlcpipe

FAMILIES = ("qwen2-tiny", "qwen3-tiny", "gemma3-tiny")
PROMPT = [int(t) for t in np.random.default_rng(1).integers(3, 512, 100)]  # > every tiny prefill chunk and the window
STEPS = 4
TOLERANCE = 1e-4


def reference_logits(model, prompt: list[int], tokens: list[int]):
    """transformers' logits of the prompt's last token, then after each of `tokens`."""
    import torch

    ids, out = list(prompt), []
    with torch.no_grad():
        for token in [None, *tokens]:
            if token is not None:
                ids.append(token)
            out.append(model(torch.tensor([ids])).logits[0, -1].numpy())
    return np.stack(out)


def reference_model(model, root, quant: str):
    """The checkpoint under `root` in float64 (the reference's own rounding out of the error, and
    out of reach of any torch state a test worker picked up), its matrices quantize-dequantized for q4."""
    reference = type(model).from_pretrained(root / "hf").double().eval()
    return quantized(reference, quant) if quant != "q0f32" else reference


def quantized(model, quant: str):
    """`model` with every matrix replaced by its quantize-dequantize round trip (in place)."""
    import torch

    scheme = QUANTIZATIONS[quant]
    with torch.no_grad():
        for _, param in model.named_parameters():
            if param.ndim == 2:
                param.copy_(torch.from_numpy(scheme.dequantize_weight(*scheme.quantize_weight(param.numpy()))))
    return model


@pytest.fixture(scope="module", params=FAMILIES)
def family(request, tmp_path_factory):
    cfg = load_model_config(request.param)
    root = tmp_path_factory.mktemp(request.param)
    model = transformers_checkpoint(root / "hf", cfg)
    imported = root / "model.yaml"
    done = mlcpipe("import-config", str(root / "hf"), "-o", str(imported), "--name", cfg.name)
    assert done.returncode == 0, done.stderr
    return cfg, root, model, imported


def test_import_config_gives_the_shipped_yaml(family):
    cfg, _, _, imported = family
    raw = yaml.safe_load(imported.read_text())
    ours = yaml.safe_load(open(cfg.source).read())
    for key in ("architecture", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                "num_key_value_heads", "head_dim", "vocab_size", "rms_norm_eps", "rope_theta", "tie_word_embeddings",
                "sliding_window", "rope_local_base_freq", "query_pre_attn_scalar"):
        assert raw.get(key) == ours.get(key), key
    if cfg.architecture == "gemma3":
        assert raw["layer_types"] == list(cfg.layer_types) and raw["prefill_chunk_size"] <= cfg.sliding_window


LONG = pytest.mark.long  # CI time (docs/tests.md): the default run keeps each family's q4f32_1 and Gemma 3 whole


def _cases(long_ones: set[tuple[str, str]]) -> list:
    return [pytest.param(f, q, marks=LONG) if (f, q) in long_ones else (f, q) for f in FAMILIES for q in ("q0f32", "q4f32_1")]


@pytest.mark.parametrize("family, quant", _cases({("qwen2-tiny", "q0f32"), ("qwen3-tiny", "q0f32")}), indirect=["family"])
def test_family_matches_transformers(family, quant, tmp_path):
    _, root, model, imported = family
    _llvm_matches_transformers(root, model, imported, quant, tmp_path)


def test_gemma3_with_every_layer_sliding_matches_transformers(tmp_path):
    """A Gemma 3 with fewer layers than its pattern (transformers' default pattern 6 on a small
    test model) has no full-attention layer: TVM's KV cache needs one (config.cache_layer_kinds)."""
    tiny = load_model_config("gemma3-tiny")
    cfg = dataclasses.replace(tiny, layer_types=("sliding_attention",) * tiny.num_hidden_layers)
    model = transformers_checkpoint(tmp_path / "hf", cfg)
    imported = tmp_path / "model.yaml"
    done = mlcpipe("import-config", str(tmp_path / "hf"), "-o", str(imported), "--name", "gemma3-sliding")
    assert done.returncode == 0, done.stderr
    assert set(yaml.safe_load(imported.read_text())["layer_types"]) == {"sliding_attention"}
    _llvm_matches_transformers(tmp_path, model, imported, "q0f32", tmp_path)


def _llvm_matches_transformers(root, model, imported, quant: str, tmp_path) -> None:
    """convert-weights, build (llvm) and run the imported checkpoint: its logits at every step
    match transformers' (of the quantize-dequantized model for q4), and so do its tokens."""
    weights, art = tmp_path / "w", tmp_path / "art"
    for args in (("convert-weights", "--model", str(imported), "--quant", quant, "--source", str(root / "hf"), "--output", str(weights)),
                 ("build", "--model", str(imported), "--quant", quant, "--target", "llvm", "--output", str(art))):
        done = mlcpipe(*args)
        assert done.returncode == 0, done.stderr
    logits = tmp_path / "logits.npy"
    done = mlcpipe("run", "--artifact", str(art), "--weights", str(weights), "--prompt-tokens", ",".join(map(str, PROMPT)),
                   "--max-new-tokens", str(STEPS), "--save-logits", str(logits))
    assert done.returncode == 0, done.stderr
    got = np.load(logits)
    tokens = [int(t) for t in done.stdout.split()[-1].split(",")]
    want = reference_logits(reference_model(model, root, quant), PROMPT, tokens[:-1])
    errors = np.abs(got - want).max(axis=1) / np.abs(want).max(axis=1)
    assert errors.max() < TOLERANCE, errors
    assert tokens == [int(np.argmax(w)) for w in want]


# relative logit error allowed per WebGPU adapter (SwiftShader's exp / sin approximations: docs/webgpu.md)
WEBGPU_TOLERANCE = {"gles": TOLERANCE, "swiftshader": 2e-3}


@pytest.mark.dawn
@pytest.mark.parametrize("family, quant", _cases({(f, q) for f in FAMILIES for q in ("q0f32", "q4f32_1")} - {("gemma3-tiny", "q4f32_1")}),
                         indirect=["family"])
def test_family_matches_transformers_on_webgpu(family, quant, tmp_path):
    """The webgpu build of each family, run whole in Dawn on both software adapters (Gemma 3's
    sliding layers need the fixed web runtime: backends/webgpu.py RUNTIME_PATCHES)."""
    cfg, root, model, imported = family
    weights, art = tmp_path / "w", tmp_path / "art"
    for args in (("convert-weights", "--model", str(imported), "--quant", quant, "--source", str(root / "hf"), "--output", str(weights)),
                 ("build", "--model", str(imported), "--quant", quant, "--target", "webgpu", "--output", str(art))):
        done = mlcpipe(*args)
        assert done.returncode == 0, done.stderr
    reference = reference_model(model, root, quant)
    for adapter, tolerance in WEBGPU_TOLERANCE.items():
        logits = tmp_path / f"logits-{adapter}.npy"
        done = mlcpipe("run", "--artifact", str(art), "--weights", str(weights), "--prompt-tokens", ",".join(map(str, PROMPT)),
                       "--max-new-tokens", str(STEPS), "--save-logits", str(logits), "--adapter", adapter)
        assert done.returncode == 0, done.stderr
        tokens = [int(t) for t in done.stdout.split()[-1].split(",")]
        want = reference_logits(reference, PROMPT, tokens[:-1])
        errors = np.abs(np.load(logits) - want).max(axis=1) / np.abs(want).max(axis=1)
        assert errors.max() < tolerance, (adapter, errors)


def test_gemma3_test_sees_the_window_and_the_local_theta(tmp_path):
    """The comparison above fails for a Gemma 3 whose window or local rope theta is off: the
    tiny model's prompt reaches beyond the window, so both matter."""
    cfg = load_model_config("gemma3-tiny")
    right = reference_logits(transformers_checkpoint(tmp_path / "a", cfg), PROMPT, [5, 6])
    for wrong in ({"sliding_window": cfg.sliding_window * 2}, {"rope_local_base_freq": cfg.rope_theta}):
        other = reference_logits(transformers_checkpoint(tmp_path / "b", cfg, **wrong), PROMPT, [5, 6])
        assert (np.abs(other - right).max(axis=1) / np.abs(right).max(axis=1)).min() > 100 * TOLERANCE, wrong


def test_bad_checkpoints_are_one_line_and_write_nothing(family, tmp_path):
    import json
    import shutil

    cfg, root, _, imported = family
    hf = json.loads((root / "hf" / "config.json").read_text())

    def import_of(config: dict):
        src = tmp_path / f"src{len(list(tmp_path.iterdir()))}"
        src.mkdir()
        (src / "config.json").write_text(json.dumps(config))
        out = tmp_path / "out.yaml"
        done = mlcpipe("import-config", str(src), "-o", str(out))
        assert done.returncode == 2 and not out.exists() and len(done.stderr.strip().splitlines()) == 1, done.stderr
        return done.stderr.strip()

    assert ("architecture 'GPT2LMHeadModel' is not supported; supported (architectures / model_type): LlamaForCausalLM / llama, "
            in import_of({**hf, "architectures": ["GPT2LMHeadModel"]}))
    # was: "model_type 'gemma3' is not supported; supported: ..., Gemma3ForCausalLM", no word of why
    multimodal = {"model_type": "gemma3", "text_config": {**hf, "model_type": "gemma3_text"}}
    assert ("model_type 'gemma3' (a multimodal checkpoint; its text_config is model_type 'gemma3_text': only text-only "
            "checkpoints are read) is not supported") in import_of(multimodal)
    assert import_of({k: v for k, v in hf.items() if k != "intermediate_size"}).endswith("field 'intermediate_size' is missing")
    assert "field 'final_logit_softcapping': got 30.0; allowed: null" in import_of({**hf, "final_logit_softcapping": 30.0})
    existing = tmp_path / "mine.yaml"
    existing.write_text("keep")
    done = mlcpipe("import-config", str(root / "hf"), "-o", str(existing))
    assert done.returncode == 2 and existing.read_text() == "keep" and "it exists" in done.stderr
    # a checkpoint whose tensors disagree with its config (and with the YAML imported from that config)
    bad = tmp_path / "bad"
    shutil.copytree(root / "hf", bad)
    config = json.loads((bad / "config.json").read_text())
    (bad / "config.json").write_text(json.dumps({**config, "intermediate_size": 2 * config["intermediate_size"]}))
    done = mlcpipe("import-config", str(bad), "-o", str(tmp_path / "bad.yaml"))
    assert done.returncode == 0, done.stderr
    done = mlcpipe("convert-weights", "--model", str(tmp_path / "bad.yaml"), "--quant", "q0f32", "--source", str(bad),
                   "--output", str(tmp_path / "w"))
    assert done.returncode == 2 and not (tmp_path / "w").exists() and len(done.stderr.strip().splitlines()) == 1
    assert "mlp.gate_proj.weight' has shape" in done.stderr
    # and a checkpoint whose config disagrees with the YAML it is converted for
    done = mlcpipe("convert-weights", "--model", str(imported), "--quant", "q0f32", "--source", str(bad), "--output", str(tmp_path / "w"))
    assert done.returncode == 2 and not (tmp_path / "w").exists()
    assert f"field 'intermediate_size': got {2 * config['intermediate_size']}, but" in done.stderr

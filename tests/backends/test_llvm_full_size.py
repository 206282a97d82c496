"""The real Llama-3.2-1B config builds for llvm (no weights): fused kernels of the right shapes."""

from __future__ import annotations

import json

import pytest

from mlcpipe.backends.binfmt import Elf
from mlcpipe.build import build
from mlcpipe.config import load_model_config
from mlcpipe.targets import load_target
from mlcpipe.quantization import quantization

# role -> (out features N, in features K) for Llama-3.2-1B
SHAPES = {"qkv": (3072, 2048), "o_proj": (2048, 2048), "gate_up": (16384, 2048), "down": (2048, 8192), "lm_head": (128256, 2048)}


@pytest.mark.parametrize("quant", ["q4f16_1", pytest.param("q4f32_1", marks=pytest.mark.long), pytest.param("q0f16", marks=pytest.mark.long)])
def test_llama_3_2_1b_builds_for_llvm(quant, tmp_path):
    config = load_model_config("llama-3.2-1b")
    assert (config.hidden_size, config.intermediate_size, config.num_hidden_layers) == (2048, 8192, 16)
    assert (config.num_attention_heads, config.num_key_value_heads, config.head_dim, config.vocab_size) == (32, 8, 64, 128256)
    assert config.rope_scaling.as_dict() == {
        "rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
    }
    assert config.rope_theta == 500000 and config.rms_norm_eps == 1e-5 and config.tie_word_embeddings

    art = build(config, quantization(quant), load_target("llvm"), output=tmp_path / "art", log=lambda *_: None)
    manifest = json.loads((art / "manifest.json").read_text())
    assert (art / "lib.so").stat().st_size > 100_000
    linear = [k for k in manifest["kernels"] if k["role"] in SHAPES]
    assert {k["role"] for k in linear} == set(SHAPES)
    # each kernel's body is its own noalias compute function, as when it is compiled alone
    functions = {s.name for s in Elf((art / "lib.so").read_bytes()).functions()}
    assert all(f"{k['name']}_compute_" in functions for k in linear), sorted(f for f in functions if f.endswith("_compute_"))
    for kernel in linear:
        n, k = SHAPES[kernel["role"]]
        if quant.startswith("q4"):
            assert kernel["name"].startswith("fused_dequantize") and "_NT_matmul" in kernel["name"], kernel["name"]
            q_weight, q_scale = kernel["args"][0], kernel["args"][1]
            assert q_weight == {"shape": [n, k // 8], "dtype": "uint32"}
            assert q_scale["shape"] == [n, k // 32]
        else:
            assert "NT_matmul" in kernel["name"] and "dequantize" not in kernel["name"]
        if kernel["role"] in ("o_proj", "down"):
            assert "_add" in kernel["name"], f"{kernel['name']}: residual add not fused"
    params = {p["name"]: p for p in manifest["parameters"]}
    if quant == "q4f16_1":
        assert params["model.embed_tokens.q_weight"] == {"name": "model.embed_tokens.q_weight", "shape": [128256, 256], "dtype": "uint32"}
        assert params["model.embed_tokens.q_scale"]["dtype"] == "float16"
        assert len(params) == 2 + 16 * (4 * 2 + 2) + 1

"""Tiny Hugging Face-layout Llama checkpoints (random weights), written by the tests themselves."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from safetensors.numpy import save_file

from mlcpipe.config import ModelConfig


def hf_config(cfg: ModelConfig) -> dict:
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": cfg.hidden_size,
        "intermediate_size": cfg.intermediate_size,
        "num_hidden_layers": cfg.num_hidden_layers,
        "num_attention_heads": cfg.num_attention_heads,
        "num_key_value_heads": cfg.num_key_value_heads,
        "head_dim": cfg.head_dim,
        "vocab_size": cfg.vocab_size,
        "rms_norm_eps": cfg.rms_norm_eps,
        "rope_theta": cfg.rope_theta,
        "rope_scaling": cfg.rope_scaling.as_dict() if cfg.rope_scaling else None,
        "tie_word_embeddings": cfg.tie_word_embeddings,
        "max_position_embeddings": 131072,
        "torch_dtype": "float32",
    }


def random_hf_weights(cfg: ModelConfig, seed: int = 0, untied: bool | None = None) -> dict[str, np.ndarray]:
    """Weights scaled so activations stay O(1) and logits are well separated."""
    rng = np.random.default_rng(seed)
    h, inter, d = cfg.hidden_size, cfg.intermediate_size, cfg.head_dim
    hq, hkv = cfg.num_attention_heads, cfg.num_key_value_heads

    def mat(out_f, in_f, gain=1.0):
        return (rng.standard_normal((out_f, in_f)) * gain / np.sqrt(in_f)).astype(np.float32)

    w = {"model.embed_tokens.weight": (rng.standard_normal((cfg.vocab_size, h))).astype(np.float32)}
    for i in range(cfg.num_hidden_layers):
        p = f"model.layers.{i}"
        w[f"{p}.self_attn.q_proj.weight"] = mat(hq * d, h, 2.0)
        w[f"{p}.self_attn.k_proj.weight"] = mat(hkv * d, h, 2.0)
        w[f"{p}.self_attn.v_proj.weight"] = mat(hkv * d, h)
        w[f"{p}.self_attn.o_proj.weight"] = mat(h, hq * d)
        w[f"{p}.mlp.gate_proj.weight"] = mat(inter, h)
        w[f"{p}.mlp.up_proj.weight"] = mat(inter, h)
        w[f"{p}.mlp.down_proj.weight"] = mat(h, inter)
        w[f"{p}.input_layernorm.weight"] = (1 + 0.1 * rng.standard_normal(h)).astype(np.float32)
        w[f"{p}.post_attention_layernorm.weight"] = (1 + 0.1 * rng.standard_normal(h)).astype(np.float32)
    w["model.norm.weight"] = (1 + 0.1 * rng.standard_normal(h)).astype(np.float32)
    if untied if untied is not None else not cfg.tie_word_embeddings:
        w["lm_head.weight"] = mat(cfg.vocab_size, h, 4.0)
    return w


def write_hf_checkpoint(
    path: Path, cfg: ModelConfig, weights: dict[str, np.ndarray], shards: int = 1, dtype=np.float32
) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    config = hf_config(cfg)
    config["tie_word_embeddings"] = "lm_head.weight" not in weights
    (path / "config.json").write_text(json.dumps(config, indent=2))
    names = list(weights)
    per = -(-len(names) // shards)
    index = {}
    for s in range(shards):
        part = {
            n: weights[n].astype(dtype) if weights[n].dtype.kind == "f" else weights[n]
            for n in names[s * per : (s + 1) * per]
        }
        file = "model.safetensors" if shards == 1 else f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
        save_file(part, str(path / file))
        index.update({n: file for n in part})
    if shards > 1:
        (path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": index}))
    return path


TINY_SPECIAL_TOKENS = ("<pad>", "<s>", "</s>")  # ids 0, 1, 2: llama-tiny's pad / bos / eos


def write_tiny_tokenizer(path: Path, cfg: ModelConfig) -> Path:
    """A byte-level BPE tokenizer.json (Llama 3's kind: ByteLevel pre-tokenizer and decoder) with
    the special tokens at 0, 1, 2 and one token per byte after them, plus tokenizer_config.json."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    vocab = {token: i for i, token in enumerate(TINY_SPECIAL_TOKENS)}
    for char in sorted(pre_tokenizers.ByteLevel.alphabet()):
        vocab[char] = len(vocab)
    assert len(vocab) <= cfg.vocab_size, (len(vocab), cfg.vocab_size)
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens(list(TINY_SPECIAL_TOKENS))
    path.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(path / "tokenizer.json"))
    (path / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "pad_token": "<pad>", "bos_token": "<s>", "eos_token": "</s>",
        "model_max_length": cfg.context_window_size,
    }, indent=2))
    return path


def write_word_tokenizer(path: Path, cfg: ModelConfig) -> Path:
    """A word-level tokenizer.json: `<pad>`, `<s>`, `</s>` at 0, 1, 2 and the word `w<i>` for every
    other id, split on whitespace, so "w5 w17" encodes to [5, 17] and a decode names each id."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {token: i for i, token in enumerate(TINY_SPECIAL_TOKENS)}
    vocab.update({f"w{i}": i for i in range(len(vocab), cfg.vocab_size)})
    tokenizer = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<pad>"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer.add_special_tokens(list(TINY_SPECIAL_TOKENS))
    path.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(path / "tokenizer.json"))
    return path


def transformers_checkpoint(path: Path, cfg: ModelConfig, seed: int = 0, **overrides):
    """A random checkpoint of `cfg`'s family written by transformers itself (`from_config` +
    `save_pretrained`, float32); returns the transformers model. Matrices N(0, 1/in); norm
    weights with an effective scale near 1 (Gemma's stored near 0); biases N(0, 0.1).
    `overrides`: config fields changed on the transformers side only (a test's wrong model)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from mlcpipe.hf_config import transformers_fields

    model_type, fields = transformers_fields(cfg)
    config = AutoConfig.for_model(model_type, **{**fields, **overrides})
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config).float().eval()
    gemma = cfg.architecture == "gemma3"
    with torch.no_grad():
        for name, param in model.named_parameters():
            if param.ndim == 1:
                center = 0.0 if gemma or name.endswith(".bias") else 1.0
                param.copy_(center + 0.1 * torch.randn_like(param))
            else:
                param.copy_(torch.randn_like(param) / param.shape[-1] ** 0.5)
    model.save_pretrained(path)
    return model

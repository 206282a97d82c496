"""Which Hugging Face tensors make each logical parameter of every architecture (fused ones are
concatenated along axis 0; `offset` is added to the values: Gemma's norms multiply by 1 + w, so
1 + w is stored). NumPy side: the weight converter and synthetic weights read these."""

from __future__ import annotations

import dataclasses

from ..config import ModelConfig


@dataclasses.dataclass(frozen=True)
class WeightSource:
    name: str  # logical parameter of our model, e.g. model.layers.0.self_attn.qkv_proj.weight
    hf_names: tuple[str, ...]  # concatenated along axis 0, in this order
    hf_shapes: tuple[tuple[int, ...], ...]
    offset: float = 0.0  # added to the checkpoint's values (Gemma's 1 + w norms)


def _one(name: str, shape: tuple[int, ...], offset: float = 0.0) -> WeightSource:
    return WeightSource(name, (name,), (shape,), offset)


def decoder_hf_sources(cfg: ModelConfig) -> list[WeightSource]:
    """Every architecture's map: the Llama layout, plus q/k/v biases (qkv_bias), q/k norms
    (qk_norm) and Gemma 3's sandwich norms, its norms stored as 1 + w."""
    h, inter, d = cfg.hidden_size, cfg.intermediate_size, cfg.head_dim
    q_out, kv_out = cfg.num_attention_heads * d, cfg.num_key_value_heads * d
    gemma = cfg.architecture == "gemma3"
    norm = 1.0 if gemma else 0.0
    out = [_one("model.embed_tokens.weight", (cfg.vocab_size, h))]
    for i in range(cfg.num_hidden_layers):
        p = f"model.layers.{i}"
        out.append(WeightSource(f"{p}.self_attn.qkv_proj.weight", tuple(f"{p}.self_attn.{x}_proj.weight" for x in "qkv"),
                                ((q_out, h), (kv_out, h), (kv_out, h))))
        if cfg.qkv_bias:
            out.append(WeightSource(f"{p}.self_attn.qkv_proj.bias", tuple(f"{p}.self_attn.{x}_proj.bias" for x in "qkv"),
                                    ((q_out,), (kv_out,), (kv_out,))))
        if cfg.qk_norm:
            out += [_one(f"{p}.self_attn.q_norm.weight", (d,), norm), _one(f"{p}.self_attn.k_norm.weight", (d,), norm)]
        out += [
            _one(f"{p}.self_attn.o_proj.weight", (h, q_out)),
            WeightSource(f"{p}.mlp.gate_up_proj.weight", (f"{p}.mlp.gate_proj.weight", f"{p}.mlp.up_proj.weight"),
                         ((inter, h), (inter, h))),
            _one(f"{p}.mlp.down_proj.weight", (h, inter)),
            _one(f"{p}.input_layernorm.weight", (h,), norm),
            _one(f"{p}.post_attention_layernorm.weight", (h,), norm),
        ]
        if gemma:
            out += [_one(f"{p}.pre_feedforward_layernorm.weight", (h,), norm),
                    _one(f"{p}.post_feedforward_layernorm.weight", (h,), norm)]
    out.append(_one("model.norm.weight", (h,), norm))
    if not cfg.tie_word_embeddings:
        out.append(_one("lm_head.weight", (cfg.vocab_size, h)))
    return out

"""Which Hugging Face tensors make each logical Llama parameter (fused ones are concatenated)."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # annotations only (see llama.py)
    from ..config import ModelConfig


@dataclasses.dataclass(frozen=True)
class WeightSource:
    name: str  # logical parameter of our model, e.g. model.layers.0.self_attn.qkv_proj.weight
    hf_names: tuple[str, ...]  # concatenated along axis 0, in this order
    hf_shapes: tuple[tuple[int, ...], ...]


def llama_hf_sources(cfg: ModelConfig) -> list[WeightSource]:
    h, inter, d = cfg.hidden_size, cfg.intermediate_size, cfg.head_dim
    q_out, kv_out = cfg.num_attention_heads * d, cfg.num_key_value_heads * d
    out = [WeightSource("model.embed_tokens.weight", ("model.embed_tokens.weight",), ((cfg.vocab_size, h),))]
    for i in range(cfg.num_hidden_layers):
        hf, ours = f"model.layers.{i}", f"model.layers.{i}"
        out += [
            WeightSource(
                f"{ours}.self_attn.qkv_proj.weight",
                tuple(f"{hf}.self_attn.{p}_proj.weight" for p in "qkv"),
                ((q_out, h), (kv_out, h), (kv_out, h)),
            ),
            WeightSource(f"{ours}.self_attn.o_proj.weight", (f"{hf}.self_attn.o_proj.weight",), ((h, q_out),)),
            WeightSource(
                f"{ours}.mlp.gate_up_proj.weight",
                (f"{hf}.mlp.gate_proj.weight", f"{hf}.mlp.up_proj.weight"),
                ((inter, h), (inter, h)),
            ),
            WeightSource(f"{ours}.mlp.down_proj.weight", (f"{hf}.mlp.down_proj.weight",), ((h, inter),)),
            WeightSource(f"{ours}.input_layernorm.weight", (f"{hf}.input_layernorm.weight",), ((h,),)),
            WeightSource(
                f"{ours}.post_attention_layernorm.weight",
                (f"{hf}.post_attention_layernorm.weight",),
                ((h,),),
            ),
        ]
    out.append(WeightSource("model.norm.weight", ("model.norm.weight",), ((h,),)))
    if not cfg.tie_word_embeddings:
        out.append(WeightSource("lm_head.weight", ("lm_head.weight",), ((cfg.vocab_size, h),)))
    return out

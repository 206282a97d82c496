"""Gemma 3 (text): sliding-window layers interleaved with global ones (config.layer_types; the
KV cache keeps `sliding_window` keys for the sliding layers), rope applied in the model with the
theta of each layer's kind (rope_local_base_freq on sliding layers, rope_theta on global ones:
the cache takes one theta, so it is made with RopeMode.NONE), q/k RMSNorm over head_dim, RMSNorm
before and after both attention and MLP, GeGLU (tanh gelu), embeddings scaled by sqrt(hidden),
attention scaled by query_pre_attn_scalar^-0.5. Gemma's norms multiply by (1 + w): the weight
converter stores 1 + w (pipeline/model/gemma3_weights.py), so the norms here are plain RMSNorm.
"""

from __future__ import annotations

import math

from tvm.relax.frontend import nn
from tvm.relax.frontend.nn.llm.kv_cache import PagedKVCache
from tvm.target import Target

from ..config import ModelConfig
from .decoder import Attention, CausalLM, GatedMLP, rms_norm
from .llama import LlamaModel


class Gemma3DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, dtype: str, layer_id: int):
        theta = cfg.rope_local_base_freq if cfg.layer_is_sliding(layer_id) else cfg.rope_theta
        self.self_attn = Attention(cfg, dtype, rope_theta=theta)
        self.mlp = GatedMLP(cfg, dtype)
        self.input_layernorm = rms_norm(cfg, dtype)
        self.post_attention_layernorm = rms_norm(cfg, dtype)
        self.pre_feedforward_layernorm = rms_norm(cfg, dtype)
        self.post_feedforward_layernorm = rms_norm(cfg, dtype)

    def forward(self, hidden: nn.Tensor, kv_cache: PagedKVCache, layer_id: int) -> nn.Tensor:
        attn = self.self_attn(self.input_layernorm(hidden), kv_cache, layer_id)
        hidden = self.post_attention_layernorm(attn) + hidden
        return self.post_feedforward_layernorm(self.mlp(self.pre_feedforward_layernorm(hidden))) + hidden


class Gemma3ForCausalLM(CausalLM):
    rope_in_model = True

    def __init__(self, cfg: ModelConfig, dtype: str, target: Target):
        layers = iter(range(cfg.num_hidden_layers))
        model = LlamaModel(cfg, dtype, layer=lambda c, d: Gemma3DecoderLayer(c, d, next(layers)))
        super().__init__(cfg, dtype, target, model)
        self.embed_scale = math.sqrt(cfg.hidden_size)

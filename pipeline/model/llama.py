"""Llama (also SmolLM2, Mistral) in `tvm.relax.frontend.nn`, with a TIR paged KV cache: pre-norm
decoder layers, rope in the cache. q/k/v and gate/up are fused projections (`qkv_proj`,
`gate_up_proj`); parameter names follow MLC-LLM's Llama. Shared parts: decoder.py; more:
docs/model.md.
"""

from __future__ import annotations

from tvm.relax.frontend import nn
from tvm.relax.frontend.nn.llm.kv_cache import PagedKVCache
from tvm.target import Target

from ..config import ModelConfig
from .decoder import Attention, CausalLM, GatedMLP, rms_norm
from .layers import Embedding


class LlamaDecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, dtype: str):
        self.self_attn = Attention(cfg, dtype)
        self.mlp = GatedMLP(cfg, dtype)
        self.input_layernorm = rms_norm(cfg, dtype)
        self.post_attention_layernorm = rms_norm(cfg, dtype)

    def forward(self, hidden: nn.Tensor, kv_cache: PagedKVCache, layer_id: int) -> nn.Tensor:
        hidden = self.self_attn(self.input_layernorm(hidden), kv_cache, layer_id) + hidden
        return self.mlp(self.post_attention_layernorm(hidden)) + hidden


class LlamaModel(nn.Module):
    def __init__(self, cfg: ModelConfig, dtype: str, layer=LlamaDecoderLayer):
        self.embed_tokens = Embedding(cfg.vocab_size, cfg.hidden_size, dtype)
        self.layers = nn.ModuleList([layer(cfg, dtype) for _ in range(cfg.num_hidden_layers)])
        self.norm = rms_norm(cfg, dtype)

    def forward(self, hidden: nn.Tensor, kv_cache: PagedKVCache) -> nn.Tensor:
        for layer_id, layer in enumerate(self.layers):
            hidden = layer(hidden, kv_cache, layer_id)
        return self.norm(hidden)


class LlamaForCausalLM(CausalLM):
    def __init__(self, cfg: ModelConfig, dtype: str, target: Target):
        super().__init__(cfg, dtype, target, LlamaModel(cfg, dtype))

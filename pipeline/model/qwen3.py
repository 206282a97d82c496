"""Qwen3: the Llama decoder with RMSNorm over head_dim on every q and k head before rope
(`q_norm`, `k_norm`; config.qk_norm), no biases, head_dim given by the config (128 for 0.6B,
where hidden / heads is 64)."""

from __future__ import annotations

from .llama import LlamaForCausalLM


class Qwen3ForCausalLM(LlamaForCausalLM):
    """Parameter names as MLC-LLM's Qwen3 (`self_attn.q_norm.weight`, `self_attn.k_norm.weight`)."""

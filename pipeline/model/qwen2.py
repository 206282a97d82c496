"""Qwen2 / Qwen2.5: the Llama decoder with biases on the q/k/v projections (config.qkv_bias);
rope theta 1e6 in the published configs, tied embeddings in the small ones."""

from __future__ import annotations

from .llama import LlamaForCausalLM


class Qwen2ForCausalLM(LlamaForCausalLM):
    """Parameter names as MLC-LLM's Qwen2 (`qkv_proj.bias` the concatenated q/k/v biases)."""

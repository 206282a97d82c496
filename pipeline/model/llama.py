"""Llama decoder in `tvm.relax.frontend.nn`, with a TIR paged KV cache.

Exports what MLC-LLM's runtime and WebLLM drive, parameters packed into one tuple argument (the
last): `embed`, `prefill` / `decode` (one sequence), `batch_prefill` / `batch_decode` /
`batch_verify` (MLC-LLM's signatures; they run prefill's kernels, the KV cache splitting the rows
between sequences) and `create_paged_kv_cache`. q/k/v and gate/up are fused projections
(`qkv_proj`, `gate_up_proj`); parameter names follow MLC-LLM's Llama. More: docs/model.md.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tvm import relax as rx
from tvm import te, tirx
from tvm.relax.frontend import nn
from tvm.relax.frontend.nn import op
from tvm.relax.frontend.nn.llm.kv_cache import PagedKVCache, RopeMode, TIRPagedKVCache
from tvm.target import Target

from .layers import Embedding, Linear

if TYPE_CHECKING:  # annotations only: config validates quantizations, which build on these layers
    from ..config import ModelConfig


class LlamaAttention(nn.Module):
    def __init__(self, cfg: ModelConfig, dtype: str):
        self.num_q_heads = cfg.num_attention_heads
        self.num_kv_heads = cfg.num_key_value_heads
        self.head_dim = cfg.head_dim
        qkv_out = (self.num_q_heads + 2 * self.num_kv_heads) * self.head_dim
        self.qkv_proj = Linear(cfg.hidden_size, qkv_out, dtype)
        self.o_proj = Linear(self.num_q_heads * self.head_dim, cfg.hidden_size, dtype)

    def forward(self, x: nn.Tensor, kv_cache: PagedKVCache, layer_id: int) -> nn.Tensor:
        b, s, _ = x.shape
        qkv = op.reshape(self.qkv_proj(x), (b, s, self.num_q_heads + 2 * self.num_kv_heads, self.head_dim))
        out = kv_cache.attention_with_fused_qkv(
            layer_id, qkv, self.num_q_heads, sm_scale=self.head_dim**-0.5
        )
        return self.o_proj(op.reshape(out, (b, s, self.num_q_heads * self.head_dim)))


class LlamaMLP(nn.Module):
    def __init__(self, cfg: ModelConfig, dtype: str):
        self.gate_up_proj = Linear(cfg.hidden_size, 2 * cfg.intermediate_size, dtype)
        self.down_proj = Linear(cfg.intermediate_size, cfg.hidden_size, dtype)

    def forward(self, x: nn.Tensor) -> nn.Tensor:
        gate, up = op.split(self.gate_up_proj(x), 2, axis=-1)
        return self.down_proj(op.silu(gate) * up)


class LlamaDecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, dtype: str):
        self.self_attn = LlamaAttention(cfg, dtype)
        self.mlp = LlamaMLP(cfg, dtype)
        self.input_layernorm = nn.RMSNorm(cfg.hidden_size, -1, cfg.rms_norm_eps, bias=False, dtype=dtype)
        self.post_attention_layernorm = nn.RMSNorm(
            cfg.hidden_size, -1, cfg.rms_norm_eps, bias=False, dtype=dtype
        )

    def forward(self, hidden: nn.Tensor, kv_cache: PagedKVCache, layer_id: int) -> nn.Tensor:
        hidden = self.self_attn(self.input_layernorm(hidden), kv_cache, layer_id) + hidden
        return self.mlp(self.post_attention_layernorm(hidden)) + hidden


class LlamaModel(nn.Module):
    def __init__(self, cfg: ModelConfig, dtype: str):
        self.embed_tokens = Embedding(cfg.vocab_size, cfg.hidden_size, dtype)
        self.layers = nn.ModuleList([LlamaDecoderLayer(cfg, dtype) for _ in range(cfg.num_hidden_layers)])
        self.norm = nn.RMSNorm(cfg.hidden_size, -1, cfg.rms_norm_eps, bias=False, dtype=dtype)

    def forward(self, hidden: nn.Tensor, kv_cache: PagedKVCache) -> nn.Tensor:
        for layer_id, layer in enumerate(self.layers):
            hidden = layer(hidden, kv_cache, layer_id)
        return self.norm(hidden)


class LlamaForCausalLM(nn.Module):
    def __init__(self, cfg: ModelConfig, dtype: str, target: Target):
        self.cfg, self.dtype, self.target = cfg, dtype, target
        self.model = LlamaModel(cfg, dtype)
        self.tie_word_embeddings = cfg.tie_word_embeddings
        if not cfg.tie_word_embeddings:
            self.lm_head = Linear(cfg.hidden_size, cfg.vocab_size, dtype)

    def _logits(self, hidden: nn.Tensor) -> nn.Tensor:
        if self.tie_word_embeddings:
            return self.model.embed_tokens.lm_head_forward(hidden)
        logits = self.lm_head(hidden)
        return logits if logits.dtype == "float32" else logits.astype("float32")

    def embed(self, input_ids: nn.Tensor) -> nn.Tensor:
        return self.model.embed_tokens(input_ids)

    def prefill(self, input_embed: nn.Tensor, paged_kv_cache: PagedKVCache):
        hidden = self.model(input_embed, paged_kv_cache)

        def _last_token(x: te.Tensor) -> te.Tensor:
            b, s, d = x.shape
            return te.compute((b, 1, d), lambda i, _, k: x[i, s - 1, k], name="index")

        hidden = op.tensor_expr_op(_last_token, name_hint="index", args=[hidden])
        return self._logits(hidden), paged_kv_cache

    def decode(self, input_embed: nn.Tensor, paged_kv_cache: PagedKVCache):
        return self._logits(self.model(input_embed, paged_kv_cache)), paged_kv_cache

    def batch_prefill(self, input_embeds: nn.Tensor, logit_positions: nn.Tensor, paged_kv_cache: PagedKVCache):
        """Sequences' tokens concatenated in `input_embeds` (1, seq_len, hidden); logits (1,
        batch_size, vocab) of the rows at `logit_positions` (each sequence's last token)."""
        hidden = self.model(input_embeds, paged_kv_cache)

        def _gather(x: te.Tensor, positions: te.Tensor) -> te.Tensor:
            b, s, d = x.shape
            zero = tirx.IntImm("int64", 0)
            row = lambda j: tirx.Max(tirx.Min(positions[j].astype("int64"), s - 1), zero)  # never out of bounds
            return te.compute((b, positions.shape[0], d), lambda i, j, k: x[i, row(j), k], name="gather_hidden")

        hidden = op.tensor_expr_op(_gather, name_hint="gather_hidden", args=[hidden, logit_positions])
        return self._logits(hidden), paged_kv_cache

    def batch_decode(self, input_embeds: nn.Tensor, paged_kv_cache: PagedKVCache):
        """One token per sequence: (batch_size, 1, hidden) -> logits (batch_size, 1, vocab), the
        sequences as the rows of one (1, batch_size, hidden) activation."""
        batch_size, _, hidden = input_embeds.shape
        logits = self._logits(self.model(op.reshape(input_embeds, (1, batch_size, hidden)), paged_kv_cache))
        return op.reshape(logits, (batch_size, 1, logits.shape[-1])), paged_kv_cache

    def batch_verify(self, input_embeds: nn.Tensor, paged_kv_cache: PagedKVCache):
        """Draft tokens of the sequences concatenated: logits of every row (1, seq_len, vocab)."""
        return self._logits(self.model(input_embeds, paged_kv_cache)), paged_kv_cache

    def create_paged_kv_cache(  # pylint: disable=too-many-arguments
        self,
        max_batch_size: tirx.Var,
        max_total_seq_len: tirx.Var,
        prefill_chunk_size: tirx.Var,
        page_size: tirx.Var,
        support_sliding_window: tirx.Var,
    ) -> PagedKVCache:
        cfg = self.cfg
        return TIRPagedKVCache(
            attn_kind="mha",
            max_batch_size=max_batch_size,
            max_total_seq_len=max_total_seq_len,
            prefill_chunk_size=prefill_chunk_size,
            page_size=page_size,
            support_sliding_window=support_sliding_window,
            layer_partition=rx.ShapeExpr([0, cfg.num_hidden_layers]),
            num_hidden_layers=cfg.num_hidden_layers,
            num_attention_heads=cfg.num_attention_heads,
            num_key_value_heads=cfg.num_key_value_heads,
            qk_head_dim=cfg.head_dim,
            v_head_dim=cfg.head_dim,
            mla_original_qk_head_dim=0,
            mla_original_v_head_dim=0,
            rope_mode=RopeMode.NORMAL,
            rope_scale=1,
            rope_theta=cfg.rope_theta,
            rope_scaling=cfg.rope_scaling.as_dict() if cfg.rope_scaling else {},
            rope_ext_factors=rx.prim_value(0),
            rotary_dim=cfg.head_dim,
            enable_disaggregation=False,
            dtype=self.dtype,
            target=self.target,
        )

    def get_default_spec(self):
        hidden, dtype = self.cfg.hidden_size, self.dtype
        packed = {"param_mode": "packed", "effect_mode": "none"}
        return nn.spec.ModuleSpec.from_raw(
            {
                "embed": {"input_ids": nn.spec.Tensor(["seq_len"], "int32"), "$": packed},
                "prefill": {
                    "input_embed": nn.spec.Tensor([1, "seq_len", hidden], dtype),
                    "paged_kv_cache": nn.spec.Object(object_type=PagedKVCache),
                    "$": packed,
                },
                "decode": {
                    "input_embed": nn.spec.Tensor([1, 1, hidden], dtype),
                    "paged_kv_cache": nn.spec.Object(object_type=PagedKVCache),
                    "$": packed,
                },
                "batch_prefill": {
                    "input_embeds": nn.spec.Tensor([1, "seq_len", hidden], dtype),
                    "logit_positions": nn.spec.Tensor(["batch_size"], "int32"),
                    "paged_kv_cache": nn.spec.Object(object_type=PagedKVCache),
                    "$": packed,
                },
                "batch_decode": {
                    "input_embeds": nn.spec.Tensor(["batch_size", 1, hidden], dtype),
                    "paged_kv_cache": nn.spec.Object(object_type=PagedKVCache),
                    "$": packed,
                },
                "batch_verify": {
                    "input_embeds": nn.spec.Tensor([1, "seq_len", hidden], dtype),
                    "paged_kv_cache": nn.spec.Object(object_type=PagedKVCache),
                    "$": packed,
                },
                "create_paged_kv_cache": {
                    "max_batch_size": int,
                    "max_total_seq_len": int,
                    "prefill_chunk_size": int,
                    "page_size": int,
                    "support_sliding_window": int,
                    "$": {"param_mode": "none", "effect_mode": "none"},
                },
            },
            self,
        )

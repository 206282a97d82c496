"""What the decoder families share (llama.py, qwen2.py, qwen3.py, gemma3.py): attention on the paged KV
cache (q/k/v fused, optional q/k RMSNorm over head_dim, rope in the cache or, where layers differ in
rope theta, in the model), the gated MLP, and the causal LM's exported functions: `embed`,
`prefill` / `decode` (one sequence), `batch_prefill` / `batch_decode` / `batch_verify` (MLC-LLM's
signatures) and `create_paged_kv_cache`, parameters packed into one tuple argument (the last).
"""

from __future__ import annotations

from tvm import relax as rx
from tvm import te, tirx
from tvm.relax.frontend import nn
from tvm.relax.frontend.nn import op
from tvm.relax.frontend.nn.llm.kv_cache import PagedKVCache, RopeMode, TIRPagedKVCache
from tvm.target import Target

from ..config import ModelConfig, cache_layer_kinds
from .layers import Embedding, Linear


def rope_te(qkv: te.Tensor, positions: te.Tensor, theta: float, rotated_heads: int) -> te.Tensor:
    """Rotary embedding (HF's rotate_half form, default rope type) of the first `rotated_heads`
    heads of qkv (b, s, heads, d) at `positions` (b * s,), computed in float32."""
    _, s, _, d = qkv.shape
    half = d // 2

    def value(b, t, h, i):
        pos = positions[b * s + t].astype("float32")
        freq = pos / tirx.power(tirx.const(theta, "float32"), (i % half * 2).astype("float32") / tirx.const(int(d), "float32"))
        x = qkv[b, t, h, i].astype("float32")
        other = tirx.if_then_else(i < half, -qkv[b, t, h, tirx.min(i + half, d - 1)], qkv[b, t, h, tirx.max(i - half, 0)])
        other = other.astype("float32")
        rotated = (tirx.cos(freq) * x + tirx.sin(freq) * other).astype(qkv.dtype)
        return tirx.if_then_else(h < rotated_heads, rotated, qkv[b, t, h, i])

    return te.compute(qkv.shape, value, name="rope")


class Attention(nn.Module):
    """q/k/v (one fused projection, with bias for qkv_bias families), optional q/k RMSNorm over
    head_dim, attention in the paged KV cache, o_proj. With `rope_theta`, rope is applied here
    (the cache is made with RopeMode.NONE), else by the cache."""

    def __init__(self, cfg: ModelConfig, dtype: str, rope_theta: float | None = None):
        self.num_q_heads, self.num_kv_heads, self.head_dim = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        self.sm_scale, self.rope_theta = cfg.sm_scale, rope_theta
        qkv_out = (self.num_q_heads + 2 * self.num_kv_heads) * self.head_dim
        self.qkv_proj = Linear(cfg.hidden_size, qkv_out, dtype, bias=cfg.qkv_bias)
        self.o_proj = Linear(self.num_q_heads * self.head_dim, cfg.hidden_size, dtype)
        if cfg.qk_norm:
            self.q_norm = nn.RMSNorm(cfg.head_dim, -1, cfg.rms_norm_eps, bias=False, dtype=dtype)
            self.k_norm = nn.RMSNorm(cfg.head_dim, -1, cfg.rms_norm_eps, bias=False, dtype=dtype)
        else:
            self.q_norm = self.k_norm = None

    def forward(self, x: nn.Tensor, kv_cache: PagedKVCache, layer_id: int) -> nn.Tensor:
        b, s, _ = x.shape
        hq, hkv = self.num_q_heads, self.num_kv_heads
        qkv = op.reshape(self.qkv_proj(x), (b, s, hq + 2 * hkv, self.head_dim))
        if self.q_norm is not None:
            q, k, v = op.split(qkv, [hq, hq + hkv], axis=2)
            qkv = op.concat([self.q_norm(q), self.k_norm(k), v], dim=2)
        if self.rope_theta is not None:
            positions = kv_cache.get_query_positions(b * s)
            theta = self.rope_theta
            qkv = op.tensor_expr_op(lambda t, p: rope_te(t, p, theta, hq + hkv), "rope", [qkv, positions])
        out = kv_cache.attention_with_fused_qkv(layer_id, qkv, hq, sm_scale=self.sm_scale)
        return self.o_proj(op.reshape(out, (b, s, hq * self.head_dim)))


class GatedMLP(nn.Module):
    """down(act(gate(x)) * up(x)), gate and up fused; act silu or tanh-approximated gelu."""

    def __init__(self, cfg: ModelConfig, dtype: str):
        self.gate_up_proj = Linear(cfg.hidden_size, 2 * cfg.intermediate_size, dtype)
        self.down_proj = Linear(cfg.intermediate_size, cfg.hidden_size, dtype)
        self.activation = cfg.hidden_activation

    def forward(self, x: nn.Tensor) -> nn.Tensor:
        gate, up = op.split(self.gate_up_proj(x), 2, axis=-1)
        act = op.gelu(gate, approximate="tanh") if self.activation == "gelu_pytorch_tanh" else op.silu(gate)
        return self.down_proj(act * up)


def rms_norm(cfg: ModelConfig, dtype: str) -> nn.RMSNorm:
    return nn.RMSNorm(cfg.hidden_size, -1, cfg.rms_norm_eps, bias=False, dtype=dtype)


class CausalLM(nn.Module):
    """A decoder-only LM: `self.model` (embed_tokens, layers, norm; forward(hidden, kv_cache)), its
    logits (tied to the embedding table, or lm_head), and the functions MLC-LLM's runtime and
    WebLLM call. `embed_scale`: the embedding multiplier (Gemma's sqrt(hidden)); `rope_in_model`:
    the layers rotate q/k themselves (the cache is made with RopeMode.NONE)."""

    embed_scale: float | None = None
    rope_in_model = False

    def __init__(self, cfg: ModelConfig, dtype: str, target: Target, model: nn.Module):
        self.cfg, self.dtype, self.target = cfg, dtype, target
        self.model = model
        self.tie_word_embeddings = cfg.tie_word_embeddings
        if not cfg.tie_word_embeddings:
            self.lm_head = Linear(cfg.hidden_size, cfg.vocab_size, dtype)

    def _logits(self, hidden: nn.Tensor) -> nn.Tensor:
        if self.tie_word_embeddings:
            return self.model.embed_tokens.lm_head_forward(hidden)
        logits = self.lm_head(hidden)
        return logits if logits.dtype == "float32" else logits.astype("float32")

    def embed(self, input_ids: nn.Tensor) -> nn.Tensor:
        embeds = self.model.embed_tokens(input_ids)
        return embeds if self.embed_scale is None else embeds * self.embed_scale

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
        kinds = cache_layer_kinds(cfg.num_hidden_layers, cfg.layer_types)
        return TIRPagedKVCache(
            attn_kind=kinds if "mha_sliding" in kinds else "mha",
            max_batch_size=max_batch_size,
            max_total_seq_len=max_total_seq_len,
            prefill_chunk_size=prefill_chunk_size,
            page_size=page_size,
            support_sliding_window=support_sliding_window,
            layer_partition=rx.ShapeExpr([0, len(kinds)]),
            num_hidden_layers=len(kinds),
            num_attention_heads=cfg.num_attention_heads,
            num_key_value_heads=cfg.num_key_value_heads,
            qk_head_dim=cfg.head_dim,
            v_head_dim=cfg.head_dim,
            mla_original_qk_head_dim=0,
            mla_original_v_head_dim=0,
            rope_mode=RopeMode.NONE if self.rope_in_model else RopeMode.NORMAL,
            rope_scale=1,
            rope_theta=cfg.rope_theta,
            rope_scaling=cfg.rope_scaling.as_dict() if cfg.rope_scaling else {},
            rope_ext_factors=rx.prim_value(0),
            rotary_dim=cfg.head_dim,
            enable_disaggregation=False,
            dtype=self.dtype,
            target=self.target,
            **({"layer_sliding_window_size": cfg.sliding_window} if cfg.sliding_window else {}),
        )

    def get_default_spec(self):
        hidden, dtype = self.cfg.hidden_size, self.dtype
        packed = {"param_mode": "packed", "effect_mode": "none"}
        cache = nn.spec.Object(object_type=PagedKVCache)
        return nn.spec.ModuleSpec.from_raw(
            {
                "embed": {"input_ids": nn.spec.Tensor(["seq_len"], "int32"), "$": packed},
                "prefill": {"input_embed": nn.spec.Tensor([1, "seq_len", hidden], dtype), "paged_kv_cache": cache, "$": packed},
                "decode": {"input_embed": nn.spec.Tensor([1, 1, hidden], dtype), "paged_kv_cache": cache, "$": packed},
                "batch_prefill": {
                    "input_embeds": nn.spec.Tensor([1, "seq_len", hidden], dtype),
                    "logit_positions": nn.spec.Tensor(["batch_size"], "int32"),
                    "paged_kv_cache": cache,
                    "$": packed,
                },
                "batch_decode": {"input_embeds": nn.spec.Tensor(["batch_size", 1, hidden], dtype), "paged_kv_cache": cache, "$": packed},
                "batch_verify": {"input_embeds": nn.spec.Tensor([1, "seq_len", hidden], dtype), "paged_kv_cache": cache, "$": packed},
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


__all__ = ["Attention", "CausalLM", "Embedding", "GatedMLP", "rms_norm", "rope_te"]

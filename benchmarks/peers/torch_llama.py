"""PyTorch peer: an HF-style Llama forward written here (RMSNorm, RoPE with llama3 scaling,
GQA, SwiGLU, tied embeddings, static KV cache), in fp32, bf16, fp16, or int4 through
`torch._weight_int4pack_mm_for_cpu` on the CPU and `torch._weight_int4pack_mm` on CUDA (group 32,
bf16 activations), eager, on the CPU or a CUDA device.

The int4 weights are mlcpipe's own q4 group quantization of the same weights (q in 0..14,
w = (q - 7) * scale, group 32 along K): PyTorch's int4 kernels dequantize
w = (q - 8) * scale + zero, so zero = scale gives exactly the same matrix. q/k/v and gate/up
are concatenated into one matmul each (as mlcpipe does), which only saves PyTorch op overhead.
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F

MODES = ("fp32", "bf16", "fp16", "int4")
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16, "int4": torch.bfloat16}
GROUP = 32


def rope_inv_freq(head_dim: int, theta: float, scaling) -> torch.Tensor:
    """HF `_compute_llama3_parameters` (float64, then float32)."""
    inv = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
    if scaling is not None:
        factor, low, high = scaling.factor, scaling.low_freq_factor, scaling.high_freq_factor
        orig = scaling.original_max_position_embeddings
        low_wavelen, high_wavelen = orig / low, orig / high
        wavelen = 2 * math.pi / inv
        scaled = torch.where(wavelen > low_wavelen, inv / factor, inv)
        smooth = (orig / wavelen - low) / (high - low)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
        inv = torch.where(medium, smoothed, scaled)
    return inv.float()


def q4_values(weight: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """mlcpipe's q4f32_1 quantization (pipeline.quantization.group_quant.GroupQuantize
    .quantize_weight), unpacked: q int32 (N, K) in 0..14 and float32 scales (N, K/32)."""
    from mlcpipe.quantization import quantization

    q4 = quantization("q4f32_1")
    group, zero = q4.group_size, q4.zero_point
    out_f, in_f = weight.shape
    w = weight.astype(np.float32, copy=False).reshape(out_f, in_f // group, group)
    scale = np.maximum(np.abs(w).max(axis=-1) / np.float32(zero), np.finfo(np.float32).tiny).astype(np.float32)
    q = np.clip(np.round(w / scale[..., None]) + zero, 0, 2 * zero).astype(np.int32)
    return q.reshape(out_f, in_f), scale


class Int4Linear:
    """y = x @ W^T with W stored as PyTorch's int4 pack (group 32, bf16 scales/zeros): the CPU
    layout from int32 values, the CUDA one (tinygemm, 8 inner k-tiles) from two values a byte,
    the even column in the high nibble."""

    def __init__(self, weight: np.ndarray, dtype=torch.bfloat16, device: str = "cpu"):
        q, q_scale = q4_values(weight)
        q = torch.from_numpy(q)  # (N, K) int32, 0..14
        scale = torch.from_numpy(np.ascontiguousarray(q_scale.T)).to(dtype)  # (K/32, N)
        self.cuda = torch.device(device).type == "cuda"
        if self.cuda:
            pairs = (q[:, ::2] << 4 | q[:, 1::2]).to(torch.uint8)
            self.packed = torch._convert_weight_to_int4pack(pairs.to(device), 8)
        else:
            self.packed = torch._convert_weight_to_int4pack_for_cpu(q, 1)
        self.scales_zeros = torch.stack([scale, scale], dim=-1).contiguous().to(device)  # zero = scale
        self.nbytes = self.packed.numel() * self.packed.element_size() + self.scales_zeros.numel() * self.scales_zeros.element_size()

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        mm = torch._weight_int4pack_mm if self.cuda else torch._weight_int4pack_mm_for_cpu
        y = mm(x.reshape(-1, shape[-1]), self.packed, GROUP, self.scales_zeros)
        return y.reshape(*shape[:-1], y.shape[-1])


class DenseLinear:
    def __init__(self, weight: np.ndarray, dtype, device: str = "cpu"):
        self.weight = torch.from_numpy(weight).to(device=device, dtype=dtype).contiguous()
        self.nbytes = self.weight.numel() * self.weight.element_size()

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight)


class TorchLlama:
    """Batch 1, one sequence, static KV cache of `max_len` positions, on `device`."""

    def __init__(self, config, weights: dict[str, np.ndarray], mode: str = "fp32", max_len: int = 1024,
                 dtype: torch.dtype | None = None, device: str = "cpu"):
        """`dtype`: activation dtype (default: the mode's, DTYPES; bfloat16 for int4)."""
        if mode not in MODES:
            raise ValueError(f"mode {mode!r}: allowed {MODES}")
        self.cfg, self.mode, self.device = config, mode, torch.device(device)
        self.dtype = dtype or DTYPES[mode]
        c = config
        self.hq, self.hkv, self.d = c.num_attention_heads, c.num_key_value_heads, c.head_dim

        def linear(w: np.ndarray):
            return Int4Linear(w, self.dtype, device) if mode == "int4" else DenseLinear(w, self.dtype, device)

        def vec(name):
            return torch.from_numpy(weights[name]).to(device=device, dtype=self.dtype)

        self.layers = []
        for i in range(c.num_hidden_layers):
            p = f"model.layers.{i}"
            qkv = np.concatenate([weights.pop(f"{p}.self_attn.{x}_proj.weight") for x in "qkv"])
            gate_up = np.concatenate([weights.pop(f"{p}.mlp.gate_proj.weight"), weights.pop(f"{p}.mlp.up_proj.weight")])
            self.layers.append({
                "ln1": vec(f"{p}.input_layernorm.weight"),
                "ln2": vec(f"{p}.post_attention_layernorm.weight"),
                "qkv": linear(qkv),
                "o": linear(weights.pop(f"{p}.self_attn.o_proj.weight")),
                "gate_up": linear(gate_up),
                "down": linear(weights.pop(f"{p}.mlp.down_proj.weight")),
            })
        embed = weights.pop("model.embed_tokens.weight")
        head = weights.pop("lm_head.weight", None)
        if mode == "int4":  # the table holds q4 values, as mlcpipe's quantized embedding does
            q, scale = q4_values(embed)
            deq = (q.reshape(q.shape[0], -1, GROUP) - 7).astype(np.float32) * scale[..., None]
            self.embed = torch.from_numpy(deq.reshape(embed.shape)).to(device=device, dtype=self.dtype)
        else:
            self.embed = torch.from_numpy(embed).to(device=device, dtype=self.dtype)
        if head is None and mode != "int4":
            self.lm_head = DenseLinear.__new__(DenseLinear)  # tied: the same tensor
            self.lm_head.weight, self.lm_head.nbytes = self.embed, self.embed.numel() * self.embed.element_size()
        else:
            self.lm_head = linear(embed if head is None else head)
        self.norm = vec("model.norm.weight")
        self.eps = c.rms_norm_eps
        inv = rope_inv_freq(c.head_dim, c.rope_theta, c.rope_scaling)
        ang = torch.outer(torch.arange(max_len, dtype=torch.float32), inv)
        self.cos = torch.cat([ang.cos()] * 2, dim=-1).to(device=device, dtype=self.dtype)  # (max_len, d)
        self.sin = torch.cat([ang.sin()] * 2, dim=-1).to(device=device, dtype=self.dtype)
        shape = (c.num_hidden_layers, 1, self.hkv, max_len, self.d)
        self.k_cache = torch.zeros(shape, dtype=self.dtype, device=device)
        self.v_cache = torch.zeros(shape, dtype=self.dtype, device=device)
        self.max_len, self.pos = max_len, 0

    @property
    def weight_bytes_per_token(self) -> int:
        """Weight bytes one decode step reads (the embedding row aside)."""
        mats = sum(l[k].nbytes for l in self.layers for k in ("qkv", "o", "gate_up", "down"))
        vecs = sum(l[k].numel() * l[k].element_size() for l in self.layers for k in ("ln1", "ln2"))
        return mats + vecs + self.lm_head.nbytes

    def reset(self) -> None:
        self.pos = 0

    def _rms(self, x, w):
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)).to(self.dtype) * w

    def _rope(self, x, cos, sin):  # x (1, heads, n, d)
        half = self.d // 2
        rot = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
        return x * cos + rot * sin

    @torch.inference_mode()
    def forward(self, tokens, all_logits: bool = False) -> torch.Tensor:
        """Append `tokens` to the sequence; float32 logits of the last (or every) new position."""
        n, start = len(tokens), self.pos
        if start + n > self.max_len:
            raise ValueError(f"{start + n} positions exceed the KV cache of {self.max_len}")
        end = start + n
        x = self.embed[torch.as_tensor(tokens, dtype=torch.long, device=self.device)].unsqueeze(0)  # (1, n, h)
        cos, sin = self.cos[start:end], self.sin[start:end]
        q_out, kv_out = self.hq * self.d, self.hkv * self.d
        mask = None
        if n > 1 and start > 0:  # chunk after a prefix: causal within the chunk, all of the prefix
            mask = torch.ones(n, end, dtype=torch.bool, device=self.device).tril(diagonal=start)
        for i, layer in enumerate(self.layers):
            h = self._rms(x, layer["ln1"])
            qkv = layer["qkv"](h)
            q = qkv[..., :q_out].view(1, n, self.hq, self.d).transpose(1, 2)
            k = qkv[..., q_out : q_out + kv_out].view(1, n, self.hkv, self.d).transpose(1, 2)
            v = qkv[..., q_out + kv_out :].view(1, n, self.hkv, self.d).transpose(1, 2)
            q, k = self._rope(q, cos, sin), self._rope(k, cos, sin)
            self.k_cache[i, :, :, start:end] = k
            self.v_cache[i, :, :, start:end] = v
            keys, values = self.k_cache[i, :, :, :end], self.v_cache[i, :, :, :end]
            attn = F.scaled_dot_product_attention(
                q, keys, values, attn_mask=mask, is_causal=(n > 1 and start == 0), enable_gqa=True
            )
            x = x + layer["o"](attn.transpose(1, 2).reshape(1, n, q_out))
            h = self._rms(x, layer["ln2"])
            gate, up = layer["gate_up"](h).chunk(2, dim=-1)
            x = x + layer["down"](F.silu(gate) * up)
        self.pos = end
        x = self._rms(x if all_logits else x[:, -1:], self.norm)
        return self.lm_head(x)[0].float()


def load(config, mode: str, seed: int = 0, max_len: int = 1024, dtype: torch.dtype | None = None,
         device: str = "cpu") -> TorchLlama:
    """The model with mlcpipe's seeded synthetic weights (same values as `--weights synthetic`)."""
    from ..common import hf_weights

    weights = {name: get() for name, _, get in hf_weights(config, seed)}
    return TorchLlama(config, weights, mode, max_len, dtype, device)


def run(settings, mode: str):
    """Benchmark one mode; returns a common.Result."""
    import time

    from ..common import Result, load_config, prompt_tokens, time_decode, time_prefill

    torch.set_num_threads(settings.threads)
    config = load_config(settings.model)
    t0 = time.perf_counter()
    model = load(config, mode, settings.seed, max_len=max(settings.context + settings.decode_steps + 1, settings.prefill))
    load_s = time.perf_counter() - t0
    result = Result("pytorch", {"fp32": "fp32", "bf16": "bf16", "int4": "int4 (w4 g32, bf16 act)"}[mode])
    fwd = lambda toks: model.forward(toks).numpy()  # noqa: E731
    prefill_tokens = prompt_tokens(config.vocab_size, settings.prefill, settings.seed + 1)
    result.prefill_s = time_prefill(fwd, model.reset, prefill_tokens, settings.prefill_runs)
    result.prefill_tokens = settings.prefill
    context = prompt_tokens(config.vocab_size, settings.context, settings.seed)
    result.decode_ms, result.tokens = time_decode(fwd, lambda t: fwd([t]), model.reset, context, settings.decode_steps)
    result.weight_bytes_per_token = model.weight_bytes_per_token
    result.extra = {"load_s": load_s, "torch": torch.__version__, "threads": torch.get_num_threads(),
                    "mkldnn_bf16": bool(torch.backends.mkldnn.is_available())}
    result.notes.append(f"torch {torch.__version__}, {torch.get_num_threads()} threads, inference_mode")
    if mode == "int4":
        result.notes.append("`_weight_int4pack_mm_for_cpu` g32 on mlcpipe's q4 values (lm_head too); embedding gathered from a bf16 table")
    return result

"""An independent NumPy Llama (HF semantics), used to check the compiled model's logits."""

from __future__ import annotations

import math

import numpy as np


def rope_inv_freq(head_dim: int, theta: float, scaling: dict | None) -> np.ndarray:
    inv = 1.0 / theta ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    if not scaling:
        return inv
    factor, low, high = scaling["factor"], scaling["low_freq_factor"], scaling["high_freq_factor"]
    orig = scaling["original_max_position_embeddings"]
    low_wavelen, high_wavelen = orig / low, orig / high
    wavelen = 2 * math.pi / inv
    scaled = np.where(wavelen > low_wavelen, inv / factor, inv)
    smooth = (orig / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
    return np.where(medium, smoothed, scaled)


class ReferenceLlama:
    """Weights: HF tensor names -> float arrays (already dequantized where the model is quantized)."""

    def __init__(self, cfg: dict, weights: dict[str, np.ndarray]):
        self.cfg = cfg
        self.w = {k: v.astype(np.float64) for k, v in weights.items()}
        self.inv_freq = rope_inv_freq(cfg["head_dim"], cfg["rope_theta"], cfg.get("rope_scaling"))
        self.k_cache: list[list[np.ndarray]] = [[] for _ in range(cfg["num_hidden_layers"])]
        self.v_cache: list[list[np.ndarray]] = [[] for _ in range(cfg["num_hidden_layers"])]
        self.pos = 0

    def _rms(self, x, w):
        return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + self.cfg["rms_norm_eps"]) * w

    def _rope(self, x, positions):  # x: (n, heads, d)
        ang = positions[:, None] * self.inv_freq[None, :]
        cos = np.concatenate([np.cos(ang)] * 2, axis=-1)[:, None, :]
        sin = np.concatenate([np.sin(ang)] * 2, axis=-1)[:, None, :]
        half = x.shape[-1] // 2
        rot = np.concatenate([-x[..., half:], x[..., :half]], axis=-1)
        return x * cos + rot * sin

    def forward(self, tokens: list[int]) -> np.ndarray:
        """Append `tokens` to the sequence; logits (float64) of every new position."""
        c, w = self.cfg, self.w
        n, d = len(tokens), c["head_dim"]
        hq, hkv = c["num_attention_heads"], c["num_key_value_heads"]
        positions = np.arange(self.pos, self.pos + n, dtype=np.float64)
        x = w["model.embed_tokens.weight"][np.asarray(tokens)]
        for i in range(c["num_hidden_layers"]):
            p = f"model.layers.{i}"
            h = self._rms(x, w[f"{p}.input_layernorm.weight"])
            q = (h @ w[f"{p}.self_attn.q_proj.weight"].T).reshape(n, hq, d)
            k = (h @ w[f"{p}.self_attn.k_proj.weight"].T).reshape(n, hkv, d)
            v = (h @ w[f"{p}.self_attn.v_proj.weight"].T).reshape(n, hkv, d)
            q, k = self._rope(q, positions), self._rope(k, positions)
            self.k_cache[i].append(k)
            self.v_cache[i].append(v)
            keys, values = np.concatenate(self.k_cache[i]), np.concatenate(self.v_cache[i])
            total = keys.shape[0]
            group = hq // hkv
            out = np.empty((n, hq, d))
            for head in range(hq):
                scores = q[:, head] @ keys[:, head // group].T / math.sqrt(d)
                causal = np.arange(total)[None, :] > (self.pos + np.arange(n))[:, None]
                scores = np.where(causal, -np.inf, scores)
                scores = np.exp(scores - scores.max(axis=-1, keepdims=True))
                out[:, head] = (scores / scores.sum(axis=-1, keepdims=True)) @ values[:, head // group]
            x = x + out.reshape(n, hq * d) @ w[f"{p}.self_attn.o_proj.weight"].T
            h = self._rms(x, w[f"{p}.post_attention_layernorm.weight"])
            gate = h @ w[f"{p}.mlp.gate_proj.weight"].T
            up = h @ w[f"{p}.mlp.up_proj.weight"].T
            x = x + (gate / (1 + np.exp(-gate)) * up) @ w[f"{p}.mlp.down_proj.weight"].T
        self.pos += n
        x = self._rms(x, w["model.norm.weight"])
        head = w.get("lm_head.weight", w["model.embed_tokens.weight"])
        return x @ head.T

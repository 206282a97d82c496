"""NumPy emulations of the CPU GEMM rules' arithmetic, shared by the x86 tests and the aarch64
ones under qemu: q8_emulate (the int8 rules: PrefillGEMMQ4VNNI, PrefillGEMMQ4I8MM), bf16_emulate
(PrefillGEMMBF16) and the operands they start from (activation_and_weight)."""

from __future__ import annotations

import numpy as np

from mlcpipe.schedules.analysis import match_nt_matmul as match


def q8_emulate(func, args, tokens: int, planes: int) -> np.ndarray:
    """The int8 rules' arithmetic in NumPy (int8 activation planes per token and weight group,
    exact integer dot products, float64 after them)."""
    info = match(func)
    params = list(func.params)
    x = args[params.index(info.x)].astype(np.float32).reshape(tokens, info.k)
    words = args[params.index(info.weight)]
    scale = args[params.index(info.scale)].astype(np.float32).astype(np.float64)
    group = info.group_size
    xg = x.reshape(tokens, -1, group)
    amax = np.abs(xg).max(axis=2)
    inv = np.where(amax > 0, np.float32(127.0) / np.where(amax > 0, amax, 1), 0).astype(np.float32)
    scaled = (xg * inv[:, :, None]).astype(np.float32)
    high = np.rint(scaled)  # round half to even, as nearbyint
    low = np.clip(np.rint((scaled - high) * np.float32(256.0)), -127, 127)
    q = np.stack([(words >> (4 * j)) & 15 for j in range(8)], axis=-1).reshape(info.n, -1, group).astype(np.int64)
    dots = np.zeros((tokens, info.n, amax.shape[1]))
    for plane, weight in ((high, 1.0), (low, 1.0 / 256))[:planes]:
        p = plane.astype(np.int64)
        dots += weight * (np.einsum("tgk,ngk->tng", p, q) - 7 * p.sum(axis=2)[:, None, :])
    a = amax.astype(np.float64) / 127.0
    return np.einsum("tng,ng,tg->tn", dots, scale, a)


def bf16_round(a: np.ndarray) -> np.ndarray:
    """f32 -> nearest-even bf16, as f64 (finite inputs)."""
    bits = a.astype(np.float32).view(np.uint32).astype(np.uint64)
    bits = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) << 16
    return bits.astype(np.uint32).view(np.float32).astype(np.float64)


def activation_and_weight(func, args, tokens: int, dtype) -> tuple[np.ndarray, np.ndarray]:
    """The matmul's x [tokens, K] and W [N, K] in `dtype` (q4 weights dequantized as MLC: (q - 7) * s)."""
    info = match(func)
    params = list(func.params)
    x = args[params.index(info.x)].astype(dtype).reshape(tokens, info.k)
    w = args[params.index(info.weight)]
    if info.quantized:
        scale = args[params.index(info.scale)].astype(dtype)
        q = np.stack([(w >> (4 * j)) & 15 for j in range(8)], axis=-1).reshape(info.n, info.k).astype(dtype)
        w = ((q - 7).reshape(info.n, -1, info.group_size) * scale[:, :, None]).reshape(info.n, info.k)
    return x, w.astype(dtype)


def bf16_emulate(func, args, tokens: int) -> np.ndarray:
    """PrefillGEMMBF16's arithmetic: x and the (dequantized) weight rounded to bf16, sums exact."""
    x, w = activation_and_weight(func, args, tokens, np.float32)
    return bf16_round(x) @ bf16_round(w).T

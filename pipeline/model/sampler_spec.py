"""The sampler kernels' shared constants, and valid inputs for each kind of them (NumPy only: the
run side's `check` builds them from the kind and sizes an artifact records). The kernels:
sampler.py."""

from __future__ import annotations

import numpy as np

SAMPLER_ATTR = "mlcpipe.sampler"
KERNEL_PREFIX = "sampler_"
GREEDY_TEMPERATURE = 1e-5  # temperatures at or below: greedy (MLC-LLM's threshold)
SOFTMAX_CHUNK = 1024  # logits per row chunk of the softmax's first pass
TOP_P_CHUNK = 512  # sorted probabilities per partial sum of sample_with_top_p
SORT_TILE = 2048  # bitonic stages with pairs closer than this run inside one tile (GPU: 16 KB of workgroup memory)
PENALTY_COLUMNS = 3  # presence, frequency, repetition


def _probability_rows(rng: np.random.Generator, rows: int, vocab: int) -> np.ndarray:
    """Distributions as a model gives them: a softmax of spread logits, some rows one-hot (greedy)."""
    logits = rng.standard_normal((rows, vocab)) * 3.0
    probs = np.exp(logits - logits.max(axis=1, keepdims=True))
    probs /= probs.sum(axis=1, keepdims=True)
    if rows > 1:
        probs[1] = 0.0
        probs[1, rng.integers(vocab)] = 1.0
    return probs.astype(np.float32)


def _sort_keys(rng: np.random.Generator, rows: int, length: int) -> tuple[np.ndarray, np.ndarray]:
    """Keys with ties (a few distinct values among random ones) and distinct indices."""
    keys = rng.standard_normal((rows, length)).astype(np.float32)
    ties = rng.random((rows, length)) < 0.3
    keys[ties] = rng.choice(np.float32([0.0, 0.25, -1.0]), size=int(ties.sum()))
    idx = np.stack([rng.permutation(length) for _ in range(rows)]).astype(np.int32)
    return keys, idx


def kernel_args(info: dict, n: int, seed: int = 0) -> tuple[list, str]:
    """Valid inputs for a sampler kernel with `n` rows (and n samples / sequences), in parameter
    order (outputs too, random: the kernel overwrites them); returns (args, label). `info`: the
    kernel's SAMPLER_ATTR (kind, vocab and its sizes)."""
    kind, vocab = info["kind"], info["vocab"]
    rng = np.random.default_rng(seed)
    rows = n
    if kind in ("softmax_chunk_stats", "softmax_merge", "softmax_normalize"):
        nc = -(-vocab // info.get("chunk", SOFTMAX_CHUNK))
        logits = (rng.standard_normal((rows, vocab)) * 2.0).astype(np.float32)
        if vocab > 4:
            logits[0, :3] = logits[0].max()  # a three-way tie for the maximum (greedy: 1/3 each)
        temperature = rng.uniform(0.5, 1.5, rows).astype(np.float32)
        temperature[0] = 0.0  # greedy row
        if rows > 2:
            temperature[2] = 1e-6  # WebLLM's clamp of temperature 0
        if kind == "softmax_chunk_stats":
            args = [logits, temperature, np.zeros((rows, nc), np.float32), np.zeros((rows, nc), np.float32)]
        elif kind == "softmax_merge":
            chunk_max = rng.standard_normal((rows, nc)).astype(np.float32)
            chunk_max[:, -1] = chunk_max.max(axis=1)  # ties for the row maximum across chunks
            chunk_sum = rng.uniform(1.0, 50.0, (rows, nc)).astype(np.float32)
            args = [chunk_max, chunk_sum, temperature, np.zeros(rows, np.float32), np.zeros(rows, np.float32)]
        else:
            row_max = logits.max(axis=1).astype(np.float32)
            scaled_max = np.where(temperature > GREEDY_TEMPERATURE, logits.max(axis=1) / np.maximum(temperature, 1e-30), row_max)
            args = [logits, temperature, scaled_max.astype(np.float32), rng.uniform(1.0, 20.0, rows).astype(np.float32),
                    np.zeros((rows, vocab), np.float32)]
        return args, f"batch_size={rows}"
    if kind == "argsort_tiles":
        probs = _probability_rows(rng, rows, vocab)
        ties = rng.random((rows, vocab)) < 0.2
        probs[ties] = np.float32(1e-3)
        out = info["out_len"]
        return [probs, np.zeros((rows, out), np.float32), np.zeros((rows, out), np.int32)], f"batch_size={rows}"
    if kind in ("argsort_global", "argsort_merge", "argsort_merge_final"):
        padded, tile = info["padded"], info["tile"]
        keys, idx = _sort_keys(rng, rows, padded)
        if kind == "argsort_global":
            return [keys, idx, padded, padded // 2], f"batch_size={rows},k={padded},j={padded // 2}"
        if kind == "argsort_merge":
            return [keys, idx, 2 * tile], f"batch_size={rows},k={2 * tile}"
        return [keys, idx, np.zeros((rows, vocab), np.float32), np.zeros((rows, vocab), np.int32)], f"batch_size={rows}"
    if kind in ("top_p_chunk_sums", "top_p_pick"):
        chunk = info["chunk"]
        nc = -(-vocab // chunk)
        probs = -np.sort(-_probability_rows(rng, rows, vocab), axis=1)
        order = np.stack([rng.permutation(vocab) for _ in range(rows)]).astype(np.int32)
        if kind == "top_p_chunk_sums":
            return [probs, np.zeros((rows, nc), np.float32)], f"batch_size={rows}"
        padded = np.zeros((rows, nc * chunk), np.float32)
        padded[:, :vocab] = probs
        sums = padded.reshape(rows, nc, chunk).sum(axis=2, dtype=np.float32)
        samples = rows
        uniform = rng.random(samples).astype(np.float32)
        sample_indices = rng.integers(0, rows, samples).astype(np.int32)
        top_p = rng.choice(np.float32([0.5, 0.9, 0.95, 1.0, -1.0]), size=rows).astype(np.float32)
        return [probs, order, sums, uniform, sample_indices, top_p, np.zeros(samples, np.int32)], f"batch_size={rows},num_samples={samples}"
    logits = rng.standard_normal((rows, vocab)).astype(np.float32)
    seq_ids = rng.permutation(rows).astype(np.int32)
    if kind == "apply_bitmask":
        words = rng.integers(-(2**31), 2**31, size=(rows, -(-vocab // 32)), dtype=np.int64).astype(np.int32)
        return [logits, seq_ids, words], f"batch_size={rows},num_seq={rows}"
    # (sequence, token) pairs without repeats: a token appears once per sequence
    per_seq = min(vocab, 3)
    pos2seq = np.repeat(np.arange(rows, dtype=np.int32), per_seq)
    tokens = np.concatenate([rng.choice(vocab, per_seq, replace=False) for _ in range(rows)]).astype(np.int32)
    if kind == "apply_logit_bias":
        bias = rng.standard_normal(pos2seq.size).astype(np.float32)
        return [logits, seq_ids[pos2seq], tokens, bias], f"batch_size={rows},num_token={pos2seq.size}"
    if kind == "apply_penalty":
        counts = rng.integers(1, 6, pos2seq.size).astype(np.int32)
        penalties = np.stack([rng.uniform(-1, 1, rows), rng.uniform(-1, 1, rows), rng.uniform(0.5, 2.0, rows)], axis=1)
        return ([logits, seq_ids, pos2seq, tokens, counts, penalties.astype(np.float32)],
                f"batch_size={rows},num_seq={rows},num_token={pos2seq.size}")
    raise ValueError(f"unknown sampler kernel kind {kind!r}")

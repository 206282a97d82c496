"""NumPy references of the sampler functions every library carries (pipeline/model/sampler.py), as
WebLLM and MLC-LLM call them: the sampler's own tests and `mlcpipe run`'s sampling check use them."""

from __future__ import annotations

import numpy as np

from mlcpipe.model import sampler

LOWEST = np.finfo(np.float32).min


def softmax_ref(logits: np.ndarray, temperature: np.ndarray) -> np.ndarray:
    out = np.zeros(logits.shape, np.float64)
    for r, (row, t) in enumerate(zip(logits, temperature)):
        if t > sampler.GREEDY_TEMPERATURE:
            with np.errstate(over="ignore"):  # masked logits / t < 1: -inf, probability 0
                x = (row / np.float32(t)).astype(np.float64)
            e = np.exp(x - x.max())
            out[r] = e / e.sum()
        else:
            top = row == row.max()
            out[r] = top / top.sum()
    return out


def argsort_ref(probs: np.ndarray) -> np.ndarray:
    """Descending; equal probabilities in ascending index order."""
    return np.stack([np.lexsort((np.arange(row.size), -row)) for row in probs]).astype(np.int32)


def top_p_ref(sorted_probs, sorted_indices, uniform, sample_indices, top_p):
    """(tokens, uniform): the inverse CDF of the renormalised nucleus (float64), each uniform
    sample first moved to the middle of the CDF step it falls in, so that float32 rounding of the
    running sums cannot pick a neighbour."""
    tokens, moved = [], []
    for u, r in zip(uniform, sample_indices):
        c = np.cumsum(sorted_probs[r].astype(np.float64))
        reach = np.nonzero(c >= top_p[r])[0]
        cutoff = int(reach[0]) if reach.size else c.size - 1
        j = min(int(np.searchsorted(c, float(u) * c[cutoff], side="right")), cutoff)
        lo = c[j - 1] if j > 0 else 0.0
        moved.append(np.float32((lo + c[j]) / 2 / c[cutoff]))
        tokens.append(sorted_indices[r, j])
    return np.array(tokens, np.int32), np.array(moved, np.float32)


def penalty_ref(logits, seq_ids, pos2seq_id, token_ids, token_cnt, penalties):
    out = logits.copy()
    for t in range(token_ids.size):
        s = pos2seq_id[t]
        row, tok = seq_ids[s], token_ids[t]
        x = np.float32(out[row, tok] - (penalties[s, 0] + np.float32(token_cnt[t]) * penalties[s, 1]))
        out[row, tok] = x * penalties[s, 2] if x < 0 else x / penalties[s, 2]
    return out


def bitmask_ref(logits, seq_ids, bitmask):
    out = logits.copy()
    vocab = logits.shape[1]
    for row in seq_ids:
        bits = (bitmask[row].view(np.uint32)[np.arange(vocab) // 32] >> (np.arange(vocab) % 32)) & 1
        out[row, bits == 0] = LOWEST
    return out

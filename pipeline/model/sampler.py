"""The sampler functions MLC-LLM's compiler attaches to a model library, written for mlcpipe.

softmax_with_temperature, argsort_probs, sample_with_top_p, apply_penalty_inplace,
apply_logit_bias_inplace, apply_bitmask_inplace: MLC-LLM's names, argument order and shapes
(WebLLM runs them on the GPU for every token). The kernels are ours, here in their reference
form (plain loops): llvm runs them as written and `mlcpipe check` uses them as every target's
reference; GPU targets schedule them with SamplerGPU. Each kernel is named `sampler_*` and
carries SAMPLER_ATTR; sampler_spec.kernel_args builds valid inputs per kind. Semantics: docs/model.md.
"""

from __future__ import annotations

import tvm
from tvm import relax, tirx
from tvm.script import tirx as T

from .sampler_spec import (  # noqa: F401  (the constants the kernels and their inputs share)
    GREEDY_TEMPERATURE,
    KERNEL_PREFIX,
    PENALTY_COLUMNS,
    SAMPLER_ATTR,
    SOFTMAX_CHUNK,
    SORT_TILE,
    TOP_P_CHUNK,
)
from .sampler_tir import exchange_rows, lowest_f32, pair_lo

DEFAULT_MAX_BATCH_SIZE = 80  # MLC-LLM's default bound of batch_size / num_samples
FUNCTIONS = (
    "softmax_with_temperature", "argsort_probs", "sample_with_top_p",
    "apply_penalty_inplace", "apply_logit_bias_inplace", "apply_bitmask_inplace",
)


def _attrs(kind: str, **sizes: int) -> dict:
    # op_pattern 8 (opaque): FuseOps leaves every sampler kernel a kernel of its own, with its name
    return {"tirx.noalias": True, "op_pattern": 8, SAMPLER_ATTR: {"kind": kind, **{k: int(v) for k, v in sizes.items()}}}


def _dims(*names: str) -> tirx.Var | tuple[tirx.Var, ...]:
    """A kernel's symbolic extents (int64), named as MLC-LLM's kernels name them."""
    dims = tuple(tirx.Var(name, "int64") for name in names)
    return dims if len(dims) > 1 else dims[0]


def padded_length(vocab_size: int) -> int:
    """The sort's row length: the smallest power of two >= vocab_size (at least 2)."""
    return max(2, 1 << (int(vocab_size) - 1).bit_length())


def sort_tile(vocab_size: int) -> int:
    return min(SORT_TILE, padded_length(vocab_size))


def sort_plan(vocab_size: int) -> list[tuple[str, int, int]]:
    """The bitonic network over the padded row as kernel launches, in order:
    ("tiles", 0, 0) sorts every tile (stages up to the tile size); then for each stage k above
    the tile size, ("global", k, j) for every distance j >= tile, and ("merge", k, 0) finishing
    the stage inside tiles. The last launch writes the (b, V) outputs."""
    padded, tile = padded_length(vocab_size), sort_tile(vocab_size)
    plan = [("tiles", 0, 0)]
    k = tile * 2
    while k <= padded:
        j = k // 2
        while j >= tile:
            plan.append(("global", k, j))
            j //= 2
        plan.append(("merge", k, 0))
        k *= 2
    return plan


# ---- reference kernels ------------------------------------------------------------------------------

def softmax_chunk_stats(vocab_size: int, chunk: int = SOFTMAX_CHUNK) -> tirx.PrimFunc:
    """Per row and chunk of `chunk` logits (x = logits / temperature, or the logits when greedy):
    chunk_max = max x; chunk_sum = sum of exp(x - chunk_max) (greedy: how many x == chunk_max)."""
    nc = -(-vocab_size // chunk)
    eps = GREEDY_TEMPERATURE

    batch_size = _dims("batch_size")
    @T.prim_func(private=True, s_tir=True)
    def kernel(logits: T.Buffer((batch_size, vocab_size), "float32"),
               temperature: T.Buffer((batch_size,), "float32"), chunk_max: T.Buffer((batch_size, nc), "float32"),
               chunk_sum: T.Buffer((batch_size, nc), "float32")):
        T.func_attr(_attrs("softmax_chunk_stats", vocab=vocab_size, chunk=chunk))
        scaled = T.alloc_buffer((batch_size, nc, chunk), "float32")
        for b, c, i in T.grid(batch_size, T.int64(nc), T.int64(chunk)):
            with T.sblock("scaled"):
                vb, vc, vi = T.axis.remap("SSS", [b, c, i])
                scaled[vb, vc, vi] = T.if_then_else(
                    vc * chunk + vi < vocab_size,
                    T.if_then_else(
                        temperature[vb] > T.float32(eps),
                        logits[vb, T.min(vc * chunk + vi, vocab_size - 1)] / temperature[vb],
                        logits[vb, T.min(vc * chunk + vi, vocab_size - 1)],
                    ),
                    lowest_f32(),
                )
        for b, c, i in T.grid(batch_size, T.int64(nc), T.int64(chunk)):
            with T.sblock("chunk_max"):
                vb, vc, vi = T.axis.remap("SSR", [b, c, i])
                with T.init():
                    chunk_max[vb, vc] = lowest_f32()
                chunk_max[vb, vc] = T.max(chunk_max[vb, vc], scaled[vb, vc, vi])
        for b, c, i in T.grid(batch_size, T.int64(nc), T.int64(chunk)):
            with T.sblock("chunk_sum"):
                vb, vc, vi = T.axis.remap("SSR", [b, c, i])
                with T.init():
                    chunk_sum[vb, vc] = T.float32(0)
                chunk_sum[vb, vc] = chunk_sum[vb, vc] + T.if_then_else(
                    vc * chunk + vi < vocab_size,
                    T.if_then_else(
                        scaled[vb, vc, vi] == chunk_max[vb, vc],
                        T.float32(1),
                        T.if_then_else(
                            temperature[vb] > T.float32(eps),
                            T.exp(scaled[vb, vc, vi] - chunk_max[vb, vc]),
                            T.float32(0),
                        ),
                    ),
                    T.float32(0),
                )

    return kernel


def softmax_merge(vocab_size: int, chunk: int = SOFTMAX_CHUNK) -> tirx.PrimFunc:
    """Per row: row_max = max of the chunk maxima; row_sum = the chunk sums rescaled to row_max
    (greedy: the counts of the chunks whose maximum is the row's)."""
    nc = -(-vocab_size // chunk)
    eps = GREEDY_TEMPERATURE

    batch_size = _dims("batch_size")
    @T.prim_func(private=True, s_tir=True)
    def kernel(chunk_max: T.Buffer((batch_size, nc), "float32"), chunk_sum: T.Buffer((batch_size, nc), "float32"),
               temperature: T.Buffer((batch_size,), "float32"), row_max: T.Buffer((batch_size,), "float32"),
               row_sum: T.Buffer((batch_size,), "float32")):
        T.func_attr(_attrs("softmax_merge", vocab=vocab_size, chunk=chunk))
        for b, c in T.grid(batch_size, T.int64(nc)):
            with T.sblock("row_max"):
                vb, vc = T.axis.remap("SR", [b, c])
                with T.init():
                    row_max[vb] = lowest_f32()
                row_max[vb] = T.max(row_max[vb], chunk_max[vb, vc])
        for b, c in T.grid(batch_size, T.int64(nc)):
            with T.sblock("row_sum"):
                vb, vc = T.axis.remap("SR", [b, c])
                with T.init():
                    row_sum[vb] = T.float32(0)
                row_sum[vb] = row_sum[vb] + T.if_then_else(
                    chunk_max[vb, vc] == row_max[vb],
                    chunk_sum[vb, vc],
                    T.if_then_else(
                        temperature[vb] > T.float32(eps),
                        chunk_sum[vb, vc] * T.exp(chunk_max[vb, vc] - row_max[vb]),
                        T.float32(0),
                    ),
                )

    return kernel


def softmax_normalize(vocab_size: int) -> tirx.PrimFunc:
    """probs = exp(x - row_max) / row_sum (greedy: 1 / row_sum where x == row_max, else 0)."""
    eps = GREEDY_TEMPERATURE

    batch_size = _dims("batch_size")
    @T.prim_func(private=True, s_tir=True)
    def kernel(logits: T.Buffer((batch_size, vocab_size), "float32"),
               temperature: T.Buffer((batch_size,), "float32"), row_max: T.Buffer((batch_size,), "float32"),
               row_sum: T.Buffer((batch_size,), "float32"), probs: T.Buffer((batch_size, vocab_size), "float32")):
        T.func_attr(_attrs("softmax_normalize", vocab=vocab_size))
        scaled = T.alloc_buffer((batch_size, vocab_size), "float32")
        for b, v in T.grid(batch_size, T.int64(vocab_size)):
            with T.sblock("scaled"):
                vb, vv = T.axis.remap("SS", [b, v])
                scaled[vb, vv] = T.if_then_else(
                    temperature[vb] > T.float32(eps), logits[vb, vv] / temperature[vb], logits[vb, vv]
                )
        for b, v in T.grid(batch_size, T.int64(vocab_size)):
            with T.sblock("probs"):
                vb, vv = T.axis.remap("SS", [b, v])
                probs[vb, vv] = T.if_then_else(
                    scaled[vb, vv] == row_max[vb],
                    T.float32(1) / row_sum[vb],
                    T.if_then_else(
                        temperature[vb] > T.float32(eps),
                        T.exp(scaled[vb, vv] - row_max[vb]) / row_sum[vb],
                        T.float32(0),
                    ),
                )

    return kernel


@T.macro
def _copy_entry(dst_k, dst_i, src_k, src_i, b, i):
    """dst[b, i] = src[b, i] for the (key, index) pair of buffers."""
    dst_k[b, i] = src_k[b, i]
    dst_i[b, i] = src_i[b, i]


@T.macro
def _merge_tile(keys, idx, row, base, log_k, steps, pairs, desc_all):
    """The last `steps` steps (distances 2^(steps - 1) .. 1) of bitonic stage 2^log_k over the
    `2 pairs` entries from `base` of a row; a pair is descending where `desc_all` says (None:
    where bit log_k of its position is 0)."""
    for step in range(steps):
        for p in range(pairs):
            log_j: T.let[T.int32] = steps - 1 - step
            lo: T.let[T.int32] = base + pair_lo(p, log_j)
            hi: T.let[T.int32] = lo + T.shift_left(1, log_j)
            if desc_all is None:
                desc: T.let[T.bool] = T.bitwise_and(lo, T.shift_left(1, log_k)) == 0
                exchange_rows(keys, idx, row, lo, hi, desc)
            else:
                exchange_rows(keys, idx, row, lo, hi, desc_all)


def argsort_tiles(vocab_size: int, out_len: int) -> tirx.PrimFunc:
    """The padded row (probs, then the lowest float32 with indices >= V) with every tile bitonic-
    sorted: stages k = 2 .. tile of the network over the whole row (a pair (i, i + j) is put in
    descending order where i & k == 0, ascending elsewhere). Writes the first `out_len` entries
    (out_len = V when the tile is the whole row: then this is the whole sort)."""
    padded, tile = padded_length(vocab_size), sort_tile(vocab_size)
    log_tile = tile.bit_length() - 1

    batch_size = _dims("batch_size")
    @T.prim_func(private=True, s_tir=True)
    def kernel(probs: T.Buffer((batch_size, vocab_size), "float32"),
               keys: T.Buffer((batch_size, out_len), "float32"), idx: T.Buffer((batch_size, out_len), "int32")):
        T.func_attr(_attrs("argsort_tiles", vocab=vocab_size, padded=padded, tile=tile, out_len=out_len))
        work_k = T.alloc_buffer((batch_size, padded), "float32")
        work_i = T.alloc_buffer((batch_size, padded), "int32")
        for b, i in T.grid(batch_size, padded):
            with T.sblock("load"):
                vb, vi = T.axis.remap("SS", [b, i])
                work_k[vb, vi] = T.if_then_else(vi < vocab_size, probs[vb, T.min(vi, vocab_size - 1)], lowest_f32())
                work_i[vb, vi] = vi
        for b in range(batch_size):
            with T.sblock("sort"):
                vb = T.axis.spatial(batch_size, b)
                for log_k in range(1, log_tile + 1):
                    _merge_tile(work_k, work_i, vb, 0, log_k, log_k, padded // 2, None)
        for b, i in T.grid(batch_size, out_len):
            with T.sblock("store"):
                vb, vi = T.axis.remap("SS", [b, i])
                _copy_entry(keys, idx, work_k, work_i, vb, vi)

    return kernel


def argsort_global(vocab_size: int) -> tirx.PrimFunc:
    """One step of the network across tiles, in place: pairs (i, i + sort_j) of stage sort_k."""
    padded, tile = padded_length(vocab_size), sort_tile(vocab_size)

    batch_size = _dims("batch_size")
    @T.prim_func(private=True, s_tir=True)
    def kernel(keys: T.Buffer((batch_size, padded), "float32"), idx: T.Buffer((batch_size, padded), "int32"),
               sort_k: T.int32, sort_j: T.int32):
        T.func_attr(_attrs("argsort_global", vocab=vocab_size, padded=padded, tile=tile))
        for b, p in T.grid(batch_size, padded // 2):
            with T.sblock("step"):
                vb, vp = T.axis.remap("SS", [b, p])
                lo: T.let[T.int32] = T.floordiv(vp, sort_j) * sort_j * 2 + T.floormod(vp, sort_j)
                hi: T.let[T.int32] = lo + sort_j
                desc: T.let[T.bool] = T.bitwise_and(lo, sort_k) == 0
                exchange_rows(keys, idx, vb, lo, hi, desc)

    return kernel


def argsort_merge(vocab_size: int, final: bool) -> tirx.PrimFunc:
    """The steps j = tile/2 .. 1 of stage sort_k inside each tile. In place; `final` (stage k =
    the padded length: all descending) reads keys/idx and writes the (b, V) outputs instead."""
    padded, tile = padded_length(vocab_size), sort_tile(vocab_size)
    log_tile = tile.bit_length() - 1
    out_len = vocab_size if final else padded
    kind = "argsort_merge_final" if final else "argsort_merge"

    batch_size = _dims("batch_size")
    @T.prim_func(private=True, s_tir=True)
    def merge_inplace(keys: T.Buffer((batch_size, padded), "float32"), idx: T.Buffer((batch_size, padded), "int32"),
                      sort_k: T.int32):
        T.func_attr(_attrs(kind, vocab=vocab_size, padded=padded, tile=tile, out_len=out_len))
        for b, t in T.grid(batch_size, padded // tile):
            with T.sblock("merge"):
                vb, vt = T.axis.remap("SS", [b, t])
                desc: T.let[T.bool] = T.bitwise_and(vt * tile, sort_k) == 0
                _merge_tile(keys, idx, vb, vt * tile, log_tile, log_tile, tile // 2, desc)

    @T.prim_func(private=True, s_tir=True)
    def merge_final(keys: T.Buffer((batch_size, padded), "float32"), idx: T.Buffer((batch_size, padded), "int32"),
                    out_keys: T.Buffer((batch_size, vocab_size), "float32"),
                    out_idx: T.Buffer((batch_size, vocab_size), "int32")):
        T.func_attr(_attrs(kind, vocab=vocab_size, padded=padded, tile=tile, out_len=out_len))
        work_k = T.alloc_buffer((batch_size, padded), "float32")
        work_i = T.alloc_buffer((batch_size, padded), "int32")
        for b, i in T.grid(batch_size, padded):
            with T.sblock("load"):
                vb, vi = T.axis.remap("SS", [b, i])
                _copy_entry(work_k, work_i, keys, idx, vb, vi)
        for b, t in T.grid(batch_size, padded // tile):
            with T.sblock("merge"):
                vb, vt = T.axis.remap("SS", [b, t])
                _merge_tile(work_k, work_i, vb, vt * tile, log_tile, log_tile, tile // 2, T.bool(True))
        for b, i in T.grid(batch_size, vocab_size):
            with T.sblock("store"):
                vb, vi = T.axis.remap("SS", [b, i])
                _copy_entry(out_keys, out_idx, work_k, work_i, vb, vi)

    return merge_final if final else merge_inplace


def top_p_chunk_sums(vocab_size: int, chunk: int = TOP_P_CHUNK) -> tirx.PrimFunc:
    """Sums of `chunk` consecutive sorted probabilities per row (the coarse level of the CDF)."""
    nc = -(-vocab_size // chunk)

    batch_size = _dims("batch_size")
    @T.prim_func(private=True, s_tir=True)
    def kernel(sorted_probs: T.Buffer((batch_size, vocab_size), "float32"),
               chunk_sums: T.Buffer((batch_size, nc), "float32")):
        T.func_attr(_attrs("top_p_chunk_sums", vocab=vocab_size, chunk=chunk))
        for b, c, i in T.grid(batch_size, T.int64(nc), T.int64(chunk)):
            with T.sblock("chunk_sums"):
                vb, vc, vi = T.axis.remap("SSR", [b, c, i])
                with T.init():
                    chunk_sums[vb, vc] = T.float32(0)
                chunk_sums[vb, vc] += T.if_then_else(vc * chunk + vi < vocab_size, sorted_probs[vb, T.min(vc * chunk + vi, vocab_size - 1)],
                                                     T.float32(0))

    return kernel


def top_p_pick(vocab_size: int, chunk: int = TOP_P_CHUNK) -> tirx.PrimFunc:
    """One token per sample: the nucleus cutoff K (first c >= top_p), then the first position
    whose running sum exceeds u * c[K]; both found chunk by chunk (chunk sums), then inside the
    chunk (running sum from the chunk's prefix)."""
    nc = -(-vocab_size // chunk)

    batch_size, num_samples = _dims("batch_size", "num_samples")
    @T.prim_func(private=True, s_tir=True)
    def kernel(sorted_probs: T.Buffer((batch_size, vocab_size), "float32"),
               sorted_indices: T.Buffer((batch_size, vocab_size), "int32"),
               chunk_sums: T.Buffer((batch_size, nc), "float32"),
               uniform_samples: T.Buffer((num_samples,), "float32"),
               sample_indices: T.Buffer((num_samples,), "int32"), top_p: T.Buffer((batch_size,), "float32"),
               tokens: T.Buffer((num_samples,), "int32")):
        T.func_attr(_attrs("top_p_pick", vocab=vocab_size, chunk=chunk))
        for s in range(num_samples):
            with T.sblock("pick"):
                vs = T.axis.spatial(num_samples, s)
                # scalars: [found, chunk, position]; [prefix, running, renorm, threshold]
                ints = T.sblock_alloc_buffer((3,), "int32", scope="local")
                floats = T.sblock_alloc_buffer((4,), "float32", scope="local")
                row: T.let[T.int32] = sample_indices[vs]
                # 1. the nucleus: K and renorm = c[K]
                ints[0] = 0
                ints[1] = nc - 1
                floats[0] = T.float32(0)
                for c in range(nc):
                    if ints[0] == 0:
                        if floats[0] + chunk_sums[row, c] >= top_p[row]:
                            ints[0] = 1
                            ints[1] = c
                        elif c < nc - 1:
                            floats[0] = floats[0] + chunk_sums[row, c]
                ints[0] = 0
                ints[2] = T.min(ints[1] * chunk + chunk, vocab_size) - 1
                floats[1] = floats[0]
                for i in range(chunk):
                    if ints[0] == 0 and ints[1] * chunk + i < vocab_size:
                        floats[1] = floats[1] + sorted_probs[row, ints[1] * chunk + i]
                        if floats[1] >= top_p[row]:
                            ints[0] = 1
                            ints[2] = ints[1] * chunk + i
                floats[2] = floats[1]
                cutoff: T.let[T.int32] = ints[2]
                # 2. the inverse CDF at u * renorm, at most K
                floats[3] = uniform_samples[vs] * floats[2]
                ints[0] = 0
                ints[1] = T.floordiv(cutoff, chunk)
                floats[0] = T.float32(0)
                for c in range(nc):
                    if ints[0] == 0 and c * chunk <= cutoff:
                        if floats[0] + chunk_sums[row, c] > floats[3]:
                            ints[0] = 1
                            ints[1] = c
                        elif c * chunk + chunk <= cutoff:
                            floats[0] = floats[0] + chunk_sums[row, c]
                ints[0] = 0
                ints[2] = T.min(T.min(ints[1] * chunk + chunk, vocab_size) - 1, cutoff)
                floats[1] = floats[0]
                for i in range(chunk):
                    if ints[0] == 0 and ints[1] * chunk + i <= cutoff:
                        floats[1] = floats[1] + sorted_probs[row, ints[1] * chunk + i]
                        if floats[1] > floats[3]:
                            ints[0] = 1
                            ints[2] = ints[1] * chunk + i
                tokens[vs] = sorted_indices[row, ints[2]]

    return kernel


def apply_logit_bias(vocab_size: int) -> tirx.PrimFunc:
    batch_size, num_token = _dims("batch_size", "num_token")
    @T.prim_func(private=True, s_tir=True)
    def kernel(logits: T.Buffer((batch_size, vocab_size), "float32"), pos2seq_id: T.Buffer((num_token,), "int32"),
               token_ids: T.Buffer((num_token,), "int32"), logit_bias: T.Buffer((num_token,), "float32")):
        T.func_attr(_attrs("apply_logit_bias", vocab=vocab_size))
        for t in range(num_token):
            with T.sblock("bias"):
                vt = T.axis.spatial(num_token, t)
                logits[pos2seq_id[vt], token_ids[vt]] = logits[pos2seq_id[vt], token_ids[vt]] + logit_bias[vt]

    return kernel


def apply_penalty(vocab_size: int) -> tirx.PrimFunc:
    batch_size, num_seq, num_token = _dims("batch_size", "num_seq", "num_token")
    @T.prim_func(private=True, s_tir=True)
    def kernel(logits: T.Buffer((batch_size, vocab_size), "float32"), seq_ids: T.Buffer((num_seq,), "int32"),
               pos2seq_id: T.Buffer((num_token,), "int32"), token_ids: T.Buffer((num_token,), "int32"),
               token_cnt: T.Buffer((num_token,), "int32"),
               penalties: T.Buffer((num_seq, PENALTY_COLUMNS), "float32")):
        T.func_attr(_attrs("apply_penalty", vocab=vocab_size))
        for t in range(num_token):
            with T.sblock("penalty"):
                vt = T.axis.spatial(num_token, t)
                seq: T.let[T.int32] = pos2seq_id[vt]
                value: T.let[T.float32] = logits[seq_ids[seq], token_ids[vt]] - (
                    penalties[seq, 0] + T.Cast("float32", token_cnt[vt]) * penalties[seq, 1])
                logits[seq_ids[seq], token_ids[vt]] = T.if_then_else(
                    value < T.float32(0), value * penalties[seq, 2], value / penalties[seq, 2])

    return kernel


def apply_bitmask(vocab_size: int) -> tirx.PrimFunc:
    words = -(-vocab_size // 32)

    batch_size, num_seq = _dims("batch_size", "num_seq")
    @T.prim_func(private=True, s_tir=True)
    def kernel(logits: T.Buffer((batch_size, vocab_size), "float32"), seq_ids: T.Buffer((num_seq,), "int32"),
               bitmask: T.Buffer((batch_size, words), "int32")):
        T.func_attr(_attrs("apply_bitmask", vocab=vocab_size))
        for s, v in T.grid(num_seq, vocab_size):
            with T.sblock("bitmask"):
                vs, vv = T.axis.remap("SS", [s, v])
                logits[seq_ids[vs], vv] = T.if_then_else(
                    T.bitwise_and(T.shift_right(bitmask[seq_ids[vs], vv // 32], vv % 32), 1) == 1,
                    logits[seq_ids[vs], vv],
                    lowest_f32(),
                )

    return kernel


# ---- Relax functions ----------------------------------------------------------------------------------

def _tensor(shape, dtype: str = "float32") -> relax.TensorType:
    return relax.TensorType(shape, dtype)


def _reshape(bb: relax.BlockBuilder, x: relax.Expr, shape: list) -> relax.Expr:
    """A view of `x` with another shape (vm.builtin.reshape: no copy, no kernel)."""
    new_shape = relax.ShapeExpr(shape)
    return bb.emit(relax.call_pure_packed("vm.builtin.reshape", x, new_shape, ty_args=_tensor(new_shape, x.ty.dtype)))


def _int32(value: int) -> relax.Expr:
    return relax.prim_value(tirx.IntImm("int32", int(value)))


def _add_softmax(bb: relax.BlockBuilder, vocab_size: int) -> None:
    batch = tirx.Var("batch_size", "int64")
    nc = -(-vocab_size // SOFTMAX_CHUNK)
    logits = relax.Var("logits", _tensor((batch, 1, vocab_size)))
    temperature = relax.Var("temperature", _tensor((batch,)))
    with bb.function("softmax_with_temperature", [logits, temperature]):
        stats_fn = bb.add_func(softmax_chunk_stats(vocab_size), "sampler_softmax_chunk_stats")
        merge_fn = bb.add_func(softmax_merge(vocab_size), "sampler_softmax_merge")
        norm_fn = bb.add_func(softmax_normalize(vocab_size), "sampler_softmax_normalize")
        with bb.dataflow():
            rows = _reshape(bb, logits, [batch, vocab_size])
            stats = bb.emit(relax.call_tir(stats_fn, [rows, temperature], [_tensor((batch, nc))] * 2))
            merged = bb.emit(relax.call_tir(
                merge_fn, [bb.emit(relax.TupleGetItem(stats, 0)), bb.emit(relax.TupleGetItem(stats, 1)), temperature],
                [_tensor((batch,))] * 2))
            probs = bb.emit(relax.call_tir(
                norm_fn, [rows, temperature, bb.emit(relax.TupleGetItem(merged, 0)), bb.emit(relax.TupleGetItem(merged, 1))],
                _tensor((batch, vocab_size))))
            out = bb.emit_output(relax.call_pure_packed(
                "vm.builtin.reshape", probs, relax.ShapeExpr([batch, 1, vocab_size]),
                ty_args=_tensor((batch, 1, vocab_size))))
        bb.emit_func_output(out)


def _add_argsort(bb: relax.BlockBuilder, vocab_size: int) -> None:
    batch = tirx.Var("batch_size", "int64")
    padded = padded_length(vocab_size)
    probs = relax.Var("probs", _tensor((batch, vocab_size)))
    plan = sort_plan(vocab_size)
    with bb.function("argsort_probs", [probs]):
        single = len(plan) == 1
        tiles_fn = bb.add_func(argsort_tiles(vocab_size, vocab_size if single else padded), "sampler_argsort_tiles")
        if not single:
            global_fn = bb.add_func(argsort_global(vocab_size), "sampler_argsort_global")
            merge_fn = bb.add_func(argsort_merge(vocab_size, final=False), "sampler_argsort_merge")
            final_fn = bb.add_func(argsort_merge(vocab_size, final=True), "sampler_argsort_merge_final")
        with bb.dataflow():
            out_len = vocab_size if single else padded
            pair = bb.emit(relax.call_tir(tiles_fn, [probs], [_tensor((batch, out_len)), _tensor((batch, out_len), "int32")]))
            keys, idx = bb.emit(relax.TupleGetItem(pair, 0)), bb.emit(relax.TupleGetItem(pair, 1))
            for kind, k, j in plan[1:]:
                if kind == "global":
                    args = [keys, idx, _int32(k), _int32(j)]
                    pair = bb.emit(relax.call_tir_inplace(global_fn, args, [0, 1], [keys.ty, idx.ty]))
                elif k < padded:
                    pair = bb.emit(relax.call_tir_inplace(merge_fn, [keys, idx, _int32(k)], [0, 1], [keys.ty, idx.ty]))
                else:
                    pair = bb.emit(relax.call_tir(final_fn, [keys, idx], [_tensor((batch, vocab_size)), _tensor((batch, vocab_size), "int32")]))
                keys, idx = bb.emit(relax.TupleGetItem(pair, 0)), bb.emit(relax.TupleGetItem(pair, 1))
            out = bb.emit_output(relax.Tuple([keys, idx]))
        bb.emit_func_output(out)


def _add_sample_with_top_p(bb: relax.BlockBuilder, vocab_size: int, max_batch_size: int) -> None:
    batch = tirx.Var("batch_size", "int64")
    num_samples = tirx.Var("num_samples", "int64")
    nc = -(-vocab_size // TOP_P_CHUNK)
    sorted_probs = relax.Var("sorted_probs", _tensor((batch, vocab_size)))
    sorted_indices = relax.Var("sorted_indices", _tensor((batch, vocab_size), "int32"))
    uniform_samples = relax.Var("uniform_samples", _tensor((num_samples,)))
    sample_indices = relax.Var("sample_indices", _tensor((num_samples,), "int32"))
    top_p = relax.Var("top_p", _tensor((batch,)))
    params = [sorted_probs, sorted_indices, uniform_samples, sample_indices, top_p]
    # MLC-LLM's bounds for its sampling functions (read by the memory estimate of `_metadata`)
    bounds = {"batch_size": max_batch_size, "num_samples": max_batch_size}
    with bb.function("sample_with_top_p", params, attrs={"tir_var_upper_bound": bounds}):
        sums_fn = bb.add_func(top_p_chunk_sums(vocab_size), "sampler_top_p_chunk_sums")
        pick_fn = bb.add_func(top_p_pick(vocab_size), "sampler_top_p_pick")
        with bb.dataflow():
            sums = bb.emit(relax.call_tir(sums_fn, [sorted_probs], _tensor((batch, nc))))
            out = bb.emit_output(relax.call_tir(
                pick_fn, [sorted_probs, sorted_indices, sums, uniform_samples, sample_indices, top_p],
                _tensor((num_samples,), "int32")))
        bb.emit_func_output(out)


def _add_inplace(bb: relax.BlockBuilder, name: str, kernel_name: str, kernel: tirx.PrimFunc, params: list) -> None:
    with bb.function(name, params):
        fn = bb.add_func(kernel, kernel_name)
        with bb.dataflow():
            out = bb.emit_output(relax.call_tir_inplace(fn, params, [0], params[0].ty))
        bb.emit_func_output(out)


def _add_logit_processors(bb: relax.BlockBuilder, vocab_size: int) -> None:
    batch = tirx.Var("batch_size", "int64")
    num_seq = tirx.Var("num_seq", "int64")
    num_token = tirx.Var("num_token", "int64")

    def logits():
        return relax.Var("logits", _tensor((batch, vocab_size)))

    _add_inplace(bb, "apply_logit_bias_inplace", "sampler_apply_logit_bias", apply_logit_bias(vocab_size), [
        logits(), relax.Var("pos2seq_id", _tensor((num_token,), "int32")),
        relax.Var("token_ids", _tensor((num_token,), "int32")), relax.Var("logit_bias", _tensor((num_token,))),
    ])
    _add_inplace(bb, "apply_penalty_inplace", "sampler_apply_penalty", apply_penalty(vocab_size), [
        logits(), relax.Var("seq_ids", _tensor((num_seq,), "int32")),
        relax.Var("pos2seq_id", _tensor((num_token,), "int32")), relax.Var("token_ids", _tensor((num_token,), "int32")),
        relax.Var("token_cnt", _tensor((num_token,), "int32")), relax.Var("penalties", _tensor((num_seq, PENALTY_COLUMNS))),
    ])
    _add_inplace(bb, "apply_bitmask_inplace", "sampler_apply_bitmask", apply_bitmask(vocab_size), [
        logits(), relax.Var("seq_ids", _tensor((num_seq,), "int32")),
        relax.Var("bitmask", _tensor((batch, -(-vocab_size // 32)), "int32")),
    ])


def attach_sampler(mod: tvm.IRModule, target: tvm.target.Target, vocab_size: int,
                   max_batch_size: int = DEFAULT_MAX_BATCH_SIZE) -> tvm.IRModule:
    """`mod` plus the six sampler functions (FUNCTIONS) for a vocabulary of `vocab_size`, their
    kernels unscheduled (the schedule phase schedules them for `target`). `max_batch_size`
    bounds the rows and samples of sample_with_top_p (its `tir_var_upper_bound`, as MLC-LLM's)."""
    del target  # one form for every target: the schedule rules specialise the kernels
    present = {gv.name_hint for gv in mod.get_global_vars()}
    if present & set(FUNCTIONS):
        return mod
    bb = relax.BlockBuilder(mod)
    _add_softmax(bb, vocab_size)
    _add_argsort(bb, vocab_size)
    _add_sample_with_top_p(bb, vocab_size, max_batch_size)
    _add_logit_processors(bb, vocab_size)
    return bb.finalize()

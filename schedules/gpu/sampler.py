"""GPU forms of the sampler kernels (pipeline/model/sampler.py): the rule SamplerGPU.

The kernels with one row loop (logit bias and penalties: a token a lane; top_p_pick: a sample a
lane) are their reference loop split over threads (tir_rewrite.bind_row_loop); the others
(bitmask, the bitonic argsort's steps, the softmax / top-p chunk passes) get a hand-written
thread-bound kernel of the same signature and contract (checked against the llvm reference by
`mlcpipe check`). Launch shapes per kernel: docs/schedules.md.
Knob: threads (lanes per workgroup; 0 = the target's limit: 256 on WebGPU / Metal, 1024 on CUDA).
"""

from __future__ import annotations

import dataclasses

from tvm import s_tir, tirx
from tvm.script import tirx as T
from tvm.target import Target

from mlcpipe.model.sampler_tir import exchange_rows, exchange_tile, lowest_f32, pair_lo

from ..analysis import sampler_info
from ..base import GPUScheduleRule, UntunedRule, max_threads
from ..tir_rewrite import bind_row_loop

def _reduce_threads(threads: int) -> int:
    """Lanes of a reduction workgroup: a power of two, at most 256."""
    out = 1
    while out * 2 <= min(threads, 256):
        out *= 2
    return out


def softmax_chunk_stats_gpu(vocab_size: int, chunk: int, threads: int, kind: str) -> tirx.PrimFunc:
    """One workgroup per (row, chunk): a max then a sum over the chunk, tree-reduced in
    workgroup memory."""
    lowest = lowest_f32(exact_literal=kind == "cuda")
    lanes = _reduce_threads(threads)
    nc = -(-vocab_size // chunk)
    per_lane = -(-chunk // lanes)
    levels = lanes.bit_length() - 1
    eps = 1e-5

    @T.prim_func(private=True, s_tir=True)
    def kernel(var_logits: T.handle, var_temperature: T.handle, var_chunk_max: T.handle, var_chunk_sum: T.handle):
        T.func_attr({"tirx.noalias": True})
        batch_size = T.int64()
        logits = T.match_buffer(var_logits, (batch_size, vocab_size), "float32")
        temperature = T.match_buffer(var_temperature, (batch_size,), "float32")
        chunk_max = T.match_buffer(var_chunk_max, (batch_size, nc), "float32")
        chunk_sum = T.match_buffer(var_chunk_sum, (batch_size, nc), "float32")
        for bx in T.thread_binding(batch_size * nc, thread="blockIdx.x"):
            for tx in T.thread_binding(lanes, thread="threadIdx.x"):
                with T.sblock("stats"):
                    red = T.sblock_alloc_buffer((lanes,), "float32", scope="shared")
                    acc = T.sblock_alloc_buffer((1,), "float32", scope="local")
                    row: T.let[T.int32] = T.Cast("int32", bx // nc)
                    start: T.let[T.int32] = T.Cast("int32", bx % nc) * chunk
                    temp: T.let[T.float32] = temperature[row]
                    acc[0] = lowest
                    for e in range(per_lane):
                        if e * lanes + tx < chunk and start + e * lanes + tx < vocab_size:
                            acc[0] = T.max(acc[0], T.if_then_else(
                                temp > T.float32(eps), logits[row, start + e * lanes + tx] / temp,
                                logits[row, start + e * lanes + tx]))
                    red[tx] = acc[0]
                    T.tvm_storage_sync("shared")
                    for level in range(levels):
                        if tx < T.shift_right(lanes, level + 1):
                            red[tx] = T.max(red[tx], red[tx + T.shift_right(lanes, level + 1)])
                        T.tvm_storage_sync("shared")
                    top: T.let[T.float32] = red[0]
                    T.tvm_storage_sync("shared")
                    acc[0] = T.float32(0)
                    for e in range(per_lane):
                        if e * lanes + tx < chunk and start + e * lanes + tx < vocab_size:
                            x: T.let[T.float32] = T.if_then_else(
                                temp > T.float32(eps), logits[row, start + e * lanes + tx] / temp,
                                logits[row, start + e * lanes + tx])
                            acc[0] = acc[0] + T.if_then_else(
                                x == top, T.float32(1),
                                T.if_then_else(temp > T.float32(eps), T.exp(x - top), T.float32(0)))
                    red[tx] = acc[0]
                    T.tvm_storage_sync("shared")
                    for level in range(levels):
                        if tx < T.shift_right(lanes, level + 1):
                            red[tx] = red[tx] + red[tx + T.shift_right(lanes, level + 1)]
                        T.tvm_storage_sync("shared")
                    if tx == 0:
                        chunk_max[row, T.Cast("int32", bx % nc)] = top
                        chunk_sum[row, T.Cast("int32", bx % nc)] = red[0]

    return kernel


def softmax_merge_gpu(vocab_size: int, chunk: int, threads: int, kind: str) -> tirx.PrimFunc:
    """One workgroup per row over its chunk statistics."""
    lowest = lowest_f32(exact_literal=kind == "cuda")
    lanes = _reduce_threads(threads)
    nc = -(-vocab_size // chunk)
    per_lane = -(-nc // lanes)
    levels = lanes.bit_length() - 1
    eps = 1e-5

    @T.prim_func(private=True, s_tir=True)
    def kernel(var_chunk_max: T.handle, var_chunk_sum: T.handle, var_temperature: T.handle, var_row_max: T.handle,
               var_row_sum: T.handle):
        T.func_attr({"tirx.noalias": True})
        batch_size = T.int64()
        chunk_max = T.match_buffer(var_chunk_max, (batch_size, nc), "float32")
        chunk_sum = T.match_buffer(var_chunk_sum, (batch_size, nc), "float32")
        temperature = T.match_buffer(var_temperature, (batch_size,), "float32")
        row_max = T.match_buffer(var_row_max, (batch_size,), "float32")
        row_sum = T.match_buffer(var_row_sum, (batch_size,), "float32")
        for bx in T.thread_binding(batch_size, thread="blockIdx.x"):
            for tx in T.thread_binding(lanes, thread="threadIdx.x"):
                with T.sblock("merge"):
                    red = T.sblock_alloc_buffer((lanes,), "float32", scope="shared")
                    acc = T.sblock_alloc_buffer((1,), "float32", scope="local")
                    row: T.let[T.int32] = T.Cast("int32", bx)
                    temp: T.let[T.float32] = temperature[row]
                    acc[0] = lowest
                    for e in range(per_lane):
                        if e * lanes + tx < nc:
                            acc[0] = T.max(acc[0], chunk_max[row, e * lanes + tx])
                    red[tx] = acc[0]
                    T.tvm_storage_sync("shared")
                    for level in range(levels):
                        if tx < T.shift_right(lanes, level + 1):
                            red[tx] = T.max(red[tx], red[tx + T.shift_right(lanes, level + 1)])
                        T.tvm_storage_sync("shared")
                    top: T.let[T.float32] = red[0]
                    T.tvm_storage_sync("shared")
                    acc[0] = T.float32(0)
                    for e in range(per_lane):
                        if e * lanes + tx < nc:
                            acc[0] = acc[0] + T.if_then_else(
                                chunk_max[row, e * lanes + tx] == top, chunk_sum[row, e * lanes + tx],
                                T.if_then_else(temp > T.float32(eps),
                                               chunk_sum[row, e * lanes + tx] * T.exp(chunk_max[row, e * lanes + tx] - top),
                                               T.float32(0)))
                    red[tx] = acc[0]
                    T.tvm_storage_sync("shared")
                    for level in range(levels):
                        if tx < T.shift_right(lanes, level + 1):
                            red[tx] = red[tx] + red[tx + T.shift_right(lanes, level + 1)]
                        T.tvm_storage_sync("shared")
                    if tx == 0:
                        row_max[row] = top
                        row_sum[row] = red[0]

    return kernel


def softmax_normalize_gpu(vocab_size: int, threads: int) -> tirx.PrimFunc:
    """One thread per probability."""
    eps = 1e-5

    @T.prim_func(private=True, s_tir=True)
    def kernel(var_logits: T.handle, var_temperature: T.handle, var_row_max: T.handle, var_row_sum: T.handle,
               var_probs: T.handle):
        T.func_attr({"tirx.noalias": True})
        batch_size = T.int64()
        logits = T.match_buffer(var_logits, (batch_size, vocab_size), "float32")
        temperature = T.match_buffer(var_temperature, (batch_size,), "float32")
        row_max = T.match_buffer(var_row_max, (batch_size,), "float32")
        row_sum = T.match_buffer(var_row_sum, (batch_size,), "float32")
        probs = T.match_buffer(var_probs, (batch_size, vocab_size), "float32")
        for bx in T.thread_binding(batch_size * T.ceildiv(vocab_size, threads), thread="blockIdx.x"):
            for tx in T.thread_binding(threads, thread="threadIdx.x"):
                with T.sblock("probs"):
                    row: T.let[T.int32] = T.Cast("int32", bx // T.ceildiv(vocab_size, threads))
                    v: T.let[T.int32] = T.Cast("int32", bx % T.ceildiv(vocab_size, threads)) * threads + tx
                    if v < vocab_size:
                        temp: T.let[T.float32] = temperature[row]
                        x: T.let[T.float32] = T.if_then_else(temp > T.float32(eps), logits[row, v] / temp, logits[row, v])
                        probs[row, v] = T.if_then_else(
                            x == row_max[row], T.float32(1) / row_sum[row],
                            T.if_then_else(temp > T.float32(eps), T.exp(x - row_max[row]) / row_sum[row], T.float32(0)))

    return kernel


def top_p_chunk_sums_gpu(vocab_size: int, chunk: int, threads: int) -> tirx.PrimFunc:
    """One workgroup per (row, chunk), tree sum in workgroup memory."""
    lanes = _reduce_threads(threads)
    nc = -(-vocab_size // chunk)
    per_lane = -(-chunk // lanes)
    levels = lanes.bit_length() - 1

    @T.prim_func(private=True, s_tir=True)
    def kernel(var_sorted_probs: T.handle, var_chunk_sums: T.handle):
        T.func_attr({"tirx.noalias": True})
        batch_size = T.int64()
        sorted_probs = T.match_buffer(var_sorted_probs, (batch_size, vocab_size), "float32")
        chunk_sums = T.match_buffer(var_chunk_sums, (batch_size, nc), "float32")
        for bx in T.thread_binding(batch_size * nc, thread="blockIdx.x"):
            for tx in T.thread_binding(lanes, thread="threadIdx.x"):
                with T.sblock("chunk_sums"):
                    red = T.sblock_alloc_buffer((lanes,), "float32", scope="shared")
                    acc = T.sblock_alloc_buffer((1,), "float32", scope="local")
                    row: T.let[T.int32] = T.Cast("int32", bx // nc)
                    start: T.let[T.int32] = T.Cast("int32", bx % nc) * chunk
                    acc[0] = T.float32(0)
                    for e in range(per_lane):
                        if e * lanes + tx < chunk and start + e * lanes + tx < vocab_size:
                            acc[0] = acc[0] + sorted_probs[row, start + e * lanes + tx]
                    red[tx] = acc[0]
                    T.tvm_storage_sync("shared")
                    for level in range(levels):
                        if tx < T.shift_right(lanes, level + 1):
                            red[tx] = red[tx] + red[tx + T.shift_right(lanes, level + 1)]
                        T.tvm_storage_sync("shared")
                    if tx == 0:
                        chunk_sums[row, T.Cast("int32", bx % nc)] = red[0]

    return kernel


def bitmask_gpu(vocab_size: int, threads: int, kind: str) -> tirx.PrimFunc:
    lowest = lowest_f32(exact_literal=kind == "cuda")
    words = -(-vocab_size // 32)
    blocks_per_seq = -(-vocab_size // threads)

    @T.prim_func(private=True, s_tir=True)
    def kernel(var_logits: T.handle, var_seq_ids: T.handle, var_bitmask: T.handle):
        T.func_attr({"tirx.noalias": True})
        batch_size = T.int64()
        num_seq = T.int64()
        logits = T.match_buffer(var_logits, (batch_size, vocab_size), "float32")
        seq_ids = T.match_buffer(var_seq_ids, (num_seq,), "int32")
        bitmask = T.match_buffer(var_bitmask, (batch_size, words), "int32")
        for bx in T.thread_binding(num_seq * blocks_per_seq, thread="blockIdx.x"):
            for tx in T.thread_binding(threads, thread="threadIdx.x"):
                with T.sblock("bitmask"):
                    row: T.let[T.int32] = seq_ids[T.Cast("int32", bx // blocks_per_seq)]
                    v: T.let[T.int32] = T.Cast("int32", bx % blocks_per_seq) * threads + tx
                    if v < vocab_size:
                        if T.bitwise_and(T.shift_right(bitmask[row, v // 32], v % 32), 1) == 0:
                            logits[row, v] = lowest

    return kernel


def argsort_global_gpu(padded: int, threads: int) -> tirx.PrimFunc:
    half = padded // 2
    blocks_per_row = -(-half // threads)

    @T.prim_func(private=True, s_tir=True)
    def kernel(var_keys: T.handle, var_idx: T.handle, sort_k: T.int32, sort_j: T.int32):
        T.func_attr({"tirx.noalias": True})
        batch_size = T.int64()
        keys = T.match_buffer(var_keys, (batch_size, padded), "float32")
        idx = T.match_buffer(var_idx, (batch_size, padded), "int32")
        for bx in T.thread_binding(batch_size * blocks_per_row, thread="blockIdx.x"):
            for tx in T.thread_binding(threads, thread="threadIdx.x"):
                with T.sblock("step"):
                    b: T.let[T.int32] = T.Cast("int32", bx // blocks_per_row)
                    p: T.let[T.int32] = T.Cast("int32", bx % blocks_per_row) * threads + tx
                    if p < half:
                        lo: T.let[T.int32] = T.floordiv(p, sort_j) * sort_j * 2 + T.floormod(p, sort_j)
                        hi: T.let[T.int32] = lo + sort_j
                        desc: T.let[T.bool] = T.bitwise_and(lo, sort_k) == 0
                        exchange_rows(keys, idx, b, lo, hi, desc)

    return kernel


def _tile_threads(tile: int, threads: int) -> int:
    return max(1, min(tile // 2, threads))


def _tile_shape(tile: int, threads: int) -> tuple[int, int, int, int]:
    """(lanes, log2 tile, entries each lane loads / stores, pairs each lane compare-exchanges per step)."""
    lanes = _tile_threads(tile, threads)
    return lanes, tile.bit_length() - 1, tile // lanes, tile // 2 // lanes


@T.macro
def _sort_steps(sk, si, tx, threads, pairs, log_k, base, desc_all):
    """The steps j = 2^(log_k - 1) .. 1 of bitonic stage 2^log_k over a tile in workgroup memory;
    a pair is descending where `desc_all` says (None: where bit log_k of its global position is 0)."""
    for step in range(log_k):
        for q in range(pairs):
            log_j: T.let[T.int32] = log_k - 1 - step
            p: T.let[T.int32] = q * threads + tx
            lo: T.let[T.int32] = pair_lo(p, log_j)
            hi: T.let[T.int32] = lo + T.shift_left(1, log_j)
            if desc_all is None:
                desc: T.let[T.bool] = T.bitwise_and(base + lo, T.shift_left(1, log_k)) == 0
                exchange_tile(sk, si, lo, hi, desc)
            else:
                exchange_tile(sk, si, lo, hi, desc_all)
        T.tvm_storage_sync("shared")


@T.macro
def _load_tile(sk, si, keys, idx, b, base, tx, threads, per_thread):
    for e in range(per_thread):
        sk[e * threads + tx] = keys[b, base + e * threads + tx]
        si[e * threads + tx] = idx[b, base + e * threads + tx]
    T.tvm_storage_sync("shared")


@T.macro
def _store_tile(sk, si, keys, idx, b, base, tx, threads, per_thread, bound):
    """The tile back to (keys, idx) at `base`, entries from `bound` on left out (None: all)."""
    for e in range(per_thread):
        if bound is None:
            keys[b, base + e * threads + tx] = sk[e * threads + tx]
            idx[b, base + e * threads + tx] = si[e * threads + tx]
        elif base + e * threads + tx < bound:
            keys[b, base + e * threads + tx] = sk[e * threads + tx]
            idx[b, base + e * threads + tx] = si[e * threads + tx]


def argsort_tiles_gpu(vocab_size: int, padded: int, tile: int, out_len: int, threads: int, kind: str) -> tirx.PrimFunc:
    """Load a tile (probs, padding), run stages k = 2 .. tile in workgroup memory, store."""
    lowest = lowest_f32(exact_literal=kind == "cuda")
    threads, log_tile, per_thread, pairs = _tile_shape(tile, threads)
    tiles = padded // tile

    @T.prim_func(private=True, s_tir=True)
    def kernel(var_probs: T.handle, var_keys: T.handle, var_idx: T.handle):
        T.func_attr({"tirx.noalias": True})
        batch_size = T.int64()
        probs = T.match_buffer(var_probs, (batch_size, vocab_size), "float32")
        keys = T.match_buffer(var_keys, (batch_size, out_len), "float32")
        idx = T.match_buffer(var_idx, (batch_size, out_len), "int32")
        for bx in T.thread_binding(batch_size * tiles, thread="blockIdx.x"):
            for tx in T.thread_binding(threads, thread="threadIdx.x"):
                with T.sblock("tile"):
                    sk = T.sblock_alloc_buffer((tile,), "float32", scope="shared")
                    si = T.sblock_alloc_buffer((tile,), "int32", scope="shared")
                    b: T.let[T.int32] = T.Cast("int32", bx // tiles)
                    base: T.let[T.int32] = T.Cast("int32", bx % tiles) * tile
                    for e in range(per_thread):
                        sk[e * threads + tx] = T.if_then_else(
                            base + e * threads + tx < vocab_size,
                            probs[b, T.min(base + e * threads + tx, vocab_size - 1)], lowest)
                        si[e * threads + tx] = base + e * threads + tx
                    T.tvm_storage_sync("shared")
                    for log_k in range(1, log_tile + 1):
                        _sort_steps(sk, si, tx, threads, pairs, log_k, base, None)
                    _store_tile(sk, si, keys, idx, b, base, tx, threads, per_thread, out_len)

    return kernel


def argsort_merge_gpu(padded: int, tile: int, threads: int) -> tirx.PrimFunc:
    """Steps j = tile/2 .. 1 of stage sort_k inside each tile, in place."""
    threads, log_tile, per_thread, pairs = _tile_shape(tile, threads)
    tiles = padded // tile

    @T.prim_func(private=True, s_tir=True)
    def kernel(var_keys: T.handle, var_idx: T.handle, sort_k: T.int32):
        T.func_attr({"tirx.noalias": True})
        batch_size = T.int64()
        keys = T.match_buffer(var_keys, (batch_size, padded), "float32")
        idx = T.match_buffer(var_idx, (batch_size, padded), "int32")
        for bx in T.thread_binding(batch_size * tiles, thread="blockIdx.x"):
            for tx in T.thread_binding(threads, thread="threadIdx.x"):
                with T.sblock("merge"):
                    sk = T.sblock_alloc_buffer((tile,), "float32", scope="shared")
                    si = T.sblock_alloc_buffer((tile,), "int32", scope="shared")
                    b: T.let[T.int32] = T.Cast("int32", bx // tiles)
                    base: T.let[T.int32] = T.Cast("int32", bx % tiles) * tile
                    desc: T.let[T.bool] = T.bitwise_and(base, sort_k) == 0
                    _load_tile(sk, si, keys, idx, b, base, tx, threads, per_thread)
                    _sort_steps(sk, si, tx, threads, pairs, log_tile, base, desc)
                    _store_tile(sk, si, keys, idx, b, base, tx, threads, per_thread, None)

    return kernel


def argsort_merge_final_gpu(vocab_size: int, padded: int, tile: int, threads: int) -> tirx.PrimFunc:
    """The last stage (k = padded: all descending) inside each tile, into the (b, V) outputs."""
    threads, log_tile, per_thread, pairs = _tile_shape(tile, threads)
    tiles = padded // tile

    @T.prim_func(private=True, s_tir=True)
    def kernel(var_keys: T.handle, var_idx: T.handle, var_out_keys: T.handle, var_out_idx: T.handle):
        T.func_attr({"tirx.noalias": True})
        batch_size = T.int64()
        keys = T.match_buffer(var_keys, (batch_size, padded), "float32")
        idx = T.match_buffer(var_idx, (batch_size, padded), "int32")
        out_keys = T.match_buffer(var_out_keys, (batch_size, vocab_size), "float32")
        out_idx = T.match_buffer(var_out_idx, (batch_size, vocab_size), "int32")
        for bx in T.thread_binding(batch_size * tiles, thread="blockIdx.x"):
            for tx in T.thread_binding(threads, thread="threadIdx.x"):
                with T.sblock("merge"):
                    sk = T.sblock_alloc_buffer((tile,), "float32", scope="shared")
                    si = T.sblock_alloc_buffer((tile,), "int32", scope="shared")
                    b: T.let[T.int32] = T.Cast("int32", bx // tiles)
                    base: T.let[T.int32] = T.Cast("int32", bx % tiles) * tile
                    _load_tile(sk, si, keys, idx, b, base, tx, threads, per_thread)
                    _sort_steps(sk, si, tx, threads, pairs, log_tile, base, T.bool(True))
                    _store_tile(sk, si, out_keys, out_idx, b, base, tx, threads, per_thread, vocab_size)

    return kernel


def gpu_kernel(info: dict, threads: int, kind_of_target: str) -> tirx.PrimFunc | None:
    """The hand-written GPU form of the sampler kernel described by `info`, or None where dlight
    schedules the reference kernel."""
    kind, vocab = info["kind"], info["vocab"]
    if kind == "softmax_chunk_stats":
        return softmax_chunk_stats_gpu(vocab, info["chunk"], threads, kind_of_target)
    if kind == "softmax_merge":
        return softmax_merge_gpu(vocab, info["chunk"], threads, kind_of_target)
    if kind == "softmax_normalize":
        return softmax_normalize_gpu(vocab, threads)
    if kind == "top_p_chunk_sums":
        return top_p_chunk_sums_gpu(vocab, info["chunk"], threads)
    if kind == "apply_bitmask":
        return bitmask_gpu(vocab, threads, kind_of_target)
    if kind == "argsort_tiles":
        return argsort_tiles_gpu(vocab, info["padded"], info["tile"], info["out_len"], threads, kind_of_target)
    if kind == "argsort_global":
        return argsort_global_gpu(info["padded"], threads)
    if kind == "argsort_merge":
        return argsort_merge_gpu(info["padded"], info["tile"], threads)
    if kind == "argsort_merge_final":
        return argsort_merge_final_gpu(vocab, info["padded"], info["tile"], threads)
    return None


# kernels whose reference loop is their GPU form, split over threads, a row a lane: kind -> block.
# top_p_pick: a sample (it walks its chunk sums, then at most two chunks); logit bias, penalty: a
# token (the runtimes give each token at most once per sequence: no two lanes touch one logit)
ROW_LOOPS = {"top_p_pick": "pick", "apply_logit_bias": "bias", "apply_penalty": "penalty"}


@dataclasses.dataclass
class SamplerGPU(UntunedRule, GPUScheduleRule):
    threads: int = 0  # lanes per workgroup; 0 = the target's limit

    def apply(self, func: tirx.PrimFunc, target: Target, tunable: bool) -> s_tir.Schedule | None:
        del tunable
        info = sampler_info(func) if self.is_target_available(target) else None
        if info is None:
            return None
        threads = self.threads or max_threads(target)
        if info["kind"] in ROW_LOOPS:
            return s_tir.Schedule(bind_row_loop(func, ROW_LOOPS[info["kind"]], threads))
        new = gpu_kernel(info, threads, target.kind.name)
        if new is None:
            return None
        for key, value in func.attrs.items():
            if key not in new.attrs:
                new = new.with_attr(key, value)
        return s_tir.Schedule(new)

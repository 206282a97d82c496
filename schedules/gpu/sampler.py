"""GPU forms of the sampler kernels (pipeline/model/sampler.py): the rule SamplerGPU.

The kernels with one row loop (logit bias and penalties: a token a lane; top_p_pick: a sample a
lane) are their reference loop split over threads (tir_rewrite.bind_row_loop); the others
(bitmask, the bitonic argsort's steps, the softmax / top-p chunk passes) get a thread-bound body
put under the reference's own parameters, so the signature is defined once (the contract is
checked against the llvm reference by `mlcpipe check`). Launch shapes per kernel: docs/schedules.md.
Knob: threads (lanes per workgroup; 0 = the target's limit: 256 on WebGPU / Metal, 1024 on CUDA).
"""

from __future__ import annotations

import dataclasses

from tvm import s_tir, tirx
from tvm.script import tirx as T
from tvm.target import Target

from mlcpipe.model.sampler_spec import GREEDY_TEMPERATURE
from mlcpipe.model.sampler_tir import exchange_rows, exchange_tile, lowest_f32, pair_lo

from ..analysis import sampler_info
from ..base import GPUScheduleRule, UntunedRule, max_threads
from ..tir_rewrite import bind_row_loop

EPS = GREEDY_TEMPERATURE


def _rows(buf) -> tirx.PrimExpr:
    """A parameter buffer's first extent (batch_size, num_seq)."""
    return buf.ty.shape[0]


def _launch(name: str, blocks, lanes: int, body) -> tirx.PrimFunc:
    """A parameterless kernel (its body reads the reference's parameter buffers from its
    closure; SamplerGPU puts it under the reference's signature): `blocks` workgroups of `lanes`
    threads running the macro `body(bx, tx)` in one block."""

    @T.prim_func(private=True, s_tir=True, check_well_formed=False)
    def kernel():
        for bx in T.thread_binding(blocks, thread="blockIdx.x"):
            for tx in T.thread_binding(lanes, thread="threadIdx.x"):
                with T.sblock(name):
                    body(bx, tx)

    return kernel


def _launch_entries(name: str, rows, count: int, threads: int, body) -> tirx.PrimFunc:
    """One thread per (row, entry < count) of `rows` rows: the macro `body(row, entry)` (int32s)."""
    per_row = -(-count // threads)

    @T.macro
    def entries(bx, tx):
        row: T.let[T.int32] = T.Cast("int32", bx // per_row)
        entry: T.let[T.int32] = T.Cast("int32", bx % per_row) * threads + tx
        if entry < count:
            body(row, entry)

    return _launch(name, rows * per_row, threads, entries)


def _launch_groups(name: str, rows, groups: int, lanes: int, body) -> tirx.PrimFunc:
    """One workgroup of `lanes` per (row, group < groups): the macro `body(tx, red, acc, row, group)`
    with `red` (a float32 per lane, workgroup memory) and `acc` (one float32, the lane's own)."""

    @T.macro
    def grouped(bx, tx):
        red = T.sblock_alloc_buffer((lanes,), "float32", scope="shared")
        acc = T.sblock_alloc_buffer((1,), "float32", scope="local")
        row: T.let[T.int32] = T.Cast("int32", bx // groups)
        group: T.let[T.int32] = T.Cast("int32", bx % groups)
        body(tx, red, acc, row, group)

    return _launch(name, rows * groups, lanes, grouped)


def _reduce_lanes(threads: int) -> tuple[int, int]:
    """(lanes, log2 lanes) of a reduction workgroup: a power of two, at most 256."""
    lanes = 1
    while lanes * 2 <= min(threads, 256):
        lanes *= 2
    return lanes, lanes.bit_length() - 1


def _chunk_shape(info: dict, threads: int) -> tuple[int, int, int, int, int, int]:
    """(vocab, chunk, lanes, log2 lanes, chunks per row, entries per lane) of a chunk reduction."""
    vocab, chunk = info["vocab"], info["chunk"]
    lanes, levels = _reduce_lanes(threads)
    return vocab, chunk, lanes, levels, -(-vocab // chunk), -(-chunk // lanes)


def _add(a, b):
    return a + b


@T.macro
def _tree(red, tx, lanes, levels, value, op):
    """red[0] = op over the workgroup's lanes of each lane's `value`, a tree in workgroup memory."""
    red[tx] = value
    T.tvm_storage_sync("shared")
    for level in range(levels):
        if tx < T.shift_right(lanes, level + 1):
            red[tx] = op(red[tx], red[tx + T.shift_right(lanes, level + 1)])
        T.tvm_storage_sync("shared")


def _tempered(x, temp):
    """A logit at temperature `temp` (greedy rows: the logit itself)."""
    return tirx.if_then_else(temp > tirx.const(EPS, "float32"), x / temp, x)


def _exp_term(x, top, temp, weight):
    """`weight` x exp(x - top): exactly `weight` at the maximum, 0 elsewhere in greedy rows."""
    greedy_zero = tirx.if_then_else(temp > tirx.const(EPS, "float32"), weight * T.exp(x - top), tirx.const(0, "float32"))
    return tirx.if_then_else(tirx.EQ(x, top), weight, greedy_zero)


def softmax_chunk_stats_gpu(params, info: dict, threads: int, kind: str) -> tirx.PrimFunc:
    """One workgroup per (row, chunk): a max then a sum over the chunk."""
    logits, temperature, chunk_max, chunk_sum = params
    vocab, chunk, lanes, levels, nc, per_lane = _chunk_shape(info, threads)
    lowest = lowest_f32(exact_literal=kind == "cuda")

    @T.macro
    def body(tx, red, acc, row, c):
        start: T.let[T.int32] = c * chunk
        temp: T.let[T.float32] = temperature[row]
        acc[0] = lowest
        for e in range(per_lane):
            if e * lanes + tx < chunk and start + e * lanes + tx < vocab:
                acc[0] = T.max(acc[0], _tempered(logits[row, start + e * lanes + tx], temp))
        _tree(red, tx, lanes, levels, acc[0], T.max)
        top: T.let[T.float32] = red[0]
        T.tvm_storage_sync("shared")
        acc[0] = T.float32(0)
        for e in range(per_lane):
            if e * lanes + tx < chunk and start + e * lanes + tx < vocab:
                x: T.let[T.float32] = _tempered(logits[row, start + e * lanes + tx], temp)
                acc[0] = acc[0] + _exp_term(x, top, temp, T.float32(1))
        _tree(red, tx, lanes, levels, acc[0], _add)
        if tx == 0:
            chunk_max[row, c] = top
            chunk_sum[row, c] = red[0]

    return _launch_groups("stats", _rows(logits), nc, lanes, body)


def softmax_merge_gpu(params, info: dict, threads: int, kind: str) -> tirx.PrimFunc:
    """One workgroup per row over its chunk statistics."""
    chunk_max, chunk_sum, temperature, row_max, row_sum = params
    lowest = lowest_f32(exact_literal=kind == "cuda")
    _, _, lanes, levels, nc, _ = _chunk_shape(info, threads)
    per_lane = -(-nc // lanes)

    @T.macro
    def body(tx, red, acc, row, _):
        temp: T.let[T.float32] = temperature[row]
        acc[0] = lowest
        for e in range(per_lane):
            if e * lanes + tx < nc:
                acc[0] = T.max(acc[0], chunk_max[row, e * lanes + tx])
        _tree(red, tx, lanes, levels, acc[0], T.max)
        top: T.let[T.float32] = red[0]
        T.tvm_storage_sync("shared")
        acc[0] = T.float32(0)
        for e in range(per_lane):
            if e * lanes + tx < nc:
                acc[0] = acc[0] + _exp_term(chunk_max[row, e * lanes + tx], top, temp, chunk_sum[row, e * lanes + tx])
        _tree(red, tx, lanes, levels, acc[0], _add)
        if tx == 0:
            row_max[row] = top
            row_sum[row] = red[0]

    return _launch_groups("merge", _rows(chunk_max), 1, lanes, body)


def softmax_normalize_gpu(params, info: dict, threads: int, kind: str) -> tirx.PrimFunc:
    """One thread per probability."""
    logits, temperature, row_max, row_sum, probs = params

    @T.macro
    def body(row, v):
        temp: T.let[T.float32] = temperature[row]
        probs[row, v] = _exp_term(_tempered(logits[row, v], temp), row_max[row], temp, T.float32(1)) / row_sum[row]

    return _launch_entries("probs", _rows(logits), info["vocab"], threads, body)


def top_p_chunk_sums_gpu(params, info: dict, threads: int, kind: str) -> tirx.PrimFunc:
    """One workgroup per (row, chunk), tree sum in workgroup memory."""
    sorted_probs, chunk_sums = params
    vocab, chunk, lanes, levels, nc, per_lane = _chunk_shape(info, threads)

    @T.macro
    def body(tx, red, acc, row, c):
        start: T.let[T.int32] = c * chunk
        acc[0] = T.float32(0)
        for e in range(per_lane):
            if e * lanes + tx < chunk and start + e * lanes + tx < vocab:
                acc[0] = acc[0] + sorted_probs[row, start + e * lanes + tx]
        _tree(red, tx, lanes, levels, acc[0], _add)
        if tx == 0:
            chunk_sums[row, c] = red[0]

    return _launch_groups("chunk_sums", _rows(sorted_probs), nc, lanes, body)


def bitmask_gpu(params, info: dict, threads: int, kind: str) -> tirx.PrimFunc:
    """One thread per (sequence, vocabulary entry)."""
    logits, seq_ids, bitmask = params
    lowest = lowest_f32(exact_literal=kind == "cuda")

    @T.macro
    def body(seq, v):
        row: T.let[T.int32] = seq_ids[seq]
        if T.bitwise_and(T.shift_right(bitmask[row, v // 32], v % 32), 1) == 0:
            logits[row, v] = lowest

    return _launch_entries("bitmask", _rows(seq_ids), info["vocab"], threads, body)


def argsort_global_gpu(params, info: dict, threads: int, kind: str) -> tirx.PrimFunc:
    """One thread per compare-exchange pair of a step whose pairs span tiles."""
    keys, idx, sort_k, sort_j = params

    @T.macro
    def body(b, p):
        lo: T.let[T.int32] = T.floordiv(p, sort_j) * sort_j * 2 + T.floormod(p, sort_j)
        hi: T.let[T.int32] = lo + sort_j
        desc: T.let[T.bool] = T.bitwise_and(lo, sort_k) == 0
        exchange_rows(keys, idx, b, lo, hi, desc)

    return _launch_entries("step", _rows(keys), info["padded"] // 2, threads, body)


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


def _tile_kernel(rows, info: dict, threads: int, first_stage: int, load, desc, store) -> tirx.PrimFunc:
    """One workgroup per tile held in workgroup memory: `load(sk, si, b, base, i)` each of its
    entries, bitonic stages 2^first_stage .. tile (pairs descending where `desc(base)` says, None:
    by position), `store(sk, si, b, base, i)` each entry; each of the lanes compare-exchanges
    tile / 2 / lanes disjoint pairs per step, a barrier between steps."""
    tile, tiles = info["tile"], info["padded"] // info["tile"]
    lanes = max(1, min(tile // 2, threads))
    log_tile, per_lane, pairs = tile.bit_length() - 1, tile // lanes, tile // 2 // lanes

    @T.macro
    def body(bx, tx):
        sk = T.sblock_alloc_buffer((tile,), "float32", scope="shared")
        si = T.sblock_alloc_buffer((tile,), "int32", scope="shared")
        b: T.let[T.int32] = T.Cast("int32", bx // tiles)
        base: T.let[T.int32] = T.Cast("int32", bx % tiles) * tile
        for e in range(per_lane):
            load(sk, si, b, base, e * lanes + tx)
        T.tvm_storage_sync("shared")
        if first_stage == log_tile:
            _sort_steps(sk, si, tx, lanes, pairs, log_tile, base, desc(base))
        else:
            for log_k in range(first_stage, log_tile + 1):
                _sort_steps(sk, si, tx, lanes, pairs, log_k, base, desc(base))
        for e in range(per_lane):
            store(sk, si, b, base, e * lanes + tx)

    return _launch("tile", rows * tiles, lanes, body)


def _tile_io(keys, idx, bound=None):
    """(load, store) macros between a tile and the (keys, idx) rows; store leaves out entries from
    `bound` on (None: none)."""

    def kept(pos):
        return tirx.const(True, "bool") if bound is None else tirx.LT(pos, bound)

    @T.macro
    def load(sk, si, b, base, i):
        sk[i] = keys[b, base + i]
        si[i] = idx[b, base + i]

    @T.macro
    def store(sk, si, b, base, i):
        if kept(base + i):
            keys[b, base + i] = sk[i]
            idx[b, base + i] = si[i]

    return load, store


def argsort_tiles_gpu(params, info: dict, threads: int, kind: str) -> tirx.PrimFunc:
    """Load a tile (probs, padding), run stages k = 2 .. tile in workgroup memory, store."""
    probs, keys, idx = params
    vocab = info["vocab"]
    lowest = lowest_f32(exact_literal=kind == "cuda")

    @T.macro
    def load(sk, si, b, base, i):
        sk[i] = T.if_then_else(base + i < vocab, probs[b, T.min(base + i, vocab - 1)], lowest)
        si[i] = base + i

    return _tile_kernel(_rows(probs), info, threads, 1, load, lambda base: None, _tile_io(keys, idx, info["out_len"])[1])


def argsort_merge_gpu(params, info: dict, threads: int, kind: str) -> tirx.PrimFunc:
    """Steps j = tile/2 .. 1 of stage sort_k inside each tile, in place."""
    keys, idx, sort_k = params
    load, store = _tile_io(keys, idx)
    return _tile_kernel(_rows(keys), info, threads, info["tile"].bit_length() - 1, load,
                        lambda base: tirx.EQ(tirx.bitwise_and(base, sort_k), tirx.const(0, "int32")), store)


def argsort_merge_final_gpu(params, info: dict, threads: int, kind: str) -> tirx.PrimFunc:
    """The last stage (k = padded: all descending) inside each tile, into the (b, V) outputs."""
    keys, idx, out_keys, out_idx = params
    return _tile_kernel(_rows(keys), info, threads, info["tile"].bit_length() - 1, _tile_io(keys, idx)[0],
                        lambda base: T.bool(True), _tile_io(out_keys, out_idx, info["vocab"])[1])


# kind -> the builder of its GPU body from the reference's parameters (MLC-LLM's order)
GPU_BODIES = {
    "softmax_chunk_stats": softmax_chunk_stats_gpu, "softmax_merge": softmax_merge_gpu,
    "softmax_normalize": softmax_normalize_gpu, "top_p_chunk_sums": top_p_chunk_sums_gpu,
    "apply_bitmask": bitmask_gpu, "argsort_tiles": argsort_tiles_gpu, "argsort_global": argsort_global_gpu,
    "argsort_merge": argsort_merge_gpu, "argsort_merge_final": argsort_merge_final_gpu,
}


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
        build = GPU_BODIES.get(info["kind"])
        if build is None:
            return None
        return s_tir.Schedule(func.with_body(build(func.params, info, threads, target.kind.name).body))

"""CPU attention kernels replacing TVM's `batch_decode_paged_kv_cpu`, `batch_prefill_ragged_kv` and
the paged prefill `batch_prefill_paged_kv_cpu` (and its `_sliding_window` twin, as the passes' fix
left it: pipeline/passes/kv_cache_fixes.py).

Same signatures and contracts (decode: online-softmax attention of one new token per sequence over
its paged K/V; ragged prefill: causal attention of a prompt chunk over itself; paged prefill: a
chunk's queries over their sequences' history, with the cross mask of a causal or sliding-window
layer; output and log2-sum-exp per head), but (sequence or query token, KV head) pairs run in
parallel, all query heads of a GQA group share each K/V row, and the head dimension is vectorised;
the kernels share one online-softmax body (`_attend`). Handles: TVM's signatures with head dim % 16
== 0 and whole GQA groups; rotary embedding inside attention (rotary_mode 1) is not implemented
(asserted). No knobs. Design notes: docs/schedules.md.
"""

from __future__ import annotations

import tvm
from tvm import tirx
from tvm.script import tirx as T

from mlcpipe.passes.kv_cache_fixes import KERNELS as PAGED_PREFILL_NAMES
from mlcpipe.passes.kv_cache_fixes import WINDOW_ATTR, length_info_at, length_info_buffer

from .microkernels import lane_sum

LOG2E = 1.4426950408889634
KERNEL_NAME = "batch_decode_paged_kv_cpu"
RAGGED_KERNEL_NAME = "batch_prefill_ragged_kv"
BLOCK = 16  # K/V rows per softmax block


def _attend(qv, o, part, score, top, m, d, kv_rows, kv, group: int, chunks: int, lanes: int, prefetch: bool) -> None:
    """Emit (inside a TVMScript kernel) the online-softmax attention of `group` query heads (qv,
    already scaled by sm_scale) over `kv_rows` K/V rows, BLOCK rows at a time: the block's scores
    (a dot product per row and head, lanes summed by a shuffle tree), one rescale per block with
    the exp vectorised over the block (natural base, fast_exp.py), then the V rows weighted into o,
    chunk by chunk. `kv = (key, value)`: key(row, x) / value(row, x) load element x of a K / V row.
    Running state: m (max), d (sum of exps), o; score / top / part are scratch. `prefetch`: at each
    block, prefetch the next block's rows (paged K/V: the next page, which the hardware prefetchers
    do not guess; contiguous ragged rows do not need it)."""
    key, value = kv
    with T.serial((kv_rows + BLOCK - 1) // BLOCK) as blk:
        for r in range(BLOCK if prefetch else 0):  # the next block's K / V rows into L1
            for x in range(0, chunks * lanes, 32):  # 64 B of f16
                for load in (key, value):
                    T.evaluate(T.call_llvm_intrin("void", "llvm.prefetch.p0", T.address_of(load(T.min(blk * BLOCK + BLOCK + r, kv_rows - 1), x)), 0, 3, 1))
        with T.serial(BLOCK) as r:
            with T.If(blk * BLOCK + r < kv_rows):
                with T.Then():
                    with T.unroll(group) as g:
                        with T.vectorized(lanes) as l:
                            T.buffer_store(part, T.float32(0.0), [l])
                        with T.serial(chunks) as c:
                            with T.vectorized(lanes) as l:
                                x = c * lanes + l
                                T.buffer_store(part, part[l] + qv[g, x] * T.Cast("float32", key(blk * BLOCK + r, x)), [l])
                        T.buffer_store(score, lane_sum(part[T.ramp(0, 1, lanes)], lanes), [g, r])
                with T.Else():
                    with T.serial(group) as g:
                        T.buffer_store(score, T.float32(-50000.0), [g, r])
        with T.serial(group) as g:
            T.buffer_store(top, m[g], [0])
            with T.serial(BLOCK) as r:
                T.buffer_store(top, T.max(top[0], score[g, r]), [0])
            T.buffer_store(top, T.exp(m[g] - top[0]), [1])  # the rescale of what came before
            with T.vectorized(BLOCK) as r:
                T.buffer_store(score, T.exp(score[g, r] - top[0]), [g, r])
            T.buffer_store(d, d[g] * top[1] + lane_sum(score[g, T.ramp(0, 1, BLOCK)], BLOCK), [g])
            T.buffer_store(m, top[0], [g])
            with T.serial(chunks) as c:
                with T.vectorized(lanes) as l:
                    T.buffer_store(o, o[g, c * lanes + l] * top[1], [g, c * lanes + l])
        with T.serial(chunks) as c:
            with T.serial(T.min(BLOCK, kv_rows - blk * BLOCK)) as r:
                with T.unroll(group) as g:
                    with T.vectorized(lanes) as l:
                        x = c * lanes + l
                        T.buffer_store(o, o[g, x] + score[g, r] * T.Cast("float32", value(blk * BLOCK + r, x)), [g, x])


def _scratch(group: int, head_dim: int, lanes: int):
    """A task's attention state (qv, o, part, score, top, m, d; what `_attend` takes) as local buffers."""
    return (T.alloc_buffer((group, head_dim), "float32"), T.alloc_buffer((group, head_dim), "float32"),
            T.alloc_buffer((lanes,), "float32"), T.alloc_buffer((group, BLOCK), "float32"), T.alloc_buffer((2,), "float32"),
            T.alloc_buffer((group,), "float32"), T.alloc_buffer((group,), "float32"))


def _start(qv, o, m, d, q, row, head0, scale, chunks: int, lanes: int) -> None:
    """Emit: the group's running state emptied (m, d, o) and its queries q[row, head0 + g] scaled
    into qv (float32)."""
    with T.serial(qv.shape[0]) as g:
        T.buffer_store(m, T.float32(-50000.0), [g])
        T.buffer_store(d, T.float32(0.0), [g])
        with T.serial(chunks) as c:
            with T.vectorized(lanes) as l:
                T.buffer_store(qv, T.Cast("float32", q[row, head0 + g, c * lanes + l]) * scale, [g, c * lanes + l])
                T.buffer_store(o, T.float32(0.0), [g, c * lanes + l])


def _finish(o, m, d, output, lse, row, head0, chunks: int, lanes: int, seen=None) -> None:
    """Emit: output[row, head0 + g] = o / d and its log2-sum-exp; where `seen` is false (no K/V
    row visible), output 0 and log2-sum-exp -50000, as TVM's kernels give them."""
    with T.serial(o.shape[0]) as g:
        with T.serial(chunks) as c:
            with T.vectorized(lanes) as l:
                value = o[g, c * lanes + l] / d[g]
                value = value if seen is None else T.if_then_else(seen, value, T.float32(0.0))
                T.buffer_store(output, T.Cast(output.dtype, value), [row, head0 + g, c * lanes + l])
        total = m[g] * T.float32(LOG2E) + T.log2(d[g])
        T.buffer_store(lse, total if seen is None else T.if_then_else(seen, total, T.float32(-50000.0)), [row, head0 + g])


def _paired_token(task, num_kv_heads: int, tokens):
    """The query token of a (token, KV head) task, taken as 0, n-1, 1, n-2, ...: causal rows grow
    with the token, and the thread pool hands each thread a contiguous range of tasks: pairs keep
    them even."""
    pair = task // num_kv_heads
    return T.if_then_else(pair % 2 == 0, pair // 2, tokens - 1 - pair // 2)


def _find_sequence(seq, indptr, batch_size, t) -> None:
    """Emit: seq[0] = the sequence whose query tokens (indptr) hold token t."""
    T.buffer_store(seq, 0, [0])
    with T.serial(batch_size) as b:
        with T.If(indptr[b] <= t):
            with T.Then():
                T.buffer_store(seq, b, [0])


def history_rows(pages, page_values, begin, page_size: int, h, lo, sink, offset):
    """(key, value) loads of rows lo.. of a sequence's history in the paged KV cache: positions past
    the `sink` attention-sink rows sit `offset` further on (a sliding window's evicted pages)."""

    def at(kind):
        def load(row, x):
            pos = lo + row
            seq_pos = pos + T.Select(pos >= sink, offset - sink, 0)  # a select, not a branch: the loads stay vectorised
            return pages[page_values[begin + seq_pos // page_size], kind, h, seq_pos % page_size, x]
        return load

    return at(0), at(1)


def ragged_rows(k, v, base, h):
    """(key, value) loads of rows base.. of the ragged K / V."""
    return (lambda row, x: k[base + row, h, x]), (lambda row, x: v[base + row, h, x])


def decode_attention(num_kv_heads: int, num_qo_heads: int, head_dim: int, page_size: int, dtype: str, lanes: int = 16) -> tirx.PrimFunc:
    group = num_qo_heads // num_kv_heads
    chunks = head_dim // lanes
    assert head_dim % lanes == 0 and num_qo_heads % num_kv_heads == 0

    # fmt: off
    @T.prim_func
    def batch_decode_paged_kv_cpu(
        Q_handle: T.handle, pages_handle: T.handle, page_table_indptr_handle: T.handle,
        page_table_values_handle: T.handle, length_info_handle: T.handle, k_rope_pos_offset_handle: T.handle,
        q_rope_position_handle: T.handle, output_handle: T.handle, lse_handle: T.handle,
        rotary_mode: T.int32, rope_scale: T.float32, rope_theta: T.float32, sm_scale: T.float32,
    ):
        T.func_attr({"op_pattern": 8, "tirx.is_scheduled": True, "tirx.noalias": True})
        B = T.int32()
        max_num_pages = T.int32()
        nnz_pages = T.int32()
        Q = T.match_buffer(Q_handle, (B, num_qo_heads, head_dim), dtype)
        pages = T.match_buffer(pages_handle, (max_num_pages, 2, num_kv_heads, page_size, head_dim), dtype)
        page_table_indptr = T.match_buffer(page_table_indptr_handle, (B + 1,), "int32", offset_factor=1)
        page_table_values = T.match_buffer(page_table_values_handle, (nnz_pages,), "int32", offset_factor=1)
        length_info = T.match_buffer(length_info_handle, (B,), "int32", offset_factor=1)
        k_rope_pos_offset = T.match_buffer(k_rope_pos_offset_handle, (B,), "int32", offset_factor=1)  # noqa: F841 - declares the symbolic dim for TVMScript
        q_rope_position = T.match_buffer(q_rope_position_handle, (B,), "int32", offset_factor=1)  # noqa: F841 - declares the symbolic dim for TVMScript
        output = T.match_buffer(output_handle, (B, num_qo_heads, head_dim), dtype)
        lse = T.match_buffer(lse_handle, (B, num_qo_heads), "float32")
        assert rotary_mode == 0, "mlcpipe's CPU decode attention expects RoPE applied before the KV append (rotary_mode 0)"
        for task in T.parallel(B * num_kv_heads):
            q, o, part, score, top, m, d = _scratch(group, head_dim, lanes)
            b = task // num_kv_heads
            h = task % num_kv_heads
            begin = page_table_indptr[b]
            end = page_table_indptr[b + 1]
            kv_len = T.if_then_else(begin != end, (end - begin - 1) * page_size + length_info[b], 0)
            _start(q, o, m, d, Q, b, h * group, sm_scale, chunks, lanes)
            _attend(q, o, part, score, top, m, d, kv_len, history_rows(pages, page_table_values, begin, page_size, h, 0, 0, 0), group, chunks, lanes, True)
            _finish(o, m, d, output, lse, b, h * group, chunks, lanes)
    # fmt: on
    return batch_decode_paged_kv_cpu


def prefill_ragged_attention(num_kv_heads: int, num_qo_heads: int, head_dim: int, dtype: str, lanes: int = 16) -> tirx.PrimFunc:
    group = num_qo_heads // num_kv_heads
    chunks = head_dim // lanes
    assert head_dim % lanes == 0 and num_qo_heads % num_kv_heads == 0

    # fmt: off
    @T.prim_func
    def batch_prefill_ragged_kv(
        q_handle: T.handle, q_indptr_handle: T.handle, k_handle: T.handle, v_handle: T.handle,
        kv_indptr_handle: T.handle, q_rope_position_handle: T.handle, k_rope_pos_offset_handle: T.handle,
        output_handle: T.handle, lse_handle: T.handle,
        causal: T.int32, rotary_mode: T.int32, rope_scale: T.float32, rope_theta: T.float32, sm_scale: T.float32,
    ):
        T.func_attr({"op_pattern": 8, "tirx.is_scheduled": True, "tirx.noalias": True})
        qo_len = T.int32()
        batch_size = T.int32()
        kv_len = T.int32()
        q = T.match_buffer(q_handle, (qo_len, num_qo_heads, head_dim), dtype)
        q_indptr = T.match_buffer(q_indptr_handle, (batch_size + 1,), "int32", offset_factor=1)
        k = T.match_buffer(k_handle, (kv_len, num_kv_heads, head_dim), dtype)
        v = T.match_buffer(v_handle, (kv_len, num_kv_heads, head_dim), dtype)
        kv_indptr = T.match_buffer(kv_indptr_handle, (batch_size + 1,), "int32", offset_factor=1)
        q_rope_position = T.match_buffer(q_rope_position_handle, (qo_len,), "int32", offset_factor=1)  # noqa: F841 - declares the symbolic dim for TVMScript
        k_rope_pos_offset = T.match_buffer(k_rope_pos_offset_handle, (batch_size,), "int32", offset_factor=1)  # noqa: F841 - declares the symbolic dim for TVMScript
        output = T.match_buffer(output_handle, (qo_len, num_qo_heads, head_dim), dtype)
        lse = T.match_buffer(lse_handle, (qo_len, num_qo_heads), "float32")
        assert rotary_mode == 0, "mlcpipe's CPU prefill attention expects RoPE applied before attention (rotary_mode 0)"
        for task in T.parallel(qo_len * num_kv_heads):
            qv, o, part, score, top, m, d = _scratch(group, head_dim, lanes)
            seq = T.alloc_buffer((1,), "int32")
            t = _paired_token(task, num_kv_heads, qo_len)
            h = task % num_kv_heads
            _find_sequence(seq, q_indptr, batch_size, t)
            b = seq[0]
            q_count = q_indptr[b + 1] - q_indptr[b]
            kv_count = kv_indptr[b + 1] - kv_indptr[b]
            visible = T.if_then_else(causal > 0, kv_count - q_count + (t - q_indptr[b]) + 1, kv_count)
            _start(qv, o, m, d, q, t, h * group, sm_scale, chunks, lanes)
            _attend(qv, o, part, score, top, m, d, visible, ragged_rows(k, v, kv_indptr[b], h), group, chunks, lanes, False)
            _finish(o, m, d, output, lse, t, h * group, chunks, lanes)
    # fmt: on
    return batch_prefill_ragged_kv


def prefill_paged_attention(num_kv_heads: int, num_qo_heads: int, head_dim: int, page_size: int, dtype: str,
                            sliding_window: bool, window: int, lanes: int = 16) -> tirx.PrimFunc:
    """A prefill chunk's queries over their sequences' paged history. Query row r of a chunk of n
    sees history rows [lo, hi): causal without a window: [0, kv_len - n + r + 1); causal with a
    window W: [kv_len - max(W - r - 1, 0), kv_len); not causal: all (TVM's cross mask). A row that
    sees none gets output 0 and log2-sum-exp -50000, as TVM's kernel gives it."""
    group = num_qo_heads // num_kv_heads
    chunks = head_dim // lanes
    assert head_dim % lanes == 0 and num_qo_heads % num_kv_heads == 0
    win = window if sliding_window else 0

    def info(buf, row, b):  # last page length, window offset, sink length (the latter two: sliding only)
        return length_info_at(buf, row, b, sliding_window)

    # fmt: off
    @T.prim_func
    def batch_prefill_paged_kv_cpu(
        var_q: T.handle, var_q_indptr: T.handle, var_pages: T.handle, var_page_indptr: T.handle,
        var_page_values: T.handle, var_length_info: T.handle, var_k_rope_pos_offset: T.handle,
        var_q_rope_position: T.handle, var_output: T.handle, var_lse: T.handle,
        causal: T.int32, rotary_mode: T.int32, rope_scale: T.float32, rope_theta: T.float32, sm_scale: T.float32,
    ):
        T.func_attr({"op_pattern": 8, "tirx.is_scheduled": True, "tirx.noalias": True})
        batch_size = T.int32()
        total_len = T.int32()
        nnz_pages = T.int32()
        max_num_pages = T.int32()
        q = T.match_buffer(var_q, (total_len, num_qo_heads, head_dim), dtype)
        q_indptr = T.match_buffer(var_q_indptr, (batch_size + 1,), "int32", offset_factor=1)
        pages = T.match_buffer(var_pages, (max_num_pages, 2, num_kv_heads, page_size, head_dim), dtype)
        page_indptr = T.match_buffer(var_page_indptr, (batch_size + 1,), "int32", offset_factor=1)
        page_values = T.match_buffer(var_page_values, (nnz_pages,), "int32", offset_factor=1)
        length_info = length_info_buffer(var_length_info, batch_size, sliding_window)
        k_rope_pos_offset = T.match_buffer(var_k_rope_pos_offset, (batch_size,), "int32", offset_factor=1)  # noqa: F841 - declares the symbolic dim for TVMScript
        q_rope_position = T.match_buffer(var_q_rope_position, (total_len,), "int32", offset_factor=1)  # noqa: F841 - declares the symbolic dim for TVMScript
        output = T.match_buffer(var_output, (total_len, num_qo_heads, head_dim), dtype)
        lse = T.match_buffer(var_lse, (total_len, num_qo_heads), "float32")
        assert rotary_mode == 0, "mlcpipe's CPU paged prefill attention expects RoPE applied before attention (rotary_mode 0)"
        for task in T.parallel(total_len * num_kv_heads):
            qv, o, part, score, top, m, d = _scratch(group, head_dim, lanes)
            seq = T.alloc_buffer((1,), "int32")
            t = _paired_token(task, num_kv_heads, total_len)
            h = task % num_kv_heads
            _find_sequence(seq, q_indptr, batch_size, t)
            b = seq[0]
            r = t - q_indptr[b]
            qo_len = q_indptr[b + 1] - q_indptr[b]
            begin = page_indptr[b]
            end = page_indptr[b + 1]
            kv_len = T.if_then_else(
                begin != end,
                (end - begin - 1) * page_size + info(length_info, 0, b) - info(length_info, 1, b) + info(length_info, 2, b),
                0,
            )
            sink = info(length_info, 2, b)
            offset = info(length_info, 1, b)
            lo = T.if_then_else(causal > 0 and win > 0, T.max(kv_len - T.max(win - r - 1, 0), 0), 0)
            hi = T.if_then_else(causal > 0 and win == 0, T.min(kv_len - qo_len + r + 1, kv_len), kv_len)
            _start(qv, o, m, d, q, t, h * group, sm_scale, chunks, lanes)
            _attend(qv, o, part, score, top, m, d, T.max(hi - lo, 0),
                    history_rows(pages, page_values, begin, page_size, h, lo, sink, offset),
                    group, chunks, lanes, False)  # every token of the chunk reads these rows: they stay in cache
            _finish(o, m, d, output, lse, t, h * group, chunks, lanes, seen=hi > lo)
    # fmt: on
    return batch_prefill_paged_kv_cpu


def _symbol(func: tirx.PrimFunc) -> str | None:
    attrs = func.attrs
    return str(attrs["global_symbol"]) if attrs is not None and "global_symbol" in attrs else None


def _shape(param) -> list:
    return list(param.shape)


def _paged_prefill(func: tirx.PrimFunc) -> tirx.PrimFunc | None:
    """Ours for the passes' paged prefill kernel (it records its window in WINDOW_ATTR; TVM's own,
    without it, is left alone), where head dim and GQA groups fit."""
    symbol = _symbol(func)
    if symbol not in PAGED_PREFILL_NAMES or len(func.params) != 15 or WINDOW_ATTR not in func.attrs:
        return None
    q_shape, page_shape = _shape(func.params[0]), _shape(func.params[2])
    try:
        qo_heads, head_dim = int(q_shape[1]), int(q_shape[2])
        kv_heads, page_size = int(page_shape[2]), int(page_shape[3])
    except (TypeError, ValueError):
        return None
    if head_dim % 16 or qo_heads % kv_heads:
        return None
    return prefill_paged_attention(kv_heads, qo_heads, head_dim, page_size, str(func.params[0].dtype),
                                   symbol.endswith("_sliding_window"), int(func.attrs[WINDOW_ATTR]))


def replace_attention_kernels(mod: tvm.IRModule) -> tuple[tvm.IRModule, list[str]]:
    """Swap TVM's CPU decode and ragged-prefill attention, and the passes' paged prefill, for ours
    where the signature matches (head dim a multiple of 16, whole GQA groups); returns the module
    and the names replaced."""
    replaced = []
    for gvar, func in list(mod.functions_items()):
        new = _paged_prefill(func) if isinstance(func, tirx.PrimFunc) else None
        if new is not None:
            mod[gvar] = new.with_attr("global_symbol", _symbol(func))
            replaced.append(gvar.name_hint)
            continue
        if isinstance(func, tirx.PrimFunc) and _symbol(func) == RAGGED_KERNEL_NAME and len(func.params) == 14:
            q_shape, k_shape = _shape(func.params[0]), _shape(func.params[2])
            try:
                qo_heads, head_dim, kv_heads = int(q_shape[1]), int(q_shape[2]), int(k_shape[1])
            except (TypeError, ValueError):
                continue
            if head_dim % 16 or qo_heads % kv_heads:
                continue
            new = prefill_ragged_attention(kv_heads, qo_heads, head_dim, str(func.params[0].dtype))
            mod[gvar] = new.with_attr("global_symbol", RAGGED_KERNEL_NAME)
            replaced.append(gvar.name_hint)
            continue
        if not isinstance(func, tirx.PrimFunc) or _symbol(func) != KERNEL_NAME or len(func.params) != 13:
            continue
        q_shape, page_shape = _shape(func.params[0]), _shape(func.params[1])
        try:
            qo_heads, head_dim = int(q_shape[1]), int(q_shape[2])
            kv_heads, page_size = int(page_shape[2]), int(page_shape[3])
        except (TypeError, ValueError):
            continue
        if head_dim % 16 or qo_heads % kv_heads:
            continue
        new = decode_attention(kv_heads, qo_heads, head_dim, page_size, str(func.params[0].dtype))
        mod[gvar] = new.with_attr("global_symbol", KERNEL_NAME)
        replaced.append(gvar.name_hint)
    return mod, replaced

"""Our replacement for one of TVM 0.27's paged-KV-cache kernels, put where the KV cache puts TVM's
(and used where `check` takes TVM's CPU kernel as the reference of a GPU one).

TVM's `batch_prefill_paged_kv_cpu` (and its `_sliding_window` twin) keeps the running maximum of
the online softmax in `new_m`, which it sets only for unmasked key rows: a query whose first key
rows are masked (a sliding window over the history: Gemma 3's local layers) reads `new_m`
uninitialised, and its output is garbage (NaN seen). Causal masks only mask trailing rows, so a
Llama never hit it. `prefill_paged_cpu` has the same signature and contract (the cross mask of
TVM's `_causal_or_sliding_cross_mask`: with causal and a window W, query row r of a chunk sees the
last W - r - 1 history rows; the sliding length_info (last page length, window offset, sink)) and
skips masked rows instead. RoPE inside attention (rotary_mode 1) is not implemented (asserted):
mlcpipe's models rotate q/k before the cache. It records its window (WINDOW_ATTR) so the llvm
schedule can swap in its vectorised kernel of the same contract (schedules/llvm/attention.py);
this one stays the reference `check` compares that with.
"""

from __future__ import annotations

import math

import tvm
from tvm import tirx
from tvm.script import tirx as T

KERNELS = ("batch_prefill_paged_kv_cpu", "batch_prefill_paged_kv_cpu_sliding_window")


def length_info_buffer(handle, batch, sliding_window: bool):
    """The paged prefill kernels' length_info: (batch,) last page lengths; with the sliding window
    (3, batch): last page length, window offset, sink length."""
    return T.match_buffer(handle, (3, batch) if sliding_window else (batch,), "int32", offset_factor=1)


def length_info_at(buf, row: int, b, sliding_window: bool):
    """Row `row` (0 last page length, 1 window offset, 2 sink length) of sequence b's length_info
    (0 for rows 1 and 2 without the sliding window)."""
    if not sliding_window:
        return buf[b] if row == 0 else tirx.const(0, "int32")
    return buf[row, b]


def prefill_paged_cpu(h_kv: int, h_q: int, d: int, dtype: str, page_size: int, sliding_window: bool,
                      sliding_window_size: int) -> tirx.PrimFunc:
    """Attention of a prefill chunk's queries over their sequences' paged K/V (the history)."""
    group = h_q // h_kv
    window = sliding_window_size if sliding_window else 0
    log2e = math.log2(math.e)

    def declare_info(handle, batch):
        return length_info_buffer(handle, batch, sliding_window)

    def info(buf, row, b):
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
        q = T.match_buffer(var_q, (total_len, h_q, d), dtype)
        q_indptr = T.match_buffer(var_q_indptr, (batch_size + 1,), "int32", offset_factor=1)
        pages = T.match_buffer(var_pages, (max_num_pages, 2, h_kv, page_size, d), dtype)
        page_indptr = T.match_buffer(var_page_indptr, (batch_size + 1,), "int32", offset_factor=1)
        page_values = T.match_buffer(var_page_values, (nnz_pages,), "int32", offset_factor=1)
        length_info = declare_info(var_length_info, batch_size)
        k_rope_pos_offset = T.match_buffer(var_k_rope_pos_offset, (batch_size,), "int32", offset_factor=1)  # noqa: F841
        q_rope_position = T.match_buffer(var_q_rope_position, (total_len,), "int32", offset_factor=1)  # noqa: F841
        output = T.match_buffer(var_output, (total_len, h_q, d), dtype)
        lse = T.match_buffer(var_lse, (total_len, h_q), "float32")
        assert rotary_mode == 0, "mlcpipe's CPU paged prefill attention expects RoPE applied before attention (rotary_mode 0)"
        for task in T.parallel(h_q * batch_size):
            h = task // batch_size
            b = task % batch_size
            o = T.alloc_buffer((d,), "float32")
            state = T.alloc_buffer((4,), "float32")  # max, sum, score, rescale
            begin = page_indptr[b]
            end = page_indptr[b + 1]
            qo_len = q_indptr[b + 1] - q_indptr[b]
            kv_len = T.if_then_else(
                begin != end,
                (end - begin - 1) * page_size + info(length_info, 0, b) - info(length_info, 1, b) + info(length_info, 2, b),
                0,
            )
            for r in T.serial(qo_len):
                token = q_indptr[b] + r
                visible_past = T.max(window - r - 1, 0)
                lo = T.if_then_else(causal > 0 and window > 0, T.max(kv_len - visible_past, 0), 0)
                hi = T.if_then_else(causal > 0 and window == 0, T.min(kv_len - qo_len + r + 1, kv_len), kv_len)
                state[0] = T.float32(-50000.0)
                state[1] = T.float32(1.0)
                for x in T.serial(d):
                    o[x] = T.float32(0.0)
                for row in T.serial(T.max(hi - lo, 0)):
                    pos = lo + row
                    seq_pos = T.if_then_else(pos >= info(length_info, 2, b), pos - info(length_info, 2, b) + info(length_info, 1, b), pos)
                    page = page_values[begin + seq_pos // page_size]
                    slot = seq_pos % page_size
                    state[2] = T.float32(0.0)
                    for x in T.serial(d):
                        state[2] = state[2] + T.Cast("float32", q[token, h, x]) * T.Cast("float32", pages[page, 0, h // group, slot, x])
                    state[2] = state[2] * sm_scale * T.float32(log2e)
                    state[3] = T.exp2(state[0] - T.max(state[0], state[2]))
                    state[0] = T.max(state[0], state[2])
                    state[2] = T.exp2(state[2] - state[0])
                    state[1] = state[1] * state[3] + state[2]
                    for x in T.serial(d):
                        o[x] = o[x] * state[3] + state[2] * T.Cast("float32", pages[page, 1, h // group, slot, x])
                for x in T.serial(d):
                    output[token, h, x] = T.Cast(dtype, o[x] / state[1])
                lse[token, h] = state[0] + T.log2(state[1])
    # fmt: on
    return batch_prefill_paged_kv_cpu


def is_tvm_prefill_cpu(func) -> bool:
    attrs = getattr(func, "attrs", None)
    return isinstance(func, tirx.PrimFunc) and attrs is not None and "global_symbol" in attrs and str(attrs["global_symbol"]) in KERNELS


def replacement(func: tirx.PrimFunc, sliding_window_size: int) -> tirx.PrimFunc:
    """Ours for TVM's kernel `func` (its sizes read off its buffers)."""
    symbol = str(func.attrs["global_symbol"])
    q_shape, page_shape = list(func.params[0].shape), list(func.params[2].shape)
    h_q, d = int(q_shape[1]), int(q_shape[2])
    h_kv, page_size = int(page_shape[2]), int(page_shape[3])
    ours = prefill_paged_cpu(h_kv, h_q, d, str(func.params[0].dtype), page_size, symbol.endswith("_sliding_window"),
                             sliding_window_size)
    # the window it was made with, for the llvm schedule's faster kernel of the same contract
    return ours.with_attr("global_symbol", symbol).with_attr(WINDOW_ATTR, sliding_window_size)


WINDOW_ATTR = "mlcpipe.sliding_window"  # the window the KV cache was made with: a module attribute, and on our kernel
DEFAULT_WINDOW = 1024  # TVM's layer_sliding_window_size default


@tvm.transform.module_pass(opt_level=0, name="FixKVCacheKernels")
def FixKVCacheKernels(mod: tvm.IRModule, _ctx) -> tvm.IRModule:  # noqa: N802 - a pass, named as TVM's are
    """TVM's CPU paged-prefill attention kernels replaced by `prefill_paged_cpu` (the window:
    the module's WINDOW_ATTR, set by the build's export, else TVM's default)."""
    window = int(mod.attrs[WINDOW_ATTR]) if mod.attrs is not None and WINDOW_ATTR in mod.attrs else DEFAULT_WINDOW
    for gvar, func in list(mod.functions_items()):
        if is_tvm_prefill_cpu(func):
            mod[gvar] = replacement(func, window)
    return mod

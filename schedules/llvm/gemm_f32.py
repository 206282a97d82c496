"""CPU prefill GEMM on f32 FMAs in register tiles (AVX-512, or AVX2 + FMA), for f32 models and
CPUs without a faster dot product.

Computed as C^T: each task converts its `block_n` weight rows to f32 (q4: (q - 7) * s, stored in
the nibble order q4_chunk_values gives, the activation permuted to match); the activation becomes
16-token vectors along K; the micro-kernel holds block_n x `token_vecs` vectors of 16 tokens' sums
and does one FMA per row, k and vector. Up to 16 tokens a one-vector tile runs instead.
Handles: llvm with avx512f, or avx2 + fma (16-lane values as two ymm: smaller tiles, tile_fits);
many-token NT matmul, f16/f32 activations, f16/f32 or q4 weights, K % 16 == 0 (q4: % 128).
Knobs: block_n, token_vecs, prefetch (1: the next task's weight rows into L2 during the first
token block; 0: off).
"""

from __future__ import annotations

import dataclasses

from tvm import s_tir, te, tirx
from tvm.script import tirx as T
from tvm.target import Target, codegen

from ..analysis import match_on_cpu
from ..base import CPUScheduleRule
from .microkernels import (LANES, activation_f32_at, prefetch_next_task, q4_chunk_values, q4_position_order, q4_words_fit, rebuild, schedule_extern_epilogue,
                           store_transposed, tile_rows, tile_vector, zero_tile)

# per ISA: (default (block_n, token_vecs), rows of the one-vector tile for up to 16 tokens)
ISA_TILES = {"avx512": ((8, 2), 16), "avx2": ((4, 1), 4)}


def tile_fits(isa: str, block_n: int, token_vecs: int) -> bool:
    """AVX-512: at most 24 accumulators (of 32 zmm; the rest hold the token vectors and a weight).
    AVX2: a 16-lane value is two of the 16 ymm registers: 2 (accumulators + token vectors) + a
    weight <= 16 (a larger tile spills)."""
    if isa == "avx2":
        return 2 * (block_n * token_vecs + token_vecs) + 1 <= 16
    return block_n * token_vecs <= 24


@dataclasses.dataclass
class PrefillGEMMF32(CPUScheduleRule):
    block_n: int | None = None  # weight rows per task and micro-kernel (None: the ISA's default, ISA_TILES)
    token_vecs: int | None = None  # 16-token vectors per micro-kernel (None: the ISA's default)
    prefetch: int = 1  # 1: prefetch the next task's weight rows while the first token block computes (0: off)

    def knob_space(self, func: tirx.PrimFunc, target: Target) -> dict[str, list]:
        info = _applicable(func, target)
        if info is None:
            return {}
        if _isa(target) == "avx2":
            return {"block_n": [v for v in (2, 4, 6) if info.n % v == 0], "token_vecs": [1, 2], "prefetch": [1, 0]}  # tiles that do not fit are declined
        return {"block_n": [v for v in (4, 6, 8) if info.n % v == 0], "token_vecs": [2, 3, 4], "prefetch": [1, 0]}  # pairs over 24 are declined

    def apply(self, func: tirx.PrimFunc, target: Target, tunable: bool) -> s_tir.Schedule | None:
        del tunable
        info = _applicable(func, target)
        if info is None:
            return None
        isa = _isa(target)
        (block_n, token_vecs), few_rows = ISA_TILES[isa]
        block_n, token_vecs = self.block_n or block_n, self.token_vecs or token_vecs
        if block_n < 1 or token_vecs < 1 or info.n % block_n or not tile_fits(isa, block_n, token_vecs) or info.n % few_rows or self.prefetch not in (0, 1):
            return None
        sch = s_tir.Schedule(_build(info, block_n, token_vecs, few_rows, self.prefetch))
        sch.parallel(sch.get_loops(sch.get_sblock("x_vecs"))[0])
        return schedule_extern_epilogue(sch, "gemm_f32", LANES)


def _isa(target: Target) -> str | None:
    """'avx512', 'avx2' (with FMA) or None."""
    if codegen.target_has_features("avx512f", target):
        return "avx512"
    if codegen.target_has_features("avx2", target) and codegen.target_has_features("fma", target):
        return "avx2"
    return None


def _applicable(func, target):
    if not isinstance(func, tirx.PrimFunc) or target.kind.name != "llvm" or _isa(target) is None:
        return None
    info = match_on_cpu(func, target, decode=False)
    if info is None or len(info.rows_shape) != 2 or info.k % LANES or str(info.x.dtype) not in ("float16", "float32"):
        return None
    if info.quantized and not q4_words_fit(info):
        return None
    if not info.quantized and str(info.weight.dtype) not in ("float16", "float32"):
        return None
    return info


def _build(info, block_n: int, token_vecs: int, few_rows: int, prefetch: int) -> tirx.PrimFunc:
    inputs = info.placeholders()
    x = inputs[info.param_index(info.x)]
    tokens = x.shape[-2]
    per_block = LANES * token_vecs
    padded = (tokens + per_block - 1) // per_block * per_block
    order = q4_position_order if info.quantized else (lambda p: p)

    def element(v, p, lane):
        t = v * LANES + lane
        return te.if_then_else(t < tokens, activation_f32_at(x, te.min(t, tokens - 1), order(p)), tirx.const(0.0, "float32"))

    # [16-token vector, k position, 16 tokens]: a vector's tokens at one k are adjacent
    xv = te.compute((padded // LANES, info.k, LANES), element, name="x_vecs")
    ins = [xv, inputs[info.param_index(info.weight)]] + ([inputs[info.param_index(info.scale)]] if info.quantized else [])

    def body(i, o):
        many = _kernel(info, padded, block_n, token_vecs, padded // per_block, prefetch, *i, o[0])
        few = _kernel(info, padded, few_rows, 1, 1, prefetch, *i, o[0])
        return tirx.IfThenElse(tokens <= LANES, few, many)

    c = te.extern(
        (padded * info.n,), ins, body, name="gemm_f32", dtype="float32",
        in_buffers=[tirx.decl_buffer(t.shape, t.dtype, name=f"{t.op.name}_buf") for t in ins],
        out_buffers=[tirx.decl_buffer((padded * info.n,), "float32", name="c_buf")],
    )
    mm = te.compute((*x.shape[:-1], info.n), lambda b, m, n: c[m * info.n + n], name="matmul")
    return rebuild(info, inputs, mm)


def _kernel(info, padded, block_n, token_vecs, blocks, prefetch, xv, weight, *rest):
    """C^T blocks: per task `block_n` weight rows as f32 (L1/L2), per block (of `blocks`) of
    token_vecs 16-token vectors block_n x token_vecs accumulators."""
    scale, out = (rest[0], rest[1]) if info.quantized else (None, rest[0])
    n_total, k = info.n, info.k
    pitch = k + LANES  # row pitch of the converted rows: not a multiple of 4 KiB (L1 sets)
    chunk = 128 if info.quantized else LANES  # k positions converted per step

    def convert(wb, wf, sf, task, r, c):
        n = task * block_n + r
        if not info.quantized:
            T.buffer_store(wb, T.Cast("float32x16", wf[T.ramp(n * k + c * LANES, 1, LANES)]), [T.ramp(r * pitch + c * LANES, 1, LANES)])
            return
        for j, value in enumerate(q4_chunk_values(info, wf, sf, n, c)):
            T.buffer_store(wb, value, [T.ramp(r * pitch + c * 128 + j * LANES, 1, LANES)])

    def step(accs, wb, xf, mb, p):
        xs = [xf[T.ramp(((mb * token_vecs + v) * k + p) * LANES, 1, LANES)] for v in range(token_vecs)]
        for r in range(block_n):
            w = T.broadcast(wb[r * pitch + p], LANES)
            for v in range(token_vecs):
                acc, lanes = tile_vector(accs, block_n, token_vecs, r, v)
                T.buffer_store(acc, T.call_llvm_pure_intrin("float32x16", "llvm.fma.v16f32", w, xs[v], acc[lanes]), [lanes])

    weight_dtype = "uint32" if info.quantized else str(weight.dtype)
    dtype_bytes = 2 if weight_dtype == "float16" else 4
    span = block_n * (k // 8 if info.quantized else k)  # elements of wf per task

    @T.prim_func(private=True, check_well_formed=False)
    def body():
        xf = T.decl_buffer((padded * k,), "float32", data=xv.data)
        wf = T.decl_buffer((n_total * (k // 8 if info.quantized else k),), weight_dtype, data=weight.data)
        sf = T.decl_buffer((n_total * (k // max(info.group_size, 1)),), str(scale.dtype) if info.quantized else "float32",
                           data=scale.data if info.quantized else weight.data)
        for task in T.parallel(n_total // block_n):
            wb = T.alloc_buffer((block_n * pitch,), "float32")
            for r in range(block_n):
                for c in range(k // chunk):
                    convert(wb, wf, sf, task, r, c)
            for mb in range(blocks):
                acc0 = T.alloc_buffer((tile_rows(block_n) * token_vecs * LANES,), "float32")  # stack arrays (tile_rows)
                acc1 = T.alloc_buffer((tile_rows(block_n) * token_vecs * LANES,), "float32")
                zero_tile((acc0, acc1), block_n, token_vecs)
                for p in range(k):
                    if prefetch > 0:
                        if mb == 0:  # LLVM unswitches this: the other blocks' loop has no prefetch
                            prefetch_next_task(wf, (task + 1) * span, span, p, k, dtype_bytes)
                    step((acc0, acc1), wb, xf, mb, p)
                store_transposed(out, (acc0, acc1), n_total, task * block_n, block_n, token_vecs, mb)

    return body.body

"""CPU prefill GEMM on f32 FMAs in register tiles (AVX-512, or AVX2 + FMA), for f32 models and
CPUs without a faster dot product.

Computed as C^T. A task holds `tiles` micro-kernel tiles of `block_n` weight rows; the k loop
runs in `k_block` slices (the tiles' accumulators carried in a task buffer between slices). Per
slice the task converts its rows' slice to f32 (q4: (q - 7) * s, in the nibble order
q4_chunk_values gives, the activation permuted to match), then per block of `token_vecs` 16-token
vectors each tile does one FMA per row, k and vector: the activation's slice is read from L2 once
per token block and from L1 by the other tiles, whatever K is. Up to 16 tokens a one-vector tile
runs instead (whole K, one tile per task).
Handles: llvm with avx512f, or avx2 + fma (16-lane values as two ymm: smaller tiles, tile_fits);
many-token NT matmul, f16/f32 activations, f16/f32 or q4 weights, K % 16 == 0 (q4: % 128).
Knobs: block_n, token_vecs, k_block (a multiple of the convert chunk; 0: the whole K), tiles,
prefetch (1: the next slice's weight rows into L2 while the first tile's first token block computes;
0: off; by default on for q4 weights only, and on in the one-vector branch, which reads whole rows).
"""

from __future__ import annotations

import dataclasses

from tvm import s_tir, te, tirx
from tvm.script import tirx as T
from tvm.target import Target, codegen

from ..analysis import match_on_cpu
from ..base import CPUScheduleRule
from .microkernels import (LANES, activation_f32_at, carry_tile, q4_chunk_values, q4_position_order, q4_words_fit, rebuild, schedule_extern_epilogue,
                           store_transposed, tile_rows, tile_vector, zero_tile)

# per ISA: (default (block_n, token_vecs), rows of the one-vector tile for up to 16 tokens)
ISA_TILES = {"avx512": ((8, 2), 16), "avx2": ((4, 1), 4)}
K_BLOCK = 256  # default k_block: 128 tokens' slice of the activation is 128 KB


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
    k_block: int | None = None  # k positions per slice of the k loop (0: the whole K; None: K_BLOCK where it divides K)
    tiles: int | None = None  # micro-kernel row blocks per task, all reading each activation slice from L1 (None: up to 4)
    prefetch: int | None = None  # 1: the next slice's weight rows into L2 during the first tile's first token block (None: q4, or up to 16 tokens)

    def knob_space(self, func: tirx.PrimFunc, target: Target) -> dict[str, list]:
        info = _applicable(func, target)
        if info is None:
            return {}
        if _isa(target) == "avx2":
            space = {"block_n": [v for v in (2, 4, 6) if info.n % v == 0], "token_vecs": [1, 2]}  # tiles that do not fit are declined
        else:
            space = {"block_n": [v for v in (4, 6, 8) if info.n % v == 0], "token_vecs": [2, 3, 4]}  # pairs over 24 are declined
        return {**space, "k_block": _k_blocks(info), "tiles": [1, 2, 4], "prefetch": [1, 0]}

    def apply(self, func: tirx.PrimFunc, target: Target, tunable: bool) -> s_tir.Schedule | None:
        del tunable
        info = _applicable(func, target)
        if info is None:
            return None
        isa = _isa(target)
        (block_n, token_vecs), few_rows = ISA_TILES[isa]
        block_n, token_vecs = self.block_n or block_n, self.token_vecs or token_vecs
        if block_n < 1 or token_vecs < 1 or info.n % block_n or not tile_fits(isa, block_n, token_vecs) or info.n % few_rows:
            return None
        k_block = self.k_block if self.k_block is not None else (K_BLOCK if info.k % K_BLOCK == 0 else 0)
        k_block = min(k_block, info.k) or info.k
        tiles = self.tiles or next(t for t in (4, 2, 1) if info.n % (block_n * t) == 0)
        # (many-token branch, one-vector branch); why f16 rows are not prefetched by slice: docs/schedules.md
        prefetch = (int(info.quantized), 1) if self.prefetch is None else (self.prefetch,) * 2
        if k_block < 0 or k_block % _chunk(info) or info.k % k_block or tiles < 1 or info.n % (block_n * tiles) or self.prefetch not in (None, 0, 1):
            return None
        sch = s_tir.Schedule(_build(info, block_n, token_vecs, few_rows, k_block, tiles, prefetch))
        sch.parallel(sch.get_loops(sch.get_sblock("x_vecs"))[0])
        return schedule_extern_epilogue(sch, "gemm_f32", LANES)


def _isa(target: Target) -> str | None:
    """'avx512', 'avx2' (with FMA) or None."""
    if codegen.target_has_features("avx512f", target):
        return "avx512"
    if codegen.target_has_features("avx2", target) and codegen.target_has_features("fma", target):
        return "avx2"
    return None


def _chunk(info) -> int:
    """k positions converted per step (q4: a 128-wide nibble chunk)."""
    return 128 if info.quantized else LANES


def _k_blocks(info) -> list[int]:
    """Slice lengths to tune over: the whole K and those that divide it."""
    return [0] + [v for v in (128, 256, 512, 1024) if v < info.k and info.k % v == 0 and v % _chunk(info) == 0]


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


def _build(info, block_n: int, token_vecs: int, few_rows: int, k_block: int, tiles: int, prefetch: tuple[int, int]) -> tirx.PrimFunc:
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
        many = _kernel(info, padded, block_n, token_vecs, padded // per_block, k_block, tiles, prefetch[0], *i, o[0])
        few = _kernel(info, padded, few_rows, 1, 1, info.k, 1, prefetch[1], *i, o[0])
        return tirx.IfThenElse(tokens <= LANES, few, many)

    c = te.extern(
        (padded * info.n,), ins, body, name="gemm_f32", dtype="float32",
        in_buffers=[tirx.decl_buffer(t.shape, t.dtype, name=f"{t.op.name}_buf") for t in ins],
        out_buffers=[tirx.decl_buffer((padded * info.n,), "float32", name="c_buf")],
    )
    mm = te.compute((*x.shape[:-1], info.n), lambda b, m, n: c[m * info.n + n], name="matmul")
    return rebuild(info, inputs, mm)


def _kernel(info, padded, block_n, token_vecs, blocks, k_block, tiles, prefetch, xv, weight, *rest):
    """C^T blocks: per task `tiles` x `block_n` weight rows; per k slice those rows' slice as f32
    (L1/L2), then per token block (of `blocks` of token_vecs 16-token vectors, its activation slice
    read from L1 by every tile) and tile block_n x token_vecs accumulators."""
    scale, out = (rest[0], rest[1]) if info.quantized else (None, rest[0])
    n_total, k = info.n, info.k
    pitch = k_block + LANES  # row pitch of the converted slice: not a multiple of 4 KiB (L1 sets)
    chunk = _chunk(info)
    slices, rows = k // k_block, tiles * block_n
    tile = block_n * token_vecs * LANES  # f32 accumulators of one tile and token block
    carried = rows * pitch  # where the tiles' accumulators wait between slices, after the converted rows
    carried_size = tiles * blocks * tile if slices > 1 else 0

    def convert(wb, wf, sf, task, r, ks, c):
        n, at = task * rows + r, r * pitch + c * chunk
        if not info.quantized:
            T.buffer_store(wb, T.Cast("float32x16", wf[T.ramp(n * k + ks * k_block + c * LANES, 1, LANES)]), [T.ramp(at, 1, LANES)])
            return
        for j, value in enumerate(q4_chunk_values(info, wf, sf, n, ks * (k_block // chunk) + c)):
            T.buffer_store(wb, value, [T.ramp(at + j * LANES, 1, LANES)])

    def step(accs, wb, xf, tl, mb, ks, q):
        xs = [xf[T.ramp(((mb * token_vecs + v) * k + ks * k_block + q) * LANES, 1, LANES)] for v in range(token_vecs)]
        for r in range(block_n):
            w = T.broadcast(wb[(tl * block_n + r) * pitch + q], LANES)
            for v in range(token_vecs):
                acc, lanes = tile_vector(accs, block_n, token_vecs, r, v)
                T.buffer_store(acc, T.call_llvm_pure_intrin("float32x16", "llvm.fma.v16f32", w, xs[v], acc[lanes]), [lanes])

    weight_dtype = "uint32" if info.quantized else str(weight.dtype)
    elem_bytes = 2 if weight_dtype == "float16" else 4
    row_len = k // 8 if info.quantized else k  # elements of wf per row
    slice_len = row_len // slices
    lines_per_row = -(-slice_len * elem_bytes // 64)
    lines = rows * lines_per_row  # cache lines of one task's slice
    per_step = -(-lines // k_block)

    def prefetch_next_slice(wf, task, ks, q):
        """Into L2 over the k_block steps of the first tile and token block: the task's next
        slice of rows, after its last slice the next task's first (clamped to the weight's end)."""
        following = task * slices + ks + 1
        for i in range(per_step):
            line = (q * per_step + i) * lines // (k_block * per_step)
            row = (following // slices) * rows + line // lines_per_row
            at = row * row_len + (following % slices) * slice_len + (line % lines_per_row) * (64 // elem_bytes)
            T.evaluate(T.call_llvm_intrin("void", "llvm.prefetch.p0", T.address_of(wf[T.min(at, n_total * row_len - 1)]), 0, 2, 1))

    @T.prim_func(private=True, check_well_formed=False)
    def body():
        xf = T.decl_buffer((padded * k,), "float32", data=xv.data)
        wf = T.decl_buffer((n_total * (k // 8 if info.quantized else k),), weight_dtype, data=weight.data)
        sf = T.decl_buffer((n_total * (k // max(info.group_size, 1)),), str(scale.dtype) if info.quantized else "float32",
                           data=scale.data if info.quantized else weight.data)
        for task in T.parallel(n_total // rows):
            wb = T.alloc_buffer((rows * pitch + carried_size,), "float32")  # one workspace allocation per task
            for ks in range(slices):
                for r in range(rows):
                    for c in range(k_block // chunk):
                        convert(wb, wf, sf, task, r, ks, c)
                for mb in range(blocks):
                    for tl in range(tiles):
                        acc0 = T.alloc_buffer((tile_rows(block_n) * token_vecs * LANES,), "float32")  # stack arrays (tile_rows)
                        acc1 = T.alloc_buffer((tile_rows(block_n) * token_vecs * LANES,), "float32")
                        if ks == 0:
                            zero_tile((acc0, acc1), block_n, token_vecs)
                        else:
                            carry_tile((acc0, acc1), wb, carried + (tl * blocks + mb) * tile, block_n, token_vecs, load=True)
                        for q in range(k_block):
                            if prefetch > 0:
                                if mb == 0:  # LLVM unswitches this: the other blocks' loop has no prefetch
                                    if tl == 0:
                                        prefetch_next_slice(wf, task, ks, q)
                            step((acc0, acc1), wb, xf, tl, mb, ks, q)
                        if ks == slices - 1:
                            store_transposed(out, (acc0, acc1), n_total, task * rows + tl * block_n, block_n, token_vecs, mb)
                        else:
                            carry_tile((acc0, acc1), wb, carried + (tl * blocks + mb) * tile, block_n, token_vecs, load=False)

    return body.body

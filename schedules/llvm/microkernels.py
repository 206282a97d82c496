"""Shared CPU micro-kernels: the pieces the explicit-vector rules build their kernels from.

Rules whose arithmetic is not a reordering of the matched loop nest write new TIR: a `te.extern`
stage built here, between TE stages that prepare the activation and the original epilogue
(`rebuild`, `schedule_extern_epilogue`). Pieces: the row-GEMV skeleton (RowGEMVRule, row_loop,
token_row_loop, few_token_rows, extern_gemv; knobs rows and prefetch), f32 activations and
products (activation_f32, float_chunk), a q4 chunk's group scale per word (chunk_scales), the q4 x
int8 arithmetic (quantize_activation, vnni_chunk) on the CPU's int8 dot product (int8_isa,
int8_dot: AVX512-VNNI, AVX-VNNI, aarch64 SDOT or AVX2's VPMADDUBSW; on AVX2 with groups of 32 the
f32 tail per group, grouped_chunk), the C^T GEMM tiles (tile_rows, tile_vector,
zero_tile, store_transposed, prefetch_next_task).
TVM 0.27: every vector value is one expression (a bound vector becomes a per-task allocation).
"""

from __future__ import annotations

import abc
import dataclasses
import functools
from collections.abc import Callable

from tvm import s_tir, te, tirx
from tvm.ir.expr import TensorLoad
from tvm.script import tirx as T
from tvm.target import Target, codegen
from tvm.tirx import expr as E

from ..analysis import NTMatmul, blocks_after, dtype_bits
from ..base import CPUScheduleRule

LANES = 16  # f32 accumulator lanes (one 512-bit register)
NIBBLES = 0x0F0F0F0F
VPDPBUSD = "llvm.x86.avx512.vpdpbusd.512"  # (i32x16 acc, u8x64, s8x64): 4 products per lane


def int8_isa(target: Target) -> str | None:
    """The CPU's int8 dot product: 'avx512' (AVX512-VNNI), 'avxvnni' (VEX VPDPBUSD on 256 bits,
    Intel client parts), 'arm' (aarch64 SDOT, FEAT_DotProd), 'avx2' (AVX2-only CPUs, no dot product
    instruction: VPMADDUBSW + VPMADDWD, llama.cpp's AVX2 arithmetic; Zen 2/3, Haswell..Comet Lake;
    AVX-512 CPUs without VNNI keep their f32 rules) or None."""
    has = codegen.target_has_features
    if has("avx512vnni", target):
        return "avx512"
    if has("avxvnni", target):
        return "avxvnni"
    if str(target.attrs.get("mtriple", "") or "").startswith("aarch64"):
        return "arm" if has("dotprod", target) else None
    if has("avx2", target) and not has("avx512f", target):
        return "avx2"
    return None


PMADDUBSW = "llvm.x86.avx2.pmadd.ub.sw"  # (u8x32, s8x32) -> i16x16: sums of adjacent pairs, saturating
PMADDWD = "llvm.x86.avx2.pmadd.wd"  # (i16x16, i16x16) -> i32x8: sums of adjacent pairs


def int8_dot(isa: str, acc, u8, s8):
    """acc (i32x16) + per lane the sum of its 4 adjacent byte products u8 x s8 (64 bytes each).
    On aarch64 SDOT multiplies signed bytes: callers' u8 values are below 128 (q4 nibbles). On
    AVX2 a pair's sum is an i16 (VPMADDUBSW saturates): exact for u8 <= 15 (nibbles) and |s8| <= 127."""
    if isa == "avx512":
        return T.call_llvm_pure_intrin("int32x16", VPDPBUSD, acc, u8, s8)

    if isa == "avx2":
        return acc + avx2_widen(avx2_madd16(u8, s8))
    parts, name, lanes = {"avxvnni": (2, "llvm.x86.avx512.vpdpbusd.256", 8), "arm": (4, "llvm.aarch64.neon.sdot.v4i32.v16i8", 4)}[isa]
    nbytes = 4 * lanes
    return T.Shuffle([T.call_llvm_pure_intrin(f"int32x{lanes}", name, _halves(acc, i, lanes), _halves(u8, i, nbytes), _halves(s8, i, nbytes))
                      for i in range(parts)], list(range(LANES)))


def _halves(v, i, width):
    return T.Shuffle([v], list(range(i * width, (i + 1) * width)))


def avx2_madd16(u8, s8):
    """AVX2 VPMADDUBSW on 64 bytes: i16x32, each the sum of an adjacent pair of u8 x s8 products
    (saturating: exact for u8 <= 15 and |s8| <= 127)."""
    return T.Shuffle([T.call_llvm_pure_intrin("int16x16", PMADDUBSW, _halves(u8, i, 32), _halves(s8, i, 32)) for i in range(2)],
                     list(range(2 * LANES)))


def avx2_widen(acc16, weight: int = 1):
    """i16x32 -> i32x16: weight x the sum of each adjacent pair (VPMADDWD by `weight`)."""
    factor = T.broadcast(T.int16(weight), 16)
    return T.Shuffle([T.call_llvm_pure_intrin("int32x8", PMADDWD, _halves(acc16, i, 16), factor) for i in range(2)], list(range(LANES)))


def avx2_dot_pair(u8a, s8a, u8b, s8b, weight: int):
    """weight x (per lane: the sum of its 4 adjacent byte products u8a x s8a, plus u8b x s8b), i32x16,
    on AVX2: both VPMADDUBSW i16 results added before one VPMADDWD by `weight` (instead of by 1),
    so a plane's scale costs no float operation. Exact for u8 <= 15 (nibbles) and |s8| <= 127:
    an i16 holds the 4 products (<= 7620)."""
    return avx2_widen(avx2_madd16(u8a, s8a) + avx2_madd16(u8b, s8b), weight)


RESIDUAL = 256.0  # the second activation plane counts in units of a / 256
# Per-task accumulators are "global" buffers of fewer bytes than this: TVM 0.27 makes those stack
# arrays (LLVM keeps them in registers). A "local" buffer, or a larger one, comes from the runtime
# workspace: two runtime calls per task (the `disable_lower_builtin` annotation does not survive
# 0.27's lowering). docs/schedules.md, "TVM 0.27 notes".
STACK_BYTES = 1024


# ---- the row-GEMV skeleton -------------------------------------------------------------------
L1_RESIDENT = 8 * 1024  # activation bytes that stay in a 32 KiB L1 next to weights prefetched into it


def gemv_default_rows(target: Target) -> int:
    """Weight rows per GEMV task when the knob is unset: 2 (interleaved) where tuned on Sapphire
    Rapids (AMX), else 1, one sequential stream per thread (what Zen 4's prefetchers follow best)."""
    return 2 if codegen.target_has_features("amx-tile", target) else 1


PREFETCH_AHEAD = 8 * 1024  # weight bytes the GEMVs' software prefetch runs ahead of the rows being read


def default_prefetch(info) -> int:
    """Rows ahead for an unset `prefetch`: about PREFETCH_AHEAD bytes of weights, at least one row
    (8 q4 rows of K = 2048, 2 f16 rows)."""
    row_bytes = info.k * (info.bits or dtype_bits(info.weight.dtype)) // 8
    return max(1, PREFETCH_AHEAD // row_bytes)


@dataclasses.dataclass
class RowGEMVRule(CPUScheduleRule, abc.ABC):
    """Base of the explicit-vector GEMV rules: knobs rows and prefetch; subclasses give
    `applicable(func, target) -> NTMatmul | None` and `build(info) -> PrimFunc`."""

    rows: int | None = None  # rows per parallel task, interleaved (None: default_rows)
    prefetch: int | None = None  # software-prefetch each weight stream this many rows ahead (0: off; None: default_prefetch)

    @abc.abstractmethod
    def applicable(self, func: tirx.PrimFunc, target: Target):
        """The matched kernel (NTMatmul) if this rule takes it, else None."""

    @abc.abstractmethod
    def build(self, info, target: Target) -> tirx.PrimFunc | None:
        """The rebuilt kernel (extern_gemv), or None when the knobs do not fit."""

    def default_rows(self, target: Target) -> int:
        return gemv_default_rows(target)

    def knob_space(self, func: tirx.PrimFunc, target: Target) -> dict[str, list]:
        info = self.applicable(func, target)
        if info is None:
            return {}
        # `mlcpipe tune` rotates through inputs beyond the last-level cache (backends' timing_cold_bytes):
        # the weights stream from memory as in the model, so row interleaving and prefetch distance show
        return {"rows": [v for v in (1, 2, 4) if info.n % v == 0], "prefetch": [0, 1, 2, 4, 8, 16]}

    def apply(self, func: tirx.PrimFunc, target: Target, tunable: bool) -> s_tir.Schedule | None:
        del tunable
        info = self.applicable(func, target)
        rows = self.rows or self.default_rows(target)
        if info is None or info.n % rows:
            return None
        prefetch = default_prefetch(info) if self.prefetch is None else self.prefetch
        func = dataclasses.replace(self, rows=rows, prefetch=prefetch).build(info, target)
        if func is None:
            return None
        sch = s_tir.Schedule(func)
        vectorize_epilogue(sch, info.n)
        return sch


def extern_gemv(info, inputs: list[te.Tensor], ins: list[te.Tensor], body: Callable) -> tirx.PrimFunc:
    """The rebuilt kernel: `body(*in_buffers, out_buffer)` writes the f32 matmul result
    [..., N]; the original epilogue follows."""
    x = inputs[info.param_index(info.x)]
    out_shape = list(x.shape[:-1]) + [info.n]
    mm = te.extern(
        out_shape,
        ins,
        lambda i, o: body(*i, o[0]),
        name="gemv",
        dtype="float32",
        in_buffers=[tirx.decl_buffer(t.shape, t.dtype, name=f"{t.op.name}_buf") for t in ins],
        out_buffers=[tirx.decl_buffer(out_shape, "float32", name="gemv_buf")],
    )
    return rebuild(info, inputs, mm)


def activation_f32_at(x: te.Tensor, t, i):
    """Token t's activation element i as f32 (x: [..., tokens, K], leading dims of extent 1)."""
    return x[(*([0] * (len(x.shape) - 2)), t, i)].astype("float32")


def lane_sum(v, lanes: int = LANES):
    while lanes > 1:
        lanes //= 2
        v = T.Shuffle([v], list(range(lanes))) + T.Shuffle([v], list(range(lanes, 2 * lanes)))
    return T.Shuffle([v], [0])


def token_row_loop(n_rows: int, rows: int, chunks: int, tokens, per_pass: int, store: Callable, chunk: Callable,
                   streams: Callable, prefetch: int, resident: int = 0) -> tirx.Stmt:
    """row_loop for a few tokens (`tokens`, may be symbolic): per task of `rows` rows, the tokens
    in passes of `per_pass` (unrolled, rows x per_pass accumulators); every chunk's weight words
    are loaded once per pass and serve all of its tokens (LLVM merges the identical loads and
    nibble unpacking of the unrolled tokens), so the weights stream from memory once and from L1
    for later passes. `chunk(n, c, t)`: one f32x16 or a list of them (added one by one);
    `streams(n, c)`: the addresses to prefetch; `store(t, n, value)` writes token t's result of row n.
    A last, partial pass recomputes its last token for the missing ones and does not store them.
    `resident`: bytes of activation data a pass re-reads per row; prefetched weights go to L1 only
    while that leaves L1 room (L1_RESIDENT), else to L2 (L1 would evict the activation)."""
    tasks = n_rows // rows
    locality = 3 if resident * per_pass <= L1_RESIDENT else 2
    last = n_rows - 1

    def ahead(n, c):
        for address in streams(T.min(n + prefetch, last), c):
            T.evaluate(T.call_llvm_intrin("void", "llvm.prefetch.p0", address, 0, locality, 1))

    def accumulate(acc, lanes, n, c, t):
        value = chunk(n, c, t)
        for term in value if isinstance(value, list) else [value]:  # one FMA each
            T.buffer_store(acc, acc[lanes] + term, [lanes])

    @T.prim_func(private=True, check_well_formed=False)
    def body():
        for task in T.parallel(tasks):
            for tp in range((tokens + per_pass - 1) // per_pass):
                acc = T.alloc_buffer((rows * per_pass * LANES,), "float32")  # a stack array (< STACK_BYTES)
                for a in T.unroll(rows * per_pass):
                    acc[T.ramp(a * LANES, 1, LANES)] = T.broadcast(T.float32(0), LANES)
                for c in range(chunks):
                    for r in T.unroll(rows):
                        if prefetch > 0:
                            if tp == 0:
                                ahead(task * rows + r, c)
                        for t in T.unroll(per_pass):  # (r * per_pass + t) inline: a bound name becomes a per-task allocation
                            accumulate(acc, T.ramp((r * per_pass + t) * LANES, 1, LANES), task * rows + r, c, T.min(tp * per_pass + t, tokens - 1))
                for r in T.unroll(rows):
                    for t in T.unroll(per_pass):
                        if tp * per_pass + t < tokens:
                            store(tp * per_pass + t, task * rows + r, lane_sum(acc[T.ramp((r * per_pass + t) * LANES, 1, LANES)]))

    return body.body


def few_token_rows(info, tokens, low_batch: int, chunk: Callable, streams: Callable, out, rows: int = 2, per_pass: int = 4,
                   prefetch: int = 8, planes: int = 2) -> tirx.Stmt:
    """C rows (flat [tokens * N] `out`) of up to `low_batch` tokens by a decode GEMV's arithmetic
    (`chunk`, `streams` of one 16-lane step: q4 words or f16 weights): the GEMM rules decode every
    weight row whatever the token count (~4 GEMVs' cost); here the weights stream once for all
    tokens, in passes of exactly 1..per_pass tokens (a wider pass would compute the missing ones)."""

    def store(t, n, value):
        T.buffer_store(out, value.astype(out.dtype), [t * info.n + n])

    chunks = info.k // (8 * LANES) if info.quantized else info.k // LANES

    def loop(width):
        return token_row_loop(info.n, rows, chunks, tokens, width, store, chunk, streams, prefetch, activation_bytes(info, planes))

    stmt = loop(min(low_batch, per_pass))
    for exact in reversed(range(1, min(low_batch, per_pass))):
        stmt = tirx.IfThenElse(tokens == exact, loop(exact), stmt)
    return stmt


def row_loop(n_rows: int, rows: int, chunks: int, out, chunk: Callable, streams: Callable, prefetch: int, resident: int = 0) -> tirx.Stmt:
    """for each task of `rows` rows (parallel): acc[r] += chunk(n, c) for c < chunks; out[.., n] = sum(acc[r]).
    `streams(n, c)` lists the addresses (T.address_of) of row n's data for chunk c, prefetched
    `prefetch` rows ahead (0: no software prefetch). One token: token_row_loop with one pass."""
    lead = [0] * (len(out.shape) - 1)

    def store(t, n, value):
        T.buffer_store(out, value, [*lead, n])

    return token_row_loop(n_rows, rows, chunks, 1, 1, store, lambda n, c, t: chunk(n, c), streams, prefetch, resident)


def activation_bytes(info, planes: int = 2, grouped: bool = False) -> int:
    """Bytes of one token's activation a row's dot product reads: f32 x, or for q4 rows the int8
    planes (xlo, xhi), their w0 and the word scales (quantize_activation; `grouped`: the two
    group vectors instead)."""
    if not info.quantized:
        return 4 * info.k
    if grouped:
        return info.k * planes + info.k // info.group_size * 4 * 2
    return info.k * planes + info.k // 8 * 4 * (planes + 1)


def vectorize_epilogue(sch, n: int) -> None:
    """The epilogue blocks after the extern (cast, residual add): one fused loop each, 16 lanes."""
    for block in blocks_after(sch, sch.get_sblock("gemv")):
        loop = sch.fuse(*sch.get_loops(block))
        if n % LANES == 0:
            sch.vectorize(sch.split(loop, [None, LANES])[1])


# ---- f32 activations, unquantized weights ---------------------------------------------------
def activation_f32(x: te.Tensor, k: int, tokens=1) -> te.Tensor:
    """The first `tokens` rows (static or symbolic) of the activation as f32 [tokens, K]."""
    return te.compute((tokens, k), lambda t, i: activation_f32_at(x, t, i), name="xf")


def float_chunk(x32, weight):
    """(chunk(n, c, t), streams(n, c)): row n's f32 products with token t's activation over
    weights 16 c .. 16 c + 15 (16 lanes), and the row's weight address for that chunk."""

    def chunk(n, c, t):
        return T.Cast("float32x16", weight[n, T.ramp(c * LANES, 1, LANES)]) * x32[t, T.ramp(c * LANES, 1, LANES)]

    def streams(n, c):
        return [T.address_of(weight[n, c * LANES])]

    return chunk, streams


# ---- q4 weights to f32 ------------------------------------------------------------------------
def q4_words_fit(info) -> bool:
    """q4 rows that q4_chunk_values decodes: K % 128 == 0, a group's words dividing 16 or a multiple of 16."""
    wpg = info.group_size // 8
    return info.bits == 4 and info.k % 128 == 0 and info.group_size % 8 == 0 and (LANES % wpg == 0 or wpg % LANES == 0)


def q4_chunk_values(info, words_buf, scales_buf, n, c) -> list:
    """Row n's 16 packed words 16 c .. 16 c + 15 as 8 f32x16 vectors, vector j = nibble j of each
    word ((q - 7) * s: k = 128 c + 8 l + j in lane l). Flat buffers: words [N * K/8], scales [N * K/G]."""
    wpg = info.group_size // 8
    gpc = max(LANES // wpg, 1)
    groups = info.k // info.group_size
    words = words_buf[T.ramp(n * (info.k // 8) + c * LANES, 1, LANES)]
    if gpc > 1:
        scales = T.Shuffle([T.Cast(f"float32x{gpc}", scales_buf[T.ramp(n * groups + c * gpc, 1, gpc)])] * (LANES // gpc),
                           [lane // wpg for lane in range(LANES)])
    else:
        scales = T.broadcast(T.Cast("float32", scales_buf[n * groups + (c * LANES) // wpg]), LANES)

    def value(j):
        nib = T.Cast("float32x16", (words >> T.broadcast(T.uint32(4 * j), LANES)) & T.broadcast(T.uint32(15), LANES))
        return (nib - T.broadcast(T.float32(7.0), LANES)) * scales

    return [value(j) for j in range(8)]


def prefetch_next_task(buf, start, span: int, step, steps: int, elem_bytes: int) -> None:
    """Software prefetch into L2 of buf[start : start + span] (the next task's weight rows, read
    while this task computes), spread over `steps` steps: emitted at step `step`, 64 B apart.
    `start` past the buffer is clamped to its last element."""
    per_step = span * elem_bytes // steps  # bytes
    last = buf.shape[0] - 1
    for j in range(max(1, -(-per_step // 64))):
        at = T.min(start + (step * per_step + j * 64) // elem_bytes, last)
        T.evaluate(T.call_llvm_intrin("void", "llvm.prefetch.p0", T.address_of(buf[at]), 0, 2, 1))


def tile_rows(block_n: int) -> int:
    """Rows of a C^T micro-kernel tile per stack array: the tile is split by rows in two arrays of
    tile_rows(block_n) * token_vecs vectors each (24 accumulators: 768 bytes, < STACK_BYTES)."""
    return -(-block_n // 2)


def tile_vector(accs, block_n: int, token_vecs: int, r: int, v: int):
    """(array, lanes) of the tile's vector for weight row r and 16-token vector v."""
    per = tile_rows(block_n)
    return accs[r // per], T.ramp(((r % per) * token_vecs + v) * LANES, 1, LANES)


def zero_tile(accs, block_n: int, token_vecs: int) -> None:
    """Every vector of the tile's two arrays to 0."""
    for r in range(block_n):
        for v in range(token_vecs):
            acc, lanes = tile_vector(accs, block_n, token_vecs, r, v)
            T.buffer_store(acc, T.broadcast(T.float32(0.0), LANES), [lanes])


def carry_tile(accs, buf, at, block_n: int, token_vecs: int, load: bool) -> None:
    """The tile's vectors from (load) or into a flat buffer at `at`, vector after vector."""
    for r in range(block_n):
        for v in range(token_vecs):
            acc, lanes = tile_vector(accs, block_n, token_vecs, r, v)
            held = T.ramp(at + (r * token_vecs + v) * LANES, 1, LANES)
            if load:
                T.buffer_store(acc, buf[held], [lanes])
            else:
                T.buffer_store(buf, acc[lanes], [held])


def store_transposed(out, accs, n_total: int, n0, block_n: int, token_vecs: int, mb) -> None:
    """A C^T micro-kernel's accumulators (the two arrays of tile_vector) into the flat C
    [tokens * N]: rows n0.. of token block mb."""
    for v in range(token_vecs):
        for r in range(block_n):
            t0 = (mb * token_vecs + v) * LANES
            acc, lanes = tile_vector(accs, block_n, token_vecs, r, v)
            T.buffer_store(out, acc[lanes], [T.ramp(t0 * n_total + n0 + r, n_total, LANES)])


def q4_position_order(p):
    """Natural k of position p when rows are stored as q4_chunk_values writes them (128-blocks of
    8 vectors): position 16 j + l of a block holds k = 8 l + j."""
    return (p // 128) * 128 + (p % 16) * 8 + (p % 128) // 16


# ---- q4 weights x int8 activations on AVX512-VNNI ------------------------------------------
def folds_planes(isa: str, planes: int) -> bool:
    """Whether vnni_chunk adds the two planes as integers (AVX2: RESIDUAL x plane 0 + plane 1, no
    float work per plane); quantize_activation's `fold` must be the same."""
    return isa == "avx2" and planes == 2


def quantize_activation(x: te.Tensor, k: int, group: int, planes: int = 2, tokens=1, fold: bool = False, grouped: bool = False):
    """The activation planes the kernel reads, for the first `tokens` rows of x (static or
    symbolic): (xlo, xhi) int8 [tokens, planes, K/2] (the even / odd k of each packed word, four
    per word), w0 int32 [tokens, planes, K/8] (-7 * sum of the word's int8 values) and a_word f32
    [tokens, K/8] (the int8 scale a of the word's group). Plane 0 is round(x / a); plane 1 (if
    any) the rounding residual in units of a / 256, so x = a * (p0 + p1 / 256) to ~16 bits.
    `fold` (folds_planes): w0 [tokens, 1, K/8] is RESIDUAL x plane 0's + plane 1's, a_word a / RESIDUAL.
    `grouped` (groups_fit; the planes folded): (xlo, xhi, a_group, c_group, spread), _group_terms."""
    xf = functools.partial(activation_f32_at, x)
    r = te.reduce_axis((0, group), "r")
    amax = te.compute((tokens, k // group), lambda t, g: te.max(te.abs(xf(t, group * g + r)), axis=r), name="amax")
    inv = te.compute(
        (tokens, k // group),
        lambda t, g: te.if_then_else(amax[t, g] > 0, tirx.const(127.0, "float32") / amax[t, g], tirx.const(0.0, "float32")),
        name="inv",
    )
    scaled = te.compute((tokens, k), lambda t, i: xf(t, i) * inv[t, i // group], name="x_scaled")

    xq = te.compute((tokens, planes, k), lambda t, p, i: q8_value(scaled[t, i], p), name="xq")
    xlo = te.compute((tokens, planes, k // 2), lambda t, p, i: xq[t, p, 8 * (i // 4) + 2 * (i % 4)], name="xlo")
    xhi = te.compute((tokens, planes, k // 2), lambda t, p, i: xq[t, p, 8 * (i // 4) + 2 * (i % 4) + 1], name="xhi")
    if grouped:
        return (xlo, xhi, *_group_terms(xq, amax, tokens, k, group, planes))
    j = te.reduce_axis((0, 8), "j")
    wpg = group // 8
    if fold:
        w0 = te.compute((tokens, 1, k // 8), lambda t, _, w: te.sum(
            (xq[t, 0, 8 * w + j].astype("int32") * int(RESIDUAL) + xq[t, 1, 8 * w + j].astype("int32")) * -7, axis=j), name="w0")
        a_word = te.compute((tokens, k // 8), lambda t, w: amax[t, w // wpg] / tirx.const(127.0 * RESIDUAL, "float32"), name="a_word")
        return xlo, xhi, w0, a_word
    w0 = te.compute((tokens, planes, k // 8), lambda t, p, w: te.sum(xq[t, p, 8 * w + j].astype("int32") * -7, axis=j), name="w0")
    a_word = te.compute((tokens, k // 8), lambda t, w: amax[t, w // wpg] / tirx.const(127.0, "float32"), name="a_word")
    return xlo, xhi, w0, a_word


# ---- the AVX2 GEMV's f32 tail per weight group ---------------------------------------------------
# Per-word scales cost more on AVX2 than the int8 products: each word's lane needs its group's
# weight scale (f16) times the activation's, spread x4. With groups of 4 words, a step of 16 groups
# (64 words) converts and multiplies them once (one f32 vector), spreads them to the words' lanes
# with one VPERMPS per 8 words, and adds the -7 offset as one group term instead of a word vector.
GROUP_WORDS = 4  # words per weight group (G = 32)
BLOCK_GROUPS = LANES  # groups per step: 64 words, 4 int8 chunks
PERMPS = "llvm.x86.avx2.permps"  # (f32x8, i32x8 index) -> f32x8; an index LLVM cannot see stays one VPERMPS


def groups_fit(info, isa: str) -> bool:
    """Whether the AVX2 GEMV takes the per-group tail: groups of 32 and K a multiple of 512."""
    return isa == "avx2" and info.group_size == 8 * GROUP_WORDS and info.k % (8 * GROUP_WORDS * BLOCK_GROUPS) == 0


def spread_index() -> te.Tensor:
    """VPERMPS indices [4, 8]: row q takes groups 2q, 2q + 1 of an 8-group vector to 4 lanes each.
    An input of the kernel, not a constant: LLVM folds a constant index into a shuffle, sinks it
    through the scale product and spreads each term's two factors apart."""
    return te.compute((4, 8), lambda q, lane: (2 * q + lane // 4).astype("int32"), name="spread")


def q8_value(scaled, p):
    """Plane p's int8 value of an activation already scaled by 127 / amax: plane 0 round(scaled)
    (nearest even), plane 1 the rounding residual x RESIDUAL, clipped to +-127."""
    high = tirx.nearbyint(scaled)
    low = tirx.nearbyint((scaled - high) * tirx.const(RESIDUAL, "float32"))
    low = te.max(te.min(low, tirx.const(127.0, "float32")), tirx.const(-127.0, "float32"))
    return te.if_then_else(p == 0, high, low).astype("int8")


def _group_terms(xq, amax, tokens, k: int, group: int, planes: int):
    """a_group [tokens, K/G]: the unit of the folded planes (a / RESIDUAL with two), and c_group
    [tokens, K/G]: a_group x -7 x the group's folded sum (the q - 7 offset), f32."""
    unit = 127.0 * (RESIDUAL if planes == 2 else 1.0)

    def folded(t, i):
        value = xq[t, 0, i].astype("int32")
        return value * int(RESIDUAL) + xq[t, 1, i].astype("int32") if planes == 2 else value

    j = te.reduce_axis((0, group), "j")
    total = te.compute((tokens, k // group), lambda t, g: te.sum(folded(t, g * group + j), axis=j), name="x_group_sum")
    a_group = te.compute((tokens, k // group), lambda t, g: amax[t, g] / tirx.const(unit, "float32"), name="a_group")
    c_group = te.compute((tokens, k // group), lambda t, g: a_group[t, g] * (total[t, g] * -7).astype("float32"), name="c_group")
    return a_group, c_group, spread_index()


def q8_planes(x: te.Tensor, tokens, padded, k: int, group: int):
    """The int8 GEMMs' activation (PrefillGEMMQ4VNNI, PrefillGEMMQ4I8MM): amax [padded, K/G] (te)
    and plane(p, t, i), the int8 value of token t at k = i in plane p (0: round(127 x / amax),
    llama.cpp's Q8; 1: the rounding residual x RESIDUAL, clipped to +-127). Tokens from `tokens`
    to `padded` are 0."""

    def xf(t, i):
        return te.if_then_else(t < tokens, activation_f32_at(x, te.min(t, tokens - 1), i), tirx.const(0.0, "float32"))

    r = te.reduce_axis((0, group), "r")
    amax = te.compute((padded, k // group), lambda t, g: te.max(te.abs(xf(t, g * group + r)), axis=r), name="amax")

    def plane(p, t, i):
        scaled = te.if_then_else(amax[t, i // group] > 0, xf(t, i) * (tirx.const(127.0, "float32") / amax[t, i // group]),
                                 tirx.const(0.0, "float32"))
        return q8_value(scaled, p)

    return amax, plane


def q8_fold_terms(amax: te.Tensor, xsum: te.Tensor) -> te.Tensor:
    """x_terms [plane, padded, K/G, 2] of the int8 GEMMs: e = 0: the plane's unit a_p (amax / 127,
    / RESIDUAL for plane 1); e = 1: the q - 7 offset in that unit (7 x sum x a_p). A plane's fold
    is then one FMS (int sum x a_p - offset), with no per-token scalar work in the kernel."""

    def term(p, t, g, e):
        unit = amax[t, g] * tirx.Select(p == 0, tirx.const(1.0 / 127.0, "float32"), tirx.const(1.0 / (127.0 * RESIDUAL), "float32"))
        return tirx.Select(e == 0, unit, (xsum[p, t, g] * 7).astype("float32") * unit)

    return te.compute((*xsum.shape, 2), term, name="x_terms")


def chunk_scales(info, scale):
    """(scales(n, c), index(c)) for q4 rows in chunks of 16 packed words: row n's group scale of
    each word of chunk c as f32x16, and the index of the chunk's first scale in a row of `scale`."""
    wpg = info.group_size // 8
    gpc = max(LANES // wpg, 1)  # scale groups per chunk
    chunks_per_group = max(wpg // LANES, 1)
    expand = [lane // wpg for lane in range(LANES)]  # word l belongs to the chunk's group expand[l]
    copies = LANES // gpc  # Shuffle cannot widen: it picks from `copies` concatenated copies

    def index(c):
        return c * gpc if gpc > 1 else c // chunks_per_group

    def scales(n, c):
        if gpc > 1:
            return T.Shuffle([T.Cast(f"float32x{gpc}", scale[n, T.ramp(c * gpc, 1, gpc)])] * copies, expand)
        return T.broadcast(T.Cast("float32", scale[n, index(c)]), LANES)

    return scales, index


def q4_nibbles(weight, n, c):
    """Row n's packed words 16 c .. 16 c + 15 as bytes: (low nibbles, high nibbles), int8x64 each."""
    words = weight[n, T.ramp(c * LANES, 1, LANES)]
    mask = T.broadcast(T.uint32(NIBBLES), LANES)
    return T.reinterpret("int8x64", words & mask), T.reinterpret("int8x64", (words >> T.broadcast(T.uint32(4), LANES)) & mask)


def plane_bytes(buf, t, p, c):
    """Token t's plane-p activation bytes (xlo or xhi) of words 16 c .. 16 c + 15, int8x64."""
    return T.reinterpret("int8x64", buf[t, p, T.ramp(c * 64, 1, 64)])


def avx2_folded_dots(lo, hi, xlo, xhi, t, c, planes: int):
    """AVX2: the words' int32 dots RESIDUAL x plane 0 + plane 1 (one plane: plane 0), without the offset."""
    total = avx2_dot_pair(lo, plane_bytes(xlo, t, 0, c), hi, plane_bytes(xhi, t, 0, c), int(RESIDUAL) if planes == 2 else 1)
    if planes == 2:
        total = total + avx2_dot_pair(lo, plane_bytes(xlo, t, 1, c), hi, plane_bytes(xhi, t, 1, c), 1)
    return total


def vnni_chunk(info, planes, xlo, xhi, w0, a_word, weight, scale, isa: str = "avx512"):
    """(chunk(n, c, t), streams(n, c)): chunk gives row n's f32 partial dot product with token
    t's activation over packed words 16 c .. 16 c + 15 (16 lanes); streams the addresses of the
    row's weight and scale data for that chunk (for software prefetch)."""
    word_scales, scale_index = chunk_scales(info, scale)

    def w0_word(t, p, c):
        return w0[t, p, T.ramp(c * LANES, 1, LANES)]

    def dot(n, c, t, p):
        """sum over each word's 8 k of (q - 7) * plane p of token t's x: int32 x 16 words"""
        lo, hi = q4_nibbles(weight, n, c)
        return int8_dot(isa, int8_dot(isa, w0_word(t, p, c), lo, plane_bytes(xlo, t, p, c)), hi, plane_bytes(xhi, t, p, c))

    def dots_folded(n, c, t):
        """RESIDUAL x plane 0 + plane 1 in one i32 (|.| < 2^22: exact in f32); a_word has the 1 / RESIDUAL"""
        lo, hi = q4_nibbles(weight, n, c)
        return T.Cast("float32x16", w0_word(t, 0, c) + avx2_folded_dots(lo, hi, xlo, xhi, t, c, 2))

    def dots(n, c, t):
        if folds_planes(isa, planes):
            return dots_folded(n, c, t)
        value = T.Cast("float32x16", dot(n, c, t, 0))
        if planes == 2:
            value = value + T.Cast("float32x16", dot(n, c, t, 1)) * T.broadcast(T.float32(1.0 / RESIDUAL), LANES)
        return value

    def chunk(n, c, t):
        return dots(n, c, t) * (word_scales(n, c) * a_word[t, T.ramp(c * LANES, 1, LANES)])

    def streams(n, c):
        return [T.address_of(weight[n, c * LANES]), T.address_of(scale[n, scale_index(c)])]

    return chunk, streams


def grouped_chunk(info, planes, xlo, xhi, a_group, c_group, spread, weight, scale):
    """(chunk(n, c, t), streams(n, c)) of the AVX2 GEMV with the per-group tail (groups_fit): step c
    covers words 64 c .. 64 c + 63 (16 groups); chunk gives 5 f32x16 terms (each 16-word chunk's
    folded int32 dots x its words' group values, and the groups' offset term)."""

    def dots(n, c, t):
        """plane-folded int32 dots (without the offset) of 16-word chunk c, as f32"""
        lo, hi = q4_nibbles(weight, n, c)
        return T.Cast("float32x16", avx2_folded_dots(lo, hi, xlo, xhi, t, c, planes))

    def spread_to_words(unit, i):
        """the group values of 8-word half i of the step (groups 2i, 2i + 1), 4 lanes each"""
        half = T.Shuffle([unit], list(range(8 * (i // 4), 8 * (i // 4) + 8)))
        return T.call_llvm_pure_intrin("float32x8", PERMPS, half, spread[i % 4, T.ramp(0, 1, 8)])

    def chunk(n, c, t):
        groups = T.ramp(c * BLOCK_GROUPS, 1, BLOCK_GROUPS)
        s = T.Cast("float32x16", scale[n, groups])
        unit = s * a_group[t, groups]
        per_step = BLOCK_GROUPS // GROUP_WORDS  # 16-word chunks per step
        terms = [dots(n, c * per_step + j, t) * T.Shuffle([spread_to_words(unit, 2 * j), spread_to_words(unit, 2 * j + 1)], list(range(LANES)))
                 for j in range(per_step)]
        return [*terms, s * c_group[t, groups]]

    def streams(n, c):
        return [T.address_of(weight[n, c * 64 + 16 * j]) for j in range(4)] + [T.address_of(scale[n, c * BLOCK_GROUPS])]

    return chunk, streams


# ---- the rebuilt kernel's epilogue -------------------------------------------------------------
def rebuild(info: NTMatmul, inputs: list[te.Tensor], matmul: te.Tensor, padded: bool = False) -> tirx.PrimFunc:
    """PrimFunc(params of `info.func`) = epilogue(matmul): `inputs` are the parameters'
    placeholders (`info.placeholders()`), `matmul` the new f32 [..., N] result (`padded`: it may
    have more rows than the output; they are dropped), the epilogue the original one, translated
    block by block."""
    params = list(info.func.params)
    known = list(zip(params[:-1], inputs[:-1])) + [(info.matmul_buffer, matmul)]
    last = matmul
    if padded and not info.epilogue:
        last = te.compute(list(params[-1].shape), lambda *i: matmul(*i), name="rows")
    for stmt in info.epilogue:
        last = _translate_block(stmt, known)
        known.append((stmt.body.buffer, last))
    args = list(inputs[:-1]) + [last]
    new = te.create_prim_func(args)
    new = new.without_attr("global_symbol")
    for key, value in info.func.attrs.items():
        new = new.with_attr(key, value)
    return new


def _name(var) -> str:
    return var.name if hasattr(var, "name") else str(var)


_BINARY = tuple(getattr(E, n) for n in ("Add", "Sub", "Mul", "Div", "FloorDiv", "FloorMod", "Min", "Max"))


def _rebuild(expr, vmap: dict, tensors: list):
    if isinstance(expr, TensorLoad):
        for var, tensor in tensors:
            if var.same_as(expr.source):
                return tensor(*[_rebuild(i, vmap, tensors) for i in expr.indices])
        raise ValueError(f"epilogue reads {_name(expr.source)}, which is neither a parameter nor computed")
    if isinstance(expr, (tirx.IntImm, tirx.FloatImm)):
        return expr
    if isinstance(expr, tirx.Var):
        for var, value in vmap:
            if var.same_as(expr):
                return value
        return expr
    if isinstance(expr, E.Cast):
        return E.Cast(str(expr.ty), _rebuild(expr.value, vmap, tensors))
    if isinstance(expr, _BINARY):
        return type(expr)(_rebuild(expr.a, vmap, tensors), _rebuild(expr.b, vmap, tensors))
    raise ValueError(f"epilogue expression {type(expr).__name__} not supported")


def _translate_block(stmt, tensors: list) -> te.Tensor:
    store = stmt.body
    ivs = [iv.var for iv in stmt.iter_vars]

    def fcompute(*idx):
        return _rebuild(store.value, list(zip(ivs, idx)), tensors)

    return te.compute(list(store.buffer.shape), fcompute, name=_name(store.buffer))


def schedule_extern_epilogue(sch: s_tir.Schedule, extern: str, lanes: int = 16) -> s_tir.Schedule:
    """After a rebuilt kernel's extern block `extern` (flat C buffer): the copy-out block inlined
    into the epilogue (C read straight from the kernel's buffer), each remaining epilogue block's
    loops fused and parallel, its innermost loop vectorized by `lanes`."""
    epilogue = blocks_after(sch, sch.get_sblock(extern))
    if len(epilogue) > 1:
        sch.compute_inline(epilogue[0])
        epilogue = epilogue[1:]
    for block in epilogue:
        loops = sch.get_loops(block)
        sch.parallel(sch.fuse(*loops[:-1]))
        sch.vectorize(sch.split(loops[-1], [None, lanes])[1])
    return sch

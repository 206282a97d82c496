"""CPU prefill GEMM on AMX bf16 tiles: C[m, n] = sum_k x[m, k] * W[n, k], many tokens m.

Computed as C^T = W . X^T: each task decodes 32 weight rows to bf16 (q4 or f16), reused by every
32-token block (2 x 2 tiles, `tdpbf16ps`), K in chunks; up to `low_batch` tokens a branch runs the
decode GEMVs' arithmetic. bf16 operands, f32 sums: f16-activation models only (q4f16_1, q0f16).
Handles: llvm with amx-bf16 and avx512bf16, N % 32 == 0, K % 128 == 0, f16 or q4 weights (group
size / 8 dividing 16). Knobs: k_chunk (K per outer step), group (tasks per parallel group; 0: 8
unquantized, 1 q4), low_batch (GEMV-branch tokens, q4 only with avx512vnni; 0: tiles always).
"""

from __future__ import annotations

import dataclasses

import tvm
from tvm import s_tir, te, tirx
from tvm.script import tirx as T
from tvm.target import Target, codegen

from ..analysis import match_on_cpu
from ..base import CPUScheduleRule, is_cpu
from .microkernels import (
    LANES,
    activation_f32,
    float_chunk,
    quantize_activation,
    rebuild,
    schedule_extern_epilogue,
    few_token_rows,
    vnni_chunk,
)

TILE = 16  # AMX tile: 16 rows x 64 bytes (32 bf16 along K)
BLOCK = 2 * TILE  # weight rows per task and tokens per step (2 x 2 tiles)
ARCH_PRCTL, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA = 158, 0x1023, 18
CVT_BF16 = "llvm.x86.avx512bf16.cvtneps2bf16.512"
K_CHUNKS = (512, 1024, 2048, 4096, 8192)
GROUPS = (8, 4, 2, 1)
PIECE = 128  # K positions of one decode step (q4: also the span of its K permutation)
PLANES, FEW_ROWS, FEW_PER_PASS, FEW_PREFETCH = 2, 2, 4, 8  # few-token branch: as the decode GEMV's defaults


@dataclasses.dataclass
class PrefillGEMMAMX(CPUScheduleRule):
    k_chunk: int = 2048
    group: int = 0  # tasks per parallel group (decode of the next overlapping the current); 0: auto
    low_batch: int = 4  # up to this many tokens take the GEMV branch (q4: on VNNI CPUs); 0: never

    def knob_space(self, func: tirx.PrimFunc, target: Target) -> dict[str, list]:
        info = _applicable(func, target)
        if info is None:
            return {}
        chunks = [c for c in K_CHUNKS if c < info.k and info.k % c == 0 and c % PIECE == 0]
        # 0 = the default's choice (8 unquantized, 1 q4), then the explicit sizes
        # `low_batch` is not searched: `mlcpipe tune` times prefill kernels at --tokens (128), where
        # the few-token branch does not run
        space = {"group": [0, *(g for g in GROUPS if (info.n // BLOCK) % g == 0)]}
        if chunks:  # else K in one piece only
            space["k_chunk"] = [*chunks, info.k]
        return space

    def apply(self, func: tirx.PrimFunc, target: Target, tunable: bool) -> s_tir.Schedule | None:
        del tunable
        info = _applicable(func, target)
        if info is None:
            return None
        chunk = min(self.k_chunk, info.k)
        group = self.group or (1 if info.quantized else 8)
        group = next(g for g in GROUPS if g <= group and (info.n // BLOCK) % g == 0)
        if info.k % chunk or chunk % PIECE or self.low_batch < 0:
            return None
        low_batch = self.low_batch if _low_batch_fits(info, target) else 0
        sch = s_tir.Schedule(_build(info, chunk, group, low_batch))
        sch.parallel(sch.get_loops(sch.get_sblock("x_bf16"))[0])
        return schedule_extern_epilogue(sch, "gemm_amx", LANES)


def _applicable(func, target):
    if not isinstance(func, tirx.PrimFunc) or not is_cpu(target):
        return None
    if not (codegen.target_has_features("amx-bf16", target) and codegen.target_has_features("avx512bf16", target)):
        return None
    info = match_on_cpu(func, target, decode=False)
    if info is None or str(info.x.dtype) != "float16" or len(info.rows_shape) != 2 or info.n % BLOCK:
        return None
    if info.k % PIECE:
        return None
    if info.quantized and (info.bits != 4 or info.group_size % 8 or LANES % (info.group_size // 8)):
        return None
    return info


def _low_batch_fits(info, target) -> bool:
    """The few-token branch: unquantized weights (f32 FMAs), or q4 with the VNNI GEMV's arithmetic."""
    return not info.quantized or codegen.target_has_features("avx512vnni", target)


def transpose_tile(dst, dst_base, dst_stride, src, src_base, src_stride) -> None:
    """Emit (inside a TVMScript function) dst[c, r] = src[r, c] for a 16 x 16 f32 block: 16 row
    loads, a 4-stage network of 64 two-vector shuffles (stage b swaps the off-diagonal b x b
    blocks), 16 row stores; a scalar or strided-gather transpose costs ~4x the instructions."""
    rows = [src[T.ramp(src_base + r * src_stride, 1, TILE)] for r in range(TILE)]
    b = TILE // 2
    while b:
        low = [lane if lane & b == 0 else TILE + lane - b for lane in range(TILE)]
        high = [lane + b if lane & b == 0 else TILE + lane for lane in range(TILE)]
        swapped = list(rows)
        for r in range(TILE):
            if r & b == 0:
                swapped[r] = T.Shuffle([rows[r], rows[r + b]], low)
                swapped[r + b] = T.Shuffle([rows[r], rows[r + b]], high)
        rows = swapped
        b //= 2
    narrow = str(dst.dtype) == "float16"
    for c in range(TILE):
        T.buffer_store(dst, T.Cast(f"float16x{TILE}", rows[c]) if narrow else rows[c], [T.ramp(dst_base + c * dst_stride, 1, TILE)])


def k_order(info):
    """Position P of the decoded weight row -> k (the same permutation is applied to x)."""
    if not info.quantized:
        return lambda p: p
    return lambda p: 8 * (LANES * (p // 128) + p % LANES) + (p % 128) // LANES


def _bf16_bits(value):
    """Round-to-nearest-even f32 -> bf16, as uint16 bits (finite inputs)."""
    u = tirx.reinterpret("uint32", value)
    rounded = (u + tirx.const(0x7FFF, "uint32") + ((u >> tirx.const(16, "uint32")) & tirx.const(1, "uint32"))) >> tirx.const(16, "uint32")
    return rounded.astype("uint16")


def _casts_to_f16_first(info) -> bool:
    """Whether the epilogue starts by casting the f32 result to f16 (`..._cast`): the kernel
    can then write f16 itself (half the bytes to write and read back; the epilogue's cast of an
    f16 value widened to f32 gives the same f16 again)."""
    if not info.epilogue:
        return False
    store = info.epilogue[0].body
    value = getattr(store, "value", None)
    if not isinstance(value, tirx.Cast) or str(value.ty.dtype) != "float16":
        return False
    inner = value.value
    return isinstance(inner, tvm.ir.TensorLoad) and inner.source.same_as(info.matmul_buffer)


def _build(info, chunk: int, group: int, low_batch: int) -> tirx.PrimFunc:
    inputs = info.placeholders()
    x = inputs[info.param_index(info.x)]
    w = inputs[info.param_index(info.weight)]
    tokens = x.shape[-2]
    padded = (tokens + BLOCK - 1) // BLOCK * BLOCK
    order = k_order(info)
    # tile-packed: xb[K step, token tile, k pair, token, 2] = one contiguous 1 KiB AMX tile each
    xb = te.compute(
        (info.k // BLOCK, padded // TILE, TILE, TILE, 2),
        lambda kb, mt, kr, t, p: te.if_then_else(
            mt * TILE + t < tokens,
            _bf16_bits(x[0, te.min(mt * TILE + t, tokens - 1), order(2 * (kb * TILE + kr) + p)].astype("float32")),
            tirx.const(0, "uint16"),
        ),
        name="x_bf16",
    )
    ins = [xb, w] + ([inputs[info.param_index(info.scale)]] if info.quantized else [])
    if low_batch:  # the few-token branch's activation (one token's when the branch does not run)
        few = tirx.Select(tokens <= low_batch, tokens, tirx.const(1, str(tokens.ty)))
        if info.quantized:
            ins += quantize_activation(x, info.k, info.group_size, PLANES, few)  # int8 planes
        else:
            ins.append(activation_f32(x, info.k, few))
    # C as a flat [padded * N] buffer: a 2-D extern buffer with a symbolic row stride was read
    # back with the wrong stride by the following stage (TVM 0.27), a flat one is not
    out_dtype = "float16" if _casts_to_f16_first(info) else "float32"

    def body(i, o):
        amx = _kernel(info, padded, chunk, group, i[0], i[1], i[2] if info.quantized else None, o[0])
        if not low_batch:
            return amx
        if info.quantized:
            row_chunk, streams = vnni_chunk(info, PLANES, *i[3:7], i[1], i[2])
        else:
            row_chunk, streams = float_chunk(i[2], i[1])
        return tirx.IfThenElse(tokens <= low_batch, few_token_rows(info, tokens, low_batch, row_chunk, streams, o[0], FEW_ROWS, FEW_PER_PASS, FEW_PREFETCH, PLANES), amx)

    c = te.extern(
        (padded * info.n,),
        ins,
        body,
        name="gemm_amx",
        dtype=out_dtype,
        in_buffers=[tirx.decl_buffer(t.shape, t.dtype, name=f"{t.op.name}_buf") for t in ins],
        out_buffers=[tirx.decl_buffer((padded * info.n,), out_dtype, name="c_buf")],
    )
    mm = te.compute((*x.shape[:-1], info.n), lambda b, m, n: c[m * info.n + n].astype("float32"), name="matmul")
    return rebuild(info, inputs, mm)


def _kernel(info, padded, chunk, group, xb, weight, scale, out):
    k, n_total = info.k, info.n
    tile_row = tirx.const(64, "int64")  # every operand tile is packed: 16 rows of 64 bytes
    acc_stride = tirx.const(BLOCK * 4, "int64")
    m_blocks = padded // BLOCK
    tasks = n_total // BLOCK
    chunks = k // chunk
    acc_size = BLOCK * BLOCK  # one 32 x 32 f32 block of C^T per (task, token block)

    def tile(op, *args):
        return T.call_llvm_intrin("void", f"llvm.x86.{op}", *args)

    def decode_q4(n, c, j):
        wpg = info.group_size // 8
        gpc = LANES // wpg
        words = weight[n, T.ramp(c * LANES, 1, LANES)]
        nib = T.Cast("float32x16", (words >> T.broadcast(T.uint32(4 * j), LANES)) & T.broadcast(T.uint32(15), LANES))
        if gpc > 1:
            scales = T.Shuffle([T.Cast(f"float32x{gpc}", scale[n, T.ramp(c * gpc, 1, gpc)])] * (LANES // gpc), [lane // wpg for lane in range(LANES)])
        else:
            scales = T.broadcast(T.Cast("float32", scale[n, c]), LANES)
        return (nib - T.broadcast(T.float32(7), LANES)) * scales

    quantized = info.quantized
    blocks = chunk // PIECE  # decode pieces of a row
    pieces = BLOCK * blocks  # decode work of one task: (row, 128-block) pieces of 8 vectors
    kbs = chunk // BLOCK
    steps = m_blocks * kbs  # K steps of one task (all token blocks)
    pieces_per_step = (pieces + steps - 1) // steps

    def packed(half, r, p):
        """Offset of row r, position p of a decoded weight block (buffer half 0 / 1), packed as
        1 KiB AMX tiles [K step, row tile, row, 32 positions]: a tile load reads 1 KiB at once."""
        return half * (BLOCK * chunk) + ((p // BLOCK) * 2 + r // TILE) * (TILE * BLOCK) + (r % TILE) * BLOCK + p % BLOCK

    def bf16(v):  # 16 f32 -> 16 bf16 bits, round to nearest even: one vcvtneps2bf16
        return T.reinterpret("uint16x16", T.call_llvm_pure_intrin("bfloat16x16", CVT_BF16, v))

    def decode_piece(d, half, task, kc, e):
        """Emit the decode of piece e (row e // blocks, 128 positions e % blocks) of `task`'s
        weight rows (chunk kc) into half `half` of d: 8 vectors of 16 bf16."""
        r, c = e // blocks, e % blocks
        n = task * BLOCK + r
        for j in range(8):
            if quantized:
                value = decode_q4(n, kc * blocks + c, j)
            else:
                value = T.Cast("float32x16", weight[n, T.ramp(kc * chunk + c * PIECE + j * LANES, 1, LANES)])
            T.buffer_store(d, bf16(value), [T.ramp(packed(half, r, c * PIECE + j * LANES), 1, LANES)])

    # software prefetch of the weight rows two tasks ahead (the next one is being decoded),
    # spread over the task's K steps, into L2
    words_per_line = 64 // (4 if quantized else 2)  # packed q4 words / f16 values per 64 B
    row_elems = chunk // 8 if quantized else chunk
    lines_per_row = max(row_elems // words_per_line, 1)
    lines_total = BLOCK * lines_per_row
    lines_per_step = (lines_total + steps - 1) // steps
    halves = 2 if group > 1 else 1  # decoded weight blocks: the current task's (+ the next one's)
    ahead = halves  # prefetch the task after the one being decoded / the next one

    def line_ahead(task, kc, j):
        row = T.min((task + ahead) * BLOCK + j // lines_per_row, n_total - 1)
        return T.address_of(weight[row, kc * row_elems + (j % lines_per_row) * words_per_line])

    # accumulator tile t (W rows 16 (t // 2).., tokens 16 (t % 2)..) at this offset of a 32 x 32 block
    def at(task, mb, t):
        return (task * m_blocks + mb) * acc_size + (t // 2) * TILE * BLOCK + (t % 2) * TILE

    def accumulators(op, acc, task, mb):
        """Emit `op` (tilezero / tileloadd64 / tilestored64) for the 4 accumulator tiles tmm0-3."""
        for t in range(4):
            if op == "tilezero":
                T.evaluate(tile(op, T.int8(t)))
            else:
                T.evaluate(tile(op, T.int8(t), T.address_of(acc[at(task, mb, t)]), acc_stride))

    @T.prim_func(private=True, check_well_formed=False)
    def body():
        assert T.call_extern("int64", "syscall", T.int64(ARCH_PRCTL), T.int64(ARCH_REQ_XCOMP_PERM), T.int64(XFEATURE_XTILEDATA)) == T.int64(0), (
            "AMX tiles are not available to this process (arch_prctl ARCH_REQ_XCOMP_PERM failed): rebuild for this CPU/OS"
        )
        acc = T.alloc_buffer((tasks * m_blocks * acc_size,), "float32")
        # K in chunks, all tasks per chunk: a thread's activation chunk stays in its L2 across tasks
        for kc in range(chunks):
            # groups of `group` consecutive tasks; within a group the next task's weights are
            # decoded (vector units) while the current task's tiles compute (AMX unit)
            for g in T.parallel(tasks // group):
                d = T.alloc_buffer((halves * BLOCK * chunk,), "uint16")  # decoded weight blocks
                cfg = T.alloc_buffer((64,), "uint8", scope="local")
                for i in range(64):
                    cfg[i] = T.uint8(0)
                cfg[0] = T.uint8(1)
                for t in range(8):
                    cfg[16 + 2 * t] = T.uint8(64)
                    cfg[48 + t] = T.uint8(TILE)
                T.evaluate(tile("ldtilecfg", T.address_of(cfg[0])))
                for e in range(pieces):
                    decode_piece(d, 0, g * group, kc, e)
                for i in range(group):
                    for mb in range(m_blocks):
                        if kc == 0:
                            accumulators("tilezero", acc, g * group + i, mb)
                        else:
                            accumulators("tileloadd64", acc, g * group + i, mb)
                        for kb in range(kbs):
                            if i + 1 < group:
                                for p in range(pieces_per_step):
                                    if (mb * kbs + kb) * pieces_per_step + p < pieces:
                                        decode_piece(d, (i + 1) % halves, g * group + i + 1, kc, (mb * kbs + kb) * pieces_per_step + p)
                            for p in range(lines_per_step):
                                if (mb * kbs + kb) * lines_per_step + p < lines_total:
                                    T.evaluate(T.call_llvm_intrin("void", "llvm.prefetch.p0", line_ahead(g * group + i, kc, (mb * kbs + kb) * lines_per_step + p), 0, 2, 1))
                            T.evaluate(tile("tileloadd64", T.int8(4), T.address_of(d[packed(i % halves, 0, kb * BLOCK)]), tile_row))
                            T.evaluate(tile("tileloadd64", T.int8(5), T.address_of(d[packed(i % halves, TILE, kb * BLOCK)]), tile_row))
                            T.evaluate(tile("tileloadd64", T.int8(6), T.address_of(xb[kc * kbs + kb, 2 * mb, 0, 0, 0]), tile_row))
                            T.evaluate(tile("tileloadd64", T.int8(7), T.address_of(xb[kc * kbs + kb, 2 * mb + 1, 0, 0, 0]), tile_row))
                            T.evaluate(tile("tdpbf16ps", T.int8(0), T.int8(4), T.int8(6)))
                            T.evaluate(tile("tdpbf16ps", T.int8(1), T.int8(4), T.int8(7)))
                            T.evaluate(tile("tdpbf16ps", T.int8(2), T.int8(5), T.int8(6)))
                            T.evaluate(tile("tdpbf16ps", T.int8(3), T.int8(5), T.int8(7)))
                        accumulators("tilestored64", acc, g * group + i, mb)
                        if kc == chunks - 1:  # the C^T block transposed into C rows
                            for a in range(2):
                                for b in range(2):
                                    transpose_tile(out, (mb * BLOCK + b * TILE) * n_total + (g * group + i) * BLOCK + a * TILE, n_total,
                                                   acc, at(g * group + i, mb, 2 * a + b), BLOCK)
                T.evaluate(tile("tilerelease"))

    return body.body

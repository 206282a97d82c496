"""CPU prefill GEMM with MLC q4 weights on aarch64 int8 matrix multiply-accumulate (FEAT_I8MM:
SMMLA, Graviton 3/4, Apple M2+, Neoverse N2/V1/V2), for CPUs without AMX.

One SMMLA multiplies a 2 x 8 int8 block of two tokens by an 8 x 2 block of two weight rows into
a 2 x 2 int32 tile: 32 products per instruction, twice SDOT's 16. The activation becomes the
same int8 planes as PrefillGEMMQ4VNNI (microkernels.q8_planes), stored per token pair as
[pair, k / 8, 2 tokens, 8 bytes]; each task repacks 2 `row_pairs` weight rows' nibbles as
[row pair, k / 8, 2 rows, 8 bytes]; a group's products sum exactly in int32, then per plane one
FMS with the precomputed terms (microkernels.q8_fold_terms) and one FMA with the row scales into
f32: the VNNI rule's arithmetic, in the same order.
Handles: llvm for aarch64 with i8mm; many-token NT matmul, f16 activations, q4 weights, group
size % 8 == 0, N % (2 row_pairs) == 0. Knobs: token_pairs, row_pairs (the micro-kernel's tile
of 2 x 2 tiles), planes (1 = Q8, the default; 2 = ~16-bit), low_batch (up to this many tokens
two planes; 0: never unless planes is 2).
"""

from __future__ import annotations

import dataclasses

from tvm import s_tir, te, tirx
from tvm.script import tirx as T
from tvm.target import Target, codegen

from ..analysis import match_on_cpu
from ..base import CPUScheduleRule, is_cpu
from .microkernels import q8_fold_terms, q8_planes, rebuild, schedule_extern_epilogue

SMMLA = "llvm.aarch64.neon.smmla.v4i32.v16i8"  # (i32x4 acc, i8x16 a, i8x16 b): acc[2i + j] += a row i . b row j (8 bytes each)
NEON_REGISTERS = 32


def has_i8mm(target: Target) -> bool:
    triple = str(target.attrs.get("mtriple", "") or "")
    return triple.startswith("aarch64") and codegen.target_has_features("i8mm", target)


def tile_fits(token_pairs: int, row_pairs: int, planes: int) -> bool:
    """int32 tiles per plane, f32 tiles and the A / B operands in the 32 NEON registers."""
    return token_pairs * row_pairs * (planes + 1) + token_pairs + row_pairs <= NEON_REGISTERS


@dataclasses.dataclass
class PrefillGEMMQ4I8MM(CPUScheduleRule):
    token_pairs: int = 2  # token pairs per micro-kernel
    row_pairs: int = 4  # weight-row pairs per micro-kernel and task
    planes: int = 1  # int8 activation planes: 1 = round(x / a) (llama.cpp's Q8), 2 = + residual (~16 bits)
    low_batch: int = 4  # up to this many tokens: two planes whatever `planes` says (the decode GEMV's precision)

    def knob_space(self, func: tirx.PrimFunc, target: Target) -> dict[str, list]:
        info = _applicable(func, target)
        if info is None:
            return {}
        return {"token_pairs": [1, 2, 4], "row_pairs": [v for v in (2, 4, 8) if info.n % (2 * v) == 0], "planes": [1, 2]}

    def apply(self, func: tirx.PrimFunc, target: Target, tunable: bool) -> s_tir.Schedule | None:
        del tunable
        info = _applicable(func, target)
        if info is None:
            return None
        if (self.token_pairs < 1 or self.row_pairs < 1 or info.n % (2 * self.row_pairs) or self.planes not in (1, 2)
                or self.low_batch < 0 or not tile_fits(self.token_pairs, self.row_pairs, self.planes)):
            return None
        sch = s_tir.Schedule(_build(info, self.token_pairs, self.row_pairs, self.planes, self.low_batch))
        for name in ("amax", "x_q", "x_sum", "x_terms"):
            sch.parallel(sch.get_loops(sch.get_sblock(name))[0])
        return schedule_extern_epilogue(sch, "gemm_i8mm", 16)


def _applicable(func, target):
    if not isinstance(func, tirx.PrimFunc) or not is_cpu(target) or not has_i8mm(target):
        return None
    info = match_on_cpu(func, target, decode=False)
    if info is None or info.bits != 4 or str(info.x.dtype) != "float16" or len(info.rows_shape) != 2:
        return None
    if info.group_size % 8 or info.k % info.group_size or info.n % 2:
        return None
    return info


def _build(info, token_pairs: int, row_pairs: int, planes: int, low_batch: int) -> tirx.PrimFunc:
    inputs = info.placeholders()
    x = inputs[info.param_index(info.x)]
    k, group = info.k, info.group_size
    tokens = x.shape[-2]
    per_block = 2 * token_pairs
    padded = (tokens + per_block - 1) // per_block * per_block
    amax, plane = q8_planes(x, tokens, padded, k, group)
    stored = 2 if planes == 2 or low_batch > 0 else 1  # planes computed per call
    # [plane, token pair, k / 8, 2 tokens, 8 bytes]: one SMMLA operand is 16 adjacent bytes
    xq = te.compute((stored, padded // 2, k // 8, 2, 8), lambda p, tp, b, tt, j: plane(p, 2 * tp + tt, 8 * b + j), name="x_q")
    j = te.reduce_axis((0, group), "j")
    xsum = te.compute((stored, padded, k // group), lambda p, t, g: te.sum(
        xq[p, t // 2, (g * group + j) // 8, t % 2, (g * group + j) % 8].astype("int32"), axis=j), name="x_sum")
    ins = [xq, q8_fold_terms(amax, xsum), inputs[info.param_index(info.weight)], inputs[info.param_index(info.scale)]]

    def body(i, o):
        many = _kernel(info, padded, token_pairs, row_pairs, planes, stored, *i, o[0])
        if planes == 2 or low_batch == 0:
            return many
        return tirx.IfThenElse(tokens <= low_batch, _kernel(info, padded, token_pairs, row_pairs, 2, stored, *i, o[0]), many)

    c = te.extern(
        (padded * info.n,), ins, body, name="gemm_i8mm", dtype="float32",
        in_buffers=[tirx.decl_buffer(t.shape, t.dtype, name=f"{t.op.name}_buf") for t in ins],
        out_buffers=[tirx.decl_buffer((padded * info.n,), "float32", name="c_buf")],
    )
    mm = te.compute((*x.shape[:-1], info.n), lambda b, m, n: c[m * info.n + n], name="matmul")
    return rebuild(info, inputs, mm)


def _pairs(lo, hi):
    """4 lanes (lo, lo, hi, hi): a per-token value laid out like a 2 x 2 tile's rows."""
    return T.Shuffle([T.broadcast(lo, 2), T.broadcast(hi, 2)], [0, 1, 2, 3])


def _kernel(info, padded, token_pairs, row_pairs, planes, stored, xq, terms, weight, scale, out):
    n_total, k, group = info.n, info.k, info.group_size
    groups = k // group
    blocks = k // 8  # 8-byte k blocks: one SMMLA step
    blocks_per_group = group // 8
    words = k // 8  # one packed u32 word holds one k block of one row
    rows = 2 * row_pairs
    tiles = token_pairs * row_pairs
    u = T.uint32

    def repack(wpk, wf, task, rp, b):
        """Rows n0, n0 + 1's k block b as 16 bytes (row n0's 8 nibbles, then row n0 + 1's): 4 u32."""
        n0 = task * rows + 2 * rp
        word = T.Shuffle([T.broadcast(wf[n0 * words + b], 2), T.broadcast(wf[(n0 + 1) * words + b], 2)], [0, 1, 2, 3])
        half = word >> T.Shuffle([T.broadcast(u(0), 2), T.broadcast(u(16), 2)], [0, 2, 1, 3])  # low, high half of each word
        nib = T.broadcast(u(15), 4)
        packed = (half & nib) | ((half >> T.broadcast(u(4), 4)) & nib) << T.broadcast(u(8), 4)
        packed = packed | ((half >> T.broadcast(u(8), 4)) & nib) << T.broadcast(u(16), 4)
        packed = packed | ((half >> T.broadcast(u(12), 4)) & nib) << T.broadcast(u(24), 4)
        T.buffer_store(wpk, packed, [T.ramp((rp * blocks + b) * 4, 1, 4)])

    def scales_of(sc, sf, task, rp, g):
        n0 = task * rows + 2 * rp
        lo, hi = (T.broadcast(T.Cast("float32", sf[n * groups + g]), 2) for n in (n0, n0 + 1))
        T.buffer_store(sc, T.Shuffle([lo, hi], [0, 2, 1, 3]), [T.ramp((g * row_pairs + rp) * 4, 1, 4)])  # (s0, s1, s0, s1)

    def tile(i, r):
        return T.ramp((i * row_pairs + r) * 4, 1, 4)

    def zero(acc, dtype):
        for a in range(tiles):
            T.buffer_store(acc, T.broadcast(tirx.const(0, dtype), 4), [T.ramp(a * 4, 1, 4)])

    def step(iaccs, wpk, x8, tb, b):
        bv = [T.reinterpret("int8x16", wpk[T.ramp((r * blocks + b) * 4, 1, 4)]) for r in range(row_pairs)]
        for p in range(planes):
            for i in range(token_pairs):
                av = x8[T.ramp((((p * (padded // 2)) + tb * token_pairs + i) * blocks + b) * 16, 1, 16)]
                for r in range(row_pairs):
                    T.buffer_store(iaccs[p], T.call_llvm_pure_intrin("int32x4", SMMLA, iaccs[p][tile(i, r)], av, bv[r]), [tile(i, r)])

    def fold(facc, iaccs, sc, tb, g):
        for i in range(token_pairs):
            t0 = (tb * token_pairs + i) * 2
            for r in range(row_pairs):
                lanes = tile(i, r)
                dots = None
                for p in range(planes):
                    unit, offset = (_pairs(terms[p, t0, g, e], terms[p, t0 + 1, g, e]) for e in (0, 1))
                    term = T.Cast("float32x4", iaccs[p][lanes]) * unit - offset
                    dots = term if dots is None else dots + term
                T.buffer_store(facc, facc[lanes] + dots * sc[T.ramp((g * row_pairs + r) * 4, 1, 4)], [lanes])

    def store(facc, task, tb):
        for i in range(token_pairs):
            t0 = (tb * token_pairs + i) * 2
            for r in range(row_pairs):
                v = facc[tile(i, r)]
                n0 = task * rows + 2 * r
                T.buffer_store(out, T.Shuffle([v], [0, 1]), [T.ramp(t0 * n_total + n0, 1, 2)])
                T.buffer_store(out, T.Shuffle([v], [2, 3]), [T.ramp((t0 + 1) * n_total + n0, 1, 2)])

    scale_dtype = str(scale.dtype)

    @T.prim_func(private=True, check_well_formed=False)
    def body():
        x8 = T.decl_buffer((stored * padded * k,), "int8", data=xq.data)
        wf = T.decl_buffer((n_total * words,), "uint32", data=weight.data)
        sf = T.decl_buffer((n_total * groups,), scale_dtype, data=scale.data)
        for task in T.parallel(n_total // rows):
            wpk = T.alloc_buffer((row_pairs * blocks * 4,), "uint32")
            sc = T.alloc_buffer((groups * row_pairs * 4,), "float32")
            for rp in range(row_pairs):
                for b in range(blocks):
                    repack(wpk, wf, task, rp, b)
                for g in range(groups):
                    scales_of(sc, sf, task, rp, g)
            for tb in range(padded // (2 * token_pairs)):
                facc = T.alloc_buffer((tiles * 4,), "float32")  # stack arrays (< STACK_BYTES each)
                iacc0 = T.alloc_buffer((tiles * 4,), "int32")
                iacc1 = T.alloc_buffer((tiles * 4,), "int32")  # plane 1 (unused with one plane)
                zero(facc, "float32")
                for g in range(groups):
                    zero(iacc0, "int32")
                    if planes == 2:
                        zero(iacc1, "int32")
                    for bb in range(blocks_per_group):
                        step((iacc0, iacc1), wpk, x8, tb, g * blocks_per_group + bb)
                    fold(facc, (iacc0, iacc1), sc, tb, g)
                store(facc, task, tb)

    return body.body

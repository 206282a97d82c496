"""CPU prefill GEMM with MLC q4 weights on int8 dot products, for CPUs without AMX.

The activation becomes int8 planes per token and weight group (plane 0: llama.cpp's Q8, plane 1:
the rounding residual); each task repacks 16 `row_vecs` weight rows' nibbles; a group's u8 x s8
products sum exactly in int32 (AVX2: in int16 pair sums, widened once per group), then per plane
one FMS with the (token, group) terms precomputed per call (x_terms) and one FMA with the row
scales into f32. Only f16-activation models (q4f16_1).
Handles: llvm with AVX512-VNNI, AVX-VNNI, AVX2 or aarch64 dotprod; many-token NT matmul, group size
% 8 == 0, N % 16 == 0. Knobs: block_m (tokens per micro-kernel), row_vecs (16-row vectors per
task; None: the ISA's), planes (1 = Q8, the default; 2 = ~16-bit), low_batch (up to this many
tokens two planes; 0: never unless planes is 2), prefetch (1: the next task's weight rows into L2
during the first token block; 0: off).
"""

from __future__ import annotations

import dataclasses

from tvm import s_tir, te, tirx
from tvm.script import tirx as T
from tvm.target import Target

from ..analysis import match_on_cpu
from ..base import CPUScheduleRule, is_cpu
from .microkernels import (LANES, avx2_madd16, avx2_widen, int8_dot, int8_isa, prefetch_next_task, q8_fold_terms, q8_planes, rebuild,
                           schedule_extern_epilogue)

# (block_m, row_vecs) when the knobs say 0; the most block_m x row_vecs whose f32 and two planes'
# int32 accumulators (16 lanes each) fit the vector registers (AVX-VNNI 16 x 256 bits, NEON 32 x 128)
DEFAULT_TILE = {"avx512": (4, 2), "avxvnni": (2, 1), "arm": (2, 1), "avx2": (2, 1)}
MAX_TILE = {"avx512": 64, "avxvnni": 2, "arm": 2, "avx2": 2}
REPACKED_BLOCK = 128 * 1024  # default row_vecs: at most this many bytes of a task's repacked rows (K x 16 per row vector)


@dataclasses.dataclass
class PrefillGEMMQ4VNNI(CPUScheduleRule):
    block_m: int | None = None  # tokens per micro-kernel (None: the ISA's default, DEFAULT_TILE)
    row_vecs: int | None = None  # 16-row vectors per micro-kernel and task (None: the ISA's default, fewer for long rows)
    planes: int = 1  # int8 activation planes: 1 = round(x / a) (llama.cpp's Q8), 2 = + residual (~16 bits)
    low_batch: int = 4  # up to this many tokens: two planes whatever `planes` says (the decode GEMV's precision)
    prefetch: int = 1  # 1: prefetch the next task's weight rows while the first token block computes (0: off)

    def knob_space(self, func: tirx.PrimFunc, target: Target) -> dict[str, list]:
        info = _applicable(func, target)
        if info is None:
            return {}
        if int8_isa(target) != "avx512":
            return {"block_m": [1, 2], "row_vecs": [1], "planes": [1, 2], "prefetch": [1, 0]}
        return {"block_m": [2, 4, 6, 8], "row_vecs": [v for v in (1, 2, 4) if info.n % (LANES * v) == 0], "planes": [1, 2], "prefetch": [1, 0]}

    def apply(self, func: tirx.PrimFunc, target: Target, tunable: bool) -> s_tir.Schedule | None:
        del tunable
        info = _applicable(func, target)
        if info is None:
            return None
        isa = int8_isa(target)
        block_m, row_vecs = (v if v is not None else d for v, d in zip((self.block_m, self.row_vecs), DEFAULT_TILE[isa]))
        if self.row_vecs is None:  # long rows (down, K = 8192): fewer rows per task, the block stays in L2 beside the activation
            row_vecs = max(1, min(row_vecs, REPACKED_BLOCK // (info.k * LANES)))
        if (block_m < 1 or row_vecs < 1 or info.n % (LANES * row_vecs) or self.planes not in (1, 2) or self.low_batch < 0
                or block_m * row_vecs > MAX_TILE[isa] or self.prefetch not in (0, 1)):
            return None
        sch = s_tir.Schedule(_build(info, block_m, row_vecs, self.planes, self.low_batch, isa, self.prefetch))
        for name in ("amax", "x_q", "x_sum", "x_terms"):
            sch.parallel(sch.get_loops(sch.get_sblock(name))[0])
        return schedule_extern_epilogue(sch, "gemm_vnni", LANES)


def _applicable(func, target):
    if not isinstance(func, tirx.PrimFunc) or not is_cpu(target):
        return None
    if int8_isa(target) is None:
        return None
    info = match_on_cpu(func, target, decode=False)
    if info is None or info.bits != 4 or str(info.x.dtype) != "float16" or len(info.rows_shape) != 2:
        return None
    if info.group_size % 8 or info.k % info.group_size or info.n % LANES:
        return None
    return info


def _build(info, block_m: int, row_vecs: int, planes: int, low_batch: int, isa: str, prefetch: int) -> tirx.PrimFunc:
    inputs = info.placeholders()
    x = inputs[info.param_index(info.x)]
    w = inputs[info.param_index(info.weight)]
    s = inputs[info.param_index(info.scale)]
    k, group = info.k, info.group_size
    groups = k // group
    tokens = x.shape[-2]
    padded = (tokens + block_m - 1) // block_m * block_m

    amax, plane = q8_planes(x, tokens, padded, k, group)

    stored = 2 if planes == 2 or low_batch > 0 else 1  # planes computed per call
    xq = te.compute((stored, padded, k), plane, name="x_q")
    j = te.reduce_axis((0, group), "j")
    xsum = te.compute((stored, padded, groups), lambda p, t, g: te.sum(xq[p, t, g * group + j].astype("int32"), axis=j), name="x_sum")
    ins = [xq, q8_fold_terms(amax, xsum), w, s]

    def body(i, o):
        many = _kernel(info, padded, block_m, row_vecs, planes, stored, isa, prefetch, *i, o[0])
        if planes == 2 or low_batch == 0:
            return many
        # few tokens (short prompts, the last chunk of a long one): two planes, the GEMV's precision
        return tirx.IfThenElse(tokens <= low_batch, _kernel(info, padded, block_m, row_vecs, 2, stored, isa, prefetch, *i, o[0]), many)

    c = te.extern(
        (padded * info.n,), ins, body, name="gemm_vnni", dtype="float32",
        in_buffers=[tirx.decl_buffer(t.shape, t.dtype, name=f"{t.op.name}_buf") for t in ins],
        out_buffers=[tirx.decl_buffer((padded * info.n,), "float32", name="c_buf")],
    )
    mm = te.compute((*x.shape[:-1], info.n), lambda b, m, n: c[m * info.n + n], name="matmul")
    return rebuild(info, inputs, mm)


def _kernel(info, padded, block_m, row_vecs, planes, stored, isa, prefetch, xq, terms, weight, scale, out):
    n_total, k, group = info.n, info.k, info.group_size
    groups = k // group
    quads = k // 4
    quads_per_group = group // 4
    words = k // 8
    rows = LANES * row_vecs
    tasks = n_total // rows
    acc_n = block_m * row_vecs

    def decode_quad(wpk, wf, task, q):
        """Bytes of quad q (k = 4q .. 4q+3) of the task's rows: one u32 per row, 16 rows a vector."""
        for v in range(row_vecs):
            n0 = task * rows + v * LANES
            word = wf[T.ramp(n0 * words + q // 2, words, LANES)]  # 16 rows' word q // 2 (a gather)
            half = word >> T.broadcast(T.Cast("uint32", (q % 2) * 16), LANES)
            nib = T.broadcast(T.uint32(15), LANES)
            packed = (half & nib) | ((half >> T.broadcast(T.uint32(4), LANES)) & nib) << T.broadcast(T.uint32(8), LANES)
            packed = packed | ((half >> T.broadcast(T.uint32(8), LANES)) & nib) << T.broadcast(T.uint32(16), LANES)
            packed = packed | ((half >> T.broadcast(T.uint32(12), LANES)) & nib) << T.broadcast(T.uint32(24), LANES)
            T.buffer_store(wpk, packed, [T.ramp((q * row_vecs + v) * LANES, 1, LANES)])

    def scales_of(sc, sf, task, g):
        for v in range(row_vecs):
            n0 = task * rows + v * LANES
            T.buffer_store(sc, T.Cast("float32x16", sf[T.ramp(n0 * groups + g, groups, LANES)]), [T.ramp((g * row_vecs + v) * LANES, 1, LANES)])

    def zero(acc, dtype, n):
        for a in range(n):
            T.buffer_store(acc, T.broadcast(tirx.const(0, dtype), LANES), [T.ramp(a * LANES, 1, LANES)])

    # AVX2: a group's VPMADDUBSW pair sums add up in i16 (exact while a group has at most 8 quads:
    # 8 x 2 x 15 x 127 < 2^15), widened by one VPMADDWD per group instead of one per quad
    i16 = isa == "avx2" and quads_per_group * 2 * 15 * 127 < 2**15
    ilanes, idtype = (2 * LANES, "int16") if i16 else (LANES, "int32")

    def zero_planes(iaccs):
        for p in range(planes):
            for a in range(acc_n):
                T.buffer_store(iaccs[p], T.broadcast(tirx.const(0, idtype), ilanes), [T.ramp(a * ilanes, 1, ilanes)])

    def quad_step(iaccs, wpk, xq32, mb, q):
        wv = [T.reinterpret("int8x64", wpk[T.ramp((q * row_vecs + v) * LANES, 1, LANES)]) for v in range(row_vecs)]
        for p in range(planes):
            for m in range(block_m):
                xb = T.reinterpret("int8x64", T.broadcast(xq32[(p * padded + mb * block_m + m) * quads + q], LANES))
                for v in range(row_vecs):
                    lanes = T.ramp((m * row_vecs + v) * ilanes, 1, ilanes)
                    acc = iaccs[p][lanes]
                    T.buffer_store(iaccs[p], acc + avx2_madd16(wv[v], xb) if i16 else int8_dot(isa, acc, wv[v], xb), [lanes])

    def group_sum(iacc, m, v):
        """the group's int32 dot products of token block row m, row vector v (16 lanes)"""
        if i16:
            return avx2_widen(iacc[T.ramp((m * row_vecs + v) * ilanes, 1, ilanes)])
        return iacc[T.ramp((m * row_vecs + v) * LANES, 1, LANES)]

    def fold(facc, iaccs, sc, mb, g):
        for m in range(block_m):
            t = mb * block_m + m
            for v in range(row_vecs):
                lanes = T.ramp((m * row_vecs + v) * LANES, 1, LANES)
                dots = None
                for p in range(planes):
                    unit, offset = (T.broadcast(terms[p, t, g, e], LANES) for e in (0, 1))
                    term = T.Cast("float32x16", group_sum(iaccs[p], m, v)) * unit - offset
                    dots = term if dots is None else dots + term
                T.buffer_store(facc, facc[lanes] + dots * sc[T.ramp((g * row_vecs + v) * LANES, 1, LANES)], [lanes])

    def store(facc, task, mb):
        for m in range(block_m):
            for v in range(row_vecs):
                T.buffer_store(out, facc[T.ramp((m * row_vecs + v) * LANES, 1, LANES)],
                               [T.ramp((mb * block_m + m) * n_total + task * rows + v * LANES, 1, LANES)])

    scale_dtype = str(scale.dtype)

    @T.prim_func(private=True, check_well_formed=False)
    def body():
        xq32 = T.decl_buffer((stored * padded * quads,), "int32", data=xq.data)
        wf = T.decl_buffer((n_total * words,), "uint32", data=weight.data)
        sf = T.decl_buffer((n_total * groups,), scale_dtype, data=scale.data)
        for task in T.parallel(tasks):
            wpk = T.alloc_buffer((quads * rows,), "uint32")
            sc = T.alloc_buffer((groups * rows,), "float32")
            for q in range(quads):
                decode_quad(wpk, wf, task, q)
            for g in range(groups):
                scales_of(sc, sf, task, g)
            for mb in range(padded // block_m):
                facc = T.alloc_buffer((acc_n * LANES,), "float32")  # stack arrays (< STACK_BYTES each)
                iacc0 = T.alloc_buffer((acc_n * ilanes,), idtype)
                iacc1 = T.alloc_buffer((acc_n * ilanes,), idtype)  # plane 1 (unused with one plane)
                zero(facc, "float32", acc_n)
                for g in range(groups):
                    zero_planes((iacc0, iacc1))
                    for qq in range(quads_per_group):
                        if prefetch > 0:
                            if mb == 0:  # LLVM unswitches this: the other blocks' loop has no prefetch
                                prefetch_next_task(wf, (task + 1) * rows * words, rows * words, g * quads_per_group + qq, quads, 4)
                        quad_step((iacc0, iacc1), wpk, xq32, mb, g * quads_per_group + qq)
                    fold(facc, (iacc0, iacc1), sc, mb, g)
                store(facc, task, mb)

    return body.body

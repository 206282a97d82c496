"""Decode GEMV on GPUs, C[1, 1, n] = sum_k A[1, 1, k] * W'[n, k], the dequantize fused as a prologue.

Covers `fused_dequantizeN_NT_matmulM[_cast][_add]` (MLC q4f16_1 / q4f32_1) and the unquantized
f16/f32 `NT_matmul` (q0f16, q0f32), one token only: every spatial dim but n is 1 and static.
A block of (threads, rows) lanes computes `rows` output rows, the `threads` lanes of a row split
K; WebGPU with subgroups runs one row of `subgroup` lanes per workgroup. See docs/schedules.md.
Knobs: threads (lanes per row), rows (rows per block), vec (32-bit words of W per lane and step),
unroll (max auto-unroll of the K loop), subgroup (WebGPU with subgroups only: lanes per row
relied on; 0 = the target's thread_warp_size), bits_to_float (each 4-bit weight made a float by
its bits, `unpack_by_bits`, instead of an integer-to-float conversion). Per-target defaults:
`GEMVDequant.for_target`.
"""

from __future__ import annotations

import dataclasses

import numpy as np
from tvm import s_tir, tirx
from tvm.target import Target

from ..analysis import NTMatmul, const, inline_nt_matmul, match_nt_matmul
from ..base import GPUScheduleRule, max_threads, max_vector_lanes, warp_size, webgpu_subgroups
from ..tir_rewrite import UnsupportedIR, map_func_exprs

# Per-target defaults: (threads, rows, vec, unroll).
DEFAULTS = {
    # CUDA: the integer-to-float conversion of each nibble (I2F, 16 per clock per SM on an H100)
    # bounded the q4 GEMVs under half of HBM bandwidth (benchmarks/results/h100)
    "cuda": dict(threads=32, rows=4, vec=4, unroll=4, bits_to_float=1),
    "metal": dict(threads=32, rows=4, vec=4, unroll=4),
    # no subgroups by default: the row reduction goes through shared memory, so fewer lanes per
    # row (fewer barrier rounds) and more rows per workgroup (with subgroups: `subgroup` lanes,
    # one row)
    "webgpu": dict(threads=16, rows=8, vec=4, unroll=4),
}
# candidate `subgroup` values (WebGPU adapters have 4 to 128 lanes)
SUBGROUP_SIZES = (4, 8, 16, 32)


@dataclasses.dataclass
class GEMVDequant(GPUScheduleRule):
    threads: int = 32
    rows: int = 4
    vec: int = 4
    unroll: int = 4
    subgroup: int = 0
    bits_to_float: int = 0  # 1: on (knobs are integers: tuning records store them so)

    @classmethod
    def for_target(cls, kind: str) -> "GEMVDequant":
        return cls(**DEFAULTS[kind])

    # ---- knob protocol -------------------------------------------------------------------
    def knob_space(self, func: tirx.PrimFunc, target: Target) -> dict[str, list]:
        info = self._match(func, target)
        if info is None:
            return {}
        limit = max_threads(target)
        vecs = [v for v in (1, 2, 4, 8) if info.words_per_row % v == 0]
        if webgpu_subgroups(target):
            words, warp = info.words_per_row, warp_size(target)
            lanes = [s for s in SUBGROUP_SIZES if s <= warp and words % s == 0]
            return {"subgroup": lanes, "vec": vecs, "unroll": [1, 2, 4, 8, 16]}
        space = {
            "threads": [t for t in (4, 8, 16, 32, 64, 128) if info.words_per_row % t == 0 and t <= limit],
            "rows": [r for r in (1, 2, 4, 8, 16) if info.n % r == 0],
            "vec": vecs,
            "unroll": [1, 2, 4, 8, 16],
        }
        if target.kind.name == "cuda":  # where the bit patterns' codegen was run (Metal, WGSL: not yet)
            space["bits_to_float"] = [0, 1]
        # only combinations with threads * vec dividing the row's words and threads * rows <= the
        # target's thread limit are taken as given (others are shrunk): filter with `valid`
        return space

    def valid(self, func: tirx.PrimFunc, target: Target) -> bool:
        """Whether this instance's knobs schedule `func` exactly as given (no clamping)."""
        info = self._match(func, target)
        if info is None:
            return False
        if webgpu_subgroups(target):
            lanes = self.subgroup or warp_size(target)
            return self._fit(info, target) == (lanes, 1, self.vec)
        return self._fit(info, target) == (self.threads, self.rows, self.vec)

    # ---- rule ----------------------------------------------------------------------------
    def apply(self, func: tirx.PrimFunc, target: Target, tunable: bool) -> s_tir.Schedule | None:
        del tunable
        info = self._match(func, target)
        if info is None:
            return None
        threads, rows, vec = self._fit(info, target)
        try:
            sch = _schedule(info, threads, rows, vec, self.unroll, target)
        except (s_tir.ScheduleError, LookupError):
            return None
        if sch is not None and self.bits_to_float:  # after scheduling: the analysis matches the cast
            unpacked = unpack_by_bits(sch.mod["main"])
            if unpacked is not None:
                sch = s_tir.Schedule(unpacked)
        return sch

    def _match(self, func, target) -> NTMatmul | None:
        if not isinstance(func, tirx.PrimFunc) or not self.is_target_available(target):
            return None
        info = match_nt_matmul(func)
        if info is None or info.rows != 1:
            return None  # one token only: batches and symbolic lengths are LowBatchGEMV / Matmul
        if str(info.x.dtype) not in ("float16", "float32") or info.words_per_row is None:
            return None
        return info

    def _fit(self, info: NTMatmul, target: Target) -> tuple[int, int, int]:
        """The knobs, shrunk where the kernel's shape or the target does not allow them."""
        if webgpu_subgroups(target):
            return self._fit_subgroup(info, target)
        limit = max_threads(target)
        vec = self.vec
        while vec > 1 and info.words_per_row % vec:
            vec //= 2
        threads = self.threads
        while threads > 1 and (info.words_per_row % (threads * vec) or threads > limit):
            threads //= 2
        rows = self.rows
        while rows > 1 and (info.n % rows or threads * rows > limit):
            rows //= 2
        return threads, rows, vec

    def _fit_subgroup(self, info: NTMatmul, target: Target) -> tuple[int, int, int]:
        """(lanes, 1, vec) for a WebGPU target with subgroups: one row per workgroup, at most
        thread_warp_size lanes (TVM takes wider reductions through shared memory), a power of
        two; narrower loads first, so a row keeps its whole subgroup where the row allows."""
        warp = warp_size(target)
        lanes = 1
        while lanes * 2 <= min(self.subgroup or warp, warp, max_threads(target)):
            lanes *= 2
        vec = self.vec
        while vec > 1 and info.words_per_row % (lanes * vec):
            vec //= 2
        while lanes > 1 and info.words_per_row % (lanes * vec):
            lanes //= 2
        return lanes, 1, vec


# float dtype -> (bits of the float whose value is 2**mantissa_bits, that value, the unsigned type of
# its width): with an integer 0 <= q < 2**mantissa_bits OR-ed into its low bits, the float's value
# is exactly that value + q
_MAGIC = {"float16": (0x6400, 1024.0, "uint16"), "float32": (0x4B000000, 8388608.0, "uint32")}


def unpack_by_bits(func: tirx.PrimFunc) -> tirx.PrimFunc | None:
    """`func` with every float(q) of a 4-bit field (`T.Cast(f16|f32, x & 15)`, the dequantize's
    unpack) computed from bits: reinterpret(MAGIC | q) - MAGIC's value, an OR and a subtract in
    place of the integer-to-float conversion; an integer constant subtracted next (the q4 zero
    point) is folded in. The same values exactly. None if `func` has no such cast."""
    made = []

    def rewrite(e):
        if isinstance(e, tirx.Cast) and str(e.ty.dtype) in _MAGIC and _is_nibble(e.value):
            bits, value, word = _MAGIC[str(e.ty.dtype)]
            field = e.value if str(e.value.ty.dtype) == "uint32" else tirx.Cast("uint32", e.value)
            pattern = tirx.bitwise_or(field, tirx.const(bits, "uint32"))
            if word != "uint32":
                pattern = tirx.Cast(word, pattern)
            float_bits = tirx.reinterpret(str(e.ty.dtype), pattern)
            made.append(float_bits)
            return tirx.Sub(float_bits, _float_const(str(e.ty.dtype), value))
        if (isinstance(e, tirx.Sub) and isinstance(e.b, tirx.FloatImm) and isinstance(e.a, tirx.Sub)
                and any(e.a.a.same_as(m) for m in made)
                and float(e.b.value).is_integer() and abs(float(e.b.value)) <= 256):
            return tirx.Sub(e.a.a, _float_const(str(e.ty.dtype), _value(e.a.b) + float(e.b.value)))
        return None

    try:
        out = map_func_exprs(func, rewrite)
    except UnsupportedIR:
        return None
    return out if made else None


def _float_const(dtype: str, value: float):
    """A float constant; float16 ones by their bits (CUDA's __float2half_rn of a literal is an inline
    conversion per use that the compiler does not fold)."""
    if dtype != "float16":
        return tirx.FloatImm(dtype, value)
    return tirx.reinterpret("float16", tirx.const(int(np.float16(value).view(np.uint16)), "uint16"))


def _value(e) -> float:
    """The value of a constant `_float_const` made."""
    if isinstance(e, tirx.FloatImm):
        return float(e.value)
    return float(np.uint16(int(e.args[0].value)).view(np.float16))


def _is_nibble(e) -> bool:
    """`x & 15` of an unsigned or signed 32-bit integer."""
    if str(e.ty.dtype) not in ("uint32", "int32") or not isinstance(e, tirx.BitwiseAnd):
        return False
    return any(isinstance(a, tirx.IntImm) and int(a.value) == 15 for a in (e.a, e.b))


def _schedule(info: NTMatmul, threads: int, rows: int, vec: int, unroll: int, target: Target) -> s_tir.Schedule:
    inlined = inline_nt_matmul(info)
    if inlined is None:
        return None
    sch, block = inlined.sch, inlined.block
    epw = info.elems_per_word
    *batch_loops, n_loop, k_loop = sch.get_loops(block)
    bx, ty = sch.split(n_loop, factors=[None, rows])
    ko, tx, kv, ke = sch.split(k_loop, factors=[None, threads, vec, epw])
    sch.reorder(bx, ty, tx, *batch_loops, ko, kv, ke)
    # partial sums per lane (rf), then the cross-lane reduction (the original block)
    rf = sch.rfactor(tx, factor_axis=len(info.rows_shape) + 1)
    # rfactor leaves the original loops to the write-back block: the rf block has fresh ones
    bx, ty, tx, *_, ko, kv, ke = sch.get_loops(rf)
    sch.bind(bx, "blockIdx.x")
    sch.bind(ty, "threadIdx.y")
    sch.bind(tx, "threadIdx.x")
    sch.set_scope(rf, 0, "local")
    sch.reverse_compute_at(block, ty, preserve_unit_loops=True)
    # its loops follow its iters: the lanes (reduced) first, then unit spatial loops; a
    # cross-thread reduction wants the reduced loop innermost
    red_tx, *units = sch.get_loops(block)[2:]
    if units:
        sch.reorder(*units, red_tx)
    sch.bind(red_tx, "threadIdx.x")
    if inlined.epilogue is not None:
        sch.set_scope(block, 0, "local")
        sch.reverse_compute_at(inlined.epilogue, ty, preserve_unit_loops=True)

    # registers: this step's words of W, its scales and activations, vector-loaded
    param_names = {p.name for p in sch.mod["main"].params}
    for name, dtype in _param_reads(sch, rf, param_names):
        local = sch.cache_read(rf, _read_index(sch, rf, name), "local")
        sch.compute_at(local, ko, preserve_unit_loops=True)
        _vector_load(sch, local, max_vector_lanes(target, dtype))

    sch.unroll(kv)
    sch.unroll(ke)
    sch.annotate(ko, "pragma_auto_unroll_max_step", unroll)
    sch.annotate(ko, "pragma_unroll_explicit", 1)
    sch.decompose_reduction(rf, ko)
    return sch


def _param_reads(sch: s_tir.Schedule, block, param_names: set) -> list[tuple[str, str]]:
    return [(r.source.name, str(r.source.dtype)) for r in sch.get(block).reads if r.source.name in param_names]


def _read_index(sch: s_tir.Schedule, block, name: str) -> int:
    for index, region in enumerate(sch.get(block).reads):
        if region.source.name == name:
            return index
    raise LookupError(f"block reads no buffer {name}")


def _vector_load(sch: s_tir.Schedule, block, lanes: int) -> None:
    """Fuse the copy loops compute_at made for a register cache (one per buffer dim, innermost)
    and split them into `lanes`-wide vector loads (fewer where the extent does not divide)."""
    depth = len(sch.get(block).iter_vars)
    copy = sch.get_loops(block)[-depth:]
    fused = sch.fuse(*copy) if len(copy) > 1 else copy[0]
    extent = const(sch.get(fused).extent)
    if extent is None:
        return
    lanes = min(lanes, extent)
    while extent % lanes:
        lanes //= 2
    if lanes > 1:
        outer, inner = sch.split(fused, factors=[None, lanes])
        sch.vectorize(inner)
        sch.unroll(outer)
    else:
        sch.unroll(fused)

"""Decode GEMV on GPUs, C[1, 1, n] = sum_k A[1, 1, k] * W'[n, k], the dequantize fused as a prologue.

Covers `fused_dequantizeN_NT_matmulM[_cast][_add]` (MLC q4f16_1 / q4f32_1) and the unquantized
f16/f32 `NT_matmul` (q0f16, q0f32), one token only: every spatial dim but n is 1 and static.
A block of (threads, rows) lanes computes `rows` output rows, the `threads` lanes of a row split
K; WebGPU with subgroups runs one row of `subgroup` lanes per workgroup. See docs/schedules.md.
Knobs: threads (lanes per row), rows (rows per block), vec (32-bit words of W per lane and step),
unroll (max auto-unroll of the K loop), subgroup (WebGPU with subgroups only: lanes per row
relied on; 0 = the target's thread_warp_size), bits_to_float (each 4-bit weight made a float by
its bits, `unpack_by_bits`, instead of an integer-to-float conversion), half2 (CUDA, q4 weights
with f16 activations: each 32-bit word of W is one call of the device function DOT8, which makes
the 8 weights as 4 half2 by their bits, exactly the dequantize's values, and sums the word's 8
products in half2 before the f32 accumulator: about half the instructions per weight; the only
difference from the reference is that 4-product f16 sum per lane). Per-target defaults:
`GEMVDequant.for_target`.
"""

from __future__ import annotations

import dataclasses

import numpy as np
from tvm import s_tir, tirx
from tvm.target import Target

from ..analysis import NTMatmul, const, inline_nt_matmul, match_nt_matmul
from ..base import GPUScheduleRule, max_threads, max_vector_lanes, warp_size, webgpu_subgroups
from ..tir_rewrite import Load, UnsupportedIR, collect, map_func_exprs, substitute

# Per-target defaults: (threads, rows, vec, unroll).
DEFAULTS = {
    # CUDA: the integer-to-float conversion of each nibble (I2F, 16 per clock per SM on an H100)
    # bounded the q4 GEMVs under half of HBM bandwidth (benchmarks/results/h100). half2 (about 4.4
    # instructions per weight, against 8.5) is not the default until a GPU has timed it: the
    # bundle's tune step races the two (docs/schedules.md)
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
    half2: int = 0  # 1: on (CUDA, q4 weights, f16 activations; bits_to_float is then moot)

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
            if _half2_fits(info):
                space["half2"] = [0, 1]
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
        half2 = bool(self.half2) and target.kind.name == "cuda" and _half2_fits(info)
        if half2:
            install_cuda_postproc()  # whoever compiles the schedule gets DOT8's definition
        try:
            sch = _schedule(info, threads, rows, vec, self.unroll, target, half2)
        except (s_tir.ScheduleError, LookupError, UnsupportedIR):
            return None
        if sch is not None and self.bits_to_float and not half2:  # after scheduling: the analysis matches the cast
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


def _schedule(info: NTMatmul, threads: int, rows: int, vec: int, unroll: int, target: Target, half2: bool = False) -> s_tir.Schedule:
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
    if half2:
        word = sch.blockize(ke)  # one word of W: its 8 weights
        names = {"x": info.x.name + "_local", "weight": info.weight.name + "_local", "scale": info.scale.name + "_local"}
        return s_tir.Schedule(_dot8_calls(sch.mod["main"], sch.get(word).name_hint, names))
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


# ---- half2: one device-function call per word of W ---------------------------------------------------
DOT8 = "mlcpipe_q4_dot8_f16"
# CUDA C++ of DOT8 (host too: tests run it on the CPU), prepended to every CUDA source that calls it
# (pipeline/backends/cuda.py):
# acc + sum_e a[e] * w_e, w_e = (nibble e of w - 7) * s in f16 as the dequantize makes it (the
# nibble OR-ed into the bits of half 1024, then 1031 subtracted: exact; times s: one rounding),
# lanes paired (e, e + 4) so that one AND-OR makes two weights; the 8 products summed in half2.
DOT8_SOURCE = r"""
__host__ __device__ __forceinline__ unsigned int mlcpipe_and_or(unsigned int x, unsigned int mask, unsigned int bits) {
#ifdef __CUDA_ARCH__
  unsigned int out;  // one LOP3 (nvcc makes two of the C expression)
  asm("lop3.b32 %0, %1, %2, %3, 0xEA;" : "=r"(out) : "r"(x), "r"(mask), "r"(bits));
  return out;
#else
  return (x & mask) | bits;
#endif
}

__host__ __device__ __forceinline__ half2 mlcpipe_hfma2(half2 a, half2 b, half2 c) {
#ifdef __CUDA_ARCH__
  return __hfma2(a, b, c);
#else  // one rounding, as HFMA2 (the products of halves and their sums are exact in double)
  float2 x = __half22float2(a), y = __half22float2(b), z = __half22float2(c);
  return __halves2half2(__double2half((double)x.x * y.x + z.x), __double2half((double)x.y * y.y + z.y));
#endif
}

__host__ __device__ __forceinline__ float mlcpipe_q4_dot8_f16(float acc, unsigned int w, half s, const half* a) {
  const unsigned int magic = 0x64006400u;  // half2(1024, 1024)
  const half2 bias = __halves2half2(__ushort_as_half((unsigned short)0x6407), __ushort_as_half((unsigned short)0x6407));
  const half2 s2 = __half2half2(s);
  const half2 a01 = *reinterpret_cast<const half2*>(a);
  const half2 a23 = *reinterpret_cast<const half2*>(a + 2);
  const half2 a45 = *reinterpret_cast<const half2*>(a + 4);
  const half2 a67 = *reinterpret_cast<const half2*>(a + 6);
  unsigned int q04 = mlcpipe_and_or(w, 0x000F000Fu, magic);
  unsigned int q15 = mlcpipe_and_or(w >> 4, 0x000F000Fu, magic);
  unsigned int q26 = mlcpipe_and_or(w >> 8, 0x000F000Fu, magic);
  unsigned int q37 = mlcpipe_and_or(w >> 12, 0x000F000Fu, magic);
  half2 w04 = __hmul2(__hsub2(*reinterpret_cast<half2*>(&q04), bias), s2);
  half2 w15 = __hmul2(__hsub2(*reinterpret_cast<half2*>(&q15), bias), s2);
  half2 w26 = __hmul2(__hsub2(*reinterpret_cast<half2*>(&q26), bias), s2);
  half2 w37 = __hmul2(__hsub2(*reinterpret_cast<half2*>(&q37), bias), s2);
  half2 sum = __hmul2(__lows2half2(a01, a45), w04);
  sum = mlcpipe_hfma2(__highs2half2(a01, a45), w15, sum);
  sum = mlcpipe_hfma2(__lows2half2(a23, a67), w26, sum);
  sum = mlcpipe_hfma2(__highs2half2(a23, a67), w37, sum);
  float2 f = __half22float2(sum);
  return acc + (f.x + f.y);
}
"""


POSTPROC = "tvm_callback_cuda_postproc"  # TVM passes each generated CUDA source through it before compiling


def with_device_functions(code: str) -> str:
    """`code` with DOT8's definition put before its first kernel when it calls DOT8 and lacks it."""
    if DOT8 + "(" not in code or f" {DOT8}(float" in code:
        return code
    at = code.find('extern "C" __global__')
    at = len(code) if at < 0 else at
    return code[:at] + DOT8_SOURCE.lstrip("\n") + "\n" + code[at:]


def install_cuda_postproc() -> None:
    """Register `with_device_functions` as TVM's CUDA source post-processor (idempotent)."""
    import tvm_ffi

    tvm_ffi.register_global_func(POSTPROC, lambda code, *_unused: with_device_functions(str(code)), override=True)


def _half2_fits(info: NTMatmul) -> bool:
    """q4 words of 8 with DOT8's constants, f16 activations and scales, groups of whole words."""
    d = info.dequantize
    return (d is not None and (d.bits, d.elems_per_word, d.mask, d.zero_point) == (4, 8, 15, 7) and d.storage_dtype == "uint32"
            and d.model_dtype == "float16" and str(info.x.dtype) == "float16" and info.scale is not None
            and d.group_size % 8 == 0)


def _dot8_calls(func: tirx.PrimFunc, word_block: str, names: dict[str, str]) -> tirx.PrimFunc:
    """`func` with the body of every block named `word_block` (a blockized word of W: `for e in
    range(8)` over one update block) replaced by acc = DOT8(acc, W_local[w], S_local[g], &x_local[8 w])."""
    def stmt(node):
        if isinstance(node, s_tir.SBlockRealize):
            block = node.block
            if block.name_hint == word_block:
                block = s_tir.SBlock(block.iter_vars, block.reads, block.writes, block.name_hint, _dot8_store(block.body, names),
                                     None, block.alloc_buffers, block.match_buffers, block.annotations)
            else:
                init = None if block.init is None else stmt(block.init)
                block = s_tir.SBlock(block.iter_vars, block.reads, block.writes, block.name_hint, stmt(block.body), init,
                                     block.alloc_buffers, block.match_buffers, block.annotations)
            return s_tir.SBlockRealize(node.iter_values, node.predicate, block)
        if isinstance(node, tirx.For):
            return tirx.For(node.loop_var, node.min, node.extent, node.kind, stmt(node.body), node.thread_binding, node.annotations)
        if isinstance(node, tirx.SeqStmt):
            return tirx.SeqStmt([stmt(x) for x in node.seq])
        if isinstance(node, (tirx.BufferStore, tirx.IfThenElse, tirx.Evaluate)):
            return node
        raise UnsupportedIR(type(node).__name__)

    return func.with_body(stmt(func.body))


def _dot8_store(body, names: dict[str, str]):
    """The DOT8 store for one blockized word: `for e in range(8): update block` -> one store."""
    if not (isinstance(body, tirx.For) and const(body.extent) == 8 and isinstance(body.body, s_tir.SBlockRealize)):
        raise UnsupportedIR("a word of W is not one loop of 8 over an update block")
    realize = body.body
    update = realize.block.body
    if not isinstance(update, tirx.BufferStore):
        raise UnsupportedIR(type(update).__name__)
    # the word's first weight: the inner block's vars as the realize binds them, e = 0
    first = {var.var: substitute(value, {body.loop_var: tirx.const(0, str(body.loop_var.ty.dtype))})
             for var, value in zip(realize.block.iter_vars, realize.iter_values)}
    loads = {}
    for load in collect(update.value, Load):
        for role, name in names.items():
            if load.source.name == name:
                loads[role] = tirx.BufferLoad(load.source, [substitute(i, first) for i in load.indices])
    acc = [load for load in collect(update.value, Load) if load.source.same_as(update.buffer)]
    if set(loads) != set(names) or len(acc) != 1:
        raise UnsupportedIR("the update block does not read the activation, weight and scale caches and its accumulator")
    indices = [substitute(i, first) for i in update.indices]
    call = tirx.call_pure_extern("float32", DOT8, tirx.BufferLoad(update.buffer, indices), loads["weight"], loads["scale"],
                                 tirx.address_of(loads["x"]))
    return tirx.BufferStore(update.buffer, call, indices)

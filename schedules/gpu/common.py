"""Helpers shared by our GPU rules: target facts and the NT-matmul structure analysis."""

from __future__ import annotations

import dataclasses

from tvm import s_tir, tirx
from tvm.target import Target

from ..analysis import inline_around_reduction

GPU_KINDS = ("cuda", "metal", "webgpu")


def kind_of(target: Target) -> str:
    return target.kind.name


def is_gpu(target: Target) -> bool:
    return kind_of(target) in GPU_KINDS


def webgpu_subgroups(target: Target) -> bool:
    """A webgpu target with `supports_subgroups` (TVM then sets thread_warp_size 32)."""
    subgroups = target.attrs.get("supports_subgroups", False)
    return kind_of(target) == "webgpu" and bool(subgroups)


def max_threads(target: Target) -> int:
    """Threads per block we allow: the smaller of the target's max_threads_per_block and
    max_num_threads (Metal's preset says 1024 and 256; WebGPU guarantees 256)."""
    values = [int(target.attrs[k]) for k in ("max_threads_per_block", "max_num_threads") if target.attrs.get(k) is not None]
    return min(values) if values else 256


def max_vector_lanes(target: Target, dtype) -> int:
    """Lanes of the widest vector load of `dtype`: 16 bytes, and WGSL / MSL vectors have at most
    4 lanes (TVM's WebGPU codegen rejects more; half8 does not exist in MSL)."""
    lanes = max(1, 128 // dtype_bits(dtype))
    return lanes if kind_of(target) == "cuda" else min(lanes, 4)


def const(expr) -> int | None:
    return int(expr.value) if isinstance(expr, tirx.IntImm) else None


def dtype_bits(dtype) -> int:
    return tvm_dtype(dtype).bits * tvm_dtype(dtype).lanes


def tvm_dtype(dtype):
    import tvm

    return tvm.runtime.DataType(str(dtype))


@dataclasses.dataclass
class NTMatmul:
    """C[*batch, n] = sum_k A[*batch, k] * W'[n, k], W' possibly decoded by inlined producers.

    Found on a fresh schedule: producers are inlined, trailing elementwise consumers merged into
    one epilogue block."""

    sch: s_tir.Schedule
    block: s_tir.schedule.SBlockRV  # the reduction
    epilogue: s_tir.schedule.SBlockRV | None
    batch: list  # extents of the spatial iters before n (int or PrimExpr)
    n: int
    k: int
    weight: tirx.Buffer  # the stored weight: uint32 words (quantized) or the float matrix
    vector: tirx.Buffer  # the activation read along k
    words_per_row: int  # 32-bit words of `weight` per output row
    elems_per_word: int  # k elements per 32-bit word (8 for int4, 2 for f16, 1 for f32)


def analyze_nt_matmul(func: tirx.PrimFunc) -> NTMatmul | None:
    """Match an NT matmul (optionally with a dequantize prologue and elementwise epilogue)."""
    if not isinstance(func, tirx.PrimFunc):
        return None
    sch = s_tir.Schedule(func)
    found = inline_around_reduction(sch)
    if found is None:
        return None
    red, epilogue = found
    stmt = sch.get(red)
    kinds = [iv.iter_type for iv in stmt.iter_vars]
    if kinds.count(tirx.IterVar.CommReduce) != 1 or kinds[-1] != tirx.IterVar.CommReduce:
        return None
    if len(sch.get_loops(red)) != len(stmt.iter_vars) or len(stmt.iter_vars) < 2:
        return None
    if not _is_sum_of_products(stmt):
        return None
    extents = [iv.dom.extent for iv in stmt.iter_vars]
    n, k = const(extents[-2]), const(extents[-1])
    if n is None or k is None:
        return None
    batch = [const(e) if const(e) is not None else e for e in extents[:-2]]
    n_var, k_var = stmt.iter_vars[-2].var, stmt.iter_vars[-1].var

    # activation: read with k as its last index and no n; weight: the biggest [n, *] parameter
    vector = None
    for region in stmt.reads:
        idx = [r.min for r in region.region]
        used = set().union(*(_vars(i) for i in idx)) if idx else set()
        if idx and _is_var(idx[-1], k_var) and n_var not in used:
            vector = region.source
    if vector is None:
        return None
    weight, best = None, 0
    read_buffers = {region.source.name: region.source for region in stmt.reads}
    for param in func.params:
        shape = list(getattr(param, "shape", None) or [])
        if len(shape) != 2 or const(shape[0]) != n or const(shape[1]) is None or param.name not in read_buffers:
            continue
        size = const(shape[1]) * dtype_bits(param.dtype)
        if size > best:
            weight, best = read_buffers[param.name], size
    if weight is None:
        return None
    row_bits = const(weight.shape[1]) * dtype_bits(weight.dtype)
    if row_bits % 32 or (k * 32) % row_bits:
        return None
    words = row_bits // 32
    if k % words:
        return None
    return NTMatmul(sch, red, epilogue, batch, n, k, weight, vector, words, k // words)


def _vars(expr) -> set:
    return set(tirx.analysis.undefined_vars(expr))


def _is_var(expr, var) -> bool:
    return isinstance(expr, tirx.Var) and expr.same_as(var)


def _is_sum_of_products(stmt) -> bool:
    """The update is `C[...] = C[...] + expr` (a sum reduction)."""
    body = stmt.body
    return isinstance(body, tirx.BufferStore) and isinstance(body.value, tirx.Add)

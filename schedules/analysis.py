"""What a kernel is, for rules of every target family (as TVM dlight's `analysis`): block helpers
and the one NT-matmul matcher.

`match_nt_matmul(func)` recognises `[dequantize ->] NT_matmul [-> epilogue...]` PrimFuncs, the
dequantize only when it matches a registered quantization's `dequantize_pattern`
(`pipeline.quantization`); anything else returns None and the rule declines. CPU rules rebuild a
matched kernel (llvm/microkernels.py, `rebuild`); GEMVDequant (GPU) and MatmulNT (CPU) schedule
its loop nest with the producers inlined (`inline_nt_matmul`). Details: docs/schedules.md.
"""

from __future__ import annotations

import dataclasses

import tvm
from tvm import s_tir, te, tirx
from tvm.ir.expr import TensorLoad
from tvm.s_tir import dlight as dl

from mlcpipe.model.sampler_tir import sampler_info  # noqa: F401  (the sampler rules recognise their kernels by it)
from mlcpipe.quantization import QUANTIZATIONS, DequantizePattern


# ---- blocks --------------------------------------------------------------------------------
def root_blocks(func) -> tuple[s_tir.Schedule, list] | None:
    """(schedule, root-level blocks) of a PrimFunc, or None if it has no single root block (not
    a kernel the rules understand)."""
    if not isinstance(func, tirx.PrimFunc):
        return None
    try:
        sch = s_tir.Schedule(func)
        return sch, sch.get_child_blocks(dl.analysis.get_root_block(sch))
    except Exception:  # noqa: BLE001 - not a schedulable function
        return None


def is_reduction_block(sch: s_tir.Schedule, block) -> bool:
    return any(iv.iter_type == tirx.IterVar.CommReduce for iv in sch.get(block).iter_vars)


def blocks_after(sch: s_tir.Schedule, block) -> list:
    """The root-level blocks that follow `block` (the epilogue of a rebuilt kernel)."""
    blocks = sch.get_child_blocks(dl.analysis.get_root_block(sch))
    names = [sch.get(b).name_hint for b in blocks]
    return blocks[names.index(sch.get(block).name_hint) + 1 :]


def inline_around_reduction(sch: s_tir.Schedule):
    """For a function of producers -> one reduction -> consumers: inline every producer (e.g. the
    dequantize) into the reduction and every consumer but the first into the first; returns
    (reduction block, first consumer or None), or None when the function has another shape or
    the inlining is not possible."""
    try:
        blocks = sch.get_child_blocks(dl.analysis.get_root_block(sch))
    except Exception:  # noqa: BLE001 - no single root block: not a kernel a rule understands
        return None
    reductions = [b for b in blocks if is_reduction_block(sch, b)]
    if len(reductions) != 1:
        return None
    red = reductions[0]
    pos = [sch.get(b).same_as(sch.get(red)) for b in blocks].index(True)
    producers, consumers = blocks[:pos], blocks[pos + 1 :]
    try:
        for block in reversed(producers):
            sch.compute_inline(block)
        for block in reversed(consumers[1:]):
            sch.reverse_compute_inline(block)
    except s_tir.ScheduleError:
        return None
    return red, (consumers[0] if consumers else None)


# ---- expressions ---------------------------------------------------------------------------
def const(expr) -> int | None:
    """The value of an integer constant, else None."""
    return int(expr.value) if isinstance(expr, tirx.IntImm) else None


def dtype_bits(dtype) -> int:
    dt = tvm.runtime.DataType(str(dtype))
    return dt.bits * dt.lanes


def _dtype(expr) -> str:
    """The dtype of an expression (PrimExprs carry it as their type: `.ty`)."""
    ty = expr.ty
    return str(ty.dtype) if hasattr(ty, "dtype") else str(ty)


def _same_var(expr, var) -> bool:
    return isinstance(expr, tirx.Var) and expr.same_as(var)


def _indexed_by(load, variables) -> bool:
    """`load` reads its buffer at exactly `variables` (identical Vars, in order)."""
    return len(load.indices) == len(variables) and all(_same_var(i, v) for i, v in zip(load.indices, variables))


def _divided(expr, var) -> int | None:
    """d when `expr` is var // d (a constant d), else None."""
    if isinstance(expr, tirx.FloorDiv) and _same_var(expr.a, var):
        return const(expr.b)
    return None


def _param(func: tirx.PrimFunc, var) -> tirx.Var | None:
    return next((p for p in func.params if p.same_as(var)), None)


# ---- the dequantize ------------------------------------------------------------------------
def registered_patterns() -> tuple[DequantizePattern, ...]:
    """The dequantize patterns of the registered quantization entries."""
    patterns = (getattr(q, "dequantize_pattern", None) for q in QUANTIZATIONS.values())
    return tuple(dict.fromkeys(p for p in patterns if p is not None))


@dataclasses.dataclass(frozen=True)
class Dequantize:
    weight: tirx.Var  # packed words [N, K / E]
    scale: tirx.Var  # [N, K / G]
    pattern: DequantizePattern


def match_dequantize(func: tirx.PrimFunc, stmt, patterns) -> Dequantize | None:
    """The block `stmt` as a group-quantized weight's dequantize of one of `patterns` (weight
    and scale being parameters of `func`), else None."""
    if len(stmt.iter_vars) != 2 or any(iv.iter_type != tirx.IterVar.DataPar for iv in stmt.iter_vars):
        return None
    i, j = (iv.var for iv in stmt.iter_vars)
    store = stmt.body
    if not isinstance(store, tirx.BufferStore) or not _indexed_by(store, (i, j)):
        return None
    dtype = str(store.buffer.dtype)
    mul = store.value  # (value - Z) * S[i, j // G]
    if not isinstance(mul, tirx.Mul) or not isinstance(mul.a, tirx.Sub) or not isinstance(mul.b, TensorLoad):
        return None
    sub, scale_load = mul.a, mul.b
    if not isinstance(sub.b, tirx.FloatImm) or float(sub.b.value) != int(sub.b.value) or _dtype(sub.b) != dtype:
        return None
    zero_point = int(sub.b.value)
    cast = sub.a  # cast(dt, (W[i, j // E] >> cast(u32, j % E * B)) & M)
    if not isinstance(cast, tirx.Cast) or _dtype(cast) != dtype or not isinstance(cast.value, tirx.BitwiseAnd):
        return None
    shifted, mask = cast.value.a, const(cast.value.b)
    if not isinstance(shifted, tirx.RShift) or not isinstance(shifted.a, TensorLoad) or mask is None:
        return None
    word_load, shift = shifted.a, shifted.b
    storage = _dtype(word_load)
    if not isinstance(shift, tirx.Cast) or _dtype(shift) != storage or not isinstance(shift.value, tirx.Mul):
        return None
    offset, bits = shift.value.a, const(shift.value.b)  # j % E, B
    if not isinstance(offset, tirx.FloorMod) or not _same_var(offset.a, j) or bits is None:
        return None
    per_word = const(offset.b)
    if len(word_load.indices) != 2 or not _same_var(word_load.indices[0], i) or _divided(word_load.indices[1], j) != per_word:
        return None
    if len(scale_load.indices) != 2 or not _same_var(scale_load.indices[0], i):
        return None
    group = _divided(scale_load.indices[1], j)
    found = DequantizePattern(bits, per_word, mask, zero_point, group, storage, dtype)
    if found not in patterns:
        return None
    weight, scale = _param(func, word_load.source), _param(func, scale_load.source)
    if weight is None or scale is None or str(scale.dtype) != dtype:
        return None
    n, k = (const(d) for d in store.buffer.shape)
    if n is None or k is None or k % group or k % per_word:
        return None
    if [const(d) for d in weight.shape] != [n, k // per_word] or [const(d) for d in scale.shape] != [n, k // group]:
        return None
    return Dequantize(weight, scale, found)


# ---- the NT matmul -------------------------------------------------------------------------
@dataclasses.dataclass
class NTMatmul:
    """C[*rows, n] = sum_k X[*rows, k] * W'[n, k] in f32, W' the weight or its dequantize, then
    the epilogue blocks."""

    func: tirx.PrimFunc
    x: tirx.Var  # activation parameter [..., K]
    weight: tirx.Var  # packed words [N, K / E] (quantized) or float [N, K] (unquantized)
    scale: tirx.Var | None  # [N, K / G] when quantized
    dequantize: DequantizePattern | None  # the quantization's format, None when unquantized
    n: int
    k: int
    matmul_buffer: tirx.Var  # the f32 accumulator the epilogue reads
    epilogue: list  # SBlock statements after the matmul, in order

    @property
    def quantized(self) -> bool:
        return self.dequantize is not None

    @property
    def bits(self) -> int:
        """Bits per quantized weight (0 when unquantized)."""
        return self.dequantize.bits if self.quantized else 0

    @property
    def group_size(self) -> int:
        """Weights per scale (0 when unquantized)."""
        return self.dequantize.group_size if self.quantized else 0

    @property
    def rows_shape(self) -> list:
        """The activation's leading dims (e.g. [1, 1] for decode, [1, seq_len] for prefill)."""
        return list(self.x.shape[:-1])

    @property
    def rows(self) -> int | None:
        """Product of the activation's leading dims when static (the M of the matmul)."""
        total = 1
        for dim in self.rows_shape:
            if const(dim) is None:
                return None
            total *= const(dim)
        return total

    @property
    def words_per_row(self) -> int | None:
        """32-bit words of `weight` per output row (None when a row is not whole words)."""
        row_bits = const(self.weight.shape[1]) * dtype_bits(self.weight.dtype)
        return None if row_bits % 32 or self.k % (row_bits // 32) else row_bits // 32

    @property
    def elems_per_word(self) -> int | None:
        """K elements per 32-bit word of `weight` (8 for int4, 2 for f16, 1 for f32)."""
        words = self.words_per_row
        return None if words is None else self.k // words

    def placeholders(self) -> list[te.Tensor]:
        return [te.placeholder(list(p.shape), str(p.dtype), name=p.name) for p in self.func.params]

    def param_index(self, var: tirx.Var) -> int:
        return [p.same_as(var) for p in self.func.params].index(True)


def match_nt_matmul(func: tirx.PrimFunc, patterns=None) -> NTMatmul | None:
    """The structure of `func` if it is a (dequantize ->) NT_matmul (-> epilogue) kernel, the
    dequantize one of `patterns` (default: the registered quantization entries')."""
    found = root_blocks(func)
    if found is None:
        return None
    sch, blocks = found
    stmts = [sch.get(b) for b in blocks]
    if not stmts or any(not isinstance(s.body, tirx.BufferStore) for s in stmts):
        return None
    for block, stmt in zip(blocks, stmts):
        if len(sch.get_loops(block)) != len(stmt.iter_vars):
            return None
    reductions = [i for i, s in enumerate(stmts) if any(iv.iter_type == tirx.IterVar.CommReduce for iv in s.iter_vars)]
    if len(reductions) != 1 or reductions[0] > 1:
        return None
    pos = reductions[0]
    producers, mm, consumers = stmts[:pos], stmts[pos], stmts[pos + 1 :]
    operands = _match_matmul_update(mm)
    if operands is None:
        return None
    x_load, b_load = operands
    store = mm.body
    x_param = _param(func, x_load.source)
    n, k = (const(d) for d in b_load.source.shape)
    if x_param is None or n is None or k is None or len(b_load.source.shape) != 2:
        return None
    for stmt in consumers:
        if any(iv.iter_type != tirx.IterVar.DataPar for iv in stmt.iter_vars):
            return None
        if not _indexed_by(stmt.body, [iv.var for iv in stmt.iter_vars]):
            return None
    final = consumers[-1].body.buffer if consumers else store.buffer
    if not func.params[-1].same_as(final):
        return None
    if not producers:
        weight = _param(func, b_load.source)
        if weight is None:
            return None
        return NTMatmul(func, x_param, weight, None, None, n, k, store.buffer, consumers)
    if not producers[0].body.buffer.same_as(b_load.source):
        return None
    deq = match_dequantize(func, producers[0], registered_patterns() if patterns is None else tuple(patterns))
    if deq is None:
        return None
    return NTMatmul(func, x_param, deq.weight, deq.scale, deq.pattern, n, k, store.buffer, consumers)


def _match_matmul_update(stmt):
    """(X load, B load) when the reduction block is C[s..., n] = C[s..., n] + f32(X[s..., k]) *
    f32(B[n, k]) (f32(): a cast to float32, or nothing for float32 operands) with a zero init."""
    kinds = [iv.iter_type for iv in stmt.iter_vars]
    if len(kinds) < 2 or kinds[-1] != tirx.IterVar.CommReduce or kinds.count(tirx.IterVar.CommReduce) != 1:
        return None
    *spatial, k = (iv.var for iv in stmt.iter_vars)
    store = stmt.body
    if str(store.buffer.dtype) != "float32" or not _indexed_by(store, spatial):
        return None
    init = stmt.init
    if init is not None and not (isinstance(init, tirx.BufferStore) and init.buffer.same_as(store.buffer)
                                 and isinstance(init.value, tirx.FloatImm) and float(init.value.value) == 0.0):
        return None
    add = store.value
    if not isinstance(add, tirx.Add) or not isinstance(add.a, TensorLoad) or not isinstance(add.b, tirx.Mul):
        return None
    if not add.a.source.same_as(store.buffer) or not _indexed_by(add.a, spatial):
        return None
    x_load, b_load = _f32_load(add.b.a), _f32_load(add.b.b)
    if x_load is None or b_load is None:
        return None
    if not _indexed_by(x_load, [*spatial[:-1], k]) or not _indexed_by(b_load, [spatial[-1], k]):
        return None
    return x_load, b_load


def _f32_load(expr):
    """The load in `expr` = load (float32) or cast(float32, load), else None."""
    if isinstance(expr, tirx.Cast) and _dtype(expr) == "float32":
        expr = expr.value
    return expr if isinstance(expr, TensorLoad) else None


def match_on_cpu(func, target, decode: bool) -> NTMatmul | None:
    """`match_nt_matmul(func)` for an llvm target, restricted to one activation row (decode) or
    several."""
    if not isinstance(func, tirx.PrimFunc) or target.kind.name != "llvm":
        return None
    info = match_nt_matmul(func)
    if info is None or (info.rows == 1) != decode:
        return None
    return info


@dataclasses.dataclass
class InlinedNTMatmul:
    """A matched kernel's loop nest on a fresh schedule: producers (the dequantize) inlined into
    the reduction, trailing elementwise consumers merged into one epilogue block."""

    info: NTMatmul
    sch: s_tir.Schedule
    block: s_tir.schedule.SBlockRV  # the reduction
    epilogue: s_tir.schedule.SBlockRV | None


def inline_nt_matmul(info: NTMatmul) -> InlinedNTMatmul | None:
    sch = s_tir.Schedule(info.func)
    found = inline_around_reduction(sch)
    return None if found is None else InlinedNTMatmul(info, sch, *found)

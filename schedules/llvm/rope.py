"""CPU rule for RoPE kernels: cos / sin computed once per (token, dim), not per (token, head, dim).

Each cos / sin call whose argument depends on a strict subset of the block's iterators becomes a
load from a table over that subset (schedules/tir_rewrite.py), filled per token inside the
parallel token loop; the rotation runs vectorised over the head dim, split at dim / 2. TVM's own
expressions are moved, not re-derived, so any RoPE scaling (llama3, yarn, ...) stays exact.
Handles: one spatial block over >= 2 iterators on llvm whose body holds such trig calls.
Anything else: None (the Elementwise rule takes it).
Knobs: lanes (vector width of the rotation), min_parallel (tokens below which it stays serial).
"""

from __future__ import annotations

import dataclasses

import tvm
import tvm_ffi
from tvm import s_tir, tirx
from tvm.target import Target

from ..base import CPUScheduleRule
from ..tir_rewrite import Load, UnsupportedIR, collect, inline_let, map_stmt_exprs, substitute

TRIG_OPS = ("tirx.cos", "tirx.sin")


@dataclasses.dataclass
class RopeTable(CPUScheduleRule):
    lanes: int = 16
    min_parallel: int = 4

    def apply(self, func: tirx.PrimFunc, target: Target, tunable: bool) -> s_tir.Schedule | None:
        del tunable
        if not self.is_target_available(target) or not isinstance(func, tirx.PrimFunc):
            return None
        hoisted = hoist_trig_tables(func)
        if hoisted is None:
            return None
        new_func, table_names, main_name = hoisted
        sch = s_tir.Schedule(new_func)
        main = sch.get_sblock(main_name)
        loops = sch.get_loops(main)
        try:
            for name in table_names:
                sch.compute_at(sch.get_sblock(name), loops[0])
                self._vectorize_inner(sch, sch.get_sblock(name), halves=False)
            self._vectorize_inner(sch, main, halves=True)
            extent = sch.get(loops[0]).extent
            if not isinstance(extent, tirx.IntImm) or int(extent) >= self.min_parallel:
                sch.parallel(loops[0])
        except s_tir.ScheduleError:  # a loop nest these primitives do not take: Elementwise's then
            return None
        return sch

    def _vectorize_inner(self, sch: s_tir.Schedule, block, halves: bool) -> None:
        inner = sch.get_loops(block)[-1]
        extent = sch.get(inner).extent
        if not isinstance(extent, tirx.IntImm):
            return
        n = int(extent)
        if halves and n % 2 == 0 and (n // 2) % self.lanes == 0:
            half, rest = sch.split(inner, [2, None])
            sch.unroll(half)
            inner = rest
            n //= 2
        if n % self.lanes == 0:
            _, vec = sch.split(inner, [None, self.lanes])
            sch.vectorize(vec)


def hoist_trig_tables(func: tirx.PrimFunc):
    """(new func, table block names, main block name) with the hoistable cos / sin calls of the
    function's single block moved into tables, or None if the function is not of that form."""
    nest = _single_block_nest(func)
    if nest is None:
        return None
    root, loops, realize = nest
    block = realize.block
    if len(block.iter_vars) < 2 or any(iv.iter_type != tirx.IterVar.DataPar for iv in block.iter_vars):
        return None
    if any(not v.same_as(loop.loop_var) for v, loop in zip(realize.iter_values, loops, strict=True)):
        return None
    try:
        body = map_stmt_exprs(block.body, inline_let)
        calls = []
        map_stmt_exprs(body, lambda e: calls.append(e) if _is_trig(e) else None)
    except UnsupportedIR:
        return None
    written = [r.source for r in block.writes]
    params = list(func.params)
    tables = []  # (call, table buffer, iterators it depends on)
    for call in calls:
        if any(tvm_ffi.structural_equal(call, seen) for seen, _, _ in tables):
            continue
        used = _iterators_used(call, block.iter_vars, params, written)
        if used is None or len(used) == len(block.iter_vars):
            continue
        name = f"{call.op.name.split('.')[-1]}_table{len(tables)}"
        tables.append((call, tirx.decl_buffer([iv.dom.extent for iv in used], str(call.ty.dtype), name), used))
    if not tables:
        return None

    def use_table(e):
        for call, buf, used in tables:
            if _is_trig(e) and tvm_ffi.structural_equal(e, call):
                return tirx.BufferLoad(buf, [iv.var for iv in used])
        return None

    body = map_stmt_exprs(body, use_table)
    buffers = {p: p for p in func.params if isinstance(p.ty, tirx.BufferType)}  # 0.27: buffers are Vars
    buffers.update({buf: buf for _, buf, _ in tables})
    main = _block_with_regions(block, block.iter_vars, body, block.name_hint, buffers)
    stmts = [_table_nest(call, buf, used, buffers) for call, buf, used in tables]
    stmts.append(_rebuild_nest(loops, s_tir.SBlockRealize(realize.iter_values, realize.predicate, main)))
    root_block = root.block
    new_root = s_tir.SBlock(
        root_block.iter_vars, root_block.reads, root_block.writes, root_block.name_hint, tirx.SeqStmt(stmts),
        root_block.init, [*root_block.alloc_buffers, *(buf for _, buf, _ in tables)], root_block.match_buffers,
        root_block.annotations,
    )  # fmt: skip
    new_func = func.with_body(s_tir.SBlockRealize(root.iter_values, root.predicate, new_root))
    return new_func, [buf.name for _, buf, _ in tables], block.name_hint


def _is_trig(e) -> bool:
    return isinstance(e, tvm.ir.Call) and isinstance(e.op, tvm.ir.Op) and e.op.name in TRIG_OPS


def _iterators_used(call, iter_vars, params, written) -> list | None:
    """The block iterators `call` depends on (in block order), or None when it reads anything
    else than iterators, function parameters and buffers the block does not write."""
    if any(load.source.same_as(w) for load in collect(call, Load) for w in written):
        return None
    used = []
    for var in collect(call, tirx.Var):
        if any(var.same_as(p) for p in params) or any(var.same_as(iv.var) for iv in used):
            continue
        match = next((iv for iv in iter_vars if iv.var.same_as(var)), None)
        if match is None or not _is_zero(match.dom.min):
            return None
        used.append(match)
    return sorted(used, key=lambda iv: next(i for i, other in enumerate(iter_vars) if other.same_as(iv)))


def _single_block_nest(func: tirx.PrimFunc):
    """(root realize, loops, inner block realize) for `root { for ...: for ...: block }`."""
    root = func.body
    if not isinstance(root, s_tir.SBlockRealize):
        return None
    loops, stmt = [], root.block.body
    while isinstance(stmt, tirx.For):
        loops.append(stmt)
        stmt = stmt.body
    if not loops or not isinstance(stmt, s_tir.SBlockRealize) or len(stmt.iter_values) != len(loops):
        return None
    if any(loop.kind != tirx.ForKind.SERIAL or not _is_zero(loop.min) for loop in loops):
        return None
    return root, loops, stmt


def _is_zero(expr) -> bool:
    return isinstance(expr, tirx.IntImm) and int(expr) == 0


def _block_with_regions(template, iter_vars, body, name, buffers):
    block = s_tir.SBlock(iter_vars, [], [], name, body)
    reads, writes = s_tir.analysis.get_sblock_read_write_region(block, buffers)
    return s_tir.SBlock(iter_vars, reads, writes, name, body, annotations=template.annotations)


def _table_nest(call, buf, used, buffers):
    new_vars = [tirx.IterVar(iv.dom, tirx.Var(f"v_{iv.var.name}", iv.var.ty), tirx.IterVar.DataPar) for iv in used]
    value = substitute(call, {iv.var: nv.var for iv, nv in zip(used, new_vars, strict=True)})
    store = tirx.BufferStore(buf, value, [nv.var for nv in new_vars])
    block = _block_with_regions(s_tir.SBlock([], [], [], "", tirx.Evaluate(0)), new_vars, store, buf.name, buffers)
    loop_vars = [tirx.Var(f"i_{iv.var.name}", iv.var.ty) for iv in used]
    stmt = s_tir.SBlockRealize(loop_vars, True, block)
    for lv, iv in reversed(list(zip(loop_vars, used, strict=True))):
        stmt = tirx.For(lv, iv.dom.min, iv.dom.extent, tirx.ForKind.SERIAL, stmt)
    return stmt


def _rebuild_nest(loops, inner):
    stmt = inner
    for loop in reversed(loops):
        stmt = tirx.For(loop.loop_var, loop.min, loop.extent, loop.kind, stmt, loop.thread_binding, loop.annotations)
    return stmt

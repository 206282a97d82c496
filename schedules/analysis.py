"""Block analysis shared by rules of every target family."""

from __future__ import annotations

from tvm import s_tir, tirx
from tvm.s_tir import dlight as dl


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

"""CPU rule for per-row normalisations (rms_norm): one reduction over the last axis per row, then
an elementwise pass over the row that reads the reduced value.

Elementwise producers are inlined; the reduction and the per-row scalar work are computed once
per row inside the output's row loop; rows run in parallel (when there are enough of them) and
the output pass is vectorized. Handles: llvm; exactly one reduction block, reducing the innermost
axis; every other block spatial; a final block whose loops start with the reduction's spatial
loops. Anything else: None. Knobs: lanes (vector width of the output pass), min_rows_parallel.
"""

from __future__ import annotations

import contextlib
import dataclasses

from tvm import s_tir, tirx
from tvm.s_tir import dlight as dl
from tvm.target import Target

from ..analysis import root_blocks
from ..base import CPUScheduleRule


@dataclasses.dataclass
class RowNorm(CPUScheduleRule):
    lanes: int = 16
    min_rows_parallel: int = 4

    def apply(self, func: tirx.PrimFunc, target: Target, tunable: bool) -> s_tir.Schedule | None:
        del tunable
        found = root_blocks(func) if self.is_target_available(target) else None
        if found is None:
            return None
        sch, blocks = found
        kinds = [[iv.iter_type for iv in sch.get(b).iter_vars] for b in blocks]
        reductions = [i for i, k in enumerate(kinds) if tirx.IterVar.CommReduce in k]
        if len(reductions) != 1 or kinds[reductions[0]][-1] != tirx.IterVar.CommReduce:
            return None
        if kinds[reductions[0]].count(tirx.IterVar.CommReduce) != 1 or len(blocks) < 3:
            return None
        red = blocks[reductions[0]]
        for block in blocks:
            if len(sch.get_loops(block)) != len(sch.get(block).iter_vars):
                return None
        # inline every spatial block but the last (the output) into its consumers
        for block in blocks[:-1]:
            if block.same_as(red):
                continue
            try:
                sch.compute_inline(block)
            except Exception:  # noqa: BLE001 - e.g. the reduction's consumer: fold it into the output instead
                with contextlib.suppress(Exception):
                    sch.reverse_compute_inline(block)
        remaining = sch.get_child_blocks(dl.analysis.get_root_block(sch))
        if len(remaining) != 2:
            return None
        red, out = remaining
        if len(sch.get(red).iter_vars) != len(sch.get(out).iter_vars):
            return None
        out_loops = sch.get_loops(out)
        rows = out_loops[:-1]
        try:
            sch.compute_at(red, rows[-1])
        except Exception:  # noqa: BLE001 - the output does not walk rows like the reduction
            return None
        inner = out_loops[-1]
        extent = _const(sch.get(inner).extent)
        if extent is not None and extent % self.lanes == 0:
            sch.vectorize(sch.split(inner, [None, self.lanes])[1])
        row_count = 1
        for loop in rows:
            value = _const(sch.get(loop).extent)
            row_count = None if value is None or row_count is None else row_count * value
        if row_count is None or row_count >= self.min_rows_parallel:
            sch.parallel(sch.fuse(*rows) if len(rows) > 1 else rows[0])
        return sch


def _const(expr) -> int | None:
    return int(expr.value) if isinstance(expr, tirx.IntImm) else None

"""CPU rule for injective kernels (swiglu's split-silu-multiply, rope, casts, residual adds).

Every intermediate block is inlined into its consumer, and each remaining block runs its outer
loops fused and parallel (when there is enough work to pay for waking the thread pool) and its
innermost loop vectorized by `lanes` when the extent divides.
Handles: PrimFuncs whose blocks are all spatial (no reduction), on llvm. Anything else: None.
Knobs: lanes (vector width), min_parallel (elements below which the kernel stays on one thread).
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
class Elementwise(CPUScheduleRule):
    lanes: int = 16
    min_parallel: int = 16384

    def apply(self, func: tirx.PrimFunc, target: Target, tunable: bool) -> s_tir.Schedule | None:
        del tunable
        found = root_blocks(func) if self.is_target_available(target) else None
        if found is None:
            return None
        sch, blocks = found
        if not blocks:
            return None
        for block in blocks:
            stmt = sch.get(block)
            if any(iv.iter_type != tirx.IterVar.DataPar for iv in stmt.iter_vars):
                return None
            if len(sch.get_loops(block)) != len(stmt.iter_vars) or not sch.get_loops(block):
                return None
            written = [region.source for region in stmt.writes]
            if any(r.source.same_as(w) for r in stmt.reads for w in written):  # in place / scatter (the sampler's)
                return None
        for block in blocks[:-1]:
            # a block that cannot be inlined (e.g. read at shifted positions) keeps its own loop nest
            with contextlib.suppress(Exception):
                sch.compute_inline(block)
        for block in sch.get_child_blocks(dl.analysis.get_root_block(sch)):
            self._schedule_block(sch, block)
        return sch

    def _schedule_block(self, sch: s_tir.Schedule, block) -> None:
        loops = sch.get_loops(block)
        inner = loops[-1]
        extent = _const(sch.get(inner).extent)
        if extent is not None and extent % self.lanes == 0 and extent >= self.lanes:
            outer_inner, vec = sch.split(inner, [None, self.lanes])
            sch.vectorize(vec)
            loops = [*loops[:-1], outer_inner]
        total = 1
        for loop in loops:
            value = _const(sch.get(loop).extent)
            total = None if value is None or total is None else total * value
        if total is None or total * self.lanes >= self.min_parallel:
            sch.parallel(sch.fuse(*loops) if len(loops) > 1 else loops[0])


def _const(expr) -> int | None:
    return int(expr.value) if isinstance(expr, tirx.IntImm) else None

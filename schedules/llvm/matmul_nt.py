"""CPU rule for C[..., n] = sum_k A[..., k] * W[n, k] with optional fused prologue/epilogue.

Covers `NT_matmul*` and `fused_dequantizeN_NT_matmulM[_cast][_add]`: the dequantize is inlined (the
weight is decoded in registers, never materialised), elementwise consumers (cast, residual add)
run right after each row block, the K reduction is vectorised by rfactor over `lanes` partial
sums, and rows are split into parallel tasks.
Handles: what schedules.analysis.match_nt_matmul recognises, static N, K % lanes == 0; else None.
Knobs: lanes (vector width of the K reduction), rows (output rows per parallel task),
unroll (max auto-unroll step of the K loop).
"""

from __future__ import annotations

import dataclasses

from tvm import s_tir, tirx
from tvm.target import Target

from ..analysis import const, inline_nt_matmul, match_nt_matmul
from ..base import CPUScheduleRule


@dataclasses.dataclass
class MatmulNT(CPUScheduleRule):
    lanes: int = 16
    rows: int = 16
    unroll: int = 8

    def apply(self, func: tirx.PrimFunc, target: Target, tunable: bool) -> s_tir.Schedule | None:
        del tunable
        if not isinstance(func, tirx.PrimFunc) or not self.is_target_available(target):
            return None
        info = match_nt_matmul(func)
        inlined = None if info is None else inline_nt_matmul(info)
        if inlined is None:
            return None
        sch, red, epilogue = inlined.sch, inlined.block, inlined.epilogue

        loops = sch.get_loops(red)
        spatial, k = loops[:-1], loops[-1]
        k_extent = const(sch.get(k).extent)
        if k_extent is None or k_extent % self.lanes:
            return None
        n_loop = spatial[-1]
        n_extent = const(sch.get(n_loop).extent)
        if n_extent is None:
            return None
        rows = self.rows if n_extent % self.rows == 0 else 1
        n_outer, n_inner = sch.split(n_loop, factors=[None, rows])
        outer = spatial[:-1]
        # Put the output-row tiles outermost (parallel), batch/token loops inside.
        sch.reorder(n_outer, *outer, n_inner)
        _, k_inner = sch.split(k, factors=[None, self.lanes])
        rf = sch.rfactor(k_inner, factor_axis=len(sch.get(red).iter_vars) - 1)
        # rf block loops: n_outer, *outer, n_inner, k_outer, k_inner
        sch.reverse_compute_at(red, sch.get_loops(rf)[len(outer) + 1])
        task = sch.get_loops(rf)[0]
        if epilogue is not None:
            sch.reverse_compute_at(epilogue, task)
        sch.parallel(task)
        rf_loops = sch.get_loops(rf)
        sch.vectorize(rf_loops[-1])
        sch.annotate(rf_loops[-2], "pragma_auto_unroll_max_step", self.unroll)
        sch.annotate(rf_loops[-2], "pragma_unroll_explicit", 1)
        sch.decompose_reduction(rf, rf_loops[-2])
        return sch


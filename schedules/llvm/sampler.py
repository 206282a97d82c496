"""CPU rule for the sampler kernels (pipeline/model/sampler.py): they run as written.

Their in-place kernels (logit bias, penalties, bitmask, the sort's steps) read and write the same
buffer, which the generic CPU rules' vectorize / parallel refuse (the schedule raises); the rest
are small row passes. On llvm these functions serve tests and the MLC-LLM function table (MLC-LLM
samples on the CPU there), so the reference loops are kept unscheduled: TVM's default lowering.
"""

from __future__ import annotations

import dataclasses

from tvm import s_tir, tirx
from tvm.target import Target

from ..analysis import sampler_info
from ..base import CPUScheduleRule, UntunedRule


@dataclasses.dataclass
class SamplerCPU(UntunedRule, CPUScheduleRule):
    def apply(self, func: tirx.PrimFunc, target: Target, tunable: bool) -> s_tir.Schedule | None:
        del tunable
        if not self.is_target_available(target) or not isinstance(func, tirx.PrimFunc):
            return None
        if sampler_info(func) is None:
            return None
        return s_tir.Schedule(func)

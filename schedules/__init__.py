"""Schedule rules per target family, applied in order (first rule that returns a Schedule wins).

Each rule follows TVM dlight's contract: `apply(func, target, tunable) -> Schedule | None`, None
meaning "not mine" so the next rule (or no schedule) is used.
"""

from __future__ import annotations

from tvm.s_tir import dlight as dl

from .gpu import GPU_RULES
from .llvm import LLVM_RULES

RULES = {
    "llvm": LLVM_RULES,
    "cuda": GPU_RULES,
    "metal": GPU_RULES,
    "webgpu": GPU_RULES,
}


def schedule_pass(target_kind: str):
    """The IRModule pass that schedules every unscheduled PrimFunc for `target_kind`."""
    return dl.ApplyDefaultSchedule(*RULES[target_kind])

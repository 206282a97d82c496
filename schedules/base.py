"""The base every schedule rule builds on, as TVM dlight keeps it (`dlight/base`, `dlight/cpu/base.py`,
`dlight/gpu/base.py`): the rule classes per target family and the target facts rules ask.

A rule module imports only this module, `schedules.analysis` (what a kernel is) and its family's
shared micro-kernels (`schedules/llvm/microkernels.py`); never another rule
(tests/schedules/test_layout.py checks it).

Every rule follows dlight's contract: `apply(func, target, tunable) -> Schedule | None`, None
meaning "not mine". Rules are dataclasses whose fields are their tuning knobs;
`knob_space(func, target)` lists the candidates valid for one kernel.
"""

from __future__ import annotations

from tvm.s_tir import dlight as dl
from tvm.target import Target

from .analysis import dtype_bits

GPU_KINDS = ("cuda", "metal", "webgpu")


class CPUScheduleRule(dl.ScheduleRule):
    """A rule for CPU (llvm) targets: declines every other target."""

    def is_target_available(self, target: Target) -> bool:
        return is_cpu(target)


class GPUScheduleRule(dl.ScheduleRule):
    """A rule for GPU targets (CUDA, Metal, WebGPU): declines every other target."""

    def is_target_available(self, target: Target) -> bool:
        return is_gpu(target)


class UntunedRule:
    """A rule with nothing to tune (the sampler's): `mlcpipe tune` skips the kernels it claims,
    claimed before any rule with knobs could take them."""

    def knob_space(self, func, target: Target) -> dict:
        del func, target
        return {}


# ---- target facts -------------------------------------------------------------------------
def kind_of(target: Target) -> str:
    return target.kind.name


def is_cpu(target: Target) -> bool:
    return kind_of(target) == "llvm"


def is_gpu(target: Target) -> bool:
    return kind_of(target) in GPU_KINDS


def webgpu_subgroups(target: Target) -> bool:
    """A webgpu target with `supports_subgroups` (TVM then sets thread_warp_size 32)."""
    subgroups = target.attrs.get("supports_subgroups", False)
    return kind_of(target) == "webgpu" and bool(subgroups)


def warp_size(target: Target) -> int:
    return int(target.attrs.get("thread_warp_size", 1))


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

"""Schedule rules per target family, applied in order (first rule that returns a Schedule wins).

Each rule follows TVM dlight's contract: `apply(func, target, tunable) -> Schedule | None`, None
meaning "not mine" so the next rule (or no schedule) is used. Rules are dataclasses whose fields
are their tuning knobs; `knob_space(func, target)` lists the candidates valid for one kernel.
A tuning table (pipeline/tuning/__init__.py: kernel signature -> rule name + knobs, or a MetaSchedule
trace: trace_replay.py) overrides the defaults kernel by kernel.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping

import tvm
from tvm import tirx

from . import script_stack, trace_replay
from .llvm.attention import replace_attention_kernels
from .gpu import CUDA_RULES, METAL_RULES, WEBGPU_RULES
from .gpu.merge_state import replace_merge_state_kernels
from .llvm import LLVM_RULES
from .signature import kernel_signature

script_stack.install()  # before any rule parses TVMScript (dlight's GPU matmul imports TVM's tensor intrinsics)

RULES = {
    "llvm": LLVM_RULES,
    "cuda": CUDA_RULES,
    "metal": METAL_RULES,
    "webgpu": WEBGPU_RULES,
}


# Whole-kernel replacements run before the rules: TVM-provided kernels (already marked scheduled)
# that we swap for our own with the same signature and contract. name -> pass(mod) -> (mod, names)
# MergeStateBarrier: TVM's GPU `_merge_state_inplace` races on S (schedules/gpu/merge_state.py).
REPLACEMENTS = {
    "llvm": {"AttentionCPU": replace_attention_kernels},
    "cuda": {"MergeStateBarrier": replace_merge_state_kernels},
    "metal": {"MergeStateBarrier": replace_merge_state_kernels},
    "webgpu": {"MergeStateBarrier": replace_merge_state_kernels},
}


def rule_by_name(target_kind: str, name: str):
    for rule in RULES[target_kind]:
        if type(rule).__name__ == name:
            return rule
    return None


def with_knobs(rule, knobs: Mapping):
    """`rule` with some knobs replaced (a copy: the registry's defaults stay as they are)."""
    return dataclasses.replace(rule, **knobs) if knobs else rule


def schedule_func(func: tirx.PrimFunc, target: tvm.target.Target, tuned: Mapping | None = None):
    """(scheduled func, record) for one PrimFunc; record names the rule, its knobs and where the
    knobs came from ("tuning" or "default"); (func, None) when no rule applies."""
    rules = RULES[target.kind.name]
    if tuned and tuned["rule"] == trace_replay.RULE_NAME:
        sch = trace_replay.replay(func, tuned["trace"])
        if sch is not None:
            return sch.mod["main"], {"rule": trace_replay.RULE_NAME, "knobs": {}, "source": "tuning"}
    elif tuned:
        rule = rule_by_name(target.kind.name, tuned["rule"])
        if rule is not None:
            tuned_rule = with_knobs(rule, tuned.get("knobs", {}))
            sch = _one(tuned_rule.apply(func, target, False))
            if sch is not None:
                return sch.mod["main"], _record(tuned_rule, "tuning")
    for rule in rules:
        sch = _one(rule.apply(func, target, False))
        if sch is not None:
            return sch.mod["main"], _record(rule, "default")
    return func, None


def _one(space):
    """dlight rules may return a list of schedules (a design space): take the first."""
    if isinstance(space, (list, tuple)):
        return space[0] if space else None
    return space


def _record(rule, source: str) -> dict:
    knobs = dataclasses.asdict(rule) if dataclasses.is_dataclass(rule) else {}
    return {"rule": type(rule).__name__, "knobs": knobs, "source": source}


def schedule_pass(target_kind: str, tuning: Mapping | None = None, on_kernel: Callable[[str, dict | None], None] | None = None):
    """The IRModule pass that schedules every unscheduled PrimFunc for `target_kind`.

    `tuning` maps kernel signatures (schedules.signature) to {"rule", "knobs"}; `on_kernel(name,
    record)` is told which rule and knobs each kernel got.
    """

    @tvm.transform.module_pass(opt_level=0, name="mlcpipe.Schedule")
    def _pass(mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        current = tvm.target.Target.current(allow_none=False)
        for name, replace in REPLACEMENTS.get(target_kind, {}).items():
            mod, replaced = replace(mod)
            for kernel in replaced:
                if on_kernel is not None:
                    on_kernel(kernel, {"rule": name, "knobs": {}, "source": "replacement"})
        updates = {}
        for gvar, func in mod.functions_items():
            if not isinstance(func, tirx.PrimFunc) or _is_scheduled(func):
                continue
            target = func.attrs["target"] if func.attrs is not None and "target" in func.attrs else current
            if target.kind.name != target_kind:
                continue
            tuned = tuning.get(kernel_signature(func)) if tuning else None
            new, record = schedule_func(func, target, tuned)
            if on_kernel is not None:
                on_kernel(gvar.name_hint, record)
            if record is not None:
                updates[gvar] = new.with_attr("tirx.is_scheduled", True)
        for gvar, func in updates.items():
            mod[gvar] = func
        return mod

    return _pass


def _is_scheduled(func: tirx.PrimFunc) -> bool:
    attrs = func.attrs
    return attrs is not None and "tirx.is_scheduled" in attrs and int(attrs["tirx.is_scheduled"]) == 1

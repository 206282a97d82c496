"""The phased Relax -> TIR pipeline, with an optional IR dump after each phase.

Phases (as MLC-LLM orders them):
  1. fuse-high-level   Relax graph rewrites before lowering (transpose folded into NT_matmul; TVM's
                       CPU paged-prefill attention fixed: kv_cache_fixes.py)
  2. lower             Relax ops -> TIR PrimFuncs, FuseOps + FuseTIR (elementwise epilogues)
  3. fuse-tir          dequantize fused into the NT_matmul that consumes it
  4. schedule          the schedule pass the caller gives (schedules.schedule_pass: our rules for
                       the target; passes/ does not import schedules/, which sit above it)
  5. finalize          Relax VM lowering: memory planning, builtins, shape lowering (and, when
                       the build gives one, the pass attaching `_metadata` right after memory
                       planning, where MLC-LLM attaches it: function_table.py)
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import tvm
from tvm import relax

from .function_table import DeferBatchedFunctions, RestoreBatchedFunctions
from .fuse_dequantize_matmul import FuseDequantizeMatmul
from .kv_cache_fixes import FixKVCacheKernels
from .shape_funcs import CanonicalShapeFuncs


def phase_passes(schedule: tvm.transform.Pass | None, after_memory_plan=None) -> list[tuple[str, list[tvm.transform.Pass]]]:
    """(phase name, passes) of every phase, in order. `schedule`: the schedule phase's pass (None:
    that phase and the next are empty). `after_memory_plan`: an optional pass run right after
    StaticPlanBlockMemory (the build's AttachMetadata, whose memory estimate reads the planned
    allocations)."""
    return [
        # the batched functions are lowered last: kernels they share with prefill/decode keep
        # their names and `seq_len` dims (function_table.py)
        ("fuse-high-level", [FixKVCacheKernels, DeferBatchedFunctions, relax.transform.FuseTransposeMatmul()]),
        (
            "lower",
            [
                relax.backend.DispatchSampling(),
                relax.backend.DispatchSortScan(),
                relax.transform.LegalizeOps(),
                relax.transform.AnnotateTIROpPattern(),
                relax.transform.FoldConstant(),
                relax.transform.FuseOps(),
                relax.transform.FuseTIR(),
            ],
        ),
        ("fuse-tir", [FuseDequantizeMatmul(), relax.transform.DeadCodeElimination(), RestoreBatchedFunctions]),
        ("schedule", [schedule] if schedule is not None else []),
        (
            "finalize",
            [
                relax.transform.RewriteDataflowReshape(),
                relax.transform.ToNonDataflow(),
                relax.transform.RemovePurityChecking(),
                relax.transform.CallTIRRewrite(),
                relax.transform.StaticPlanBlockMemory(),
                *([after_memory_plan] if after_memory_plan is not None else []),
                relax.transform.RewriteCUDAGraph(),  # only with relax.backend.use_cuda_graph (cuda's cuda_graph)
                relax.transform.LowerAllocTensor(),
                relax.transform.KillAfterLastUse(),
                relax.transform.LowerRuntimeBuiltin(),
                relax.transform.ComputePrimValue(),
                relax.transform.VMShapeLower(),
                CanonicalShapeFuncs,
                relax.transform.AttachGlobalSymbol(),
            ],
        ),
    ]


PHASES = ("fuse-high-level", "lower", "fuse-tir", "schedule", "finalize")


def run_pipeline(
    mod: tvm.IRModule,
    target: tvm.target.Target,
    dump_dir: Path | None = None,
    on_phase: Callable[[str, tvm.IRModule], None] | None = None,
    schedule: tvm.transform.Pass | None = None,
    after_memory_plan: tvm.transform.Pass | None = None,
    until: str | None = None,
) -> tvm.IRModule:
    """Run every phase under `target`; dump `NN-<phase>.py` TVMScript into `dump_dir` if given.

    `on_phase(name, mod)` sees the module after each phase (used to record the fused kernels
    before scheduling hides their structure). `schedule`: the schedule phase's pass
    (`schedules.schedule_pass(kind, tuning, on_kernel)`), needed unless the run stops before that
    phase. `after_memory_plan` runs right after StaticPlanBlockMemory (the
    build's AttachMetadata). `until` (a name in PHASES) stops after that phase: `until="fuse-tir"`
    gives the fused, unscheduled kernels.
    """
    if until is not None and until not in PHASES:
        raise ValueError(f"until={until!r}: not a phase; allowed: {', '.join(PHASES)}")
    if schedule is None and PHASES.index(until or PHASES[-1]) >= PHASES.index("schedule"):
        raise ValueError("run_pipeline: the schedule phase needs a schedule pass (schedules.schedule_pass(kind, tuning, on_kernel))")
    if dump_dir is not None:
        dump_dir.mkdir(parents=True, exist_ok=True)
        (dump_dir / "00-input.py").write_text(mod.script(show_meta=False))
    phases = phase_passes(schedule, after_memory_plan)
    assert tuple(name for name, _ in phases) == PHASES
    with target:
        for index, (name, passes) in enumerate(phases, start=1):
            mod = tvm.transform.Sequential(passes, name=name)(mod)
            if dump_dir is not None:
                (dump_dir / f"{index:02d}-{name}.py").write_text(mod.script(show_meta=False))
            if on_phase is not None:
                on_phase(name, mod)
            if name == until:
                break
    return mod

"""The phased Relax -> TIR pipeline, with an optional IR dump after each phase.

Phases (as MLC-LLM orders them):
  1. fuse-high-level   Relax graph rewrites before lowering (transpose folded into NT_matmul)
  2. lower             Relax ops -> TIR PrimFuncs, FuseOps + FuseTIR (elementwise epilogues)
  3. fuse-tir          dequantize fused into the NT_matmul that consumes it
  4. schedule          our schedule rules for the target (schedules/)
  5. finalize          Relax VM lowering: memory planning, builtins, shape lowering
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import tvm
from tvm import relax

from .fuse_dequantize_matmul import FuseDequantizeMatmul


def _phases(target_kind: str, tuning=None, on_kernel=None) -> list[tuple[str, list[tvm.transform.Pass]]]:
    from schedules import schedule_pass

    return [
        ("fuse-high-level", [relax.transform.FuseTransposeMatmul()]),
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
        ("fuse-tir", [FuseDequantizeMatmul(), relax.transform.DeadCodeElimination()]),
        ("schedule", [schedule_pass(target_kind, tuning, on_kernel)]),
        (
            "finalize",
            [
                relax.transform.RewriteDataflowReshape(),
                relax.transform.ToNonDataflow(),
                relax.transform.RemovePurityChecking(),
                relax.transform.CallTIRRewrite(),
                relax.transform.StaticPlanBlockMemory(),
                relax.transform.LowerAllocTensor(),
                relax.transform.KillAfterLastUse(),
                relax.transform.LowerRuntimeBuiltin(),
                relax.transform.ComputePrimValue(),
                relax.transform.VMShapeLower(),
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
    tuning: dict | None = None,
    on_kernel: Callable[[str, dict | None], None] | None = None,
) -> tvm.IRModule:
    """Run every phase under `target`; dump `NN-<phase>.py` TVMScript into `dump_dir` if given.

    `on_phase(name, mod)` sees the module after each phase (used to record the fused kernels
    before scheduling hides their structure). `tuning` (kernel signature -> rule + knobs, from
    pipeline/tuning.py) overrides rule defaults; `on_kernel(name, record)` hears which rule and
    knobs each kernel got.
    """
    if dump_dir is not None:
        dump_dir.mkdir(parents=True, exist_ok=True)
        (dump_dir / "00-input.py").write_text(mod.script(show_meta=False))
    phases = _phases(target.kind.name, tuning, on_kernel)
    assert tuple(name for name, _ in phases) == PHASES
    with target:
        for index, (name, passes) in enumerate(phases, start=1):
            mod = tvm.transform.Sequential(passes, name=name)(mod)
            if dump_dir is not None:
                (dump_dir / f"{index:02d}-{name}.py").write_text(mod.script(show_meta=False))
            if on_phase is not None:
                on_phase(name, mod)
    return mod

"""`profile` for an open engine: the measurement that fits where the model runs."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from ..backends import backend
from ..device import RunOptions
from .core import Workload


def profile(engine, options: RunOptions, weights, llvm_twin: Callable[[], Path] | None, workload: Workload,
            progress: Callable[[str, int, int], None] | None = None) -> dict:
    """Per-kernel profile of `engine`: in a WebGPU runtime every kernel of the real run timed by
    timestamp queries; in TVM's runtime here the VM instrument; over RPC remote timers on the call
    sequence recorded on an llvm build of the same model (the artifact itself when it is one this
    CPU runs, else `llvm_twin()`: built for this CPU)."""
    kind = engine.manifest["target"]["kind"]
    if backend(kind).WEBGPU_RUNTIME:
        from ..runners.webgpu.profile import profile as measure_webgpu

        return measure_webgpu(engine, workload, progress)
    if options.remote is None:
        from .measure import profile as measure

        return measure(engine, workload, progress)
    from ..runtime import Engine
    from ..targets import missing_cpu_flags
    from .remote import profile_remote

    runs_here = backend(kind).HOST_CPU and not missing_cpu_flags(engine.manifest.get("cpu_flags") or [])  # e.g. not the remote's mcpu
    twin = engine.artifact if runs_here else llvm_twin()
    return profile_remote(engine, Engine(twin, weights), workload, progress)

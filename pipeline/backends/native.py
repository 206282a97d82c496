"""Running artifacts in TVM's own runtime (llvm, cuda, metal): here, or over TVM RPC.

Shared by the llvm, cuda and metal backends: the Relax VM engine, one kernel of the shipped
library at a time (for `check`), and the profiler that fits where the model runs.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from . import RunOptions

PROFILE_DEFAULTS = (128, 32, 3)  # prompt tokens, generated tokens, measured runs


def _refuse_web_options(options: RunOptions) -> None:
    if options.adapter or options.browser:
        raise ValueError("--adapter / --browser choose a WebGPU runtime: they apply to webgpu artifacts only")


def open_engine(artifact: Path, weights, seed: int, options: RunOptions):
    from ..runtime import Engine

    _refuse_web_options(options)
    return Engine(artifact, weights, seed=seed, remote=options.remote, prefill_chunk=options.prefill_chunk)


def kernel_runner(artifact: Path, manifest: dict, options: RunOptions, local: bool) -> Callable | None:
    """(kernel name, args) -> args after the call, running the shipped library's kernel on the
    artifact's device (the remote's over RPC); None when `local` is False and there is no RPC."""
    from ..runtime import library_kernel_runner

    _refuse_web_options(options)
    if options.remote is None and not local:
        return None
    return library_kernel_runner(Path(artifact), manifest, options.remote)


def profile(engine, options: RunOptions, weights, llvm_twin: Callable[[], Path], **kwargs) -> dict:
    """Per-kernel profile: the VM instrument here; over RPC, remote timers on the call sequence
    recorded on an llvm build of the same model (`llvm_twin()` gives its artifact)."""
    if options.remote is None:
        from ..profiler.measure import profile as measure

        return measure(engine, **kwargs)
    from ..profiler.remote import profile_remote
    from ..runtime import Engine

    twin = engine.artifact if engine.manifest["target"]["kind"] == "llvm" else llvm_twin()
    return profile_remote(engine, Engine(twin, weights), **kwargs)

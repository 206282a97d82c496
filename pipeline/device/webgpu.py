"""WebGPU: lib.wasm runs in a WebGPU runtime (Dawn for node, headless Chromium, WebLLM:
pipeline/runners/webgpu/), not in TVM's runtime here."""

from __future__ import annotations

RPC_DEVICE = None  # not TVM's runtime: no RPC
RPC_DEVICE_HINT = ""
HOST_MEMORY = False  # an adapter's memory, not this machine's (the WebGPU runtime allocates the KV cache)
PROFILE_DEFAULTS = (32, 8, 2)  # prompt tokens, generated tokens, measured runs (software adapters are slow)
NIGHTLY_PROFILE = False


def runs_here() -> bool:
    """TVM's runtime here has no WebGPU (the WebGPU runtimes run the artifact: runtime.open_engine)."""
    return False


def local_device():
    from ..errors import ArtifactError
    from .cuda import runs_here as cuda_here

    raise ArtifactError(f"artifact target 'webgpu' cannot run on this machine (runnable here: llvm{', cuda' if cuda_here() else ''})")


def timing_device():
    raise ValueError("tune --target webgpu: cannot time webgpu kernels here (allowed: llvm, cuda); the software "
                     "adapters run WebGPU on the CPU, so their timings do not rank GPU schedules: use `mlcpipe check` for numerics")


def timing_cold_bytes() -> int:
    """0: one input set per timing (not timed here)."""
    return 0


def local_peak_gbps() -> float | None:
    """None: an adapter does not say its memory's bandwidth; reports use the target preset's figure."""
    return None

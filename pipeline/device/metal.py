"""Apple GPUs: the dylib runs on a Mac whose TVM has the Metal runtime, reached over TVM RPC."""

from __future__ import annotations

RPC_DEVICE = "metal"
RPC_DEVICE_HINT = " (serve from a Mac whose TVM is built with USE_METAL)"
HOST_MEMORY = False  # a GPU's own memory: the KV cache is checked against what its device API says is free
PROFILE_DEFAULTS = (128, 32, 3)  # prompt tokens, generated tokens, measured runs
NIGHTLY_PROFILE = False
RUN_HINT = "metal artifacts run on a Mac: serve `python -m tvm.exec.rpc_server` there and pass --rpc HOST:PORT"


def runs_here() -> bool:
    """Metal kernels run only on a Mac: over TVM RPC (`--rpc`), not here."""
    return False


def local_device():
    """A Mac whose TVM has the Metal runtime."""
    import tvm

    from ..errors import ArtifactError

    if not tvm.metal(0).exist:
        raise ArtifactError(RUN_HINT)
    return tvm.metal(0)


def timing_device():
    raise ValueError("tune --target metal: Metal kernels cannot be timed here (allowed: llvm, cuda); "
                     "`mlcpipe check --rpc` runs them on a Mac")


def timing_cold_bytes() -> int:
    """0: one input set per timing (not timed here)."""
    return 0


def local_peak_gbps() -> float | None:
    """None: no Mac runs here; reports use the target preset's figure."""
    return None

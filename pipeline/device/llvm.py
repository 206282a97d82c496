"""CPU: artifacts run on this machine's CPU in TVM's runtime (or a remote's over RPC)."""

from __future__ import annotations

from pathlib import Path

RPC_DEVICE = "cpu"  # the RPCSession method giving the remote device
RPC_DEVICE_HINT = ""
HOST_MEMORY = True  # the local device's memory is this machine's (the KV cache checked against MemAvailable)
PROFILE_DEFAULTS = (128, 32, 3)  # prompt tokens, generated tokens, measured runs
NIGHTLY_PROFILE = True  # the nightly's profile check can run it


def runs_here() -> bool:
    return True


def local_device():
    from . import tvm_runtime as rt

    return rt.device("cpu")


def timing_device():
    """`mlcpipe tune` times llvm kernels on this CPU."""
    import tvm

    return tvm.cpu()


def timing_cold_bytes() -> int:
    """Inputs `mlcpipe tune` rotates through per timing: twice the last-level cache, so weights
    stream from memory as in the model (a kernel timed on one input set runs from the cache)."""
    llc = 0
    for index in sorted(Path("/sys/devices/system/cpu/cpu0/cache").glob("index*")):
        try:
            size = (index / "size").read_text().strip()
        except OSError:
            continue
        factor = {"K": 1 << 10, "M": 1 << 20}.get(size[-1:], 1)
        llc = max(llc, int(size.rstrip("KM") or 0) * factor)
    return 2 * (llc or 32 << 20)


def local_peak_gbps() -> float | None:
    """None: a CPU's bandwidth is measured (benchmarks) or the target preset's, never looked up."""
    return None

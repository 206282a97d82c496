"""NVIDIA GPUs: the artifact's fatbin runs on this machine's CUDA device in TVM's runtime (its
CUDA runtime library loaded first), or on a remote's over RPC."""

from __future__ import annotations

from ..backends.cuda import CUDART, RUNTIME_LIBRARIES

RPC_DEVICE = "cuda"
RPC_DEVICE_HINT = ""
HOST_MEMORY = False  # a GPU's own memory: the KV cache is checked against what its device API says is free
PROFILE_DEFAULTS = (128, 32, 3)  # prompt tokens, generated tokens, measured runs
NIGHTLY_PROFILE = True  # where a GPU is present
# HBM bandwidth in GB/s by the vendor's datasheets; the first fragment found in the device's name
# wins (GH200 before H200, the H100 PCIe and NVL parts before the SXM one)
DATASHEET_GBPS = (("GH200 144G", 4900.0), ("GH200", 4000.0), ("H200", 4800.0), ("H100 PCIe", 2000.0), ("H100 NVL", 3900.0),
                  ("H100", 3350.0), ("A100-SXM4-80GB", 2039.0), ("A100 80GB PCIe", 1935.0), ("A100", 1555.0))


def cuda_device():
    """Device 0 of TVM's CUDA runtime (loaded first; RuntimeUnavailable where it cannot load)."""
    from . import tvm_runtime as rt

    return rt.device("cuda", 0, RUNTIME_LIBRARIES, (CUDART,))


def datasheet_gbps(name: str) -> float | None:
    """The datasheet memory bandwidth of the GPU called `name` (as its driver names it), None when unknown."""
    low = name.lower()
    return next((gbps for fragment, gbps in DATASHEET_GBPS if fragment.lower() in low), None)


def runs_here() -> bool:
    """Whether TVM's runtime sees a CUDA device here (False where its CUDA runtime cannot load)."""
    from . import tvm_runtime as rt

    try:
        return rt.exists(cuda_device())
    except rt.RuntimeUnavailable:
        return False


ELSEWHERE = "run it where an NVIDIA GPU is, or pass --rpc HOST:PORT of a TVM RPC server on one"


def local_device():
    """This machine's CUDA device; where there is none, one line saying why and where the artifact runs."""
    from ..errors import ArtifactError
    from . import tvm_runtime as rt

    try:
        dev = cuda_device()
    except rt.RuntimeUnavailable as exc:
        why = "no NVIDIA driver here (libcuda.so.1 cannot be loaded)" if "libcuda.so" in str(exc) else str(exc)
        raise ArtifactError(f"artifact target 'cuda' cannot run on this machine: {why}; {ELSEWHERE}") from None
    if not rt.exists(dev):
        raise ArtifactError(f"artifact target 'cuda' cannot run on this machine: TVM's CUDA runtime finds no GPU here; {ELSEWHERE}")
    return dev


def timing_device():
    """`mlcpipe tune` times cuda kernels on this machine's GPU."""
    import tvm

    if not tvm.cuda().exist:
        raise ValueError("tune --target cuda: no CUDA device on this machine (run it where a GPU is, e.g. the lent H100 / H200)")
    return tvm.cuda()


def timing_cold_bytes() -> int:
    """0: one input set per timing (GPU timings on inputs beyond a Hopper's 50-60 MB L2 are untested)."""
    return 0


def local_peak_gbps() -> float | None:
    """The datasheet bandwidth of the GPU here (None without one, or for a GPU not in DATASHEET_GBPS)."""
    from . import tvm_runtime as rt

    return datasheet_gbps(rt.device_name(cuda_device())) if runs_here() else None

"""NVIDIA GPUs: the artifact's fatbin runs on this machine's CUDA device in TVM's runtime (its
CUDA runtime library loaded first), or on a remote's over RPC."""

from __future__ import annotations

from ..backends.cuda import CUDART, RUNTIME_LIBRARIES

RPC_DEVICE = "cuda"
RPC_DEVICE_HINT = ""
HOST_MEMORY = False  # a GPU's own memory: the KV cache is checked against what its device API says is free
PROFILE_DEFAULTS = (128, 32, 3)  # prompt tokens, generated tokens, measured runs
NIGHTLY_PROFILE = True  # where a GPU is present


def cuda_device():
    """Device 0 of TVM's CUDA runtime (loaded first; RuntimeUnavailable where it cannot load)."""
    from . import tvm_runtime as rt

    return rt.device("cuda", 0, RUNTIME_LIBRARIES, (CUDART,))


def runs_here() -> bool:
    """Whether TVM's runtime sees a CUDA device here (False where its CUDA runtime cannot load)."""
    from . import tvm_runtime as rt

    try:
        return rt.exists(cuda_device())
    except rt.RuntimeUnavailable:
        return False


def local_device():
    from ..errors import ArtifactError

    if not runs_here():
        raise ArtifactError("artifact target 'cuda' cannot run on this machine (runnable here: llvm)")
    return cuda_device()


def timing_device():
    """`mlcpipe tune` times cuda kernels on this machine's GPU."""
    import tvm

    if not tvm.cuda().exist:
        raise ValueError("tune --target cuda: no CUDA device on this machine (run it where a GPU is, e.g. the lent H100)")
    return tvm.cuda()


def timing_cold_bytes() -> int:
    """0: one input set per timing (GPU timings on inputs beyond an H100's 50 MB L2 are untested)."""
    return 0

"""The run half of each target kind (pipeline/device/): what runs here, the not-runnable errors,
the tuning timer's device, the RPC device names; and `RunOptions` for the layers above."""

from __future__ import annotations

import pytest

from mlcpipe.device import INTERFACE, RunOptions, device, kinds_with
from mlcpipe.errors import ArtifactError

from tests.helpers.hardware import NO_CUDA


def test_each_kind_says_where_it_runs():
    cuda_here = device("cuda").runs_here()
    assert device("llvm").runs_here() and not device("metal").runs_here() and not device("webgpu").runs_here()
    assert str(device("llvm").local_device()).startswith("cpu")
    with pytest.raises(ArtifactError, match=r"^artifact target 'webgpu' cannot run on this machine \(runnable here: llvm"):
        device("webgpu").local_device()
    if not cuda_here:  # no CUDA device: a one-line refusal saying why and where the artifact runs
        with pytest.raises(ArtifactError, match=NO_CUDA):
            device("cuda").local_device()
    with pytest.raises(ValueError, match=r"no device module for target kind 'rocm'; allowed: llvm, cuda, metal, webgpu"):
        device("rocm")


def test_cuda_refusal_names_the_missing_piece(monkeypatch):
    """No driver, no GPU behind a loaded driver, or no TVM runtime: each its own reason, the same advice."""
    from mlcpipe.device import cuda, tvm_runtime as rt

    def unavailable(message):
        def fail():
            raise rt.RuntimeUnavailable(message)
        return fail

    monkeypatch.setattr(cuda, "cuda_device", unavailable("cannot load /x/libtvm_runtime_cuda.so: libcuda.so.1: cannot open shared object file"))
    with pytest.raises(ArtifactError, match=r"^artifact target 'cuda' cannot run on this machine: no NVIDIA driver here \(libcuda.so.1 cannot be "
                                            r"loaded\); run it where an NVIDIA GPU is, or pass --rpc HOST:PORT of a TVM RPC server on one$"):
        cuda.local_device()
    monkeypatch.setattr(cuda, "cuda_device", unavailable("/y/libtvm_runtime.so: missing"))
    with pytest.raises(ArtifactError, match=r"^artifact target 'cuda' cannot run on this machine: /y/libtvm_runtime.so: missing; run it where"):
        cuda.local_device()
    monkeypatch.setattr(cuda, "cuda_device", lambda: "cuda:0")
    monkeypatch.setattr(rt, "exists", lambda dev: False)
    with pytest.raises(ArtifactError, match=r"^artifact target 'cuda' cannot run on this machine: TVM's CUDA runtime finds no GPU here; run it where"):
        cuda.local_device()
    monkeypatch.setattr(rt, "exists", lambda dev: dev == "cuda:0")
    assert cuda.local_device() == "cuda:0"


def test_rpc_memory_profile_and_timing_attributes():
    assert kinds_with("RPC_DEVICE") == ("llvm", "cuda", "metal")
    assert [device(k).RPC_DEVICE for k in ("llvm", "cuda", "metal")] == ["cpu", "cuda", "metal"]
    assert kinds_with("HOST_MEMORY") == ("llvm",)
    assert "NIGHTLY_PROFILE" in INTERFACE and kinds_with("NIGHTLY_PROFILE") == ("llvm", "cuda")
    assert device("webgpu").PROFILE_DEFAULTS == (32, 8, 2) and device("llvm").PROFILE_DEFAULTS == (128, 32, 3)
    for kind, allowed in (("metal", "allowed: llvm, cuda"), ("webgpu", "allowed: llvm, cuda")):
        with pytest.raises(ValueError, match=f"tune --target {kind}: .*{allowed}"):
            device(kind).timing_device()
    assert RunOptions().remote is None and not RunOptions(adapter="gles").browser


def test_the_run_half_never_imports_the_layers_above_it():
    """Loaded in a fresh interpreter: the device modules pull in neither the runtime, the runners,
    the profiler nor TVM's compiler package (a bundle runs them without apache-tvm)."""
    import subprocess
    import sys

    code = ("import sys\nfrom mlcpipe.device import device\n"
            "[device(k) for k in ('llvm', 'cuda', 'metal', 'webgpu')]\n"
            "bad = [m for m in sys.modules if m == 'tvm' or m.startswith(('mlcpipe.runtime', 'mlcpipe.runners', 'mlcpipe.profiler'))]\n"
            "print(bad)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr

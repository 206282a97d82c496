"""What each hardware marker needs (pyproject.toml registers them; docs/tests.md), and whether this
machine has it. A probe returns None where the need is met, else one line saying what is missing;
each runs at most once per session, when the first test carrying its marker is set up.

tests/conftest.py skips a marked test where its probe finds something missing, for `gpu` always and
for the others where the marker says `skip_if_missing=True` (the tests that ran where their
hardware was and skipped elsewhere). Without it the test runs and fails with the pipeline's own
one-line error naming the setup step: scripts/setup-debian.sh installs what `lavapipe`, `dawn`,
`browser` and `qemu` need, and the default suite is meant to run whole after it (deselect with -m)."""

from __future__ import annotations

import functools
import shutil

# the refusal of a cuda artifact where no CUDA device is: one line, the reason, and where it runs instead
NO_CUDA = (r"^artifact target 'cuda' cannot run on this machine: (no NVIDIA driver here \(libcuda.so.1 cannot be loaded\)|TVM's CUDA "
           r"runtime finds no GPU here); run it where an NVIDIA GPU is, or pass --rpc HOST:PORT of a TVM RPC server on one$")


def _node_packages(packages: tuple[str, ...]) -> str | None:
    from mlcpipe.runners import node_modules

    for package in packages:
        if not (node_modules() / package).is_dir():
            return f"npm package {package} missing (npm ci)"
    return None


@functools.cache
def lavapipe() -> str | None:
    """wgpu finds a WebGPU adapter (Mesa lavapipe: mesa-vulkan-drivers) and the wgpu package is installed."""
    from mlcpipe.runners.webgpu import lavapipe as runner

    try:
        runner.get_device()
    except RuntimeError as exc:  # no wgpu, or no adapter (mesa-vulkan-drivers missing)
        return str(exc)
    return None


@functools.cache
def dawn() -> str | None:
    """node and the npm packages of the WebGPU runner (webgpu: Dawn for node; TVM's web runtime)."""
    if shutil.which("node") is None:
        return "node not found"
    return _node_packages(("webgpu", "@mlc-ai/web-runtime"))


@functools.cache
def browser() -> str | None:
    """node, Chromium and the npm packages that drive it (puppeteer-core, WebLLM, Dawn's for the comparison)."""
    from mlcpipe.runners.webgpu.browser import chromium_path

    if shutil.which("node") is None:
        return "node not found"
    if not chromium_path().is_file():
        return f"no Chromium at {chromium_path()}"
    return _node_packages(("puppeteer-core", "@mlc-ai/web-runtime", "webgpu", "@mlc-ai/web-llm"))


@functools.cache
def qemu() -> str | None:
    """qemu-aarch64 and the aarch64 cross gcc that links kernels for it (pipeline/runners/qemu_arm.py)."""
    from mlcpipe.runners import qemu_arm

    return qemu_arm.missing()


@functools.cache
def nvcc() -> str | None:
    """The CUDA toolkit's nvcc (not a Debian package here): PATH, $CUDA_HOME, /usr/local/cuda."""
    from mlcpipe.backends.cuda import find_nvcc

    try:
        find_nvcc()
    except RuntimeError as exc:
        return str(exc)
    return None


@functools.cache
def gpu() -> str | None:
    """A real GPU TVM's runtime can run on (CUDA, ROCm or Metal device)."""
    import tvm

    if any(tvm.device(kind, 0).exist for kind in ("cuda", "rocm", "metal")):
        return None
    return "no CUDA, ROCm or Metal device here"


# marker name -> probe
PROBES = {"lavapipe": lavapipe, "dawn": dawn, "browser": browser, "qemu": qemu, "nvcc": nvcc, "gpu": gpu}
ALWAYS_SKIPPED_WHERE_MISSING = {"gpu"}

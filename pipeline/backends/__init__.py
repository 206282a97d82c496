"""One backend module per target kind (llvm, cuda, metal, webgpu), small and flat: `backend(kind)`.

Every backend defines INTERFACE: what its presets accept, the build (library / kernel source
names, PassContext config, device kernel suffix, `export`, ...), and how `run`, `check`,
`profile`, `tune` and the nightly run it. Every decision on a target kind lives here: the rest of
pipeline/ asks these names (tests/test_layout.py). Signatures and meaning: docs/backends.md.
"""

from __future__ import annotations

import dataclasses
import importlib

KINDS = ("llvm", "cuda", "metal", "webgpu")
INTERFACE = (
    "HOST_CPU", "PRESET_OPTIONS", "check_preset",  # target presets
    "LIBRARY", "SOURCE_FILE", "PASS_CONFIG", "pipeline_config", "KERNEL_SUFFIX", "export", "kernel_source", "compile_context",  # build
    "install_lowerings",
    "open_engine", "kernel_runner", "static_checks", "not_executed", "PROFILE_DEFAULTS", "profile",  # run
    "local_device", "timing_device", "timing_cold_bytes", "RPC_DEVICE", "RPC_DEVICE_HINT", "WEBGPU_RUNTIME", "METASCHEDULE", "NIGHTLY_PROFILE",
    "LIBRARY_FORMAT", "HOST_MEMORY",
)


@dataclasses.dataclass(frozen=True)
class RunOptions:
    """Where an artifact runs: a TVM RPC session (llvm, cuda, metal), or a WebGPU adapter
    (gles, swiftshader, gpu, auto) in node or in headless Chromium; a smaller prefill chunk."""

    remote: object = None
    adapter: str | None = None
    browser: bool = False
    prefill_chunk: int | None = None
    timed: bool = False  # for `profile`: pick a device that can time kernels
    console: object = None  # callable(line): the browser page's console lines, as they come


def backend(kind: str):
    """The backend module for a target kind (llvm, cuda, metal, webgpu)."""
    if kind not in KINDS:
        raise ValueError(f"no backend for target kind {kind!r}; allowed: llvm, cuda, metal, webgpu")
    return importlib.import_module(f"{__name__}.{kind}")


def kinds_with(attribute: str) -> tuple[str, ...]:
    """The target kinds whose backend's `attribute` is true (e.g. "METASCHEDULE"), in KINDS order."""
    return tuple(kind for kind in KINDS if getattr(backend(kind), attribute))


def not_runnable_here(kind: str, cuda_here: bool) -> Exception:
    """The error for an artifact TVM's runtime cannot run on this machine (`cuda_here`: whether
    cuda artifacts can, cuda.cuda_present())."""
    from ..errors import ArtifactError

    runnable = ["llvm"] + (["cuda"] if cuda_here else [])
    return ArtifactError(f"artifact target '{kind}' cannot run on this machine (runnable here: {', '.join(runnable)})")


def host_side_kernels(manifest: dict) -> set[str]:
    """Kernels the build found no thread binding in (they run on the host, with no device code).
    Every other kernel of a GPU artifact must have its device code in the library."""
    return {k["name"] for k in manifest.get("kernels", []) if "launch" in k and not k["launch"]}


def device_modules(executable):
    """The device-code modules imported by an executable's host module (empty for llvm)."""
    return imported_device_modules(executable.mod)


def imported_device_modules(module):
    """The device-code modules a runtime module imports, at any depth (not host code)."""
    found = []

    def walk(mod, depth):
        if depth > 0 and mod.kind not in ("llvm", "c", "static_library"):
            found.append(mod)
        for sub in mod.imports:
            walk(sub, depth + 1)

    walk(module, 0)
    return found

"""One backend module per target kind (llvm, cuda, metal, webgpu), small and flat.

Build side:
    LIBRARY, SOURCE_FILE                               the library / kernel source file names
    PASS_CONFIG                                        TVM PassContext config of the target's build
    KERNEL_SUFFIX                                      a PrimFunc's device kernel is <name><suffix>
    export(executable, target, out_dir, library=LIBRARY) -> list[str]
                                                       writes `library` (+ extras)
    kernel_source(executable) -> str                   the device code (CUDA C, MSL, WGSL)
    compile_context(target_spec) -> context manager    active around relax.build
Run side (`run`, `check`, `profile` ask these, given a RunOptions):
    open_engine(artifact, weights, seed, options)      the model, ready to generate
    kernel_runner(artifact, manifest, options)         (name, args) -> args, one shipped kernel
                                                       on the device; None: not executable here
    static_checks(artifact, manifest, names, roles)    rows (kernel, role, status, note) when not
                                                       (a device kernel without code: FAIL)
    not_executed(options) -> str                       ... and the summary line saying so
    PROFILE_DEFAULTS, profile(engine, options, weights, llvm_twin, **sizes) -> profile dict
    local_device()                                     the device an Engine runs the artifact on here
    timing_device()                                    the device `mlcpipe tune` times kernels on
"""

from __future__ import annotations

import dataclasses
import importlib


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
    if kind not in ("llvm", "cuda", "metal", "webgpu"):
        raise ValueError(f"no backend for target kind {kind!r}; allowed: llvm, cuda, metal, webgpu")
    return importlib.import_module(f"{__name__}.{kind}")


def not_runnable_here(kind: str) -> Exception:
    """The error for an artifact TVM's runtime cannot run on this machine."""
    import tvm

    from ..errors import ArtifactError

    runnable = ["llvm"] + (["cuda"] if tvm.cuda(0).exist else [])
    return ArtifactError(f"artifact target '{kind}' cannot run on this machine (runnable here: {', '.join(runnable)})")


def host_side_kernels(manifest: dict) -> set[str]:
    """Kernels the build found no thread binding in (they run on the host, with no device code).
    Every other kernel of a GPU artifact must have its device code in the library."""
    return {k["name"] for k in manifest.get("kernels", []) if "launch" in k and not k["launch"]}


def device_modules(executable):
    """The device-code modules imported by an executable's host module (empty for llvm)."""
    found = []

    def walk(mod, depth):
        if depth > 0 and mod.kind not in ("llvm", "c", "static_library"):
            found.append(mod)
        for sub in mod.imports:
            walk(sub, depth + 1)

    walk(executable.mod, 0)
    return found

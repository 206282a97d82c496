"""Per-target export of a built Relax executable into an artifact directory.

Each backend module (one per target kind, small and flat) provides:
    LIBRARY: str                 file name of the loadable library in the artifact
    SOURCE_FILE: str | None      file name of the generated kernel source, if any
    export(executable, target, out_dir) -> list[str]   writes LIBRARY (+ extras), returns names
    kernel_source(executable) -> str                   the device code (CUDA C, MSL, WGSL)
    compile_context(target_spec) -> context manager    active around relax.build (e.g. installs
                                                       the nvcc callback that makes a fatbin)
"""

from __future__ import annotations

import importlib


def backend(kind: str):
    """The backend module for a target kind (llvm, cuda, metal, webgpu)."""
    if kind not in ("llvm", "cuda", "metal", "webgpu"):
        raise ValueError(f"no backend for target kind {kind!r}; allowed: llvm, cuda, metal, webgpu")
    return importlib.import_module(f"{__name__}.{kind}")


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

"""The compile half of each target kind, one module per kind (llvm, cuda, metal, webgpu): `backend(kind)`.

Every backend defines INTERFACE: what its presets accept, the build (library / kernel source
names, PassContext config, device kernel suffix, `export`, ...) and what `check` verifies of a
build without its device. Every compile-time decision on a target kind lives here: the rest of
pipeline/ asks these names (tests/test_layout.py). The run half is `pipeline.device`, which
imports this side, never the other way. Signatures and meaning: docs/backends.md.
"""

from __future__ import annotations

import importlib

KINDS = ("llvm", "cuda", "metal", "webgpu")
INTERFACE = (
    "HOST_CPU", "PRESET_OPTIONS", "check_preset",  # target presets
    "LIBRARY", "SOURCE_FILE", "PASS_CONFIG", "pipeline_config", "KERNEL_SUFFIX", "export", "kernel_source", "compile_context",  # build
    "install_lowerings", "WEBGPU_RUNTIME", "METASCHEDULE", "LIBRARY_FORMAT",
    "static_checks", "not_executed",  # `check` without the device
)


def backend(kind: str):
    """The backend module for a target kind (llvm, cuda, metal, webgpu)."""
    if kind not in KINDS:
        raise ValueError(f"no backend for target kind {kind!r}; allowed: llvm, cuda, metal, webgpu")
    return importlib.import_module(f"{__name__}.{kind}")


def kinds_with(attribute: str) -> tuple[str, ...]:
    """The target kinds whose backend's `attribute` is true (e.g. "METASCHEDULE"), in KINDS order."""
    return tuple(kind for kind in KINDS if getattr(backend(kind), attribute))

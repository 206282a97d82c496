"""CPU: the executable exported as a shared library for this host."""

from __future__ import annotations

import contextlib
from pathlib import Path

from .native import PROFILE_DEFAULTS, open_engine, profile  # noqa: F401  (run side: TVM's own runtime)

LIBRARY = "lib.so"
SOURCE_FILE = None
PASS_CONFIG: dict = {}
KERNEL_SUFFIX = ""  # host code: the kernel is the PrimFunc itself


def compile_context(target_spec):
    del target_spec
    return contextlib.nullcontext()


def export(executable, target, out_dir: Path, library: str = LIBRARY) -> list[str]:
    del target
    executable.export_library(str(Path(out_dir) / library))
    return [library]


def kernel_source(executable) -> str:
    del executable
    return ""


def kernel_runner(artifact, manifest, options):
    from .native import kernel_runner as run_shipped

    return run_shipped(artifact, manifest, options, local=True)


def static_checks(artifact, manifest, names, roles) -> list[tuple]:
    del artifact, manifest, names, roles
    return []


def not_executed(options) -> str:
    del options
    return "llvm: NOT EXECUTED"


def local_device():
    import tvm

    return tvm.cpu()


def timing_device():
    """`mlcpipe tune` times llvm kernels on this CPU."""
    import tvm

    return tvm.cpu()

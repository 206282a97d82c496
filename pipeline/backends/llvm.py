"""CPU: the executable exported as a shared library for this host."""

from __future__ import annotations

import contextlib
from pathlib import Path

LIBRARY = "lib.so"
SOURCE_FILE = None


def compile_context(target_spec):
    del target_spec
    return contextlib.nullcontext()


def export(executable, target, out_dir: Path) -> list[str]:
    del target
    executable.export_library(str(Path(out_dir) / LIBRARY))
    return [LIBRARY]


def kernel_source(executable) -> str:
    del executable
    return ""

"""A cheaper `inspect.stack()` for TVMScript's parser entry points.

`T.prim_func`, `I.ir_module` and `R.function` call `inspect.stack()` on every decoration to find the
caller's frames. `inspect` resolves each frame's module by scanning `sys.modules`, for every frame
of every decoration; under an import (frames of `<frozen importlib...>`) with TVM's ~2000 modules
loaded, that is most of the cost of `import tvm.s_tir.tensor_intrin`, which dlight's GPU matmul rule
triggers. The parser reads only each frame object and the caller's source line (to tell a class
body's `@I.ir_module`); `stack` gives both without the scan. `install()` points those three entry
modules at it, once per process; MLCPIPE_SCRIPT_STACK=inspect keeps TVM's own (to compare build
times, or to rule this out).
"""

from __future__ import annotations

import importlib
import inspect
import linecache
import os
import sys
import types

ENV = "MLCPIPE_SCRIPT_STACK"
# the TVMScript modules that call inspect.stack() (apache-tvm 0.27)
ENTRY_MODULES = ("tvm.tirx.script.parser.entry", "tvm.script.parser.ir.entry", "tvm.relax.script.parser.entry")


def stack(context: int = 1) -> list[inspect.FrameInfo]:
    """`inspect.stack(context)` for the caller, with one source line (or None) per frame."""
    frames = []
    frame = sys._getframe(1)
    while frame is not None:
        code = frame.f_code
        line = linecache.getline(code.co_filename, frame.f_lineno) if context > 0 else ""
        frames.append(inspect.FrameInfo(frame, code.co_filename, frame.f_lineno, code.co_name,
                                        [line] if line else None, 0 if line else None))
        frame = frame.f_back
    return frames


class _Inspect(types.ModuleType):
    """`inspect`, but for `stack`."""

    stack = staticmethod(stack)

    def __getattr__(self, name):
        return getattr(inspect, name)


_INSPECT = _Inspect("inspect")


def install() -> list[str]:
    """Give each TVMScript entry module that uses `inspect.stack` this one; returns their names."""
    done = []
    choice = os.environ.get(ENV, "")
    if choice not in ("", "inspect"):
        raise ValueError(f"environment {ENV}={choice!r}: expected 'inspect' (TVM's own inspect.stack) or unset")
    if choice == "inspect":
        return done
    for name in ENTRY_MODULES:
        try:
            module = importlib.import_module(name)
        except ImportError:
            continue
        if getattr(module, "inspect", None) in (inspect, _INSPECT):
            module.inspect = _INSPECT
            done.append(name)
    return done

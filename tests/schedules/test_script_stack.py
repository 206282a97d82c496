"""schedules/script_stack.py: TVMScript parses the same with the cheaper stack as with inspect's."""

import importlib
import inspect
import os
import subprocess
import sys

import pytest
import tvm
from tvm.script import ir as I
from tvm.script import tirx as T

from mlcpipe.schedules import script_stack


def _both_stacks():
    return inspect.stack(), script_stack.stack()


def test_stack_has_inspects_frames_and_caller_lines():
    theirs, ours = _both_stacks()
    assert len(ours) == len(theirs) > 3
    for a, b in zip(theirs, ours):
        assert (a.frame, a.filename, a.lineno, a.function) == (b.frame, b.filename, b.lineno, b.function)
        if a.code_context:  # frozen import frames have none in either
            assert b.code_context == a.code_context
    assert ours[0].function == "_both_stacks" and "script_stack.stack()" in ours[0].code_context[0]


def _parse_examples():
    """A closure-shaped prim_func and an ir_module class (its methods must not parse on their own)."""
    n = 48

    @T.prim_func(private=True, s_tir=True)
    def scale(a: T.Buffer((n, 8), "float32"), b: T.Buffer((n, 8), "float32")):
        for i, j in T.grid(n, 8):
            with T.sblock("s"):
                vi, vj = T.axis.remap("SS", [i, j])
                b[vi, vj] = a[vi, vj] * T.float32(2)

    @I.ir_module
    class Mod:
        @T.prim_func(s_tir=True)
        def add(a: T.Buffer((16,), "float16"), b: T.Buffer((16,), "float16")):
            T.func_attr({"global_symbol": "add"})
            for i in range(16):
                with T.sblock("a"):
                    vi = T.axis.spatial(16, i)
                    b[vi] = a[vi] + T.float16(1)

    return scale, Mod


@pytest.fixture
def entry_modules():
    script_stack.install()
    modules = [importlib.import_module(name) for name in script_stack.ENTRY_MODULES]
    yield modules
    script_stack.install()  # back to ours, whatever the test left


def test_parses_equal_tvms_own(entry_modules):
    assert all(m.inspect.stack is script_stack.stack and m.inspect.getsource is inspect.getsource for m in entry_modules)
    ours = _parse_examples()
    for module in entry_modules:
        module.inspect = inspect
    theirs = _parse_examples()
    for a, b in zip(ours, theirs):
        tvm.ir.assert_structural_equal(a, b)
    assert isinstance(ours[1], tvm.IRModule) and [gv.name_hint for gv in ours[1].get_global_vars()] == ["add"]


def test_env_keeps_tvms_stack_and_refuses_other_values():
    probe = ("import sys, inspect, importlib; from mlcpipe.schedules import script_stack; "
             "print(all(importlib.import_module(m).inspect is inspect for m in script_stack.ENTRY_MODULES))")
    kept = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          env={**os.environ, script_stack.ENV: "inspect"})
    assert kept.stdout.strip() == "True", kept.stderr[-2000:]
    bad = subprocess.run([sys.executable, "-c", "import mlcpipe.schedules"], capture_output=True, text=True,
                         env={**os.environ, script_stack.ENV: "fast"})
    assert bad.returncode != 0 and "MLCPIPE_SCRIPT_STACK='fast': expected 'inspect'" in bad.stderr

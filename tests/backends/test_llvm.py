"""pipeline/backends/llvm.py: host code generated per aliasing kind, so a kernel's buffers keep
`noalias` whatever function of the module is generated last."""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax
from tvm.script import relax as R
from tvm.script import tirx as T

from mlcpipe.backends import llvm
from mlcpipe.backends.binfmt import Elf


@T.prim_func(s_tir=True)
def axpy(x: T.Buffer((256,), "float32"), y: T.Buffer((256,), "float32"), out: T.Buffer((256,), "float32")):
    T.func_attr({"tirx.noalias": True})
    for i in range(256):
        with T.sblock("axpy"):
            v = T.axis.spatial(256, i)
            out[v] = T.float32(2) * x[v] + y[v]


@T.prim_func(s_tir=True)
def zz_shape(h: T.Buffer((2,), "int64")):
    """Named to be generated last, without `tirx.noalias` (like the VM's shape functions)."""
    h[1] = h[0] * T.int64(3)


def _module() -> tvm.IRModule:
    return tvm.IRModule({"axpy": axpy.with_attr("global_symbol", "axpy"), "zz_shape": zz_shape.with_attr("global_symbol", "zz_shape")})


def _llvm_ir(lib) -> str:
    return "\n".join(m.inspect_source("ll") for m in [lib, *lib.imports] if m.kind == "llvm")


def _compute_function(ir: str, name: str) -> str | None:
    return next((line for line in ir.splitlines() if line.startswith("define") and f"@{name}_compute_(" in line), None)


def _wrapper(ir: str, name: str) -> str:
    return next(line for line in ir.splitlines() if line.startswith("define") and f"@__tvm_ffi_{name}(" in line)


def test_a_kernel_keeps_noalias_beside_a_function_without_it():
    target = tvm.target.Target("llvm")
    with target:
        plain = _llvm_ir(tvm.tirx.build(_module(), target))
        with llvm.separate_alias_kinds():
            split = tvm.tirx.build(_module(), target)
    # TVM alone: the last function's setting wins, the kernel's compute function is inlined away
    assert _compute_function(plain, "axpy") is None
    kernel = _compute_function(_llvm_ir(split), "axpy")
    assert kernel is not None and kernel.count("noalias") == 3, kernel
    # the other way round (the noalias kernel generated last), TVM alone marks the function
    # without tirx.noalias noalias too; the split does not
    flipped = tvm.IRModule({"axpy": axpy.with_attr("global_symbol", "zzz_axpy"), "shape": zz_shape.with_attr("global_symbol", "aa_shape")})
    with target:
        plain_flipped = _llvm_ir(tvm.tirx.build(flipped, target))
        with llvm.separate_alias_kinds():
            split_flipped = _llvm_ir(tvm.tirx.build(flipped, target))
    assert "noalias" in _wrapper(plain_flipped, "aa_shape") and "noalias" not in _wrapper(split_flipped, "aa_shape")
    # both run from the one module
    x, y = np.arange(256, dtype="float32"), np.ones(256, dtype="float32")
    out = tvm.runtime.tensor(np.zeros(256, dtype="float32"))
    split["axpy"](tvm.runtime.tensor(x), tvm.runtime.tensor(y), out)
    np.testing.assert_array_equal(out.numpy(), 2 * x + y)
    h = tvm.runtime.tensor(np.array([7, 0], dtype="int64"))
    split.get_function("zz_shape", query_imports=True)(h)
    assert h.numpy().tolist() == [7, 21]


def test_an_exported_executable_links_both_modules(tmp_path):
    """relax.build under the backend's compile context: one lib.so with the kernel's compute
    function and the function without noalias beside it, and the VM runs both."""

    @tvm.script.ir_module
    class Module:
        @T.prim_func(private=True, s_tir=True)
        def scale(x: T.handle, out: T.handle):
            T.func_attr({"tirx.noalias": True})
            n = T.int64()
            X = T.match_buffer(x, (n,), "float32")
            O = T.match_buffer(out, (n,), "float32")
            for i in range(n):
                with T.sblock("scale"):
                    v = T.axis.spatial(n, i)
                    O[v] = X[v] * T.float32(3)

        @T.prim_func(private=True, s_tir=True)
        def zz_offset(x: T.handle, out: T.handle):
            n = T.int64()
            X = T.match_buffer(x, (n,), "float32")
            O = T.match_buffer(out, (n,), "float32")
            for i in range(n):
                with T.sblock("offset"):
                    v = T.axis.spatial(n, i)
                    O[v] = X[v] + T.float32(1)

        @R.function
        def main(x: R.Tensor(("n",), "float32")):
            n = T.int64()
            cls = Module
            y = R.call_tir(cls.scale, (x,), out_ty=R.Tensor((n,), "float32"))
            z = R.call_tir(cls.zz_offset, (y,), out_ty=R.Tensor((n,), "float32"))
            return z

    target = tvm.target.Target("llvm")
    with target, llvm.compile_context(None):
        executable = relax.build(Module, target)
    exported = llvm.export(executable, target, tmp_path)
    path = tmp_path / exported[0]
    symbols = {s.name for s in Elf(path.read_bytes()).functions()}
    assert {"scale_compute_", "__tvm_ffi_zz_offset"} <= symbols, sorted(symbols)
    vm = relax.VirtualMachine(tvm.runtime.load_module(str(path)), tvm.cpu())
    x = np.arange(37, dtype="float32")
    np.testing.assert_array_equal(vm["main"](tvm.runtime.tensor(x)).numpy(), 3 * x + 1)

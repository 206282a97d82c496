"""CanonicalShapeFuncs: the same lowered model gives the same shape functions whatever order
VMShapeLower wrote their stores in (the cause of llvm libraries differing between builds)."""

from __future__ import annotations

import pytest
import tvm
from tvm import relax, tirx
from tvm.relax.expr_functor import PyExprMutator, PyExprVisitor, mutator, visitor
from tvm.script import tirx as T

from mlcpipe.build import export_model
from mlcpipe.passes import phase_passes
from mlcpipe.passes.shape_funcs import CanonicalShapeFuncs, order_stores
from mlcpipe.targets import load_target
from mlcpipe.schedules import schedule_pass
from mlcpipe.quantization import quantization


@pytest.fixture(scope="module")
def before_canonical(tiny_config):
    """The tiny q4f16_1 model lowered for llvm up to (not including) CanonicalShapeFuncs."""
    target = load_target("llvm").tvm_target()
    mod, _ = export_model(tiny_config, quantization("q4f16_1"), target)
    with target:
        for _name, passes in phase_passes(schedule_pass("llvm")):
            if CanonicalShapeFuncs in passes:
                passes = passes[: passes.index(CanonicalShapeFuncs)]
            mod = tvm.transform.Sequential(passes)(mod)
    return mod


def _shape_funcs(mod):
    return {gv.name_hint: f for gv, f in mod.functions_items() if gv.name_hint.startswith("shape_func")}


def _callees(func) -> set[str]:
    names: set[str] = set()

    @visitor
    class _Calls(PyExprVisitor):
        def visit_global_var_(self, op):
            names.add(op.name_hint)

    _Calls().visit_expr(func)
    return names


def _stores(func):
    return list(func.body.seq) if isinstance(func.body, tirx.SeqStmt) else [func.body]


def _reversed_stores(mod):
    """What another process's VMShapeLower may write: every shape function's stores reversed, and
    one Relax function calling a second copy of a shared shape function (not merged)."""
    funcs = _shape_funcs(mod)
    multi = [name for name, f in funcs.items() if len(_stores(f)) > 1]
    assert multi, "the tiny model has no shape function with two stores"
    out = tvm.IRModule({gv: (f.with_body(tirx.SeqStmt(_stores(f)[::-1])) if gv.name_hint in multi else f)
                        for gv, f in mod.functions_items()}, attrs=mod.attrs)
    builder = relax.BlockBuilder(out)
    users = {name: [gv.name_hint for gv, f in sorted(out.functions_items(), key=lambda i: i[0].name_hint)
                    if isinstance(f, relax.Function) and name in _callees(f)] for name in multi}
    victim = max(multi, key=lambda name: len(users[name]))  # shared by batch_decode and batch_verify when VMShapeLower merged them
    copy = builder.add_func(mod[victim], "shape_func_copy")  # stores in the first order: not equal to the reversed one

    @mutator
    class _Redirect(PyExprMutator):
        def visit_global_var_(self, op):
            return copy if op.name_hint == victim else op

    user = builder.get().get_global_var(users[victim][-1])
    builder.update_func(user, _Redirect(builder.get()).visit_expr(builder.get()[user]))
    return builder.get(), victim


def test_store_order_and_duplicates_do_not_change_the_module(before_canonical):
    shuffled, victim = _reversed_stores(before_canonical)
    assert len(_shape_funcs(shuffled)) == len(_shape_funcs(before_canonical)) + 1
    a, b = CanonicalShapeFuncs(before_canonical), CanonicalShapeFuncs(shuffled)
    names = sorted(_shape_funcs(a))
    assert names == sorted(_shape_funcs(b))
    assert names == sorted(["shape_func"] + [f"shape_func{i}" for i in range(1, len(names))])
    for gv, func in a.functions_items():
        if isinstance(func, relax.Function) or gv.name_hint.startswith("shape_func"):
            tvm.ir.assert_structural_equal(func, b[gv.name_hint], map_free_vars=True)
    # no two shape functions left equal (the copy was merged back)
    funcs = list(_shape_funcs(a).values())
    for i, f in enumerate(funcs):
        for g in funcs[i + 1:]:
            with pytest.raises(ValueError):
                tvm.ir.assert_structural_equal(f, g, map_free_vars=True)


@T.prim_func(private=True)
def _dependent(H: T.Buffer((6,), "int64")):
    H[5] = H[0] * T.int64(3)
    H[4] = H[0] * T.int64(2)
    H[1] = H[4] * T.int64(7)  # reads slot 4: must stay after it
    H[2] = H[0] + T.int64(1)


def test_stores_keep_their_dependencies():
    slots = [s.indices[0].value for s in _stores(order_stores(_dependent))]
    assert slots == [2, 4, 1, 5]

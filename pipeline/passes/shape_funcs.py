"""CanonicalShapeFuncs: the host shape functions VMShapeLower writes, made the same on every build.

VMShapeLower emits a shape function's stores in an order that changes between processes, so
two equal functions are sometimes not merged and their names shift: two builds of the same
model gave different libraries. After it, this pass orders each function's stores (dependencies
first, then by heap slot), merges equal functions and names them shape_func, shape_func1, .. in order of
first use (Relax functions by name). Run it before AttachGlobalSymbol.
"""

from __future__ import annotations

import tvm
import tvm_ffi
from tvm import relax, tirx
from tvm.ir.expr import TensorLoad
from tvm.relax.expr_functor import PyExprMutator, PyExprVisitor, mutator, visitor

PREFIX = "shape_func"


def _slot(index) -> int | None:
    return int(index.value) if isinstance(index, tirx.IntImm) else None


def _reads(expr, heap) -> set[int] | None:
    """Heap slots the expression loads; None if it holds a node this pass does not know."""
    if isinstance(expr, TensorLoad):  # TVM 0.27's buffer load; its source is the buffer
        slot = _slot(expr.indices[0]) if len(expr.indices) == 1 else None
        return {slot} if expr.source.same_as(heap) and slot is not None else None
    if isinstance(expr, (tirx.IntImm, tirx.FloatImm, tirx.Var)):
        return set()
    if isinstance(expr, tirx.Cast):
        return _reads(expr.value, heap)
    if hasattr(expr, "a") and hasattr(expr, "b"):  # binary arithmetic and comparisons
        a, b = _reads(expr.a, heap), _reads(expr.b, heap)
        return None if a is None or b is None else a | b
    return None


def order_stores(func: tirx.PrimFunc) -> tirx.PrimFunc:
    """The function with its heap stores in a fixed order (unchanged if its body is anything else)."""
    body = func.body
    stores = list(body.seq) if isinstance(body, tirx.SeqStmt) else [body]
    if not stores or not all(isinstance(s, tirx.BufferStore) and len(s.indices) == 1 and _slot(s.indices[0]) is not None for s in stores):
        return func
    heap = stores[0].buffer
    if any(not s.buffer.same_as(heap) for s in stores):
        return func
    written = {_slot(s.indices[0]) for s in stores}
    reads = [_reads(s.value, heap) for s in stores]
    if any(r is None for r in reads) or len(written) != len(stores):
        return func
    pending = [(_slot(s.indices[0]), r & written, s) for s, r in zip(stores, reads)]
    done: set[int] = set()
    order = []
    while pending:
        ready = [p for p in pending if p[1] <= done]
        if not ready:  # a cycle cannot come from VMShapeLower; keep what it wrote
            return func
        slot, _, store = min(ready, key=lambda p: p[0])
        order.append(store)
        done.add(slot)
        pending = [p for p in pending if p[2] is not store]
    return func.with_body(tirx.SeqStmt(order) if len(order) > 1 else order[0])


def _same(a: tirx.PrimFunc, b: tirx.PrimFunc) -> bool:
    return tvm_ffi.structural_equal(a, b, map_free_vars=True)


def _uses(mod: tvm.IRModule, shape_vars: set[str]) -> list[str]:
    """Shape-function names in order of first use, Relax functions taken by name."""
    seen: list[str] = []

    @visitor
    class _Calls(PyExprVisitor):
        def visit_global_var_(self, op: relax.GlobalVar) -> None:
            if op.name_hint in shape_vars and op.name_hint not in seen:
                seen.append(op.name_hint)

    for gv, func in sorted(mod.functions_items(), key=lambda item: item[0].name_hint):
        if isinstance(func, relax.Function):
            _Calls().visit_expr(func)
    return seen


@tvm.transform.module_pass(opt_level=0, name="mlcpipe.CanonicalShapeFuncs")
def CanonicalShapeFuncs(mod: tvm.IRModule, _ctx) -> tvm.IRModule:  # noqa: N802 (a pass)
    shape = {gv.name_hint: order_stores(f) for gv, f in mod.functions_items()
             if isinstance(f, tirx.PrimFunc) and gv.name_hint.startswith(PREFIX) and f.attrs and f.attrs.get("tirx.is_host_func")}
    if not shape:
        return mod
    kept: list[tuple[str, tirx.PrimFunc]] = []  # (new name, function), in order of first use
    rename: dict[str, str] = {}
    for name in _uses(mod, set(shape)):
        twin = next((new for new, f in kept if _same(f, shape[name])), None)
        if twin is None:
            twin = PREFIX + (str(len(kept)) if kept else "")
            kept.append((twin, shape[name]))
        rename[name] = twin

    @mutator
    class _Rename(PyExprMutator):
        def visit_global_var_(self, op: relax.GlobalVar) -> relax.Expr:
            return new_vars[rename[op.name_hint]] if op.name_hint in rename else op

    base = tvm.IRModule({gv: f for gv, f in mod.functions_items() if gv.name_hint not in shape}, attrs=mod.attrs)
    builder = relax.BlockBuilder(base)
    new_vars = {new: builder.add_func(func, new) for new, func in kept}  # typed GlobalVars, as calls need
    for gv, func in base.functions_items():
        if isinstance(func, relax.Function):
            builder.update_func(gv, _Rename(builder.get()).visit_expr(func))
    return builder.get()

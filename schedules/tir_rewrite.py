"""Small post-order rewriting of TIR expressions and block bodies.

TVM 0.27's Python API has no stmt_functor (ir_transform / substitute), and schedule primitives
cannot move an *expression* into a block of its own. Rules that need that (llvm/rope.py: hoisting the
cos / sin of RoPE out of the head loop) rewrite block bodies with these helpers. They cover the
node kinds elementwise kernels use; anything else raises `UnsupportedIR`, and the rule declines.
"""

from __future__ import annotations

from collections.abc import Callable

import tvm
from tvm import s_tir, tirx

_BINARY = (
    tirx.Add, tirx.Sub, tirx.Mul, tirx.Div, tirx.Mod, tirx.FloorDiv, tirx.FloorMod, tirx.Min, tirx.Max,
    tirx.EQ, tirx.NE, tirx.LT, tirx.LE, tirx.GT, tirx.GE, tirx.And, tirx.Or,
    tirx.BitwiseAnd, tirx.BitwiseOr, tirx.BitwiseXor, tirx.LShift, tirx.RShift,
)  # fmt: skip
Load = tvm.ir.TensorLoad  # what tirx.BufferLoad(...) builds; `.source` is the buffer
_LEAVES = (tirx.Var, tirx.IntImm, tirx.FloatImm, tvm.ir.StringImm)


class UnsupportedIR(ValueError):
    """A node kind the rewriter does not know."""


def map_expr(expr, fn: Callable):
    """Rebuild `expr` bottom-up; `fn(node)` (children already rewritten) returns a replacement or
    None to keep the node."""

    def visit(e):
        if isinstance(e, _BINARY):
            new = type(e)(visit(e.a), visit(e.b))
        elif isinstance(e, tirx.Cast):
            new = tirx.Cast(e.ty, visit(e.value))
        elif isinstance(e, tirx.Not):
            new = tirx.Not(visit(e.a))
        elif isinstance(e, tirx.BitwiseNot):
            new = tirx.BitwiseNot(visit(e.a))
        elif isinstance(e, tirx.Select):
            new = tirx.Select(visit(e.condition), visit(e.true_value), visit(e.false_value))
        elif isinstance(e, tirx.Let):
            new = tirx.Let(e.var, visit(e.value), visit(e.body))
        elif isinstance(e, tvm.ir.Call):
            new = tvm.ir.Call(e.op, [visit(a) for a in e.args], e.attrs, e.ty_args, None, e.ty)
        elif isinstance(e, Load):
            new = tirx.BufferLoad(e.source, [visit(i) for i in e.indices])
        elif isinstance(e, _LEAVES):
            new = e
        else:
            raise UnsupportedIR(type(e).__name__)
        out = fn(new)
        return new if out is None else out

    return visit(expr)


def map_stmt_exprs(stmt, fn: Callable):
    """`map_expr(., fn)` over every expression of a block body made of stores and ifs."""
    if isinstance(stmt, tirx.BufferStore):
        indices = [map_expr(i, fn) for i in stmt.indices]
        return tirx.BufferStore(stmt.buffer, map_expr(stmt.value, fn), indices)
    if isinstance(stmt, tirx.IfThenElse):
        other = None if stmt.else_case is None else map_stmt_exprs(stmt.else_case, fn)
        return tirx.IfThenElse(map_expr(stmt.condition, fn), map_stmt_exprs(stmt.then_case, fn), other)
    if isinstance(stmt, tirx.SeqStmt):
        return tirx.SeqStmt([map_stmt_exprs(s, fn) for s in stmt.seq])
    if isinstance(stmt, tirx.Evaluate):
        return tirx.Evaluate(map_expr(stmt.value, fn))
    raise UnsupportedIR(type(stmt).__name__)


def substitute(expr, mapping: dict):
    """`expr` with Vars replaced (mapping: Var -> expr, matched by identity)."""
    pairs = list(mapping.items())

    def replace(e):
        if isinstance(e, tirx.Var):
            return next((value for var, value in pairs if var.same_as(e)), None)
        return None

    return map_expr(expr, replace)


def inline_let(node):
    """A `map_expr` callback: a Let becomes its body with the value substituted (post-order: Lets
    inside it are already gone)."""
    return substitute(node.body, {node.var: node.value}) if isinstance(node, tirx.Let) else None


def collect(expr, kind) -> list:
    """Every node of type `kind` in `expr` (post-order, repeats included)."""
    found = []
    map_expr(expr, lambda e: found.append(e) if isinstance(e, kind) else None)
    return found


def map_func_exprs(func: tirx.PrimFunc, fn: Callable) -> tirx.PrimFunc:
    """`func` with `map_expr(., fn)` applied to every stored value of every block (block nests of
    loops, blocks and stores, as unscheduled kernels are); anything else raises UnsupportedIR."""

    def stmt(s):
        if isinstance(s, s_tir.SBlockRealize):
            return s_tir.SBlockRealize(s.iter_values, s.predicate, block(s.block))
        if isinstance(s, tirx.For):
            return tirx.For(s.loop_var, s.min, s.extent, s.kind, stmt(s.body), s.thread_binding, s.annotations)
        if isinstance(s, tirx.SeqStmt):
            return tirx.SeqStmt([stmt(x) for x in s.seq])
        if isinstance(s, tirx.BufferStore):
            return tirx.BufferStore(s.buffer, map_expr(s.value, fn), s.indices)
        raise UnsupportedIR(type(s).__name__)

    def block(b):
        init = None if b.init is None else stmt(b.init)
        return s_tir.SBlock(b.iter_vars, b.reads, b.writes, b.name_hint, stmt(b.body), init, b.alloc_buffers,
                            b.match_buffers, b.annotations)

    return func.with_body(stmt(func.body))


def bind_row_loop(func: tirx.PrimFunc, block: str, threads: int) -> tirx.PrimFunc:
    """`func`, whose root holds one loop over `block`'s rows, with that loop split into workgroups
    of `threads` lanes bound to blockIdx.x / threadIdx.x, a row a lane. Built directly: the
    schedule's `bind` refuses in-place kernels (a block reading and writing one buffer has no
    compact dataflow), though each row touches its own elements."""
    sch = s_tir.Schedule(func)
    (loop,) = sch.get_loops(sch.get_sblock(block))
    sch.split(loop, [None, threads])
    split = sch.mod["main"]
    root = split.body.block
    if not isinstance(root.body, tirx.For) or not isinstance(root.body.body, tirx.For):
        raise UnsupportedIR(type(root.body).__name__)

    def bound(loop, tag, body):
        var = tirx.IterVar(tvm.ir.Range.from_min_extent(loop.min, loop.extent), loop.loop_var, tirx.IterVar.ThreadIndex, tag)
        return tirx.For(loop.loop_var, loop.min, loop.extent, tirx.ForKind.THREAD_BINDING, body, var, loop.annotations)

    outer, inner = root.body, root.body.body
    body = bound(outer, "blockIdx.x", bound(inner, "threadIdx.x", inner.body))
    new_root = s_tir.SBlock(root.iter_vars, root.reads, root.writes, root.name_hint, body, root.init, root.alloc_buffers,
                            root.match_buffers, root.annotations)
    return split.with_body(s_tir.SBlockRealize(split.body.iter_values, split.body.predicate, new_root))


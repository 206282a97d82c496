"""Recognise `[dequantize ->] NT_matmul [-> epilogue...]` PrimFuncs and rebuild them in TE.

The fast CPU kernels compute the same function with a different algorithm (e.g. the q4 GEMV
sums activation x nibble first and applies each group's scale once), so their rules do not
transform the original loop nest: they match its structure exactly, then build a new PrimFunc
with the same parameters (order, shapes, dtypes) whose matmul part is theirs and whose epilogue
(cast, residual add, ...) is the original one, translated block by block.

Matched shapes (MLC's formats, see pipeline/quantization/group_quant.py):
  dequantize  D[n, k] = (cast(dt, (W[n, k // 8] >> cast(u32, k % 8 * 4)) & 15) - 7) * S[n, k // G]
  NT_matmul   C[..., n] += cast(f32, X[..., k]) * cast(f32, D[n, k])   (casts absent for f32)
  epilogues   elementwise blocks reading C (and other parameters), writing the next tensor.
Anything else returns None, so the rule declines.
"""

from __future__ import annotations

import dataclasses

from tvm import s_tir, te, tirx
from tvm.ir.expr import TensorLoad
from tvm.s_tir import dlight as dl
from tvm.tirx import expr as E

from ..analysis import root_blocks


@dataclasses.dataclass
class DequantMatmul:
    func: tirx.PrimFunc
    x: tirx.Var  # activation parameter [..., K]
    weight: tirx.Var  # uint32 [N, K/8] (q4) or float [N, K] (unquantized)
    scale: tirx.Var | None  # [N, K/G] for q4
    group_size: int  # G (0 when unquantized)
    n: int
    k: int
    matmul_buffer: tirx.Var  # the f32 accumulator the epilogue reads
    epilogue: list  # SBlock statements after the matmul, in order

    @property
    def quantized(self) -> bool:
        return self.scale is not None

    @property
    def rows_shape(self) -> list:
        """The activation's leading dims (e.g. [1, 1] for decode, [1, seq_len] for prefill)."""
        return list(self.x.shape[:-1])

    def placeholders(self) -> list[te.Tensor]:
        return [te.placeholder(list(p.shape), str(p.dtype), name=p.name) for p in self.func.params]

    def param_index(self, var: tirx.Var) -> int:
        return [p.same_as(var) for p in self.func.params].index(True)

    def finish(self, inputs: list[te.Tensor], matmul: te.Tensor, padded: bool = False) -> tirx.PrimFunc:
        """PrimFunc(params of `func`) = epilogue(matmul); `matmul` is the new f32 [..., N] result
        (`padded`: it may have more rows than the output; they are dropped)."""
        params = list(self.func.params)
        known = list(zip(params[:-1], inputs[:-1])) + [(self.matmul_buffer, matmul)]
        last = matmul
        if padded and not self.epilogue:
            last = te.compute(list(params[-1].shape), lambda *i: matmul(*i), name="rows")
        for stmt in self.epilogue:
            last = _translate_block(stmt, known)
            known.append((stmt.body.buffer, last))
        args = list(inputs[:-1]) + [last]
        new = te.create_prim_func(args)
        new = new.without_attr("global_symbol")
        for key, value in self.func.attrs.items():
            new = new.with_attr(key, value)
        return new


def _const(expr) -> int | None:
    return int(expr.value) if isinstance(expr, tirx.IntImm) else None


def _name(var) -> str:
    return var.name if hasattr(var, "name") else str(var)


def _param_named(func: tirx.PrimFunc, var) -> tirx.Var | None:
    for p in func.params:
        if p.same_as(var):
            return p
    return None


def _loads(expr) -> list:
    """(source Var, indices) of every tensor load in `expr`, in order of appearance."""
    found: list = []

    def visit(e):
        if isinstance(e, TensorLoad):
            found.append((e.source, list(e.indices)))
            return
        for field in ("a", "b", "value"):
            if hasattr(e, field) and not isinstance(e, (tirx.IntImm, tirx.FloatImm)):
                visit(getattr(e, field))
        if hasattr(e, "args"):
            for arg in e.args:
                visit(arg)

    visit(expr)
    return found


def _dequant_text(v_i: str, v_j: str, weight: str, scale: str, group: int, dtype: str) -> str:
    return (
        f'(T.Cast("{dtype}", {weight}[{v_i}, {v_j} // T.int64(8)] >> T.Cast("uint32", {v_j} % T.int64(8) * T.int64(4))'
        f' & T.uint32(15)) - T.{dtype}(7.0)) * {scale}[{v_i}, {v_j} // T.int64({group})]'
    )


def match(func: tirx.PrimFunc) -> DequantMatmul | None:
    """The structure of `func` if it is a (dequantize ->) NT_matmul (-> epilogue) kernel."""
    found = root_blocks(func)
    if found is None:
        return None
    sch, blocks = found
    stmts = [sch.get(b) for b in blocks]
    if not stmts or any(not isinstance(s.body, tirx.BufferStore) for s in stmts):
        return None
    for block, stmt in zip(blocks, stmts):
        if len(sch.get_loops(block)) != len(stmt.iter_vars):
            return None
    reductions = [i for i, s in enumerate(stmts) if any(iv.iter_type == tirx.IterVar.CommReduce for iv in s.iter_vars)]
    if len(reductions) != 1 or reductions[0] > 1:
        return None
    pos = reductions[0]
    producers, mm, consumers = stmts[:pos], stmts[pos], stmts[pos + 1 :]
    # --- the matmul: C[s..., n] = C[s..., n] + cast(X[s..., k]) * cast(B[n, k])
    kinds = [iv.iter_type for iv in mm.iter_vars]
    if kinds[-1] != tirx.IterVar.CommReduce or kinds.count(tirx.IterVar.CommReduce) != 1:
        return None
    names = [_name(iv.var) for iv in mm.iter_vars]
    spatial, kname = names[:-1], names[-1]
    store = mm.body
    if str(_dtype_of(store.buffer)) != "float32":
        return None
    loads = _loads(store.value)
    if len(loads) != 3:
        return None
    (c_src, _), (x_src, _), (b_src, _) = loads
    acc = f"{_name(store.buffer)}[{', '.join(spatial)}]"
    x_ref = f"{_name(x_src)}[{', '.join(spatial[:-1] + [kname])}]"
    b_ref = f"{_name(b_src)}[{spatial[-1]}, {kname}]"
    text = store.value.script()
    plain = f"{acc} + {x_ref} * {b_ref}"
    cast = f'{acc} + T.Cast("float32", {x_ref}) * T.Cast("float32", {b_ref})'
    if text not in (plain, cast) or not c_src.same_as(store.buffer):
        return None
    x_param = _param_named(func, x_src)
    n, k = (_const(d) for d in b_src.shape)
    if x_param is None or n is None or k is None:
        return None
    for stmt in consumers:
        if any(iv.iter_type != tirx.IterVar.DataPar for iv in stmt.iter_vars):
            return None
        if [str(i) for i in stmt.body.indices] != [_name(iv.var) for iv in stmt.iter_vars]:
            return None
    final = consumers[-1].body.buffer if consumers else store.buffer
    if not func.params[-1].same_as(final):
        return None
    if not producers:
        weight = _param_named(func, b_src)
        if weight is None:
            return None
        return DequantMatmul(func, x_param, weight, None, 0, n, k, store.buffer, consumers)
    deq = producers[0]
    if not deq.body.buffer.same_as(b_src) or len(deq.iter_vars) != 2:
        return None
    dq_loads = _loads(deq.body.value)
    if len(dq_loads) != 2:
        return None
    (w_src, _), (s_src, _) = dq_loads
    weight, scale = _param_named(func, w_src), _param_named(func, s_src)
    if weight is None or scale is None or str(weight.dtype) != "uint32":
        return None
    groups = _const(scale.shape[1])
    if groups is None or k % groups or _const(weight.shape[1]) != k // 8:
        return None
    group = k // groups
    dtype = str(_dtype_of(deq.body.buffer))
    v_i, v_j = (_name(iv.var) for iv in deq.iter_vars)
    if deq.body.value.script() != _dequant_text(v_i, v_j, _name(weight), _name(scale), group, dtype):
        return None
    return DequantMatmul(func, x_param, weight, scale, group, n, k, store.buffer, consumers)


def _dtype_of(var) -> str:
    return str(var.dtype)


_BINARY = tuple(getattr(E, n) for n in ("Add", "Sub", "Mul", "Div", "FloorDiv", "FloorMod", "Min", "Max"))


def _rebuild(expr, vmap: dict, tensors: list):
    if isinstance(expr, TensorLoad):
        for var, tensor in tensors:
            if var.same_as(expr.source):
                return tensor(*[_rebuild(i, vmap, tensors) for i in expr.indices])
        raise ValueError(f"epilogue reads {_name(expr.source)}, which is neither a parameter nor computed")
    if isinstance(expr, (tirx.IntImm, tirx.FloatImm)):
        return expr
    if isinstance(expr, tirx.Var):
        for var, value in vmap:
            if var.same_as(expr):
                return value
        return expr
    if isinstance(expr, E.Cast):
        return E.Cast(str(expr.ty), _rebuild(expr.value, vmap, tensors))
    if isinstance(expr, _BINARY):
        return type(expr)(_rebuild(expr.a, vmap, tensors), _rebuild(expr.b, vmap, tensors))
    raise ValueError(f"epilogue expression {type(expr).__name__} not supported")


def _translate_block(stmt, tensors: list) -> te.Tensor:
    store = stmt.body
    ivs = [iv.var for iv in stmt.iter_vars]

    def fcompute(*idx):
        return _rebuild(store.value, list(zip(ivs, idx)), tensors)

    return te.compute(list(store.buffer.shape), fcompute, name=_name(store.buffer))


def rows_extent(info: DequantMatmul) -> int | None:
    """Product of the activation's leading dims when static (the M of the matmul)."""
    total = 1
    for dim in info.rows_shape:
        value = _const(dim)
        if value is None:
            return None
        total *= value
    return total



def match_on_cpu(func, target, decode: bool) -> DequantMatmul | None:
    """`match(func)` for an llvm target, restricted to one activation row (decode) or several."""
    if not isinstance(func, tirx.PrimFunc) or target.kind.name != "llvm":
        return None
    info = match(func)
    if info is None or (rows_extent(info) == 1) != decode:
        return None
    return info


def blocks_after(sch: s_tir.Schedule, block) -> list:
    """The root-level blocks that follow `block` (the epilogue of a rebuilt kernel)."""
    blocks = sch.get_child_blocks(dl.analysis.get_root_block(sch))
    names = [sch.get(b).name_hint for b in blocks]
    return blocks[names.index(sch.get(block).name_hint) + 1 :]


def schedule_extern_epilogue(sch: s_tir.Schedule, extern: str, lanes: int = 16) -> s_tir.Schedule:
    """After a rebuilt kernel's extern block `extern` (flat C buffer): the copy-out block inlined
    into the epilogue (C read straight from the kernel's buffer), each remaining epilogue block's
    loops fused and parallel, its innermost loop vectorized by `lanes`."""
    epilogue = blocks_after(sch, sch.get_sblock(extern))
    if len(epilogue) > 1:
        sch.compute_inline(epilogue[0])
        epilogue = epilogue[1:]
    for block in epilogue:
        loops = sch.get_loops(block)
        sch.parallel(sch.fuse(*loops[:-1]))
        sch.vectorize(sch.split(loops[-1], [None, lanes])[1])
    return sch

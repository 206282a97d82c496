"""Fuse each `dequantize*` call_tir into the `NT_matmul*` call_tir that consumes it.

Plain FuseOps never fuses an injective producer into a reduction, so after FuseOps/FuseTIR a
quantized linear is still two kernels (dequantize, then fused_NT_matmul..._add). This pass
matches call_tir(dequantize*) -> call_tir(*NT_matmul*) with up to `_MAX_EPILOGUE_ARGS` extra
epilogue inputs (residual add, ...) and merges the pair into one PrimFunc named
`fused_dequantizeN_NT_matmulM[_epilogue]`, as MLC-LLM's FuseDequantizeMatmulEwise does.
"""

from __future__ import annotations

import tvm
from tvm import relax
from tvm.relax.dpl import GlobalVarPattern, TuplePattern, is_op, wildcard

_MAX_EPILOGUE_ARGS = 3


def _callee_name(call) -> str:
    if isinstance(call, relax.Call) and isinstance(call.args[0], relax.GlobalVar):
        return call.args[0].name_hint
    return ""


def _pattern(n_weight_args: int, n_epilogue_args: int):
    weight = is_op("relax.call_tir")(
        GlobalVarPattern(), TuplePattern([wildcard() for _ in range(n_weight_args)]), add_constraint=False
    )
    matmul = is_op("relax.call_tir")(
        GlobalVarPattern(),
        TuplePattern([wildcard(), weight] + [wildcard() for _ in range(n_epilogue_args)]),
        add_constraint=False,
    )

    def check(ctx: relax.transform.PatternCheckContext) -> bool:
        w_name = _callee_name(ctx.annotated_expr["w"])
        m_name = _callee_name(ctx.annotated_expr["matmul"])
        return w_name.startswith("dequantize") and "NT_matmul" in m_name

    return matmul, {"w": weight, "matmul": matmul}, check


@tvm.transform.module_pass(opt_level=0, name="FuseDequantizeMatmul")
class FuseDequantizeMatmul:  # pylint: disable=too-few-public-methods
    def transform_module(self, mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
        passes = []
        for n_epilogue in range(_MAX_EPILOGUE_ARGS + 1):
            for n_weight_args in (2, 1, 3):
                pattern, annotations, check = _pattern(n_weight_args, n_epilogue)
                passes.append(
                    relax.transform.FuseOpsByPattern(
                        [("dequantize_matmul", pattern, annotations, check)]
                    )
                )
        passes.append(relax.transform.FuseTIR())
        return drop_inner_fused_prefix(tvm.transform.Sequential(passes)(mod))


@relax.expr_functor.mutator
class _GlobalVarRenamer(relax.PyExprMutator):
    def __init__(self, mod: tvm.IRModule, new_vars: dict):
        super().__init__(mod)
        self.new_vars = new_vars

    def visit_global_var_(self, op: relax.GlobalVar) -> relax.Expr:  # pylint: disable=arguments-renamed
        return self.new_vars.get(op, op)


def drop_inner_fused_prefix(mod: tvm.IRModule) -> tvm.IRModule:
    """`fused_dequantize1_fused_NT_matmul1_add` -> `fused_dequantize1_NT_matmul1_add`."""
    renames = {
        gv: gv.name_hint.replace("_fused_", "_", 1)
        for gv, func in mod.functions_items()
        if isinstance(func, tvm.tirx.PrimFunc)
        and gv.name_hint.startswith("fused_dequantize")
        and "_fused_" in gv.name_hint
    }
    if not renames:
        return mod
    kept = tvm.IRModule({gv: f for gv, f in mod.functions_items() if gv not in renames}, attrs=mod.attrs)
    builder = relax.BlockBuilder(kept)
    new_vars = {old: builder.add_func(mod[old], new_name) for old, new_name in renames.items()}
    staged = builder.get()
    renamer = _GlobalVarRenamer(staged, new_vars)
    out = tvm.IRModule(attrs=mod.attrs)
    for gv, func in staged.functions_items():
        out[gv] = renamer.visit_expr(func) if isinstance(func, relax.Function) else func
    return out

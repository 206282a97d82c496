"""Kernel metadata read from the IR: the role each kernel plays (pipeline/roles.py), its launch
grid/block, which kernels the paged KV cache carries, and each kernel's signature (what the run
side's kernel_inputs builds inputs from; random_args / kernel_args / symbolic_dims here take a
PrimFunc).

Weight-consuming kernels are identified from the Relax graph: the parameter a call_tir reads
tells the role exactly. The rest are classified by their (TVM-given) names.
"""

from __future__ import annotations

import re

import tvm
from tvm import relax

from . import kernel_inputs
from .model.sampler_spec import SAMPLER_ATTR
from .roles import ROLES, role_by_name, role_of_param


def kernel_roles(mod: tvm.IRModule, param_names: list[str]) -> dict[str, str]:
    """kernel name -> role, for every PrimFunc of `mod` (a module after FuseTIR)."""
    roles: dict[str, str] = {}
    for _, func in mod.functions_items():
        if not isinstance(func, relax.Function) or not func.params:
            continue
        packed = func.params[-1]
        from_param: dict[relax.Var, str] = {}
        for block in func.body.blocks:
            for binding in block.bindings:
                value = binding.value
                if isinstance(value, relax.TupleGetItem) and value.tuple_value.same_as(packed):
                    from_param[binding.var] = param_names[value.index]
                elif isinstance(value, relax.Call) and value.op.same_as(tvm.ir.Op.get("relax.call_tir")):
                    kernel = value.args[0].name_hint
                    params = [from_param[a] for a in value.args[1].fields if a in from_param]
                    if params:
                        roles[kernel] = role_of_param(params[0], kernel)
    for gv, func in mod.functions_items():
        if isinstance(func, tvm.tirx.PrimFunc) and gv.name_hint not in roles:
            roles[gv.name_hint] = role_by_name(gv.name_hint)
    return roles


_THREAD_BINDING = re.compile(r'T\.thread_binding\((.*?), thread="((?:blockIdx|threadIdx)\.[xyz])"')


def launch_config(mod: tvm.IRModule) -> dict[str, dict[str, list[str]]]:
    """kernel name -> {"grid": [x, y, z], "block": [x, y, z]} from the scheduled TIR's thread
    bindings (extents as TIR expressions, symbolic where a dim is). CPU kernels are left out."""
    out = {}
    for gv, func in mod.functions_items():
        if not isinstance(func, tvm.tirx.PrimFunc):
            continue
        extents: dict[str, str] = {}
        for extent, tag in _THREAD_BINDING.findall(func.script()):
            extents.setdefault(tag, re.sub(r"T\.int(?:32|64)\((\w+)\)", r"\1", extent.split(", ")[-1]))
        if extents:
            out[gv.name_hint] = {
                "grid": [extents.get(f"blockIdx.{a}", "1") for a in "xyz"],
                "block": [extents.get(f"threadIdx.{a}", "1") for a in "xyz"],
            }
    return out




def kv_cache_kernel_slots(mod: tvm.IRModule) -> list:
    """Kernel names at each argument of the paged KV cache's create call (None where an argument
    is no kernel, a list for tuples): the profiler wraps these to time kernels that run inside
    the KV cache, invisible to the VM's instrument."""
    slots: list = []

    def visit(expr):
        if (
            not slots
            and isinstance(expr, relax.Call)
            and expr.args
            and isinstance(expr.args[0], relax.ExternFunc)
            and expr.args[0].global_symbol == kernel_inputs.KV_CACHE_CREATE
        ):
            for arg in expr.args[1:]:
                if isinstance(arg, relax.GlobalVar):
                    slots.append(arg.name_hint)
                elif isinstance(arg, relax.Tuple):
                    slots.append([f.name_hint if isinstance(f, relax.GlobalVar) else None for f in arg.fields])
                else:
                    slots.append(None)

    for _, func in mod.functions_items():
        if isinstance(func, relax.Function):
            relax.analysis.post_order_visit(func.body, visit)
    return slots


# ---- signatures -----------------------------------------------------------------------------------

_DIM_OPS = {"Add": "add", "Sub": "sub", "Mul": "mul", "FloorDiv": "floordiv", "FloorMod": "floormod",
            "Div": "div", "Mod": "mod", "Min": "min", "Max": "max"}


def dim_record(dim) -> int | dict:
    """A shape dim as kernel_inputs evaluates it (int, {"var"}, {"op", "args"})."""
    if isinstance(dim, int | tvm.tirx.IntImm):
        return int(dim)
    if isinstance(dim, tvm.tirx.Var):
        return {"var": dim.name}
    if isinstance(dim, tvm.tirx.Cast):
        return {"op": "cast", "args": [dim_record(dim.value)]}
    op = _DIM_OPS.get(type(dim).__name__)
    if op is None:
        raise ValueError(f"shape dim {dim} ({type(dim).__name__}): not an expression a signature can record")
    return {"op": op, "args": [dim_record(dim.a), dim_record(dim.b)]}


def signature_of(func: tvm.tirx.PrimFunc) -> dict:
    """The kernel's parameters (name, dtype, shape; shape None for a scalar) and, for a sampler
    kernel, its SAMPLER_ATTR."""
    params = []
    for param in func.params:
        try:
            shape = [dim_record(d) for d in param.shape]
            params.append({"name": param.name, "dtype": str(param.dtype), "shape": shape})
        except AttributeError:  # a scalar parameter
            params.append({"name": param.name, "dtype": str(param.ty), "shape": None})
    sampler = None
    if func.attrs is not None and SAMPLER_ATTR in func.attrs:
        sampler = {str(k): (str(v) if str(k) == "kind" else int(v)) for k, v in func.attrs[SAMPLER_ATTR].items()}
    return {"params": params, "sampler": sampler}


def is_thread_bound(func: tvm.tirx.PrimFunc) -> bool:
    """Whether the kernel binds GPU threads (it cannot run on the CPU)."""
    script = func.script()
    return "thread_binding" in script or "launch_thread" in script


def random_args(func: tvm.tirx.PrimFunc, sizes: dict[str, int], seed: int = 0):
    return kernel_inputs.random_args(signature_of(func), sizes, seed)


def kernel_args(func: tvm.tirx.PrimFunc, n: int, seed: int = 0, heads: dict[str, int] | None = None):
    return kernel_inputs.kernel_args(signature_of(func), n, seed, heads)


def symbolic_dims(func: tvm.tirx.PrimFunc) -> list[str]:
    return kernel_inputs.symbolic_dims(signature_of(func))

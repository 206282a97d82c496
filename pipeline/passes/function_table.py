"""MLC-LLM's model-library function table: the entries that are not model code.

- `add_kv_cache_alias(mod)`: `create_tir_paged_kv_cache` (MLC-LLM's and WebLLM's name) beside our
  `create_paged_kv_cache`, both calling the same kernels;
- `DeferBatchedFunctions` / `RestoreBatchedFunctions`: the batched functions are lowered last, so
  every kernel keeps the name and `seq_len` dims it has without them;
- `AttachMetadata(metadata)`: `_metadata` (MLC's model metadata JSON) with each function's
  intermediate memory, symbolic sizes counted at their bounds. Details: docs/model.md.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import tvm
from tvm import relax, tirx
from tvm.sym import Analyzer

KV_CACHE_CREATE_FUNC = "create_paged_kv_cache"
MLC_KV_CACHE_CREATE_FUNC = "create_tir_paged_kv_cache"
METADATA_FUNC = "_metadata"
# In the order they are lowered, after every other function: batch_verify's kernels all have
# `seq_len` rows (its logits of every row included), so it names the kernels the others share.
BATCHED_FUNCS = ("batch_verify", "batch_prefill", "batch_decode")
_DEFERRED = {name: f"zz{i}_{name}" for i, name in enumerate(BATCHED_FUNCS)}  # sort after the rest
# MLC-LLM's compile-time default batch bound (`max_batch_size` of its generated model configs)
DEFAULT_MAX_BATCH_SIZE = 80


def add_kv_cache_alias(mod: tvm.IRModule) -> tvm.IRModule:
    """`mod` with `create_tir_paged_kv_cache`: a copy (fresh variables) of `create_paged_kv_cache`."""
    names = {gv.name_hint: gv for gv in mod.get_global_vars()}
    if KV_CACHE_CREATE_FUNC not in names or MLC_KV_CACHE_CREATE_FUNC in names:
        return mod
    func = relax.utils.copy_with_new_vars(mod[names[KV_CACHE_CREATE_FUNC]])
    if func.attrs is not None and "global_symbol" in func.attrs:
        func = func.with_attr("global_symbol", MLC_KV_CACHE_CREATE_FUNC)
    mod = mod.clone()
    mod[MLC_KV_CACHE_CREATE_FUNC] = func
    return mod


def _renamed(mod: tvm.IRModule, names: Mapping[str, str]) -> tvm.IRModule:
    """`mod` with the Relax functions `names` maps renamed (GlobalVar and global_symbol), moved
    to the end of the module. They must be entry points: nothing in the module calls them."""
    kept, moved = {}, {}
    for gv, func in mod.functions.items():
        if gv.name_hint in names and isinstance(func, relax.Function):
            new = names[gv.name_hint]
            moved[relax.GlobalVar(new)] = func.with_attr("global_symbol", new)
        else:
            kept[gv] = func
    if not moved:
        return mod
    return tvm.IRModule({**kept, **moved}, attrs=mod.attrs, global_infos=mod.global_infos)


@tvm.transform.module_pass(opt_level=0, name="mlcpipe.DeferBatchedFunctions")
def DeferBatchedFunctions(mod: tvm.IRModule, _ctx) -> tvm.IRModule:  # noqa: N802 (a pass)
    """Rename the batched functions to sort (and sit) after every other function."""
    return _renamed(mod, _DEFERRED)


@tvm.transform.module_pass(opt_level=0, name="mlcpipe.RestoreBatchedFunctions")
def RestoreBatchedFunctions(mod: tvm.IRModule, _ctx) -> tvm.IRModule:  # noqa: N802 (a pass)
    """Give the batched functions their names back (MLC-LLM's)."""
    return _renamed(mod, {deferred: name for name, deferred in _DEFERRED.items()})


def _dtype_bytes(dtype: str) -> int:
    dt = tvm.runtime.DataType(str(dtype))
    return (dt.bits * dt.lanes + 7) // 8


class _MemoryEstimate:
    """Bytes a Relax function allocates for intermediates (after StaticPlanBlockMemory): planned
    storages plus tensors left unplanned (symbolic shapes), symbolic sizes at `bounds`."""

    def __init__(self, bounds: Mapping[str, int]):
        self.bounds = dict(bounds)
        self.alloc_tensor = tvm.ir.Op.get("relax.builtin.alloc_tensor")
        self.alloc_storage = tvm.ir.Op.get("relax.memory.alloc_storage")
        self.unbounded: set[str] = set()  # variables met without a bound (those allocations left out)

    def _value(self, expr) -> int | None:
        if isinstance(expr, tirx.IntImm):
            return int(expr.value)
        free = tirx.analysis.undefined_vars(expr)
        missing = [v.name for v in free if v.name not in self.bounds]
        if missing:
            self.unbounded.update(missing)
            return None
        analyzer = Analyzer()
        for var in free:
            analyzer.bind(var, self.bounds[var.name])
        simplified = analyzer.simplify(expr)
        return int(simplified.value) if isinstance(simplified, tirx.IntImm) else None

    def _bytes(self, call: relax.Call) -> int:
        if call.op.same_as(self.alloc_storage):
            sizes = call.args[0]
            if isinstance(sizes, relax.ShapeExpr) and len(sizes.values) == 1:
                return self._value(sizes.values[0]) or 0
            return 0
        shape, dtype = call.args[0], call.args[1]
        if not isinstance(shape, relax.ShapeExpr):
            return 0
        total = _dtype_bytes(dtype.value)
        for dim in shape.values:
            value = self._value(dim)
            if value is None:
                return 0
            total *= value
        return total

    def run(self, func: relax.Function) -> int:
        # a function's own bounds (MLC-LLM's `tir_var_upper_bound`, e.g. the sampler's num_samples) add to the build's
        own = func.attrs["tir_var_upper_bound"] if func.attrs is not None and "tir_var_upper_bound" in func.attrs else {}
        bounds, self.bounds = self.bounds, {**self.bounds, **{str(k): int(v) for k, v in own.items()}}
        total = 0

        def visit(expr):
            nonlocal total
            if isinstance(expr, relax.Call) and (expr.op.same_as(self.alloc_tensor) or expr.op.same_as(self.alloc_storage)):
                total += self._bytes(expr)

        relax.analysis.post_order_visit(func.body, visit)
        self.bounds = bounds
        return total


def memory_usage(mod: tvm.IRModule, bounds: Mapping[str, int]) -> dict[str, int]:
    """{Relax function name: bytes of intermediate buffers}, sorted by name."""
    estimate = _MemoryEstimate(bounds)
    out = {
        gv.name_hint: estimate.run(func)
        for gv, func in mod.functions_items()
        if isinstance(func, relax.Function) and gv.name_hint != METADATA_FUNC
    }
    return dict(sorted(out.items()))


def metadata_function(text: str) -> relax.Function:
    """A Relax function of no arguments returning the string `text`."""
    bb = relax.BlockBuilder()
    with bb.function(METADATA_FUNC, params=[]):
        bb.emit_func_output(tvm.ir.StringImm(text))
    return bb.finalize()[METADATA_FUNC]


def AttachMetadata(metadata: Mapping[str, Any], bounds: Mapping[str, int]) -> tvm.transform.Pass:  # noqa: N802 (a pass)
    """Module pass adding `_metadata` (JSON of `metadata` + `memory_usage`). `bounds`: symbolic
    variable name -> upper bound, for the memory estimate."""

    @tvm.transform.module_pass(opt_level=0, name="mlcpipe.AttachMetadata")
    def _pass(mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        full = {**metadata, "memory_usage": memory_usage(mod, bounds)}
        mod = mod.clone()
        mod[METADATA_FUNC] = metadata_function(json.dumps(full))
        return mod

    return _pass

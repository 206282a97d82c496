"""A race-free `tir_attention_merge_state` for GPU targets (CUDA, Metal, WebGPU), replacing TVM's.

TVM 0.27's `_merge_state_inplace` (tvm/relax/frontend/nn/llm/_decode_kernels.py) has every thread
of a (token, head) row read S[token, head] and then write the merged log-sum-exp back into it with
no barrier in between: right only when a row's threads run in lockstep, so on WebGPU (lavapipe,
SwiftShader) every prompt chunk after the first gets wrong logits. This is the same kernel (same
launch and parameters, recovered from TVM's) with a workgroup barrier between the reads of S and
its write, and one writer of S per row. No knobs. The race in detail: docs/schedules.md.
"""

from __future__ import annotations

import re

import tvm
from tvm import tirx
from tvm.script import tirx as T

KERNEL_PREFIX = "tir_attention_merge_state"  # and tir_attention_merge_state_mla
_THREAD_BINDING = re.compile(r'T\.thread_binding\((?:[^,()]*, )?(\d+), thread="((?:blockIdx|threadIdx)\.[xyz])"')
_VECTORIZED = re.compile(r"T\.vectorized\((\d+)\)")


def merge_state_inplace(num_heads: int, head_dim: int, v_dtype: str, target: tvm.target.Target, vec_size: int | None = None, bdy: int | None = None) -> tirx.PrimFunc:
    """TVM's `_merge_state_inplace` (same signature, contract and launch) without its race.

    `vec_size` / `bdy` default to TVM's choice (4 lanes; as many heads per block as the target's
    thread limit allows)."""
    VEC_SIZE = vec_size or min(max(8 // 2, head_dim // 32), 4)  # TVM's formula (it assumes 2-byte V)
    bdx = head_dim // VEC_SIZE
    if bdy is None:
        bdy = num_heads
        max_threads = int(target.attrs["max_num_threads"])
        while bdx * bdy > max_threads and bdy > 1:
            bdy //= 2
    assert bdx * VEC_SIZE == head_dim and num_heads % bdy == 0, (num_heads, head_dim, VEC_SIZE, bdy)
    gdy = num_heads // bdy

    @T.prim_func(s_tir=True)
    def merge_state_inplace(v: T.handle, s: T.handle, v_other: T.handle, s_other: T.handle):
        T.func_attr({"tirx.is_scheduled": True})
        N = T.int32()
        H = T.int32()
        D = T.int32()
        V = T.match_buffer(v, (N, H, D), v_dtype)
        S = T.match_buffer(s, (N, H), "float32")
        V_other = T.match_buffer(v_other, (N, H, D), v_dtype)
        S_other = T.match_buffer(s_other, (N, H), "float32")

        for bx in T.thread_binding(N, thread="blockIdx.x"):
            for by in T.thread_binding(gdy, thread="blockIdx.y"):
                for ty in T.thread_binding(bdy, thread="threadIdx.y"):
                    for tx in T.thread_binding(bdx, thread="threadIdx.x"):
                        with T.sblock("merge"):
                            s_val = T.sblock_alloc_buffer((1,), "float32", scope="local")
                            s_other_val = T.sblock_alloc_buffer((1,), "float32", scope="local")
                            s_max = T.sblock_alloc_buffer((1,), "float32", scope="local")
                            scale = T.sblock_alloc_buffer((1,), "float32", scope="local")
                            other_scale = T.sblock_alloc_buffer((1,), "float32", scope="local")
                            v_vec = T.sblock_alloc_buffer((VEC_SIZE,), v_dtype, scope="local")
                            v_other_vec = T.sblock_alloc_buffer((VEC_SIZE,), v_dtype, scope="local")

                            s_val[0] = S[bx, ty + by * bdy]
                            s_other_val[0] = S_other[bx, ty + by * bdy]
                            s_max[0] = T.max(s_val[0], s_other_val[0])
                            s_val[0] = T.exp2(s_val[0] - s_max[0])
                            s_other_val[0] = T.exp2(s_other_val[0] - s_max[0])
                            scale[0] = s_val[0] / (s_val[0] + s_other_val[0])
                            other_scale[0] = s_other_val[0] / (s_val[0] + s_other_val[0])
                            for vec in T.vectorized(VEC_SIZE):
                                v_vec[vec] = V[bx, ty + by * bdy, tx * VEC_SIZE + vec]
                            for vec in T.vectorized(VEC_SIZE):
                                v_other_vec[vec] = V_other[bx, ty + by * bdy, tx * VEC_SIZE + vec]
                            for vec in T.serial(VEC_SIZE):
                                v_vec[vec] = v_vec[vec] * scale[0] + v_other_vec[vec] * other_scale[0]
                            for vec in T.vectorized(VEC_SIZE):
                                V[bx, ty + by * bdy, tx * VEC_SIZE + vec] = v_vec[vec]
                            # every thread of the row has read S[bx, head] before anyone writes it
                            T.tvm_storage_sync("shared")
                            if tx == 0:
                                S[bx, ty + by * bdy] = T.log2(s_val[0] + s_other_val[0]) + s_max[0]

    return merge_state_inplace


def _symbol(func: tirx.PrimFunc) -> str | None:
    attrs = func.attrs
    return str(attrs["global_symbol"]) if attrs is not None and "global_symbol" in attrs else None


def _launch(func: tirx.PrimFunc) -> dict[str, int]:
    out: dict[str, int] = {}
    for extent, tag in _THREAD_BINDING.findall(func.script()):
        out.setdefault(tag, int(extent))
    return out


def _parameters(func: tirx.PrimFunc) -> tuple[int, int, int, int, str] | None:
    """(num_heads, head_dim, vec_size, bdy, v_dtype) of one of TVM's merge kernels, or None if
    it does not have that kernel's shape (4 params, 2-D thread block, static extents)."""
    if len(func.params) != 4:
        return None
    launch = _launch(func)
    vectorized = _VECTORIZED.findall(func.script())
    if not vectorized or not {"blockIdx.y", "threadIdx.x", "threadIdx.y"} <= set(launch):
        return None
    vec = int(vectorized[0])
    bdx, bdy, gdy = launch["threadIdx.x"], launch["threadIdx.y"], launch["blockIdx.y"]
    return gdy * bdy, bdx * vec, vec, bdy, str(func.params[0].dtype)


def replace_merge_state_kernels(mod: tvm.IRModule) -> tuple[tvm.IRModule, list[str]]:
    """Swap TVM's GPU `tir_attention_merge_state*` kernels for the race-free one (same
    parameters, same launch); returns the module and the names replaced. A kernel of that name
    whose shape is not TVM 0.27's is an error: the fix must not silently stop applying."""
    current = tvm.target.Target.current(allow_none=False)
    replaced = []
    for gvar, func in list(mod.functions_items()):
        if not isinstance(func, tirx.PrimFunc) or not (_symbol(func) or "").startswith(KERNEL_PREFIX):
            continue
        if (_symbol(func) or "").endswith("_cpu"):
            continue
        params = _parameters(func)
        if params is None:
            raise RuntimeError(f"{gvar.name_hint}: not the shape of TVM 0.27's _merge_state_inplace; re-check schedules/gpu/merge_state.py")
        num_heads, head_dim, vec, bdy, dtype = params
        target = func.attrs["target"] if "target" in func.attrs else current
        new = merge_state_inplace(num_heads, head_dim, dtype, target, vec_size=vec, bdy=bdy)
        if _launch(new) != _launch(func):
            raise RuntimeError(f"{gvar.name_hint}: launch {_launch(func)} not reproduced ({_launch(new)})")
        new = new.with_attr("global_symbol", _symbol(func))
        if "target" in func.attrs:
            new = new.with_attr("target", func.attrs["target"])
        mod[gvar] = new
        replaced.append(gvar.name_hint)
    return mod, replaced

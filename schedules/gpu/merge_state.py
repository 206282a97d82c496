"""A race-free `tir_attention_merge_state` for GPU targets, replacing TVM's.

TVM bug (apache-tvm 0.27, tvm/relax/frontend/nn/llm/_decode_kernels.py, `_merge_state_inplace`,
lines 455-526): the kernel merges two attention states in place, V, S <- merge(V, S, V_other,
S_other). Each (token, head) row is handled by `bdx = head_dim / 4` threads (threadIdx.x), every
one of which reads S[token, head] (line 497) and then writes the merged log-sum-exp back into
the same S[token, head] (line 521), with no barrier in between. A thread that writes S before
another thread of its row has read it makes that thread merge with the already-merged S: its
V columns and its (last-writer-wins) S come out wrong. The kernel is right only if all `bdx`
threads of a row read S before any of them writes it, i.e. if they run in lockstep in one
warp / SIMD group. WebGPU promises no such thing: Mesa llvmpipe/lavapipe (8-lane subgroups)
breaks it from head_dim 64 on (bdx = 16: columns 32..63 and S wrong, max error ~2.6 at
Llama-3.2-1B's attention shape), SwiftShader (4 lanes) already at head_dim 32 (bdx = 8). CUDA
only gets it right by the warp's lockstep (bdx <= 32, and not guaranteed under Volta's
independent thread scheduling). The PagedKVCache calls this kernel whenever a prefill chunk
attends to earlier context (paged prefill + ragged prefill, then the merge), hence wrong logits
for every prompt chunk after the first and every later turn, while single-chunk prompts and
decode are right.

The fix: the same kernel (same launch, threads, vector loads; the same parameters TVM picked,
recovered from its kernel) with a workgroup barrier between the reads of S and the write of S
(a write-after-read hazard: an execution barrier is enough), and one writer of S per row
(threadIdx.x == 0). The barrier is in uniform control flow (every thread of the block reaches it),
as WGSL requires. Upstream TVM (main, as stored) still has the racy kernel.
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

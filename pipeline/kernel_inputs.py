"""Seeded inputs of a PrimFunc's real shapes, symbolic dims bound to chosen sizes.

Plain kernels get random data. Paged-KV-cache kernels (attention, rope, kv append, state merge)
read page tables and position maps: those get a valid layout for one sequence (`n` new tokens on
top of `HISTORY` cached ones, pages of the buffer's page size, in shuffled order), so every index
they follow is in bounds.
"""

from __future__ import annotations

import numpy as np
import tvm
from tvm.sym.analyzer import Analyzer

HISTORY = 9  # cached tokens before the new ones in paged-attention inputs
SCALARS = {"causal": 1, "rotary_mode": 0, "rope_scale": 1.0, "rope_theta": 10000.0, "sm_scale": 0.125, "apply_rope": 1, "batch_size": 1}


def concrete_shape(shape, sizes: dict[str, int]) -> tuple[int, ...]:
    """Evaluate each dim with symbolic vars bound by name (`sizes`)."""
    out = []
    for dim in shape:
        analyzer = Analyzer()
        for var in tvm.tirx.analysis.undefined_vars(dim):
            if var.name not in sizes:
                raise ValueError(f"symbolic dim '{var.name}' has no size; give one of it in sizes")
            analyzer.bind(var, tvm.tirx.const(sizes[var.name], str(var.ty)))
        out.append(int(analyzer.simplify(dim)))
    return tuple(out)


def buffer_shape(param):
    """The shape of a buffer parameter, or None for a scalar parameter."""
    try:
        return list(param.shape)
    except AttributeError:
        return None


def symbolic_dims(func: tvm.tirx.PrimFunc) -> list[str]:
    names: list[str] = []
    for param in func.params:
        for dim in buffer_shape(param) or []:
            for var in tvm.tirx.analysis.undefined_vars(dim):
                if var.name not in names:
                    names.append(var.name)
    return names


def random_array(shape: tuple[int, ...], dtype: str, rng: np.random.Generator) -> np.ndarray:
    if dtype == "uint32":  # packed int4 words: every bit pattern is a valid set of nibbles
        return rng.integers(0, 2**32, size=shape, dtype=np.uint64).astype(np.uint32)
    if dtype.startswith(("int", "uint")):
        return rng.integers(0, 8, size=shape).astype(dtype)
    return (rng.standard_normal(shape) * 0.5).astype(dtype)


def random_args(func: tvm.tirx.PrimFunc, sizes: dict[str, int], seed: int = 0) -> list[np.ndarray]:
    """One random array per buffer parameter (outputs included; kernels overwrite them)."""
    rng = np.random.default_rng(seed)
    return [random_array(concrete_shape(p.shape, sizes), str(p.dtype), rng) for p in func.params]


def _page_size(func: tvm.tirx.PrimFunc) -> int:
    for param in func.params:
        if param.name == "pages":  # (pages, 2, heads, page, dim) or MLA's (pages, page, dim)
            shape = list(param.shape)
            dim = shape[3] if len(shape) == 5 else shape[1]
            return int(dim) if isinstance(dim, tvm.tirx.IntImm) else 16
    return 16


def kernel_args(func: tvm.tirx.PrimFunc, n: int, seed: int = 0, heads: dict[str, int] | None = None) -> tuple[list, str]:
    """Inputs for `func` with `n` as the token count; returns (args, label of the sizes).

    Scalar parameters get fixed values (SCALARS); int32 index buffers get a valid paged layout.
    `heads` ({"H": query heads, "D": head dim} of the model) sizes the merge-state kernel's
    symbolic head dims: TVM's GPU kernel bakes both into its launch (threads, grid) and reads
    and writes out of bounds with any other H / D.
    """
    from .model.sampler import is_sampler_kernel, kernel_args as sampler_kernel_args

    if is_sampler_kernel(func):  # indices in range, distributions, sorted rows, bitmask words
        return sampler_kernel_args(func, n, seed=seed)
    rng = np.random.default_rng(seed)
    page = _page_size(func)
    kv_len = n + HISTORY
    pages = -(-kv_len // page)
    sizes = {
        "B": 1, "batch_size": 1, "total_len": n, "qo_len": n, "kv_len": n, "seq_len": n, "ntoken": n,
        "max_num_pages": pages, "nnz_pages": pages, "num_pages": pages, "N": n, "H": 4, "D": 32,
    }
    sizes.update(heads or {})
    dims = symbolic_dims(func)
    sizes = {**{d: n for d in dims}, **{k: v for k, v in sizes.items() if k in dims}}
    page_order = rng.permutation(pages).astype(np.int32)
    index_values = {
        "q_indptr": [0, n], "kv_indptr": [0, n],
        "page_indptr": [0, pages], "page_table_indptr": [0, pages],
        "page_values": page_order, "page_table_values": page_order,
        "length_info": [kv_len - page * (pages - 1)],
        "k_rope_pos_offset": [0],
        "q_rope_position": np.arange(kv_len - n, kv_len) if "pages" in [p.name for p in func.params] else np.arange(n),
        "position_map": np.arange(n),
        # tree attention: node i's Euler interval [i, n) makes every later token its descendant (a chain: causal)
        "tree_order_indptr": [0, n], "tree_order": np.stack([np.arange(n), np.full(n, n)], axis=1),
        # KV compaction: the n tokens after the history move to the first n positions
        "copy_length_indptr": [0, n], "copy_src_dst_pos": np.stack([np.arange(HISTORY, HISTORY + n), np.arange(n)]),
    }
    args = []
    for param in func.params:
        shape = buffer_shape(param)
        if shape is None:
            args.append(SCALARS.get(param.name, 0 if "int" in str(param.ty) else 1.0))
            continue
        shape = concrete_shape(shape, sizes)
        dtype = str(param.dtype)
        if dtype == "int32" and param.name in index_values:
            values = np.zeros(shape, np.int32)
            flat = np.asarray(index_values[param.name], np.int32)
            if flat.shape == tuple(shape):  # given whole (tree_order, copy_src_dst_pos)
                values = flat.copy()
            elif len(shape) == 2:  # e.g. length_info (3, B) when sliding windows are compiled in
                values[0, : flat.size] = flat[: shape[1]]
            else:
                values[: min(flat.size, shape[0])] = flat[: shape[0]]
            args.append(values)
        else:
            args.append(random_array(shape, dtype, rng))
    label = ",".join(f"{k}={v}" for k, v in sizes.items()) or "static"
    if any(p.name == "pages" for p in func.params):
        label += f",context={kv_len}"
    return args, label

"""Seeded inputs of a kernel's real shapes, symbolic dims bound to chosen sizes, from its
signature: the parameters' names, dtypes and shapes as the build records them (NumPy only, so
the run side builds the same inputs without TVM's compiler; `kernel_info.signature_of` makes a
signature of a PrimFunc).

A signature is {"params": [{"name", "dtype", "shape"}], "sampler": info or None}: `shape` is None
for a scalar parameter, else a list of dims, each an int, {"var": name} or {"op": add | sub | mul
| floordiv | floormod | div | mod | min | max | cast, "args": [dims]}.

Plain kernels get random data. Paged-KV-cache kernels (attention, rope, kv append, state merge)
read page tables and position maps: those get a valid layout for one sequence (`n` new tokens on
top of `HISTORY` cached ones, pages of the buffer's page size, in shuffled order), so every index
they follow is in bounds.
"""

from __future__ import annotations

import numpy as np

from .model.sampler_spec import kernel_args as sampler_kernel_args

KV_CACHE_CREATE = "vm.builtin.paged_attention_kv_cache_create"  # the KV cache's create call (its kernels are its arguments)
HISTORY = 9  # cached tokens before the new ones in paged-attention inputs
SLIDING_OFFSET = 5  # where a sliding window starts in its first page, in sliding-window kernels' inputs
SCALARS = {"causal": 1, "rotary_mode": 0, "rope_scale": 1.0, "rope_theta": 10000.0, "sm_scale": 0.125, "apply_rope": 1, "batch_size": 1}
_OPS = {
    "add": lambda a, b: a + b, "sub": lambda a, b: a - b, "mul": lambda a, b: a * b,
    "floordiv": lambda a, b: a // b, "floormod": lambda a, b: a % b, "div": lambda a, b: int(a / b),
    "mod": lambda a, b: a - b * int(a / b), "min": min, "max": max, "cast": lambda a: a,
}


def eval_dim(dim, sizes: dict[str, int]) -> int:
    """A recorded dim's value with its vars bound by name (`sizes`)."""
    if isinstance(dim, int):
        return dim
    if "var" in dim:
        if dim["var"] not in sizes:
            raise ValueError(f"symbolic dim '{dim['var']}' has no size; give one of it in sizes")
        return int(sizes[dim["var"]])
    return int(_OPS[dim["op"]](*(eval_dim(a, sizes) for a in dim["args"])))


def dim_vars(dim) -> list[str]:
    if isinstance(dim, int):
        return []
    if "var" in dim:
        return [dim["var"]]
    return [v for a in dim["args"] for v in dim_vars(a)]


def concrete_shape(shape, sizes: dict[str, int]) -> tuple[int, ...]:
    return tuple(eval_dim(d, sizes) for d in shape)


def symbolic_dims(signature: dict) -> list[str]:
    names: list[str] = []
    for param in signature["params"]:
        for dim in param["shape"] or []:
            for var in dim_vars(dim):
                if var not in names:
                    names.append(var)
    return names


def random_array(shape: tuple[int, ...], dtype: str, rng: np.random.Generator) -> np.ndarray:
    if dtype == "uint32":  # packed int4 words: every bit pattern is a valid set of nibbles
        return rng.integers(0, 2**32, size=shape, dtype=np.uint64).astype(np.uint32)
    if dtype.startswith(("int", "uint")):
        return rng.integers(0, 8, size=shape).astype(dtype)
    return (rng.standard_normal(shape) * 0.5).astype(dtype)


def random_args(signature: dict, sizes: dict[str, int], seed: int = 0) -> list[np.ndarray]:
    """One random array per buffer parameter (outputs included; kernels overwrite them)."""
    rng = np.random.default_rng(seed)
    return [random_array(concrete_shape(p["shape"], sizes), p["dtype"], rng) for p in signature["params"]]


def _page_size(signature: dict) -> int:
    for param in signature["params"]:
        if param["name"] == "pages" and param["shape"]:  # (pages, 2, heads, page, dim) or MLA's (pages, page, dim)
            shape = param["shape"]
            dim = shape[3] if len(shape) == 5 else shape[1]
            return dim if isinstance(dim, int) else 16
    return 16


def _symbolic_sizes(signature: dict, n: int, heads: dict[str, int] | None) -> dict[str, int]:
    """The value of each symbolic dim of `signature` for token count `n` (see kernel_args)."""
    pages = -(-(n + HISTORY) // _page_size(signature))
    sizes = {
        "B": 1, "batch_size": 1, "total_len": n, "qo_len": n, "kv_len": n, "seq_len": n, "ntoken": n,
        "max_num_pages": pages, "nnz_pages": pages, "num_pages": pages, "N": n, "H": 4, "D": 32,
    }
    sizes.update(heads or {})
    dims = symbolic_dims(signature)
    return {**{d: n for d in dims}, **{k: v for k, v in sizes.items() if k in dims}}


def kernel_args_bytes(signature: dict, n: int, heads: dict[str, int] | None = None) -> int:
    """Bytes of kernel_args' arrays for token count `n`, computed without allocating them."""
    if signature.get("sampler"):
        return 0
    sizes = _symbolic_sizes(signature, n, heads)
    return sum(int(np.prod(concrete_shape(p["shape"], sizes), dtype=np.float64)) * np.dtype(p["dtype"] if p["dtype"] != "bfloat16" else "uint16").itemsize
               for p in signature["params"] if p["shape"] is not None)


def kernel_args(signature: dict, n: int, seed: int = 0, heads: dict[str, int] | None = None) -> tuple[list, str]:
    """Inputs for the kernel of `signature` with `n` as the token count; returns (args, label of the sizes).

    Scalar parameters get fixed values (SCALARS); int32 index buffers get a valid paged layout.
    `heads` ({"H": query heads, "D": head dim} of the model) sizes the merge-state kernel's
    symbolic head dims: TVM's GPU kernel bakes both into its launch (threads, grid) and reads
    and writes out of bounds with any other H / D.
    """
    if signature.get("sampler"):  # indices in range, distributions, sorted rows, bitmask words
        return sampler_kernel_args(signature["sampler"], n, seed=seed)
    rng = np.random.default_rng(seed)
    page = _page_size(signature)
    kv_len = n + HISTORY
    pages = -(-kv_len // page)
    sizes = _symbolic_sizes(signature, n, heads)
    page_order = rng.permutation(pages).astype(np.int32)
    index_values = {
        "q_indptr": [0, n], "kv_indptr": [0, n],
        "page_indptr": [0, pages], "page_table_indptr": [0, pages],
        "page_values": page_order, "page_table_values": page_order,
        "length_info": [kv_len - page * (pages - 1)],
        "k_rope_pos_offset": [0],
        "q_rope_position": np.arange(kv_len - n, kv_len) if any(p["name"] == "pages" for p in signature["params"]) else np.arange(n),
        "position_map": np.arange(n),
        # tree attention: node i's Euler interval [i, n) makes every later token its descendant (a chain: causal)
        "tree_order_indptr": [0, n], "tree_order": np.stack([np.arange(n), np.full(n, n)], axis=1),
        # KV compaction: the n tokens after the history move to the first n positions
        "copy_length_indptr": [0, n], "copy_src_dst_pos": np.stack([np.arange(HISTORY, HISTORY + n), np.arange(n)]),
    }
    args = []
    for param in signature["params"]:
        name, dtype = param["name"], param["dtype"]
        if param["shape"] is None:
            args.append(SCALARS.get(name, 0 if "int" in dtype else 1.0))
            continue
        shape = concrete_shape(param["shape"], sizes)
        if dtype == "int32" and name in index_values:
            values = np.zeros(shape, np.int32)
            flat = np.asarray(index_values[name], np.int32)
            if flat.shape == tuple(shape):  # given whole (tree_order, copy_src_dst_pos)
                values = flat.copy()
            elif len(shape) == 2:  # length_info (3, B) of a sliding-window kernel: last page length, window
                values[0, : flat.size] = flat[: shape[1]]  # offset in the first page, sink length
                if name == "length_info" and shape[0] == 3:
                    values[1, :] = min(SLIDING_OFFSET, kv_len - 1)  # the window starts inside the first page
            else:
                values[: min(flat.size, shape[0])] = flat[: shape[0]]
            args.append(values)
        else:
            args.append(random_array(shape, dtype, rng))
    label = ",".join(f"{k}={v}" for k, v in sizes.items()) or "static"
    if any(p["name"] == "pages" for p in signature["params"]):
        label += f",context={kv_len}"
    return args, label

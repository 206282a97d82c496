"""The machine's memory-bandwidth bound: a STREAM-like read of a large array (well beyond the
last-level cache) with a given thread count, best of several runs, in GB/s (1e9 bytes/s).

Methods (each reported; the bound is the best one, since every method is a lower bound on what
the memory system can deliver):
- `tvm-reduction`: a tiny TVM-compiled kernel (this CPU's llvm target, as the model's kernels)
  summing (64 rows x m x 16 lanes): rows parallel over TVM's thread pool (`TVM_NUM_THREADS`), 16
  float32 lanes vectorised, so it is bound by memory rather than by the adds;
- `numpy-threads`: the array split into one contiguous chunk per thread, each summed by
  `np.add.reduce` on its own Python thread (NumPy releases the GIL inside the ufunc loop);
- `torch-sum`: `torch.sum` over the whole array with `torch.set_num_threads(threads)`
  (ATen's vectorised parallel reduction), when torch is installed.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np

DEFAULT_GIB = 2.0


def _best_gbps(fn, nbytes: int, repeats: int) -> float:
    fn()  # touch every page once
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return nbytes / best / 1e9


def numpy_threads(array: np.ndarray, threads: int, repeats: int) -> float:
    chunks = np.array_split(array, threads)
    with ThreadPoolExecutor(max_workers=threads) as pool:
        return _best_gbps(lambda: list(pool.map(np.add.reduce, chunks)), array.nbytes, repeats)


def torch_sum(array: np.ndarray, threads: int, repeats: int) -> float | None:
    try:
        import torch
    except ImportError:
        return None
    torch.set_num_threads(threads)
    tensor = torch.from_numpy(array)
    return _best_gbps(lambda: tensor.sum(), array.nbytes, repeats)


def tvm_reduction(array: np.ndarray, threads: int, repeats: int) -> float | None:
    """Needs TVM_NUM_THREADS=threads in the environment before TVM starts its pool."""
    try:
        import tvm
        from tvm import s_tir, te

        from mlcpipe.targets import load_target
    except ImportError:
        return None
    rows, lanes = 64, 16
    inner = array.size // rows // lanes
    a = te.placeholder((rows, inner, lanes), "float32", name="A")
    k = te.reduce_axis((0, inner), "k")
    b = te.compute((rows, lanes), lambda p, v: te.sum(a[p, k, v], axis=k), name="B")
    sch = s_tir.Schedule(te.create_prim_func([a, b]))
    p, v, kk = sch.get_loops(sch.get_sblock("B"))
    sch.reorder(p, kk, v)
    sch.parallel(p)
    sch.vectorize(v)
    lib = tvm.compile(sch.mod, target=load_target("llvm").tvm_target())
    dev = tvm.cpu()
    src = tvm.runtime.tensor(array[: rows * inner * lanes].reshape(rows, inner, lanes), dev)
    out = tvm.runtime.tensor(np.zeros((rows, lanes), np.float32), dev)
    timer = lib.mod.time_evaluator("main", dev, number=1, repeat=repeats)
    timer(src, out)  # warm-up
    return rows * inner * lanes * 4 / min(timer(src, out).results) / 1e9


def measure(threads: int, gib: float = DEFAULT_GIB, repeats: int = 5) -> dict:
    """{"bound_gbps", "method", "methods": {name: GB/s}, "bytes", "threads", "repeats"}."""
    n = int(gib * 2**30) // 4
    array = np.ones(n, dtype=np.float32)  # np.ones writes every page: no lazy zero pages
    methods = {}
    for name, fn in (("tvm-reduction", tvm_reduction), ("numpy-threads", numpy_threads), ("torch-sum", torch_sum)):
        value = fn(array, threads, repeats)
        if value is not None:
            methods[name] = value
    best = max(methods, key=methods.get)
    return {"bound_gbps": methods[best], "method": best, "methods": methods, "bytes": array.nbytes,
            "threads": threads, "repeats": repeats}


if __name__ == "__main__":
    import argparse
    import json

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--gib", type=float, default=DEFAULT_GIB)
    args = ap.parse_args()
    print(json.dumps(measure(args.threads, args.gib), indent=1))

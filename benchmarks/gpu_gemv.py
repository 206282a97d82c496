"""Decode GEMV bandwidth of Llama-3.2-1B (q4f16_1) on CUDA: our GEMVDequant vs dlight's GEMV.

    python -m benchmarks.gpu_gemv [--quant q4f16_1] [--repeat 200] [--peak GBPS]

For each decode GEMV kernel (qkv, o_proj, gate_up, down, lm_head) both schedules are compiled
for the CUDA device present (`arch` from the device's compute capability), checked against each
other, and timed with `time_evaluator`; bytes moved = weights + scales + activations + outputs,
printed as GB/s and as a share of the peak (default: the device's datasheet figure, e.g. H100 SXM
3350 GB/s, H200 4800 GB/s).

Without a CUDA device it says so in one line and instead checks our rule's numerics for the same
kernels through WebGPU on lavapipe (when the wgpu package is installed), then exits 0.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

ROLES = {"": "qkv", "1": "o_proj", "2": "gate_up", "3": "down", "4": "lm_head"}  # NT_matmul<N> of decode


def role_of(name: str) -> str:
    number = name.split("NT_matmul", 1)[1].split("_", 1)[0]
    return ROLES.get(number, "?")


def decode_kernels(quant: str, target_name: str):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
    from test_gpu_rules import decode_gemvs, fused_kernels

    return decode_gemvs(fused_kernels("llama-3.2-1b", quant, target_name))


def bytes_moved(func) -> int:
    total = 0
    for param in func.params:
        n = int(np.prod([int(d) for d in param.shape]))
        total += n * np.dtype(str(param.dtype)).itemsize
    return total


def launch_of(rule, func, target) -> str:
    info = rule._match(func, target)
    threads, rows, vec = rule._fit(info, target)
    return f"grid ({info.n // rows},1,1) block ({threads},{rows},1) vec {vec} words"


def run_cuda(args) -> int:
    import tvm
    from tvm.s_tir import dlight as dl

    from mlcpipe.targets import load_target
    from mlcpipe.schedules.gpu.gemv_dequant import GEMVDequant

    dev = tvm.cuda(0)
    major, minor = (int(x) for x in str(dev.compute_version).split("."))
    spec = load_target("cuda")
    target = tvm.target.Target({**spec.target, "arch": f"sm_{major}{minor}", "host": {"kind": "llvm"}})
    ours = GEMVDequant.for_target("cuda")
    theirs = dl.gpu.GEMV()
    if args.peak is None:
        from mlcpipe.device.cuda import datasheet_gbps

        args.peak = datasheet_gbps(dev.device_name)
        if args.peak is None:
            print(f"error: no datasheet bandwidth known for {dev.device_name!r}; give --peak GBPS", file=sys.stderr)
            return 2
    print(f"device: {dev.device_name}, sm_{major}{minor}; peak {args.peak:.0f} GB/s; {args.quant}")
    print(f"{'kernel':44} {'role':8} {'MB':>7} {'ours us':>9} {'GB/s':>7} {'%peak':>6} {'dlight us':>9} {'GB/s':>7} {'%peak':>6}  launch (ours)")
    rng = np.random.default_rng(0)
    for name, func in sorted(decode_kernels(args.quant, "cuda").items()):
        arrays = []
        for p in func.params:
            shape = [int(d) for d in p.shape]
            if str(p.dtype) == "uint32":
                arrays.append(rng.integers(0, 2**32, size=shape, dtype=np.uint64).astype(np.uint32))
            else:
                arrays.append((rng.standard_normal(shape) * 0.5).astype(str(p.dtype)))
        results, row = [], []
        for rule in (ours, theirs):
            copy = tvm.ir.load_json(tvm.ir.save_json(func))
            with target:
                sch = rule.apply(copy, target, False)
            if sch is None:
                row.append(None)
                continue
            mod = tvm.IRModule({"main": sch.mod["main"].with_attr("global_symbol", "main")})
            lib = tvm.compile(mod, target=target)
            tensors = [tvm.runtime.tensor(a, dev) for a in arrays]
            lib["main"](*tensors)
            dev.sync()
            results.append(tensors[-1].numpy().astype(np.float64))
            module = lib if hasattr(lib, "time_evaluator") else lib.mod  # an Executable has no time_evaluator
            timer = module.time_evaluator("main", dev, number=args.repeat, repeat=3, min_repeat_ms=50)
            row.append(min(timer(*tensors).results))
        nbytes = bytes_moved(func)
        if len(results) == 2:
            scale = max(np.abs(results[1]).max(), 1e-6)
            err = np.abs(results[0] - results[1]).max() / scale
            if err > 2e-2:
                print(f"  {name}: ours and dlight's disagree (rel err {err:.2e})")
        cells = []
        for seconds in row:
            if seconds is None:
                cells += ["-", "-", "-"]
            else:
                gbps = nbytes / seconds / 1e9
                cells += [f"{seconds * 1e6:.1f}", f"{gbps:.0f}", f"{100 * gbps / args.peak:.0f}"]
        print(f"{name:44} {role_of(name):8} {nbytes / 1e6:7.2f} {cells[0]:>9} {cells[1]:>7} {cells[2]:>6} {cells[3]:>9} {cells[4]:>7} {cells[5]:>6}  {launch_of(ours, func, target)}")
    return 0


def run_lavapipe(args) -> int:
    try:
        import wgpu  # noqa: F401
    except ImportError:
        print("no wgpu package either: nothing more to check here")
        return 0
    from mlcpipe.targets import load_target
    from mlcpipe.schedules.gpu.gemv_dequant import GEMVDequant

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
    from test_gpu_rules import check_on_lavapipe

    target = load_target("webgpu").tvm_target()
    rule = GEMVDequant.for_target("webgpu")
    kernels = decode_kernels(args.quant, "webgpu")
    print(f"numerics of GEMVDequant (webgpu defaults) on lavapipe vs llvm, {args.quant}:")
    for name, func in sorted(kernels.items()):
        if role_of(name) == "lm_head" and not args.with_lm_head:
            print(f"  {name:44} {role_of(name):8} {bytes_moved(func) / 1e6:7.2f} MB  not run (the llvm reference decodes 0.5 GB; --with-lm-head)  {launch_of(rule, func, target)}")
            continue
        err = check_on_lavapipe(rule, name, func)
        print(f"  {name:44} {role_of(name):8} {bytes_moved(func) / 1e6:7.2f} MB  rel err {err:.1e}  {launch_of(rule, func, target)}")
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quant", default="q4f16_1")
    parser.add_argument("--repeat", type=int, default=100)
    parser.add_argument("--peak", type=float, default=None, help="peak bandwidth in GB/s (default: the device's datasheet figure)")
    parser.add_argument("--with-lm-head", action="store_true", help="lavapipe check: also run the 128256-row lm_head (slow on the CPU)")
    args = parser.parse_args(argv)
    import tvm

    if tvm.cuda(0).exist:
        return run_cuda(args)
    print("no CUDA device: not timing; checking GEMVDequant's numerics on lavapipe instead")
    return run_lavapipe(args)


if __name__ == "__main__":
    sys.exit(main())

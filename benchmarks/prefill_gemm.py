"""Prefill GEMM (or decode GEMV) rules side by side on one target CPU: each 1B matmul built by every rule.

    python -m benchmarks.prefill_gemm [--mcpu haswell] [--quants q4f32_1,q0f16] [--tokens 128]
        [--rules PrefillGEMM,PrefillGEMMF32] [--repeat 5] [-o benchmarks/results/prefill-gemm-haswell.md]
    python -m benchmarks.prefill_gemm --decode --quants q4f16_1 --rules DecodeGEMVQ4F32,DecodeGEMVQ4VNNI,DecodeGEMVQ4VNNI:planes=1 --cold

Builds each prefill NT matmul of the model (lm_head left out: the model runs it on one token;
`--decode`: each one-token matmul, lm_head included) with each rule's default knobs for `--mcpu` (which the host must be able to run: e.g. haswell,
AVX2 + FMA only, on any AVX2 host), checks every rule's output against the first rule's, and
times each (pipeline.tuning.knobs.time_kernel_ms: best of `repeat`, the thread pool as set by
TVM_NUM_THREADS). A rule may carry knobs (`DecodeGEMVQ4VNNI:planes=1;rows=2`). `--cold`: the
calls rotate through input copies beyond the last-level cache (the weights stream from memory as
in the model; what `mlcpipe tune` times) and the rules are timed in interleaved rounds, medians
(a shared VM's bandwidth drifts in phases of seconds); GB/s per call is printed too. Prints a
Markdown table.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

from .common import cpu_llvm, cpu_model


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="llama-3.2-1b")
    ap.add_argument("--mcpu", default="haswell")
    ap.add_argument("--quants", default="q4f32_1,q0f16")
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--rules", default="PrefillGEMM,PrefillGEMMF32")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--decode", action="store_true", help="the one-token (decode) matmuls instead of the prefill ones")
    ap.add_argument("--cold", action="store_true", help="inputs beyond the last-level cache, rules interleaved (medians)")
    ap.add_argument("-o", "--output")
    args = ap.parse_args(argv)

    import tvm

    from mlcpipe.config import load_model_config
    from mlcpipe.kernel_info import random_args, symbolic_dims
    from mlcpipe.roles import role_of_param
    from mlcpipe.device import device
    from mlcpipe.tuning.knobs import compile_kernel, interleaved_times, run_kernel, time_kernel_ms, unscheduled_kernels
    from mlcpipe.schedules import rule_by_name
    from mlcpipe.schedules.analysis import match_nt_matmul

    target = tvm.target.Target({"kind": "llvm", "mcpu": args.mcpu})
    specs = args.rules.split(",")
    rules = [_with_knobs(rule_by_name("llvm", spec.partition(":")[0]), spec) for spec in specs]
    if any(r is None for r in rules):
        print(f"error: --rules {args.rules}: unknown rule name or knob (allowed: Rule or Rule:knob=int;knob=int)", file=sys.stderr)
        return 2
    cold = device("llvm").timing_cold_bytes() if args.cold else 0
    title = "Decode GEMV rules" if args.decode else "Prefill GEMM rules"
    lines = [f"# {title} on mcpu={args.mcpu}, {1 if args.decode else args.tokens} token(s)", "", "```",
             "python -m benchmarks.prefill_gemm " + " ".join(argv if argv is not None else sys.argv[1:]), "```", "",
             f"- date: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; host CPU: {cpu_model()}, llvm target CPU {cpu_llvm()}, "
             f"TVM_NUM_THREADS={os.environ.get('TVM_NUM_THREADS', 'unset')}; "
             + (f"inputs rotated through {cold >> 20} MiB, rules interleaved, median of {args.repeat}" if cold else f"best of {args.repeat}")
             + ", ms per call (GB/s: bytes of every argument per call)", "",
             "| quant | matmul (N x K) | role | " + " | ".join(specs) + " | speedup (last / first) |",
             "|---|---|---|" + "---|" * len(rules) + "---|"]
    for quant in args.quants.split(","):
        config = load_model_config(args.model)
        kernels = unscheduled_kernels(config, config.scheme(quant), target)
        for name, func in sorted(kernels.items()):
            info = match_nt_matmul(func) if "NT_matmul" in name else None
            role = role_of_param(getattr(info.weight, "name", str(info.weight)), name) if info is not None else None
            if info is None or (bool(symbolic_dims(func)) == args.decode) or (role == "lm_head" and not args.decode):
                continue
            inputs = random_args(func, {d: args.tokens for d in symbolic_dims(func)}, seed=1)
            libs, first = [], None
            for spec, rule in zip(specs, rules):
                sch = rule.apply(func, target, False)
                if sch is None:
                    libs.append(None)
                    continue
                lib = compile_kernel(sch.mod["main"], target)
                out = run_kernel(lib, inputs, tvm.cpu())
                if first is None:
                    first = out
                elif not np.allclose(out, first, atol=1e-2 * float(np.abs(first).max())):  # int8 activations (Q8): ~1e-2 of the max
                    print(f"error: {spec} disagrees with {specs[0]} on {name}", file=sys.stderr)
                    return 1
                libs.append(lib)
            built = [(i, lib) for i, lib in enumerate(libs) if lib is not None]
            if cold:
                timed = dict(interleaved_times(built, inputs, tvm.cpu(), args.repeat, cold))
            else:
                timed = {i: time_kernel_ms(lib, inputs, tvm.cpu(), args.repeat) for i, lib in built}
            times = [timed.get(i) for i in range(len(libs))]
            nbytes = sum(a.size * a.itemsize for a in inputs)
            cells = ["declined" if t is None else f"{t:.3g} ({nbytes / t / 1e6:.1f} GB/s)" for t in times]
            speedup = f"{times[0] / times[-1]:.2f}x" if times[0] and times[-1] else "–"
            lines.append(f"| {quant} | {info.n} x {info.k} | {role} | " + " | ".join(cells) + f" | {speedup} |")
            print(lines[-1], flush=True)
    text = "\n".join(lines) + "\n"
    if args.output:
        with open(args.output, "w") as f:
            f.write(text)
    else:
        print(text)
    return 0


def _with_knobs(rule, spec: str):
    """`rule` with the knobs of `spec` (Rule:knob=int;knob=int), or None (no rule, a bad knob)."""
    import dataclasses

    _, _, knobs = spec.partition(":")
    if rule is None or not knobs:
        return rule
    values = {}
    for item in knobs.split(";"):
        key, _, value = item.partition("=")
        if key not in {f.name for f in dataclasses.fields(rule)} or not value.lstrip("-").isdigit():
            return None
        values[key] = int(value)
    return dataclasses.replace(rule, **values)


if __name__ == "__main__":
    sys.exit(main())

"""How far an llvm build's logits are from the float32 truth, per rule knob setting: which kernel's
arithmetic carries the error.

    python -m benchmarks.accuracy [--model llama-3.2-1b] [--quant q4f16_1] [--mcpu znver3]
        [--variants "default,PrefillGEMMQ4VNNI:planes=2"] [--prompt 300] [--steps 6] [-o out.md]

Each variant is a build of the model (synthetic weights, seed 0) whose kernels taken by the named
rule by default get the given knobs (a tuning database written for the build, the way `mlcpipe
tune` records winners); `default` is the plain build. Every build runs the same random prompt
(prefill in the config's chunks) and `steps` - 1 decode steps fed the same tokens
(pipeline.interface.job.teacher_forced); the truth is PyTorch in float32 with the quantized
model's exact weight values (benchmarks.llm_gpu.f32_truth). Prints a Markdown table: relative L2
distance of the prefill's logits and the worst decode step's.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from .common import cpu_llvm, cpu_model


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="llama-3.2-1b")
    ap.add_argument("--quant", default="q4f16_1")
    ap.add_argument("--mcpu", default=None, help="llvm target CPU (default: this machine's)")
    ap.add_argument("--variants", default="default,PrefillGEMMQ4VNNI:planes=2")
    ap.add_argument("--prompt", type=int, default=300)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("-o", "--output")
    args = ap.parse_args(argv)

    from mlcpipe.config import load_model_config
    from mlcpipe.schedules import rule_by_name

    from .prefill_gemm import _with_knobs

    variants = []
    for spec in args.variants.split(","):
        rule = None if spec == "default" else _with_knobs(rule_by_name("llvm", spec.partition(":")[0]), spec)
        if spec != "default" and (rule is None or ":" not in spec):
            print(f"error: --variants {spec}: expected 'default' or Rule:knob=int;knob=int with an llvm rule", file=sys.stderr)
            return 2
        variants.append((spec, rule))
    config = load_model_config(args.model)
    lines = [f"# Accuracy of llvm builds against the float32 truth: {args.model} {args.quant}", "", "```",
             "python -m benchmarks.accuracy " + " ".join(argv if argv is not None else sys.argv[1:]), "```", "",
             f"- date: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; host CPU: {cpu_model()}, llvm target CPU "
             f"{args.mcpu or cpu_llvm()}; {args.prompt}-token random prompt (prefill in chunks of {config.prefill_chunk_size}), "
             f"{args.steps - 1} decode steps fed the same tokens; synthetic weights, seed 0",
             "- relative L2 = ||logits - truth|| / ||truth||; the truth: PyTorch float32 with the quantized weights' exact values", "",
             "| variant | kernels changed | prefill logits | worst decode step | greedy tokens = truth's |", "|---|---|---|---|---|"]
    truth = prompt = tokens = None
    with tempfile.TemporaryDirectory(prefix="mlcpipe-accuracy-") as tmp:
        for spec, rule in variants:
            logits, changed, prompt, tokens = _run(config, args, rule, Path(tmp) / f"v{len(lines)}", prompt, tokens)
            if truth is None:
                from .llm_gpu import f32_truth

                truth = f32_truth(config, args.quant, prompt, tokens).reshape(logits.shape)
            dist = [float(np.linalg.norm(g - w) / np.linalg.norm(w)) for g, w in zip(logits, truth)]
            agree = sum(int(np.argmax(g) == np.argmax(w)) for g, w in zip(logits, truth))
            lines.append(f"| {spec} | {changed} | {dist[0]:.2e} | {max(dist[1:], default=0):.2e} | {agree}/{len(dist)} |")
            print(lines[-1], flush=True)
    text = "\n".join(lines) + "\n"
    if args.output:
        Path(args.output).write_text(text)
    else:
        print(text)
    return 0


def _run(config, args, rule, out: Path, prompt, tokens):
    """(logits, kernels changed, prompt, tokens) of one variant's build; prompt / tokens None: drawn
    (a random prompt, greedy tokens of this build)."""
    from mlcpipe.build import build
    from mlcpipe.device import RunOptions
    from mlcpipe.interface.job import teacher_forced
    from mlcpipe.runtime import open_engine
    from mlcpipe.targets import load_target

    target = load_target("llvm", {"mcpu": args.mcpu} if args.mcpu else None)
    scheme = config.scheme(args.quant)
    db_path, changed = None, 0
    if rule is not None:
        db_path, changed = _tuning_db(config, scheme, target, rule, out.with_suffix(".json"))
    art = build(config, scheme, target, output=out, tuning_db=db_path, log=lambda *_: None)
    engine = open_engine(art, "synthetic", 0, RunOptions(prefill_chunk=config.prefill_chunk_size))
    if prompt is None:
        length = min(args.prompt, engine.context_window - args.steps - 1)
        prompt = [int(t) for t in np.random.default_rng(0).integers(0, engine.vocab_size, size=length)]
    fed, logits = teacher_forced(engine, prompt, args.steps, tokens)
    return logits, changed, prompt, fed


def _tuning_db(config, quant, target, rule, path: Path) -> tuple[Path, int]:
    """A tuning database giving `rule` (with its knobs) every kernel it takes by default."""
    import dataclasses

    from mlcpipe.schedules import schedule_func
    from mlcpipe.schedules.signature import kernel_signature
    from mlcpipe.tuning import TuningDB
    from mlcpipe.tuning.knobs import unscheduled_kernels

    db = TuningDB(path)
    tvm_target = target.tvm_target()
    name = type(rule).__name__
    knobs = {f.name: getattr(rule, f.name) for f in dataclasses.fields(rule)}
    changed = 0
    for kernel, func in sorted(unscheduled_kernels(config, quant, tvm_target).items()):
        chosen = schedule_func(func, tvm_target)[1] or {}  # None: no rule (dlight-free kernels)
        if chosen.get("rule") == name:
            db.put(target.target, kernel_signature(func), {"kernel": kernel, "rule": name, "knobs": knobs})
            changed += 1
    db.save()
    return path, changed


if __name__ == "__main__":
    sys.exit(main())

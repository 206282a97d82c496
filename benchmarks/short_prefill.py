"""Short prompts: prefill time at 1-16 tokens, with and without the prefill GEMM's few-token branch.

    python -m benchmarks.short_prefill [--model llama-3.2-1b] [--quant q4f16_1] [--tokens 1,2,3,4,8,16] [--runs 7] [--threads 2]

Builds the model twice from the current sources (artifacts/short-prefill/, or under $MLCPIPE_ARTIFACTS): once with the
defaults (PrefillGEMMAMX's GEMV branch up to `low_batch` = 4 tokens) and once with a
tuning database that sets `low_batch` to 0 on every prefill matmul (AMX tiles at every token
count, the previous behaviour). Both load the same seeded synthetic weights; each prompt length
is timed alternately on the two engines (median of `runs` after a warm-up) so both see the same
machine state. Prints a Markdown table; the logits of the two builds are compared as well
(the branch has finer activations than the tiles' bf16, so they agree to bf16 precision).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

from .common import prompt_tokens

ROOT = Path(__file__).resolve().parents[1]


def _builds(model: str, quant: str, out_root: Path, log) -> dict[str, Path]:
    from mlcpipe.build import build
    from mlcpipe.config import load_model_config
    from mlcpipe.kernel_info import symbolic_dims
    from mlcpipe.targets import load_target
    from mlcpipe.tuning.knobs import unscheduled_kernels
    from mlcpipe.tuning import TuningDB
    from mlcpipe.schedules.signature import kernel_signature

    config, target = load_model_config(model), load_target("llvm")
    scheme = config.scheme(quant)
    tiles_only = TuningDB(out_root / "low-batch-0.json")
    for name, func in unscheduled_kernels(config, scheme, target.tvm_target()).items():
        if "NT_matmul" in name and symbolic_dims(func):
            tiles_only.put(target.target, kernel_signature(func), {"kernel": name, "rule": "PrefillGEMMAMX", "knobs": {"low_batch": 0}})
    tiles_only.save()
    defaults = TuningDB(out_root / "defaults.json")  # empty: every kernel gets the rules' defaults
    defaults.save()
    arts = {}
    for label, db in (("AMX tiles only (low_batch=0)", tiles_only), ("default (few-token branch)", defaults)):
        out = out_root / ("tiles" if db is tiles_only else "default")
        if out.exists():
            import shutil

            shutil.rmtree(out)
        t0 = time.perf_counter()
        arts[label] = build(config, scheme, target, output=out, tuning_db=db.path, log=lambda *_: None)
        log(f"[short-prefill] built {label} in {time.perf_counter() - t0:.1f}s")
    return arts


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="llama-3.2-1b")
    parser.add_argument("--quant", default="q4f16_1")
    parser.add_argument("--tokens", default="1,2,3,4,8,16")
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("-o", "--output", type=Path, default=None, help="Also write the table here.")
    args = parser.parse_args(argv)
    from mlcpipe.threads import configure

    configure(args.threads)
    from mlcpipe.runtime import Engine

    def log(msg):
        print(msg, file=sys.stderr, flush=True)

    arts = _builds(args.model, args.quant, Path(os.environ.get("MLCPIPE_ARTIFACTS", ROOT / "artifacts")) / "short-prefill", log)
    engines = {label: Engine(path, "synthetic", seed=0) for label, path in arts.items()}
    lengths = [int(t) for t in args.tokens.split(",")]
    times: dict[str, dict[int, list[float]]] = {label: {n: [] for n in lengths} for label in engines}
    max_diff = {}
    for n in lengths:
        prompt = prompt_tokens(engines[next(iter(engines))].vocab_size, n, 1)
        logits = {}
        for i in range(args.runs + 1):
            for label, engine in engines.items():
                engine.reset()
                t0 = time.perf_counter()
                out = engine.prefill(prompt)
                if i:
                    times[label][n].append((time.perf_counter() - t0) * 1e3)
                logits[label] = np.asarray(out, dtype=np.float32)
        a, b = logits.values()
        max_diff[n] = float(np.abs(a - b).max() / (np.abs(a).max() or 1.0))
    labels = list(engines)
    lines = [f"{args.model} {args.quant}, llvm, {args.threads} threads: prefill ms (median of {args.runs}, alternating builds)", "",
             f"| prompt tokens | {labels[0]} | {labels[1]} | speed-up | max logit diff / max logit |", "|---|---|---|---|---|"]
    for n in lengths:
        old, new = (statistics.median(times[label][n]) for label in labels)
        lines.append(f"| {n} | {old:.1f} | {new:.1f} | {old / new:.2f}x | {max_diff[n]:.1e} |")
    table = "\n".join(lines)
    print(table)
    if args.output:
        cmd = "python -m benchmarks.short_prefill " + " ".join(argv if argv is not None else sys.argv[1:])
        args.output.write_text(f"# Short-prompt prefill\n\nCommand: `{cmd.strip()}`\n\n{table}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

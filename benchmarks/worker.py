"""Run one engine of the benchmark in this process and write its result as JSON.

    python -m benchmarks.worker --engine mlcpipe|pytorch|llama.cpp|bandwidth --variant V \
        --settings '{"model": ..., "threads": 2, ...}' --out result.json [--rebuild]

llm_cpu.py starts one of these per table row (one at a time), with the thread count fixed in
the environment (TVM_NUM_THREADS, OMP_NUM_THREADS, ...) before any library starts its pool.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
import traceback

from .common import Result, Settings


def run(engine: str, variant: str, settings: Settings, rebuild: bool = False) -> dict:
    load_before = os.getloadavg()
    started = time.perf_counter()
    try:
        if engine == "bandwidth":
            from .bandwidth import measure

            return {"engine": engine, **measure(settings.threads, settings.bandwidth_gib), "load_average": load_before,
                    "wall_s": time.perf_counter() - started}
        if engine == "mlcpipe":
            from .mlcpipe_side import run as run_engine

            result = run_engine(settings, variant, rebuild)
        elif engine == "pytorch":
            from .common import load_config

            if load_config(settings.model).architecture == "llama":  # the hand-written Llama (int4 too)
                from .peers.torch_llama import run as run_engine
            else:  # transformers' own model of the family
                from .peers.transformers_model import run as run_engine

            result = run_engine(settings, variant)
        elif engine == "llama.cpp":
            from .peers.llama_cpp import run as run_engine

            result = run_engine(settings, variant)
        else:
            raise ValueError(f"unknown engine {engine!r}")
    except Exception as exc:  # the table shows the failure instead of losing the whole run
        traceback.print_exc()
        message = f"{type(exc).__name__}: {exc}".splitlines()[0][:300]
        if isinstance(exc, ImportError):
            message += " (install the bench extra: pip install -e '.[bench]'; see benchmarks/results/README.md)"
        result = Result(engine, variant, error=message)
    out = dataclasses.asdict(result)
    out.update({"load_average": load_before, "load_average_after": os.getloadavg(), "wall_s": time.perf_counter() - started})
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--engine", required=True)
    ap.add_argument("--variant", default="")
    ap.add_argument("--settings", default="{}")
    ap.add_argument("--out", required=True)
    ap.add_argument("--rebuild", action="store_true")
    args = ap.parse_args(argv)
    settings = Settings(**json.loads(args.settings))
    out = run(args.engine, args.variant, settings, args.rebuild)
    with open(args.out, "w") as fh:
        json.dump(out, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())

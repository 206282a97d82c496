"""Build time per target: `mlcpipe build` of one model, phase by phase, against the 60 s goal.

    python -m benchmarks.build_time [--model llama-3.2-1b] [--quant q4f16_1]
        [--targets llvm,cuda,metal,webgpu] [--rounds 1] [--compare-stack]
        [-o benchmarks/results/build-time-<cpu>.md]

Each build is the CLI in a fresh process (what a user waits for: imports included), into a temp
dir that is removed afterwards. Wall seconds from outside, the phases from the build's own log
line, peak memory from the process's rusage. `--compare-stack` builds each target a second time
with MLCPIPE_SCRIPT_STACK=inspect (TVMScript's parser on TVM's own `inspect.stack`: the build as
it was before schedules/script_stack.py), in alternation, so both sides see the same machine.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from .common import cpu_llvm, cpu_model

GOAL_S = 60.0
PHASES_LINE = re.compile(r"\[mlcpipe\] build phases: (.*)")


def build_once(model: str, quant: str, target: str, env: dict) -> dict:
    """One `mlcpipe build` in a fresh process: wall seconds, phases, peak RSS (MiB)."""
    out = Path(tempfile.mkdtemp(prefix="mlcpipe-build-time-"))
    try:
        cmd = [sys.executable, "-m", "mlcpipe.cli", "build", "--model", model, "--quant", quant,
               "--target", target, "--output", str(out / "art")]
        started = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
        log = proc.stdout.read()
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - started
        proc.returncode = os.waitstatus_to_exitcode(status)
        if proc.returncode != 0:
            raise RuntimeError(f"{target}: mlcpipe build exited {proc.returncode}:\n{log[-3000:]}")
        found = PHASES_LINE.search(log)
        phases = {}
        for part in (found.group(1).split(", ") if found else []):
            name, seconds, _ = part.rsplit(" ", 2)
            phases[name] = float(seconds)
        return {"wall": wall, "phases": phases, "peak_mib": usage.ru_maxrss / 1024}
    finally:
        shutil.rmtree(out, ignore_errors=True)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="llama-3.2-1b")
    ap.add_argument("--quant", default="q4f16_1")
    ap.add_argument("--targets", default="llvm,cuda,metal,webgpu")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--compare-stack", action="store_true", help="also each target with MLCPIPE_SCRIPT_STACK=inspect")
    ap.add_argument("-o", "--output")
    args = ap.parse_args(argv)
    if args.rounds < 1:
        ap.error(f"--rounds {args.rounds}: expected at least 1")
    targets = [t for t in args.targets.split(",") if t]
    sides = {"mlcpipe": {k: v for k, v in os.environ.items() if k != "MLCPIPE_SCRIPT_STACK"}}
    if args.compare_stack:
        sides["TVM's inspect.stack"] = {**sides["mlcpipe"], "MLCPIPE_SCRIPT_STACK": "inspect"}
    runs: dict[tuple[str, str], list[dict]] = {}
    for _ in range(args.rounds):
        for target in targets:
            for side, env in sides.items():
                got = build_once(args.model, args.quant, target, env)
                runs.setdefault((target, side), []).append(got)
                print(f"{target:7s} {side:20s} {got['wall']:6.1f} s  " + ", ".join(f"{k} {v:.1f}" for k, v in got["phases"].items()), flush=True)

    phase_names = list(dict.fromkeys(name for rs in runs.values() for r in rs for name in r["phases"]))
    lines = [
        f"# `mlcpipe build` time per target: {args.model} {args.quant}", "",
        f"CPU: {cpu_model()} (llvm host: {cpu_llvm()}), {os.cpu_count()} cores; TVM_NUM_THREADS="
        f"{os.environ.get('TVM_NUM_THREADS', 'unset')}; {args.rounds} round(s), median wall seconds of a fresh "
        f"`python -m mlcpipe.cli build` process; phases from the build's log. Goal: at most {GOAL_S:.0f} s per target.", "",
        "| target | parser stack | wall s | " + " | ".join(phase_names) + " | peak MiB | goal |",
        "|---|---|---|" + "---|" * len(phase_names) + "---|---|",
    ]
    for (target, side), rs in runs.items():
        wall = statistics.median(r["wall"] for r in rs)
        cells = [f"{statistics.median(r['phases'].get(p, 0.0) for r in rs):.1f}" for p in phase_names]
        lines.append(f"| {target} | {side} | {wall:.1f} | " + " | ".join(cells)
                     + f" | {max(r['peak_mib'] for r in rs):.0f} | {'met' if wall <= GOAL_S else 'missed'} |")
    if args.compare_stack:
        lines += ["", "| target | wall, mlcpipe / TVM's inspect.stack |", "|---|---|"]
        for target in targets:
            a = statistics.median(r["wall"] for r in runs[(target, "mlcpipe")])
            b = statistics.median(r["wall"] for r in runs[(target, "TVM's inspect.stack")])
            lines.append(f"| {target} | {a / b:.2f} |")
    text = "\n".join(lines) + "\n"
    print(text)
    if args.output:
        from mlcpipe.artifact import write_file_atomic

        write_file_atomic(args.output, text)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""LLM CPU benchmark: mlcpipe (llvm) next to PyTorch CPU and llama.cpp, plus the machine's
bandwidth bound, all measured in the same invocation.

    python -m benchmarks.llm_cpu --threads 2 [--model llama-3.2-1b] [--quants q0f16,q4f16_1,q4f32_1]
        [--peers torch,llamacpp] [--torch-modes fp32,bf16,int4] [--llamacpp-types f16,q4_0,q4_k_m]
        [--context 300 --prefill 128 --decode-steps 32] [--rebuild] [-o benchmarks/results/llm-cpu-<cpu>.md]
    python -m benchmarks.llm_cpu --render benchmarks/results/llm-cpu-<cpu>.json [-o benchmarks/results/llm-cpu-<cpu>.md]

Every engine runs in its own subprocess (benchmarks/worker.py), one at a time, with the same
thread count (TVM_NUM_THREADS / torch.set_num_threads / llama.cpp n_threads). The bandwidth bound
is measured first and last. `--rounds N` runs the engine list N times, every other round in
reverse order (a machine whose bandwidth drifts during the run then favours no engine), and
reports per engine the median prefill and the decode p50 over all rounds' steps. Prints the
Markdown report; with -o writes it, and the raw results as JSON next to it (same name, .json).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import math
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from .common import Settings, cpu_llvm, cpu_model, thread_env
from .table import render

ROOT = Path(__file__).resolve().parents[1]
PEERS = ("torch", "llamacpp")
TORCH_MODES = ("fp32", "bf16", "int4")
LLAMACPP_TYPES = ("f16", "q4_0", "q4_k_m")


def _csv(value: str, allowed: tuple[str, ...] | None, what: str) -> list[str]:
    items = [v.strip() for v in value.split(",") if v.strip()]
    if allowed:
        bad = [v for v in items if v not in allowed]
        if bad:
            raise SystemExit(f"error: --{what}: got {bad[0]!r}; allowed: {', '.join(allowed)}")
    return items


def _versions() -> dict[str, str]:
    from importlib import metadata

    out = {"python": sys.version.split()[0]}
    for dist in ("apache-tvm", "apache-tvm-ffi", "numpy", "torch", "llama-cpp-python", "gguf"):
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            out[dist] = "not installed"
    return out


def _commit() -> str:
    try:
        sha = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--", "pipeline", "schedules", "configs", "benchmarks"],
                               cwd=ROOT, capture_output=True, text=True, timeout=10).stdout.strip()
        return sha + (" + uncommitted changes" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return "?"


def merge_rounds(results: list[dict]) -> dict:
    """One engine's row from its rounds: the median prefill, every round's decode steps, the
    per-round figures in the notes and in extra["rounds"]; rounds that failed are left out (all
    failed: the first failure)."""
    ok = [r for r in results if not r.get("error")]
    if len(results) == 1 or not ok:
        return results[0]
    row = dict(ok[0])
    prefills = [r["prefill_s"] for r in ok if r.get("prefill_s")]
    row["prefill_s"] = statistics.median(prefills) if prefills else None
    row["decode_ms"] = [ms for r in ok for ms in r.get("decode_ms", [])]
    per_round = [{"prefill_s": r.get("prefill_s"), "decode_p50_ms": statistics.median(r["decode_ms"]) if r.get("decode_ms") else None} for r in ok]
    row["extra"] = {**row.get("extra", {}), "rounds": per_round}
    shown = " / ".join(f"{x['decode_p50_ms']:.1f}" if x["decode_p50_ms"] else "–" for x in per_round)
    note = f"{len(ok)} rounds (alternating order): decode p50 per round {shown} ms"
    if len(ok) < len(results):
        note += f"; {len(results) - len(ok)} failed round(s) left out"
    row["notes"] = [*row.get("notes", []), note]
    return row


def run_worker(engine: str, variant: str, settings: Settings, rebuild: bool, timeout: float, log) -> dict:
    """One engine in its own process; its stderr goes to ours (progress, tracebacks)."""
    with tempfile.TemporaryDirectory(prefix="mlcpipe-bench-") as tmp:
        out = Path(tmp) / "result.json"
        cmd = [sys.executable, "-m", "benchmarks.worker", "--engine", engine, "--variant", variant,
               "--settings", json.dumps(dataclasses.asdict(settings)), "--out", str(out)] + (["--rebuild"] if rebuild else [])
        log(f"[bench] {engine} {variant} ...")
        t0 = time.perf_counter()
        try:
            proc = subprocess.run(cmd, cwd=ROOT, env=thread_env(settings.threads), stdout=sys.stderr, timeout=timeout)
            rc = proc.returncode
        except subprocess.TimeoutExpired:
            rc = "timeout"
        wall = time.perf_counter() - t0
        if out.is_file():
            result = json.loads(out.read_text())
        else:
            result = {"engine": engine, "dtype": variant, "error": f"worker exited with {rc} after {wall:.0f} s and wrote no result",
                      "decode_ms": [], "notes": [], "extra": {}}
        log(f"[bench] {engine} {variant}: done in {wall:.0f} s" + (f" — {result['error']}" if result.get("error") else ""))
        return result


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.llm_cpu", description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--model", default="llama-3.2-1b")
    ap.add_argument("--quants", default="q0f16,q4f16_1,q4f32_1", help="mlcpipe quantizations ('' for none)")
    ap.add_argument("--peers", default="torch,llamacpp", help=f"peers ('' for none): {','.join(PEERS)}")
    ap.add_argument("--torch-modes", default=",".join(TORCH_MODES))
    ap.add_argument("--llamacpp-types", default=",".join(LLAMACPP_TYPES))
    ap.add_argument("--context", type=int, default=300)
    ap.add_argument("--prefill", type=int, default=128)
    ap.add_argument("--decode-steps", type=int, default=32)
    ap.add_argument("--prefill-runs", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-bandwidth", action="store_true", help="skip the bandwidth bound")
    ap.add_argument("--bandwidth-gib", type=float, default=2.0, help="GiB read by the bandwidth bound (well beyond the LLC)")
    ap.add_argument("--rebuild", action="store_true", help="rebuild mlcpipe artifacts even when the sources are unchanged")
    ap.add_argument("--timeout", type=float, default=3600, help="seconds allowed to one engine")
    ap.add_argument("--rounds", type=int, default=1, help="times the engine list runs, every other round reversed (results merged)")
    ap.add_argument("-o", "--output", help="write the Markdown report here (and the raw JSON beside it)")
    ap.add_argument("--render", metavar="JSON", help="only re-render the report of an earlier run's JSON (no measuring)")
    args = ap.parse_args(argv)
    if args.render:
        report = render(json.loads(Path(args.render).read_text()))
        print(report)
        if args.output:
            Path(args.output).write_text(report)
        return 0

    if args.rounds < 1:
        raise SystemExit(f"error: --rounds: got {args.rounds}; allowed: an integer >= 1")
    from mlcpipe.config import load_model_config

    config = load_model_config(args.model)
    quants = _csv(args.quants, tuple(config.quantizations), "quants")
    peers = _csv(args.peers, PEERS, "peers")
    torch_modes = _csv(args.torch_modes, TORCH_MODES, "torch-modes") if "torch" in peers else []
    ll_types = _csv(args.llamacpp_types, LLAMACPP_TYPES, "llamacpp-types") if "llamacpp" in peers else []
    settings = Settings(model=args.model, threads=args.threads, context=args.context, prefill=args.prefill,
                        decode_steps=args.decode_steps, prefill_runs=args.prefill_runs, seed=args.seed,
                        bandwidth_gib=args.bandwidth_gib)
    log = lambda msg: print(msg, file=sys.stderr, flush=True)  # noqa: E731

    from .common import hf_weights

    params = sum(math.prod(shape) for _, shape, _ in hf_weights(config, args.seed))
    started = datetime.datetime.now().astimezone()
    run = {
        "meta": {
            "command": "python -m benchmarks.llm_cpu " + " ".join(shlex.quote(a) for a in (sys.argv[1:] if argv is None else argv)),
            "date": started.strftime("%Y-%m-%d %H:%M %Z"),
            "commit": _commit(),
            "cpu": cpu_model(),
            "cpu_llvm": cpu_llvm(),
            "cores": os.cpu_count(),
            "versions": _versions(),
            "model_display": config.display_name,
            "params": params,
            "load_start": list(os.getloadavg()),
            "rounds": args.rounds,
        },
        "settings": dataclasses.asdict(settings),
        "bandwidth": [],
        "rows": [],
    }
    jobs = [("mlcpipe", q) for q in quants] + [("pytorch", m) for m in torch_modes] + [("llama.cpp", t) for t in ll_types]
    if not args.no_bandwidth:
        run["bandwidth"].append(run_worker("bandwidth", "", settings, False, args.timeout, log))
    results: dict[tuple[str, str], list[dict]] = {job: [] for job in jobs}
    for i in range(args.rounds):
        for job in jobs if i % 2 == 0 else jobs[::-1]:
            results[job].append(run_worker(*job, settings, args.rebuild and i == 0, args.timeout, log))
    run["rows"] = [merge_rounds(results[job]) for job in jobs]
    if not args.no_bandwidth:
        run["bandwidth"].append(run_worker("bandwidth", "", settings, False, args.timeout, log))
    run["meta"]["load_end"] = list(os.getloadavg())
    run["meta"]["wall_s"] = (datetime.datetime.now().astimezone() - started).total_seconds()

    report = render(run)
    print(report)
    if args.output:
        out = Path(args.output)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(report)
        out.with_suffix(".json").write_text(json.dumps(run, indent=1) + "\n")
        log(f"[bench] wrote {out} and {out.with_suffix('.json')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""One cell's TVM work, in its own process (TVM cannot schedule one module for two targets in a
process): `python -m mlcpipe.nightly.worker SPEC.json`.

SPEC (written by runner.py): model (YAML path), quant, preset, options, and any of
  build:       {"output": DIR, "manifest_extra": {...}}  build the artifact there
  conformance: {"sizes": [...], "kernels": REGEX|null}   `mlcpipe check` on `artifact`
  profile:     {"prompt_len", "gen_len", "runs", "warmup"} `mlcpipe profile --weights synthetic`
with `artifact` (the artifact the checks run on), `checks_out` (where their reports go) and
`result` (a JSON file this process writes: each check's status and headline numbers). A failed
build exits non-zero (the traceback is in the log); a failed check is reported in `result`.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import traceback
from pathlib import Path
from typing import Any


def _die_with_parent() -> None:
    """Linux: get SIGTERM when the nightly process that started us dies (best effort)."""
    parent = os.getppid()
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return
    if os.getppid() != parent:
        sys.exit(1)


def _conformance(artifact: Path, settings: dict, out: Path) -> dict[str, Any]:
    from ..conformance import check_artifact, report_json

    report = check_artifact(artifact, tuple(settings["sizes"]), settings.get("kernels"),
                            progress=lambda i, n, name: print(f"[check {i + 1}/{n}] {name}", flush=True))
    from ..artifact import write_file_atomic

    write_file_atomic(out / "conformance.json", report_json(report) + "\n")
    write_file_atomic(out / "conformance.txt", report.table() + "\n\n" + report.summary + "\n")
    counts: dict[str, int] = {}
    for r in report.results:
        counts[r.status] = counts.get(r.status, 0) + 1
    status = "failed" if not report.ok else ("passed" if report.executed else "static-only")
    print(report.summary, flush=True)
    return {"status": status, "summary": report.summary, "counts": counts}


def _profile(artifact: Path, settings: dict, out: Path) -> dict[str, Any]:
    from ..device import peak_gbps
    from ..profiler.core import Workload
    from ..profiler.measure import profile
    from ..profiler.reports import render
    from ..profiler.schema import save_profile
    from ..runtime import Engine

    engine = Engine(artifact, "synthetic")
    data = profile(engine, Workload(settings["prompt_len"], settings["gen_len"], settings["runs"], settings["warmup"]),
                   progress=lambda label, done, n: print(f"[profile {done}/{n}] {label}", flush=True))
    data["peak_gbps"] = peak_gbps(engine.manifest["target"]["kind"], data["target_name"])
    save_profile(data, out / "profile.json")
    from ..artifact import write_file_atomic

    write_file_atomic(out / "profile.md", render(data, "md", peak_gbps=data["peak_gbps"]))
    m = data["metrics"]
    headline = {
        "prompt_len": settings["prompt_len"], "gen_len": settings["gen_len"],
        "load_ms": round(m["load_ms"], 2), "ttft_ms": round(m["ttft_ms"], 3),
        "prefill_tok_s": round(m["prefill_tok_s"], 1),
        "decode_ms_per_token_p50": round(m["decode_ms_per_token"]["p50"], 3),
        "decode_tok_s": round(m["decode_tok_s"], 1),
        "peak_host_memory_mb": round(m["peak_host_memory_bytes"] / 2**20, 1),
    }
    print(f"profile: {headline}", flush=True)
    return {"status": "passed", "headline": headline}


def run(spec: dict) -> dict[str, Any]:
    from ..build import build
    from ..config import load_model_config
    from ..targets import load_target

    result: dict[str, Any] = {}
    if spec.get("build"):
        config = load_model_config(spec["model"])
        target = load_target(spec["preset"], spec.get("options") or {})
        build(config, config.scheme(spec["quant"]), target, output=Path(spec["build"]["output"]),
              manifest_extra=spec["build"].get("manifest_extra"), log=lambda msg: print(msg, flush=True))
    out = Path(spec["checks_out"]) if spec.get("checks_out") else None
    for name, check in (("conformance", _conformance), ("profile", _profile)):
        if spec.get(name) is None:
            continue
        out.mkdir(parents=True, exist_ok=True)
        print(f"[mlcpipe] {name} check on {spec['artifact']}", flush=True)
        try:
            result[name] = check(Path(spec["artifact"]), spec[name], out)
        except Exception as exc:  # noqa: BLE001 - a check that crashes is a failed check, reported
            traceback.print_exc()
            result[name] = {"status": "failed", "error": f"{type(exc).__name__}: {str(exc).strip().splitlines()[-1] if str(exc).strip() else ''}"}
    return result


def main(argv: list[str]) -> int:
    _die_with_parent()
    # Ctrl-C reaches the whole foreground group; the nightly process alone decides (it stops its
    # workers with SIGTERM): a worker that turned SIGINT into an error mid-build would be reported
    # as a failed cell and replace the previous result. It starts with SIGINT blocked (the cell
    # thread's mask); ignoring it discards one that came during start-up, then it is unblocked.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    if len(argv) != 1:
        print("usage: python -m mlcpipe.nightly.worker SPEC.json", file=sys.stderr)
        return 2
    spec = json.loads(Path(argv[0]).read_text())
    result = run(spec)
    Path(spec["result"]).write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

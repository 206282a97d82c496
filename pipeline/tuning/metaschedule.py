"""`mlcpipe tune --tuner metaschedule`: TVM MetaSchedule searches a kernel's schedule, and wins
only if it beats the schedule our rules give.

For every static-shape kernel MetaSchedule runs `trials` candidates (local builder and runner,
random cost model); its best one, rebuilt from the trace, is checked against and timed with the
schedule `mlcpipe build` would use today. The trace goes into the tuning database only when it is
faster. Details: docs/tuning.md.
"""

from __future__ import annotations

import importlib.util
import logging
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import tvm

from ..backends import backend, kinds_with
from ..device import device as device_of
from ..config import ModelConfig
from ..kernel_info import random_args, symbolic_dims
from ..quantization import Quantization
from ..targets import TargetSpec
from ..threads import configure as configure_threads
from .candidates import TuneError, matching_kernels, nothing_tuned, unscheduled_kernels
from .knobs import compile_kernel, output_mismatch, run_kernel, time_kernel_ms, timing_device
from . import TuningDB


@dataclass
class SearchResult:
    kernel: str
    ours_rule: str
    ours_ms: float
    search_ms: float | None  # MetaSchedule's best, timed like ours; None when no candidate ran
    trials: int
    seconds: float
    kept: bool
    error: str | None = None
    trace: str | None = None  # MetaSchedule's best schedule (TVM JSON), stored when kept


def _search_target(target: tvm.target.Target) -> tvm.target.Target:
    """MetaSchedule's CPU rules need the core count in the target (the build does not)."""
    if not backend(target.kind.name).HOST_CPU:
        return target
    return tvm.target.Target({**target.export(), "num-cores": configure_threads()})


def _search(func: tvm.tirx.PrimFunc, target: tvm.target.Target, trials: int, seed: int, work_dir: Path) -> str | None:
    """MetaSchedule's best trace for `func` as JSON, or None when no candidate built and ran."""
    from tvm.s_tir import meta_schedule as ms

    from mlcpipe.schedules.trace_replay import trace_to_json

    mod = tvm.IRModule({"main": func.with_attr("global_symbol", "main")})
    # MetaSchedule's console handler takes this logger's level, which each search resets to DEBUG:
    # its progress tables stay in work_dir's log files
    logging.getLogger("tvm.s_tir.meta_schedule").setLevel(logging.WARNING)
    database = ms.tune_tir(
        mod, _search_target(target), str(work_dir),
        max_trials_global=trials, num_trials_per_iter=min(trials, 16),
        builder=ms.builder.LocalBuilder(timeout_sec=300, max_workers=2),
        runner=ms.runner.LocalRunner(timeout_sec=120), cost_model="random", seed=seed,
    )
    best = database.get_top_k(database.commit_workload(mod), 1)
    return trace_to_json(best[0].trace) if best else None


def tune_metaschedule(
    config: ModelConfig,
    quant: Quantization,
    target: TargetSpec,
    db: TuningDB,
    pattern: str | None = None,
    trials: int = 32,
    repeat: int = 5,
    seed: int = 0,
    log: Callable[[str], None] = print,
) -> list[SearchResult]:
    """Search every static kernel matching `pattern`; keep MetaSchedule's trace where it is faster."""
    from mlcpipe.schedules import schedule_func
    from mlcpipe.schedules.signature import kernel_signature
    from mlcpipe.schedules.trace_replay import RULE_NAME, replay

    allowed = kinds_with("METASCHEDULE")
    if target.kind not in allowed:
        raise TuneError(f"tune --tuner metaschedule --target {target.kind}: MetaSchedule cannot tune {target.kind} here "
                        f"(allowed: {', '.join(allowed)})")
    missing = [m for m in ("psutil", "cloudpickle") if importlib.util.find_spec(m) is None]
    if missing:
        raise TuneError(f"tune --tuner metaschedule needs {' and '.join(missing)}: pip install 'mlcpipe[metaschedule]'")
    device = timing_device(target.kind)
    cold_bytes = device_of(target.kind).timing_cold_bytes()  # the same timer as the knob tuner
    tvm_target = target.tvm_target()
    table = db.table(target.target)
    results: list[SearchResult] = []
    chosen = matching_kernels(unscheduled_kernels(config, quant, tvm_target), pattern, f"{config.name} {quant.name}")
    for name, func in chosen:
        if func.attrs is not None and "tirx.is_scheduled" in func.attrs:
            continue  # TVM's own kernels (paged attention, KV-cache copies) come scheduled
        symbolic = symbolic_dims(func)
        if symbolic:
            log(f"[tune] {name}: skipped (symbolic dims {', '.join(symbolic)}: MetaSchedule tunes static shapes only)")
            continue
        ours, record = schedule_func(func, tvm_target, table.get(kernel_signature(func)))
        if record is None:
            continue
        args = random_args(func, {}, seed=seed)
        lib = compile_kernel(ours, tvm_target)
        want = run_kernel(lib, args, device)
        result = SearchResult(name, record["rule"], time_kernel_ms(lib, args, device, repeat, cold_bytes), None, trials, 0.0, False)
        started = time.perf_counter()
        with tempfile.TemporaryDirectory(prefix="mlcpipe-ms-") as work_dir:
            try:
                result.trace = _search(func, tvm_target, trials, seed, Path(work_dir))
            except Exception as exc:  # noqa: BLE001 - a kernel MetaSchedule cannot tune keeps our schedule
                result.error = str(exc).strip().splitlines()[-1][:200]
        result.seconds = time.perf_counter() - started
        sch = replay(func, result.trace) if result.trace else None
        if sch is None:
            result.error = result.error or "no candidate built and ran"
        else:
            found = compile_kernel(sch.mod["main"], tvm_target)
            mismatch = output_mismatch(run_kernel(found, args, device), want, quant)
            if mismatch:
                result.error = f"output differs from our schedule ({mismatch})"
            else:
                result.search_ms = time_kernel_ms(found, args, device, repeat, cold_bytes)
                result.kept = result.search_ms < result.ours_ms
        if result.kept:
            db.put(target.target, kernel_signature(func), {
                "kernel": name, "rule": RULE_NAME, "knobs": {}, "trace": result.trace, "ms": round(result.search_ms, 4),
                "default_ms": round(result.ours_ms, 4), "replaces": record["rule"], "trials": trials, "sizes": {},
            })
        results.append(result)
        outcome = result.error or f"{result.search_ms:.4f} ms vs {result.ours_rule} {result.ours_ms:.4f} ms: " + (
            "kept" if result.kept else "ours stays")
        log(f"[tune] {name}: MetaSchedule {trials} trials in {result.seconds:.0f}s, {outcome}")
    if not results:
        raise TuneError(nothing_tuned(pattern, chosen, f"{config.name} {quant.name}",
                                      "MetaSchedule searches our scheduled kernels of static shape only"))
    db.save()
    return results


def report(results: list[SearchResult]) -> str:
    """Markdown table: our schedule against MetaSchedule's best, per kernel."""
    lines = ["| Kernel | Our rule | Ours (ms) | MetaSchedule (ms) | Trials | Search (s) | Kept |", "|---|---|---|---|---|---|---|"]
    for r in results:
        found = f"{r.search_ms:.4f}" if r.search_ms is not None else f"failed: {r.error}"
        lines.append(f"| {r.kernel} | {r.ours_rule} | {r.ours_ms:.4f} | {found} | {r.trials} | {r.seconds:.0f} | "
                     f"{'MetaSchedule' if r.kept else 'ours'} |")
    return "\n".join(lines)

"""`mlcpipe tune`: measure each kernel's knob candidates on the target, keep the fastest.

For every kernel (after fusion, before scheduling) each rule that takes it lists its candidates
(`knob_space`); each is compiled, run on seeded inputs of the kernel's real shapes, checked
against the first rule's default (what build applies untuned) and timed (the median of `repeat`
rounds, each timing every candidate once: interleaved_times). The fastest, of whichever rule,
wins (e.g. PrefillGEMMQ4VNNI, PrefillGEMMBF16 or PrefillGEMMF32 for a q4f16_1 prefill GEMM on a
CPU with VNNI and BF16). Winners go into the tuning database (pipeline/tuning/__init__.py) that `mlcpipe build` applies; a candidate whose
output differs is rejected and reported. Timing needs the target's device (its device module's
`timing_device`). Details: docs/tuning.md.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import tvm

from ..config import ModelConfig
from ..kernel_info import random_args, symbolic_dims
from ..quantization import Quantization
from ..targets import TargetSpec
from . import TuningDB, outputs_differ
from .candidates import TuneError, matching_kernels, nothing_tuned, shuffled, unscheduled_kernels  # noqa: F401 - re-exported for the tuners' callers



@dataclass
class KernelTuning:
    kernel: str
    signature: str
    rule: str
    default: dict
    best: dict
    default_ms: float
    best_ms: float
    candidates: list = field(default_factory=list)  # {"rule", "knobs", "ms" | None, "error" | None}
    default_rule: str = ""  # the rule build applies untuned (`default` are its knobs); `rule` won

    @property
    def speedup(self) -> float:
        return self.default_ms / self.best_ms if self.best_ms else 0.0


def timing_device(kind: str):
    """The device kernels of this target kind are timed on, as its device module says."""
    from ..device import device

    return device(kind).timing_device()


def compile_kernel(func: tvm.tirx.PrimFunc, target: tvm.target.Target):
    """One scheduled PrimFunc built on its own, callable as lib["main"] (with the lowerings the
    build uses: it is timed as the model will run it)."""
    from ..backends import backend

    backend(target.kind.name).install_lowerings()
    with target:
        return tvm.compile(tvm.IRModule({"main": func.with_attr("global_symbol", "main")}), target=target)


def run_kernel(lib, args, device):
    """Run once on copies of `args`; the last argument (the output) as float32."""
    tensors = [tvm.runtime.tensor(a, device) for a in args]
    lib["main"](*tensors)
    device.sync()
    return tensors[-1].numpy().astype(np.float32)


def timing_copies(args, cold_bytes: int, most: int = 64) -> int:
    """Input sets a timing rotates through: enough for `cold_bytes` (0: one)."""
    size = sum(a.nbytes for a in args) or 1
    return max(1, min(most, -(-cold_bytes // size)))


def timing_inputs(args, device, cold_bytes: int = 0) -> list[list]:
    """The input sets a timing rotates through (timing_copies of them), on `device`."""
    return [[tvm.runtime.tensor(a, device) for a in args] for _ in range(timing_copies(args, cold_bytes))]


def time_on_inputs(lib, sets: list[list], device, repeat: int) -> float:
    """Best of `repeat` timings (each at least 50 ms of calls, rotating through `sets`), in ms."""
    if len(sets) == 1:
        timer = lib.mod.time_evaluator("main", device, number=1, repeat=repeat, min_repeat_ms=50)
        return float(min(timer(*sets[0]).results)) * 1e3
    func = lib["main"]
    for tensors in sets:  # warm-up: code, page faults
        func(*tensors)
    device.sync()
    best = float("inf")
    for _ in range(repeat):
        calls, start = 0, time.perf_counter()
        while calls < len(sets) or time.perf_counter() - start < 0.05:
            func(*sets[calls % len(sets)])
            calls += 1
        device.sync()
        best = min(best, (time.perf_counter() - start) / calls)
    return best * 1e3


def time_kernel_ms(lib, args, device, repeat: int, cold_bytes: int = 0) -> float:
    """Best of `repeat` timings (each at least 50 ms of calls), in ms. With `cold_bytes`, the calls
    rotate through that many bytes of input copies, so the inputs are not in the cache."""
    return time_on_inputs(lib, timing_inputs(args, device, cold_bytes), device, repeat)


def interleaved_times(candidates: list[tuple], args, device, repeat: int, cold_bytes: int = 0) -> list[tuple]:
    """[(key, ms)]: each candidate's median of `repeat` timings (time_on_inputs, one each, on input
    sets made once for all), taken in rounds that time every candidate once, so that a drift of
    the machine's speed (memory bandwidth on a shared VM moves in phases of seconds) reaches all
    candidates alike."""
    sets = timing_inputs(args, device, cold_bytes) if candidates else []
    samples: list[list[float]] = [[] for _ in candidates]
    for _ in range(repeat):
        for times, (_key, lib) in zip(samples, candidates):
            times.append(time_on_inputs(lib, sets, device, 1))
    return [(key, float(np.median(times))) for (key, _lib), times in zip(candidates, samples)]


def output_mismatch(got: np.ndarray, want: np.ndarray, quant: Quantization) -> str | None:
    """None when two schedules' outputs agree (within the quantization's tolerance, relative to the
    output's scale: 2% for f16 models), else why not."""
    return outputs_differ(got, want, quant.tolerance)


def tune(
    config: ModelConfig,
    quant: Quantization,
    target: TargetSpec,
    db: TuningDB,
    pattern: str | None = None,
    budget: int = 8,
    tokens: int = 128,
    repeat: int = 5,
    seed: int = 0,
    log: Callable[[str], None] = print,
) -> list[KernelTuning]:
    """Tune every kernel (or those matching `pattern`) and store the winners in `db` (saved).
    Every rule that takes a kernel competes with `budget` knob candidates (its defaults first);
    the fastest whose output matches the untuned schedule's wins, whichever rule it is."""
    from mlcpipe.schedules import RULES
    from mlcpipe.schedules.signature import kernel_signature

    from ..device import device as device_of

    device = timing_device(target.kind)
    cold_bytes = device_of(target.kind).timing_cold_bytes()
    tvm_target = target.tvm_target()
    kernels = unscheduled_kernels(config, quant, tvm_target)
    results: list[KernelTuning] = []
    chosen = matching_kernels(kernels, pattern, f"{config.name} {quant.name}")
    for name, func in chosen:
        # every rule that takes the kernel and has knobs competes; the first (what build applies untuned) is the reference
        contenders = [(r, r.knob_space(func, tvm_target)) for r in RULES[target.kind]
                      if hasattr(r, "knob_space") and r.apply(func, tvm_target, False) is not None]
        contenders = [(r, space) for r, space in contenders if space]
        if not contenders:
            continue
        sizes = {d: tokens for d in symbolic_dims(func)}
        args = random_args(func, sizes, seed=seed)
        started = time.perf_counter()
        tried, libs = _build_candidates(func, contenders, tvm_target, args, device, quant, budget, seed)
        for entry, ms in interleaved_times(libs, args, device, repeat, cold_bytes):
            entry["ms"] = ms
        timed = [c for c in tried if c["ms"] is not None]
        if not timed:
            log(f"[tune] {name}: no candidate ran ({tried[0]['error']})")
            continue
        best = min(timed, key=lambda c: c["ms"])
        first, first_space = contenders[0]
        default_ms = tried[0]["ms"] if tried[0]["ms"] is not None else best["ms"]
        result = KernelTuning(name, kernel_signature(func), best["rule"], {k: dataclasses.asdict(first)[k] for k in first_space}, best["knobs"],
                              default_ms, best["ms"], tried, default_rule=type(first).__name__)
        results.append(result)
        db.put(target.target, result.signature, {
            "kernel": name, "rule": result.rule, "knobs": result.best, "ms": round(result.best_ms, 4),
            "default_rule": result.default_rule, "default_ms": round(result.default_ms, 4), "sizes": sizes,
            "candidates": [{"rule": c["rule"], "knobs": c["knobs"], "ms": None if c["ms"] is None else round(c["ms"], 4), "error": c["error"]}
                           for c in tried],
        })
        rules = len(contenders)
        log(f"[tune] {name}: {result.rule} {result.best} {result.best_ms:.3f} ms (default {result.default_rule} {result.default_ms:.3f} ms, "
            f"{len(timed)}/{len(tried)} candidates of {rules} rule{'s' * (rules > 1)}, {time.perf_counter() - started:.1f}s)")
    if not results:
        raise TuneError(nothing_tuned(pattern, chosen, f"{config.name} {quant.name}",
                                      f"no {target.kind} rule with knobs takes them, or no candidate ran"))
    db.save()
    return results


def _build_candidates(func, contenders: list[tuple], tvm_target, args: list, device, quant: Quantization, budget: int,
                      seed: int) -> tuple[list[dict], list[tuple[dict, object]]]:
    """Every rule's knob candidates built and run once: (every candidate's entry, with the error
    of those that declined, failed or computed another output; (entry, library) of the others,
    to time). The first rule's defaults come first: their output is the reference."""
    from mlcpipe.schedules import with_knobs

    want = None
    tried: list[dict] = []
    libs: list[tuple[dict, object]] = []
    for rule, space in contenders:
        for knobs in shuffled(space, dataclasses.asdict(rule), budget, seed):
            entry: dict = {"rule": type(rule).__name__, "knobs": knobs, "ms": None, "error": None}
            tried.append(entry)
            sch = with_knobs(rule, knobs).apply(func, tvm_target, False)
            if sch is None:
                entry["error"] = "rule declined these knobs"
                continue
            try:
                lib = compile_kernel(sch.mod["main"], tvm_target)
                got = run_kernel(lib, args, device)
            except Exception as exc:  # noqa: BLE001 - a failing candidate is reported, never chosen
                entry["error"] = str(exc).strip().splitlines()[-1][:200]
                continue
            if want is None:
                want = got
            mismatch = output_mismatch(got, want, quant)
            if mismatch:
                entry["error"] = f"output differs from the default schedule ({mismatch})"
                continue
            libs.append((entry, lib))
    return tried, libs


def report(results: list[KernelTuning]) -> str:
    """Markdown table of the tuning run."""
    lines = ["| Kernel | Rule | Default knobs | Default (ms) | Best knobs | Best (ms) | Speed-up |", "|---|---|---|---|---|---|---|"]
    for r in results:
        fmt = lambda k: " ".join(f"{a}={b}" for a, b in sorted(k.items()))  # noqa: E731
        default = fmt(r.default) if r.default_rule in ("", r.rule) else f"{r.default_rule}: {fmt(r.default)}"
        lines.append(f"| {r.kernel} | {r.rule} | {default} | {r.default_ms:.3f} | {fmt(r.best)} | {r.best_ms:.3f} | {r.speedup:.2f}x |")
    return "\n".join(lines)

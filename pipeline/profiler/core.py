"""The profiler's core, shared by its drivers (measure: TVM's runtime here; remote: over RPC;
webgpu: a WebGPU runtime): the two modes run alternately, run by run (low-overhead: whole steps
of the real generation; per-kernel: each kernel timed), so drift in machine load hits both alike;
the metrics of the low-overhead steps; the profile document (schema.py). A driver gives only what
its device measures."""

from __future__ import annotations

import dataclasses
import math
import os
import resource
from collections.abc import Callable

import numpy as np

from ..device import tvm_runtime as rt
from .schema import overhead_metrics, profile_header


@dataclasses.dataclass(frozen=True)
class Workload:
    """What a profile runs, whatever the device: `warmup` + `runs` generations per mode of
    `gen_len` tokens after a random prompt of `prompt_len` tokens (the same for the same seed)."""

    prompt_len: int = 128
    gen_len: int = 32
    runs: int = 3
    warmup: int = 1
    seed: int = 0

    def prompt(self, engine) -> list[int]:
        """The prompt's token ids, checked to fit the engine's context with `gen_len`."""
        engine.check_tokens([0] * self.prompt_len, self.gen_len)
        return [int(t) for t in np.random.default_rng(self.seed).integers(0, engine.vocab_size, size=self.prompt_len)]

    def config(self, threads: int | None = None, **extra) -> dict:
        """The profile document's `config` (schema.py)."""
        return {"prompt_len": self.prompt_len, "gen_len": self.gen_len, "runs": self.runs, "warmup_runs": self.warmup,
                "seed": self.seed, "threads": threads, **extra}


def alternate(warmup: int, runs: int, modes: list[tuple[str, Callable[[int], None]]],
              progress: Callable[[str, int, int], None] | None = None) -> None:
    """Each mode (label, fn(run)) once per run, in order, for the warm-up runs and then `runs`;
    `progress(label, done, total)` after each."""
    total, done = (warmup + runs) * len(modes), 0
    for run in range(warmup + runs):
        for label, measure in modes:
            measure(run)
            done += 1
            if progress:
                progress(label, done, total)


def weight_bytes(manifest: dict) -> int:
    """Bytes of the model's parameters (the manifest's shapes and dtypes): what a decode step reads."""
    return sum(int(math.prod(p["shape"]) * rt.dtype_bytes(p["dtype"])) for p in manifest["parameters"])


def percentiles(values: list[float]) -> dict[str, float]:
    if not values:
        return {"mean": 0.0, "p50": 0.0, "p95": 0.0, "p99": 0.0, "min": 0.0, "max": 0.0}
    arr = np.asarray(values)
    return {
        "mean": float(arr.mean()), "p50": float(np.percentile(arr, 50)), "p95": float(np.percentile(arr, 95)),
        "p99": float(np.percentile(arr, 99)), "min": float(arr.min()), "max": float(arr.max()),
    }


def ttft_ms(steps: list[dict], warmup: int) -> float:
    """Median time to first token of the measured runs: from the request (a new sequence in a
    fresh KV cache) through the prompt's prefill to the first token sampled on the host."""
    return float(np.median([s["first_token_ns"] / 1e6 for s in steps if s["run"] >= warmup and "first_token_ns" in s]))


def measured_ms(steps: list[dict], phase: str, warmup: int) -> list[float]:
    """The measured (not warm-up) steps' times of `phase`, in ms (steps as run_once records them)."""
    return [s["ns"] / 1e6 for s in steps if s["run"] >= warmup and s["phase"] == phase]


def metrics(engine, prompt_len: int, low_steps: list[dict], per_kernel_total_ms: float, warmup: int, weight_bytes: int) -> dict:
    """The profile's metrics from the low-overhead steps (`low_steps`: run, phase, ns, first_token_ns
    as run_once records them) and the per-kernel mode's total time."""
    low_prefill, low_decode = measured_ms(low_steps, "prefill", warmup), measured_ms(low_steps, "decode", warmup)
    prefill_ms = float(np.median(low_prefill))
    p50_decode = float(np.median(low_decode)) if low_decode else 0.0
    return {
        "load_ms": engine.load_seconds * 1e3,
        "ttft_ms": ttft_ms(low_steps, warmup),
        "prefill_ms": prefill_ms,
        "prefill_tok_s": prompt_len / (prefill_ms / 1e3) if prefill_ms else 0.0,
        "decode_ms_per_token": percentiles(low_decode),
        "decode_tok_s": 1e3 / p50_decode if p50_decode else 0.0,
        "warmup_prefill_ms": [s["ns"] / 1e6 for s in low_steps if s["run"] < warmup and s["phase"] == "prefill"],
        "peak_host_memory_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        "weight_bytes": weight_bytes,
        "overhead": overhead_metrics(per_kernel_total_ms, sum(low_prefill) + sum(low_decode)),
    }


def kernel_table(names, roles: dict[str, str], moved: dict[tuple[str, str], int], shapes: dict[tuple[str, str], list]) -> dict:
    """Every kernel's role, and per phase its moved bytes and argument shapes (empty if never called)."""
    return {
        name: {
            "role": roles.get(name, "other"),
            "bytes": {phase: b for (k, phase), b in moved.items() if k == name},
            "arg_shapes": {phase: sh for (k, phase), sh in shapes.items() if k == name},
        }
        for name in sorted(names)
    }


def document(engine, device: str, config: dict, metrics_: dict, tokens: list[int], kernels: dict, records: dict,
             environment: dict | None = None, method: dict | None = None) -> dict:
    """The profile (schema.py): header, where it ran and how, the metrics, the kernels, the runs."""
    return {
        **profile_header(engine.manifest),
        "device": device,
        **({"method": method} if method is not None else {}),
        "num_layers": engine.config["model_config"]["num_hidden_layers"],
        "config": config,
        "metrics": metrics_,
        "generated_tokens": tokens,
        "kernels": kernels,
        **records,
        "environment": {**(environment or {}), "load_average": list(os.getloadavg())},
    }

"""Profile a webgpu artifact's real run (Dawn): every kernel timed by WebGPU timestamp queries.

Two modes alternate run by run, as `measure.profile` does on llvm: low-overhead (each step's
wall time: dispatch, GPU work and the logits read back) and per-kernel (every compute pass of
the step carries timestamp writes; a sample is the GPU time of one kernel dispatch). Moved bytes
come from the manifest's argument shapes with the step's token count bound to symbolic dims.
"""

from __future__ import annotations

import os
import re
import resource
import time
from collections.abc import Callable

import numpy as np

from ..errors import ArtifactError
from ..runners.dawn import WebGPUEngine
from .measure import kernel_params, percentiles, ttft_ms, uncounted_params
from .schema import overhead_metrics, profile_header, run_records

_SINGLE = re.compile(r"^(B|batch_size|num_seq)$")  # one sequence


def _bytes_at(args: list[dict], tokens: int, skip: set[int]) -> tuple[int, list]:
    """Bytes of a kernel's arguments with symbolic dims bound (batch dims 1, others `tokens`)."""
    total, shapes = 0, []
    for pos, arg in enumerate(args):
        if not arg.get("shape"):
            shapes.append(None)
            continue
        dims = []
        for d in arg["shape"]:
            if isinstance(d, int):
                dims.append(d)
                continue
            names = {n: (1 if _SINGLE.match(n) else tokens) for n in re.findall(r"[A-Za-z_]\w*", d)}
            dims.append(int(eval(d, {"__builtins__": {}}, names)))  # manifest shape expressions: names, + - * //
        shapes.append(dims)
        if pos not in skip:
            total += int(np.prod(dims)) * np.dtype(arg["dtype"]).itemsize
    return total, shapes


def device_description(engine: WebGPUEngine) -> str:
    info = engine.adapter_info
    name = info.get("description") or info.get("device") or info.get("vendor") or "?"
    return f"WebGPU {engine.adapter}: {name} ({info.get('browser') or 'Dawn for node'})"


def profile(engine: WebGPUEngine, prompt_len: int = 32, gen_len: int = 8, runs: int = 2, warmup: int = 1,
            seed: int = 0, progress: Callable[[str, int, int], None] | None = None) -> dict:
    """Profile `engine` (a WebGPUEngine); returns the profile as a JSON-ready dict (schema.py)."""
    if "timestamp-query" not in engine.adapter_info.get("features", []):
        raise ArtifactError(f"--adapter {engine.adapter}: the adapter has no timestamp-query, so kernels cannot be timed; "
                            "use --adapter swiftshader (or a GPU)")
    manifest = engine.manifest
    engine.check_tokens([0] * prompt_len, gen_len)
    prompt = [int(t) for t in np.random.default_rng(seed).integers(0, engine.vocab_size, size=prompt_len)]
    kernels = {k["name"]: k for k in manifest["kernels"]}
    skip = uncounted_params(kernel_params(engine.artifact, manifest), manifest)
    total = (warmup + runs) * 2
    done = 0
    low_steps: list[dict] = []
    steps: list[dict] = []
    samples: list[tuple] = []
    moved: dict[tuple[str, str], tuple[int, list]] = {}
    tokens: list[int] = []

    def one_run(run: int, timed: bool, out: list[dict]) -> list[int]:
        engine.timed = timed
        t_request = time.perf_counter_ns()  # TTFT counts from here: a new sequence, prefill, first token
        engine.reset()
        t_start = time.perf_counter_ns()
        generated: list[int] = []
        for step in range(gen_len):
            if step == 0:
                t0 = time.perf_counter_ns()
                for i in range(0, len(prompt), engine.prefill_chunk):
                    chunk_start = time.perf_counter_ns()
                    logits = engine._step("prefill", np.asarray(prompt[i : i + engine.prefill_chunk]))
                    record(run, timed, "prefill", 0, len(prompt[i : i + engine.prefill_chunk]), chunk_start - t_start)
            else:
                t0 = time.perf_counter_ns()
                logits = engine._step("decode", np.asarray([generated[-1]]))
                record(run, timed, "decode", step, 1, t0 - t_start)
            t1 = time.perf_counter_ns()
            out.append({"run": run, "phase": "prefill" if step == 0 else "decode", "step": step,
                        "tokens": len(prompt) if step == 0 else 1, "start_ns": t0 - t_start, "ns": t1 - t0})
            generated.append(int(np.argmax(logits)))
            if step == 0:
                out[-1]["first_token_ns"] = time.perf_counter_ns() - t_request
        return generated

    def record(run: int, timed: bool, phase: str, step: int, n_tokens: int, start_ns: int) -> None:
        if not timed:
            return
        at = start_ns
        for name, ns in engine.last_kernels:
            samples.append((name, "vm", phase, step, run, at, ns))
            at += ns
            if (name, phase) not in moved and name in kernels:
                moved[(name, phase)] = _bytes_at(kernels[name]["args"], n_tokens, skip.get(name, set()))

    try:
        for run in range(warmup + runs):
            one_run(run, False, low_steps)
            done += 1
            if progress:
                progress("low-overhead", done, total)
            tokens = one_run(run, True, steps)
            done += 1
            if progress:
                progress("per-kernel", done, total)
    finally:
        engine.timed = False

    def measured(step_list, phase):
        return [s["ns"] / 1e6 for s in step_list if s["run"] >= warmup and s["phase"] == phase]

    low_prefill, low_decode = measured(low_steps, "prefill"), measured(low_steps, "decode")
    per_kernel_total = sum(measured(steps, "prefill")) + sum(measured(steps, "decode"))
    p50_prefill = float(np.median(low_prefill))
    p50_decode = float(np.median(low_decode)) if low_decode else 0.0
    names = sorted(set(kernels) | {s[0] for s in samples})
    return {
        **profile_header(manifest),
        "device": device_description(engine),
        "num_layers": engine.config["model_config"]["num_hidden_layers"],
        "config": {"prompt_len": prompt_len, "gen_len": gen_len, "runs": runs, "warmup_runs": warmup, "seed": seed,
                   "threads": None, "adapter": engine.adapter},
        "method": {"kind": "real run", "timer": "timestamp-query",
                   "runtime": f"{engine.adapter_info.get('browser') or 'Dawn (npm webgpu)'} + @mlc-ai/web-runtime",
                   "adapter": engine.adapter_info, "bytes": "manifest argument shapes at the step's token count"},
        "metrics": {
            "load_ms": engine.load_seconds * 1e3,
            "ttft_ms": ttft_ms(low_steps, warmup),
            "prefill_ms": p50_prefill,
            "prefill_tok_s": prompt_len / (p50_prefill / 1e3),
            "decode_ms_per_token": percentiles(low_decode),
            "decode_tok_s": 1e3 / p50_decode if p50_decode else 0.0,
            "warmup_prefill_ms": [s["ns"] / 1e6 for s in low_steps if s["run"] < warmup and s["phase"] == "prefill"],
            "peak_host_memory_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
            "weight_bytes": engine.weight_bytes,
            "overhead": overhead_metrics(per_kernel_total, sum(low_prefill) + sum(low_decode)),
        },
        "generated_tokens": tokens,
        "kernels": {
            name: {
                "role": kernels.get(name, {}).get("role", "other"),
                "bytes": {phase: b for (k, phase), (b, _) in moved.items() if k == name},
                "arg_shapes": {phase: sh for (k, phase), (_, sh) in moved.items() if k == name},
            }
            for name in names
        },
        **run_records(low_steps, steps, samples, warmup),
        "environment": {"load_average": list(os.getloadavg())},
    }

"""Profile a webgpu artifact's real run (Dawn): every kernel timed by WebGPU timestamp queries.

Two modes alternate run by run, as `measure.profile` does on llvm: low-overhead (each step's
wall time: dispatch, GPU work and the logits read back) and per-kernel (every compute pass of
the step carries timestamp writes; a sample is the GPU time of one kernel dispatch). Moved bytes
come from the manifest's argument shapes with the step's token count bound to symbolic dims.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable

import numpy as np

from ...errors import ArtifactError
from ...profiler.core import Workload, alternate, document, kernel_table, measured_ms, metrics
from ...profiler.measure import kernel_params, uncounted_params
from ...profiler.schema import run_records
from .dawn import WebGPUEngine

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


def profile(engine: WebGPUEngine, workload: Workload = Workload(32, 8, 2), progress: Callable[[str, int, int], None] | None = None) -> dict:
    """Profile `engine` (a WebGPUEngine); returns the profile as a JSON-ready dict (schema.py)."""
    if "timestamp-query" not in engine.adapter_info.get("features", []):
        raise ArtifactError(f"--adapter {engine.adapter}: the adapter has no timestamp-query, so kernels cannot be timed; "
                            "use --adapter swiftshader (or a GPU)")
    manifest = engine.manifest
    prompt, gen_len, warmup = workload.prompt(engine), workload.gen_len, workload.warmup
    kernels = {k["name"]: k for k in manifest["kernels"]}
    timed = _TimedRuns(engine, prompt, gen_len, kernels, uncounted_params(kernel_params(engine.artifact, manifest), manifest))
    low_steps: list[dict] = []
    steps: list[dict] = []
    tokens: list[int] = []

    def per_kernel(run: int) -> None:
        nonlocal tokens
        tokens = timed.run(run, True, steps)

    try:
        alternate(warmup, workload.runs, [("low-overhead", lambda run: timed.run(run, False, low_steps)), ("per-kernel", per_kernel)], progress)
    finally:
        engine.timed = False
    per_kernel_total = sum(measured_ms(steps, "prefill", warmup)) + sum(measured_ms(steps, "decode", warmup))
    roles = {name: k.get("role", "other") for name, k in kernels.items()}
    method = {"kind": "real run", "timer": "timestamp-query",
              "runtime": f"{engine.adapter_info.get('browser') or 'Dawn (npm webgpu)'} + @mlc-ai/web-runtime",
              "adapter": engine.adapter_info, "bytes": "manifest argument shapes at the step's token count"}
    moved = {key: b for key, (b, _) in timed.moved.items()}
    shapes = {key: sh for key, (_, sh) in timed.moved.items()}
    return document(engine, device_description(engine), workload.config(adapter=engine.adapter),
                    metrics(engine, workload.prompt_len, low_steps, per_kernel_total, warmup, engine.weight_bytes), tokens,
                    kernel_table(set(kernels) | {s[0] for s in timed.samples}, roles, moved, shapes),
                    run_records(low_steps, steps, timed.samples, warmup), method=method)


class _TimedRuns:
    """Generations on a WebGPUEngine as a request is served (a new sequence, the prompt's prefill
    in chunks, the first token, decode steps); with `timed`, every kernel dispatch's GPU time
    (timestamp queries) recorded as a sample laid end to end from its step's start."""

    def __init__(self, engine: WebGPUEngine, prompt: list[int], gen_len: int, kernels: dict, skip: dict[str, set[int]]):
        self.engine, self.prompt, self.gen_len, self.kernels, self.skip = engine, prompt, gen_len, kernels, skip
        self.samples: list[tuple] = []
        self.moved: dict[tuple[str, str], tuple[int, list]] = {}

    def run(self, run: int, timed: bool, out: list[dict]) -> list[int]:
        """One generation; its step records appended to `out`; the generated tokens."""
        engine, prompt = self.engine, self.prompt
        engine.timed = timed
        t_request = time.perf_counter_ns()  # TTFT counts from here: a new sequence, prefill, first token
        engine.reset()
        t_start = time.perf_counter_ns()
        generated: list[int] = []
        for step in range(self.gen_len):
            t0 = time.perf_counter_ns()
            if step == 0:
                for i in range(0, len(prompt), engine.prefill_chunk):
                    chunk_start = time.perf_counter_ns()
                    logits = engine._step("prefill", np.asarray(prompt[i : i + engine.prefill_chunk]))
                    self._record(run, timed, "prefill", 0, len(prompt[i : i + engine.prefill_chunk]), chunk_start - t_start)
            else:
                logits = engine._step("decode", np.asarray([generated[-1]]))
                self._record(run, timed, "decode", step, 1, t0 - t_start)
            t1 = time.perf_counter_ns()
            out.append({"run": run, "phase": "prefill" if step == 0 else "decode", "step": step,
                        "tokens": len(prompt) if step == 0 else 1, "start_ns": t0 - t_start, "ns": t1 - t0})
            generated.append(int(np.argmax(logits)))
            if step == 0:
                out[-1]["first_token_ns"] = time.perf_counter_ns() - t_request
        return generated

    def _record(self, run: int, timed: bool, phase: str, step: int, n_tokens: int, start_ns: int) -> None:
        if not timed:
            return
        at = start_ns
        for name, ns in self.engine.last_kernels:
            self.samples.append((name, "vm", phase, step, run, at, ns))
            at += ns
            if (name, phase) not in self.moved and name in self.kernels:
                self.moved[(name, phase)] = _bytes_at(self.kernels[name]["args"], n_tokens, self.skip.get(name, set()))

"""Run prefill + decode on an Engine and time every kernel call.

Per-kernel mode: the Relax VM instrument times every kernel the VM launches; kernels that run
inside the paged KV cache (attention, rope, kv append, state merge) are invisible to it, so the
KV cache is re-created with each of its kernels wrapped in a timer (the kernel names come from
the manifest's `kv_cache_kernels`). Low-overhead mode times whole forward steps only; both are
run and the per-kernel mode's overhead is reported against it. The first run is warm-up: kept in
the JSON, marked, and left out of the statistics.
"""

from __future__ import annotations

import os
import platform
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..artifact import read_json, verified
from ..backends import backend
from ..device import tvm_runtime as rt
from ..kernel_inputs import KV_CACHE_CREATE
from ..runtime import Engine

from .core import Workload, alternate, document, kernel_table, measured_ms, metrics, weight_bytes
from .schema import run_records


def device_description(target_kind: str, device=None) -> str:
    """The CPU and its threads (host-CPU targets), else the device's name as its runtime gives it."""
    if backend(target_kind).HOST_CPU:
        name = platform.processor() or platform.machine()
        cpuinfo = Path("/proc/cpuinfo")
        if cpuinfo.exists():
            for line in cpuinfo.read_text().splitlines():
                if line.startswith("model name"):
                    name = line.split(":", 1)[1].strip()
                    break
        return f"{name} ({rt.num_threads()} threads)"
    if device is not None and not device.dlpack_device_type() >= rt.RPC_SESS_MASK:
        return f"{target_kind}: {rt.device_name(device)}"
    return target_kind


@dataclass
class RecordedTensor:
    shape: tuple[int, ...]
    dtype: str
    data: np.ndarray  # int32 (positions, page tables, token ids): this call's; else the first call's
                      # contents at this kernel / position / shape, shared between calls


@dataclass
class RecordedCall:
    """One kernel call of a run: its arguments as they were just before the kernel ran."""

    kernel: str
    parent: str  # "vm" or "kv_cache"
    phase: str
    step: int
    args: list  # RecordedTensor for tensors, the value for scalars


class _Recorder:
    """Collects (kernel, parent, phase, step, start_ns, duration_ns) for every kernel call; with
    `record_calls`, also every call's arguments (`calls`, untimed: taken before the timer starts)."""

    def __init__(self, kernels: set[str], skip_params: dict[str, set[int]], device, record_calls: bool = False):
        # GPU launches are asynchronous: synchronise around each kernel so its time is its own
        self.sync = (lambda: None) if rt.is_cpu(device) else (lambda: rt.sync(device))
        self.kernels = kernels
        self.skip_params = skip_params  # kernel -> arg positions not counted as moved bytes
        self.samples: list[tuple] = []
        self.bytes: dict[tuple[str, str], int] = {}
        self.shapes: dict[tuple[str, str], list] = {}
        self.phase, self.step, self.run = "", 0, 0
        self._t0 = 0
        self.calls: list[RecordedCall] | None = [] if record_calls else None
        self._contents: dict[tuple, np.ndarray] = {}

    def _record_call(self, name: str, parent: str, args) -> None:
        if self.calls is None:
            return
        recorded: list = []
        for pos, arg in enumerate(args):
            if rt.is_tensor(arg):
                shape, dtype = tuple(int(d) for d in arg.shape), str(arg.dtype)
                key = (name, pos, shape, dtype)
                if dtype == "int32":
                    data = rt.to_numpy(arg)
                else:
                    data = self._contents.get(key)
                    if data is None:
                        data = self._contents[key] = rt.to_numpy(arg)
                recorded.append(RecordedTensor(shape, dtype, data))
            elif isinstance(arg, bool | int | float):
                recorded.append(arg)
            else:
                raise RuntimeError(f"{name}: cannot record an argument of type {type(arg).__name__}")
        self.calls.append(RecordedCall(name, parent, self.phase, self.step, recorded))

    def _count_bytes(self, name: str, args) -> None:
        key = (name, self.phase)
        if key in self.bytes:
            return
        self.shapes[key] = [[int(d) for d in a.shape] if rt.is_tensor(a) else None for a in args]
        total = 0
        for pos, arg in enumerate(args):
            if rt.is_tensor(arg) and pos not in self.skip_params.get(name, ()):
                total += int(int(np.prod(arg.shape)) * rt.dtype_bytes(arg.dtype))
        self.bytes[key] = total

    def instrument(self, func, name, before_run, ret, *args):
        del func, ret
        if name in self.kernels:
            if before_run:
                self._record_call(name, "vm", args)
                self.sync()
                self._t0 = time.perf_counter_ns()
            else:
                self.sync()
                end = time.perf_counter_ns()
                self.samples.append((name, "vm", self.phase, self.step, self.run, self._t0, end - self._t0))
                self._count_bytes(name, args)
        return 0

    def wrap(self, fn, name: str) -> Callable:
        def timed(*args):
            self._record_call(name, "kv_cache", args)
            self.sync()
            start = time.perf_counter_ns()
            fn(*args)
            self.sync()
            end = time.perf_counter_ns()
            self.samples.append((name, "kv_cache", self.phase, self.step, self.run, start, end - start))
            self._count_bytes(name, args)

        return timed


def _wrapped_kv_cache_factory(engine: Engine, recorder: _Recorder) -> Callable[[], object]:
    """A function creating the KV cache with every kernel in it wrapped by `recorder`."""
    captured = {}

    def capture(func, name, before_run, ret, *args):
        del func, ret
        if before_run and name == KV_CACHE_CREATE:
            captured["args"] = list(args)
        return 0

    engine.vm.set_instrument(capture)
    engine.reset()
    engine.vm.set_instrument(None)
    slots = engine.manifest.get("kv_cache_kernels") or []
    if "args" not in captured or len(slots) != len(captured["args"]):
        raise RuntimeError("could not capture the KV cache's kernels (artifact built by an older mlcpipe? rebuild it)")
    args = []
    for arg, slot in zip(captured["args"], slots):
        if isinstance(slot, str):
            args.append(recorder.wrap(arg, slot))
        elif isinstance(slot, list) and slot:
            args.append([recorder.wrap(a, s) if s else a for a, s in zip(arg, slot)])
        else:
            args.append(arg)
    create = rt.global_func(KV_CACHE_CREATE)
    add_sequence = rt.global_func("vm.builtin.kv_state_add_sequence")

    def make():
        kv = create(*args)
        add_sequence(kv, 0)
        return kv

    return make


def run_once(engine: Engine, prompt: list[int], gen_len: int, recorder: _Recorder | None, make_kv, run: int, steps: list):
    """One generation, as a request is served: a new sequence, the prompt's prefill, the first
    token, then decode steps. Appends step records to `steps` (the prefill's also has
    `first_token_ns`, request to first token); returns the generated tokens."""
    t_request = time.perf_counter_ns()
    if make_kv is None:
        engine.reset()
    else:
        engine.kv_cache = make_kv()
    t_start = time.perf_counter_ns()
    if recorder:
        recorder.phase, recorder.step, recorder.run = "prefill", 0, run
    t0 = time.perf_counter_ns()
    logits = engine.prefill(prompt)
    t1 = time.perf_counter_ns()
    token = int(np.argmax(logits))
    t_first = time.perf_counter_ns()
    steps.append({"run": run, "phase": "prefill", "step": 0, "tokens": len(prompt), "start_ns": t0 - t_start, "ns": t1 - t0,
                  "first_token_ns": t_first - t_request})
    out = [token]
    for i in range(1, gen_len):
        if recorder:
            recorder.phase, recorder.step = "decode", i
        t0 = time.perf_counter_ns()
        logits = engine.decode(token)
        token = int(np.argmax(logits))
        t1 = time.perf_counter_ns()
        steps.append({"run": run, "phase": "decode", "step": i, "tokens": 1, "start_ns": t0 - t_start, "ns": t1 - t0})
        out.append(token)
    return out


def uncounted_params(params: dict[str, list[str]], manifest: dict) -> dict[str, set[int]]:
    """kernel -> argument positions left out of its moved bytes: the paged KV cache's page pool
    (a call reads only its sequence's pages) and an embedding lookup's table (a call reads only
    the rows of its tokens)."""
    weights = {p["name"] for p in manifest.get("parameters", [])}
    roles = {k["name"]: k.get("role") for k in manifest.get("kernels", [])}
    out = {}
    for kernel, names in params.items():
        table = roles.get(kernel) == "embedding"
        out[kernel] = {i for i, p in enumerate(names) if p == "pages" or (table and (p in weights or "embed" in p))}
    return out


def kernel_params(artifact: Path, manifest: dict) -> dict[str, list[str]]:
    """kernel -> its parameter names (from the artifact's reference record of kernel signatures;
    {} for an artifact built without one)."""
    record = manifest.get("reference")
    if not isinstance(record, dict) or "kernels" not in record:
        return {}
    kernels = read_json(verified(Path(artifact), manifest, record["kernels"], "reference"), "reference record").get("kernels", {})
    return {name: [p["name"] for p in k["signature"]["params"]] for name, k in kernels.items()}


def record_calls(engine: Engine, workload: Workload) -> list[RecordedCall]:
    """One generation as `profile` runs it (same prompt for the same seed), every kernel call
    recorded in call order with its arguments: the call sequence `profile --rpc` times on the remote."""
    recorder = _Recorder({k["name"] for k in engine.manifest["kernels"]}, {}, engine.device, record_calls=True)
    make_kv = _wrapped_kv_cache_factory(engine, recorder)
    engine.vm.set_instrument(recorder.instrument)
    try:
        run_once(engine, workload.prompt(engine), workload.gen_len, recorder, make_kv, 0, [])
    finally:
        engine.vm.set_instrument(None)
    return recorder.calls


def profile(engine: Engine, workload: Workload = Workload(), progress: Callable[[str, int, int], None] | None = None) -> dict:
    """Profile `engine`; returns the profile as a JSON-ready dict (schema in `schema.py`)."""
    manifest = engine.manifest
    prompt, gen_len, warmup = workload.prompt(engine), workload.gen_len, workload.warmup
    kernels = {k["name"] for k in manifest["kernels"]}
    recorder = _Recorder(kernels, uncounted_params(kernel_params(engine.artifact, manifest), manifest), engine.device)
    make_kv = _wrapped_kv_cache_factory(engine, recorder)
    low_steps: list = []
    steps: list = []
    tokens: list[int] = []

    def low_overhead(run: int) -> None:
        engine.vm.set_instrument(None)  # whole-step timing only
        run_once(engine, prompt, gen_len, None, None, run, low_steps)

    def per_kernel(run: int) -> None:
        nonlocal tokens
        engine.vm.set_instrument(recorder.instrument)
        tokens = run_once(engine, prompt, gen_len, recorder, make_kv, run, steps)

    try:
        alternate(warmup, workload.runs, [("low-overhead", low_overhead), ("per-kernel", per_kernel)], progress)
    finally:
        engine.vm.set_instrument(None)
    per_kernel_total = sum(measured_ms(steps, "prefill", warmup)) + sum(measured_ms(steps, "decode", warmup))
    roles = {k["name"]: k.get("role", "other") for k in manifest["kernels"]}
    host_cpu = backend(manifest["target"]["kind"]).HOST_CPU
    config = workload.config(rt.num_threads() if host_cpu else None)
    return document(engine, device_description(manifest["target"]["kind"], engine.device), config,
                    metrics(engine, workload.prompt_len, low_steps, per_kernel_total, warmup, weight_bytes(manifest)), tokens,
                    kernel_table(kernels, roles, recorder.bytes, recorder.shapes),  # every kernel; ones never called: empty
                    run_records(low_steps, steps, recorder.samples, warmup), {"TVM_NUM_THREADS": os.environ.get("TVM_NUM_THREADS")})

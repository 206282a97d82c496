"""Profile a webgpu artifact by kernel replay on wgpu (lavapipe here).

TVM has no WebGPU device in Python, so the Relax VM cannot run a webgpu artifact. Instead:
1. the same model and quantization built for llvm runs one prefill + greedy decode with every
   kernel call recorded (`measure.record_calls`: kernel, phase, step, arguments). The paged KV
   cache's C++ runtime and the Relax graph are the same on both targets, so this is the webgpu
   run's call sequence; only the KV cache's kernels differ by name (`kernel_map`);
2. every call is prepared once on the device with the recorded arguments (real data: weights and
   activations as the first llvm call of that kernel and shape saw them; each call's own int32
   positions, page tables and token ids), then the sequence is replayed `warmup + runs` times,
   alternating two modes run by run as `measure.profile` does:
   - low-overhead: each forward step's kernels dispatched back to back in one command buffer and
     timed as one (the profile's metrics: TTFT, prefill, decode ms/token, tok/s);
   - per-kernel: every kernel call dispatched and timed alone (the samples);
   both with `runners.webgpu.time_calls` (WebGPU timestamp queries where the adapter has them,
   else synchronised wall time). Metrics are sums of replayed kernel device time only: no host,
   VM, upload or readback time; no tokens are generated on the device.
The result is a profile in the schema of `schema.py`, plus `method` describing the replay.
"""

from __future__ import annotations

import json
import os
import resource
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import tvm

from ..artifact import RUNTIME_CONFIG, ArtifactError, read_manifest
from ..config import ModelConfig, parse_model_config
from ..runners import webgpu as runner
from .kernel_map import map_kernels
from .measure import RecordedCall, RecordedTensor, _kernel_params, _percentiles, record_calls, uncounted_params
from .schema import overhead_metrics, profile_header


def model_config_of(artifact: str | Path) -> ModelConfig:
    """The model config an artifact was built from (its runtime config keeps all of it)."""
    path = Path(artifact) / RUNTIME_CONFIG
    if not path.is_file():
        raise ArtifactError(f"{artifact}: {RUNTIME_CONFIG} missing; rebuild the artifact")
    return parse_model_config(json.loads(path.read_text())["model_config"], str(path))


def device_description() -> str:
    info = runner.adapter_info()
    on_cpu = info.get("adapter_type") == "CPU" or str(info.get("adapter_type")).lower() == "cpu"
    name = "lavapipe" if on_cpu and info.get("vendor") == "llvmpipe" and info.get("backend_type") == "Vulkan" else info.get("device", "?")
    where = f"{info.get('backend_type', '?')} on CPU" if on_cpu else f"{info.get('backend_type', '?')}, {info.get('device', '?')}"
    return f"{name} ({where}; {info.get('description', '')}) via wgpu — kernel replay of the llvm call sequence"


class _Calls:
    """Prepared device calls, shared by replayed calls with the same kernel and arguments; device
    arrays shared by calls with the same kernel, position and shape (int32 ones also by data)."""

    def __init__(self, scheduled: tvm.IRModule, target: tvm.target.Target):
        self.scheduled, self.target = scheduled, target
        self.arrays: dict[tuple, runner.DeviceArray] = {}
        self.calls: dict[tuple, runner.PreparedCall] = {}

    def get(self, kernel: str, call: RecordedCall) -> runner.PreparedCall:
        key = (kernel, tuple(
            (a.shape, a.dtype, a.data.tobytes() if a.dtype == "int32" else None) if isinstance(a, RecordedTensor) else a
            for a in call.args
        ))  # fmt: skip
        if key in self.calls:
            return self.calls[key]
        func = self.scheduled[kernel]
        if len(call.args) != len(func.params):
            raise ArtifactError(f"{kernel} (replaying llvm {call.kernel}): {len(call.args)} recorded arguments, the webgpu kernel takes {len(func.params)}")
        args = []
        for pos, arg in enumerate(call.args):
            if not isinstance(arg, RecordedTensor):
                args.append(arg)
                continue
            array_key = (kernel, pos, arg.shape, arg.dtype, arg.data.tobytes() if arg.dtype == "int32" else None)
            if array_key not in self.arrays:
                self.arrays[array_key] = runner.upload(arg.data)
            args.append(self.arrays[array_key])
        try:
            self.calls[key] = runner.prepare(func, self.target, args)
        except (ValueError, TypeError) as exc:
            raise ArtifactError(f"{kernel} (replaying llvm {call.kernel}): {exc}") from None
        return self.calls[key]


def prepare_replay(artifact: str | Path, calls: list[RecordedCall], kernels: list[str]) -> list[runner.PreparedCall]:
    """Each recorded call made ready on the device as the webgpu artifact's kernel `kernels[i]`,
    with the recorded arguments (calls with the same kernel and arguments share one)."""
    artifact = Path(artifact)
    path = artifact / "tir" / "scheduled.json"
    if not path.is_file():
        raise ArtifactError(f"{artifact}: tir/scheduled.json missing (artifact built by an older mlcpipe? rebuild it)")
    pool = _Calls(tvm.ir.load_json(path.read_text()), tvm.target.Target(read_manifest(artifact)["target"]))
    return [pool.get(k, c) for k, c in zip(kernels, calls)]


def _step_groups(calls: list[RecordedCall]) -> list[tuple[str, int, list[int]]]:
    """(phase, step, indices of its calls) in call order."""
    groups: list[tuple[str, int, list[int]]] = []
    for i, call in enumerate(calls):
        if not groups or groups[-1][:2] != (call.phase, call.step):
            groups.append((call.phase, call.step, []))
        groups[-1][2].append(i)
    return groups


def _moved_bytes(call: RecordedCall, skip: set[int]) -> int:
    return sum(int(np.prod(a.shape)) * tvm.runtime.DataType(a.dtype).bits // 8
               for pos, a in enumerate(call.args) if isinstance(a, RecordedTensor) and pos not in skip)  # fmt: skip


def profile_replay(
    artifact: str | Path,
    llvm_artifact: str | Path,
    prompt_len: int = 128,
    gen_len: int = 32,
    runs: int = 3,
    warmup: int = 1,
    seed: int = 0,
    weights: str | Path = "synthetic",
    progress: Callable[[str, int, int], None] | None = None,
) -> dict:
    """Profile the webgpu `artifact` by replaying the call sequence of `llvm_artifact` (the same
    model and quantization built for llvm, run with `weights`); returns the profile dict."""
    from ..runtime import Engine

    artifact, llvm_artifact = Path(artifact), Path(llvm_artifact)
    manifest, llvm_manifest = read_manifest(artifact), read_manifest(llvm_artifact)
    if manifest["target"]["kind"] != "webgpu" or llvm_manifest["target"]["kind"] != "llvm":
        raise ArtifactError(f"kernel replay needs a webgpu artifact and an llvm one, got {manifest['target']['kind']} ({artifact}) and {llvm_manifest['target']['kind']} ({llvm_artifact})")
    for field in ("config_hash", "quantization"):
        if manifest.get(field) != llvm_manifest.get(field):
            raise ArtifactError(f"{llvm_artifact}: field '{field}' is {llvm_manifest.get(field)!r}, the webgpu artifact's is {manifest.get(field)!r}: both must come from the same model config and quantization")
    engine = Engine(llvm_artifact, weights)
    calls = record_calls(engine, prompt_len, gen_len, seed)
    mapping = map_kernels(sorted({c.kernel for c in calls}), llvm_manifest, manifest)
    kernels = [mapping[c.kernel] for c in calls]

    timer = runner.timer_kind()
    started = time.perf_counter()
    prepared = prepare_replay(artifact, calls, kernels)
    load_ms = (time.perf_counter() - started) * 1e3

    groups = _step_groups(calls)
    tokens = {"prefill": prompt_len, "decode": 1}
    samples: list[dict] = []
    steps: list[dict] = []
    total, done = (warmup + runs) * 2, 0
    for run in range(warmup + runs):
        is_warmup = run < warmup
        origin = None
        for phase, step, indices in groups:  # low-overhead mode: one command buffer per step
            start, ns = runner.time_calls([prepared[i] for i in indices])
            origin = start if origin is None else origin
            steps.append({"mode": "low-overhead", "run": run, "warmup": is_warmup, "phase": phase, "step": step,
                          "tokens": tokens[phase], "start_ms": (start - origin) / 1e6, "ms": ns / 1e6})
        done += 1
        if progress:
            progress("low-overhead", done, total)
        origin = None
        for phase, step, indices in groups:  # per-kernel mode: every call timed alone
            step_start, step_ns = None, 0
            for i in indices:
                start, ns = runner.time_calls([prepared[i]])
                origin = start if origin is None else origin
                step_start = start if step_start is None else step_start
                step_ns += ns
                samples.append({"kernel": kernels[i], "parent": calls[i].parent, "phase": phase, "step": step, "run": run,
                                "warmup": is_warmup, "start_ms": start / 1e6, "ms": ns / 1e6})
            steps.append({"mode": "per-kernel", "run": run, "warmup": is_warmup, "phase": phase, "step": step,
                          "tokens": tokens[phase], "start_ms": (step_start - origin) / 1e6, "ms": step_ns / 1e6})
        done += 1
        if progress:
            progress("per-kernel", done, total)

    def measured(mode: str, phase: str) -> list[float]:
        return [s["ms"] for s in steps if s["mode"] == mode and not s["warmup"] and s["phase"] == phase]

    low_prefill, low_decode = measured("low-overhead", "prefill"), measured("low-overhead", "decode")
    low_total = sum(low_prefill) + sum(low_decode)
    per_kernel_total = sum(measured("per-kernel", "prefill")) + sum(measured("per-kernel", "decode"))
    prefill_ms = float(np.median(low_prefill))
    p50_decode = float(np.median(low_decode)) if low_decode else 0.0
    params = _kernel_params(artifact)
    skip = uncounted_params(params, manifest)
    moved: dict[tuple[str, str], int] = {}
    shapes: dict[tuple[str, str], list] = {}
    for kernel, call in zip(kernels, calls):
        if (kernel, call.phase) not in moved:
            moved[(kernel, call.phase)] = _moved_bytes(call, skip.get(kernel, set()))
            shapes[(kernel, call.phase)] = [list(a.shape) if isinstance(a, RecordedTensor) else None for a in call.args]
    roles = {k["name"]: k.get("role", "other") for k in manifest["kernels"]}
    weight_bytes = sum(int(np.prod(p["shape"])) * tvm.runtime.DataType(p["dtype"]).bits // 8 for p in manifest["parameters"])
    return {
        **profile_header(manifest),
        "device": device_description(),
        "method": {
            "kind": "kernel replay",
            "timer": timer,
            "call_sequence": f"recorded on llvm ({llvm_artifact}): {len(calls)} kernel calls per generation",
            "kernel_map": {k: v for k, v in sorted(mapping.items()) if k != v},
            "metrics": "sums of replayed kernel device time: each step's kernels dispatched back to back in one "
                       "command buffer (low-overhead mode); no host, VM, upload or readback time",
            "load_ms": "compiling the WGSL pipelines and uploading the recorded arguments",
        },
        "num_layers": engine.config["model_config"]["num_hidden_layers"],
        "config": {"prompt_len": prompt_len, "gen_len": gen_len, "runs": runs, "warmup_runs": warmup, "seed": seed, "threads": None},
        "metrics": {
            "load_ms": load_ms,
            "ttft_ms": prefill_ms,
            "prefill_ms": prefill_ms,
            "prefill_tok_s": prompt_len / (prefill_ms / 1e3) if prefill_ms else 0.0,
            "decode_ms_per_token": _percentiles(low_decode),
            "decode_tok_s": 1e3 / p50_decode if p50_decode else 0.0,
            "warmup_prefill_ms": [s["ms"] for s in steps if s["mode"] == "low-overhead" and s["warmup"] and s["phase"] == "prefill"],
            "peak_host_memory_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
            "weight_bytes": weight_bytes,
            "overhead": overhead_metrics(per_kernel_total, low_total),
        },
        "generated_tokens": [],
        "kernels": {
            name: {
                "role": roles.get(name, "other"),
                "bytes": {phase: b for (k, phase), b in moved.items() if k == name},
                "arg_shapes": {phase: sh for (k, phase), sh in shapes.items() if k == name},
            }
            for name in sorted(roles)
        },
        "steps": steps,
        "samples": samples,
        "environment": {"adapter": {k: str(v) for k, v in runner.adapter_info().items()}, "load_average": list(os.getloadavg())},
    }

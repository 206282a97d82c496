"""Chrome trace JSON ("trace"): the Trace Event Format that Perfetto and chrome://tracing open.

Process 1 "per-kernel mode": one "X" (complete) event per kernel call of the profile (warm-up
included, marked in args), on a lane (tid) per parent (vm, kv_cache), and one "X" event per
forward step on a "steps" lane. Process 2 "low-overhead mode": its forward steps. ts / dur in
microseconds, the first kernel call at 0.

Samples carry absolute times; steps carry times relative to their run's start, which is not
recorded, so each per-kernel run's steps are placed at the latest offset that starts no step after
its first kernel call. Low-overhead runs are laid end to end (1 ms apart) on their own timeline.
"""

from __future__ import annotations

import json

from ..schema import device_kernel_name

PER_KERNEL_PID, LOW_OVERHEAD_PID = 1, 2
STEPS_TID = 1
PARENT_TIDS = {"vm": 2, "kv_cache": 3}


def _meta(pid: int, tid: int | None, kind: str, name: str) -> dict:
    event = {"ph": "M", "pid": pid, "name": kind, "args": {"name": name}}
    if tid is not None:
        event["tid"] = tid
    return event


def _step_event(step: dict, pid: int, ts_us: float) -> dict:
    return {
        "name": f"{step['phase']} step {step['step']}", "cat": "step", "ph": "X", "pid": pid, "tid": STEPS_TID,
        "ts": ts_us, "dur": step["ms"] * 1e3,
        "args": {"mode": step["mode"], "run": step["run"], "warmup": step["warmup"], "phase": step["phase"],
                 "step": step["step"], "tokens": step["tokens"]},
    }


def render_trace(profile: dict, peak_gbps: float | None = None) -> str:
    del peak_gbps
    samples = profile["samples"]
    steps = profile.get("steps", [])
    # per-kernel steps: per run, the offset (absolute ms - relative ms) that keeps every step's
    # start at or before its first kernel call
    first_call: dict[tuple, float] = {}
    for s in samples:
        key = (s["run"], s["phase"], s["step"])
        first_call[key] = min(first_call.get(key, s["start_ms"]), s["start_ms"])
    offsets: dict[int, float] = {}
    for st in steps:
        key = (st["run"], st["phase"], st["step"])
        if st["mode"] == "per-kernel" and key in first_call:
            gap = first_call[key] - st["start_ms"]
            offsets[st["run"]] = min(offsets.get(st["run"], gap), gap)
    per_kernel_steps = [(st, st["start_ms"] + offsets.get(st["run"], 0.0)) for st in steps if st["mode"] == "per-kernel"]
    origin = min([s["start_ms"] for s in samples] + [t for _, t in per_kernel_steps], default=0.0)

    tids = dict(PARENT_TIDS)
    for s in samples:
        tids.setdefault(s["parent"], len(tids) + 2)
    events = [
        _meta(PER_KERNEL_PID, None, "process_name", "per-kernel mode"),
        _meta(PER_KERNEL_PID, STEPS_TID, "thread_name", "steps"),
        *(_meta(PER_KERNEL_PID, tid, "thread_name", parent) for parent, tid in tids.items()),
        _meta(LOW_OVERHEAD_PID, None, "process_name", "low-overhead mode"),
        _meta(LOW_OVERHEAD_PID, STEPS_TID, "thread_name", "steps"),
    ]
    kernels = profile.get("kernels", {})
    for s in samples:
        info = kernels.get(s["kernel"], {})
        events.append({
            "name": device_kernel_name(profile, s["kernel"]), "cat": info.get("role", "other"), "ph": "X",
            "pid": PER_KERNEL_PID, "tid": tids[s["parent"]],
            "ts": (s["start_ms"] - origin) * 1e3, "dur": s["ms"] * 1e3,
            "args": {"kernel": s["kernel"], "phase": s["phase"], "step": s["step"], "run": s["run"],
                     "warmup": s["warmup"], "bytes": info.get("bytes", {}).get(s["phase"])},
        })
    events += [_step_event(st, PER_KERNEL_PID, (start - origin) * 1e3) for st, start in per_kernel_steps]
    low_origin, low_run, low_end = 0.0, None, 0.0
    for st in steps:
        if st["mode"] == "per-kernel":
            continue
        if st["run"] != low_run:
            low_origin, low_run = (low_end + 1.0 if low_run is not None else 0.0), st["run"]
        low_end = max(low_end, low_origin + st["start_ms"] + st["ms"])
        events.append(_step_event(st, LOW_OVERHEAD_PID, (low_origin + st["start_ms"]) * 1e3))
    return json.dumps({
        "traceEvents": events,
        "displayTimeUnit": "ms",
        "otherData": {"model": profile["model"], "quantization": profile["quantization"], "device": profile["device"],
                      "target": profile.get("target_name", profile["target"]["kind"])},
    })

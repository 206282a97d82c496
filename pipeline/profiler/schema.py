"""The profile JSON (schema "mlcpipe-profile", version 1) and the statistics every report uses.

Top-level keys: schema, version, model, display_name, quantization, target, target_name, device,
num_layers, config, metrics (load, TTFT, prefill, decode percentiles, tok/s, memory, overhead),
generated_tokens, kernels (role, bytes moved per call), steps (one per forward step and mode),
samples (one per kernel call) and, optionally, method (how the samples were taken); field by
field in docs/profiler.md. Statistics exclude warm-up samples (warmup: true), kept in the file.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from ..config import short_repr, short_text
from ..errors import ProfileError

SCHEMA = "mlcpipe-profile"
VERSION = 1
_REQUIRED = ("schema", "version", "model", "quantization", "target", "device", "config", "metrics", "kernels", "steps", "samples")


def load_profile(path: str | Path) -> dict:
    """A profile JSON file, validated (`validate`); ProfileError in one line otherwise."""
    from ..artifact import ArtifactError, read_json

    path = Path(path)
    if not path.exists():
        raise ProfileError(f"{path}: file not found")
    try:
        data = read_json(path, "profile")
    except ArtifactError as exc:
        raise ProfileError(str(exc)) from None
    validate(data, str(path))
    return data


def _number(value, minimum: float | None = 0.0) -> bool:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    return ok and (minimum is None or value >= minimum)


def _int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


# field -> (check, what is allowed) for each entry of `steps` and `samples` (what the reports read)
_STEP_FIELDS = {"mode": (lambda v: v in ("low-overhead", "per-kernel"), "'low-overhead' or 'per-kernel'"),
                "run": (_int, "an integer >= 0"), "warmup": (lambda v: isinstance(v, bool), "true or false"),
                "phase": (lambda v: isinstance(v, str), "a phase name"), "step": (_int, "an integer >= 0"),
                "ms": (_number, "a finite number >= 0")}
_SAMPLE_FIELDS = {"kernel": (lambda v: isinstance(v, str) and bool(v), "a kernel name"),
                  "phase": (lambda v: isinstance(v, str), "a phase name"), "step": (_int, "an integer >= 0"),
                  "run": (_int, "an integer >= 0"), "warmup": (lambda v: isinstance(v, bool), "true or false"),
                  "ms": (_number, "a finite number >= 0")}
_METRICS = ("load_ms", "ttft_ms", "prefill_ms", "prefill_tok_s", "decode_tok_s", "peak_host_memory_bytes", "weight_bytes")


def validate(data: dict, where: str = "profile") -> None:
    """The profile has every top-level field, of the right kind, and every step / sample the
    statistics read is well-formed (finite durations); ProfileError in one line otherwise."""
    if not isinstance(data, dict) or data.get("schema") != SCHEMA:
        raise ProfileError(f"{where}: not an mlcpipe profile (field 'schema' must be {SCHEMA!r})")
    if data.get("version") != VERSION:
        raise ProfileError(f"{where}: field 'version': got {short_repr(data.get('version'))}; this mlcpipe reads version {VERSION}")
    for key in _REQUIRED:
        if key not in data:
            raise ProfileError(f"{where}: field '{key}' is missing")
    kinds = {"model": str, "quantization": str, "device": str, "target": dict, "config": dict, "metrics": dict,
             "kernels": dict, "steps": list, "samples": list}
    for key, kind in kinds.items():
        if not isinstance(data[key], kind):
            raise ProfileError(f"{where}: field '{key}': got {short_repr(data[key])}; expected {_KIND_NAMES[kind]}")
    if not isinstance(data["target"].get("kind"), str):
        raise ProfileError(f"{where}: field 'target.kind': got {short_repr(data['target'].get('kind'))}; expected a target kind")
    peak = data.get("peak_gbps")
    if peak is not None and not (_number(peak) and peak > 0):
        raise ProfileError(f"{where}: field 'peak_gbps': got {short_repr(peak)}; expected a positive finite number or null")
    metrics = data["metrics"]
    for key in _METRICS:
        if key in metrics and not _number(metrics[key]):
            raise ProfileError(f"{where}: field 'metrics.{key}': got {short_repr(metrics[key])}; expected a finite number >= 0")
    decode = metrics.get("decode_ms_per_token", {})
    if not isinstance(decode, dict) or not all(_number(v) for v in decode.values()):
        raise ProfileError(f"{where}: field 'metrics.decode_ms_per_token': got {short_repr(decode)}; "
                           "expected an object of finite numbers >= 0")
    for name, info in data["kernels"].items():
        if not isinstance(info, dict):
            raise ProfileError(f"{where}: field 'kernels.{short_text(name)}': got {short_repr(info)}; expected an object")
    for key, fields in (("steps", _STEP_FIELDS), ("samples", _SAMPLE_FIELDS)):
        for i, entry in enumerate(data[key]):
            if not isinstance(entry, dict):
                raise ProfileError(f"{where}: field '{key}[{i}]': got {short_repr(entry)}; expected an object")
            for field, (ok, allowed) in fields.items():
                if field == "mode" and field not in entry:
                    continue  # older profiles: low-overhead steps only
                if field not in entry:
                    raise ProfileError(f"{where}: field '{key}[{i}].{field}' is missing")
                if not ok(entry[field]):
                    raise ProfileError(f"{where}: field '{key}[{i}].{field}': got {short_repr(entry[field])}; expected {allowed}")


_KIND_NAMES = {str: "a string", dict: "an object", list: "a list"}


def save_profile(data: dict, path: str | Path) -> None:
    from ..artifact import write_file_atomic

    validate(data)
    write_file_atomic(path, json.dumps(data, indent=1) + "\n")


def device_kernel_name(profile: dict, kernel: str) -> str:
    """The kernel as the device sees it: GPU kernels carry TVM's `_kernel` suffix (KERNEL_SUFFIX)."""
    from ..backends import backend

    return kernel + backend(profile["target"]["kind"]).KERNEL_SUFFIX


def measured_samples(profile: dict, phase: str | None = None) -> list[dict]:
    return [s for s in profile["samples"] if not s["warmup"] and (phase is None or s["phase"] == phase)]


def kernel_stats(profile: dict, phase: str | None = None) -> list[dict]:
    """Per kernel: total_ms, iterations, avg_ms, peak_ms, pct, cum_pct; sorted by total time."""
    groups: dict[str, list[float]] = {}
    for sample in measured_samples(profile, phase):
        groups.setdefault(sample["kernel"], []).append(sample["ms"])
    grand = sum(sum(v) for v in groups.values()) or 1.0
    rows, cumulative = [], 0.0
    for name, times in sorted(groups.items(), key=lambda kv: (-sum(kv[1]), kv[0])):
        total = sum(times)
        cumulative += total
        rows.append({
            "kernel": name,
            "role": profile["kernels"].get(name, {}).get("role", "other"),
            "total_ms": total,
            "iterations": len(times),
            "avg_ms": total / len(times),
            "peak_ms": max(times),
            "pct": 100.0 * total / grand,
            "cum_pct": 100.0 * cumulative / grand,
        })
    return rows


def profile_header(manifest: dict) -> dict:
    """The identifying fields every profile starts with, from the artifact's manifest."""
    return {
        "schema": SCHEMA,
        "version": VERSION,
        "model": manifest["model"],
        "display_name": manifest.get("display_name", manifest["model"]),
        "quantization": manifest["quantization"],
        "target": manifest["target"],
        "target_name": manifest.get("target_name", manifest["target"]["kind"]),
    }


def overhead_metrics(per_kernel_total_ms: float, low_overhead_total_ms: float) -> dict:
    """The per-kernel mode's cost against the low-overhead mode over the same measured runs."""
    low = low_overhead_total_ms
    return {
        "low_overhead_total_ms": low,
        "per_kernel_total_ms": per_kernel_total_ms,
        "percent": 100.0 * (per_kernel_total_ms - low) / low if low else 0.0,
    }


def run_records(low_steps: list[dict], steps: list[dict], samples: list[tuple], warmup: int) -> dict:
    """The profile's `steps` (both modes; each {run, phase, step, tokens, start_ns, ns[, first_token_ns]}) and
    `samples` ((kernel, parent, phase, step, run, start_ns, ns) per kernel call)."""
    return {
        "steps": [
            {"mode": mode, "run": s["run"], "warmup": s["run"] < warmup, "phase": s["phase"], "step": s["step"],
             "tokens": s["tokens"], "start_ms": s["start_ns"] / 1e6, "ms": s["ns"] / 1e6,
             **({"first_token_ms": s["first_token_ns"] / 1e6} if "first_token_ns" in s else {})}
            for mode, step_list in (("low-overhead", low_steps), ("per-kernel", steps)) for s in step_list
        ],
        "samples": [
            {"kernel": name, "parent": parent, "phase": phase, "step": step, "run": run, "warmup": run < warmup,
             "start_ms": start / 1e6, "ms": dur / 1e6}
            for name, parent, phase, step, run, start, dur in samples
        ],
    }

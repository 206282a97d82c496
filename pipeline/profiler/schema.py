"""The profile JSON (schema "mlcpipe-profile", version 1) and the statistics every report uses.

Top-level keys: schema, version, model, display_name, quantization, target, target_name, device,
num_layers, config, metrics (load, TTFT, prefill, decode percentiles, tok/s, memory, overhead),
generated_tokens, kernels (role, bytes moved per call), steps (one per forward step and mode),
samples (one per kernel call) and, optionally, method (how the samples were taken); field by
field in docs/profiler.md. Statistics exclude warm-up samples (warmup: true), kept in the file.
"""

from __future__ import annotations

import json
from pathlib import Path

from ..errors import ProfileError

SCHEMA = "mlcpipe-profile"
VERSION = 1
_REQUIRED = ("schema", "version", "model", "quantization", "target", "device", "config", "metrics", "kernels", "steps", "samples")


def load_profile(path: str | Path) -> dict:
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise ProfileError(f"{path}: file not found") from None
    except json.JSONDecodeError as exc:
        raise ProfileError(f"{path}: not JSON ({exc})") from None
    validate(data, str(path))
    return data


def validate(data: dict, where: str = "profile") -> None:
    if not isinstance(data, dict) or data.get("schema") != SCHEMA:
        raise ProfileError(f"{where}: not an mlcpipe profile (field 'schema' must be {SCHEMA!r})")
    if data.get("version") != VERSION:
        raise ProfileError(f"{where}: field 'version': got {data.get('version')!r}; this mlcpipe reads version {VERSION}")
    for key in _REQUIRED:
        if key not in data:
            raise ProfileError(f"{where}: field '{key}' is missing")


def save_profile(data: dict, path: str | Path) -> None:
    validate(data)
    Path(path).write_text(json.dumps(data, indent=1) + "\n")


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

"""The event summary ("events"): `=== Analyzing <source> ===`, `Total events: N`, then sections of
`label: count=N | total=… | avg=… | min=… | max=… | p95_ms=…, p99_ms=…` lines by event type,
phase, parent/op, kernel, role and matmul shape. Events are the profile's samples (one kernel
call each) and steps (one forward step each); statistics use the measured (non warm-up) ones.
Layout: docs/profiler.md.
"""

from __future__ import annotations

from ..schema import device_kernel_name, measured_samples
from ._common import PHASES, ROLES, group_by, is_matmul, matmul_shape, measured_steps, percentile, shape_label


def stats_line(times: list[float]) -> str:
    if not times:
        return "no samples"
    total = sum(times)
    return (f"count={len(times)} | total={total:.2f}ms | avg={total / len(times):.3f}ms | min={min(times):.3f}ms"
            f" | max={max(times):.3f}ms | p95_ms={percentile(times, 95):.3f}ms, p99_ms={percentile(times, 99):.3f}ms")


def _section(title: str, groups: dict[str, list[float]], order: list[str] | None = None) -> list[str]:
    """`title:` then one line per group, by total time (groups in `order` with no samples last)."""
    keys = sorted(groups, key=lambda k: (-sum(groups[k]), k))
    keys += [k for k in (order or []) if k not in groups]
    return [f"{title}:", *(f"  {k}: {stats_line(groups.get(k, []))}" for k in keys), ""]


def render_events(profile: dict, peak_gbps: float | None = None) -> str:
    del peak_gbps
    name = lambda k: device_kernel_name(profile, k)  # noqa: E731
    samples = measured_samples(profile)
    steps = profile.get("steps", [])
    source = profile.get("source") or f"{profile['model']}-{profile['quantization']}-{profile.get('target_name', profile['target']['kind'])} profile"
    out = ["", f"=== Analyzing {source} ===", f"Total events: {len(profile['samples']) + len(steps)}", ""]

    # event types: kernel calls, then forward steps of each timing mode
    types = [("KernelCall", profile["samples"], samples)]
    for mode, label in (("per-kernel", "ForwardStep"), ("low-overhead", "ForwardStepLowOverhead")):
        types.append((label, [s for s in steps if s["mode"] == mode], measured_steps(profile, mode)))
    out.append("Event type summary:")
    for label, every, measured in sorted(types, key=lambda t: -len(t[1])):
        out.append(f"  {label} (count={len(every)}): {stats_line([s['ms'] for s in measured])}")
    out.append("")

    phases = list(PHASES) + sorted({s["phase"] for s in samples} - set(PHASES))
    out += _section("Kernel calls by phase", group_by(samples, lambda s: s["phase"]), phases)
    out += _section("Kernel calls by parent", group_by(samples, lambda s: s["parent"]), ["vm", "kv_cache"])
    out += _section("Kernel calls by parent/op", group_by(samples, lambda s: f"{s['parent']} :: {name(s['kernel'])}"))
    out += _section("Kernel calls by phase/op", group_by(samples, lambda s: f"{s['phase']} :: {name(s['kernel'])}"))
    # every kernel the profile lists; one never called (outside warm-up) shows `no samples`
    out += _section("Kernel aggregate (all parents)", group_by(samples, lambda s: name(s["kernel"])),
                    [name(k) for k in profile.get("kernels", {})])
    # roles: every role a kernel can have; those never called (in this model / phase) show `no samples`
    role_of = {k: v.get("role", "other") for k, v in profile.get("kernels", {}).items()}
    roles = list(ROLES) + sorted(set(role_of.values()) - set(ROLES))
    out += _section("Kernel aggregate (by kernel type)", group_by(samples, lambda s: role_of.get(s["kernel"], "other")), roles)
    out += _section("Kernel aggregate (by phase/kernel type)",
                    group_by(samples, lambda s: f"{s['phase']} :: {role_of.get(s['kernel'], 'other')}"),
                    [f"{p} :: {r}" for p in phases for r in roles])
    out += _matmul_shapes(profile, samples, name)
    out += _section("Forward steps (per-kernel mode)", group_by(measured_steps(profile, "per-kernel"), lambda s: s["phase"]), phases)
    out += _section("Forward steps (low-overhead mode)", group_by(measured_steps(profile, "low-overhead"), lambda s: s["phase"]), phases)
    return "\n".join(out)


def _matmul_shapes(profile: dict, samples: list[dict], name) -> list[str]:
    mm = [s for s in samples if is_matmul(s["kernel"])]
    shapes = {(s["kernel"], s["phase"]): matmul_shape(profile, s["kernel"], s["phase"]) for s in mm}
    if mm and all(shapes.values()):
        title = "Matmul shape summary"
        outer = lambda s: f"op=NT_matmul | {shape_label(shapes[(s['kernel'], s['phase'])])}"  # noqa: E731
        inner = lambda s: f"phase={s['phase']} kernel={name(s['kernel'])}"  # noqa: E731
    else:
        title = "Matmul shape summary (shapes not recorded in this profile: grouped by kernel name)"
        outer = lambda s: f"op=NT_matmul | kernel={name(s['kernel'])}"  # noqa: E731
        inner = lambda s: f"phase={s['phase']}"  # noqa: E731
    groups: dict[str, list[dict]] = {}
    for s in mm:
        groups.setdefault(outer(s), []).append(s)
    out = [f"{title}:"]
    if not groups:
        out.append("  matmul kernels: no samples")
    for label in sorted(groups, key=lambda k: (-sum(s["ms"] for s in groups[k]), k)):
        out.append(f"  {label}:")
        inner_groups = group_by(groups[label], inner)
        for key in sorted(inner_groups, key=lambda k: (-sum(inner_groups[k]), k)):
            out.append(f"    {key}: {stats_line(inner_groups[key])}")
    out.append("")
    return out

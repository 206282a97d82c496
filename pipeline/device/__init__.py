"""The run half of each target kind, one module per kind (llvm, cuda, metal, webgpu): `device(kind)`.

What a kind needs where an artifact runs: the device TVM's runtime gives it here (`local_device`),
whether it runs here at all, the device `mlcpipe tune` times on, the RPC session method giving
a remote one, whose memory the KV cache goes into, the profile's default sizes. The compile
half (presets, export, link, kernel source) is `pipeline.backends`; this side imports it, never
the other way. TVM's runtime library driven without the compiler: `tvm_runtime`. Signatures and
meaning: docs/backends.md.
"""

from __future__ import annotations

import dataclasses
import importlib

from ..backends import KINDS

INTERFACE = (
    "runs_here", "local_device", "local_peak_gbps", "timing_device", "timing_cold_bytes",
    "RPC_DEVICE", "RPC_DEVICE_HINT", "HOST_MEMORY", "PROFILE_DEFAULTS", "NIGHTLY_PROFILE",
)


@dataclasses.dataclass(frozen=True)
class RunOptions:
    """Where an artifact runs: a TVM RPC session (llvm, cuda, metal), or a WebGPU adapter
    (gles, swiftshader, gpu, auto) in node or in headless Chromium; a smaller prefill chunk."""

    remote: object = None
    adapter: str | None = None
    browser: bool = False
    prefill_chunk: int | None = None
    timed: bool = False  # for `profile`: pick a device that can time kernels
    console: object = None  # callable(line): the browser page's console lines, as they come


def device(kind: str):
    """The run-side module for a target kind (llvm, cuda, metal, webgpu)."""
    if kind not in KINDS:
        raise ValueError(f"no device module for target kind {kind!r}; allowed: llvm, cuda, metal, webgpu")
    return importlib.import_module(f"{__name__}.{kind}")


def kinds_with(attribute: str) -> tuple[str, ...]:
    """The target kinds whose device module's `attribute` is true (e.g. "NIGHTLY_PROFILE"), in KINDS order."""
    return tuple(kind for kind in KINDS if getattr(device(kind), attribute))


def check_cpu_flags(manifest: dict, where) -> None:
    """One line when this CPU lacks a /proc/cpuinfo flag the artifact's CPU code needs (the
    manifest's `cpu_flags`: an llvm library's, a GPU library's host code's): such code stopped
    the process on an illegal instruction, without a word. An older manifest: not checked."""
    from ..errors import ArtifactError
    from ..targets import missing_cpu_flags

    needed = manifest.get("cpu_flags")
    if needed is None:
        return
    if not isinstance(needed, list) or not all(isinstance(flag, str) for flag in needed):
        raise ArtifactError(f"{where}: manifest field 'cpu_flags': expected a list of /proc/cpuinfo flags")
    missing = missing_cpu_flags(needed)
    if missing:
        raise ArtifactError(f"{where}: built for CPU {_code_cpu(manifest)!r}, whose code needs {', '.join(missing)}: this CPU "
                            "lacks them (/proc/cpuinfo flags); run it on such a CPU (or --rpc HOST:PORT to one), or rebuild it for "
                            "one this CPU runs (llvm: --mcpu auto, or portable)")


def _code_cpu(manifest: dict) -> str | None:
    """The CPU the artifact's CPU code was built for: llvm's mcpu, or a GPU library's host code's."""
    from ..targets import cpu_code_target

    return (cpu_code_target(manifest.get("target", {})) or {}).get("mcpu")


def cpu_note(manifest: dict) -> str:
    """For a remote whose process stopped while running the artifact: the CPU features its code
    needs, which a remote CPU lacking one stops on (no local check sees that CPU); "" if unrecorded."""
    needed = manifest.get("cpu_flags")
    if not isinstance(needed, list) or not needed:
        return ""
    return (f"; this artifact's code, built for CPU {_code_cpu(manifest)!r}, stops on an illegal instruction on a CPU "
            f"without one of {', '.join(map(str, needed))} (/proc/cpuinfo flags): if the remote lacks one, rebuild with --mcpu of "
            "its CPU (or portable)")


def peak_gbps(kind: str, target_name: str, here: bool = True) -> float | None:
    """Memory bandwidth for the % of peak columns: the device's own where the artifact ran here and
    it is known (a GPU's datasheet figure by its name), else the target preset's."""
    from ..targets import preset_peak_gbps

    return (device(kind).local_peak_gbps() if here else None) or preset_peak_gbps(target_name)

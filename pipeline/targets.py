"""Target presets (configs/targets/<name>.yaml) -> TVM target JSON dicts."""

from __future__ import annotations

import dataclasses
import os
import platform
import re
from pathlib import Path
from typing import Any

from .backends import KINDS, backend
from .config import CONFIG_DIR, load_yaml, short_repr
from .errors import ConfigError

TARGETS_DIR = CONFIG_DIR / "targets"

# (required /proc/cpuinfo flags, LLVM cpu name), most capable first.
_X86_CPUS = (
    ({"avx512_fp16", "amx_bf16"}, "sapphirerapids"),
    ({"avx512f", "avx512_vnni", "avx512_bf16"}, "cooperlake"),
    ({"avx512f", "avx512_vbmi2", "avx512_vnni"}, "icelake-server"),
    ({"avx512f", "avx512_vnni"}, "cascadelake"),
    ({"avx512f", "avx512bw", "avx512vl"}, "skylake-avx512"),
    ({"avx2", "fma", "f16c"}, "haswell"),
)


@dataclasses.dataclass(frozen=True)
class TargetSpec:
    name: str  # preset name: llvm, cuda, metal, webgpu
    target: dict[str, Any]  # TVM target JSON dict
    peak_gbps: float
    options: dict[str, Any] = dataclasses.field(default_factory=dict)  # mlcpipe-only keys

    @property
    def kind(self) -> str:
        return self.target["kind"]

    def tvm_target(self):
        from tvm.target import Target

        return Target(self.target)


# LLVM feature -> the /proc/cpuinfo flag that says the CPU has it: what LLVM's CPU name is checked
# against (x86 "flags", aarch64 "Features").
_X86_FEATURE_FLAGS = {
    "avx2": "avx2", "fma": "fma", "f16c": "f16c", "avx512f": "avx512f", "avx512bw": "avx512bw", "avx512vl": "avx512vl",
    "avx512vnni": "avx512_vnni", "avx512bf16": "avx512_bf16", "avx512fp16": "avx512_fp16", "amx-bf16": "amx_bf16",
    "amx-tile": "amx_tile", "avxvnni": "avx_vnni",
}
_ARM_FEATURE_FLAGS = {"neon": "asimd", "fullfp16": "asimdhp", "dotprod": "asimddp", "i8mm": "i8mm", "bf16": "bf16", "sve": "sve"}


@dataclasses.dataclass(frozen=True)
class HostCPU:
    mcpu: str
    mattr: tuple[str, ...] = ()  # LLVM features added to a generic CPU (aarch64 hosts LLVM cannot name)
    source: str = "llvm"  # "llvm": LLVM's host detection, confirmed by the flags; "flags": from the flags; "env": HOST_CPU_ENV


def cpu_flags(cpuinfo: str) -> set[str]:
    """The flags (x86) or Features (aarch64) of a /proc/cpuinfo text."""
    for line in cpuinfo.splitlines():
        if line.startswith(("flags", "Features")):
            return set(line.split(":", 1)[1].split())
    return set()


def _llvm_features(cpu: str, triple: str, table: dict[str, str]) -> set[str] | None:
    """The features of `table` LLVM gives `cpu`; None for a name LLVM does not know."""
    from tvm.target import Target, codegen

    if not codegen.llvm_is_valid_cpu(cpu, triple):
        return None
    target = Target({"kind": "llvm", "mtriple": triple, "mcpu": cpu})
    return {feature for feature in table if codegen.target_has_features(feature, target)}


def cpu_code_target(target: dict[str, Any]) -> dict[str, Any] | None:
    """The llvm target of a target's CPU code: itself (a HOST_CPU kind: llvm), or its llvm `host`
    (cuda, metal); None when it has none (webgpu's host is wasm)."""
    for code in (target, target.get("host")):
        if isinstance(code, dict) and code.get("kind") in KINDS and backend(code["kind"]).HOST_CPU:
            return None if str(code.get("mtriple", "")).startswith("wasm") else code
    return None


def required_cpu_flags(target: dict[str, Any]) -> list[str] | None:
    """The /proc/cpuinfo flags a CPU needs to run a target's CPU code (cpu_code_target): the
    features of the tables above its mcpu has (LLVM's answer), its mattr's +/- applied; None
    without CPU code, or for a CPU LLVM does not name. Recorded in the manifest (`cpu_flags`) for
    the run side."""
    target = cpu_code_target(target)
    if target is None:
        return None
    from tvm.target import codegen

    triple = str(target.get("mtriple") or codegen.llvm_get_system_triple())
    table = _ARM_FEATURE_FLAGS if triple.startswith(("aarch64", "arm64")) else _X86_FEATURE_FLAGS
    features = _llvm_features(str(target.get("mcpu") or "generic"), triple, table)
    if features is None:
        return None
    for attr in target.get("mattr") or []:
        if isinstance(attr, str) and attr[1:] in table:
            (features.add if attr.startswith("+") else features.discard)(attr[1:])
    return sorted(table[feature] for feature in features)


def missing_cpu_flags(needed: list[str]) -> list[str]:
    """Those of `needed` this machine's /proc/cpuinfo does not list (none where it cannot be read)."""
    try:
        flags = cpu_flags(Path("/proc/cpuinfo").read_text())
    except OSError:
        return []
    return [flag for flag in needed if flag not in flags]


# `mcpu: portable`: the baseline CPU of this machine's architecture, for code that runs on other
# machines (a cuda artifact's host code, on the GPU machine's CPU): AVX2 + FMA + F16C on x86-64.
PORTABLE_MCPU = {"x86_64": "x86-64-v3", "aarch64": "generic"}

HOST_CPU_ENV = "MLCPIPE_HOST_CPU"  # an LLVM CPU name `auto` stands for (e.g. haswell: AVX2 code on any AVX2 host)


def _host_from_env() -> HostCPU | None:
    name = os.environ.get(HOST_CPU_ENV, "")
    if not name:
        return None
    from tvm.target import codegen

    triple = codegen.llvm_get_system_triple()
    problem = f"not a CPU LLVM knows for {triple}" if name == "native" else cpu_problem(name, triple)
    if problem:
        raise ConfigError(f"environment {HOST_CPU_ENV}={name!r}: {problem} (e.g. haswell, znver3, sapphirerapids)")
    return HostCPU(name, source="env")


def cpu_problem(cpu: str, triple: str) -> str | None:
    """Why LLVM cannot build `triple` code for `cpu` (a name it does not know, where TVM would
    build generic code; a 32-bit-only CPU for a 64-bit x86 triple, where LLVM aborts at code
    generation), or None."""
    from tvm.target import Target, codegen

    if not codegen.llvm_is_valid_cpu(cpu, triple):
        return f"not a CPU LLVM knows for {triple}"
    if triple.startswith("x86_64") and not codegen.target_has_features("64bit", Target({"kind": "llvm", "mtriple": triple, "mcpu": cpu})):
        return f"a 32-bit-only CPU, and {triple} is 64-bit code"
    return None


def detect_host(cpuinfo: str | None = None, llvm_cpu: str | None = None, machine: str | None = None) -> HostCPU:
    """The host CPU as LLVM names it (`llvm_get_system_cpu`), taken when every feature LLVM gives
    that name is in the CPU's /proc/cpuinfo flags (a VM can hide features LLVM's CPUID model
    assumes) and, on x86, the flags' own best name adds none (a VM can report a family/model whose
    name lacks what the flags have: model 167, "rocketlake", with AMX and AVX512-FP16); else x86:
    the most capable named CPU the flags allow; aarch64: `generic` with the
    flags' dotprod / i8mm / bf16 / fullfp16 / sve as `mattr`. A given `cpuinfo` describes another
    machine: LLVM's answer for this one is not asked, and the machine follows the text. Without
    one, MLCPIPE_HOST_CPU (an LLVM CPU name) overrides the detection: the suite and `auto` builds
    take another CPU class's code paths (haswell: the AVX2-only rules on any AVX2 host)."""
    if cpuinfo is None and (forced := _host_from_env()) is not None:
        return forced
    if cpuinfo is None:
        path = Path("/proc/cpuinfo")
        cpuinfo = path.read_text() if path.exists() else ""
        if llvm_cpu is None:
            from tvm.target import codegen

            llvm_cpu = codegen.llvm_get_system_cpu()
        machine = machine or platform.machine()
    elif machine is None:
        machine = "aarch64" if any(line.startswith("Features") for line in cpuinfo.splitlines()) else "x86_64"
    flags = cpu_flags(cpuinfo)
    arm = machine in ("aarch64", "arm64")
    triple, table = ("aarch64-linux-gnu", _ARM_FEATURE_FLAGS) if arm else ("x86_64-linux-gnu", _X86_FEATURE_FLAGS)
    has = {feature for feature, flag in table.items() if flag in flags}
    named = _llvm_features(llvm_cpu, triple, table) if llvm_cpu and llvm_cpu != "generic" else None
    if arm:
        if named is not None and named <= has:
            return HostCPU(llvm_cpu)
        return HostCPU("generic", tuple(f"+{feature}" for feature in table if feature in has and feature != "neon"), "flags")
    by_flags = next((cpu for needed, cpu in _X86_CPUS if needed <= flags), "x86-64")
    if named is not None and named <= has and not (_llvm_features(by_flags, triple, table) or set()) - named:
        return HostCPU(llvm_cpu)
    return HostCPU(by_flags, source="flags")


def detect_host_cpu(cpuinfo: str | None = None) -> str:
    """LLVM CPU name for this machine (see `detect_host`)."""
    return detect_host(cpuinfo).mcpu


def available_targets() -> list[str]:
    return sorted(p.stem for p in TARGETS_DIR.glob("*.yaml"))


# The command line's preset overrides (build / tune: --mcpu, --arch, --fatbin-archs, --cuda-graph;
# a nightly cell's `options`) and the target kinds each applies to.
OVERRIDE_KINDS = {"mcpu": ("llvm",), "arch": ("cuda",), "fatbin_archs": ("cuda",), "cuda_graph": ("cuda",)}


# TVM's GPU target limits a preset may set (TVM takes any integer, 0 and negatives included).
_GPU_LIMITS = ("max_shared_memory_per_block", "max_threads_per_block", "max_num_threads", "thread_warp_size", "max_function_args")

# Preset keys an override may not change, and why.
_NOT_OVERRIDES = {
    "kind": "the preset's kind ({kind}) is not an override: name a preset of the kind wanted",
    "peak_gbps": "reports take the preset's figure: edit {path} (or pass profile --peak-gbps)",
}


def load_target(name: str, overrides: dict[str, Any] | None = None,
                where: tuple[Path, str] | None = None) -> TargetSpec:
    """Preset `name`, with `overrides` (e.g. {"mcpu": "skylake-avx512"}) applied on top. Errors
    name an override as its --flag (OVERRIDE_KINDS), or where = (file, field) as `file: field
    'field.<key>'` (a nightly matrix's target options)."""
    path = TARGETS_DIR / f"{name}.yaml"
    if not path.is_file():
        raise ConfigError(f"--target {name!r}: unknown target; allowed: {available_targets()}")
    raw = load_yaml(path, "target preset") or {}
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: expected a YAML mapping at top level, got {type(raw).__name__}")
    given = {k: f"{where[0]}: field '{where[1]}.{k}'" if where else
             f"--{k.replace('_', '-')}" if k in OVERRIDE_KINDS else f"{path}: field '{k}'"
             for k, v in (overrides or {}).items() if v is not None}
    for key, why in _NOT_OVERRIDES.items():
        if key in given:
            raise ConfigError(f"{got(given[key], overrides[key])}; {why.format(path=path, kind=raw.get('kind'))}")
    raw = {**raw, **{k: v for k, v in (overrides or {}).items() if v is not None}}
    peak = raw.pop("peak_gbps", None)
    if peak is not None and not (isinstance(peak, int | float) and not isinstance(peak, bool) and 0 < peak < float("inf")):
        raise ConfigError(f"{path}: field 'peak_gbps': got {short_repr(peak)}; expected a number of GB/s > 0 (the reports' "
                          "peak memory bandwidth; leave it out for none)")
    kind = raw.get("kind")
    if kind not in KINDS:
        raise ConfigError(f"{path}: field 'kind': got {kind!r}; allowed: {list(KINDS)}")
    for key in sorted(given):  # e.g. --mcpu on cuda: TVM took it as a cuda attribute; on metal, a screen of TVM's options
        kinds = OVERRIDE_KINDS.get(key, (kind,))
        if kind not in kinds:
            what = f"--target {name}: '{key}' ({given[key]})" if not where else f"{given[key]}: preset {name}:"
            raise ConfigError(f"{what} applies to {' and '.join(kinds)} targets only, not {kind}")
    for key in _GPU_LIMITS:
        value = raw.get(key, 1)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1 or key == "thread_warp_size" and value & (value - 1):
            allowed = "a power of two" if key == "thread_warp_size" else "an integer >= 1"
            raise ConfigError(f"{got(given.get(key) or f'{path}: field {key!r}', value)}; expected {allowed}")
    kind_backend = backend(kind)
    # keys of the preset that are mlcpipe's, not TVM's (e.g. cuda's fatbin_archs)
    options = {key: raw.pop(key) for key in kind_backend.PRESET_OPTIONS if key in raw}
    kind_backend.check_preset(path, raw, options, given)  # before the CPU's check, which reads llvm's mtriple
    if kind_backend.HOST_CPU:
        raw = _resolve_cpu(path, raw, "mcpu", given.get("mcpu"))
    elif isinstance(raw.get("host"), dict) and ("mtriple" not in raw["host"] or raw["host"].get("mcpu") not in (None, "auto")):
        raw["host"] = _resolve_cpu(path, dict(raw["host"]), "host.mcpu")  # another machine's (metal): its triple's CPU
    target = dict(raw)
    _validate_with_tvm(path, target, given)
    return TargetSpec(name=name, target=target, peak_gbps=float(peak or 0), options=options)


def got(where: str, value: Any) -> str:
    """`--flag 'value'` or `file: field 'x': got 'value'` (`where` is a --flag or `file: field 'x'`)."""
    return f"{where} {short_repr(value)}" if where.startswith("--") else f"{where}: got {short_repr(value)}"


def preset_peak_gbps(name: str) -> float | None:
    """Peak memory bandwidth of target preset `name` (reports' % of peak); None when the preset
    says none, or no longer loads (removed or renamed since the profile was taken)."""
    path = TARGETS_DIR / f"{name}.yaml"
    try:
        raw = load_yaml(path, "target preset") if path.is_file() else None
    except ConfigError:
        return None
    peak = raw.get("peak_gbps") if isinstance(raw, dict) else None  # the YAML alone: no TVM on the run side
    return float(peak) if isinstance(peak, int | float) and not isinstance(peak, bool) and peak > 0 else None


def _resolve_cpu(path: Path, raw: dict[str, Any], field: str, given: str | None = None) -> dict[str, Any]:
    """`auto` made the host's CPU, `portable` its architecture's baseline (PORTABLE_MCPU); a CPU
    LLVM cannot build for (cpu_problem) refused in one line naming the preset's field, or `given`
    (--mcpu, a matrix field) where an override set it."""
    if raw.get("mcpu", "auto") in ("auto", None):
        host = detect_host()
        raw["mcpu"] = host.mcpu
        if host.mattr and "mattr" not in raw:
            raw["mattr"] = list(host.mattr)
    elif raw["mcpu"] == "portable" and not raw.get("mtriple") and platform.machine() in PORTABLE_MCPU:
        raw["mcpu"] = PORTABLE_MCPU[platform.machine()]
    cpu = raw["mcpu"]
    where = got(given or f"{path}: field '{field}'", cpu)
    if cpu == "native":
        raise ConfigError(f"{where}; name the CPU (e.g. sapphirerapids) or use 'auto' (TVM silently builds generic x86-64 code for 'native')")
    from tvm.target import codegen

    triple = raw.get("mtriple") or codegen.llvm_get_system_triple()
    problem = cpu_problem(cpu, triple) if isinstance(cpu, str) else "not a CPU name"
    if problem:
        foreign = raw.get("mtriple") and not str(raw["mtriple"]).startswith(platform.machine())  # a metal host's
        hint = f"llc -mtriple={raw['mtriple']} -mcpu=help lists them" if foreign else f"e.g. {detect_host().mcpu}, 'auto' or 'portable'"
        raise ConfigError(f"{where}; {problem} ({hint})")
    return raw


def _validate_with_tvm(path: Path, target: dict[str, Any], given: dict[str, str]) -> None:
    from tvm.target import Target

    try:
        Target(target)
    except Exception as exc:  # TVM raises its own error types
        first = str(exc).strip().splitlines()[-1] if str(exc).strip() else type(exc).__name__
        named = re.search(r"'([^']+)'", first)  # "Unknown config option 'x'. Known options: ...", "Option 'x': ..."
        if named and named.group(1) in given:  # a matrix's target options (the flags' values are checked before)
            key = named.group(1)
            reason = first.split(" Target creation from config dict failed")[0].rstrip(".")
            raise ConfigError(f"{got(given[key], target[key])}; rejected by TVM for {target['kind']} targets: {reason}") from None
        raise ConfigError(f"{path}: target {target} rejected by TVM: {first}") from None

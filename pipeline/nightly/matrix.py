"""The nightly matrix (configs/nightly.yaml): models x quantizations x targets, and the checks
each cell gets. Validation errors are one line naming the file, the field, the value and what is
allowed; unknown models, quantizations and targets are rejected before anything builds."""

from __future__ import annotations

import dataclasses
import difflib
import re
from pathlib import Path
from typing import Any

from ..device import kinds_with
from ..config import CONFIG_DIR, check_path_name, load_model_config, load_yaml, model_dirs, short_repr, short_text
from ..errors import ConfigError
from ..quantization import QUANTIZATIONS

DEFAULT_MATRIX = CONFIG_DIR / "nightly.yaml"
CHECKS = ("conformance", "profile", "reproducibility")
_TOP = ("models", "quantizations", "targets", "checks")
_CHECK_FIELDS = {
    "conformance": {"targets": list, "sizes": list, "kernels": (str, type(None))},
    "profile": {"targets": list, "prompt_len": int, "gen_len": int, "runs": int, "warmup": int},
    "reproducibility": {"targets": list},
}
_CHECK_DEFAULTS = {
    "conformance": {"targets": [], "sizes": [1, 7], "kernels": None},
    "profile": {"targets": [], "prompt_len": 128, "gen_len": 32, "runs": 3, "warmup": 1},
    "reproducibility": {"targets": []},
}


@dataclasses.dataclass(frozen=True)
class TargetEntry:
    name: str  # the cell's target name (the preset's, unless renamed)
    preset: str  # configs/targets/<preset>.yaml
    options: dict[str, Any]  # preset overrides, as `mlcpipe build --mcpu/--arch/...`
    # (matrix file, field of the options): what errors name; checked when the cell runs (a bad
    # option fails only its cells)
    where: tuple[Path, str] | None = dataclasses.field(default=None, compare=False)


@dataclasses.dataclass(frozen=True)
class Cell:
    model: str  # model name (from its config)
    model_source: str  # the model YAML file
    quant: str
    target: TargetEntry
    checks: dict[str, dict[str, Any]]  # check name -> settings, only the checks this cell runs

    @property
    def id(self) -> str:
        return f"{self.model}-{self.quant}-{self.target.name}"


@dataclasses.dataclass(frozen=True)
class Matrix:
    path: Path
    cells: list[Cell]

    def select(self, ids: list[str]) -> list[Cell]:
        """The cells named by `ids` (all when empty); an unknown id is a one-line error."""
        if not ids:
            return list(self.cells)
        known = {c.id: c for c in self.cells}
        unknown = [i for i in ids if i not in known]
        if unknown:
            close = difflib.get_close_matches(unknown[0], known, n=3, cutoff=0.6)
            hint = f"closest: {', '.join(close)}" if close else f"{len(known)} cells: mlcpipe nightly --matrix {self.path} --list-cells"
            raise ConfigError(f"--cell {short_repr(unknown[0])}: not a cell of {self.path} ({hint})")
        return [known[i] for i in dict.fromkeys(ids)]


def _preset_kind(preset: str) -> str | None:
    from ..targets import TARGETS_DIR

    try:
        raw = load_yaml(TARGETS_DIR / f"{preset}.yaml", "target preset") or {}
    except ConfigError:
        return None
    return raw.get("kind") if isinstance(raw, dict) else None


def _err(path: Path, field: str, value: Any, allowed: str) -> ConfigError:
    return ConfigError(f"{path}: field '{short_text(field)}': got {short_repr(value)}; {allowed}")


def _name_list(path: Path, raw: dict, field: str) -> list:
    value = raw.get(field)
    if not isinstance(value, list) or not value:
        raise _err(path, field, value, "expected a non-empty list")
    if len(set(map(str, value))) != len(value):
        raise _err(path, field, value, "expected each entry once")
    return value


def _targets(path: Path, raw: list) -> list[TargetEntry]:
    from ..targets import available_targets

    presets = available_targets()
    entries = []
    for i, item in enumerate(raw):
        field = f"targets[{i}]"
        if isinstance(item, str):
            item = {"name": item}
        if not isinstance(item, dict) or not isinstance(item.get("name"), str) or not item["name"]:
            raise _err(path, field, item, "expected a target preset name or {name, preset, options}")
        check_path_name(path, f"{field}.name", item["name"])  # part of the cell's directory name
        extra = set(item) - {"name", "preset", "options"}
        if extra:
            raise _err(path, f"{field}.{sorted(extra)[0]}", item[sorted(extra)[0]], "allowed keys: name, preset, options")
        preset = item.get("preset", item["name"])
        if preset not in presets:
            raise _err(path, f"{field}.preset" if "preset" in item else field, preset, f"allowed: {presets}")
        options = item.get("options") or {}
        if not isinstance(options, dict):
            raise _err(path, f"{field}.options", options, "expected a mapping of preset overrides")
        entries.append(TargetEntry(item["name"], preset, dict(options), where=(path, f"{field}.options")))
    names = [e.name for e in entries]
    for i, name in enumerate(names):
        if name in names[:i]:
            raise _err(path, f"targets[{i}].name", name, "expected each target name once")
    return entries


def _checks(path: Path, raw: Any, targets: list[TargetEntry]) -> dict[str, dict[str, Any]]:
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise _err(path, "checks", raw, f"expected a mapping with keys {list(CHECKS)}")
    known = {t.name for t in targets} | {t.preset for t in targets}
    out = {}
    for name, settings in raw.items():
        if name not in CHECKS:
            raise _err(path, f"checks.{name}", settings, f"allowed checks: {list(CHECKS)}")
        if not isinstance(settings, dict):
            raise _err(path, f"checks.{name}", settings, "expected a mapping")
        merged = {**_CHECK_DEFAULTS[name], **settings}
        for key, value in merged.items():
            field = f"checks.{name}.{key}"
            kind = _CHECK_FIELDS[name].get(key)
            if kind is None:
                raise _err(path, field, value, f"allowed keys: {list(_CHECK_FIELDS[name])}")
            if not isinstance(value, kind) or isinstance(value, bool):
                raise _err(path, field, value, f"expected {getattr(kind, '__name__', 'a string or null')}")
            if kind is int and value < (0 if key == "warmup" else 1):
                raise _err(path, field, value, f"expected an integer >= {0 if key == 'warmup' else 1}")
        for i, target in enumerate(merged["targets"]):
            if target not in known:
                raise _err(path, f"checks.{name}.targets[{i}]", target, f"allowed: the matrix's targets {sorted(known)}")
            if target in merged["targets"][:i]:
                raise _err(path, f"checks.{name}.targets[{i}]", target, "expected each target once")
        sizes = merged.get("sizes", [1])
        if not sizes or not all(isinstance(s, int) and not isinstance(s, bool) and s >= 1 for s in sizes):
            raise _err(path, f"checks.{name}.sizes", merged["sizes"], "expected a non-empty list of positive integers")
        if len(set(sizes)) != len(sizes):
            raise _err(path, f"checks.{name}.sizes", merged["sizes"], "expected each size once")
        if merged.get("kernels") is not None:
            try:
                re.compile(merged["kernels"])
            except re.error as exc:
                raise _err(path, f"checks.{name}.kernels", merged["kernels"], f"expected a regular expression ({exc}) or null") from None
        out[name] = merged
    return out


def load_matrix(path: str | Path | None = None) -> Matrix:
    """Read and validate a nightly matrix; every model/quantization/target is checked here."""
    path = Path(path) if path else DEFAULT_MATRIX
    if not path.is_file():
        raise ConfigError(f"--matrix {str(path)!r}: file not found")
    raw = load_yaml(path, "nightly matrix")
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: expected a YAML mapping with keys {list(_TOP)}, got {type(raw).__name__}")
    for key in raw:
        if key not in _TOP:
            raise _err(path, key, raw[key], f"allowed keys: {list(_TOP)}")
    models = _name_list(path, raw, "models")
    quants = _name_list(path, raw, "quantizations")
    targets = _targets(path, _name_list(path, raw, "targets"))
    checks = _checks(path, raw.get("checks"), targets)
    profiled = kinds_with("NIGHTLY_PROFILE")  # what the profiler runs (cuda: where a GPU is present)
    for i, name in enumerate(checks.get("profile", {}).get("targets", [])):
        kinds = {_preset_kind(t.preset) for t in targets if name in (t.name, t.preset)}
        if not kinds <= set(profiled):
            raise _err(path, f"checks.profile.targets[{i}]", name, f"the profiler runs targets of kind {list(profiled)}")
    configs = []
    for i, model in enumerate(models):
        folders = model_dirs()
        if not isinstance(model, str) or not any((d / f"{model}.yaml").is_file() for d in folders) and not model.endswith((".yaml", ".yml")):
            raise _err(path, f"models[{i}]", model, f"allowed: {sorted({p.stem for d in folders for p in d.glob('*.yaml')})} or a YAML path")
        try:
            configs.append(load_model_config(model))
        except ConfigError as exc:
            raise ConfigError(f"{path}: field 'models[{i}]': {exc}") from None
    for i, quant in enumerate(quants):
        if quant not in QUANTIZATIONS:
            raise _err(path, f"quantizations[{i}]", quant, f"allowed: {sorted(QUANTIZATIONS)}")
        for config in configs:
            if quant not in config.quantizations:
                raise _err(path, f"quantizations[{i}]", quant, f"model {config.name} ({config.source}) lists {list(config.quantizations)}")
            try:
                config.scheme(quant)
            except ConfigError as exc:
                raise ConfigError(f"{path}: field 'quantizations[{i}]': {exc}") from None
    for config in configs:
        for size in checks.get("conformance", {}).get("sizes", []):
            if size > config.context_window_size:
                raise _err(path, "checks.conformance.sizes", size,
                           f"at most the context window of model {config.name} ({config.context_window_size} tokens)")
        profile = checks.get("profile")
        if profile and profile["targets"] and profile["prompt_len"] + profile["gen_len"] > config.context_window_size:
            raise _err(path, "checks.profile.prompt_len", profile["prompt_len"],
                       f"prompt_len + gen_len ({profile['gen_len']}) must fit the context window of model {config.name} "
                       f"({config.context_window_size} tokens)")
    cells = []
    for config in configs:
        for target in targets:
            for quant in quants:
                mine = {n: s for n, s in checks.items() if target.name in s["targets"] or target.preset in s["targets"]}
                cells.append(Cell(config.name, str(config.source), str(quant), target, mine))
    ids = [c.id for c in cells]
    if len(set(ids)) != len(ids):
        dup = next(i for i in ids if ids.count(i) > 1)
        raise ConfigError(f"{path}: cell {dup!r} appears twice (two models with one name?)")
    return Matrix(path, cells)

"""Model configuration: YAML file -> validated `ModelConfig`.

Every validation failure raises `ConfigError` with one line naming the file, the field, the
offending value and what is allowed.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from pathlib import Path
from typing import Any

import yaml

REPO_ROOT = Path(__file__).resolve().parent.parent
CONFIG_DIR = Path(os.environ.get("MLCPIPE_CONFIGS", REPO_ROOT / "configs"))
MODELS_DIR = CONFIG_DIR / "models"

SUPPORTED_ARCHITECTURES = ("llama",)


class ConfigError(ValueError):
    """A user-facing configuration error (one line: file, field, value, what is allowed)."""


@dataclasses.dataclass(frozen=True)
class RopeScaling:
    rope_type: str
    factor: float
    low_freq_factor: float
    high_freq_factor: float
    original_max_position_embeddings: int

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """Architecture of a Llama-family decoder plus its compile-time runtime limits."""

    name: str
    display_name: str
    architecture: str
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    vocab_size: int
    rms_norm_eps: float
    rope_theta: float
    rope_scaling: RopeScaling | None
    tie_word_embeddings: bool
    context_window_size: int
    prefill_chunk_size: int
    page_size: int
    quantizations: tuple[str, ...]
    source: str = ""  # the YAML file this came from

    def as_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out.pop("source")
        out["quantizations"] = list(self.quantizations)
        return out

    def config_hash(self) -> str:
        blob = json.dumps(self.as_dict(), sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()[:16]


_INT_FIELDS = (
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "vocab_size",
    "context_window_size",
    "prefill_chunk_size",
)
_REQUIRED = ("name", "architecture", *_INT_FIELDS, "rms_norm_eps", "rope_theta", "quantizations")
_ROPE_FIELDS = {
    "rope_type": str,
    "factor": float,
    "low_freq_factor": float,
    "high_freq_factor": float,
    "original_max_position_embeddings": int,
}


def _err(path: str, field: str, value: Any, allowed: str) -> ConfigError:
    return ConfigError(f"{path}: field '{field}': got {value!r}; {allowed}")


def _positive_int(path: str, raw: dict, field: str) -> int:
    value = raw[field]
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise _err(path, field, value, "expected a positive integer")
    return value


def _positive_float(path: str, raw: dict, field: str) -> float:
    value = raw[field]
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
        raise _err(path, field, value, "expected a positive number")
    return float(value)


def _parse_rope_scaling(path: str, raw: Any) -> RopeScaling | None:
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise _err(path, "rope_scaling", raw, "expected a mapping or null")
    if raw.get("rope_type") != "llama3":
        raise _err(path, "rope_scaling.rope_type", raw.get("rope_type"), "allowed: 'llama3'")
    values = {}
    for key, kind in _ROPE_FIELDS.items():
        if key not in raw:
            raise ConfigError(f"{path}: field 'rope_scaling.{key}' is missing")
        value = raw[key]
        if kind is not str:
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
                raise _err(path, f"rope_scaling.{key}", value, "expected a positive number")
            value = kind(value)
        values[key] = value
    if values["high_freq_factor"] <= values["low_freq_factor"]:
        raise _err(
            path, "rope_scaling.high_freq_factor", values["high_freq_factor"],
            f"must be greater than low_freq_factor ({values['low_freq_factor']})",
        )
    unknown = set(raw) - set(_ROPE_FIELDS)
    if unknown:
        raise _err(path, "rope_scaling", sorted(unknown)[0], f"unknown key; allowed: {sorted(_ROPE_FIELDS)}")
    return RopeScaling(**values)


def parse_model_config(raw: Any, path: str) -> ModelConfig:
    """Validate a parsed YAML mapping; `path` is used in error messages only."""
    from .quantization import QUANTIZATIONS  # local: quantization imports nothing from here

    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: expected a YAML mapping at top level, got {type(raw).__name__}")
    for field in _REQUIRED:
        if field not in raw:
            raise ConfigError(f"{path}: field '{field}' is missing")
    known = set(_REQUIRED) | {
        "display_name", "rope_scaling", "tie_word_embeddings", "page_size",
    }
    unknown = sorted(set(raw) - known)
    if unknown:
        raise _err(path, unknown[0], raw[unknown[0]], f"unknown field; allowed: {sorted(known)}")
    if raw["architecture"] not in SUPPORTED_ARCHITECTURES:
        raise _err(path, "architecture", raw["architecture"], f"allowed: {list(SUPPORTED_ARCHITECTURES)}")
    if not isinstance(raw["name"], str) or not raw["name"]:
        raise _err(path, "name", raw["name"], "expected a non-empty string")

    ints = {field: _positive_int(path, raw, field) for field in _INT_FIELDS}
    raw_page = raw.get("page_size", 16)
    page_size = _positive_int(path, {"page_size": raw_page}, "page_size")
    eps = _positive_float(path, raw, "rms_norm_eps")
    theta = _positive_float(path, raw, "rope_theta")

    heads, kv_heads, head_dim = (
        ints["num_attention_heads"], ints["num_key_value_heads"], ints["head_dim"]
    )
    if ints["hidden_size"] % heads != 0:
        raise _err(path, "num_attention_heads", heads,
                   f"must divide hidden_size ({ints['hidden_size']})")
    if heads % kv_heads != 0:
        raise _err(path, "num_key_value_heads", kv_heads,
                   f"must divide num_attention_heads ({heads})")
    if head_dim % 2 != 0:
        raise _err(path, "head_dim", head_dim, "must be even (rotary embedding pairs)")
    if ints["prefill_chunk_size"] > ints["context_window_size"]:
        raise _err(path, "prefill_chunk_size", ints["prefill_chunk_size"],
                   f"must be <= context_window_size ({ints['context_window_size']})")

    quants = raw["quantizations"]
    if not isinstance(quants, list) or not quants:
        raise _err(path, "quantizations", quants, f"expected a non-empty list from {sorted(QUANTIZATIONS)}")
    for q in quants:
        if q not in QUANTIZATIONS:
            raise _err(path, "quantizations", q, f"allowed: {sorted(QUANTIZATIONS)}")

    tie = raw.get("tie_word_embeddings", False)
    if not isinstance(tie, bool):
        raise _err(path, "tie_word_embeddings", tie, "expected true or false")

    return ModelConfig(
        name=raw["name"],
        display_name=str(raw.get("display_name", raw["name"])),
        architecture=raw["architecture"],
        rms_norm_eps=eps,
        rope_theta=theta,
        rope_scaling=_parse_rope_scaling(path, raw.get("rope_scaling")),
        tie_word_embeddings=tie,
        page_size=page_size,
        quantizations=tuple(quants),
        source=path,
        **ints,
    )


def resolve_model_path(model: str) -> Path:
    """A config name from configs/models/ or a path to a YAML file."""
    candidate = Path(model)
    if candidate.suffix in (".yaml", ".yml") or candidate.exists():
        if not candidate.is_file():
            raise ConfigError(f"{model}: model config file not found")
        return candidate
    named = MODELS_DIR / f"{model}.yaml"
    if named.is_file():
        return named
    available = sorted(p.stem for p in MODELS_DIR.glob("*.yaml"))
    raise ConfigError(f"--model {model!r}: no such config in {MODELS_DIR}; available: {available}")


def load_model_config(model: str) -> ModelConfig:
    path = resolve_model_path(model)
    try:
        raw = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise ConfigError(f"{path}: invalid YAML{where}: {problem}") from None
    return parse_model_config(raw, str(path))


def check_quantization(config: ModelConfig, quant: str) -> None:
    """The quantization must be known, listed by the model, and fit its shapes."""
    from .quantization import QUANTIZATIONS

    if quant not in QUANTIZATIONS:
        raise ConfigError(f"--quant {quant!r}: unknown quantization; allowed: {sorted(QUANTIZATIONS)}")
    if quant not in config.quantizations:
        raise ConfigError(
            f"{config.source}: field 'quantizations' does not list {quant!r}; "
            f"listed: {list(config.quantizations)}"
        )
    QUANTIZATIONS[quant].check_shapes(config)

"""Model configuration: YAML file -> validated `ModelConfig`.

Every validation failure raises `ConfigError` with one line naming the file, the field, the
offending value and what is allowed.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from .conv_templates import CONV_TEMPLATES
from .errors import ConfigError
from .quantization import QUANTIZATIONS, Quantization, quantization

REPO_ROOT = Path(__file__).resolve().parent.parent  # the checkout (installed: site-packages)
# an installed wheel ships the configs inside the package; a source tree has them beside it
IN_CHECKOUT = not (Path(__file__).resolve().parent / "configs").is_dir() and (REPO_ROOT / "configs").is_dir()


def _config_dir() -> Path:
    """$MLCPIPE_CONFIGS, else the checkout's configs/, else the copy an installed wheel ships
    inside the package (site-packages/mlcpipe/configs, setup.py)."""
    if os.environ.get("MLCPIPE_CONFIGS"):
        return Path(os.environ["MLCPIPE_CONFIGS"])
    return REPO_ROOT / "configs" if IN_CHECKOUT else Path(__file__).resolve().parent / "configs"


CONFIG_DIR = _config_dir()
MODELS_DIR = CONFIG_DIR / "models"


def check_config_dir() -> None:
    """$MLCPIPE_CONFIGS, where set, is a folder with models/ and targets/ (was: every --model
    'no such config in .../models; available: []', every --target a missing preset)."""
    given = os.environ.get("MLCPIPE_CONFIGS")
    if given and not all((Path(given) / sub).is_dir() for sub in ("models", "targets")):
        raise ConfigError(f"environment MLCPIPE_CONFIGS={short_repr(given, 300)}: expected a folder holding models/ and targets/ "
                          "(it replaces mlcpipe's configs/), or unset it")


def artifacts_root() -> Path:
    """Where builds, caches, bundles and tuning databases go: $MLCPIPE_ARTIFACTS, else the
    checkout's artifacts/ (a developer's), else ./artifacts in the current directory (an
    installed mlcpipe never writes into site-packages)."""
    if os.environ.get("MLCPIPE_ARTIFACTS"):
        return Path(os.environ["MLCPIPE_ARTIFACTS"])
    return REPO_ROOT / "artifacts" if IN_CHECKOUT else Path.cwd() / "artifacts"


def model_dirs() -> list[Path]:
    """Folders `--model NAME` is looked up in: the current directory's configs/models/ (a user's
    own), then mlcpipe's."""
    own = Path.cwd() / "configs" / "models"
    return [own, MODELS_DIR] if own.is_dir() and own.resolve() != MODELS_DIR.resolve() else [MODELS_DIR]

# The architectures (one module each in pipeline/model/) and the YAML fields each adds to the
# common ones (config.json's names), with their defaults. SmolLM2 and Mistral are `llama`.
ARCHITECTURE_FIELDS: dict[str, dict[str, Any]] = {
    "llama": {},
    "qwen2": {},  # q/k/v projections with bias
    "qwen3": {"attention_bias": False},  # q/k RMSNorm over head_dim
    "gemma3": {  # sliding-window layers with their own rope theta, q/k norms, sandwich norms, GeGLU
        "sliding_window": 512, "sliding_window_pattern": 6, "layer_types": None, "rope_local_base_freq": 10000.0,
        "query_pre_attn_scalar": None, "hidden_activation": "gelu_pytorch_tanh",
    },
}
SUPPORTED_ARCHITECTURES = tuple(ARCHITECTURE_FIELDS)
LAYER_TYPES = ("full_attention", "sliding_attention")
DEFAULT_MAX_BATCH_SIZE = 80  # MLC-LLM's compile-time batch bound (`max_batch_size` of its model configs)
DEFAULT_CONV_TEMPLATE = "LM"  # plain completion (pipeline/conv_templates.py)


MAX_YAML_BYTES = 1 << 20  # a model / target / matrix YAML is a few KiB; refuse anything past 1 MiB
SHORT_REPR = 80  # longest value repr an error message quotes


def short_repr(value: Any, limit: int = SHORT_REPR) -> str:
    """repr(value) cut to `limit` characters (an error line quoting a huge value stays short)."""
    if isinstance(value, (str, bytes)) and len(value) > 4 * limit:
        value = value[: 4 * limit]  # no repr of megabytes just to cut it
    text = repr(value)
    if isinstance(value, (list, tuple, dict, set)) and len(text) > 64 * limit:
        text = text[: 64 * limit]
    return text if len(text) <= limit else text[: limit - 8] + "...(cut)"


def short_text(text: Any, limit: int = SHORT_REPR) -> str:
    """str(text) cut to `limit` characters."""
    text = str(text)[: 4 * limit] if not isinstance(text, str) else text
    return text if len(text) <= limit else text[: limit - 8] + "...(cut)"


class _NoAliasLoader(yaml.SafeLoader):
    """SafeLoader that refuses aliases (`*name`, `<<: *name`): alias expansion is how a few
    hundred bytes of YAML become gigabytes of objects (billion laughs)."""

    def compose_node(self, parent, index):
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            raise yaml.composer.ComposerError(
                None, None, f"alias '*{event.anchor}' not allowed (YAML anchors/aliases are refused; write the value out)",
                event.start_mark)
        return super().compose_node(parent, index)

    def construct_mapping(self, node, deep=False):
        """A mapping whose key appears twice is refused (YAML says keys are unique; PyYAML keeps the last)."""
        if isinstance(node, yaml.MappingNode):
            seen = {}
            for key_node, _ in node.value:
                if isinstance(key_node, yaml.ScalarNode):
                    key = key_node.value
                    if key in seen:
                        raise yaml.constructor.ConstructorError(
                            None, None, f"key {key!r} appears twice (first on line {seen[key] + 1}); a key may appear once",
                            key_node.start_mark)
                    seen[key] = key_node.start_mark.line
        return super().construct_mapping(node, deep=deep)


def load_yaml(path: Path, what: str = "YAML") -> Any:
    """A YAML file parsed safely: at most MAX_YAML_BYTES, no aliases; ConfigError (one line,
    with the line and column of a syntax error) otherwise."""
    path = Path(path)
    try:
        size = path.stat().st_size
        if size > MAX_YAML_BYTES:
            raise ConfigError(f"{path}: {size} bytes; a {what} file may have at most {MAX_YAML_BYTES} bytes (1 MiB)")
        with open(path, "rb") as f:
            data = f.read(MAX_YAML_BYTES + 1)
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read {what}: {exc.strerror or exc}") from None
    if len(data) > MAX_YAML_BYTES:  # grew since stat, or not a regular file
        raise ConfigError(f"{path}: more than {MAX_YAML_BYTES} bytes; a {what} file may have at most 1 MiB")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: invalid YAML: not UTF-8 text (byte {exc.start})") from None
    try:
        return yaml.load(text, Loader=_NoAliasLoader)  # noqa: S506 - a SafeLoader subclass
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise ConfigError(f"{path}: invalid YAML{where}: {short_text(problem, 200)}") from None
    except RecursionError:
        raise ConfigError(f"{path}: invalid YAML: nested too deeply") from None


def cache_layer_kinds(num_hidden_layers: int, layer_types: Sequence[str] | None) -> list[str]:
    """TVM's attention kind of each KV cache layer ("mha", "mha_sliding"). A model whose layers
    all slide gets one more, unused, "mha" layer: TVM 0.27's runtime allocates the prefill's
    q/k/v scratch only when some layer is "mha" (without one, the first prefill fails in
    Tensor::CreateView on a null tensor)."""
    kinds = ["mha_sliding" if layer_types and layer_types[i] == "sliding_attention" else "mha" for i in range(num_hidden_layers)]
    return kinds + ["mha"] if "mha" not in kinds else kinds


def kv_cache_bytes(model_config: dict, context: int, dtype_bytes: int) -> int:
    """Bytes of a paged KV cache of `context` tokens: cache layers x (K, V) x KV heads x head_dim
    x the pages' tokens x dtype_bytes."""
    page = int(model_config.get("page_size", 16))
    tokens = -(-context // page) * page
    layers = len(cache_layer_kinds(int(model_config["num_hidden_layers"]), model_config.get("layer_types")))
    return layers * 2 * int(model_config["num_key_value_heads"]) * int(model_config["head_dim"]) * tokens * dtype_bytes



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
class ConvTemplate:
    """A conversation template in MLC-LLM's `Conversation` format (fields in its order)."""

    name: str | None
    system_template: str
    system_message: str
    system_prefix_token_ids: tuple[int, ...] | None
    add_role_after_system_message: bool
    roles: dict[str, str]
    role_templates: dict[str, str]
    messages: tuple[tuple[str, str | None], ...]
    seps: tuple[str, ...]
    role_content_sep: str
    role_empty_sep: str
    stop_str: tuple[str, ...]
    stop_token_ids: tuple[int, ...]
    function_string: str
    use_function_calling: bool

    def as_dict(self) -> dict[str, Any]:
        """The JSON object MLC-LLM and WebLLM read (lists, not tuples)."""
        return json.loads(json.dumps(dataclasses.asdict(self)))

    def __hash__(self) -> int:  # the dict fields keep the generated hash from working
        return hash(json.dumps(self.as_dict(), sort_keys=True))


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
    # The largest batch MLC-LLM's runtime may run, and the chat / generation defaults of
    # mlc-chat-config.json (MLC-LLM's system defaults when the YAML omits them).
    max_batch_size: int = DEFAULT_MAX_BATCH_SIZE
    temperature: float = 1.0
    top_p: float = 1.0
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    bos_token_id: int = 1
    eos_token_id: int | tuple[int, ...] = 2
    pad_token_id: int = 0
    conv_template: ConvTemplate | None = None  # resolved from a name or an inline mapping
    # architecture fields (ARCHITECTURE_FIELDS; the defaults here mean "not this architecture's")
    layer_types: tuple[str, ...] = ()  # per layer: full_attention or sliding_attention (empty: all full)
    sliding_window: int = 0  # keys a sliding_attention layer sees, its own included
    rope_local_base_freq: float = 0.0  # rope theta of the sliding layers
    query_pre_attn_scalar: float = 0.0  # attention scale scalar^-0.5 (0: head_dim)
    hidden_activation: str = "silu"  # of the gated MLP: silu or gelu_pytorch_tanh
    source: str = ""  # the YAML file this came from

    @property
    def qkv_bias(self) -> bool:
        return self.architecture == "qwen2"

    @property
    def qk_norm(self) -> bool:
        return self.architecture in ("qwen3", "gemma3")

    @property
    def sm_scale(self) -> float:
        return (self.query_pre_attn_scalar or self.head_dim) ** -0.5

    def scheme(self, name: str, flag: str = "--quant") -> Quantization:
        """The quantization scheme `name` (from `flag`) for building this model: known, listed by `quantizations`, fitting the shapes."""
        scheme = quantization(name, flag)
        if name not in self.quantizations:
            raise ConfigError(f"{self.source}: field 'quantizations' does not list {name!r}; listed: {list(self.quantizations)}")
        scheme.check_shapes(self)
        return scheme

    def layer_is_sliding(self, layer: int) -> bool:
        return bool(self.layer_types) and self.layer_types[layer] == "sliding_attention"

    def as_dict(self) -> dict[str, Any]:
        """Every field of its architecture (JSON types); `parse_model_config` of it gives this
        config back."""
        out = dataclasses.asdict(self)
        out.pop("source")
        if self.architecture != "gemma3":
            for key in ("layer_types", "sliding_window", "rope_local_base_freq", "query_pre_attn_scalar", "hidden_activation"):
                out.pop(key)
        else:
            out["layer_types"] = list(self.layer_types)
        out["quantizations"] = list(self.quantizations)
        if isinstance(self.eos_token_id, tuple):
            out["eos_token_id"] = list(self.eos_token_id)
        if self.conv_template is not None:
            out["conv_template"] = self.conv_template.as_dict()
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
# Upper bounds, far above any released model (a typo like 1e12 is one line, not a TVM failure):
# vocabularies reach 262144, hidden sizes 16384, contexts 10M tokens only with tricks mlcpipe lacks.
_INT_LIMITS = {
    "hidden_size": 1 << 16, "intermediate_size": 1 << 18, "num_hidden_layers": 1024, "num_attention_heads": 1024,
    "num_key_value_heads": 1024, "head_dim": 1024, "vocab_size": 1 << 22, "context_window_size": 1 << 21,
    "prefill_chunk_size": 1 << 21,
}
PAGE_SIZE = 16  # tokens per KV cache page: the only size TVM 0.27's paged attention kernels index
_REQUIRED = ("name", "architecture", *_INT_FIELDS, "rms_norm_eps", "rope_theta", "quantizations")
# Generation defaults: field -> (MLC-LLM's system default, check, what is allowed). The ranges are
# WebLLM's (postInitAndCheckGenerationConfigValues), which refuses a config outside them.
_GENERATION_FIELDS = {
    "temperature": (1.0, lambda v: v >= 0, "expected a number >= 0"),
    "top_p": (1.0, lambda v: 0 < v <= 1, "expected a number in (0, 1]"),
    "repetition_penalty": (1.0, lambda v: v > 0, "expected a number > 0"),
    "presence_penalty": (0.0, lambda v: -2 <= v <= 2, "expected a number in [-2, 2]"),
    "frequency_penalty": (0.0, lambda v: -2 <= v <= 2, "expected a number in [-2, 2]"),
}
_TOKEN_ID_DEFAULTS = {"bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 0}
# Keys MLC-LLM's Llama model_config has that mlcpipe derives (mlc-chat-config.json's model_config
# carries them; parse_model_config accepts them when they agree): key -> (value, what is allowed).
_MLC_DERIVED = {
    "tensor_parallel_shards": (1, "allowed: 1 (mlcpipe builds single-device libraries)"),
    "pipeline_parallel_stages": (1, "allowed: 1 (mlcpipe builds single-device libraries)"),
    "disaggregation": (False, "allowed: false"),
}
_CONV_FIELDS = {f.name for f in dataclasses.fields(ConvTemplate)}
_DEFAULT_ROLE_TEMPLATES = {  # MLC-LLM's Conversation defaults, overridden per role by the template
    "user": "{user_message}", "assistant": "{assistant_message}", "tool": "{tool_message}",
}
_ROPE_FIELDS = {
    "rope_type": str,
    "factor": float,
    "low_freq_factor": float,
    "high_freq_factor": float,
    "original_max_position_embeddings": int,
}


def _err(path: str, field: str, value: Any, allowed: str) -> ConfigError:
    return ConfigError(f"{path}: field '{short_text(field)}': got {short_repr(value)}; {allowed}")


def _positive_int(path: str, raw: dict, field: str) -> int:
    value = raw[field]
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise _err(path, field, value, "expected a positive integer")
    limit = _INT_LIMITS.get(field)
    if limit is not None and value > limit:
        raise _err(path, field, value, f"expected a positive integer <= {limit}")
    return value


def _finite(value: Any) -> bool:
    return not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value)


def _positive_float(path: str, raw: dict, field: str) -> float:
    value = raw[field]
    if not _finite(value) or value <= 0:
        raise _err(path, field, value, "expected a positive finite number")
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
            if not _finite(value) or value <= 0:
                raise _err(path, f"rope_scaling.{key}", value, "expected a positive finite number")
            value = kind(value)
        values[key] = value
    if values["high_freq_factor"] <= values["low_freq_factor"]:
        raise _err(
            path, "rope_scaling.high_freq_factor", values["high_freq_factor"],
            f"must be greater than low_freq_factor ({values['low_freq_factor']})",
        )
    unknown = set(raw) - set(_ROPE_FIELDS)
    if unknown:
        raise _err(path, "rope_scaling", sorted(unknown, key=str)[0], f"unknown key; allowed: {sorted(_ROPE_FIELDS)}")
    return RopeScaling(**values)


def _number(path: str, field: str, value: Any, ok, allowed: str) -> float:
    if not _finite(value) or not ok(value):
        raise _err(path, field, value, allowed)
    return float(value)


def _token_id(path: str, field: str, value: Any, vocab_size: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < vocab_size:
        raise _err(path, field, value, f"expected a token id in [0, vocab_size={vocab_size})")
    return value


def _token_ids(path: str, field: str, value: Any, vocab_size: int, allow_empty: bool = True) -> tuple[int, ...]:
    if not isinstance(value, list) or (not value and not allow_empty):
        raise _err(path, field, value, f"expected a {'' if allow_empty else 'non-empty '}list of token ids in [0, vocab_size={vocab_size})")
    return tuple(_token_id(path, field, v, vocab_size) for v in value)


def _string(path: str, field: str, value: Any) -> str:
    if not isinstance(value, str):
        raise _err(path, field, value, "expected a string")
    return value


def _strings(path: str, field: str, value: Any, sizes: tuple[int, int] | None = None) -> tuple[str, ...]:
    if not isinstance(value, list) or (sizes and not sizes[0] <= len(value) <= sizes[1]):
        what = f"a list of {sizes[0]} or {sizes[1]} strings" if sizes else "a list of strings"
        raise _err(path, field, value, f"expected {what}")
    return tuple(_string(path, field, v) for v in value)


def _string_map(path: str, field: str, value: Any) -> dict[str, str]:
    if not isinstance(value, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
        raise _err(path, field, value, "expected a mapping of strings to strings")
    return dict(value)


def _bool(path: str, field: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise _err(path, field, value, "expected true or false")
    return value


def parse_conv_template(raw: Any, path: str, vocab_size: int, field: str = "conv_template") -> ConvTemplate:
    """A template name from `pipeline/conv_templates.py`, or a mapping in MLC-LLM's Conversation
    format (required: roles with user and assistant, seps; the rest take MLC-LLM's defaults)."""
    name = None
    if isinstance(raw, str):
        if raw not in CONV_TEMPLATES:
            raise _err(path, field, raw, f"allowed: a mapping or one of {sorted(CONV_TEMPLATES)}")
        name, raw = raw, {"name": raw, **CONV_TEMPLATES[raw]}
    if not isinstance(raw, dict):
        raise _err(path, field, raw, f"expected a template name or a mapping with fields {sorted(_CONV_FIELDS)}")
    unknown = sorted(set(raw) - _CONV_FIELDS, key=str)
    if unknown:
        raise _err(path, f"{field}.{unknown[0]}", raw[unknown[0]], f"unknown field; allowed: {sorted(_CONV_FIELDS)}")
    for key in ("roles", "seps"):
        if key not in raw:
            raise ConfigError(f"{path}: field '{field}.{key}' is missing")
    f = lambda key: f"{field}.{key}"  # noqa: E731
    roles = _string_map(path, f("roles"), raw["roles"])
    for role in ("user", "assistant"):
        if role not in roles:
            raise _err(path, f("roles"), raw["roles"], "must map 'user' and 'assistant' (and optionally 'tool')")
    role_templates = {**_DEFAULT_ROLE_TEMPLATES, **_string_map(path, f("role_templates"), raw.get("role_templates", {}))}
    messages = raw.get("messages", [])
    if not isinstance(messages, list):
        raise _err(path, f("messages"), messages, "expected a list of [role, content] pairs")
    for message in messages:
        if (not isinstance(message, (list, tuple)) or len(message) != 2 or message[0] not in roles
                or not (message[1] is None or isinstance(message[1], str))):
            raise _err(path, f("messages"), message, f"expected [role, content or null] with role in {sorted(roles)}")
    name = raw.get("name", name)
    if name is not None:
        name = _string(path, f("name"), name)
    prefix = raw.get("system_prefix_token_ids")
    return ConvTemplate(
        name=name,
        system_template=_string(path, f("system_template"), raw.get("system_template", "{system_message}")),
        system_message=_string(path, f("system_message"), raw.get("system_message", "")),
        system_prefix_token_ids=None if prefix is None else _token_ids(path, f("system_prefix_token_ids"), prefix, vocab_size),
        add_role_after_system_message=_bool(path, f("add_role_after_system_message"), raw.get("add_role_after_system_message", True)),
        roles=roles,
        role_templates=role_templates,
        messages=tuple((m[0], m[1]) for m in messages),
        seps=_strings(path, f("seps"), raw["seps"], sizes=(1, 2)),
        role_content_sep=_string(path, f("role_content_sep"), raw.get("role_content_sep", "")),
        role_empty_sep=_string(path, f("role_empty_sep"), raw.get("role_empty_sep", "")),
        stop_str=_strings(path, f("stop_str"), raw.get("stop_str", [])),
        stop_token_ids=_token_ids(path, f("stop_token_ids"), raw.get("stop_token_ids", []), vocab_size),
        function_string=_string(path, f("function_string"), raw.get("function_string", "")),
        use_function_calling=_bool(path, f("use_function_calling"), raw.get("use_function_calling", False)),
    )


# A name that becomes one path component (artifacts/<name>-<quant>-<target>, nightly cells).
_PATH_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")


def check_path_name(path: Any, field: str, value: Any) -> None:
    """`value` must be a safe single file name: no '/', '..', leading dot or other characters."""
    if not isinstance(value, str) or not _PATH_NAME.fullmatch(value):
        raise _err(str(path), field, value, "expected a name of letters, digits, '.', '_' and '-' (at most 128, "
                   "starting with a letter or digit): it names directories")


def parse_model_config(raw: Any, path: str) -> ModelConfig:
    """Validate a parsed YAML mapping; `path` is used in error messages only."""
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: expected a YAML mapping at top level, got {type(raw).__name__}")
    for field in _REQUIRED:
        if field not in raw:
            raise ConfigError(f"{path}: field '{field}' is missing")
    if raw["architecture"] not in SUPPORTED_ARCHITECTURES:
        raise _err(path, "architecture", raw["architecture"], f"allowed: {list(SUPPORTED_ARCHITECTURES)}")
    family = ARCHITECTURE_FIELDS[raw["architecture"]]
    _check_known_fields(path, raw, family)
    check_path_name(path, "name", raw["name"])
    ints = {field: _positive_int(path, raw, field) for field in _INT_FIELDS}
    page_size = raw.get("page_size", PAGE_SIZE)
    if type(page_size) is not int or page_size != PAGE_SIZE:
        raise _err(path, "page_size", page_size, f"allowed: {PAGE_SIZE} (TVM's paged KV cache kernels are written for {PAGE_SIZE}-token pages)")
    eps = _positive_float(path, raw, "rms_norm_eps")
    theta = _positive_float(path, raw, "rope_theta")
    _check_shapes(path, ints)
    quants = _quantizations(path, raw)
    tie = raw.get("tie_word_embeddings", False)
    if not isinstance(tie, bool):
        raise _err(path, "tie_word_embeddings", tie, "expected true or false")
    _check_mlc_fields(path, raw, theta)
    max_batch = _positive_int(path, {"max_batch_size": raw.get("max_batch_size", DEFAULT_MAX_BATCH_SIZE)}, "max_batch_size")
    generation = {
        key: _number(path, key, raw.get(key, default), ok, allowed)
        for key, (default, ok, allowed) in _GENERATION_FIELDS.items()
    }
    tokens = _token_ids_of(path, raw, ints["vocab_size"])
    conv = parse_conv_template(raw.get("conv_template", DEFAULT_CONV_TEMPLATE), path, ints["vocab_size"])
    architecture = _architecture_fields(path, raw, family, ints)
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
        max_batch_size=max_batch,
        conv_template=conv,
        source=path,
        **architecture,
        **generation,
        **tokens,
        **ints,
    )


def _check_known_fields(path: str, raw: dict, family: dict) -> None:
    """Every field of `raw` is one of the config's or of its architecture's."""
    known = set(_REQUIRED) | {
        "display_name", "rope_scaling", "tie_word_embeddings", "page_size", "max_batch_size",
        *_GENERATION_FIELDS, *_TOKEN_ID_DEFAULTS, "conv_template",
        "position_embedding_base", *_MLC_DERIVED,  # as mlc-chat-config.json's model_config has them
    } | set(family)
    unknown = sorted(set(raw) - known, key=str)
    if unknown:
        others = [a for a, fields in ARCHITECTURE_FIELDS.items() if unknown[0] in fields]
        why = (f"not a field of architecture {raw['architecture']!r} (it is {', '.join(repr(a) for a in others)}'s)" if others
               else "unknown field")
        raise _err(path, unknown[0], raw[unknown[0]], f"{why}; allowed: {sorted(known)}")


def _check_shapes(path: str, ints: dict) -> None:
    """Heads divide the hidden size, KV heads the heads, head_dim is even, a prefill chunk fits the context."""
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


def _quantizations(path: str, raw: dict) -> list[str]:
    quants = raw["quantizations"]
    if not isinstance(quants, list) or not quants:
        raise _err(path, "quantizations", quants, f"expected a non-empty list from {sorted(QUANTIZATIONS)}")
    for q in quants:
        if q not in QUANTIZATIONS:
            raise _err(path, "quantizations", q, f"allowed: {sorted(QUANTIZATIONS)}")
    return quants


def _check_mlc_fields(path: str, raw: dict, theta: float) -> None:
    """MLC-LLM's names of our fields, and the fields mlc-chat-config.json derives, where given, agree."""
    if "position_embedding_base" in raw:  # MLC-LLM's name for rope_theta
        base = _positive_float(path, raw, "position_embedding_base")
        if abs(base - theta) > 1e-9 * theta:
            raise _err(path, "position_embedding_base", raw["position_embedding_base"], f"must equal rope_theta ({theta})")
    for key, (value, allowed) in _MLC_DERIVED.items():
        if key in raw and (raw[key] != value or type(raw[key]) is not type(value)):
            raise _err(path, key, raw[key], allowed)


def _token_ids_of(path: str, raw: dict, vocab: int) -> dict[str, Any]:
    """The special token ids (eos may be a list), each inside the vocabulary."""
    tokens: dict[str, Any] = {
        key: _token_id(path, key, raw.get(key, default), vocab)
        for key, default in _TOKEN_ID_DEFAULTS.items() if key != "eos_token_id"
    }
    eos = raw.get("eos_token_id", _TOKEN_ID_DEFAULTS["eos_token_id"])
    tokens["eos_token_id"] = (
        _token_ids(path, "eos_token_id", eos, vocab, allow_empty=False) if isinstance(eos, list)
        else _token_id(path, "eos_token_id", eos, vocab)
    )
    return tokens


def _architecture_fields(path: str, raw: dict, family: dict, ints: dict) -> dict[str, Any]:
    """The ModelConfig fields of the architecture's own YAML fields (ARCHITECTURE_FIELDS)."""
    values = {key: raw.get(key, default) for key, default in family.items()}
    if "attention_bias" in values and values["attention_bias"] is not False:
        raise _err(path, "attention_bias", values["attention_bias"], "allowed: false (q/k/v/o projections without bias)")
    if "sliding_window" not in family:
        return {}
    layers = ints["num_hidden_layers"]
    window = _positive_int(path, values, "sliding_window")
    if ints["prefill_chunk_size"] > window:  # the paged KV cache masks a chunk's own tokens causally, not by window
        raise _err(path, "prefill_chunk_size", ints["prefill_chunk_size"],
                   f"must be <= sliding_window ({window}): a prefill chunk attends to itself without the window")
    if values["layer_types"] is not None:
        types = _strings(path, "layer_types", values["layer_types"])
        if len(types) != layers or any(t not in LAYER_TYPES for t in types):
            raise _err(path, "layer_types", values["layer_types"],
                       f"expected num_hidden_layers ({layers}) entries, each one of {list(LAYER_TYPES)}")
        if "sliding_window_pattern" in raw:
            raise ConfigError(f"{path}: field 'sliding_window_pattern': give layer_types or sliding_window_pattern, not both")
    else:
        pattern = _positive_int(path, values, "sliding_window_pattern")
        types = tuple("full_attention" if (i + 1) % pattern == 0 else "sliding_attention" for i in range(layers))
    scalar = values["query_pre_attn_scalar"]
    scalar = ints["head_dim"] if scalar is None else _positive_float(path, values, "query_pre_attn_scalar")
    activation = values["hidden_activation"]
    if activation not in ("gelu_pytorch_tanh", "silu"):
        raise _err(path, "hidden_activation", activation, "allowed: 'gelu_pytorch_tanh', 'silu'")
    return {"layer_types": types, "sliding_window": window, "hidden_activation": activation, "query_pre_attn_scalar": float(scalar),
            "rope_local_base_freq": _positive_float(path, values, "rope_local_base_freq")}


def resolve_model_path(model: str, flag: str = "--model") -> Path:
    """A config name from configs/models/ or a path to a YAML file (a directory of the same name as
    a config, e.g. an artifact built with `--output llama-tiny`, does not hide the config)."""
    folders = model_dirs()

    def available() -> list[str]:
        return sorted({p.stem for folder in folders for p in folder.glob("*.yaml")})

    if not model.strip():
        raise ConfigError(f"{flag} {model!r}: empty; give a config name ({', '.join(available())}) or a YAML file's path")
    candidate = Path(model)
    if candidate.suffix in (".yaml", ".yml") or candidate.is_file():
        if not candidate.is_file():
            raise ConfigError(f"{model}: model config file not found" + (" (it is a directory)" if candidate.is_dir() else ""))
        return candidate
    for folder in folders:
        if (folder / f"{model}.yaml").is_file():
            return folder / f"{model}.yaml"
    here = f" ({model} here is a directory, not a model YAML)" if candidate.is_dir() else ""
    raise ConfigError(f"{flag} {model!r}: no such config in {', '.join(map(str, folders))}{here}; available: {available()}")


def load_model_config(model: str, flag: str = "--model") -> ModelConfig:
    path = resolve_model_path(model, flag)
    return parse_model_config(load_yaml(path, "model config"), str(path))

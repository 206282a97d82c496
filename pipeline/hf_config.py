"""A Hugging Face `config.json` as mlcpipe's model fields: `model_fields` reads both the 4.x form
(`rope_theta`, `rope_local_base_freq`, `sliding_window_pattern`) and the 5.x form
(`rope_parameters` per layer type, `layer_types`), refusing in one line what an architecture here
cannot compute exactly; `model_yaml` makes the whole model YAML of `mlcpipe import-config`, and
`weights.check_hf_config` holds a checkpoint against a YAML with the same reading."""

from __future__ import annotations

import math
from typing import Any

from .config import LAYER_TYPES, PAGE_SIZE, short_repr
from .conv_templates import CONV_TEMPLATES as TEMPLATES
from .errors import ConfigError
from .quantization import QUANTIZATIONS

# (config.json's architectures[0], its model_type, the mlcpipe architecture)
_SUPPORTED = (("LlamaForCausalLM", "llama", "llama"), ("MistralForCausalLM", "mistral", "llama"),
              ("Qwen2ForCausalLM", "qwen2", "qwen2"), ("Qwen3ForCausalLM", "qwen3", "qwen3"),
              ("Gemma3ForCausalLM", "gemma3_text", "gemma3"))
HF_ARCHITECTURES = {hf_arch: arch for hf_arch, _, arch in _SUPPORTED}
HF_MODEL_TYPES = {model_type: arch for _, model_type, arch in _SUPPORTED}
# transformers' config class defaults of what a saved config.json may leave out
_TIED_DEFAULT = {"llama": False, "qwen2": False, "qwen3": False, "gemma3": True}
_ACTIVATION = {"llama": "silu", "qwen2": "silu", "qwen3": "silu", "gemma3": "gelu_pytorch_tanh"}
CONV_TEMPLATES = {"llama": "llama-3_1", "qwen2": "qwen2", "qwen3": "qwen2", "gemma3": "gemma_instruction"}
MAX_CONTEXT = 4096  # context_window_size of an imported model: the KV cache is allocated whole
MAX_PREFILL_CHUNK = 2048


def _field(path: str, hf: dict, key: str, check, allowed: str, default: Any = None) -> Any:
    if key not in hf:
        if default is not None:
            return default
        raise ConfigError(f"{path}: field '{key}' is missing")
    if not check(hf[key]):
        raise ConfigError(f"{path}: field '{key}': got {short_repr(hf[key])}; {allowed}")
    return hf[key]


def _int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value) and value > 0


def architecture_of(hf: dict, path: str) -> str:
    names = hf.get("architectures")
    name = names[0] if isinstance(names, list) and names and isinstance(names[0], str) else None
    if name in HF_ARCHITECTURES:
        return HF_ARCHITECTURES[name]
    if name is None and hf.get("model_type") in HF_MODEL_TYPES:
        return HF_MODEL_TYPES[hf["model_type"]]
    what = f"architecture {short_repr(name)}" if name else f"model_type {short_repr(hf.get('model_type'))}"
    text = hf.get("text_config")
    if isinstance(text, dict):  # e.g. Gemma 3 4B+ (model_type gemma3): a vision tower beside a text model
        what += (f" (a multimodal checkpoint; its text_config is model_type {short_repr(text.get('model_type'))}: "
                 "only text-only checkpoints are read)")
    supported = ", ".join(f"{hf_arch} / {model_type}" for hf_arch, model_type, _ in _SUPPORTED)
    raise ConfigError(f"{path}: {what} is not supported; supported (architectures / model_type): {supported}")


def _rope(path: str, hf: dict, layer_type: str) -> dict:
    """{"rope_theta", "rope_type", ...} of one layer type: 5.x rope_parameters (flat, or per
    layer type), else 4.x rope_theta / rope_local_base_freq / rope_scaling."""
    params = hf.get("rope_parameters")
    if isinstance(params, dict) and layer_type in params and isinstance(params[layer_type], dict):
        params = params[layer_type]
    if isinstance(params, dict) and "rope_theta" in params:
        return dict(params)
    theta_key = "rope_local_base_freq" if layer_type == "sliding_attention" else "rope_theta"
    theta = _field(path, hf, theta_key, _number, "expected a positive number", 10000.0)
    scaling = hf.get("rope_scaling") if layer_type == "full_attention" else None
    return {"rope_theta": theta, **(scaling or {"rope_type": "default"})}


def _rope_scaling(path: str, rope: dict, architecture: str) -> dict | None:
    kind = rope.get("rope_type", rope.get("type", "default"))
    if kind == "default":
        return None
    if kind == "llama3" and architecture == "llama":
        return {k: rope[k] for k in ("rope_type", "factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")
                if k in rope}
    raise ConfigError(f"{path}: field 'rope_parameters': rope_type {short_repr(kind)} is not supported for {architecture} "
                      f"(supported: default{', llama3' if architecture == 'llama' else ''})")


def model_fields(hf: Any, path: str) -> dict[str, Any]:
    """The architecture fields of a model YAML (ARCHITECTURE_FIELDS and the common ones) from a
    parsed config.json; ConfigError in one line for what is missing or not supported."""
    if not isinstance(hf, dict):
        raise ConfigError(f"{path}: expected a JSON object at top level, got {type(hf).__name__}")
    arch = architecture_of(hf, path)
    out: dict[str, Any] = {"architecture": arch}
    for key in ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "vocab_size"):
        out[key] = _field(path, hf, key, _int, "expected a positive integer")
    out["num_key_value_heads"] = _field(path, hf, "num_key_value_heads", _int, "expected a positive integer",
                                        out["num_attention_heads"])
    head_dim = hf.get("head_dim")
    out["head_dim"] = head_dim if head_dim is not None else out["hidden_size"] // out["num_attention_heads"]
    _field(path, {"head_dim": out["head_dim"]}, "head_dim", _int, "expected a positive integer")
    out["rms_norm_eps"] = float(_field(path, hf, "rms_norm_eps", _number, "expected a positive number"))
    tied = hf.get("tie_word_embeddings", _TIED_DEFAULT[arch])
    out["tie_word_embeddings"] = _field(path, {"tie_word_embeddings": tied}, "tie_word_embeddings",
                                        lambda v: isinstance(v, bool), "expected true or false")
    activation = hf.get("hidden_activation", hf.get("hidden_act", _ACTIVATION[arch]))
    if activation != _ACTIVATION[arch]:
        raise ConfigError(f"{path}: field 'hidden_act': got {short_repr(activation)}; {arch} computes {_ACTIVATION[arch]!r}")
    for key in ("final_logit_softcapping", "attn_logit_softcapping"):
        if hf.get(key) is not None:
            raise ConfigError(f"{path}: field '{key}': got {short_repr(hf[key])}; allowed: null (no logit soft-capping)")
    if hf.get("use_sliding_window") and arch != "gemma3":
        raise ConfigError(f"{path}: field 'use_sliding_window': got true; allowed: false for {arch}")
    for key in ("attention_bias", "mlp_bias"):  # Qwen2's q/k/v biases are always there (its config has no flag)
        if hf.get(key, False) is not False and not (arch == "qwen2" and key == "attention_bias"):
            raise ConfigError(f"{path}: field '{key}': got {short_repr(hf[key])}; allowed: false ({arch} layers without biases)")
    full = _rope(path, hf, "full_attention")
    out["rope_theta"] = float(_field(path, full, "rope_theta", _number, "expected a positive number"))
    scaling = _rope_scaling(path, full, arch)
    if scaling:
        out["rope_scaling"] = scaling
    if arch == "gemma3":
        out["sliding_window"] = _field(path, hf, "sliding_window", _int, "expected a positive integer")
        types = hf.get("layer_types")
        if types is None:
            pattern = hf.get("sliding_window_pattern", hf.get("_sliding_window_pattern", 6))
            _field(path, {"sliding_window_pattern": pattern}, "sliding_window_pattern", _int, "expected a positive integer")
            types = ["full_attention" if (i + 1) % pattern == 0 else "sliding_attention" for i in range(out["num_hidden_layers"])]
        if not isinstance(types, list) or len(types) != out["num_hidden_layers"] or any(t not in LAYER_TYPES for t in types):
            raise ConfigError(f"{path}: field 'layer_types': got {short_repr(types)}; expected num_hidden_layers entries of {list(LAYER_TYPES)}")
        out["layer_types"] = list(types)
        local = _rope(path, hf, "sliding_attention")
        _rope_scaling(path, local, arch)
        out["rope_local_base_freq"] = float(_field(path, local, "rope_theta", _number, "expected a positive number"))
        out["query_pre_attn_scalar"] = float(_field(path, hf, "query_pre_attn_scalar", _number, "expected a positive number",
                                                    out["head_dim"]))
    return out


def model_yaml(hf: dict, path: str, name: str, generation: dict | None = None) -> dict[str, Any]:
    """A whole model YAML (as a mapping) for `mlcpipe import-config`: the architecture fields, the
    runtime limits (context min(max_position_embeddings, MAX_CONTEXT), prefill chunk within it and
    the sliding window), the token ids (generation_config.json's first), the quantizations whose
    group size divides the shapes, and the family's conversation template where its token ids
    exist in the vocabulary (else plain completion)."""
    fields = model_fields(hf, path)
    max_pos = hf.get("max_position_embeddings")
    if max_pos is not None and not _int(max_pos):
        raise ConfigError(f"{path}: field 'max_position_embeddings': got {short_repr(max_pos)}; expected a positive integer")
    context = min(max_pos, MAX_CONTEXT) if max_pos is not None else MAX_CONTEXT
    window = hf.get("sliding_window")
    if fields["architecture"] == "llama" and hf.get("model_type") == "mistral" and window is not None and not (_int(window) and window >= context):
        raise ConfigError(f"{path}: field 'sliding_window': got {short_repr(window)}; allowed: null or at least the context "
                          f"window ({context} tokens): mlcpipe's llama attends to the whole context")
    chunk = min(context, MAX_PREFILL_CHUNK, fields.get("sliding_window", context))
    tokens = {}
    for key in ("bos_token_id", "eos_token_id", "pad_token_id"):
        value = (generation or {}).get(key, hf.get(key))
        if value is not None:
            tokens[key] = value
    if "pad_token_id" not in tokens and "eos_token_id" in tokens:
        eos = tokens["eos_token_id"]
        tokens["pad_token_id"] = eos[0] if isinstance(eos, list) else eos
    quants = [q for q, scheme in QUANTIZATIONS.items()
              if not getattr(scheme, "group_size", None) or all(
                  v % scheme.group_size == 0 for v in (fields["hidden_size"], fields["intermediate_size"],
                                                       fields["num_attention_heads"] * fields["head_dim"]))]
    template = CONV_TEMPLATES[fields["architecture"]]
    spec = TEMPLATES[template]
    ids = list(spec.get("stop_token_ids", [])) + list(spec.get("system_prefix_token_ids") or [])
    if any(i >= fields["vocab_size"] for i in ids):
        template = "LM"
    return {"name": name, "display_name": name, **fields, "context_window_size": context, "prefill_chunk_size": chunk,
            "page_size": PAGE_SIZE, "quantizations": quants, **tokens, "conv_template": template}


def transformers_fields(cfg) -> tuple[str, dict[str, Any]]:
    """(transformers model_type, config fields) of a ModelConfig: what `AutoConfig.for_model` takes
    to build the same model (the inverse of `model_fields`)."""
    model_type = {v: k for k, v in HF_MODEL_TYPES.items() if k != "mistral"}[cfg.architecture]
    fields = dict(
        vocab_size=cfg.vocab_size, hidden_size=cfg.hidden_size, intermediate_size=cfg.intermediate_size,
        num_hidden_layers=cfg.num_hidden_layers, num_attention_heads=cfg.num_attention_heads,
        num_key_value_heads=cfg.num_key_value_heads, head_dim=cfg.head_dim, rms_norm_eps=cfg.rms_norm_eps,
        rope_theta=cfg.rope_theta, tie_word_embeddings=cfg.tie_word_embeddings, max_position_embeddings=cfg.context_window_size,
        bos_token_id=cfg.bos_token_id, eos_token_id=list(cfg.eos_token_id) if isinstance(cfg.eos_token_id, tuple) else cfg.eos_token_id, pad_token_id=cfg.pad_token_id,
    )
    if cfg.rope_scaling is not None:
        fields["rope_scaling"] = cfg.rope_scaling.as_dict()
    if cfg.architecture == "gemma3":
        fields.update(sliding_window=cfg.sliding_window, layer_types=list(cfg.layer_types), rope_local_base_freq=cfg.rope_local_base_freq,
                      query_pre_attn_scalar=int(cfg.query_pre_attn_scalar), hidden_activation=cfg.hidden_activation)
    return model_type, fields

"""What MLC-LLM's runtimes and WebLLM read: `mlc-chat-config.json` (written here), the model
directory they load (config + tensor cache + shards + tokenizer files) and the functions they call
in the model library; `check_model_dir` / `check_library` say in one line what is missing.

Field names and formats follow MLC-LLM's `MLCChatConfig` / `Conversation`
(python/mlc_llm/protocol/), its `gen_config` and C++ readers (cpp/serve/config.cc,
cpp/json_ffi/conv_template.cc, cpp/tokenizers/tokenizers.cc) and WebLLM's `ChatConfig`
(src/config.ts, src/llm_chat.ts).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from .artifact import MANIFEST, RUNTIME_CONFIG, TENSOR_CACHE, TOKENIZER_FILES, confined, read_json, read_manifest, verified
from .config import DEFAULT_CONV_TEMPLATE, ModelConfig, parse_conv_template, short_repr
from .errors import ArtifactError
from .quantization import Quantization
from .tensor_cache import read_tensor_cache

MLC_CHAT_CONFIG_VERSION = "0.1.0"
WEBLLM_TOKENIZERS = ("tokenizer.json", "tokenizer.model")  # what WebLLM's reload can load (else UnsupportedTokenizerFilesError)
# mlcpipe architecture -> the model_type MLC-LLM's registry names it by
MLC_MODEL_TYPES = {"llama": "llama", "qwen2": "qwen2", "qwen3": "qwen3", "gemma3": "gemma3_text"}
# The tokenizer files MLC-LLM's gen_config copies from a checkpoint, in its order.
# MLC-LLM's TokenizerInfo defaults (what it writes when there is no tokenizer.json to look at).
DEFAULT_TOKENIZER_INFO = {"token_postproc_method": "byte_fallback", "prepend_space_in_encode": False,
                          "strip_space_in_decode": False}

# Top-level fields of mlc-chat-config.json that MLC-LLM (MLCChatConfig, cpp/serve/config.cc) or
# WebLLM (ChatConfig) require.
REQUIRED_CONFIG_FIELDS = (
    "model_type", "quantization", "model_config", "vocab_size", "context_window_size", "sliding_window_size",
    "prefill_chunk_size", "attention_sink_size", "tensor_parallel_shards", "temperature", "top_p",
    "repetition_penalty", "presence_penalty", "frequency_penalty", "tokenizer_files", "tokenizer_info", "conv_template",
)
# model_config keys MLC-LLM's LlamaConfig and engine-config inference look up.
REQUIRED_MODEL_CONFIG_FIELDS = (
    "hidden_size", "intermediate_size", "num_attention_heads", "num_hidden_layers", "rms_norm_eps", "vocab_size",
    "context_window_size", "prefill_chunk_size",
)
# conv_template keys Conversation::FromJSON (MLC-LLM) and WebLLM's Conversation require.
REQUIRED_CONV_FIELDS = (
    "system_template", "system_message", "add_role_after_system_message", "roles", "messages", "seps",
    "role_content_sep", "role_empty_sep", "stop_str", "stop_token_ids",
)
REQUIRED_TOKENIZER_INFO_FIELDS = ("token_postproc_method", "prepend_space_in_encode", "strip_space_in_decode")
# Relax functions MLC-LLM's engine and WebLLM's LLMChatPipeline look up in the model library.
REQUIRED_FUNCTIONS = (
    "_metadata", "embed", "prefill", "decode", "batch_prefill", "batch_decode", "batch_verify",
    "create_tir_paged_kv_cache", "softmax_with_temperature", "argsort_probs", "sample_with_top_p",
    "apply_penalty_inplace", "apply_logit_bias_inplace", "apply_bitmask_inplace",
)


class MLCContractError(ArtifactError):
    """A model directory or library that MLC-LLM / WebLLM would not load (one line)."""


# ---- writing -------------------------------------------------------------------------------------
def detect_tokenizer_info(model_dir: Path | None) -> dict[str, Any]:
    """MLC-LLM's `Tokenizer.DetectTokenizerInfo` on `<model_dir>/tokenizer.json`: ByteLevel or
    ByteFallback decoder -> token_postproc_method; a Prepend("▁") normalizer ->
    prepend_space_in_encode; a Strip(" ", 1, 0) decoder -> strip_space_in_decode. Byte-level BPE
    tokenizers (Llama 3, GPT-2) give byte_level / false / false."""
    info = dict(DEFAULT_TOKENIZER_INFO)
    path = Path(model_dir) / "tokenizer.json" if model_dir is not None else None
    if path is None or not path.is_file():
        return info
    tokenizer = read_json(path, "tokenizer.json")
    if not isinstance(tokenizer, dict):
        raise ArtifactError(f"{path}: corrupt tokenizer.json: expected a JSON object, got {type(tokenizer).__name__}")

    def parts(node: Any, key: str) -> list[dict]:
        if not isinstance(node, dict):
            return []
        return [n for n in node.get(key, []) if isinstance(n, dict)] if node.get("type") == "Sequence" else [node]

    decoders = parts(tokenizer.get("decoder"), "decoders")
    for decoder in decoders:
        if decoder.get("type") == "ByteLevel":
            info["token_postproc_method"] = "byte_level"
        elif decoder.get("type") == "ByteFallback":
            info["token_postproc_method"] = "byte_fallback"
    info["prepend_space_in_encode"] = any(
        n.get("type") == "Prepend" and n.get("prepend") == "\u2581" for n in parts(tokenizer.get("normalizer"), "normalizers"))
    info["strip_space_in_decode"] = any(
        d.get("type") == "Strip" and d.get("content") == " " and d.get("start") == 1 and d.get("stop") == 0
        for d in decoders)
    return info


def mlc_model_config(config: ModelConfig) -> dict[str, Any]:
    """`model_config` as MLC-LLM's LlamaConfig dumps it, then mlcpipe's own fields (the runtimes
    ignore keys they do not know; `pipeline.config.parse_model_config` reads the whole back)."""
    ours = config.as_dict()
    mlc = {
        "hidden_size": config.hidden_size,
        "intermediate_size": config.intermediate_size,
        "num_attention_heads": config.num_attention_heads,
        "num_hidden_layers": config.num_hidden_layers,
        "rms_norm_eps": config.rms_norm_eps,
        "vocab_size": config.vocab_size,
        "tie_word_embeddings": config.tie_word_embeddings,
        "position_embedding_base": config.rope_theta,
        "rope_scaling": ours["rope_scaling"],
        "context_window_size": config.context_window_size,
        "prefill_chunk_size": config.prefill_chunk_size,
        "num_key_value_heads": config.num_key_value_heads,
        "head_dim": config.head_dim,
        "tensor_parallel_shards": 1,
        "pipeline_parallel_stages": 1,
        "max_batch_size": config.max_batch_size,
        "disaggregation": False,
    }
    return {**mlc, **{k: v for k, v in ours.items() if k not in mlc}}


def mlc_chat_config(config: ModelConfig, quant: Quantization, model_dir: Path | None = None,
                    tokenizer_files: list[str] | None = None) -> dict[str, Any]:
    """mlc-chat-config.json for `config` at `quant`. `tokenizer_files`: the tokenizer files beside
    it (`model_dir`, where tokenizer.json is read for `tokenizer_info`); none by default.
    mlcpipe's own runtime reads `model_config`, `vocab_size`, `context_window_size`,
    `prefill_chunk_size`, `page_size` (and the rest of its keys at the end)."""
    files = list(tokenizer_files or [])
    conv = config.conv_template or parse_conv_template(DEFAULT_CONV_TEMPLATE, config.source, config.vocab_size)
    return {
        "version": MLC_CHAT_CONFIG_VERSION,
        "model_type": MLC_MODEL_TYPES[config.architecture],
        "quantization": quant.name,
        "model_config": mlc_model_config(config),
        "vocab_size": config.vocab_size,
        "context_window_size": config.context_window_size,
        "sliding_window_size": -1,
        "prefill_chunk_size": config.prefill_chunk_size,
        "attention_sink_size": -1,
        "tensor_parallel_shards": 1,
        "pipeline_parallel_stages": 1,
        "temperature": config.temperature,
        "presence_penalty": config.presence_penalty,
        "frequency_penalty": config.frequency_penalty,
        "repetition_penalty": config.repetition_penalty,
        "top_p": config.top_p,
        "tokenizer_files": files,
        "tokenizer_info": detect_tokenizer_info(model_dir if "tokenizer.json" in files else None),
        "conv_template": conv.as_dict(),
        "pad_token_id": config.pad_token_id,
        "bos_token_id": config.bos_token_id,
        "eos_token_id": list(config.eos_token_id) if isinstance(config.eos_token_id, tuple) else config.eos_token_id,
        # mlcpipe's runtime
        "model": config.name,
        "model_dtype": quant.model_dtype,
        "hidden_size": config.hidden_size,
        "page_size": config.page_size,
    }


def copy_tokenizer_files(source: Path, dest: Path) -> list[str]:
    """Copy the tokenizer files of a checkpoint directory (MLC-LLM's list); return their names."""
    copied = []
    for name in TOKENIZER_FILES:
        if (Path(source) / name).is_file():
            shutil.copyfile(Path(source) / name, Path(dest) / name)
            copied.append(name)
    return copied


# ---- checking ------------------------------------------------------------------------------------
def _missing(obj: dict, fields: tuple[str, ...], prefix: str = "") -> list[str]:
    return [prefix + f for f in fields if obj.get(f) is None]


def check_chat_config(data: Any, where: str) -> None:
    """Every field MLC-LLM / WebLLM require is present and of the right kind; one line if not."""
    if not isinstance(data, dict):
        raise MLCContractError(f"{where}: expected a JSON object, got {type(data).__name__}")
    missing = _missing(data, REQUIRED_CONFIG_FIELDS)
    model_config = data.get("model_config")
    if isinstance(model_config, dict):
        missing += _missing(model_config, REQUIRED_MODEL_CONFIG_FIELDS, "model_config.")
    conv = data.get("conv_template")
    if isinstance(conv, dict):
        missing += _missing(conv, REQUIRED_CONV_FIELDS, "conv_template.")
    info = data.get("tokenizer_info")
    if isinstance(info, dict):
        missing += _missing(info, REQUIRED_TOKENIZER_INFO_FIELDS, "tokenizer_info.")
    if missing:
        raise MLCContractError(f"{where}: missing field(s) {', '.join(repr(m) for m in missing)} (MLC-LLM / WebLLM require them)")
    for field, kind, what in (
        ("model_config", dict, "an object"),
        ("conv_template", dict, "an object in MLC-LLM's Conversation format (WebLLM takes no template name)"),
        ("tokenizer_files", list, "a list of file names"),
        ("tokenizer_info", dict, "an object"),
    ):
        if not isinstance(data[field], kind):
            raise MLCContractError(f"{where}: field '{field}': got {data[field]!r}; expected {what}")
    for field in ("vocab_size", "context_window_size", "prefill_chunk_size"):
        if isinstance(data[field], bool) or not isinstance(data[field], int) or data[field] <= 0:
            raise MLCContractError(f"{where}: field '{field}': got {data[field]!r}; expected a positive integer")
    if data["model_config"].get("vocab_size") != data["vocab_size"]:
        raise MLCContractError(f"{where}: field 'model_config.vocab_size': got {data['model_config'].get('vocab_size')!r}; "
                               f"must equal vocab_size ({data['vocab_size']})")


def check_model_dir(weights_dir: str | Path) -> dict[str, Any]:
    """A directory MLC-LLM / WebLLM load as the model: mlc-chat-config.json with every required
    field, the tokenizer files it lists, tensor-cache.json and every shard it names. Returns the
    parsed config; raises MLCContractError (one line naming what is missing) otherwise."""
    root = Path(weights_dir)
    if not root.is_dir():
        raise MLCContractError(f"{root}: not a directory")
    config_path = root / RUNTIME_CONFIG
    if not config_path.is_file():
        raise MLCContractError(f"{root}: {RUNTIME_CONFIG} missing (MLC-LLM / WebLLM read it first); run `mlcpipe convert-weights`")
    try:
        data = json.loads(config_path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise MLCContractError(f"{config_path}: not valid JSON: {exc}") from None
    check_chat_config(data, str(config_path))
    absent = [name for name in data["tokenizer_files"]
              if not confined(root, name, f"{config_path}: field 'tokenizer_files'").is_file()]
    if absent:
        raise MLCContractError(f"{root}: tokenizer file(s) {', '.join(map(repr, absent))} listed in 'tokenizer_files' are missing")
    cache_path = root / TENSOR_CACHE
    if not cache_path.is_file():
        raise MLCContractError(f"{root}: {TENSOR_CACHE} missing (the weights MLC-LLM / WebLLM load); run `mlcpipe convert-weights`")

    try:
        shards = [record["dataPath"] for record in read_tensor_cache(root)[1]]
    except ArtifactError as exc:
        raise MLCContractError(str(exc)) from None
    absent = [shard for shard in shards if not (root / shard).is_file()]
    if absent:
        raise MLCContractError(f"{root}: weight shard(s) {', '.join(map(repr, absent[:3]))}{' ...' if len(absent) > 3 else ''} "
                               f"named in {TENSOR_CACHE} are missing")
    return data


def check_pair(artifact: Path, model_dir: Path, chat_config: dict[str, Any]) -> int:
    """The model directory is one the artifact's library can run: the same quantization and every
    parameter the library takes, with its shape and dtype. Returns the parameter count; raises
    ArtifactError (one line) otherwise."""
    from .tensor_cache import check_parameters

    manifest = read_manifest(Path(artifact), ("quantization", "parameters"))
    if chat_config["quantization"] != manifest["quantization"]:
        raise MLCContractError(f"--model-dir {model_dir}: quantization {chat_config['quantization']!r} ({RUNTIME_CONFIG}), "
                               f"but {artifact} is built for {manifest['quantization']!r}")
    check_parameters(Path(model_dir), manifest["parameters"], "--model-dir")
    return len(manifest["parameters"])


def check_library(artifact: str | Path) -> dict[str, Any]:
    """The artifact's library defines every function MLC-LLM / WebLLM call, read from the library
    itself (its Relax VM executable, never loaded), and matches its manifest (library.py: container,
    `_metadata`). Returns the manifest; raises MLCContractError (one line) otherwise."""
    from .library import check_library_file

    manifest = read_manifest(Path(artifact))
    library = manifest.get("library")
    if not library or not confined(Path(artifact), library, f"{Path(artifact) / MANIFEST}: field 'library'").is_file():
        raise MLCContractError(f"{artifact}: library file {short_repr(library)} missing")
    path = verified(Path(artifact), manifest, library, "library")
    functions = check_library_file(path, manifest).functions
    missing = [name for name in REQUIRED_FUNCTIONS if name not in functions]
    if missing:
        raise MLCContractError(f"{path}: library lacks function(s) {', '.join(map(repr, missing))} "
                               f"that MLC-LLM / WebLLM call (has: {', '.join(sorted(functions))})")
    return manifest

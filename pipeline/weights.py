"""Weights: Hugging Face safetensors directory (or seeded synthetic weights) -> quantized
shards + `tensor-cache.json` in MLC-LLM's format."""

from __future__ import annotations

import contextlib
import io
import json
import struct
from collections.abc import Callable
from pathlib import Path

import ml_dtypes
import numpy as np

from .artifact import RUNTIME_CONFIG, WEIGHTS_WRITER, ArtifactError, atomic_directory, check_not_inside, write_json
from .config import ConfigError, ModelConfig, check_quantization
from .mlc_contract import TENSOR_CACHE, copy_tokenizer_files, mlc_chat_config
from .model import MODELS
from .quantization import QUANTIZATIONS

_SAFETENSORS_DTYPES = {
    "F64": np.float64, "F32": np.float32, "F16": np.float16, "BF16": ml_dtypes.bfloat16,
    "I64": np.int64, "I32": np.int32, "I16": np.int16, "I8": np.int8, "U8": np.uint8,
}
# HF config.json key -> ModelConfig attribute that must agree.
_HF_FIELDS = {
    "hidden_size": "hidden_size",
    "intermediate_size": "intermediate_size",
    "num_hidden_layers": "num_hidden_layers",
    "num_attention_heads": "num_attention_heads",
    "num_key_value_heads": "num_key_value_heads",
    "head_dim": "head_dim",
    "vocab_size": "vocab_size",
    "tie_word_embeddings": "tie_word_embeddings",
    "rope_theta": "rope_theta",
    "rms_norm_eps": "rms_norm_eps",
}


class SafetensorsDir:
    """Every tensor of a directory of *.safetensors files (sharded or not), read lazily."""

    def __init__(self, path: Path):
        self.path = Path(path)
        files = sorted(self.path.glob("*.safetensors"))
        if not files:
            raise ArtifactError(f"{self.path}: no *.safetensors files")
        self.index: dict[str, tuple[Path, dict, int]] = {}
        for file in files:
            with open(file, "rb") as fh:
                (header_len,) = struct.unpack("<Q", fh.read(8))
                try:
                    header = json.loads(fh.read(header_len))
                except json.JSONDecodeError as exc:
                    raise ArtifactError(f"{file}: corrupt safetensors header: {exc}") from None
            for name, info in header.items():
                if name != "__metadata__":
                    self.index[name] = (file, info, 8 + header_len)

    def __contains__(self, name: str) -> bool:
        return name in self.index

    def get(self, name: str) -> np.ndarray:
        file, info, base = self.index[name]
        dtype = _SAFETENSORS_DTYPES.get(info["dtype"])
        if dtype is None:
            raise ArtifactError(f"{file}: tensor '{name}' has dtype {info['dtype']}; allowed: {sorted(_SAFETENSORS_DTYPES)}")
        start, end = info["data_offsets"]
        array = np.memmap(file, dtype=np.uint8, mode="r", offset=base + start, shape=(end - start,))
        return np.frombuffer(array, dtype=dtype).reshape(info["shape"])


def check_hf_config(config: ModelConfig, hf_dir: Path) -> None:
    path = Path(hf_dir) / "config.json"
    if not path.is_file():
        raise ArtifactError(f"{hf_dir}: config.json missing (expected a Hugging Face checkpoint directory)")
    hf = json.loads(path.read_text())
    hf.setdefault("head_dim", hf.get("hidden_size", 0) // max(hf.get("num_attention_heads", 1), 1))
    hf.setdefault("tie_word_embeddings", False)
    for key, attr in _HF_FIELDS.items():
        if key not in hf:
            continue
        ours = getattr(config, attr)
        theirs = hf[key]
        same = abs(float(theirs) - float(ours)) <= 1e-9 * max(1.0, abs(float(ours))) if isinstance(ours, float) else theirs == ours
        if not same:
            raise ConfigError(f"{path}: field '{key}': got {theirs!r}, but {config.source} says {ours!r}")


def synthetic_source(config: ModelConfig, seed: int = 0) -> Callable[[str, tuple[int, ...]], np.ndarray]:
    """Seeded random float32 weights (per-tensor seed from its name, so order does not matter)."""

    def get(name: str, shape: tuple[int, ...]) -> np.ndarray:
        rng = np.random.default_rng([seed, *name.encode()])
        if len(shape) == 1:  # norm weights around 1
            return (1.0 + 0.1 * rng.standard_normal(shape)).astype(np.float32)
        return (rng.standard_normal(shape, dtype=np.float32) * np.float32(0.02))

    return get


def logical_weights(config: ModelConfig, source: str | Path, seed: int = 0):
    """Yield (logical name, float32 array) for every logical parameter of the model."""
    sources = MODELS[config.architecture]["hf_sources"](config)
    if str(source) == "synthetic":
        get = synthetic_source(config, seed)
        for ws in sources:
            parts = [get(hf_name, shape) for hf_name, shape in zip(ws.hf_names, ws.hf_shapes)]
            yield ws.name, parts[0] if len(parts) == 1 else np.concatenate(parts, axis=0)
        return
    check_hf_config(config, Path(source))
    tensors = SafetensorsDir(Path(source))
    for ws in sources:
        parts = []
        for hf_name, shape in zip(ws.hf_names, ws.hf_shapes):
            if hf_name not in tensors:
                raise ArtifactError(f"{source}: tensor '{hf_name}' is missing (needed for {ws.name})")
            array = tensors.get(hf_name)
            if tuple(array.shape) != tuple(shape):
                raise ArtifactError(
                    f"{source}: tensor '{hf_name}' has shape {list(array.shape)}, expected {list(shape)}"
                )
            if not np.issubdtype(np.dtype(array.dtype), np.floating) and array.dtype != ml_dtypes.bfloat16:
                raise ArtifactError(
                    f"{source}: tensor '{hf_name}' has dtype {array.dtype}; expected a float dtype (F32, F16, BF16)"
                )
            parts.append(np.asarray(array, dtype=np.float32))
        yield ws.name, parts[0] if len(parts) == 1 else np.concatenate(parts, axis=0)


def expected_parameters(config: ModelConfig, quant: str) -> list[tuple[str, tuple[int, ...], str]]:
    """(name, shape, dtype) of every stored parameter, in the order the compiled model takes them."""
    from tvm.target import Target

    from .build import create_model

    model = create_model(config, quant, Target({"kind": "llvm"}))
    return [(name, tuple(int(s) for s in p.shape), p.dtype) for name, p in model.named_parameters()]


def convert_weights(
    config: ModelConfig, quant: str, source: str | Path, output: Path, seed: int = 0, log=print
) -> Path:
    """Quantize `source` ("synthetic" or a HF dir) into `output`: a model directory MLC-LLM and
    WebLLM load (shards + tensor-cache.json + mlc-chat-config.json + the checkpoint's tokenizer
    files, listed in the config's `tokenizer_files`; none for synthetic weights). `output` must be
    new, empty or an mlcpipe weights directory, and neither be nor contain nor lie inside `source`;
    it is locked while converting and replaced in one step."""
    from tvm.contrib import tvmjs

    check_quantization(config, quant)
    if str(source) != "synthetic" and not Path(source).is_dir():
        raise ArtifactError(f"--source {source}: not a directory (expected a Hugging Face checkpoint or 'synthetic')")
    if str(source) != "synthetic":
        check_not_inside(output, Path(source))
    scheme = QUANTIZATIONS[quant]
    with atomic_directory(Path(output), kind="weights") as tmp:
        expected = expected_parameters(config, quant)
        stored: dict[str, np.ndarray] = {}
        total_params = 0
        for name, weight in logical_weights(config, source, seed):
            total_params += weight.size
            stored.update(scheme.quantize_param(name, weight))
        for name, shape, dtype in expected:
            if name not in stored:
                raise ArtifactError(f"{source}: no tensor produced for parameter '{name}'")
            if tuple(stored[name].shape) != shape or str(stored[name].dtype) != dtype:
                raise ArtifactError(
                    f"{source}: parameter '{name}' is {list(stored[name].shape)} {stored[name].dtype}, "
                    f"the model expects {list(shape)} {dtype}"
                )
        ordered = {name: stored[name] for name, _, _ in expected}
        total_bytes = sum(a.nbytes for a in ordered.values())
        with contextlib.redirect_stdout(io.StringIO()):
            tvmjs.dump_tensor_cache(
                ordered,
                str(tmp),
                encode_format="raw",
                meta_data={
                    "ParamSize": len(ordered),
                    "ParamBytes": total_bytes,
                    "BitsPerParam": total_bytes * 8.0 / max(total_params, 1),
                    "writer": WEIGHTS_WRITER,  # the ownership marker (artifact.owner_kind)
                    "model": config.name,
                    "quantization": quant,
                    "source": "synthetic" if str(source) == "synthetic" else str(Path(source).resolve()),
                    "seed": seed if str(source) == "synthetic" else None,
                },
                show_progress=False,
            )
        copied = copy_tokenizer_files(Path(source), tmp) if str(source) != "synthetic" else []
        write_json(tmp / RUNTIME_CONFIG, mlc_chat_config(config, quant, tmp, copied))
    log(f"[mlcpipe] wrote {len(ordered)} tensors ({total_bytes / 2**20:.1f} MiB) to {output}")
    return Path(output)


def load_stored_weights(weights_dir: Path) -> dict[str, np.ndarray]:
    """Read a tensor cache back into NumPy (used by tests and the reference model)."""
    path = Path(weights_dir) / TENSOR_CACHE
    if not path.is_file():
        raise ArtifactError(f"{weights_dir}: {TENSOR_CACHE} missing; run `mlcpipe convert-weights` first")
    info = json.loads(path.read_text())
    out = {}
    for shard in info["records"]:
        raw = (Path(weights_dir) / shard["dataPath"]).read_bytes()
        for rec in shard["records"]:
            buf = raw[rec["byteOffset"] : rec["byteOffset"] + rec["nbytes"]]
            out[rec["name"]] = np.frombuffer(buf, dtype=rec["dtype"]).reshape(rec["shape"]).copy()
    return out

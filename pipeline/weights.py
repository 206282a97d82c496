"""Weights: Hugging Face safetensors directory (or seeded synthetic weights) -> quantized
shards + `tensor-cache.json` in MLC-LLM's format."""

from __future__ import annotations

import contextlib
import io
import json
import math
import os
import shutil
import struct
from collections.abc import Callable
from pathlib import Path

import ml_dtypes
import numpy as np

from .artifact import RUNTIME_CONFIG, WEIGHTS_WRITER, atomic_directory, check_not_inside, read_json, sha256_file, verify_bytes, write_json
from .config import ModelConfig, short_repr
from .errors import ArtifactError, ConfigError
from .mlc_contract import TENSOR_CACHE, copy_tokenizer_files, detect_tokenizer_info, mlc_chat_config
from .tensor_cache import CACHE_DTYPES, read_tensor_cache, uint
from .model import WEIGHT_MAPS
from .quantization import Quantization
from .tokenizer import Tokenizer

_SAFETENSORS_DTYPES = {
    "F64": np.float64, "F32": np.float32, "F16": np.float16, "BF16": ml_dtypes.bfloat16,
    "I64": np.int64, "I32": np.int32, "I16": np.int16, "I8": np.int8, "U8": np.uint8,
}
# HF config.json key -> ModelConfig attribute that must agree.


# Every dtype of the safetensors format -> bytes per element (the size check needs it for all).
_SAFETENSORS_ITEMSIZE = {
    "BOOL": 1, "U8": 1, "I8": 1, "F8_E5M2": 1, "F8_E4M3": 1, "F8_E8M0": 1,
    "I16": 2, "U16": 2, "F16": 2, "BF16": 2, "I32": 4, "U32": 4, "F32": 4, "I64": 8, "U64": 8, "F64": 8,
}
MAX_SAFETENSORS_HEADER = 100_000_000  # the safetensors library's own limit


SAFETENSORS_INDEX = "model.safetensors.index.json"


class SafetensorsDir:
    """The tensors of a checkpoint directory, read lazily: with `model.safetensors.index.json`, the
    files its `weight_map` names and each tensor from the file it names (other *.safetensors
    files, e.g. a stale shard beside a fresh download, are not read); without one, every
    *.safetensors file, a tensor in two of them an error naming both. Each header is checked
    against its file before any tensor is read: header length within the file, a JSON object,
    known dtypes, data_offsets [start, end] inside the data, disjoint and covering it without
    gaps, each end - start = prod(shape) * itemsize; ArtifactError naming file and tensor."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self.index: dict[str, tuple[Path, dict, int]] = {}
        weight_map = self._weight_map()
        if weight_map is not None:
            headers = {}
            for file_name in sorted(set(weight_map.values())):
                file = self.path / file_name
                if not file.is_file():
                    needing = sorted(n for n, f in weight_map.items() if f == file_name)
                    raise ArtifactError(f"{self.path / SAFETENSORS_INDEX}: shard '{file_name}' is missing "
                                        f"({len(needing)} tensors need it, e.g. '{needing[0]}')")
                headers[file_name] = _read_safetensors_header(file)
            for name, file_name in weight_map.items():
                header, base = headers[file_name]
                if name not in header or name == "__metadata__":
                    raise ArtifactError(f"{self.path / SAFETENSORS_INDEX}: tensor '{name}' is not in '{file_name}', the shard it names")
                self.index[name] = (self.path / file_name, header[name], base)
            return
        files = sorted(self.path.glob("*.safetensors"))
        if not files:
            others = sorted(f.name for pattern in ("*.bin", "*.pt", "*.pth", "*.gguf") for f in self.path.glob(pattern))
            found = (f" (found {', '.join(others[:3])}{', ...' if len(others) > 3 else ''}: PyTorch pickles and GGUF are not read; "
                     "save the checkpoint as safetensors, e.g. transformers' save_pretrained(dir, safe_serialization=True))") if others else ""
            raise ArtifactError(f"{self.path}: no *.safetensors files{found}")
        for file in files:
            header, base = _read_safetensors_header(file)
            for name, info in header.items():
                if name == "__metadata__":
                    continue
                if name in self.index:
                    raise ArtifactError(f"{self.path}: tensor '{name}' is in both '{self.index[name][0].name}' and '{file.name}' "
                                        f"(no {SAFETENSORS_INDEX} says which to use)")
                self.index[name] = (file, info, base)

    def _weight_map(self) -> dict[str, str] | None:
        """The index's tensor -> file map (validated), or None without an index."""
        path = self.path / SAFETENSORS_INDEX
        if not path.is_file():
            return None
        try:
            data = json.loads(path.read_text())
        except (OSError, UnicodeDecodeError, ValueError) as exc:
            raise ArtifactError(f"{path}: not valid JSON ({exc})") from None
        weight_map = data.get("weight_map") if isinstance(data, dict) else None
        if not isinstance(weight_map, dict) or not weight_map:
            raise ArtifactError(f"{path}: field 'weight_map': got {weight_map!r}; expected a mapping of tensor names to shard files")
        for name, file_name in weight_map.items():
            if not isinstance(file_name, str) or Path(file_name).name != file_name or not file_name.endswith(".safetensors"):
                raise ArtifactError(f"{path}: field 'weight_map.{name}': got {file_name!r}; expected a *.safetensors file name in this directory")
        return weight_map

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


def _read_safetensors_header(file: Path) -> tuple[dict, int]:
    """(header, offset of the data) of one safetensors file, validated (see SafetensorsDir)."""
    size = file.stat().st_size
    if size < 8:
        raise ArtifactError(f"{file}: truncated safetensors file ({size} bytes; it starts with an 8-byte header length)")
    with open(file, "rb") as fh:
        (header_len,) = struct.unpack("<Q", fh.read(8))
        if header_len > size - 8 or header_len > MAX_SAFETENSORS_HEADER:
            raise ArtifactError(f"{file}: corrupt safetensors header: length {header_len} bytes, but the file has "
                                f"{size - 8} bytes after it (allowed: at most {min(size - 8, MAX_SAFETENSORS_HEADER)})")
        raw = fh.read(header_len)
    try:
        header = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        what = exc.msg if isinstance(exc, json.JSONDecodeError) else "not UTF-8 JSON"
        raise ArtifactError(f"{file}: corrupt safetensors header: {what}") from None
    if not isinstance(header, dict):
        raise ArtifactError(f"{file}: corrupt safetensors header: expected a JSON object, got {type(header).__name__}")
    data_size = size - 8 - header_len
    spans = []
    for name, info in header.items():
        if name == "__metadata__":
            continue
        where = f"{file}: tensor {short_repr(name)}"
        if not isinstance(info, dict):
            raise ArtifactError(f"{where}: got {short_repr(info)}; expected an object with dtype, shape, data_offsets")
        dtype, shape, offsets = info.get("dtype"), info.get("shape"), info.get("data_offsets")
        if dtype not in _SAFETENSORS_ITEMSIZE:
            raise ArtifactError(f"{where}: dtype {short_repr(dtype)}; allowed: {sorted(_SAFETENSORS_ITEMSIZE)}")
        if not isinstance(shape, list) or not all(uint(d) for d in shape):
            raise ArtifactError(f"{where}: shape {short_repr(shape)}; expected a list of integers >= 0")
        if not (isinstance(offsets, list) and len(offsets) == 2 and all(uint(o) for o in offsets)):
            raise ArtifactError(f"{where}: data_offsets {short_repr(offsets)}; expected [start, end], integers >= 0")
        start, end = offsets
        if not start <= end <= data_size:
            raise ArtifactError(f"{where}: data_offsets [{start}, {end}] outside the {data_size} data bytes "
                                "(allowed: start <= end <= data size)")
        want = math.prod(shape) * _SAFETENSORS_ITEMSIZE[dtype]
        if end - start != want:
            raise ArtifactError(f"{where}: data_offsets [{start}, {end}] hold {end - start} bytes; shape {shape} {dtype} "
                                f"needs {want}")
        spans.append((start, end, name))
    spans.sort()
    for (_, end_a, name_a), (start, end, name) in zip(spans, spans[1:]):
        if start < end_a:
            raise ArtifactError(f"{file}: tensor {short_repr(name)}: data_offsets [{start}, {end}] overlaps tensor "
                                f"{short_repr(name_a)}, which ends at {end_a} (allowed: disjoint byte ranges)")
    position = 0
    for start, end, name in spans:
        if start != position:
            raise ArtifactError(f"{file}: tensor {short_repr(name)}: data_offsets [{start}, {end}] leave a gap of "
                                f"{start - position} bytes (tensors must be contiguous from byte 0)")
        position = end
    if position != data_size:
        raise ArtifactError(f"{file}: corrupt safetensors file: tensors end at data byte {position}, the file has {data_size}")
    return header, 8 + header_len


def check_hf_config(config: ModelConfig, hf_dir: Path) -> None:
    """The checkpoint's config.json describes the model of `config`: every field mlcpipe reads
    from it (hf_config.model_fields, 4.x or 5.x form) equals the YAML's; one line otherwise."""
    from .hf_config import model_fields

    path = Path(hf_dir) / "config.json"
    if not path.is_file():
        raise ArtifactError(f"{hf_dir}: config.json missing (expected a Hugging Face checkpoint directory)")
    theirs_all = model_fields(read_json(path, "Hugging Face config"), str(path))
    ours_all = config.as_dict()
    for key, theirs in theirs_all.items():
        ours = ours_all.get(key)
        if isinstance(ours, float) and isinstance(theirs, int | float):
            same = abs(float(theirs) - ours) <= 1e-9 * max(1.0, abs(ours))
        else:
            same = theirs == ours
        if not same:
            raise ConfigError(f"{path}: field '{key}': got {short_repr(theirs)}, but {config.source} says {ours!r}")


def synthetic_source(config: ModelConfig, seed: int = 0) -> Callable[[str, tuple[int, ...]], np.ndarray]:
    """Seeded random float32 checkpoint tensors (per-tensor seed from its name, so order does not
    matter): matrices N(0, 0.02), biases N(0, 0.1), norm weights whose effective scale is about 1
    (around 1, or around 0 where the architecture adds 1: Gemma)."""
    offsets = {n: ws.offset for ws in WEIGHT_MAPS[config.architecture](config) for n in ws.hf_names}

    def get(name: str, shape: tuple[int, ...]) -> np.ndarray:
        rng = np.random.default_rng([seed, *name.encode()])
        if len(shape) == 1:
            center = 0.0 if name.endswith(".bias") else 1.0 - offsets.get(name, 0.0)
            return (center + 0.1 * rng.standard_normal(shape)).astype(np.float32)
        return (rng.standard_normal(shape, dtype=np.float32) * np.float32(0.02))

    return get


def _check_values(where: str, values: np.ndarray, limit: tuple[float, str] | None) -> None:
    """A checkpoint tensor holds finite numbers within `limit` ((max |value|, why)); ArtifactError
    naming the tensor, the count of NaN / Inf and the largest |value| otherwise."""
    finite = np.isfinite(values)
    if not finite.all():
        nan = int(np.isnan(values).sum())
        inf = values.size - int(finite.sum()) - nan
        raise ArtifactError(f"{where}: {nan} NaN and {inf} Inf values of {values.size}; a checkpoint must hold finite numbers")
    if limit is not None and values.size:
        peak = float(np.abs(values).max())
        if peak > limit[0]:
            count = int((np.abs(values) > limit[0]).sum())
            raise ArtifactError(f"{where}: max |value| {peak:.6g} ({count} values above {limit[0]:g}); {limit[1]}")


def value_limit(quant: Quantization) -> tuple[float, str] | None:
    """(largest |weight| the quantization stores, why) for a checkpoint converted to `quant`:
    float16 holds |x| <= 65504; a q4f16_1 group stores max|w| / 7 as a float16 scale and
    dequantizes (q - 7) * scale in float16, so its weights must stay within 65504 too."""
    dtype = quant.model_dtype
    if dtype in ("float16", "bfloat16"):
        finfo = ml_dtypes.finfo(dtype) if dtype == "bfloat16" else np.finfo(dtype)
        return float(finfo.max), f"{quant.name} stores {dtype} (allowed: |value| <= {float(finfo.max):g}); rescale the checkpoint or use a f32 quantization"
    return None


# checkpoint tensors that are buffers, not parameters (older transformers saved RoPE's inverse frequencies)
IGNORED_TENSOR_SUFFIXES = (".rotary_emb.inv_freq",)


def logical_weights(config: ModelConfig, source: str | Path, seed: int = 0, limit: tuple[float, str] | None = None,
                    allow_unused: bool = False, log=None):
    """Yield (logical name, float32 array) for every logical parameter of the model; checkpoint
    tensors must be finite and, with `limit` (see `value_limit`), within it. A checkpoint tensor
    the model does not use (an extra layer, another model's head) is an error naming it before
    any tensor is read; `allow_unused` lists them through `log` instead."""
    sources = WEIGHT_MAPS[config.architecture](config)
    if str(source) == "synthetic":
        get = synthetic_source(config, seed)
        for ws in sources:
            yield ws.name, _synthetic_tensor(get, ws)
        return
    check_hf_config(config, Path(source))
    tensors = SafetensorsDir(Path(source))
    used = {hf_name for ws in sources for hf_name in ws.hf_names}
    unused = sorted(n for n in tensors.index if n not in used and not n.endswith(IGNORED_TENSOR_SUFFIXES))
    if unused:
        shown = ", ".join(f"'{n}'" for n in unused[:5]) + (f" and {len(unused) - 5} more" if len(unused) > 5 else "")
        if not allow_unused:
            raise ArtifactError(f"{source}: {len(unused)} tensors the model ({config.name}, {config.num_hidden_layers} layers) does not use: "
                                f"{shown} (a checkpoint of another size or model? --allow-unused converts without them)")
        if log is not None:
            log(f"[mlcpipe] --allow-unused: {len(unused)} checkpoint tensors left out: {', '.join(unused)}")
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
            values = np.asarray(array, dtype=np.float32)
            _check_values(f"{tensors.index[hf_name][0]}: tensor '{hf_name}'", values, limit)
            parts.append(values)
        yield ws.name, _logical(ws, parts)


def synthetic_stored(config: ModelConfig, quant: Quantization, seed: int = 0, workers: int | None = None) -> dict[str, np.ndarray]:
    """The stored tensors of `--weights synthetic` (logical_weights' values, quantized), made by
    `workers` threads (default: the CPUs this process may use; NumPy releases the GIL)."""
    from concurrent.futures import ThreadPoolExecutor

    get = synthetic_source(config, seed)
    if workers is None:
        workers = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    stored: dict[str, np.ndarray] = {}
    with ThreadPoolExecutor(max_workers=workers) as pool:
        for tensors in pool.map(lambda ws: quant.quantize_param(ws.name, _synthetic_tensor(get, ws)),
                                WEIGHT_MAPS[config.architecture](config)):
            stored.update(tensors)
    return stored


def _synthetic_tensor(get, ws) -> np.ndarray:
    """A logical parameter of seeded synthetic weights."""
    return _logical(ws, [get(hf_name, shape) for hf_name, shape in zip(ws.hf_names, ws.hf_shapes)])


def _logical(ws, parts: list[np.ndarray]) -> np.ndarray:
    """The logical parameter of its checkpoint tensors: concatenated, plus the source's offset."""
    value = parts[0] if len(parts) == 1 else np.concatenate(parts, axis=0)
    return value + np.float32(ws.offset) if ws.offset else value


def expected_parameters(config: ModelConfig, quant: Quantization) -> list[tuple[str, tuple[int, ...], str]]:
    """(name, shape, dtype) of every stored parameter, in the order the compiled model takes them."""
    from tvm.target import Target

    from .model.create import create_model

    model = create_model(config, quant, Target({"kind": "llvm"}))
    return [(name, tuple(int(s) for s in p.shape), p.dtype) for name, p in model.named_parameters()]


def check_free_space(directory: Path, nbytes: int, what: str) -> None:
    """ArtifactError (one line) before any work when `directory`'s file system has less room than
    `nbytes` (+ 5% and 64 MiB for the metadata, the tokenizer and the file system)."""
    free = shutil.disk_usage(directory).free
    need = int(nbytes * 1.05) + (64 << 20)
    if free < need:
        raise ArtifactError(f"{directory.parent}: {free / 2**30:.2f} GiB free; about {need / 2**30:.2f} GiB needed for {what}")


def convert_weights(
    config: ModelConfig, quant: Quantization, source: str | Path, output: Path, seed: int = 0, log=print, allow_unused: bool = False,
    final: Path | None = None,
) -> Path:
    """Quantize `source` ("synthetic" or a HF dir) into `output`: a model directory MLC-LLM and
    WebLLM load (shards + tensor-cache.json + mlc-chat-config.json + the checkpoint's tokenizer
    files, listed in the config's `tokenizer_files`; none for synthetic weights). `output` must be
    new, empty or an mlcpipe weights directory, and neither be nor contain nor lie inside `source`;
    it is locked while converting and replaced in one step. Checkpoint tensors the model does not
    use are an error unless `allow_unused` (logical_weights). `final`: where `output` will end up
    (a build's temp dir is renamed), for the log line."""
    from tvm.contrib import tvmjs

    if str(source) != "synthetic" and not Path(source).is_dir():
        raise ArtifactError(f"--source {source}: not a directory (expected a Hugging Face checkpoint or 'synthetic')")
    if str(source) != "synthetic":
        check_not_inside(output, Path(source))
    if str(source) != "synthetic" and (Path(source) / "tokenizer.json").is_file():  # refused before it is copied
        detect_tokenizer_info(Path(source))
        Tokenizer.check(Path(source) / "tokenizer.json")
    with atomic_directory(Path(output), kind="weights") as tmp:  # owned / locked before any work
        expected = expected_parameters(config, quant)
        check_free_space(tmp, sum(math.prod(shape) * np.dtype(dtype).itemsize for _, shape, dtype in expected), "the converted weights")
        stored: dict[str, np.ndarray] = {}
        total_params = 0
        limit = value_limit(quant)
        for name, weight in logical_weights(config, source, seed, limit=limit, allow_unused=allow_unused, log=log):
            total_params += weight.size
            for stored_name, array in quant.quantize_param(name, weight).items():
                with np.errstate(over="ignore"):  # a q4f16_1 scale's largest dequantized value, (14 - 7) * scale
                    peak = array * array.dtype.type(quant.zero_point) if stored_name.endswith(".q_scale") else array
                if array.dtype.kind == "f" and not np.isfinite(peak).all():  # e.g. a q4f16_1 scale that rounded up
                    raise ArtifactError(f"{source}: parameter '{stored_name}' is not finite in {array.dtype} (max |weight| of "
                                        f"{name}: {float(np.abs(weight).max()):.6g}); {limit[1] if limit else ''}")
                stored[stored_name] = array
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
                    "quantization": quant.name,
                    "source": "synthetic" if str(source) == "synthetic" else str(Path(source).resolve()),
                    "seed": seed if str(source) == "synthetic" else None,
                },
                show_progress=False,
            )
        add_shard_digests(tmp)
        copied = copy_tokenizer_files(Path(source), tmp) if str(source) != "synthetic" else []
        write_json(tmp / RUNTIME_CONFIG, mlc_chat_config(config, quant, tmp, copied))
    log(f"[mlcpipe] wrote {len(ordered)} tensors ({total_bytes / 2**20:.1f} MiB) to {final or output}")
    return Path(output)


def read_shard(weights_dir: Path, cache_path: Path, shard: dict) -> bytes:
    """One shard's bytes, checked against the size and digest its tensor cache records (SHA-256
    when mlcpipe wrote it, else MLC's MD5) before any tensor is taken from it."""
    path = Path(weights_dir) / shard["dataPath"]
    if not path.is_file():
        raise ArtifactError(f"{path}: weight shard missing (named in {cache_path})")
    data = path.read_bytes()
    if len(data) != shard["nbytes"]:
        raise ArtifactError(f"{path}: {len(data)} bytes, {cache_path} records {shard['nbytes']}: the shard is truncated "
                            "or was replaced; re-run `mlcpipe convert-weights`")
    algo = "sha256" if "sha256" in shard else "md5"
    verify_bytes(path, data, shard["sha256" if algo == "sha256" else "md5sum"], str(cache_path), algo)
    return data


def verify_tensor_cache(weights_dir: Path) -> list[dict]:
    """Validate tensor-cache.json and check every shard's digest (for runtimes that read the
    shards themselves); returns the shard records."""
    path, shards = read_tensor_cache(weights_dir)
    for shard in shards:
        read_shard(weights_dir, path, shard)
    return shards


def add_shard_digests(weights_dir: Path) -> None:
    """Record each shard's SHA-256 beside MLC's md5sum in tensor-cache.json (what `run` checks)."""
    path = Path(weights_dir) / TENSOR_CACHE
    cache = json.loads(path.read_text())
    for shard in cache["records"]:
        shard["sha256"] = sha256_file(Path(weights_dir) / shard["dataPath"])
    path.write_text(json.dumps(cache, indent=4))


def load_stored_weights(weights_dir: Path) -> dict[str, np.ndarray]:
    """Read a tensor cache back into NumPy, every shard verified first (`read_shard`)."""
    path, shards = read_tensor_cache(weights_dir)
    out = {}
    for shard in shards:
        raw = read_shard(weights_dir, path, shard)
        for rec in shard["records"]:
            buf = raw[rec["byteOffset"] : rec["byteOffset"] + rec["nbytes"]]
            out[rec["name"]] = np.frombuffer(buf, dtype=CACHE_DTYPES[rec["dtype"]]).reshape(rec["shape"]).copy()
    return out

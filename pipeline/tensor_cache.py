"""MLC's tensor cache (tensor-cache.json + raw shards): its records read and validated field by field."""

from __future__ import annotations

import math
import re
from pathlib import Path

import ml_dtypes
import numpy as np

from .artifact import TENSOR_CACHE, confined, read_json
from .config import short_repr
from .errors import ArtifactError


def uint(value) -> bool:
    """An int >= 0 (not a bool)."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


CACHE_DTYPES = {
    "float16": np.float16, "float32": np.float32, "float64": np.float64, "bfloat16": ml_dtypes.bfloat16,
    "int8": np.int8, "uint8": np.uint8, "int16": np.int16, "uint16": np.uint16, "int32": np.int32, "uint32": np.uint32,
    "int64": np.int64, "uint64": np.uint64,
}
_HEX = {"sha256": 64, "md5sum": 32}


def read_tensor_cache(weights_dir: Path) -> tuple[Path, list[dict]]:
    """(tensor-cache.json, its shard records) with every field validated: each dataPath inside
    `weights_dir`, a SHA-256 (mlcpipe's) or MD5 (MLC's) per shard, records of known dtypes and
    raw format whose bytes lie inside their shard and match their shape; one-line ArtifactError."""
    root = Path(weights_dir)
    path = root / TENSOR_CACHE
    if not path.is_file():
        raise ArtifactError(f"{weights_dir}: {TENSOR_CACHE} missing; run `mlcpipe convert-weights` first")
    cache = read_json(path, "tensor cache")
    if not isinstance(cache, dict) or not isinstance(cache.get("records"), list):
        raise ArtifactError(f"{path}: not a tensor cache (expected an object with a 'records' list)")
    names: set[str] = set()
    for i, shard in enumerate(cache["records"]):
        field = f"{path}: field 'records[{i}]"
        if not isinstance(shard, dict):
            raise ArtifactError(f"{field}': got {short_repr(shard)}; expected a shard object")
        confined(root, shard.get("dataPath"), f"{field}.dataPath'")
        if shard.get("format") != "raw-shard":
            raise ArtifactError(f"{field}.format': got {short_repr(shard.get('format'))}; allowed: 'raw-shard'")
        if not uint(shard.get("nbytes")):
            raise ArtifactError(f"{field}.nbytes': got {short_repr(shard.get('nbytes'))}; expected an integer >= 0")
        digests = [k for k in _HEX if k in shard]
        if not digests:
            raise ArtifactError(f"{field}': no 'sha256' or 'md5sum' recorded for {shard['dataPath']}; re-run `mlcpipe convert-weights`")
        for key in digests:
            if not (isinstance(shard[key], str) and re.fullmatch(f"[0-9a-f]{{{_HEX[key]}}}", shard[key])):
                raise ArtifactError(f"{field}.{key}': got {short_repr(shard[key])}; expected {_HEX[key]} hex digits")
        if not isinstance(shard.get("records"), list):
            raise ArtifactError(f"{field}.records': got {short_repr(shard.get('records'))}; expected a list")
        for j, rec in enumerate(shard["records"]):
            where = f"{field}.records[{j}]"
            if not isinstance(rec, dict) or not isinstance(rec.get("name"), str) or not rec["name"]:
                raise ArtifactError(f"{where}': got {short_repr(rec)}; expected an object with a name")
            if rec["name"] in names:
                raise ArtifactError(f"{where}.name': {short_repr(rec['name'])} appears twice")
            names.add(rec["name"])
            dtype, shape = rec.get("dtype"), rec.get("shape")
            if dtype not in CACHE_DTYPES:
                raise ArtifactError(f"{where}.dtype': got {short_repr(dtype)}; allowed: {sorted(CACHE_DTYPES)}")
            if rec.get("format", "raw") != "raw":
                raise ArtifactError(f"{where}.format': got {short_repr(rec.get('format'))}; allowed: 'raw'")
            if not isinstance(shape, list) or not all(uint(d) for d in shape):
                raise ArtifactError(f"{where}.shape': got {short_repr(shape)}; expected a list of integers >= 0")
            offset, nbytes = rec.get("byteOffset"), rec.get("nbytes")
            want = math.prod(shape) * np.dtype(CACHE_DTYPES[dtype]).itemsize
            if not uint(nbytes) or nbytes != want:
                raise ArtifactError(f"{where}.nbytes': got {short_repr(nbytes)}; shape {shape} {dtype} needs {want}")
            if not uint(offset) or offset + nbytes > shard["nbytes"]:
                raise ArtifactError(f"{where}.byteOffset': got {short_repr(offset)}; the {nbytes} bytes must lie inside "
                                    f"the shard's {shard['nbytes']} bytes")
    return path, cache["records"]


def check_parameters(weights_dir: Path, parameters: list[dict], flag: str = "--weights") -> list[dict]:
    """Every parameter an artifact takes (its manifest's `parameters`) is in the tensor cache of
    `weights_dir` with its shape and dtype, as a runtime binding them needs; ArtifactError (one line
    naming the first that is not) otherwise. Returns the shard records."""
    if not (Path(weights_dir) / TENSOR_CACHE).is_file():
        synthetic = " or pass --weights synthetic" if flag == "--weights" else ""
        raise ArtifactError(f"{flag} {weights_dir}: {TENSOR_CACHE} missing; run `mlcpipe convert-weights`{synthetic}")
    _, shards = read_tensor_cache(weights_dir)
    records = {rec["name"]: rec for shard in shards for rec in shard["records"]}
    for spec in parameters:
        rec = records.get(spec["name"])
        if rec is None:
            raise ArtifactError(f"{flag} {weights_dir}: parameter '{spec['name']}' is missing")
        if list(rec["shape"]) != list(spec["shape"]) or rec["dtype"] != spec["dtype"]:
            raise ArtifactError(f"{flag} {weights_dir}: parameter '{spec['name']}' is {list(rec['shape'])} {rec['dtype']}; "
                                f"the artifact expects {spec['shape']} {spec['dtype']} (built for another model or quantization?)")
    return shards

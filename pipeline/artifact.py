"""Artifact directories: atomic creation (temp dir + rename), file checksums, manifest reading."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path, PurePosixPath
from typing import Any

from .config import short_repr, short_text
from .errors import ArtifactError

MANIFEST = "manifest.json"
RUNTIME_CONFIG = "mlc-chat-config.json"


@contextlib.contextmanager
def atomic_directory(final: Path) -> Iterator[Path]:
    """Yield a temp dir beside `final`; on success it replaces `final`, on error it vanishes."""
    final = Path(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.tmp-", dir=final.parent))
    try:
        yield tmp
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    old = None
    if final.exists():
        old = final.parent / f".{final.name}.old-{tmp.name[-8:]}"
        final.rename(old)
    tmp.chmod(0o755)  # mkdtemp makes it 0700
    tmp.rename(final)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def write_json(path: Path, data: Any) -> None:
    path.write_text(json.dumps(data, indent=2, sort_keys=False) + "\n")


MAX_JSON_BYTES = 256 << 20  # a manifest, tensor cache or profile is far smaller; refuse to parse more


def read_json(path: Path, what: str) -> Any:
    """A JSON file (at most MAX_JSON_BYTES, UTF-8), or ArtifactError in one line naming it."""
    path = Path(path)
    try:
        size = path.stat().st_size
        if size > MAX_JSON_BYTES:
            raise ArtifactError(f"{path}: {size} bytes; a {what} may have at most {MAX_JSON_BYTES} bytes")
        text = path.read_bytes().decode("utf-8")
        return json.loads(text)
    except (OSError, UnicodeDecodeError) as exc:
        raise ArtifactError(f"{path}: unreadable {what}: {_reason(exc)}") from None
    except json.JSONDecodeError as exc:
        raise ArtifactError(f"{path}: corrupt {what}: {exc.msg} (line {exc.lineno}, column {exc.colno})") from None
    except RecursionError:
        raise ArtifactError(f"{path}: corrupt {what}: nested too deeply") from None


def _reason(exc: Exception) -> str:
    if isinstance(exc, UnicodeDecodeError):
        return f"not UTF-8 text (byte {exc.start})"
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    return short_text(exc, 120)


# Manifest fields `run`, `check` and `profile` read: field -> (check, what is allowed).
_HEX64 = re.compile(r"[0-9a-f]{64}")
_MANIFEST_FIELDS = {
    "model": (lambda v: isinstance(v, str) and bool(v), "a model name"),
    "quantization": (lambda v: isinstance(v, str) and bool(v), "a quantization name"),
    "target": (lambda v: isinstance(v, dict) and v.get("kind") in ("llvm", "cuda", "metal", "webgpu"),
               "a TVM target object whose kind is llvm, cuda, metal or webgpu"),
    "library": (lambda v: isinstance(v, str) and bool(v), "the library's file name"),
    "parameters": (lambda v: isinstance(v, list) and all(
        isinstance(p, dict) and isinstance(p.get("name"), str) and isinstance(p.get("dtype"), str)
        and isinstance(p.get("shape"), list) and all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in p["shape"])
        for p in v), "a list of {name, shape, dtype}"),
    "kernels": (lambda v: isinstance(v, list) and all(isinstance(k, dict) and isinstance(k.get("name"), str) for k in v),
                "a list of {name, ...}"),
    "files": (lambda v: isinstance(v, dict) and all(
        isinstance(f, dict) and isinstance(f.get("sha256"), str) and _HEX64.fullmatch(f["sha256"])
        and isinstance(f.get("bytes"), int) and f["bytes"] >= 0 for f in v.values()),
        "an object {relative path: {sha256, bytes}}"),
}
RUN_FIELDS = tuple(_MANIFEST_FIELDS)


def read_manifest(artifact: Path, required: tuple[str, ...] = ()) -> dict[str, Any]:
    """The artifact's manifest (a JSON object) with the `required` fields present and well-formed
    (RUN_FIELDS: what `run`, `check` and `profile` read); ArtifactError in one line otherwise."""
    path = Path(artifact) / MANIFEST
    if not path.is_file():
        raise ArtifactError(f"{artifact}: not an mlcpipe artifact ({MANIFEST} missing); run `mlcpipe build` first")
    data = read_json(path, "manifest")
    if not isinstance(data, dict):
        raise ArtifactError(f"{path}: corrupt manifest: expected a JSON object, got {type(data).__name__}")
    for field in required:
        if field not in data:
            raise ArtifactError(f"{path}: field '{field}' is missing (not a manifest of `mlcpipe build`; rebuild the artifact)")
        ok, allowed = _MANIFEST_FIELDS[field]
        if not ok(data[field]):
            raise ArtifactError(f"{path}: field '{field}': got {short_repr(data[field])}; expected {allowed}")
    return data


def confined(root: Path, rel: Any, where: str) -> Path:
    """`root / rel` for a path read from a file (`where` names the entry): refused unless `rel`
    is a relative path that stays inside `root`, symlinks resolved."""
    if not isinstance(rel, str) or not rel or "\x00" in rel:
        raise ArtifactError(f"{where}: got {short_repr(rel)}; expected a file name relative to {root}")
    pure = PurePosixPath(rel)
    root = Path(root)
    if pure.is_absolute() or Path(rel).is_absolute() or ".." in pure.parts:
        raise ArtifactError(f"{where}: got {short_repr(rel)}; a path must stay inside {root} (no absolute paths, no '..')")
    path = root / rel
    real_root = root.resolve()
    real = path.resolve()
    if real != real_root and real_root not in real.parents:
        raise ArtifactError(f"{where}: got {short_repr(rel)}; it resolves to {real}, outside {real_root} (symlink)")
    return path


def _digest_error(path: Path, got: str, want: str, recorded: str, algo: str = "sha256") -> ArtifactError:
    return ArtifactError(f"{path}: {algo} {got[:16]}... does not match {want[:16]}... recorded in {recorded}: "
                         "the file is corrupt or was replaced; rebuild / re-convert it")


def verify_bytes(path: Path, data: bytes, want: str, recorded: str, algo: str = "sha256") -> None:
    """`data` (the file's content, already read) against its recorded digest."""
    got = hashlib.new(algo, data).hexdigest()
    if got != want:
        raise _digest_error(path, got, want, recorded, algo)


def verify_file(path: Path, want: str, nbytes: int | None, recorded: str) -> Path:
    """`path` against its recorded SHA-256 (and size) before it is loaded; ArtifactError in one
    line naming the file, both digests' prefixes and where the expected one is recorded."""
    if not path.is_file():
        raise ArtifactError(f"{path}: missing (listed in {recorded})")
    size = path.stat().st_size
    if nbytes is not None and size != nbytes:
        raise ArtifactError(f"{path}: {size} bytes, {recorded} records {nbytes}: the file is corrupt or was replaced; "
                            "rebuild / re-convert it")
    got = sha256_file(path)
    if got != want:
        raise _digest_error(path, got, want, recorded)
    return path


def verified(artifact: Path, manifest: dict[str, Any], rel: Any, field: str) -> Path:
    """An artifact file named by the manifest (`field` says where), confined to the artifact and
    checked against the SHA-256 its manifest's `files` records."""
    artifact = Path(artifact)
    where = f"{artifact / MANIFEST}: field '{field}'"
    path = confined(artifact, rel, where)
    record = manifest.get("files", {}).get(rel)
    if record is None:
        raise ArtifactError(f"{where}: {short_repr(rel)} has no SHA-256 in field 'files'; rebuild the artifact")
    if not path.is_file():
        raise ArtifactError(f"{artifact}: {'library ' if field == 'library' else ''}{rel} missing; rebuild the artifact")
    return verify_file(path, record["sha256"], record["bytes"], f"{artifact / MANIFEST}")


def verified_library(artifact: Path, manifest: dict[str, Any]) -> Path:
    """The artifact's library, verified (see `verified`) before it is loaded or uploaded."""
    return verified(artifact, manifest, manifest["library"], "library")


def sha256_file(path: Path, chunk: int = 1 << 20) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def file_digests(root: Path, exclude: tuple[str, ...] = (MANIFEST,), skip_dirs: tuple[str, ...] = (),
                 skip_hidden: bool = False) -> dict[str, dict[str, Any]]:
    """{relative path: {"sha256", "bytes"}} of every regular file under `root`, sorted by path
    (`exclude`: relative paths left out, e.g. the manifest that holds this map; `skip_dirs`:
    relative folders left out; `skip_hidden`: leave out names starting with a dot)."""
    root = Path(root)
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        rel_dir = Path(dirpath).relative_to(root)
        dirnames[:] = sorted(d for d in dirnames if (rel_dir / d).as_posix() not in skip_dirs
                             and not (skip_hidden and d.startswith(".")))
        filenames = [f for f in filenames if not (skip_hidden and f.startswith("."))]
        for name in sorted(filenames):
            path = Path(dirpath) / name
            rel = path.relative_to(root).as_posix()
            if rel in exclude or path.is_symlink() or not path.is_file():
                continue
            out[rel] = {"sha256": sha256_file(path), "bytes": path.stat().st_size}
    return dict(sorted(out.items()))


def model_config_of(artifact: str | Path):
    """The model config an artifact was built from (its runtime config keeps all of it)."""
    from .config import parse_model_config

    path = Path(artifact) / RUNTIME_CONFIG
    if not path.is_file():
        raise ArtifactError(f"{artifact}: {RUNTIME_CONFIG} missing; rebuild the artifact")
    return parse_model_config(json.loads(path.read_text())["model_config"], str(path))

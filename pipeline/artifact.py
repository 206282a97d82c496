"""Artifact directories: atomic creation (temp dir + rename), file checksums, manifest reading."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

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


def read_manifest(artifact: Path) -> dict[str, Any]:
    path = Path(artifact) / MANIFEST
    if not path.is_file():
        raise ArtifactError(f"{artifact}: not an mlcpipe artifact ({MANIFEST} missing); run `mlcpipe build` first")
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise ArtifactError(f"{path}: corrupt manifest: {exc}") from None


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

"""Artifact directories: atomic creation (temp dir + rename) and manifest reading."""

from __future__ import annotations

import contextlib
import json
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

MANIFEST = "manifest.json"
RUNTIME_CONFIG = "mlc-chat-config.json"


class ArtifactError(ValueError):
    """A user-facing error about an artifact or weights directory."""


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

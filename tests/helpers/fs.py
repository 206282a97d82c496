"""File-tree helpers shared by the tests that prove nothing was lost."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path


def snapshot(root: Path) -> dict[str, str]:
    """{relative path: sha256 | 'dir' | 'link -> target'} of everything under `root`, dot-names too."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            path = Path(dirpath) / name
            rel = path.relative_to(root).as_posix()
            if path.is_symlink():
                out[rel] = f"link -> {os.readlink(path)}"
            elif path.is_dir():
                out[rel] = "dir"
            else:
                out[rel] = hashlib.sha256(path.read_bytes()).hexdigest()
    return out

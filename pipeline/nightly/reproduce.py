"""Reproducibility: two builds of one cell (in fresh processes) compared file by file.

The manifest is left out (it holds the build's wall-clock seconds); every other file should be
identical (see backends/reproducible.py for what had to be fixed). A file that differs is
explained: tar members, Mach-O UUID / code signature, embedded temp paths, else the first
differing offset.
"""

from __future__ import annotations

import re
import struct
import tarfile
from pathlib import Path

import numpy as np

from ..artifact import MANIFEST, read_manifest

_TEMP_PATH = re.compile(rb"/tmp/[\w.\-/]+|/var/folders/[\w.\-/]+")
_MACHO_MAGIC = b"\xcf\xfa\xed\xfe"


def compare(first: Path, second: Path) -> dict:
    """{"identical": bool, "files": n, "differs": {relative path: why}} of two artifact builds."""
    a, b = read_manifest(first).get("files", {}), read_manifest(second).get("files", {})
    differs = {}
    for rel in sorted(set(a) | set(b)):
        if rel not in a or rel not in b:
            differs[rel] = "only in the " + ("first" if rel in a else "second") + " build"
        elif a[rel]["sha256"] != b[rel]["sha256"]:
            differs[rel] = explain(Path(first) / rel, Path(second) / rel)
    return {"identical": not differs, "files": len(set(a) | set(b)), "excluded": {MANIFEST: "holds build_seconds (wall clock)"},
            "differs": differs}


def explain(a: Path, b: Path) -> str:
    """Why two versions of one file differ, in one line."""
    da, db = a.read_bytes(), b.read_bytes()
    if tarfile.is_tarfile(a) and tarfile.is_tarfile(b):
        return _explain_tar(a, b)
    if da[:4] == db[:4] == _MACHO_MAGIC:
        why = _explain_macho(da, db)
        if why:
            return why
    offsets = _differing_offsets(da, db)
    size = "" if len(da) == len(db) else f"sizes {len(da)} vs {len(db)} bytes; "
    if not offsets:
        return f"{size}one is a prefix of the other"
    paths = {m.group().decode(errors="replace") for data in (da, db) for off in offsets[:50]
             for m in _TEMP_PATH.finditer(data[max(0, off - 128): off + 128])}
    where = f"{size}{len(offsets)} bytes differ, first at offset {offsets[0]:#x}"
    return where + (f"; temp paths embedded near it: {sorted(paths)[:3]}" if paths else "")


def _differing_offsets(da: bytes, db: bytes) -> list[int]:
    n = min(len(da), len(db))
    return np.flatnonzero(np.frombuffer(da, np.uint8, n) != np.frombuffer(db, np.uint8, n)).tolist()


def _explain_tar(a: Path, b: Path) -> str:
    with tarfile.open(a) as ta, tarfile.open(b) as tb:
        ma, mb = {m.name: m for m in ta.getmembers()}, {m.name: m for m in tb.getmembers()}
        content = [n for n in sorted(set(ma) & set(mb)) if ma[n].isfile() and ta.extractfile(n).read() != tb.extractfile(n).read()]
        meta = [n for n in sorted(set(ma) & set(mb)) if (ma[n].mtime, ma[n].uid, ma[n].mode) != (mb[n].mtime, mb[n].uid, mb[n].mode)]
    parts = []
    if set(ma) != set(mb):
        parts.append(f"members differ: {sorted(set(ma) ^ set(mb))[:4]}")
    if content:
        parts.append(f"member contents differ: {content[:4]}")
    if meta:
        parts.append(f"member mtime/owner/mode differ: {meta[:4]}")
    return "tar: " + ("; ".join(parts) or "member order or padding differs")


def _macho_uuid(data: bytes) -> tuple[int, int] | None:
    ncmds = struct.unpack_from("<I", data, 16)[0]
    off = 32
    for _ in range(ncmds):
        cmd, size = struct.unpack_from("<II", data, off)
        if cmd == 0x1B:
            return off + 8, off + 24
        off += size
    return None


def _explain_macho(da: bytes, db: bytes) -> str | None:
    span = _macho_uuid(da)
    if span is None or len(da) != len(db):
        return None
    s, e = span
    if da[s:e] == db[s:e]:
        return None
    rest = [i for i in _differing_offsets(da, db) if not s <= i < e]
    return f"Mach-O LC_UUID differs (the linker's UUID){'' if not rest else f'; plus {len(rest)} other bytes (code signature page hashes cover the UUID)'}"

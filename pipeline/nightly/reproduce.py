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
from ..backends.binfmt import SHT_NOBITS, Elf, MachO, is_elf, is_macho

_TEMP_PATH = re.compile(rb"/tmp/[\w.\-/]+|/var/folders/[\w.\-/]+")


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
    if is_macho(da) and is_macho(db):
        why = _explain_macho(da, db)
        if why:
            return why
    offsets = _differing_offsets(da, db)
    size = "" if len(da) == len(db) else f"sizes {len(da)} vs {len(db)} bytes; "
    if not offsets:
        return f"{size}one is a prefix of the other"
    elf = _elf(da) if is_elf(da) and is_elf(db) else None
    if elf is not None and len(da) != len(db):
        try:
            changed = _elf_changed_functions(elf, Elf(db))
        except (ValueError, IndexError, struct.error):  # not a well-formed ELF64 after all
            changed = []
        if changed:
            size += "code differs in " + ", ".join(changed[:4]) + "; "
    sections = [(s.name or "(null)", s.offset, s.offset + s.size) for s in elf.sections
                if s.type != SHT_NOBITS and s.size] if elf is not None and len(da) == len(db) else None
    if sections:
        counts: dict[str, int] = {}
        for off in offsets:
            name = next((n for n, start, end in sections if start <= off < end), "(no section)")
            counts[name] = counts.get(name, 0) + 1
        size = "ELF: bytes differ in " + ", ".join(f"{n} ({c})" for n, c in sorted(counts.items(), key=lambda kv: -kv[1])) + "; "
        functions = _elf_functions(elf, offsets)
        if functions:
            size += "code differs in " + ", ".join(f"{n} ({c} bytes)" for n, c in sorted(functions.items(), key=lambda kv: -kv[1])[:4]) + "; "
    paths = {m.group().decode(errors="replace") for data in (da, db) for off in offsets[:50]
             for m in _TEMP_PATH.finditer(data[max(0, off - 128): off + 128])}
    where = f"{size}{len(offsets)} bytes differ, first at offset {offsets[0]:#x}"
    return where + (f"; temp paths embedded near it: {sorted(paths)[:3]}" if paths else "")


def _elf(data: bytes) -> Elf | None:
    try:
        return Elf(data)
    except (ValueError, IndexError, struct.error):  # not a well-formed ELF64
        return None


def _elf_changed_functions(a: Elf, b: Elf) -> list[str]:
    """Functions whose code differs between two ELF files (by symbol name), largest change first."""
    ca, cb = a.function_code(), b.function_code()
    changed = [(abs(len(ca[n]) - len(cb[n])), n, len(ca[n]), len(cb[n])) for n in ca if n in cb and ca[n] != cb[n]]
    changed += [(len(ca[n]), n, len(ca[n]), 0) for n in ca if n not in cb] + [(len(cb[n]), n, 0, len(cb[n])) for n in cb if n not in ca]
    return [f"{n} ({a} vs {b} bytes)" for _, n, a, b in sorted(changed, reverse=True)]


def _elf_functions(elf: Elf, offsets: list[int]) -> dict[str, int]:
    """{function symbol: differing bytes} for the `offsets` that fall in a function's code."""
    out: dict[str, int] = {}
    functions = elf.functions()
    for o in offsets:
        vaddr = elf.vaddr(o)
        name = next((f.name for f in functions if vaddr is not None and f.value <= vaddr < f.value + f.size), None)
        if name:
            out[name] = out.get(name, 0) + 1
    return out


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


def _explain_macho(da: bytes, db: bytes) -> str | None:
    span = MachO(da).uuid_span()
    if span is None or len(da) != len(db):
        return None
    s, e = span
    if da[s:e] == db[s:e]:
        return None
    rest = [i for i in _differing_offsets(da, db) if not s <= i < e]
    return f"Mach-O LC_UUID differs (the linker's UUID){'' if not rest else f'; plus {len(rest)} other bytes (code signature page hashes cover the UUID)'}"

"""What a compiled library is, read from its bytes before TVM loads it: the container (ELF, Mach-O,
wasm) and its machine, the Relax VM functions its executable defines and the `_metadata` it
carries (model type, quantization, parameters). `check_library_file` holds them against the
manifest; a library of another target, model or quantization is one line naming what differs."""

from __future__ import annotations

import dataclasses
import json
import struct
from pathlib import Path
from typing import Any

from .errors import ArtifactError

VM_MAGIC = struct.pack("<Q", 0xD225DE2F4214151E)  # TVM's Relax VM executable (kTVMVMBytecodeMagic)
ELF_MACHINES = {62: "x86_64", 183: "aarch64"}
MACHO_CPUS = {0x01000007: "x86_64", 0x0100000C: "arm64"}


@dataclasses.dataclass
class LibraryFacts:
    container: str  # "ELF", "Mach-O", "wasm" or "unknown"
    machine: str | None  # ELF / Mach-O CPU ("x86_64", "aarch64", "arm64"); None for wasm
    functions: list[str]  # the Relax VM functions the executable defines (MLC's `prefill`, `decode`, ...)
    metadata: dict[str, Any]  # the `_metadata` JSON (model_type, quantization, params, ...)


def _container(data: bytes) -> tuple[str, str | None]:
    if data[:4] == b"\x7fELF":
        if len(data) < 64 or data[4] != 2 or data[5] != 1:
            return "ELF (not 64-bit little-endian)", None
        e_type, e_machine = struct.unpack_from("<HH", data, 16)
        if e_type != 3:
            return f"ELF of type {e_type} (not a shared library)", None
        return "ELF", ELF_MACHINES.get(e_machine, f"machine {e_machine}")
    if data[:4] == b"\xcf\xfa\xed\xfe" and len(data) >= 8:
        (cpu,) = struct.unpack_from("<I", data, 4)
        return "Mach-O", MACHO_CPUS.get(cpu, f"cpu {cpu:#x}")
    if data[:4] == b"\x00asm":
        return "wasm", None
    return "unknown", None


def _elf_end(data: bytes) -> int:
    """The byte past the last section / segment an ELF64's headers describe."""
    e_phoff, e_shoff = struct.unpack_from("<QQ", data, 32)
    e_phentsize, e_phnum, e_shentsize, e_shnum = struct.unpack_from("<HHHH", data, 54)
    end = max(e_phoff + e_phentsize * e_phnum, e_shoff + e_shentsize * e_shnum)
    if end > len(data):
        return end
    for i in range(e_phnum):
        p_offset, _, _, p_filesz = struct.unpack_from("<QQQQ", data, e_phoff + i * e_phentsize + 8)
        end = max(end, p_offset + p_filesz)
    for i in range(e_shnum):
        sh_type, = struct.unpack_from("<I", data, e_shoff + i * e_shentsize + 4)
        sh_offset, sh_size = struct.unpack_from("<QQ", data, e_shoff + i * e_shentsize + 24)
        if sh_type != 8:  # SHT_NOBITS occupies no file bytes
            end = max(end, sh_offset + sh_size)
    return end


class _Reader:
    def __init__(self, data: bytes, pos: int):
        self.data, self.pos = data, pos

    def take(self, fmt: str):
        size = struct.calcsize(fmt)
        if self.pos + size > len(self.data):
            raise ValueError("truncated")
        values = struct.unpack_from(fmt, self.data, self.pos)
        self.pos += size
        return values[0] if len(values) == 1 else values

    def string(self, limit: int = 1 << 16) -> str:
        size = self.take("<Q")
        if size > limit or self.pos + size > len(self.data):
            raise ValueError("bad string length")
        value = self.data[self.pos : self.pos + size].decode()
        self.pos += size
        return value


def _executable(data: bytes) -> tuple[list[str], dict[str, Any]]:
    """(VM functions, metadata) of the first Relax VM executable in `data` (TVM's serialization:
    magic, version, then the function table: kind i32, name, 4 x i64, parameter names)."""
    at = data.find(VM_MAGIC)
    if at < 0:
        raise ValueError("no Relax VM executable in it")
    reader = _Reader(data, at + 8)
    reader.string(64)  # the bytecode version
    count = reader.take("<Q")
    if count > 1 << 16:
        raise ValueError("bad function count")
    functions = []
    for _ in range(count):
        kind = reader.take("<i")
        name = reader.string()
        reader.take("<qqqq")
        params = reader.take("<Q")
        if params > 1 << 16:
            raise ValueError("bad parameter count")
        for _ in range(params):
            reader.string()
        if kind != 0:  # 0: a packed function the VM calls; else a function the executable defines
            functions.append(name)
    key = b'{"model_type": '
    start = data.find(key, reader.pos)
    if start < 8:
        raise ValueError("no _metadata constant")
    (size,) = struct.unpack_from("<Q", data, start - 8)
    metadata = json.loads(data[start : start + size].decode())
    if not isinstance(metadata, dict):
        raise ValueError("_metadata is not an object")
    return functions, metadata


def _leb(data: bytes, pos: int, signed: bool = False) -> tuple[int, int]:
    result = shift = 0
    while True:
        if pos >= len(data) or shift > 63:
            raise ValueError("truncated wasm")
        byte = data[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            if signed and byte & 0x40:
                result -= 1 << shift
            return result, pos


def wasm_memory(data: bytes) -> bytes:
    """The initial linear memory of a wasm module: its active data segments placed at their
    (i32.const) offsets; the gaps (emscripten leaves runs of zeros out) are zeros."""
    pos, segments = 8, []
    while pos < len(data):
        section, pos = data[pos], pos + 1
        size, pos = _leb(data, pos)
        end = pos + size
        if section == 11:  # the data section
            count, pos = _leb(data, pos)
            for _ in range(count):
                flags, pos = _leb(data, pos)
                if flags == 1:  # passive: not placed
                    length, pos = _leb(data, pos)
                    pos += length
                    continue
                if flags == 2:
                    _, pos = _leb(data, pos)
                if data[pos] != 0x41:  # i32.const
                    raise ValueError("data segment offset is not a constant")
                offset, pos = _leb(data, pos + 1, signed=True)
                if data[pos] != 0x0B:
                    raise ValueError("bad data segment offset expression")
                length, pos = _leb(data, pos + 1)
                segments.append((offset, data[pos : pos + length]))
                pos += length
        pos = end
    if not segments:
        raise ValueError("no data segments")
    base = min(o for o, _ in segments)
    image = bytearray(max(o + len(b) for o, b in segments) - base)
    for offset, chunk in segments:
        image[offset - base : offset - base + len(chunk)] = chunk
    return bytes(image)


def library_facts(path: str | Path) -> LibraryFacts:
    """Read `path` (never loaded); ArtifactError when it holds no readable TVM VM executable."""
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise ArtifactError(f"{path}: unreadable library: {exc.strerror or exc}") from None
    container, machine = _container(data)
    if container == "ELF":
        end = _elf_end(data)
        if end > len(data):
            raise ArtifactError(f"{path}: truncated ELF library: its headers reach byte {end}, the file has {len(data)}")
    try:
        functions, metadata = _executable(wasm_memory(data) if container == "wasm" else data)
    except (ValueError, UnicodeDecodeError, struct.error) as exc:
        raise ArtifactError(f"{path}: not a TVM model library ({container}, {len(data)} bytes: {exc})") from None
    return LibraryFacts(container, machine, functions, metadata)


def expected_machine(target: dict[str, Any]) -> str | None:
    """The CPU a target's library is built for (its mtriple, or its host's, else this machine's x86_64 / aarch64)."""
    import platform

    host = target.get("host")
    triple = target.get("mtriple") or (host.get("mtriple") if isinstance(host, dict) else None)
    arch = (triple or platform.machine()).split("-")[0]
    return {"arm64": "aarch64", "amd64": "x86_64"}.get(arch, arch)


def check_library_file(path: Path, manifest: dict[str, Any]) -> LibraryFacts:
    """The library against its manifest: the container its target kind builds (and its machine),
    the manifest's functions defined, and `_metadata` of the manifest's quantization and
    parameters. ArtifactError (one line naming the file and what differs) otherwise."""
    from .backends import KINDS, backend

    kind = manifest["target"]["kind"]
    want = backend(kind).LIBRARY_FORMAT if kind in KINDS else None
    try:
        with open(path, "rb") as f:
            container, machine = _container(f.read(64))
    except OSError as exc:
        raise ArtifactError(f"{path}: unreadable library: {exc.strerror or exc}") from None
    if want is not None and container not in (want, "unknown"):
        raise ArtifactError(f"{path}: a {container} file; a {kind} artifact's library is {want} (library of another target?)")
    if container == "ELF":
        expected = expected_machine(manifest["target"])
        if expected in ELF_MACHINES.values() and machine != expected:
            raise ArtifactError(f"{path}: built for {machine}; the manifest's target is {expected}")
    facts = library_facts(path)
    if want is not None and facts.container != want:
        raise ArtifactError(f"{path}: a {facts.container} file; a {kind} artifact's library is {want} (library of another target?)")
    missing = [f for f in manifest.get("functions", []) if f not in facts.functions]
    if missing:
        raise ArtifactError(f"{path}: lacks function(s) {', '.join(map(repr, missing[:5]))} the manifest lists "
                            "(a library of another build?)")
    quant = facts.metadata.get("quantization")
    if quant != manifest["quantization"]:
        raise ArtifactError(f"{path}: built for quantization {quant!r}; the manifest says {manifest['quantization']!r}")
    theirs = [(p.get("name"), list(p.get("shape", [])), p.get("dtype")) for p in facts.metadata.get("params", []) if isinstance(p, dict)]
    ours = [(p["name"], list(p["shape"]), p["dtype"]) for p in manifest.get("parameters", [])]
    if theirs != ours:
        diff = next(((a, b) for a, b in zip(theirs, ours) if a != b), None)
        what = (f"parameter {diff[0][0]!r} {diff[0][1]} {diff[0][2]}, the manifest's {diff[1][0]!r} {diff[1][1]} {diff[1][2]}"
                if diff else f"{len(theirs)} parameters, the manifest {len(ours)}")
        raise ArtifactError(f"{path}: built for another model ({facts.metadata.get('model_type')!r}: {what})")
    return facts

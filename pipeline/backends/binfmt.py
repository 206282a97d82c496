"""Readers of the binary files mlcpipe inspects without loading them (little-endian, 64-bit):
ELF (Linux shared libraries: llvm / cuda lib.so), Mach-O (Metal's objects and dylib) and TVM's
serialized module blob (`__tvm_ffi__library_bin`, `runtime.ModulePackImportsToTensor`).
"""

from __future__ import annotations

import dataclasses
import struct
from collections.abc import Iterator
from pathlib import Path

# ---- ELF64 ------------------------------------------------------------------------------------

ELF_MAGIC = b"\x7fELF"
SHT_PROGBITS, SHT_SYMTAB, SHT_NOBITS, SHT_DYNSYM = 1, 2, 8, 11
STT_FUNC = 2
SHN_LORESERVE = 0xFF00  # section indices from here on are special (ABS, COMMON, ...)


def is_elf(data: bytes) -> bool:
    return data[:4] == ELF_MAGIC


def cstring(data: bytes, at: int) -> str:
    return data[at : data.index(b"\0", at)].decode(errors="replace")


@dataclasses.dataclass(frozen=True)
class Section:
    name: str
    type: int  # SHT_*
    addr: int  # virtual address (0: not loaded)
    offset: int  # in the file
    size: int
    link: int  # the string table of a symbol table


@dataclasses.dataclass(frozen=True)
class Symbol:
    name: str
    type: int  # STT_*
    section: int  # index into Elf.sections; 0: undefined
    value: int  # virtual address
    size: int


class Elf:
    """Sections and symbols of a little-endian ELF64 file."""

    def __init__(self, data: bytes):
        if len(data) < 64 or not is_elf(data) or data[4] != 2 or data[5] != 1:
            raise ValueError("not a 64-bit little-endian ELF file")
        self.data = data
        (shoff,) = struct.unpack_from("<Q", data, 0x28)
        shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3A)
        raw = [struct.unpack_from("<IIQQQQI", data, shoff + i * shentsize) for i in range(shnum)]
        names = raw[shstrndx][4] if raw else 0
        self.sections = [Section(cstring(data, names + n), t, addr, off, size, link)
                         for n, t, _flags, addr, off, size, link in raw]

    def symbols(self, tables: tuple[int, ...] = (SHT_SYMTAB, SHT_DYNSYM)) -> Iterator[Symbol]:
        for table in self.sections:
            if table.type not in tables:
                continue
            strings = self.sections[table.link].offset
            for at in range(table.offset, table.offset + table.size, 24):
                name, info, _other, section, value, size = struct.unpack_from("<IBBHQQ", self.data, at)
                yield Symbol(cstring(self.data, strings + name), info & 0xF, section, value, size)

    def symbol_offset(self, name: str) -> int:
        """File offset of the bytes of the symbol `name` a section defines; KeyError if none does."""
        for sym in self.symbols():
            if sym.name == name and 0 < sym.section < SHN_LORESERVE:
                section = self.sections[sym.section]
                return section.offset + sym.value - section.addr
        raise KeyError(name)

    def functions(self) -> list[Symbol]:
        """The function symbols of the full symbol table (.symtab) that have a size."""
        return [s for s in self.symbols((SHT_SYMTAB,)) if s.type == STT_FUNC and s.size]

    def _loaded(self) -> list[Section]:
        return [s for s in self.sections if s.type == SHT_PROGBITS and s.addr]

    def file_offset(self, vaddr: int) -> int | None:
        return next((s.offset + vaddr - s.addr for s in self._loaded() if s.addr <= vaddr < s.addr + s.size), None)

    def vaddr(self, offset: int) -> int | None:
        return next((s.addr + offset - s.offset for s in self._loaded() if s.offset <= offset < s.offset + s.size), None)

    def function_code(self) -> dict[str, bytes]:
        """{function name: its machine code}."""
        out = {}
        for f in self.functions():
            at = self.file_offset(f.value)
            if at is not None:
                out[f.name] = self.data[at : at + f.size]
        return out

    def function_at(self, offset: int) -> str | None:
        """The function whose code holds the byte at file `offset`."""
        vaddr = self.vaddr(offset)
        if vaddr is None:
            return None
        return next((f.name for f in self.functions() if f.value <= vaddr < f.value + f.size), None)


# ---- Mach-O 64 --------------------------------------------------------------------------------

MH_MAGIC_64 = 0xFEEDFACF
CPU_TYPE_ARM64 = 0x0100000C
MH_OBJECT, MH_DYLIB = 1, 6
LC_SYMTAB, LC_UUID, LC_CODE_SIGNATURE, LC_BUILD_VERSION = 0x2, 0x1B, 0x1D, 0x32


def is_macho(data: bytes) -> bool:
    return len(data) >= 4 and struct.unpack_from("<I", data, 0)[0] == MH_MAGIC_64


class MachO:
    """Header, load commands and symbols of a little-endian 64-bit Mach-O file (`data` may be a
    bytearray the caller edits; offsets stay valid while the layout does)."""

    def __init__(self, data: bytes):
        if len(data) < 32 or not is_macho(data):
            magic = struct.unpack_from("<I", data, 0)[0] if len(data) >= 4 else None
            raise ValueError(f"not a little-endian 64-bit Mach-O file (magic {magic:#x})" if magic is not None
                             else "not a Mach-O file: shorter than its header")
        self.data = data
        magic, cputype, cpusubtype, filetype, ncmds = struct.unpack_from("<IiiII", data, 0)
        self.header = {"magic": magic, "cputype": cputype & 0xFFFFFFFF, "cpusubtype": cpusubtype,
                       "filetype": filetype, "ncmds": ncmds}
        self.commands: list[tuple[int, int, int]] = []  # (cmd, offset, size)
        at = 32
        for _ in range(ncmds):
            cmd, size = struct.unpack_from("<II", data, at)
            self.commands.append((cmd, at, size))
            at += size

    def command(self, cmd: int) -> int | None:
        """Offset of the first load command `cmd`."""
        return next((at for c, at, _ in self.commands if c == cmd), None)

    def uuid_span(self) -> tuple[int, int] | None:
        """(start, end) of the LC_UUID bytes."""
        at = self.command(LC_UUID)
        return None if at is None else (at + 8, at + 24)

    def code_signature(self) -> tuple[int, int] | None:
        """(dataoff, datasize) of the embedded code signature."""
        at = self.command(LC_CODE_SIGNATURE)
        return None if at is None else struct.unpack_from("<II", self.data, at + 8)

    def defined_symbols(self) -> list[str]:
        """Global symbols the file defines, as C names (Mach-O adds one leading underscore)."""
        names: set[str] = set()
        for cmd, at, _ in self.commands:
            if cmd != LC_SYMTAB:
                continue
            symoff, nsyms, stroff, strsize = struct.unpack_from("<IIII", self.data, at + 8)
            for i in range(nsyms):
                n_strx, n_type, _sect, _desc, _value = struct.unpack_from("<IBBHQ", self.data, symoff + 16 * i)
                if n_type & 0xE0:  # N_STAB: a debugging entry
                    continue
                if not n_type & 0x01 or n_type & 0x10:  # not N_EXT, or N_PEXT (private extern)
                    continue
                if n_type & 0x0E == 0:  # N_UNDF: an import, not a definition
                    continue
                end = self.data.index(b"\0", stroff + n_strx, stroff + strsize)
                name = bytes(self.data[stroff + n_strx : end]).decode()
                names.add(name[1:] if name.startswith("_") else name)
        return sorted(names)


# ---- TVM's serialized modules -----------------------------------------------------------------

LIBRARY_BIN = "__tvm_ffi__library_bin"


class BlobReader:
    """Sequential reader of TVM's serialization: u64 counts, strings and bytes as <len:u64><bytes>."""

    def __init__(self, data: bytes, pos: int = 0):
        self.data, self.pos = data, pos

    def u64(self) -> int:
        if self.pos + 8 > len(self.data):
            raise ValueError("truncated TVM blob")
        (value,) = struct.unpack_from("<Q", self.data, self.pos)
        self.pos += 8
        return value

    def bytes(self) -> bytes:
        size = self.u64()
        if self.pos + size > len(self.data):
            raise ValueError("truncated TVM blob")
        value = self.data[self.pos : self.pos + size]
        self.pos += size
        return value

    def str(self) -> str:
        return self.bytes().decode()

    def skip(self, nbytes: int) -> None:
        self.pos += nbytes

    def done(self) -> bool:
        return self.pos >= len(self.data)


def pack_bytes(data: bytes) -> bytes:
    return struct.pack("<Q", len(data)) + data


@dataclasses.dataclass
class ModuleBlob:
    """A packed module blob: <nbytes:u64>, the import tree (<indptr: vec<u64>> <child indices:
    vec<u64>>), then per module <kind> and, unless kind is "_lib", <payload> (both <len:u64> + bytes)."""

    import_tree: bytes
    modules: list[tuple[bytes, bytes | None]]  # (kind, payload); payload None for "_lib"

    @classmethod
    def parse(cls, blob: bytes) -> ModuleBlob:
        reader = BlobReader(blob)
        nbytes = reader.u64()
        if nbytes + 8 != len(blob):
            raise ValueError(f"module blob size mismatch: header {nbytes} + 8 != {len(blob)}")
        start = reader.pos
        n_indptr = reader.u64()
        reader.skip(8 * n_indptr)
        reader.skip(8 * reader.u64())
        tree = blob[start : reader.pos]
        modules = []
        for _ in range(n_indptr - 1):
            kind = reader.bytes()
            modules.append((kind, None if kind == b"_lib" else reader.bytes()))
        if not reader.done():
            raise ValueError(f"module blob has {len(blob) - reader.pos} trailing bytes")
        return cls(tree, modules)

    def payloads(self, kind: bytes) -> list[bytes]:
        return [p for k, p in self.modules if k == kind and p is not None]

    def to_bytes(self) -> bytes:
        body = self.import_tree + b"".join(pack_bytes(k) + (b"" if p is None else pack_bytes(p)) for k, p in self.modules)
        return struct.pack("<Q", len(body)) + body


def library_blob(path: str | Path, symbol: str = LIBRARY_BIN) -> bytes:
    """The packed module blob an ELF shared library embeds under `symbol` (read, not loaded)."""
    data = Path(path).read_bytes()
    try:
        at = Elf(data).symbol_offset(symbol)
    except ValueError as exc:
        raise ValueError(f"{path}: {exc}") from None
    except KeyError:
        raise ValueError(f"{path}: no {symbol} symbol") from None
    (nbytes,) = struct.unpack_from("<Q", data, at)
    return data[at : at + 8 + nbytes]

"""Byte-reproducible outputs: what the toolchains leave varying between two builds, removed.

Found by building the same cell twice (tests/nightly/test_nightly.py) and comparing every file:
  * `export_library("lib.tar")` (TVM runs `tar` on a temp dir) stores each member's mtime: the
    tarball is rewritten with sorted members, mtime = $SOURCE_DATE_EPOCH (default 0), owner 0/0.
  * Debian's ld64.lld-14 writes a different LC_UUID on every link, even of the same objects at the
    same paths, and the ad-hoc code signature hashes the page holding it; its debug map (N_OSO
    stabs) also names each object by its (temp) path. The link runs with `-oso_prefix <temp dir>`,
    and `fix_macho_uuid` then sets the UUID to a hash of the rest of the file and re-hashes the
    signature's pages, so the dylib is a function of its objects alone.
"""

from __future__ import annotations

import hashlib
import io
import os
import struct
import tarfile
from pathlib import Path

from ..errors import ConfigError
from .binfmt import MachO

CSMAGIC_EMBEDDED_SIGNATURE = 0xFADE0CC0
CSMAGIC_CODEDIRECTORY = 0xFADE0C02
CSSLOT_CODEDIRECTORY = 0
CS_HASHTYPE_SHA256 = 2


def source_date_epoch() -> int:
    """$SOURCE_DATE_EPOCH (default 0); a malformed one is an error, as reproducible-builds.org
    asks (it was read as 0: the build looked reproducible under another date than the one set)."""
    text = os.environ.get("SOURCE_DATE_EPOCH", "0")
    if not (text.isascii() and text.isdigit()) or int(text) >= 8**11:  # tar stores mtime in 11 octal digits
        raise ConfigError(f"environment SOURCE_DATE_EPOCH={text!r}: expected seconds since 1970 (an integer >= 0)")
    return int(text)


def normalize_tar(path: str | Path) -> None:
    """Rewrite a tarball with sorted members, a fixed mtime and owner (contents unchanged)."""
    path = Path(path)
    mtime = source_date_epoch()
    with tarfile.open(path, "r:*") as src:
        members = sorted(src.getmembers(), key=lambda m: m.name)
        blobs = {m.name: src.extractfile(m).read() if m.isfile() else None for m in members}
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.GNU_FORMAT) as dst:
        for member in members:
            member.mtime, member.uid, member.gid, member.uname, member.gname = mtime, 0, 0, "", ""
            data = blobs[member.name]
            dst.addfile(member, io.BytesIO(data) if data is not None else None)
    path.write_bytes(out.getvalue())


def fix_macho_uuid(path: str | Path) -> str:
    """Set a Mach-O file's LC_UUID to a hash of its other bytes and re-hash its ad-hoc code
    signature's pages; returns the new UUID (hex). A file without LC_UUID is left as it is."""
    path = Path(path)
    data = bytearray(path.read_bytes())
    macho = MachO(data)
    span, sig = macho.uuid_span(), macho.code_signature()  # sig: (dataoff, datasize)
    if span is None:
        return ""
    uuid_at = span[0]
    code_end = sig[0] if sig else len(data)
    data[uuid_at : uuid_at + 16] = bytes(16)
    uuid = bytearray(hashlib.sha256(bytes(data[:code_end])).digest()[:16])
    uuid[6] = (uuid[6] & 0x0F) | 0x50  # RFC 4122 name-based (SHA) version
    uuid[8] = (uuid[8] & 0x3F) | 0x80  # RFC 4122 variant
    data[uuid_at : uuid_at + 16] = uuid
    if sig:
        _rehash_code_directory(data, sig[0])
    path.write_bytes(bytes(data))
    return uuid.hex()


def _rehash_code_directory(data: bytearray, superblob: int) -> None:
    magic, _, count = struct.unpack_from(">III", data, superblob)
    if magic != CSMAGIC_EMBEDDED_SIGNATURE:
        raise ValueError(f"code signature magic {magic:#x}: not an embedded signature")
    for i in range(count):
        slot, offset = struct.unpack_from(">II", data, superblob + 12 + 8 * i)
        if slot != CSSLOT_CODEDIRECTORY:
            continue
        cd = superblob + offset
        (cd_magic, _, _, _, hash_offset, _, _, n_code_slots, code_limit,
         hash_size, hash_type, _, page_log2) = struct.unpack_from(">IIIIIIIIIBBBB", data, cd)  # fmt: skip
        if cd_magic != CSMAGIC_CODEDIRECTORY or hash_type != CS_HASHTYPE_SHA256 or hash_size != 32:
            raise ValueError("code directory: only SHA-256 ad-hoc signatures (as ld64.lld writes) are supported")
        page = 1 << page_log2
        for n in range(n_code_slots):
            start = n * page
            digest = hashlib.sha256(bytes(data[start : min(start + page, code_limit)])).digest()
            at = cd + hash_offset + n * hash_size
            data[at : at + hash_size] = digest

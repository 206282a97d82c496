"""Runs aarch64 llvm kernels on this machine under qemu-user (`qemu-aarch64 -cpu max`: NEON,
dotprod, i8mm, bf16, fp16), so the Arm rules' code is executed and checked against NumPy here,
not only read in the assembly.

A kernel built for an aarch64 llvm target is exported as its object files and linked statically
with qemu/harness.c (a stand-in for the TVM runtime entry points a kernel object calls: parallel
launch on POSIX threads, workspace, errors) by Debian's aarch64 cross gcc. Needs the Debian
packages qemu-user and gcc-aarch64-linux-gnu (scripts/setup-debian.sh). Emulated: correct, not
timed.
"""

from __future__ import annotations

import shutil
import struct
import subprocess
import tarfile
import tempfile
from pathlib import Path

import numpy as np

QEMU = "qemu-aarch64"
CC = "aarch64-linux-gnu-gcc"
HARNESS = Path(__file__).with_name("qemu") / "harness.c"
# DLPack type codes
_CODES = {"i": 0, "u": 1, "f": 2}


def missing() -> str | None:
    """Why aarch64 kernels cannot run here (a missing tool), or None."""
    for tool, package in ((QEMU, "qemu-user"), (CC, "gcc-aarch64-linux-gnu")):
        if shutil.which(tool) is None:
            return f"{tool} not found (Debian package {package}: scripts/setup-debian.sh)"
    return None


def _include_dirs() -> list[str]:
    import tvm
    import tvm_ffi

    return [str(Path(tvm_ffi.__file__).parent / "include"), str(Path(tvm.__file__).parent / "include")]


def link_aarch64(executable, out: Path) -> Path:
    """Link a kernel built for an aarch64 llvm target (`tvm.compile` of one PrimFunc named
    `main`: its symbol is `__tvm_ffi_main`) with the harness into the static program `out`."""
    with tempfile.TemporaryDirectory(prefix="mlcpipe-qemu-") as tmp:
        archive = Path(tmp) / "kernel.tar"
        executable.export_library(str(archive))
        with tarfile.open(archive) as tar:
            tar.extractall(tmp, filter="data")
        objects = sorted(str(p) for p in Path(tmp).glob("*.o"))
        if not objects:
            raise RuntimeError("the kernel module exported no object files (not an llvm build?)")
        partial = out.with_suffix(".tmp")
        cmd = [CC, "-O1", "-std=c11", "-static", "-pthread", *(f"-I{d}" for d in _include_dirs()), str(HARNESS), *objects, "-lm", "-o", str(partial)]
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode:
            raise RuntimeError(f"{CC} failed linking the kernel:\n{done.stderr.strip()}")
        partial.replace(out)
    return out


def _write(path: Path, arrays: list) -> None:
    with open(path, "wb") as f:
        f.write(struct.pack("<i", len(arrays)))
        for a in arrays:
            if isinstance(a, (int, float, np.integer, np.floating)):  # a scalar parameter
                is_float = isinstance(a, (float, np.floating))
                f.write(struct.pack("<iBBH", -1, _CODES["f" if is_float else "i"], 64, 1))
                f.write(struct.pack("<d" if is_float else "<q", a))
                continue
            a = np.ascontiguousarray(a)
            if a.dtype.kind not in _CODES:
                raise ValueError(f"dtype {a.dtype} cannot be passed to the harness (int, uint or float only)")
            f.write(struct.pack("<iBBH", a.ndim, _CODES[a.dtype.kind], a.dtype.itemsize * 8, 1))
            f.write(struct.pack(f"<{a.ndim}q", *a.shape))
            f.write(a.tobytes())


def _read(path: Path, like: list) -> list:
    data = path.read_bytes()
    (count,), pos = struct.unpack_from("<i", data), 4
    if count != len(like):
        raise RuntimeError(f"the harness wrote {count} tensors, {len(like)} were passed")
    out = []
    for a in like:
        ndim, _, _, _ = struct.unpack_from("<iBBH", data, pos)
        pos += 8
        if ndim == -1:
            out.append(a)
            pos += 8
            continue
        a = np.asarray(a)
        shape = struct.unpack_from(f"<{ndim}q", data, pos)
        pos += 8 * ndim
        nbytes = int(np.prod(shape, dtype=np.int64)) * a.dtype.itemsize
        out.append(np.frombuffer(data, a.dtype, count=nbytes // a.dtype.itemsize, offset=pos).reshape(shape).copy())
        pos += nbytes
    return out


def run_aarch64(program: Path, arrays: list, threads: int = 2, timeout: float = 600) -> list:
    """Run a linked kernel on `arrays` (its parameters in order: NumPy arrays, or int / float
    scalars) under qemu; every argument after the call (the outputs are the last tensors)."""
    with tempfile.TemporaryDirectory(prefix="mlcpipe-qemu-") as tmp:
        src, dst = Path(tmp) / "in.bin", Path(tmp) / "out.bin"
        _write(src, arrays)
        done = subprocess.run([QEMU, "-cpu", "max", str(program), str(threads), str(src), str(dst)], capture_output=True, text=True, timeout=timeout)
        if done.returncode:
            raise RuntimeError(f"the aarch64 kernel failed under {QEMU} (exit {done.returncode}): {(done.stderr or done.stdout).strip()}")
        return _read(dst, arrays)

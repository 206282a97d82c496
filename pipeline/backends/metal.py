"""Apple GPUs: arm64 macOS host object + Metal Shading Language source, linked into a Mach-O dylib.

`export_library("lib.tar")` gives lib0.o (host code) and devc.o (the packed module blob: the VM
executable and a "metal" module whose MSL the Metal runtime compiles at load); Debian's ld64.lld
links both into an ad-hoc signed lib.dylib; lib.tar stays in the artifact. Without a Mac,
`static_checks` checks that the dylib exports every symbol TVM's loader looks up
(docs/backends.md) and that each kernel's MSL is there.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import subprocess
import tarfile
import tempfile
from pathlib import Path

from .modules import host_side_kernels
from .binfmt import MachO
from .reproducible import fix_macho_uuid, normalize_tar, source_date_epoch

LIBRARY = "lib.dylib"
SOURCE_FILE = "kernels.metal"
# TIR-level CommonSubexprElim breaks TVM's own batch_tree_attn kernel at Llama-3.2-1B shapes on GPU
# targets ("variable cse_vN has been used before definition", TVM 0.27); the GPU shader compilers run
# their own CSE, so it is off for them.
PASS_CONFIG = {"tirx.disable_cse_tir": True}
KERNEL_SUFFIX = "_kernel"  # TVM names a PrimFunc's device kernel <name>_kernel
HOST_CPU = False
PRESET_OPTIONS = {"macos_min_version": "a macOS version string, e.g. '13.0'"}
_MACOS_VERSION = r"\d+(\.\d+){0,2}"
WEBGPU_RUNTIME = False
METASCHEDULE = False
LIBRARY_FORMAT = "Mach-O"  # the container of LIBRARY (pipeline/library.py checks it before loading)
TARBALL = "lib.tar"

LIBRARY_SYMBOLS = ("__tvm_ffi__library_bin", "__tvm_ffi__library_ctx")
CONTEXT_SYMBOLS = ("__TVMFFIFunctionCall", "__TVMFFIEnvModLookupFromImports", "__TVMFFIHandleInitOnce")
FUNCTION_PREFIX = "__tvm_ffi_"


def compile_context(target_spec):
    del target_spec
    return contextlib.nullcontext()


def install_lowerings() -> None:
    """No intrinsic lowerings of our own for this target (llvm has some)."""


def pipeline_config(options) -> dict:
    """No PassContext config for the Relax pipeline."""
    del options
    return {}


def check_preset(path, raw, options, given) -> None:
    """Beyond what TVM checks, before any work rather than at the link or the export:
    macos_min_version, and $SOURCE_DATE_EPOCH, which the library's tarball will carry."""
    from ..config import short_repr
    from ..errors import ConfigError

    del raw
    version = options.get("macos_min_version", "13.0")
    if isinstance(version, bool) or not re.fullmatch(_MACOS_VERSION, str(version)):
        where = given.get("macos_min_version") or f"{path}: field 'macos_min_version'"
        raise ConfigError(f"{where}: got {short_repr(version)}; expected {PRESET_OPTIONS['macos_min_version']}")
    source_date_epoch()


# --------------------------------------------------------------------------------------------
# linking


def find_ld64() -> str:
    """Path of Debian's Mach-O linker (ld64.lld, or a versioned ld64.lld-NN)."""
    candidates = ["ld64.lld"] + [f"ld64.lld-{v}" for v in range(30, 10, -1)]
    for name in candidates:
        found = shutil.which(name)
        if found:
            return found
    raise RuntimeError(
        "ld64.lld not found on PATH: the Metal target links its Mach-O dylib with LLVM's lld; "
        "install the Debian package lld (scripts/setup-debian.sh does)"
    )


def _min_version(target_spec) -> str:
    options = getattr(target_spec, "options", None) or {}
    version = str(options.get("macos_min_version", "13.0"))
    if not re.fullmatch(_MACOS_VERSION, version):
        raise ValueError(f"macos_min_version must look like '13.0', got {version!r}")
    return version


def link_dylib(objects: list[str], output, min_version: str = "13.0") -> None:
    """Link arm64 macOS objects into a dylib; TVM runtime symbols stay dynamic_lookup.

    The output depends on the objects' contents only (see `reproducible.py`): object paths are
    stripped from the debug map, their mtimes zeroed (ZERO_AR_DATE) and the UUID made a hash.
    """
    ld = find_ld64()
    obj_dir = str(Path(objects[0]).parent) + "/" if objects else ""
    cmd = [
        ld,
        "-dylib",
        "-arch", "arm64",
        "-platform_version", "macos", min_version, min_version,
        "-undefined", "dynamic_lookup",
        "-install_name", f"@rpath/{Path(output).name}",
        *(["-oso_prefix", obj_dir] if obj_dir else []),
        "-o", str(output),
        *objects,
    ]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "ZERO_AR_DATE": "1"})
    if proc.returncode != 0:
        lines = [ln for ln in (proc.stdout + proc.stderr).splitlines() if ln.strip()]
        raise RuntimeError(f"{Path(ld).name} failed (exit {proc.returncode}): " + " | ".join(lines[:6]))
    fix_macho_uuid(output)


def export(executable, target_spec, out_dir, library: str = LIBRARY) -> list[str]:
    """Write lib.tar (lib0.o + devc.o) and lib.dylib (or `library`) linked from them."""
    out_dir = Path(out_dir)
    tar_path = out_dir / TARBALL
    executable.export_library(str(tar_path))
    normalize_tar(tar_path)
    with tempfile.TemporaryDirectory(prefix="mlcpipe-metal-") as tmp:
        objects = extract_objects(tar_path, Path(tmp))
        link_dylib(objects, out_dir / library, _min_version(target_spec))
    return [library, TARBALL]


def extract_objects(tar_path: Path, dest: Path) -> list[str]:
    """The object files of an exported lib.tar, written into `dest`, in link order."""
    with tarfile.open(tar_path, "r:*") as tar:
        members = [m for m in tar.getmembers() if m.isfile() and m.name.endswith(".o")]
        for member in members:
            target = dest / Path(member.name).name
            with tar.extractfile(member) as src, open(target, "wb") as dst:
                shutil.copyfileobj(src, dst)
    if not members:
        raise RuntimeError(f"{tar_path}: export_library produced no object files")
    # host object(s) first, the packed-imports blob (devc.o) last, as TVM's own linker call does
    names = sorted((Path(m.name).name for m in members), key=lambda n: (n.endswith("devc.o"), n))
    return [str(dest / n) for n in names]


def kernel_source(executable) -> str:
    """The Metal Shading Language source of every Metal device module."""
    from .modules import device_modules

    sources = []
    for module in device_modules(executable):
        if module.kind != "metal":
            continue
        for fmt in ("", "metal"):
            try:
                text = module.inspect_source(fmt)
            except Exception:  # noqa: BLE001 - a module without that source format
                continue
            if text:
                sources.append(str(text))
                break
    return "\n".join(sources)


# --------------------------------------------------------------------------------------------
# Mach-O symbols


def macho_header(path) -> dict[str, int]:
    """magic, cputype, cpusubtype, filetype, ncmds of a 64-bit Mach-O file."""
    try:
        return MachO(Path(path).read_bytes()).header
    except ValueError as exc:
        raise ValueError(f"{path}: {exc}") from None


def exported_symbols(path, use_tools: bool = True) -> list[str]:
    """Global symbols a Mach-O dylib (or object) defines, as C names (`__tvm_ffi__library_bin`).

    Uses `llvm-nm` where it is on PATH, otherwise reads the LC_SYMTAB nlist_64 entries itself.
    """
    nm = shutil.which("llvm-nm") if use_tools else None
    if nm:
        proc = subprocess.run(
            [nm, "--extern-only", "--defined-only", "--just-symbol-name", str(path)],
            capture_output=True,
            text=True,
        )
        if proc.returncode == 0:
            names = [ln.strip() for ln in proc.stdout.splitlines() if ln.strip() and not ln.endswith(":")]
            return sorted({n[1:] if n.startswith("_") else n for n in names})
    return MachO(Path(path).read_bytes()).defined_symbols()


def required_symbols(tar_path) -> list[str]:
    """What lib.dylib must export for TVM to load it: the library/context symbols plus every
    global the objects in lib.tar define (the `__tvm_ffi_<name>` host functions)."""
    needed = set(LIBRARY_SYMBOLS)
    with tempfile.TemporaryDirectory(prefix="mlcpipe-metal-") as tmp:
        for obj in extract_objects(Path(tar_path), Path(tmp)):
            needed |= {s for s in exported_symbols(obj) if s.startswith(("__tvm_ffi", "__TVMFFI"))}
    return sorted(needed)


def static_checks(artifact, manifest, names, roles) -> list[tuple]:
    """Without a Mac: the dylib exports every symbol TVM's loader needs, each kernel's MSL is there."""
    library = Path(artifact) / manifest["library"]
    source_file = manifest.get("kernel_source")
    source = (Path(artifact) / source_file).read_text() if source_file and (Path(artifact) / source_file).is_file() else ""
    needed = set(required_symbols(Path(artifact) / TARBALL))
    missing = sorted(needed - set(exported_symbols(library)))
    rows = [(f"<{manifest['library']}>", "library", "FAIL" if missing else "static",
             f"missing exports {missing[:3]}" if missing else f"exports all {len(needed)} symbols TVM's loader needs; Mach-O {macho_header(library)}")]
    host = host_side_kernels(manifest)
    for name in names:
        present = bool(re.search(rf"kernel void {re.escape(name)}(_kernel(_\d+)?)?\(", source))  # not a longer name's
        if present:
            rows.append((name, roles.get(name, "other"), "static", "MSL kernel present"))
        elif name in host:
            rows.append((name, roles.get(name, "other"), "skip", "host-side function: no device kernel"))
        else:
            rows.append((name, roles.get(name, "other"), "FAIL", f"device kernel missing from {source_file}"))
    return rows


def not_executed(options) -> str:
    del options
    return ("metal: NOT EXECUTED (Metal runs on a Mac: `mlcpipe check --rpc HOST:PORT` against a rpc_server there): "
            "MSL source of every kernel present, dylib exports checked")

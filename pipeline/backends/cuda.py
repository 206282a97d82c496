"""NVIDIA GPUs: x86-64 host code plus ONE fatbin holding SASS for every `fatbin_archs` arch.

`compile_context` routes TVM's CUDA compile callback to nvcc (one multi-arch fatbin); `export`
makes sure the library's packed module blob holds that fatbin even where TVM kept CUDA source
(no CUDA runtime on the build machine), recompiling such modules with nvcc. Without a GPU,
`static_checks` reports every kernel's ptxas registers and spills. How TVM 0.27 hands CUDA code
over: docs/backends.md.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import os
import re
import shutil
import struct
import subprocess
import tempfile
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from .modules import host_side_kernels
from .binfmt import BlobReader, ModuleBlob, library_blob, pack_bytes

LIBRARY = "lib.so"
SOURCE_FILE = "kernels.cu"
# TIR-level CommonSubexprElim breaks TVM's own batch_tree_attn kernel at Llama-3.2-1B shapes on GPU
# targets ("variable cse_vN has been used before definition", TVM 0.27); the GPU shader compilers run
# their own CSE, so it is off for them.
PASS_CONFIG = {"tirx.disable_cse_tir": True}
KERNEL_SUFFIX = "_kernel"  # TVM names a PrimFunc's device kernel <name>_kernel
HOST_CPU = False
PRESET_OPTIONS = {"fatbin_archs": "a list of sm_XY archs, e.g. [sm_80, sm_90]",
                  "cuda_graph": "true or false (default): capture decode's static kernel runs as CUDA graphs"}
WEBGPU_RUNTIME = False
METASCHEDULE = True
LIBRARY_FORMAT = "ELF"  # the container of LIBRARY (pipeline/library.py checks it before loading)

# TVM's CUDA runtime, loaded with the device (pipeline/device/tvm_runtime.py), after the CUDA runtime
# it links where one lies beside it (a bundle's: the machine's may not be on the loader's path)
RUNTIME_LIBRARIES = ("libtvm_runtime_cuda.so",)
CUDART = "libcudart.so.13"
CALLBACK = "tvm_callback_cuda_compile"
FATBIN_MAGIC = 0xBA55ED50
_FATBIN_MAGIC_BYTES = struct.pack("<I", FATBIN_MAGIC)

# The flags TVM's own nvcc path (tvm/support/nvcc.py) uses, so kernels behave the same.
_NVCC_FLAGS = [
    "-O3",
    "-U__CUDA_NO_HALF_OPERATORS__",
    "-U__CUDA_NO_HALF_CONVERSIONS__",
    "-U__CUDA_NO_BFLOAT16_OPERATORS__",
    "-U__CUDA_NO_BFLOAT16_CONVERSIONS__",
    "-U__CUDA_NO_BFLOAT162_OPERATORS__",
    "-U__CUDA_NO_BFLOAT162_CONVERSIONS__",
    "--expt-relaxed-constexpr",
    "--expt-extended-lambda",
    "--use_fast_math",
    "--ptxas-options=-v,--register-usage-level=10,--warn-on-local-memory-usage",
    "-diag-suppress=1046",  # "floating-point value cannot be represented exactly": TVM's hex floats
]

# (sha256(source), arch) -> {kernel: stats}: ptxas -v output seen while building a fatbin, so
# `ptxas_report` on the same source in the same process does not compile it again.
PTXAS_CACHE: dict[tuple[str, str], dict[str, dict[str, int]]] = {}
_CACHE_LOCK = threading.Lock()


# --------------------------------------------------------------------------------------------
# nvcc


def find_nvcc() -> str:
    """Path of nvcc: PATH, then $CUDA_HOME/$CUDA_PATH, then /usr/local/cuda."""
    found = shutil.which("nvcc")
    if found:
        return found
    for root in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
        if root and (Path(root) / "bin" / "nvcc").is_file():
            return str(Path(root) / "bin" / "nvcc")
    raise RuntimeError(
        "nvcc not found (PATH, $CUDA_HOME, /usr/local/cuda): the CUDA target needs the CUDA toolkit's nvcc"
    )


def _check_archs(archs) -> list[str]:
    archs = list(archs or [])
    if not archs or not all(isinstance(a, str) and re.fullmatch(r"sm_\d+[af]?", a) for a in archs):
        raise ValueError(f"CUDA archs must be a non-empty list like ['sm_80', 'sm_90'], got {archs!r}")
    return archs


def _gencode(archs: list[str]) -> list[str]:
    out = []
    for arch in archs:
        suffix = arch[3:]
        out += ["-gencode", f"arch=compute_{suffix},code=sm_{suffix}"]
    return out


# --------------------------------------------------------------------------------------------
# target presets

# The archs nvcc 12.x-13.x compile for (nvcc --list-gpu-code), used when nvcc is not installed.
KNOWN_CUDA_ARCHS = ("sm_50", "sm_52", "sm_53", "sm_60", "sm_61", "sm_62", "sm_70", "sm_72", "sm_75", "sm_80", "sm_86",
                    "sm_87", "sm_88", "sm_89", "sm_90", "sm_100", "sm_101", "sm_103", "sm_110", "sm_120", "sm_121")


@functools.lru_cache(maxsize=1)
def cuda_archs() -> tuple[tuple[str, ...], str]:
    """(sm_XY archs nvcc compiles for, where the list came from): `nvcc --list-gpu-code` when
    nvcc is installed (a few ms), else KNOWN_CUDA_ARCHS."""
    try:
        nvcc = find_nvcc()
        out = subprocess.run([nvcc, "--list-gpu-code"], capture_output=True, text=True, timeout=60)
    except (RuntimeError, OSError, subprocess.TimeoutExpired):
        return KNOWN_CUDA_ARCHS, "known list; nvcc not found"
    listed = tuple(a for a in out.stdout.split() if re.fullmatch(r"sm_\d+", a))
    if out.returncode != 0 or not listed:
        return KNOWN_CUDA_ARCHS, "known list"
    return tuple(sorted(listed, key=lambda a: int(a[3:]))), "nvcc --list-gpu-code"


def _check_nvcc_archs(where: str, archs: list) -> None:
    """Each arch is one nvcc compiles for: sm_XY it lists, sm_XYa for XY >= 90, sm_XYf for
    XY >= 100 (the arch-specific and family variants it does not list)."""
    from ..config import short_repr
    from ..errors import ConfigError

    allowed, source = cuda_archs()
    for arch in archs:
        m = re.fullmatch(r"sm_(\d+)([af]?)", arch) if isinstance(arch, str) else None
        ok = bool(m) and f"sm_{m.group(1)}" in allowed and (
            not m.group(2) or int(m.group(1)) >= (90 if m.group(2) == "a" else 100))
        if not ok:
            head = f"{where} {short_repr(arch)}:" if where.startswith("--") else f"{where}: got {short_repr(arch)};"
            raise ConfigError(f"{head} not an arch nvcc compiles for; allowed: {', '.join(allowed)} "
                              f"(and sm_XYa for XY >= 90, sm_XYf for XY >= 100; {source})")


def check_preset(path, raw, options, given) -> None:
    """`arch` and `fatbin_archs` (default [arch], and always holding arch) are archs nvcc
    compiles for; `given`: the overrides' keys, each with how errors name it (--arch, a field)."""
    from ..config import short_repr
    from ..errors import ConfigError

    def where(field: str) -> str:
        return given.get(field) or f"{path}: field '{field}'"

    archs = options.setdefault("fatbin_archs", [raw.get("arch", "sm_80")])
    if not isinstance(archs, list) or not archs or not all(isinstance(a, str) and a.startswith("sm_") for a in archs):
        raise ConfigError(f"{where('fatbin_archs')}: got {short_repr(archs)}; expected {PRESET_OPTIONS['fatbin_archs']}")
    for field, values in (("arch", [raw.get("arch", "sm_80")]), ("fatbin_archs", archs)):
        _check_nvcc_archs(where(field), values)
    if raw.get("arch") not in archs:
        options["fatbin_archs"] = [*archs, raw.get("arch")]
    if not isinstance(options.get("cuda_graph", False), bool):
        raise ConfigError(f"{where('cuda_graph')}: got {short_repr(options['cuda_graph'])}; expected {PRESET_OPTIONS['cuda_graph']}")


def pipeline_config(options) -> dict:
    """`cuda_graph`: TVM's RewriteCUDAGraph (in the finalize phase) lifts the static-shape kernel
    runs between the KV cache's calls into regions the VM captures once and replays as CUDA graphs."""
    return {"relax.backend.use_cuda_graph": True} if options.get("cuda_graph") else {}


def _first_errors(output: str, limit: int = 6) -> str:
    lines = [ln.rstrip() for ln in output.splitlines() if ln.strip()]
    errors = [ln for ln in lines if re.search(r"\berror\b|fatal", ln, re.IGNORECASE)]
    return "\n".join((errors or lines[-limit:])[:limit])


def _run_nvcc(source: str, args: list[str], out_name: str, what: str) -> tuple[bytes, str]:
    """Compile `source` with nvcc `args` into `out_name` in a temp dir; (output bytes, log)."""
    nvcc = find_nvcc()
    with tempfile.TemporaryDirectory(prefix="mlcpipe-nvcc-") as tmp:
        src = Path(tmp) / "kernels.cu"
        out = Path(tmp) / out_name
        src.write_text(source)
        cmd = [nvcc, *args, *_NVCC_FLAGS, "-o", str(out), str(src)]
        proc = subprocess.run(cmd, capture_output=True, text=True, cwd=tmp)
        log = proc.stdout + proc.stderr
        if proc.returncode != 0 or not out.is_file() or out.stat().st_size == 0:
            raise RuntimeError(
                f"nvcc failed (exit {proc.returncode}) compiling CUDA for {what}:\n{_first_errors(log)}"
            )
        return out.read_bytes(), log


def compile_fatbin(source: str, archs) -> bytes:
    """One fatbin with SASS for every arch in `archs` (e.g. ['sm_80', 'sm_90'])."""
    archs = _check_archs(archs)
    data, log = _run_nvcc(source, ["--fatbin", *_gencode(archs)], "kernels.fatbin", ", ".join(archs))
    report = parse_ptxas_log(log)
    digest = hashlib.sha256(source.encode()).hexdigest()
    with _CACHE_LOCK:
        for arch in archs:
            per_kernel = {k: v[arch] for k, v in report.items() if arch in v}
            if per_kernel:
                PTXAS_CACHE[(digest, arch)] = per_kernel
    return data


# --------------------------------------------------------------------------------------------
# ptxas resource usage

_ENTRY = re.compile(r"Compiling entry function '([^']+)' for '(sm_\w+)'")
_PROPS = re.compile(r"Function properties for (\S+)")
_SPILLS = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_USED = re.compile(r"Used (\d+) registers")
_SMEM = re.compile(r"(\d+) bytes smem")


def parse_ptxas_log(log: str) -> dict[str, dict[str, dict[str, int]]]:
    """`ptxas -v` output -> {kernel: {arch: {registers, spill_stores, spill_loads, smem}}}."""
    report: dict[str, dict[str, dict[str, int]]] = {}
    current: dict[str, int] | None = None
    entry_name = None
    props_name = None
    for line in log.splitlines():
        if m := _ENTRY.search(line):
            entry_name, arch = m.group(1), m.group(2)
            current = report.setdefault(entry_name, {}).setdefault(
                arch, {"registers": 0, "spill_stores": 0, "spill_loads": 0, "smem": 0}
            )
            props_name = None
        elif m := _PROPS.search(line):
            props_name = m.group(1)
        elif (m := _SPILLS.search(line)) and current is not None and props_name == entry_name:
            current["spill_stores"] = int(m.group(2))
            current["spill_loads"] = int(m.group(3))
        elif (m := _USED.search(line)) and current is not None:
            current["registers"] = int(m.group(1))
            if s := _SMEM.search(line):
                current["smem"] = int(s.group(1))
    return report


def ptxas_report(source: str, archs: list[str]) -> dict[str, dict[str, dict[str, int]]]:
    """Per-kernel register / spill / shared-memory use from ptxas, for each arch.

    Compiles `source` to a cubin per arch with `-Xptxas -v` (in parallel) unless this process
    already compiled the same source for that arch into a fatbin (same flags, same ptxas run).
    Returns {kernel_name: {arch: {"registers", "spill_stores", "spill_loads", "smem"}}}.
    """
    archs = _check_archs(archs)
    digest = hashlib.sha256(source.encode()).hexdigest()
    per_arch: dict[str, dict[str, dict[str, int]]] = {}
    with _CACHE_LOCK:
        for arch in archs:
            if (digest, arch) in PTXAS_CACHE:
                per_arch[arch] = PTXAS_CACHE[(digest, arch)]
    missing = [a for a in archs if a not in per_arch]

    def one(arch: str) -> dict[str, dict[str, int]]:
        _, log = _run_nvcc(source, ["--cubin", f"-arch={arch}"], "kernels.cubin", arch)
        return {k: v[arch] for k, v in parse_ptxas_log(log).items() if arch in v}

    if missing:
        with ThreadPoolExecutor(max_workers=min(len(missing), os.cpu_count() or 1)) as pool:
            for arch, result in zip(missing, pool.map(one, missing)):
                per_arch[arch] = result
                with _CACHE_LOCK:
                    PTXAS_CACHE[(digest, arch)] = result
    report: dict[str, dict[str, dict[str, int]]] = {}
    for arch in archs:
        for kernel, stats in per_arch[arch].items():
            report.setdefault(kernel, {})[arch] = dict(stats)
    return report


# --------------------------------------------------------------------------------------------
# build-time callback


def make_callback(archs):
    """The `tvm_callback_cuda_compile` implementation: CUDA source -> fatbin bytes for `archs`."""
    archs = _check_archs(archs)

    def tvm_callback_cuda_compile(code, *_unused):  # TVM 0.27 passes (code); older ones (code, target)
        return compile_fatbin(str(code), archs)

    return tvm_callback_cuda_compile


@contextlib.contextmanager
def compile_context(target_spec):
    """Around `relax.build`: route TVM's CUDA compile callback to nvcc -> one multi-arch fatbin."""
    import tvm_ffi

    archs = _archs_of(target_spec)
    previous = tvm_ffi.get_global_func(CALLBACK, allow_missing=True)
    tvm_ffi.register_global_func(CALLBACK, make_callback(archs), override=True)
    install_lowerings()
    try:
        yield
    finally:
        if previous is not None:
            tvm_ffi.register_global_func(CALLBACK, previous, override=True)
        else:
            tvm_ffi.remove_global_func(CALLBACK)


def install_lowerings() -> None:
    """The device functions our schedules call, added to every CUDA source TVM generates in this
    process (schedules/gpu/gemv_dequant.py: `install_cuda_postproc`); no intrinsic lowerings of
    our own, as llvm has."""
    from mlcpipe.schedules.gpu.gemv_dequant import install_cuda_postproc

    install_cuda_postproc()


def _archs_of(target_spec) -> list[str]:
    options = getattr(target_spec, "options", None) or {}
    archs = options.get("fatbin_archs") or [getattr(target_spec, "target", {}).get("arch", "sm_80")]
    return _check_archs(archs)


# --------------------------------------------------------------------------------------------
# fatbin inspection


def fatbin_archs(data: bytes) -> list[str]:
    """SASS archs (sm_XY) of every fatbin image found inside `data` (a fatbin or any binary)."""
    found: set[str] = set()
    start = 0
    while (pos := data.find(_FATBIN_MAGIC_BYTES, start)) >= 0:
        start = pos + 4
        if pos + 16 > len(data):
            break
        _, version, header_size, fat_size = struct.unpack_from("<IHHQ", data, pos)
        if version != 1 or header_size < 16 or pos + header_size + fat_size > len(data):
            continue
        off, end = pos + header_size, pos + header_size + fat_size
        while off + 32 <= end:
            kind, _, entry_header, payload = struct.unpack_from("<HHIQ", data, off)
            if entry_header < 32 or off + entry_header + payload > end:
                break
            (arch,) = struct.unpack_from("<I", data, off + 28)
            if kind == 2:  # 1 = PTX, 2 = ELF (cubin)
                found.add(f"sm_{arch}")
            off += entry_header + payload
    return sorted(found, key=lambda a: (int(re.sub(r"\D", "", a)), a))


def verify_fatbin(lib_path) -> list[str]:
    """The sm archs of the fatbin(s) embedded in a library, e.g. ['sm_80', 'sm_90'].

    Uses `cuobjdump --list-elf` where it is installed and finds something; otherwise scans the file
    for fatbin images and reads their entry headers (TVM embeds the fatbin inside its packed module
    blob, not as a .nv_fatbin section, so cuobjdump often sees nothing).
    """
    lib_path = Path(lib_path)
    cuobjdump = shutil.which("cuobjdump")
    if cuobjdump:
        proc = subprocess.run([cuobjdump, "--list-elf", str(lib_path)], capture_output=True, text=True)
        archs = sorted(set(re.findall(r"\b(sm_\d+[af]?)\b", proc.stdout)))
        if proc.returncode == 0 and archs:
            return archs
    return fatbin_archs(lib_path.read_bytes())


# --------------------------------------------------------------------------------------------
# packed module blob (`__tvm_ffi__library_bin`, read by binfmt.ModuleBlob). A "cuda" payload is
# <fmt: str> <fmap> <code: bytes> (CUDAModuleNode::SaveToBytes), code last.


def rewrite_cuda_modules(blob: bytes, replace) -> bytes:
    """Rewrite every "cuda" module in a packed library blob.

    `replace(index, fmt, code)` returns None to keep the module or (new_fmt, new_code).
    """
    packed = ModuleBlob.parse(blob)
    cuda_index = 0
    for i, (kind, payload) in enumerate(packed.modules):
        if kind != b"cuda":
            continue
        reader = BlobReader(payload)
        fmt = reader.bytes()
        # code is the last field: find it from the end and check the length prefix matches
        code = _last_bytes_field(payload, reader.pos)
        fmap = payload[reader.pos : len(payload) - 8 - len(code)]
        new = replace(cuda_index, fmt.decode(), code)
        cuda_index += 1
        if new is not None:
            new_fmt, new_code = new
            packed.modules[i] = (kind, pack_bytes(new_fmt.encode()) + fmap + pack_bytes(bytes(new_code)))
    return packed.to_bytes()


def _last_bytes_field(payload: bytes, fmap_start: int) -> bytes:
    # The fmap (FunctionInfo table) has its own encoding; rather than decode it, find the code
    # field, <len:u64><len bytes> ending exactly at the end of the payload: the FIRST u64 after
    # the fmt whose value equals the rest of the payload. (Taking the first matters: a fatbin's
    # own header holds such a u64 at its offset 8, so later candidates can be inside the code;
    # inside the fmap, values are small counts or ASCII and cannot span the rest.)
    for pos in range(fmap_start, len(payload) - 7):
        (n,) = struct.unpack_from("<Q", payload, pos)
        if pos + 8 + n == len(payload):
            return payload[pos + 8 :]
    raise ValueError("cannot locate the code field of a CUDA module")


def embedded_cuda_formats(lib_path) -> list[str]:
    """Format of each CUDA module packed in a library: "fatbin" after `export`, "cuda" = source."""
    formats: list[str] = []
    rewrite_cuda_modules(library_blob(lib_path), lambda _i, fmt, _code: formats.append(fmt))
    return formats


_C_ARRAY = re.compile(r"(library_bin\[)(\d+)(\]\s*=\s*\{)(.*?)(\};)", re.DOTALL)


def _c_array(data: bytes) -> str:
    hexes = [f"0x{b:02x}" for b in data]
    rows = (",".join(hexes[i : i + 32]) for i in range(0, len(hexes), 32))
    return "\n  " + ",\n  ".join(rows) + "\n"


def _pack_imports_with_fatbin(archs: list[str], sources: list[str]):
    """An `fpack_imports` for export_library that embeds a fatbin for every CUDA module."""

    def replace(index: int, fmt: str, code: bytes):
        if fmt == "cuda":
            return "fatbin", compile_fatbin(code.decode(), archs)
        if set(archs) <= set(fatbin_archs(code)):
            return None  # already a fatbin with every arch (built under compile_context)
        if index >= len(sources) or not sources[index]:
            raise RuntimeError(
                f"CUDA module {index} holds {fmt!r} code without {archs} and its source is unavailable"
            )
        return "fatbin", compile_fatbin(sources[index], archs)

    def fpack_imports(mod, is_system_lib, symbol_prefix, workspace_dir):
        import tvm_ffi

        blob = tvm_ffi.get_global_func("runtime.ModulePackImportsToTensor")(mod).numpy().tobytes()
        new_blob = rewrite_cuda_modules(blob, replace)
        c_text = tvm_ffi.get_global_func("runtime.ModulePackImportsToC")(mod, is_system_lib, symbol_prefix)
        matches = list(_C_ARRAY.finditer(c_text))
        if len(matches) != 1 or int(matches[0].group(2)) != len(blob):
            raise RuntimeError("unexpected layout of TVM's packed-imports C source; cannot embed the fatbin")
        m = matches[0]
        c_text = c_text[: m.start()] + f"library_bin[{len(new_blob)}] = {{{_c_array(new_blob)}}};" + c_text[m.end() :]
        path = Path(workspace_dir) / f"{symbol_prefix}devc.c"
        path.write_text(c_text)
        return str(path)

    return fpack_imports


# --------------------------------------------------------------------------------------------
# backend interface


def export(executable, target_spec, out_dir, library: str = LIBRARY) -> list[str]:
    """Write lib.so (x86-64 host code + one fatbin for every `fatbin_archs` arch)."""
    archs = _archs_of(target_spec)
    cuda_mods = [m for m in _device_modules(executable) if m.kind == "cuda"]
    sources = [_source_of(m) for m in cuda_mods]
    out = Path(out_dir) / library
    executable.export_library(str(out), fpack_imports=_pack_imports_with_fatbin(archs, sources))
    if cuda_mods:
        present = verify_fatbin(out)
        if not set(archs) <= set(present):
            raise RuntimeError(f"{out}: embedded fatbin has archs {present}, expected all of {archs}")
    return [library]


def kernel_source(executable) -> str:
    """The generated CUDA C++ of every CUDA device module."""
    return "\n".join(_source_of(m) for m in _device_modules(executable) if m.kind == "cuda")


def _device_modules(executable):
    from .modules import device_modules

    return device_modules(executable)


def _source_of(module) -> str:
    for fmt in ("cuda", ""):
        try:
            text = module.inspect_source(fmt)
        except Exception:  # noqa: BLE001 - a module without that source format
            continue
        if text and not text.startswith(("\x50\xed", "\x7fELF")):
            return str(text)
    return ""


def static_checks(artifact, manifest, names, roles) -> list[tuple]:
    """Without a GPU: the library embeds one fatbin with every arch, each kernel compiles in ptxas."""
    source_file = manifest.get("kernel_source")
    source = (Path(artifact) / source_file).read_text() if source_file and (Path(artifact) / source_file).is_file() else ""
    archs = manifest.get("target_options", {}).get("fatbin_archs") or [manifest["target"].get("arch", "sm_80")]
    library = Path(artifact) / manifest["library"]
    present = verify_fatbin(library)
    formats = embedded_cuda_formats(library)
    lib_ok = formats == ["fatbin"] and set(archs) <= set(present)
    rows = [(f"<{manifest['library']}>", "library", "static" if lib_ok else "FAIL",
             f"embedded {formats}, fatbin archs {present} (wanted {archs})")]
    report = ptxas_report(source, archs)
    host = host_side_kernels(manifest)
    for name in names:
        kernels = {k: v for k, v in report.items() if k == name or k.startswith(name + "_kernel")}
        if not kernels:
            rows.append((name, roles.get(name, "other"), "skip", "host-side function: no device kernel") if name in host else
                        (name, roles.get(name, "other"), "FAIL", f"device kernel missing from the ptxas report of {source_file}"))
            continue
        for kname, per_arch in sorted(kernels.items()):
            info = "; ".join(f"{a}: {v['registers']} regs, spills {v['spill_stores']}/{v['spill_loads']} B st/ld" for a, v in sorted(per_arch.items()))
            rows.append((kname, roles.get(name, "other"), "compiled", info))
    return rows


def not_executed(options) -> str:
    del options
    return "cuda: NOT EXECUTED (no CUDA device here): every kernel compiled by nvcc/ptxas for the fatbin archs; registers and spills reported"

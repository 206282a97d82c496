"""WebGPU: WGSL kernels; host code for wasm32 linked by emscripten with TVM's web runtime.

`lib.wasm` is what WebLLM loads: a standalone wasm holding TVM's web runtime, the VM executable
and its host functions as a system library, and the WGSL kernels as an imported "webgpu" module.
The web runtime is compiled here from the wheel's sources plus our stand-ins for the headers it
lacks (web_runtime/), once, and cached; how this differs from
`tvm.support.emcc.create_tvmjs_wasm`: docs/backends.md.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import shutil
import subprocess
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

LIBRARY = "lib.wasm"
SOURCE_FILE = "kernels.wgsl"
# TIR-level CommonSubexprElim breaks TVM's own batch_tree_attn kernel at Llama-3.2-1B shapes on GPU
# targets ("variable cse_vN has been used before definition", TVM 0.27); the GPU shader compilers run
# their own CSE, so it is off for them.
PASS_CONFIG = {"tirx.disable_cse_tir": True}
KERNEL_SUFFIX = "_kernel"  # TVM names a PrimFunc's device kernel <name>_kernel
HOST_CPU = False
PRESET_OPTIONS: dict = {}
WEBGPU_RUNTIME = True  # runs in a WebGPU runtime (Dawn in node, Chromium, WebLLM): WGSL kernels
METASCHEDULE = False
LIBRARY_FORMAT = "wasm"  # the container of LIBRARY (pipeline/library.py checks it before loading)

_SETUP_HINT = "install with scripts/setup-debian.sh"
_OWN_HEADERS = Path(__file__).resolve().parent / "web_runtime"
_RUNTIME_UNITS = ("wasm_runtime", "tvmjs_support", "webgpu_runtime")
_COMPILE_FLAGS = ("-O3", "-std=c++17", "-Wno-ignored-attributes")
# As tvm.support.emcc.create_tvmjs_wasm links (what WebLLM's tvmjs expects), except the
# optimisation level: emcc's -O2/-O3 run binaryen's wasm-opt at -O2/-O3, which takes 30-85 s on
# this 7 MB module (2 cores); we link at -O1 and run `wasm-opt -O<MLCPIPE_WASM_OPT>` ourselves
# (default 1: ~4-6 s, the module ~6% larger than at -O3; 0 skips it, 3 matches create_tvmjs_wasm).
_LINK_FLAGS = (
    "-O1",
    "--no-entry",
    "-s", "WASM_BIGINT=1",
    "-s", "ERROR_ON_UNDEFINED_SYMBOLS=0",
    "-s", "STANDALONE_WASM=1",
    "-s", "ALLOW_MEMORY_GROWTH=1",
    "-s", "TOTAL_MEMORY=160MB",
)  # fmt: skip


def pipeline_config(options) -> dict:
    """No PassContext config for the Relax pipeline."""
    del options
    return {}


def check_preset(path, raw, options, given) -> None:
    """`supports_subgroups: true` (TVM's webgpu attribute) opts in to WebGPU subgroups: kernels
    then need an adapter with the "subgroups" feature. TVM 0.27 sets thread_warp_size to 32
    with it, whatever the preset says, and refuses any other thread_warp_size without it. Also
    $MLCPIPE_CACHE_DIR."""
    from ..errors import ConfigError

    del options

    def where(field: str) -> str:
        return given.get(field) or f"{path}: field '{field}'"

    subgroups = raw.get("supports_subgroups", False)
    if not isinstance(subgroups, bool):
        raise ConfigError(f"{where('supports_subgroups')}: got {subgroups!r}; expected true or false")
    warp = raw.get("thread_warp_size")
    if subgroups and warp not in (None, 32):
        raise ConfigError(
            f"{where('thread_warp_size')}: got {warp!r}; TVM 0.27 fixes it to 32 on webgpu "
            "with supports_subgroups (leave it out)"
        )
    cache_dir()  # where the runtime objects are cached: checked before any work


def compile_context(target_spec):
    del target_spec
    return contextlib.nullcontext()


def install_lowerings() -> None:
    """No intrinsic lowerings of our own for this target (llvm has some)."""


def export(executable, target, out_dir: Path, library: str = LIBRARY) -> list[str]:
    del target
    objects = runtime_objects()
    output = Path(out_dir) / library

    def fcompile(file_name, files, options=None, **kwargs):
        del kwargs
        emcc_link(file_name, [*objects, *files], list(options or []))

    fcompile.object_format = "o"
    executable.export_library(str(output), fcompile=fcompile)
    return [library]


def kernel_source(executable) -> str:
    from .modules import device_modules

    return "\n".join(m.inspect_source("") for m in device_modules(executable) if m.kind == "webgpu")


# ---- emscripten -------------------------------------------------------------------------------


def _emcc() -> str:
    path = shutil.which(os.environ.get("EMCC", "emcc"))
    if path is None:
        raise RuntimeError(f"emcc (emscripten) not found on PATH, needed for the webgpu target: {_SETUP_HINT}")
    return path


def _emcc_env() -> dict[str, str]:
    env = dict(os.environ)
    # Debian's emcc finds its `acorn` (JS parser) through NODE_PATH.
    paths = [p for p in env.get("NODE_PATH", "").split(os.pathsep) if p]
    if "/usr/share/nodejs" not in paths and Path("/usr/share/nodejs").is_dir():
        paths.append("/usr/share/nodejs")
    env["NODE_PATH"] = os.pathsep.join(paths)
    return env


def _run_emcc(cmd: list[str], what: str, log_file: Path) -> None:
    try:
        proc = subprocess.run(cmd, env=_emcc_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, check=False)
    except OSError as exc:
        raise RuntimeError(f"emcc could not be started ({exc.strerror}) to {what}: {_SETUP_HINT}") from None
    out = proc.stdout.decode("utf-8", errors="replace")
    if proc.returncode != 0:
        log_file.parent.mkdir(parents=True, exist_ok=True)
        log_file.write_text(" ".join(cmd) + "\n\n" + out)
        errors = [line.strip() for line in out.splitlines() if "error" in line.lower()]
        first = errors[0] if errors else (out.strip().splitlines() or ["no output"])[-1]
        raise RuntimeError(
            f"emcc failed to {what} (exit {proc.returncode}): {first[:300]} "
            f"(full log: {log_file}); check the emscripten install ({_SETUP_HINT})"
        )


def emcc_version() -> str:
    emcc = _emcc()
    try:
        proc = subprocess.run([emcc, "--version"], env=_emcc_env(), capture_output=True, text=True, check=False)
    except OSError as exc:
        raise RuntimeError(f"emcc could not be started ({exc.strerror}): {_SETUP_HINT}") from None
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise RuntimeError(f"emcc --version failed ({last}): {_SETUP_HINT}")
    return proc.stdout.strip().splitlines()[0]


def emcc_link(output: str, objects: list[str], options: list[str] | None = None) -> None:
    """Link wasm objects (runtime first) into a standalone .wasm, as create_tvmjs_wasm does,
    then optimise it with binaryen's wasm-opt (see _LINK_FLAGS)."""
    cmd = [_emcc(), *_LINK_FLAGS, "-o", str(output), *objects, *(options or [])]
    log_file = Path(tempfile.gettempdir()) / f"mlcpipe-{Path(output).name}.emcc.log"
    _run_emcc(cmd, f"link {Path(output).name}", log_file)
    with open(output, "rb") as f:
        if f.read(4) != b"\0asm":
            raise RuntimeError(f"emcc produced no wasm module at {output}: {_SETUP_HINT}")
    _wasm_opt(Path(output), log_file)


def _wasm_opt(wasm: Path, log_file: Path) -> None:
    level = os.environ.get("MLCPIPE_WASM_OPT", "1").strip().lstrip("-O") or "1"
    if level not in ("0", "1", "2", "3", "4", "s", "z"):
        raise RuntimeError(f"MLCPIPE_WASM_OPT={level!r}: expected one of 0, 1, 2, 3, 4, s, z")
    if level == "0":
        return
    tool = shutil.which("wasm-opt")
    if tool is None:
        raise RuntimeError(f"wasm-opt (binaryen) not found on PATH, needed after emcc links {wasm.name}: {_SETUP_HINT}")
    # the passes emcc itself runs after linking (STANDALONE_WASM, global base 1024)
    cmd = [tool, "--strip-dwarf", "--post-emscripten", f"-O{level}", "--low-memory-unused", "--zero-filled-memory",
           "--strip-debug", "--strip-producers", str(wasm), "-o", str(wasm)]  # fmt: skip
    try:
        proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, check=False)
    except OSError as exc:
        raise RuntimeError(f"wasm-opt could not be started ({exc.strerror}): {_SETUP_HINT}") from None
    if proc.returncode != 0:
        out = proc.stdout.decode("utf-8", errors="replace")
        log_file.write_text(" ".join(cmd) + "\n\n" + out)
        last = (out.strip().splitlines() or ["no output"])[-1]
        raise RuntimeError(f"wasm-opt failed on {wasm.name} (exit {proc.returncode}): {last[:300]} (full log: {log_file}); {_SETUP_HINT}")


# ---- TVM's web runtime, built once ------------------------------------------------------------


def _wheel_sources() -> dict[str, Path]:
    """Staging-tree path -> source directory in the installed wheels (TVM's source layout)."""
    import tvm
    import tvm_ffi

    tvm_dir = Path(tvm.__file__).resolve().parent
    ffi_dir = Path(tvm_ffi.__file__).resolve().parent
    sources = {
        "src": tvm_dir / "src",
        "include": tvm_dir / "include",
        "web/emcc": tvm_dir / "web" / "emcc",
        "3rdparty/tvm-ffi/src": ffi_dir / "src",
        "3rdparty/tvm-ffi/include": ffi_dir / "include",
    }
    missing = [str(p) for p in sources.values() if not p.is_dir()]
    if missing:
        raise RuntimeError(f"the installed apache-tvm wheel lacks the web runtime sources {missing}: reinstall apache-tvm==0.27.0.post1")
    return sources


# Fixes to TVM 0.27's runtime sources, applied to the staged tree before emcc compiles them: (file,
# text, replacement), each text found exactly once. The paged KV cache's plain aux-data manager (every
# device but CUDA and the CPU: WebGPU, Metal) copies a depth's page indptr / page indices / length
# info for the per-layer sliding window into the same device arrays as the full layers' ones, so a
# model with both kinds of layer (Gemma 3) reads the sliding layers' pages in its global layers once
# the window leaves a page behind. Here the second copy of each per forward goes to spare arrays.
_PLAIN_AUX = "src/runtime/vm/attn_utils.h"
RUNTIME_PATCHES = (
    (_PLAIN_AUX, "    cur_append_length_indptr_device_ = Tensor::Empty({reserved_num_seqs + 1}, dtype_aux_, device);",
     "    for (int d = 0; d < kPagedKVCacheMaxBlockDepth; ++d) {  // mlcpipe: spares for the sliding-window copies\n"
     "      mlcpipe_spare_page_indptr_.push_back(Tensor::Empty({reserved_num_seqs + 1}, dtype_aux_, device));\n"
     "      mlcpipe_spare_page_indices_.push_back(Tensor::Empty({num_total_pages}, dtype_aux_, device));\n"
     "      mlcpipe_spare_length_info_.push_back(Tensor::Empty({3, reserved_num_seqs}, dtype_aux_, device));\n"
     "    }\n"
     "    cur_append_length_indptr_device_ = Tensor::Empty({reserved_num_seqs + 1}, dtype_aux_, device);"),
    (_PLAIN_AUX, "  void ResetAttnAuxDataCopy() final {}",
     "  void ResetAttnAuxDataCopy() final { std::fill(mlcpipe_copies_.begin(), mlcpipe_copies_.end(), 0); }"),
    (_PLAIN_AUX, "    Tensor view = page_indptr_on_depths_device_[depth].CreateView(",
     "    Tensor view = MlcpipeSlot(page_indptr_on_depths_device_, mlcpipe_spare_page_indptr_, 0, depth).CreateView("),
    (_PLAIN_AUX, "    Tensor view = page_indices_on_depths_device_[depth].CreateView(",
     "    Tensor view = MlcpipeSlot(page_indices_on_depths_device_, mlcpipe_spare_page_indices_, 1, depth).CreateView("),
    (_PLAIN_AUX, "    Tensor view = length_info_on_depths_device_[depth].CreateView(",  # last page length, then length info
     "    Tensor view = MlcpipeSlot(length_info_on_depths_device_, mlcpipe_spare_length_info_, 2, depth).CreateView("),
    (_PLAIN_AUX, "  void CommitAttnAuxDataCopy() final {}",
     "  void CommitAttnAuxDataCopy() final {}\n"
     "  // mlcpipe: the first copy of a kind on a depth in a forward goes to `first`, a second to `spare`\n"
     "  Tensor& MlcpipeSlot(std::vector<Tensor>& first, std::vector<Tensor>& spare, int kind, int depth) {\n"
     "    int& copies = mlcpipe_copies_[kind * kPagedKVCacheMaxBlockDepth + depth];\n"
     "    return copies++ == 0 ? first[depth] : spare[depth];\n"
     "  }\n"
     "  std::vector<Tensor> mlcpipe_spare_page_indptr_, mlcpipe_spare_page_indices_, mlcpipe_spare_length_info_;\n"
     "  std::vector<int> mlcpipe_copies_ = std::vector<int>(3 * kPagedKVCacheMaxBlockDepth, 0);"),
)


def _patch_runtime(tree: Path) -> None:
    for rel, text, replacement in RUNTIME_PATCHES:
        path = tree / rel
        source = path.read_text()
        if source.count(text) != (1 if "length_info_on_depths_device_[depth].CreateView(" not in text else 2):
            raise RuntimeError(f"TVM's {rel} changed ({text.strip()[:60]!r} not found as expected): review RUNTIME_PATCHES")
        path.write_text(source.replace(text, replacement))


def _source_files(root: Path):
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d != "__pycache__")
        for name in sorted(filenames):
            if name.endswith((".h", ".cc", ".c", ".hpp", ".inc", ".def")):
                yield Path(dirpath) / name


def _runtime_key(sources: dict[str, Path], version: str) -> str:
    digest = hashlib.sha256()
    digest.update(version.encode())
    digest.update(" ".join(_COMPILE_FLAGS).encode())
    digest.update(repr(RUNTIME_PATCHES).encode())
    for stage, root in [*sorted(sources.items()), ("<own>", _OWN_HEADERS)]:
        for path in _source_files(root):
            digest.update(f"{stage}/{path.relative_to(root)}\0".encode())
            digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def cache_dir() -> Path:
    base = os.environ.get("MLCPIPE_CACHE_DIR")
    if base:
        if os.path.exists(base) and not os.path.isdir(base):
            from ..errors import ConfigError

            raise ConfigError(f"environment MLCPIPE_CACHE_DIR={base!r}: not a directory")
        return Path(base)
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "mlcpipe"


def _stage(tree: Path, sources: dict[str, Path]) -> None:
    """TVM's source layout from the wheels, with our headers laid over it."""
    for stage, src in sources.items():
        shutil.copytree(src, tree / stage, ignore=shutil.ignore_patterns("__pycache__", "*.py", "*.pyc"))
    # dlpack.h sits beside the tvm-ffi headers in the wheel
    (tree / "3rdparty/tvm-ffi/3rdparty/dlpack").mkdir(parents=True)
    (tree / "3rdparty/tvm-ffi/3rdparty/dlpack/include").symlink_to(tree / "3rdparty/tvm-ffi/include")
    shutil.copytree(_OWN_HEADERS, tree, dirs_exist_ok=True, ignore=shutil.ignore_patterns("*.md", "*.cjs", "__pycache__"))
    _patch_runtime(tree)


_RESOLVED: dict[tuple[str, str], list[Path]] = {}  # (emcc, cache dir) -> objects, per process


def runtime_objects() -> list[str]:
    """Paths of TVM's web runtime objects (wasm_runtime, tvmjs_support, webgpu_runtime), compiled
    by emcc on first use and cached (a cold build takes about 2 minutes on 2 cores)."""
    memo_key = (_emcc(), str(cache_dir()))
    if memo_key in _RESOLVED and all(o.is_file() for o in _RESOLVED[memo_key]):
        return [str(o) for o in _RESOLVED[memo_key]]
    version = emcc_version()
    sources = _wheel_sources()
    out_dir = cache_dir() / f"web-runtime-{_runtime_key(sources, version)}"
    objects = [out_dir / f"{unit}.o" for unit in _RUNTIME_UNITS]
    _RESOLVED[memo_key] = objects
    if all(o.is_file() for o in objects):
        return [str(o) for o in objects]
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    with open(out_dir.parent / f"{out_dir.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another process may be building the same runtime
        if all(o.is_file() for o in objects):
            return [str(o) for o in objects]
        with tempfile.TemporaryDirectory(prefix="web-runtime-", dir=out_dir.parent) as tmp:
            tree = Path(tmp) / "tvm"
            _stage(tree, sources)
            build = Path(tmp) / "obj"
            build.mkdir()
            includes = [
                f"-I{tree}",
                f"-I{tree / 'include'}",
                f"-I{tree / '3rdparty/tvm-ffi/include'}",
                f"-I{tree / '3rdparty/tvm-ffi/3rdparty/dlpack/include'}",
                f"-I{tree / '3rdparty/compiler-rt'}",
            ]

            def compile_unit(unit: str) -> None:
                cmd = [_emcc(), *includes, *_COMPILE_FLAGS, "-c", "-o", str(build / f"{unit}.o"), str(tree / "web/emcc" / f"{unit}.cc")]
                _run_emcc(cmd, f"compile TVM's web runtime ({unit}.cc)", cache_dir() / f"{unit}.emcc.log")

            with ThreadPoolExecutor(max_workers=len(_RUNTIME_UNITS)) as pool:
                for future in [pool.submit(compile_unit, unit) for unit in _RUNTIME_UNITS]:
                    future.result()
            if out_dir.exists():
                shutil.rmtree(out_dir)
            build.rename(out_dir)
    return [str(o) for o in objects]


def static_checks(artifact, manifest, names, roles) -> list[tuple]:
    del artifact, manifest, names, roles
    return []


def not_executed(options) -> str:
    del options
    return "webgpu: NOT EXECUTED"

"""CPU: the executable exported as a shared library for this host."""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path


LIBRARY = "lib.so"
SOURCE_FILE = None
PASS_CONFIG: dict = {}
KERNEL_SUFFIX = ""  # host code: the kernel is the PrimFunc itself
# Kernels run on this machine's CPU: the preset's mcpu is resolved for this host, profiles name the
# CPU and its threads, `check` needs no llvm reference kernels, MetaSchedule gets the core count.
HOST_CPU = True
PRESET_OPTIONS: dict = {}  # mlcpipe's own preset keys (not TVM's): key -> what is allowed
WEBGPU_RUNTIME = False  # runs in TVM's runtime, not a WebGPU one
METASCHEDULE = True  # `tune --tuner metaschedule` can search its kernels here
LIBRARY_FORMAT = "ELF"  # the container of LIBRARY (pipeline/library.py checks it before loading)

def pipeline_config(options) -> dict:
    """No PassContext config for the Relax pipeline."""
    del options
    return {}


def check_preset(path, raw, options, given) -> None:
    """An `mtriple` names this machine's CPU and OS: the library is linked here by the system's
    C++ compiler, which links no other (was: g++'s error after the whole compile)."""
    import platform
    import sys

    from ..config import short_repr
    from ..errors import ConfigError

    del options
    triple = raw.get("mtriple")
    if triple is None:
        return
    here = {"arm64": "aarch64", "amd64": "x86_64"}.get(platform.machine(), platform.machine())
    parts = triple.split("-") if isinstance(triple, str) else []
    if not parts or parts[0] != here or not any(part.startswith(sys.platform) for part in parts[1:]):
        where = given.get("mtriple") or f"{path}: field 'mtriple'"
        raise ConfigError(f"{where}: got {short_repr(triple)}; llvm libraries are linked on this machine by its C++ "
                          f"compiler: a triple for {here} {sys.platform} (e.g. {here}-{sys.platform}-gnu), or leave it out")


def compile_context(target_spec):
    """Around `relax.build`: the llvm lowerings our kernels are built with installed first, and the
    host code generated in one LLVM module per aliasing kind (`separate_alias_kinds`)."""
    del target_spec
    install_lowerings()
    return separate_alias_kinds()


@contextlib.contextmanager
def separate_alias_kinds():
    """TVM 0.27's LLVM codegen gives every function of a module the `tirx.noalias` setting of the
    one declared last (by name): with a VM shape function last, no kernel's buffers get `noalias`
    and its compute function is inlined into the packed wrapper, which vectorizes worse. Here the
    functions with `tirx.noalias` and those without are generated as two LLVM modules, the second
    imported into the first; `export_library` links both into the one shared library."""
    import tvm

    build_module = sys.modules["tvm.tirx.build"]
    original = build_module.codegen_build

    def codegen_build(mod, target):
        restricted = {gv: f for gv, f in mod.functions_items() if _noalias(f)}
        if target.kind.name != "llvm" or not restricted or len(restricted) == len(mod.functions):
            return original(mod, target)
        rest = {gv: f for gv, f in mod.functions_items() if gv not in restricted}
        host = original(tvm.IRModule(restricted, attrs=mod.attrs), target)
        host.import_module(original(tvm.IRModule(rest, attrs=mod.attrs), target))
        return host

    build_module.codegen_build = codegen_build
    try:
        yield
    finally:
        build_module.codegen_build = original


def _noalias(func) -> bool:
    return bool(func.attrs and func.attrs.get("tirx.noalias", False))


def install_lowerings() -> None:
    """The intrinsic lowerings llvm kernels are built with: the vectorizable exp
    (schedules/llvm/fast_exp.py). Process-wide (TVM's lowering table is global) and idempotent;
    the build and `mlcpipe tune` call it, importing `schedules` does not."""
    from mlcpipe.schedules.llvm import fast_exp

    fast_exp.install()


def export(executable, target, out_dir: Path, library: str = LIBRARY) -> list[str]:
    del target
    executable.export_library(str(Path(out_dir) / library))
    return [library]


def kernel_source(executable) -> str:
    del executable
    return ""


def static_checks(artifact, manifest, names, roles) -> list[tuple]:
    del artifact, manifest, names, roles
    return []


def not_executed(options) -> str:
    del options
    return "llvm: NOT EXECUTED"

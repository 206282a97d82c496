"""TVM's runtime library driven through `tvm_ffi` alone: no module of the `tvm` Python package is
imported, so an artifact runs where only `libtvm_runtime*.so` and `tvm_ffi` are (a bundle on a
GPU machine without apache-tvm), and the same way where the whole wheel is installed.

The libraries come from $MLCPIPE_TVM_RUNTIME (a folder holding libtvm_runtime.so) or else from the
installed `tvm` package's `lib/` (found, not imported). A device's own runtime libraries (the
backend names them: cuda's libtvm_runtime_cuda.so, after a libcudart found beside it) are loaded
when a device of that kind is first asked for.
"""

from __future__ import annotations

import ctypes
import importlib.util
import json
import os
import struct
from pathlib import Path

import numpy as np
import tvm_ffi

ENV = "MLCPIPE_TVM_RUNTIME"
RPC_SESS_MASK = 128  # device types at or above it live on a TVM RPC session (tvm/rpc/base.py)
CORE = "libtvm_runtime.so"
# runtime.GetDeviceAttr ids (TVM's DeviceAttrKind)
EXIST, DEVICE_NAME, TOTAL_MEMORY, AVAILABLE_MEMORY = 0, 5, 14, 15  # TVM's DeviceAttrKind

_loaded: dict[str, ctypes.CDLL] = {}


class RuntimeUnavailable(RuntimeError):
    """TVM's runtime library (or a device kind's) cannot be found or loaded: one line."""


def library_dir() -> Path:
    """Where libtvm_runtime.so is: $MLCPIPE_TVM_RUNTIME, else the installed tvm package's lib/."""
    given = os.environ.get(ENV)
    if given:
        return Path(given)
    spec = importlib.util.find_spec("tvm")  # a top-level package is located, not imported
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeUnavailable(f"TVM's runtime library not found: install apache-tvm, or set ${ENV} to a folder holding {CORE}")
    return Path(next(iter(spec.submodule_search_locations))) / "lib"


def _load(name: str, optional: bool = False) -> None:
    if name in _loaded:
        return
    path = library_dir() / name
    if not path.is_file():
        if optional:
            return
        raise RuntimeUnavailable(f"{path}: missing (TVM's runtime library; ${ENV} or the installed apache-tvm)")
    try:
        _loaded[name] = ctypes.CDLL(str(path), mode=ctypes.RTLD_GLOBAL)
    except OSError as exc:
        raise RuntimeUnavailable(f"cannot load {path}: {exc}") from None


def load_runtime(libraries: tuple[str, ...] = (), optional: tuple[str, ...] = ()) -> None:
    """Load libtvm_runtime.so, then `optional` libraries where they are in the same folder, then
    `libraries` (idempotent)."""
    _load(CORE)
    for name in optional:
        _load(name, optional=True)
    for name in libraries:
        _load(name)


def global_func(name: str):
    load_runtime()
    return tvm_ffi.get_global_func(name)


# ---- devices --------------------------------------------------------------------------------------

def device(name: str, index: int = 0, libraries: tuple[str, ...] = (), optional: tuple[str, ...] = ()):
    """A local device ("cpu", "cuda", ...), its runtime libraries (`load_runtime`) loaded first."""
    load_runtime(libraries, optional)
    return tvm_ffi.device(name, index)


def _attr(dev, attr: int):
    return global_func("runtime.GetDeviceAttr")(dev.dlpack_device_type(), dev.index, attr)


def exists(dev) -> bool:
    try:
        return bool(_attr(dev, EXIST))
    except Exception:  # noqa: BLE001 - no device API registered for this kind: no such device
        return False


def device_name(dev) -> str:
    return str(_attr(dev, DEVICE_NAME))


def total_memory(dev) -> int:
    return int(_attr(dev, TOTAL_MEMORY))


def available_memory(dev) -> int | None:
    """Bytes the device can still allocate (CUDA: cudaMemGetInfo's free), None where its device
    API does not say."""
    try:
        free = int(_attr(dev, AVAILABLE_MEMORY))
    except Exception:  # noqa: BLE001 - an attribute the device API does not implement
        return None
    return free if free > 0 else None


def is_cpu(dev) -> bool:
    return dev.dlpack_device_type() % RPC_SESS_MASK == 1


def sync(dev) -> None:
    global_func("runtime.Device_StreamSync")(dev, 0)


def num_threads() -> int:
    """Threads of TVM's CPU thread pool."""
    return int(global_func("runtime.NumThreads")())


# ---- tensors --------------------------------------------------------------------------------------

def _np_dtype(dtype: str) -> np.dtype:
    if dtype in ("bfloat16", "float8_e4m3fn", "float8_e5m2"):
        import ml_dtypes

        return np.dtype(getattr(ml_dtypes, dtype))
    return np.dtype(dtype)


def dtype_bytes(dtype) -> float:
    """Bytes per element of a TVM dtype string."""
    return tvm_ffi.dtype(str(dtype)).bits / 8


def shape(*dims: int):
    return tvm_ffi.Shape([int(d) for d in dims])


def empty(dims, dtype: str, dev):
    return global_func("runtime.TVMTensorAllocWithScope")(shape(*dims), tvm_ffi.dtype(str(dtype)), dev, None)


def tensor(array: np.ndarray, dev):
    """A copy of `array` on `dev`."""
    array = np.ascontiguousarray(array)
    out = empty(array.shape, str(array.dtype), dev)
    global_func("runtime.TVMTensorCopyFromBytes")(out, array.ctypes.data_as(ctypes.c_void_p), array.nbytes)
    return out


def to_numpy(t) -> np.ndarray:
    """A host copy of a tensor on any device."""
    out = np.empty(tuple(int(d) for d in t.shape), dtype=_np_dtype(str(t.dtype)))
    global_func("runtime.TVMTensorCopyToBytes")(t, out.ctypes.data_as(ctypes.c_void_p), out.nbytes)
    return out


def view(t, dims, dtype: str | None = None):
    """A view of `t` with another shape (same bytes)."""
    return global_func("runtime.TVMTensorCreateView")(t, shape(*dims), tvm_ffi.dtype(str(dtype or t.dtype)), 0)


def is_tensor(value) -> bool:
    return isinstance(value, tvm_ffi.Tensor)


# ---- modules --------------------------------------------------------------------------------------

def load_module(path: str | Path):
    """A compiled library (.so) loaded into this process."""
    load_runtime()
    return tvm_ffi.load_module(str(path))


def owner(module, name: str):
    """The module among `module` and its imports (at any depth) that defines function `name`."""
    if module.implements_function(name, False):
        return module
    for sub in module.imports:
        found = owner(sub, name)
        if found is not None:
            return found
    return None


def time_evaluator(module, name: str, dev, number: int = 10, repeat: int = 5, min_repeat_ms: int = 0):
    """f(*args) -> per-repeat mean seconds of `number` runs of function `name` of `module` (or of
    a module it imports), timed by TVM's device timer (CUDA events on cuda)."""
    feval = global_func("runtime.RPCTimeEvaluator")(owner(module, name), name, dev.dlpack_device_type(), dev.index, number, repeat,
                                                    min_repeat_ms, 0, 0, 1, 0, "")

    def evaluate(*args) -> list[float]:
        return list(struct.unpack("@" + "d" * repeat, feval(*args)))

    return evaluate


class VirtualMachine:
    """The Relax VM of a library (`vm_load_executable`), initialised for `dev` (and the host CPU
    for shape functions), with pooled allocators, as TVM's own VirtualMachine sets it up."""

    POOLED = 2

    def __init__(self, library, dev):
        self.module = library["vm_load_executable"]()
        devices = [dev] if is_cpu(dev) else [dev, tvm_ffi.device("cpu", 0)]
        init = []
        for d in devices:
            init += [d.dlpack_device_type() % RPC_SESS_MASK, d.index, self.POOLED]
        self.module["vm_initialization"](*init)

    def __getitem__(self, name: str):
        return self.module[name]

    def set_instrument(self, instrument) -> None:
        """f(func, name, before_run, ret, *args) -> 0 around every VM call; None: off."""
        self.module["set_instrument"](instrument)

    def metadata(self) -> dict:
        return json.loads(self.module["_metadata"]())

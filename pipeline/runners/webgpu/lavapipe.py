"""Run TVM-generated WebGPU (WGSL) kernels on this machine: wgpu-py on Vulkan (lavapipe, the CPU).

`run_primfunc(func, target, args)` compiles a scheduled (thread-bound) PrimFunc for webgpu and
launches its kernels as TVM's web runtime does in a browser: kernel order from the host function,
WGSL and function info from the serialized "webgpu" module, buffers bound in order plus a uniform
PODArgs, x grids of 2^16 or more folded into z. `prepare` / `time_calls` repeat and time calls.
TVM's packed-grid bound check is patched (PATCH_PACK_GRID_CHECK) and `enable subgroups;` dropped
for naga (PATCH_SUBGROUPS_ENABLE). Details, the TVM bug, subgroups: docs/webgpu.md.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import tempfile
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import tvm

from ...backends import kinds_with
from ...backends.modules import imported_device_modules
from ...backends.binfmt import BlobReader, ModuleBlob

# Workaround for TVM's `> packGridDimX` (see the module docstring).
PATCH_PACK_GRID_CHECK = True
# Time kernels with WebGPU timestamp queries where the adapter has them (time_calls).
USE_TIMESTAMP_QUERY = True
_PACK_CHECK = re.compile(r"(blockIdx\.z \* gridDim\.x \+ blockIdx\.x\)?) > (podArgs\.packGridDimX)")
# Drop `enable subgroups;` before naga compiles the WGSL (see the module docstring).
PATCH_SUBGROUPS_ENABLE = True
_ENABLE_SUBGROUPS = re.compile(r"^[ \t]*enable[ \t]+subgroups[ \t]*;", re.MULTILINE)
_SUBGROUP_OP = re.compile(r"\bsubgroup[A-Z]\w*\s*\(|@builtin\(\s*subgroup_")
_WORKGROUP_SIZE = re.compile(r"@workgroup_size\((\d+)(?:,\s*(\d+))?(?:,\s*(\d+))?")
# The feature's name: the spec's "subgroups", wgpu-native's "subgroup" (wgpu 0.32).
_SUBGROUP_FEATURES = ("subgroups", "subgroup")
# The GPU backends' PASS_CONFIG (TIR CSE off), as pipeline.build compiles with.
_PASS_CONFIG = {"tirx.disable_cse_tir": True}
_MAX_GRID_X = 1 << 16  # tvmjs folds x extents from this size on into blockIdx.z

_STATE: dict[str, Any] = {}
_COMPILED: dict[str, "_Compiled"] = {}
_PIPELINES: dict[tuple[str, str, tuple], Any] = {}


# ---- device ------------------------------------------------------------------------------------


def _wgpu():
    try:
        import wgpu
    except ImportError:
        raise RuntimeError("the wgpu Python package is missing: pip install wgpu (runs WebGPU kernels on lavapipe)") from None
    return wgpu


def get_device():
    """The process-wide wgpu device (created on first use)."""
    if "device" in _STATE:
        return _STATE["device"]
    wgpu = _wgpu()
    if not os.environ.get("XDG_RUNTIME_DIR"):  # Mesa's WSI complains on stderr without one
        runtime_dir = os.path.join(tempfile.gettempdir(), f"mlcpipe-xdg-{os.getuid()}")
        os.makedirs(runtime_dir, mode=0o700, exist_ok=True)
        os.environ["XDG_RUNTIME_DIR"] = runtime_dir
    try:
        adapter = wgpu.gpu.request_adapter_sync(power_preference="high-performance")
    except Exception as exc:  # wgpu raises its own error types when no Vulkan ICD is present
        adapter = None
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    else:
        reason = "no adapter returned"
    if adapter is None:
        raise RuntimeError(
            f"no WebGPU adapter found by wgpu ({reason}): install mesa-vulkan-drivers (lavapipe), "
            "e.g. with scripts/setup-debian.sh"
        )
    features = [f for f in ("shader-f16", "timestamp-query") if f in adapter.features]
    subgroups = next((f for f in _SUBGROUP_FEATURES if f in adapter.features), None)
    if subgroups is not None:
        features.append(subgroups)
    wanted = ("max-storage-buffer-binding-size", "max-buffer-size", "max-compute-workgroup-storage-size",
              "max-compute-invocations-per-workgroup", "max-compute-workgroup-size-x",
              "max-compute-workgroup-size-y", "max-compute-workgroup-size-z", "max-storage-buffers-per-shader-stage")  # fmt: skip
    limits = {k: adapter.limits[k] for k in wanted if k in adapter.limits}
    device = adapter.request_device_sync(required_features=features, required_limits=limits)
    # "subgroups" in `features` stands for either name of the feature
    features_set = {*features, "subgroups"} if subgroups else set(features)
    _STATE.update(adapter=adapter, device=device, features=features_set)
    return device


def subgroup_sizes() -> tuple[int, int] | None:
    """(smallest, largest) subgroup size the device runs a 256-invocation workgroup with, measured
    once with a probe shader (`@builtin(subgroup_size)`); None where the device has no subgroups."""
    device = get_device()
    if "subgroups" not in _STATE["features"]:
        return None
    if "subgroup_sizes" not in _STATE:
        wgpu = _wgpu()
        code = (
            "@group(0) @binding(0) var<storage, read_write> sizes : array<u32>;\n"
            "@compute @workgroup_size(256, 1, 1)\n"
            "fn main(@builtin(local_invocation_index) i : u32,\n"
            "        @builtin(subgroup_size) n : u32) { sizes[i] = n; }\n"
        )
        usage = wgpu.BufferUsage.STORAGE | wgpu.BufferUsage.COPY_SRC
        buffer = device.create_buffer(size=256 * 4, usage=usage)
        module = device.create_shader_module(code=code)
        stage = {"module": module, "entry_point": "main"}
        pipeline = device.create_compute_pipeline(layout="auto", compute=stage)
        entries = [{"binding": 0, "resource": {"buffer": buffer}}]
        layout = pipeline.get_bind_group_layout(0)
        bind_group = device.create_bind_group(layout=layout, entries=entries)
        encoder = device.create_command_encoder()
        compute = encoder.begin_compute_pass()
        compute.set_pipeline(pipeline)
        compute.set_bind_group(0, bind_group)
        compute.dispatch_workgroups(4)
        compute.end()
        device.queue.submit([encoder.finish()])
        sizes = np.frombuffer(bytes(device.queue.read_buffer(buffer)), dtype=np.uint32)
        _STATE["subgroup_sizes"] = (int(sizes.min()), int(sizes.max()))
    return _STATE["subgroup_sizes"]


def adapter_info() -> dict[str, Any]:
    get_device()
    return dict(_STATE["adapter"].info)


def clear_pipeline_cache() -> None:
    """Forget the compute pipelines built so far (the next calls build them again)."""
    _PIPELINES.clear()


@contextlib.contextmanager
def features_hidden(*names: str):
    """The device as if its adapter lacked the features `names` (e.g. "subgroups"): to check how
    kernels needing them are refused. The pipeline cache is cleared on entry and on exit."""
    get_device()
    saved = _STATE["features"]
    _STATE["features"] = saved - set(names)
    clear_pipeline_cache()
    try:
        yield
    finally:
        _STATE["features"] = saved
        clear_pipeline_cache()


# ---- compile -----------------------------------------------------------------------------------


@dataclass
class _Launch:
    kernel: str
    args: list[Any]  # ("buffer", slot) for buffers, numbers for scalars
    extents: list[int]


@dataclass
class _Compiled:
    host: tvm.tirx.PrimFunc  # host function before MakePackedAPI
    func_info: dict[str, dict[str, Any]]
    shaders: dict[str, str]
    source: str = ""  # all kernels, as inspect_source gives them
    warp_size: int = 1  # the target's thread_warp_size: subgroup width assumed


def _read_webgpu_blob(runtime_module) -> dict[str, str]:
    """{kernel: WGSL} from the serialized "webgpu" module, as the artifact packs it."""
    pack = tvm.get_global_func("runtime.ModulePackImportsToTensor")
    payloads = ModuleBlob.parse(pack(runtime_module).numpy().tobytes()).payloads(b"webgpu")
    if not payloads:
        raise RuntimeError("the compiled module has no webgpu device module (is the function thread-bound?)")
    data = BlobReader(payloads[0])
    # {name: FunctionInfo} then {name: WGSL}; skip the first, read the second
    for _ in range(data.u64()):
        data.str()  # key
        data.str()  # FunctionInfo.name
        data.skip(4 * data.u64())  # arg_types (DLDataType)
        for _ in range(data.u64()):
            data.str()  # launch_param_tags
        data.skip(4 * data.u64())  # arg_extra_tags (int32 enum)
    return {data.str(): data.str() for _ in range(data.u64())}


def _compile(func: tvm.tirx.PrimFunc, target: tvm.target.Target) -> _Compiled:
    key = hashlib.sha256((func.script() + "\0" + json.dumps(target.export(), sort_keys=True, default=str)).encode()).hexdigest()
    if key in _COMPILED:
        return _COMPILED[key]
    if target.kind.name not in kinds_with("WEBGPU_RUNTIME"):
        raise ValueError(f"run_primfunc needs a webgpu target, got {target.kind.name!r}")
    captured: dict[str, tvm.IRModule] = {}

    @tvm.instrument.pass_instrument
    class _CaptureHost:
        def run_before_pass(self, mod, info):
            if info.name.endswith("MakePackedAPI"):
                captured["mod"] = mod

    mod = tvm.IRModule({"main": func.with_attr("global_symbol", "main")})
    with tvm.transform.PassContext(config=_PASS_CONFIG, instruments=[_CaptureHost()]):
        runtime_module = tvm.tirx.build(mod, target=target)
    devices = imported_device_modules(runtime_module)
    if not devices or "mod" not in captured:
        raise RuntimeError("no WebGPU kernel was generated: the PrimFunc must be scheduled (thread-bound) for webgpu")
    host = captured["mod"]["main"]
    compiled = _Compiled(
        host=host,
        func_info=json.loads(devices[0].inspect_source("func_info")),
        shaders=_read_webgpu_blob(runtime_module),
        source=devices[0].inspect_source(""),
        warp_size=int(target.attrs.get("thread_warp_size", 1)),
    )
    _COMPILED[key] = compiled
    return compiled


# ---- host-side interpretation ------------------------------------------------------------------


class _Host:
    """Follows the host function's statements with concrete values; records the kernel launches."""

    def __init__(self, func: tvm.tirx.PrimFunc, args: list[Any]):
        self.env: dict[Any, Any] = {}  # Var -> python number
        self.slots: dict[Any, int] = {}  # buffer Var -> buffer slot (arg index, or temp >= len(args))
        self.temps: list[tuple[int, str]] = []  # (nbytes, dtype) of host-allocated device buffers
        self.launches: list[_Launch] = []
        self.nargs = len(args)
        for index, (param, value) in enumerate(zip(func.params, args)):
            shape = _param_shape(param)
            if shape is None:
                self.env[param] = value.item() if isinstance(value, np.generic | np.ndarray) else value
                continue
            self.slots[param] = index
            for dim, size in zip(shape, value.shape):
                if isinstance(dim, tvm.tirx.Var) and dim not in self.env:
                    self.env[dim] = int(size)
            # each array is its own GPU buffer, contiguous, starting at element 0
            offset = getattr(param, "elem_offset", None)
            if isinstance(offset, tvm.tirx.Var):
                self.env[offset] = 0
            strides = list(getattr(param, "strides", None) or [])
            contiguous = [int(np.prod(value.shape[i + 1 :], dtype=np.int64)) for i in range(value.ndim)]
            for stride, size in zip(strides, contiguous):
                if isinstance(stride, tvm.tirx.Var):
                    self.env[stride] = size

    def eval(self, expr) -> Any:
        if isinstance(expr, int | float):
            return expr
        if isinstance(expr, tvm.tirx.IntImm | tvm.tirx.FloatImm):
            return expr.value
        if isinstance(expr, tvm.tirx.Var) and expr in self.env:
            return self.env[expr]
        from tvm.sym.analyzer import Analyzer

        analyzer = Analyzer()
        for var in tvm.tirx.analysis.undefined_vars(expr):
            if var not in self.env:
                raise RuntimeError(f"host code of the kernel uses {var.name}, which has no value here")
            value = self.env[var]
            const = tvm.tirx.const(value, str(var.dtype)) if hasattr(var, "dtype") else tvm.tirx.const(value)
            analyzer.bind(var, const)
        result = analyzer.simplify(expr)
        if isinstance(result, tvm.tirx.IntImm | tvm.tirx.FloatImm):
            return result.value
        raise RuntimeError(f"cannot evaluate host expression {expr} (got {result})")

    def slot(self, expr) -> int:
        """The buffer slot a kernel's handle argument refers to."""
        if isinstance(expr, tvm.ir.expr.Call) and expr.op.name == "tirx.buffer_data":
            expr = expr.args[0]
        if expr in self.slots:
            return self.slots[expr]
        raise RuntimeError(f"kernel argument {expr} is not a buffer of the function")

    def run(self, stmt) -> None:
        t = tvm.tirx
        if isinstance(stmt, t.SeqStmt):
            for s in stmt.seq:
                self.run(s)
        elif isinstance(stmt, t.Bind | t.LetStmt):
            self.env[stmt.var] = self.eval(stmt.value)
        elif isinstance(stmt, t.DeclBuffer):
            if stmt.data is not None:  # a view of a parameter's (or workspace's) data
                self.slots[stmt.buffer] = self.slot(stmt.data)
        elif isinstance(stmt, t.AllocBuffer):
            buffer = stmt.buffer
            count = 1
            for dim in buffer.shape:
                count *= int(self.eval(dim))
            self.slots[buffer] = self.nargs + len(self.temps)
            self.temps.append((count * np.dtype(_np_dtype(str(buffer.dtype))).itemsize, str(buffer.dtype)))
        elif isinstance(stmt, t.AttrStmt):
            self.run(stmt.body)
        elif isinstance(stmt, t.AssertStmt):
            if not self.eval(stmt.condition):
                raise RuntimeError(f"host assertion failed: {' '.join(str(p) for p in stmt.message_parts)}")
        elif isinstance(stmt, t.IfThenElse):
            if self.eval(stmt.condition):
                self.run(stmt.then_case)
            elif stmt.else_case is not None:
                self.run(stmt.else_case)
        elif isinstance(stmt, t.For):
            start, extent = self.eval(stmt.min), self.eval(stmt.extent)
            step = self.eval(stmt.step) if stmt.step is not None else 1
            for i in range(start, start + extent, step):
                self.env[stmt.loop_var] = i
                self.run(stmt.body)
        elif isinstance(stmt, t.Evaluate):
            self.call(stmt.value)
        else:
            raise RuntimeError(f"host statement {type(stmt).__name__} is not supported by the WebGPU runner")

    def call(self, expr) -> None:
        if not isinstance(expr, tvm.ir.expr.Call):
            return
        if expr.op.name != "tirx.call_ffi_kernel":
            raise RuntimeError(f"host code calls {expr.op.name}, which the WebGPU runner does not model")
        name = expr.args[0].value
        launch_params = list(expr.attrs.launch_params)
        rest = list(expr.args[1:])
        count = len(rest) - len(launch_params)
        values: list[Any] = []
        for arg in rest[:count]:
            if "handle" in str(getattr(arg, "dtype", "")) or (isinstance(arg, tvm.ir.expr.Call) and arg.op.name == "tirx.buffer_data"):
                values.append(("buffer", self.slot(arg)))
            else:
                values.append(self.eval(arg))
        self.launches.append(_Launch(name, values, [int(self.eval(e)) for e in rest[count:]]))


def _param_shape(param):
    try:
        return list(param.shape)
    except AttributeError:
        return None


def _np_dtype(dtype: str):
    if dtype == "bool":
        return np.bool_
    return np.dtype(dtype)


# ---- dispatch ----------------------------------------------------------------------------------


def _pipeline(device, compiled: _Compiled, kernel: str, layout_key: tuple):
    wgpu = _wgpu()
    code = compiled.shaders[kernel]
    if PATCH_PACK_GRID_CHECK:
        code = _PACK_CHECK.sub(r"\1 >= \2", code)
    key = (hashlib.sha256(code.encode()).hexdigest(), kernel, layout_key)
    if key in _PIPELINES:
        return _PIPELINES[key]
    if re.search(r"^\s*enable\s+f16\s*;", code, re.M) and "shader-f16" not in _STATE["features"]:
        raise RuntimeError(f"{kernel}: the WGSL enables f16 but this WebGPU adapter lacks the shader-f16 feature")
    uses_subgroups = _SUBGROUP_OP.search(code) is not None
    if uses_subgroups or _ENABLE_SUBGROUPS.search(code):
        _check_subgroups(kernel, code, compiled.warp_size if uses_subgroups else 0)
        if PATCH_SUBGROUPS_ENABLE:
            code = _ENABLE_SUBGROUPS.sub("", code)
    writes, _ = layout_key
    entries = [
        {"binding": i, "visibility": wgpu.ShaderStage.COMPUTE,
         "buffer": {"type": wgpu.BufferBindingType.storage if w else wgpu.BufferBindingType.read_only_storage}}
        for i, w in enumerate(writes)
    ]  # fmt: skip
    entries.append({"binding": len(writes), "visibility": wgpu.ShaderStage.COMPUTE, "buffer": {"type": wgpu.BufferBindingType.uniform}})
    bind_layout = device.create_bind_group_layout(entries=entries)
    layout = device.create_pipeline_layout(bind_group_layouts=[bind_layout])
    module = device.create_shader_module(code=code)
    pipeline = device.create_compute_pipeline(layout=layout, compute={"module": module, "entry_point": kernel})
    _PIPELINES[key] = (pipeline, bind_layout)
    return _PIPELINES[key]


def _check_subgroups(kernel: str, code: str, warp_size: int) -> None:
    """Refuse a kernel enabling subgroups where the device lacks them and, where it uses
    subgroup operations for `warp_size` lanes (0: none), one this device would run wrongly."""
    if "subgroups" not in _STATE["features"]:
        name = _STATE["adapter"].info.get("device", "") or "this adapter"
        raise RuntimeError(
            f"{kernel}: the WGSL enables subgroups (built for a webgpu target "
            f"with supports_subgroups) but the WebGPU adapter ({name}) lacks the "
            "subgroups feature: rebuild without supports_subgroups"
        )
    smallest, largest = subgroup_sizes()
    if not warp_size or smallest == largest == warp_size:
        return
    match = _WORKGROUP_SIZE.search(code)
    x, y, z = (int(v) if v else 1 for v in match.groups()) if match else (0, 0, 0)
    if y == z == 1 and 0 < x <= min(smallest, warp_size):
        return  # the workgroup is one subgroup: no lane index reaches past it
    lanes = str(smallest) if smallest == largest else f"{smallest}-{largest}"
    raise RuntimeError(
        f"{kernel}: built for {warp_size}-lane subgroups (the target's thread_warp_size) "
        f"but this adapter's subgroups have {lanes} lanes and the workgroup ({x}, {y}, {z}) "
        "is not a single subgroup: its cross-thread reductions would be wrong here"
    )


def _launch_layout(finfo: dict[str, Any]) -> tuple[list[int], list[int]]:
    """(work dim of each launch extent: 0-2 blockIdx.xyz, 3-5 threadIdx.xyz; write flag of each
    buffer argument), read from the launch tags as webgpu.ts reads them."""
    dims: list[int] = []
    writes: list[int] = []
    for tag in finfo["launch_param_tags"]:
        if tag.startswith("blockIdx."):
            dims.append("xyz".index(tag[-1]))
        elif tag.startswith("threadIdx."):
            dims.append(3 + "xyz".index(tag[-1]))
        elif tag.startswith("paramWriteAccess:"):
            writes = json.loads(tag[len("paramWriteAccess:") :])
        else:
            raise RuntimeError(f"{finfo['name']}: launch parameter {tag!r} is not supported by WebGPU")
    return dims, writes


@dataclass
class DeviceArray:
    """An array uploaded once to the wgpu device (a storage buffer), reusable by any kernel call."""

    buffer: Any
    shape: tuple[int, ...]
    dtype: np.dtype

    @property
    def ndim(self) -> int:
        return len(self.shape)


def upload(array: np.ndarray) -> DeviceArray:
    """Copy `array` into a new device storage buffer."""
    wgpu = _wgpu()
    data = np.ascontiguousarray(array).tobytes()
    size = max(4, -(-len(data) // 4) * 4)  # storage bindings are whole 4-byte words
    usage = wgpu.BufferUsage.STORAGE | wgpu.BufferUsage.COPY_SRC | wgpu.BufferUsage.COPY_DST
    buffer = get_device().create_buffer_with_data(data=data + b"\0" * (size - len(data)), usage=usage)
    return DeviceArray(buffer, tuple(int(d) for d in array.shape), array.dtype)


@dataclass
class PreparedCall:
    """One PrimFunc call made ready on the device: arrays uploaded, uniforms written, pipelines
    and bind groups created; `dispatches` are its kernel launches in host order."""

    args: list[Any]  # DeviceArray for buffers, scalars as given
    dispatches: list[tuple[Any, Any, tuple[int, int, int]]]  # (pipeline, bind group, workgroups)
    keep: list[Any]  # uniforms and host-allocated temporaries the bind groups use

    def read(self) -> list[Any]:
        """Every argument read back: numpy arrays for buffers, scalars as given."""
        queue = get_device().queue
        out: list[Any] = []
        for value in self.args:
            if isinstance(value, DeviceArray):
                flat = np.frombuffer(bytes(queue.read_buffer(value.buffer)), dtype=value.dtype, count=int(np.prod(value.shape)))
                out.append(flat.reshape(value.shape).copy())
            else:
                out.append(value)
        return out


def _check_args(func: tvm.tirx.PrimFunc, args: list[Any]) -> None:
    if len(args) != len(func.params):
        raise ValueError(f"{len(args)} arguments for a PrimFunc with {len(func.params)} parameters")
    for param, value in zip(func.params, args):
        shape = _param_shape(param)
        if shape is None:
            continue
        if not isinstance(value, np.ndarray | DeviceArray):
            raise TypeError(f"parameter {param.name}: expected a numpy array, got {type(value).__name__}")
        if value.ndim != len(shape) or str(value.dtype) != str(param.dtype):
            raise ValueError(f"parameter {param.name}: expected {str(param.dtype)} of rank {len(shape)}, got {value.dtype} {value.shape}")
        for dim, size in zip(shape, value.shape):
            if isinstance(dim, tvm.tirx.IntImm) and int(dim) != size:
                raise ValueError(f"parameter {param.name}: expected shape {[str(d) for d in shape]}, got {value.shape}")


def prepare(func: tvm.tirx.PrimFunc, target: tvm.target.Target, args: list[Any]) -> PreparedCall:
    """Compile `func` (cached) and set up one call of it with `args` (as for run_primfunc; a
    DeviceArray is used as it is, a numpy array is uploaded into a new buffer)."""
    wgpu = _wgpu()
    target = tvm.target.Target(target) if not isinstance(target, tvm.target.Target) else target
    _check_args(func, args)
    compiled = _compile(func, target)
    host = _Host(compiled.host, args)
    host.run(compiled.host.body)
    device = get_device()

    args = [upload(a) if isinstance(a, np.ndarray) else a for a in args]
    buffers = {i: a.buffer for i, a in enumerate(args) if isinstance(a, DeviceArray)}
    usage = wgpu.BufferUsage.STORAGE | wgpu.BufferUsage.COPY_SRC | wgpu.BufferUsage.COPY_DST
    for offset, (nbytes, _) in enumerate(host.temps):
        buffers[len(args) + offset] = device.create_buffer(size=max(4, -(-nbytes // 4) * 4), usage=usage)

    keep: list[Any] = [b for slot, b in buffers.items() if slot >= len(args)]
    dispatches = []
    for launch in host.launches:
        finfo = compiled.func_info[launch.kernel]
        dims, writes = _launch_layout(finfo)
        arg_types = finfo["arg_types"]
        buffer_args = [i for i, t in enumerate(arg_types) if t == "handle"]
        pod_args = [i for i, t in enumerate(arg_types) if t != "handle"]
        if len(launch.args) != len(arg_types) or len(launch.extents) != len(dims) or len(writes) != len(buffer_args):
            raise RuntimeError(f"{launch.kernel}: host launch does not match its function info {finfo}")
        work = [1] * 6
        for dim, extent in zip(dims, launch.extents):
            work[dim] = extent
        if work[2] != 1:
            raise RuntimeError(f"{launch.kernel}: blockIdx.z is reserved for internal use by TVM's WebGPU runtime")
        pack_x = work[0]
        while work[0] >= _MAX_GRID_X:  # fold x into z, as webgpu.ts does
            work[0] = work[0] // 2 if work[0] % 2 == 0 else (work[0] + 1) // 2
            work[2] *= 2
        pod = np.zeros(len(pod_args) + 1, np.int32)
        for slot, i in enumerate(pod_args):
            value, dtype = launch.args[i], arg_types[i]
            if dtype.startswith("int"):
                pod[slot] = np.int32(int(value))
            elif dtype.startswith("uint"):
                pod.view(np.uint32)[slot] = np.uint32(int(value))
            elif dtype.startswith("float"):
                pod.view(np.float32)[slot] = np.float32(value)
            else:
                raise RuntimeError(f"{launch.kernel}: cannot pass a {dtype} argument to a WebGPU kernel")
        pod.view(np.uint32)[len(pod_args)] = np.uint32(pack_x)
        pod_bytes = pod.tobytes() + b"\0" * (-pod.nbytes % 16)
        uniform = device.create_buffer_with_data(data=pod_bytes, usage=wgpu.BufferUsage.UNIFORM)
        keep.append(uniform)

        pipeline, bind_layout = _pipeline(device, compiled, launch.kernel, (tuple(writes), len(pod_args)))
        entries = []
        for binding, i in enumerate(buffer_args):
            kind, slot = launch.args[i]
            buf = buffers[slot]
            entries.append({"binding": binding, "resource": {"buffer": buf, "offset": 0, "size": buf.size}})
        entries.append({"binding": len(buffer_args), "resource": {"buffer": uniform, "offset": 0, "size": pod.nbytes}})
        bind_group = device.create_bind_group(layout=bind_layout, entries=entries)
        dispatches.append((pipeline, bind_group, (work[0], work[1], work[2])))
    return PreparedCall(args, dispatches, keep)


def _encode(calls: list[PreparedCall], query_set=None):
    """A command buffer dispatching every launch of `calls` in order, one compute pass each (the
    pass boundary orders each launch after the previous); with `query_set`, timestamps 0 and 1
    at the beginning of the first pass and the end of the last."""
    device = get_device()
    encoder = device.create_command_encoder()
    dispatches = [d for call in calls for d in call.dispatches]
    for index, (pipeline, bind_group, work) in enumerate(dispatches):
        writes = {}
        if query_set is not None and index == 0:
            writes["beginning_of_pass_write_index"] = 0
        if query_set is not None and index == len(dispatches) - 1:
            writes["end_of_pass_write_index"] = 1
        compute = encoder.begin_compute_pass(timestamp_writes={"query_set": query_set, **writes} if writes else None)
        compute.set_pipeline(pipeline)
        compute.set_bind_group(0, bind_group)
        compute.dispatch_workgroups(*work)
        compute.end()
    return encoder, len(dispatches)


def timer_kind() -> str:
    """"timestamp-query" when the adapter has it (and USE_TIMESTAMP_QUERY), else "wall"."""
    get_device()
    return "timestamp-query" if USE_TIMESTAMP_QUERY and "timestamp-query" in _STATE["features"] else "wall"


def time_calls(calls: list[PreparedCall]) -> tuple[int, int]:
    """Run `calls` back to back in one command buffer and wait for them; returns (start_ns,
    duration_ns).

    What is timed: only the dispatch of the already prepared launches (arrays, uniforms,
    pipelines and bind groups are made by `prepare`, nothing is compiled or uploaded here).
    With "timestamp-query" (timer_kind()): the device's timestamps at the beginning of the first
    compute pass and at the end of the last, i.e. the kernels plus the barriers between them;
    start_ns is on the device's clock. Otherwise: host wall time (perf_counter_ns) from the
    submit until a 4-byte read-back queued behind the work has returned, after earlier work
    (uploads) has drained; this also counts the submission and that read-back.
    """
    wgpu = _wgpu()
    device = get_device()
    if timer_kind() == "timestamp-query":
        query_set = device.create_query_set(type=wgpu.QueryType.timestamp, count=2)
        encoder, count = _encode(calls, query_set)
        if not count:
            raise RuntimeError("nothing to time: the calls launch no kernel")
        resolved = device.create_buffer(size=16, usage=wgpu.BufferUsage.QUERY_RESOLVE | wgpu.BufferUsage.COPY_SRC)
        encoder.resolve_query_set(query_set, 0, 2, resolved, 0)
        device.queue.submit([encoder.finish()])
        begin, end = np.frombuffer(bytes(device.queue.read_buffer(resolved)), dtype=np.uint64)
        return int(begin), int(end - begin)
    encoder, count = _encode(calls)
    if not count:
        raise RuntimeError("nothing to time: the calls launch no kernel")
    command_buffer = encoder.finish()
    _wait_for_queue()
    start = time.perf_counter_ns()
    device.queue.submit([command_buffer])
    _wait_for_queue()
    return start, time.perf_counter_ns() - start


def _wait_for_queue() -> None:
    """Block until everything submitted so far has run: read back a 4-byte buffer (the copy is
    queued after that work; wgpu 0.32's on_submitted_work_done_sync fails on its callback type)."""
    if "fence" not in _STATE:
        _STATE["fence"] = get_device().create_buffer(size=4, usage=_wgpu().BufferUsage.COPY_SRC)
    get_device().queue.read_buffer(_STATE["fence"])


def run_primfunc(func: tvm.tirx.PrimFunc, target: tvm.target.Target, args: list[Any]) -> list[Any]:
    """Run a scheduled PrimFunc's WebGPU kernels on wgpu; returns the arguments after the run.

    `args` follow `func.params`: numpy arrays for buffers (shapes bind the symbolic dims), Python
    or numpy scalars for scalar parameters. Every buffer is read back (outputs filled, inputs
    unchanged unless the kernel writes them); scalars are returned as given.
    """
    call = prepare(func, target, args)
    encoder, _ = _encode([call])
    get_device().queue.submit([encoder.finish()])
    return call.read()


def kernel_names(func: tvm.tirx.PrimFunc, target: tvm.target.Target, args: list[Any]) -> list[str]:
    """The device kernels `func` launches for these arguments, in launch order."""
    compiled = _compile(func, target)
    host = _Host(compiled.host, args)
    host.run(compiled.host.body)
    return [launch.kernel for launch in host.launches]


class LavapipeKernels:
    """(name, args) -> args: an artifact's scheduled TIR kernel compiled to WGSL and run on Mesa
    lavapipe through wgpu (f16 included), for f16 artifacts where Dawn has no shader-f16 here."""

    adapter = "lavapipe (wgpu; kernels from tir/scheduled.json: no Dawn adapter with shader-f16 here)"

    def __init__(self, artifact, manifest):
        from pathlib import Path

        self._scheduled = tvm.ir.load_json((Path(artifact) / "tir" / "scheduled.json").read_text())
        self._target = tvm.target.Target(manifest["target"])
        self.adapter_info = adapter_info()

    def __call__(self, name: str, args: list) -> list:
        return run_primfunc(self._scheduled[name], self._target, args)

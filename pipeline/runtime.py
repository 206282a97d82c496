"""Load an artifact + weights and generate with the paged KV cache, on TVM's runtime library alone
(pipeline/device/tvm_runtime.py: no compiler), here or over TVM RPC; `open_engine` and
`kernel_runner` give a WebGPU artifact the WebGPU runtime's (pipeline/runners/webgpu/) instead."""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from .artifact import RUN_FIELDS, RUNTIME_CONFIG, check_output_file, read_manifest, verified_library
from .backends import backend
from .device import RunOptions, check_cpu_flags, cpu_note, device, tvm_runtime as rt
from .errors import ArtifactError
from .generation import Generation, available_memory


class Engine(Generation):
    """A compiled model with its weights, ready to prefill and decode one sequence at a time."""

    def __init__(self, artifact: str | Path, weights: str | Path | None = None, seed: int = 0, remote=None,
                 prefill_chunk: int | None = None):
        """`remote`: a TVM RPC session (`pipeline.rpc.open_session`): the library is uploaded and
        loaded there, the weights go to its device, and every step runs on it."""
        self._open_artifact(artifact, prefill_chunk)
        self.remote = remote
        self._remote_funcs: dict = {}
        self._remote_shapes: dict = {}
        kind = self.manifest["target"]["kind"]
        started = time.perf_counter()
        library = verified_library(self.artifact, self.manifest)  # a corrupt library can crash the process
        if remote is None:
            self.device = device(kind).local_device()  # first: where the kind cannot run here, the reason (metal: a Mac)
            check_cpu_flags(self.manifest, self.artifact)
            self.lib = rt.load_module(library)
        else:
            from .rpc import describe, remote_device, upload_library

            self.device = remote_device(remote, kind, describe(remote))
            self.lib = upload_library(remote, library, describe(remote))
        self.vm = rt.VirtualMachine(self.lib, self.device)
        arrays = self._load_params(weights, seed)
        if remote is None:
            self.params = [rt.tensor(array, self.device) for array in arrays]
            self._params_arg = self.params  # what the VM functions take as their parameter tuple
        else:
            self.params = []  # the weights live on the remote, in the Array object `_params_arg`
            self._params_arg = self._remote_param_array(arrays)
        self.load_seconds = time.perf_counter() - started
        self._embed, self._prefill, self._decode = (self.vm[n] for n in ("embed", "prefill", "decode"))
        self.kv_cache = None

    # ---- weights ---------------------------------------------------------------------------
    def _load_params(self, weights, seed: int) -> list[np.ndarray]:
        """The weights as host arrays in the manifest's parameter order, checked against it."""
        weights = self._weights_or_params(weights)
        if str(weights) == "synthetic":
            arrays = self._synthetic_params(seed)
        else:
            from .tensor_cache import check_parameters
            from .weights import load_stored_weights

            check_parameters(Path(weights), self.manifest["parameters"])  # before any shard is read
            arrays = load_stored_weights(Path(weights))
        return [arrays[spec["name"]] for spec in self.manifest["parameters"]]

    def _remote_param_array(self, arrays: list[np.ndarray]):
        """The parameters as an Array object on the remote. A tensor sent as an argument reaches
        the remote as a DLTensor view whose shape lives in the RPC call's scratch memory, so
        `ffi.Array(*tensors)` would keep dangling views: each tensor is copied into TVM's tensor
        cache over there instead (one upload at a time), and the Array is taken from the cache."""
        update = self.global_func("vm.builtin.tensor_cache.update")
        remove = self.global_func("vm.builtin.tensor_cache.remove")
        prefix = f"mlcpipe.{id(self):x}."
        names = [prefix + spec["name"] for spec in self.manifest["parameters"]]
        for name, array in zip(names, arrays):
            uploaded = rt.tensor(array, self.device)
            update(name, uploaded, True)
            del uploaded  # frees the remote upload; the cache has its own copy
        array = self.global_func("vm.builtin.param_array_from_cache_by_name_unpacked")(*names)
        for name in names:  # the Array holds the tensors now
            remove(name)
        return array

    def _synthetic_params(self, seed: int) -> dict[str, np.ndarray]:
        from .config import parse_model_config
        from .weights import synthetic_stored

        cfg = parse_model_config(self.config["model_config"], str(self.artifact / RUNTIME_CONFIG))
        return synthetic_stored(cfg, self.quant, seed)

    # ---- local or remote runtime objects ---------------------------------------------------
    def global_func(self, name: str):
        """A global function of the runtime the model runs in (the remote's over RPC)."""
        if self.remote is None:
            return rt.global_func(name)
        if name not in self._remote_funcs:  # each lookup is a network round trip
            self._remote_funcs[name] = self.remote.get_function(name)
        return self._remote_funcs[name]

    def shape(self, *dims: int):
        """An ffi.Shape living where the model runs (shapes cannot be sent over RPC)."""
        if self.remote is None:
            return rt.shape(*dims)
        if dims not in self._remote_shapes:
            self._remote_shapes[dims] = self.global_func("ffi.Shape")(*dims)
        return self._remote_shapes[dims]

    def reset(self) -> None:
        if self.remote is None:  # the memory it goes into, before allocating
            if device(self.manifest["target"]["kind"]).HOST_MEMORY:
                have, where = available_memory(), "this machine has"
            else:  # a GPU: what its device API says is free now (the weights already there)
                have, where = rt.available_memory(self.device), f"{rt.device_name(self.device)} has"
            need = self.kv_cache_bytes()
            if have is not None and need > have:
                raise ArtifactError(f"{self.artifact}: its KV cache ({self.context_window} tokens, context_window_size) needs "
                                    f"{need / 2**30:.1f} GiB; {where} {have / 2**30:.1f} GiB available (rebuild with a "
                                    "smaller context_window_size)")
        create = self.vm["create_paged_kv_cache"]
        sizes = (1, self.context_window, self.prefill_chunk, int(self.config["page_size"]), 0)
        self.kv_cache = create(*(self.shape(n) for n in sizes))
        self.global_func("vm.builtin.kv_state_add_sequence")(self.kv_cache, 0)

    def _step(self, kind: str, tokens: np.ndarray) -> np.ndarray:
        return rt.to_numpy(self.forward(kind, tokens)).reshape(-1)

    def forward(self, kind: str, tokens: np.ndarray):
        """One forward pass of `tokens` ("prefill" chunk or "decode"); the last token's logits
        as a tensor on the device (the KV cache advanced)."""
        if self.kv_cache is None:  # the VM would dereference a null KV cache: a crash, not an error
            raise ValueError(f"{self.artifact}: no sequence to {kind}: reset() starts one (generate() does)")
        func = self._prefill if kind == "prefill" else self._decode
        ids = rt.tensor(tokens.astype("int32"), self.device)
        embed = self._embed(ids, self._params_arg)
        embed = rt.view(embed, (1, len(tokens), embed.shape[-1]))
        begin = self.global_func("vm.builtin.kv_state_begin_forward")
        end = self.global_func("vm.builtin.kv_state_end_forward")
        begin(self.kv_cache, self.shape(0), self.shape(len(tokens)))
        out = func(embed, self.kv_cache, self._params_arg)
        if self.remote is None:
            logits, self.kv_cache = out
        else:  # the (logits, kv_cache) tuple stays on the remote: take its items there
            get_item = self.global_func("ffi.ArrayGetItem")
            logits, self.kv_cache = get_item(out, 0), get_item(out, 1)
        end(self.kv_cache)
        return logits

    def _item(self, out, index: int):
        """Item `index` of a tuple a VM function returned (over RPC it stays on the remote)."""
        return out[index] if self.remote is None else self.global_func("ffi.ArrayGetItem")(out, index)

    def _sample(self, logits, sampling, penalty, uniform: float) -> int:
        vocab = logits.size
        put = lambda array: rt.tensor(np.ascontiguousarray(array), self.device)  # noqa: E731
        x = put(logits.astype(np.float32).reshape(1, vocab))
        if penalty is not None:
            rows = np.zeros(len(penalty.token_ids), dtype=np.int32)
            args = (x, put(np.int32([0])), put(rows), put(penalty.token_ids), put(penalty.token_cnt), put(penalty.penalties))
            if self.remote is None:
                self.vm["apply_penalty_inplace"](*args)
            else:  # TVM's RPC cannot return a tensor that is one of the call's arguments (the in-place
                # result): the function's one kernel is called directly, which returns nothing
                self.lib.get_function("sampler_apply_penalty", query_imports=True)(*args)
        probs = self.vm["softmax_with_temperature"](rt.view(x, (1, 1, vocab)), put(np.float32([sampling.temperature])))
        ordered = self.vm["argsort_probs"](rt.view(probs, (1, vocab)))
        token = self.vm["sample_with_top_p"](self._item(ordered, 0), self._item(ordered, 1), put(np.float32([uniform])),
                                             put(np.int32([0])), put(np.float32([sampling.top_p])))
        return int(rt.to_numpy(token)[0])


def check_logits_path(path: str | Path) -> Path:
    """The --save-logits path, refused (ValueError) unless its directory exists."""
    return check_output_file(path, "--save-logits", "logits.npy")


def save_logits(path: str | Path, steps: Sequence[np.ndarray]) -> Path:
    """Write the logits of every generated step as one float32 array (steps, vocab_size) in .npy
    format (artifact.write_file_atomic: a temp file beside `path`, renamed over it)."""
    import io

    from .artifact import write_file_atomic

    path = check_logits_path(path)
    buffer = io.BytesIO()
    np.save(buffer, np.stack([np.asarray(s, dtype=np.float32).reshape(-1) for s in steps]))
    return write_file_atomic(path, buffer.getvalue())


def library_kernel_runner(artifact: Path, manifest: dict, remote=None):
    """(kernel name, args) -> args after the call: one kernel of the artifact's shipped library on
    its device, here or on a TVM RPC session's (for `mlcpipe check`)."""
    library = verified_library(Path(artifact), manifest)  # a corrupt library can crash the process
    kind = manifest["target"]["kind"]
    if remote is None:
        dev = device(kind).local_device()
        check_cpu_flags(manifest, artifact)
        lib = rt.load_module(library)
    else:
        from .rpc import describe, remote_device, stops_reported, upload_library

        dev = remote_device(remote, kind, describe(remote))
        lib = upload_library(remote, library, describe(remote))

    def call(name: str, args: list) -> list:
        tensors = [rt.tensor(a, dev) if isinstance(a, np.ndarray) else a for a in args]
        lib.get_function(name, query_imports=True)(*tensors)
        rt.sync(dev)
        return [rt.to_numpy(t) if rt.is_tensor(t) else t for t in tensors]

    if remote is None:
        return call
    note = cpu_note(manifest)

    def run(name: str, args: list) -> list:
        with stops_reported(remote, f"running kernel {name}", note):
            return call(name, args)

    return run


def _refuse_options(kind: str, options: RunOptions) -> None:
    """RPC is TVM's runtime; adapters and the browser are WebGPU runtimes': one of them per kind."""
    if backend(kind).WEBGPU_RUNTIME and options.remote is not None:
        raise ValueError("--rpc runs TVM's runtime (llvm, cuda, metal artifacts); a webgpu artifact runs in a WebGPU "
                         "runtime here: choose it with --adapter (gles, swiftshader, gpu) or --browser")
    if not backend(kind).WEBGPU_RUNTIME and (options.adapter or options.browser):
        raise ValueError("--adapter / --browser choose a WebGPU runtime: they apply to webgpu artifacts only")


def open_engine(artifact: Path, weights, seed: int, options: RunOptions):
    """The model ready to generate: TVM's runtime here or over RPC, or for a WebGPU artifact the
    WebGPU runtime the options choose (Dawn, Chromium). The artifact's manifest is checked first."""
    kind = read_manifest(artifact, RUN_FIELDS)["target"]["kind"]
    _refuse_options(kind, options)
    if backend(kind).WEBGPU_RUNTIME:
        from .runners.webgpu.dawn import WebGPUEngine

        return WebGPUEngine(artifact, weights, seed=seed, adapter=options.adapter, browser=options.browser,
                            prefill_chunk=options.prefill_chunk, timed_adapter=options.timed, console=options.console)
    return Engine(artifact, weights, seed=seed, remote=options.remote, prefill_chunk=options.prefill_chunk)


def kernel_runner(artifact: Path, manifest: dict, options: RunOptions):
    """(kernel name, args) -> args after the call: one shipped kernel on the artifact's device (the
    remote's over RPC), or None when it cannot run here. WebGPU: the lib.wasm's kernels in Dawn;
    f16 kernels need an adapter with shader-f16, and where none is chosen and the one found lacks
    it, they run on Mesa lavapipe through wgpu, compiled from the artifact's scheduled TIR by the
    same codegen (runners.webgpu.lavapipe.LavapipeKernels)."""
    kind = manifest["target"]["kind"]
    _refuse_options(kind, options)
    if not backend(kind).WEBGPU_RUNTIME:
        if options.remote is None and not device(kind).runs_here():
            return None
        return library_kernel_runner(Path(artifact), manifest, options.remote)
    from .errors import RunnerError
    from .runners.webgpu.dawn import KernelRunner

    try:
        return KernelRunner(artifact, options.adapter, browser=options.browser)
    except RunnerError as exc:
        if "shader-f16" not in str(exc) or options.adapter not in (None, "auto") or options.browser:
            raise
        from .runners.webgpu.lavapipe import LavapipeKernels

        return LavapipeKernels(artifact, manifest)

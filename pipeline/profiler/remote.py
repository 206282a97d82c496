"""Profile an artifact that runs on a TVM RPC server (`mlcpipe profile --rpc HOST:PORT`).

The VM instrument cannot work over RPC, so the low-overhead mode runs the real generation on the
remote, each step timed by this machine's clock (RPC round trips included; the metrics come from
it), and the per-kernel mode records the kernel call sequence locally on llvm and times every call
on the remote with TVM's `time_evaluator`, on kernels compiled from the artifact's scheduled TIR
and uploaded as a library of their own. Details: docs/profiler.md.
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import tvm

from ..errors import ArtifactError
from ..runtime import Engine
from .kernel_map import map_kernels
from .measure import (
    RecordedCall,
    RecordedTensor,
    kernel_params,
    record_calls,
    run_once,
    uncounted_params,
)
from .core import Workload, alternate, document, kernel_table, metrics, weight_bytes

NUMBER = 5  # launches averaged per time_evaluator measurement


def kernel_library(artifact: Path, manifest: dict, out_dir: Path) -> Path:
    """Compile every kernel of the artifact's tir/scheduled.json for its target into a library
    whose root module holds the kernels (so a remote time_evaluator finds them by name)."""
    from ..backends import backend

    path = artifact / "tir" / "scheduled.json"
    if not path.is_file():
        raise ArtifactError(f"{artifact}: tir/scheduled.json missing (artifact built by an older mlcpipe? rebuild it)")
    scheduled = tvm.ir.load_json(path.read_text())
    mod = tvm.IRModule({gv: f.with_attr("global_symbol", gv.name_hint) for gv, f in scheduled.functions_items()})
    kind = manifest["target"]["kind"]
    spec = SimpleNamespace(target=manifest["target"], options=manifest.get("target_options") or {}, kind=kind)
    target = tvm.target.Target(manifest["target"])
    out_dir.mkdir(parents=True, exist_ok=True)
    impl = backend(kind)
    with target, impl.compile_context(spec), tvm.transform.PassContext(config=impl.PASS_CONFIG):
        executable = tvm.compile(mod, target=target)
    # a file name of its own: the shipped library is loaded on the remote already
    library = f"mlcpipe-kernels{Path(impl.LIBRARY).suffix}"
    impl.export(executable, spec, out_dir, library=library)
    return out_dir / library


def round_trip_ms(session, repeat: int = 20) -> float:
    """Median wall time of one trivial remote call."""
    make_shape = session.get_function("ffi.Shape")
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        make_shape(1)
        times.append((time.perf_counter() - start) * 1e3)
    return float(np.median(times))


class _RemoteCalls:
    """Recorded calls made ready on the remote: arguments uploaded once per kernel, position and
    shape (int32 ones also per data), one time evaluator per kernel, one timing per distinct
    call and run (calls with the same kernel and arguments are the same launch)."""

    def __init__(self, module, device, scheduled_params: dict[str, list[str]]):
        self.module, self.device, self.params = module, device, scheduled_params
        self.arrays: dict[tuple, tvm.runtime.Tensor] = {}
        self.timers: dict[str, Callable] = {}
        self.cache: dict[tuple, float] = {}

    @staticmethod
    def key(kernel: str, call: RecordedCall) -> tuple:
        return (kernel, tuple(
            (a.shape, a.dtype, a.data.tobytes() if a.dtype == "int32" else None) if isinstance(a, RecordedTensor) else a
            for a in call.args
        ))  # fmt: skip

    def args(self, kernel: str, call: RecordedCall) -> list:
        if kernel in self.params and len(call.args) != len(self.params[kernel]):
            raise ArtifactError(f"{kernel} (replaying llvm {call.kernel}): {len(call.args)} recorded arguments, the kernel takes {len(self.params[kernel])}")
        out = []
        for pos, arg in enumerate(call.args):
            if not isinstance(arg, RecordedTensor):
                out.append(arg)
                continue
            array_key = (kernel, pos, arg.shape, arg.dtype, arg.data.tobytes() if arg.dtype == "int32" else None)
            if array_key not in self.arrays:
                self.arrays[array_key] = tvm.runtime.tensor(arg.data, self.device)
            out.append(self.arrays[array_key])
        return out

    def time_ms(self, kernel: str, call: RecordedCall, run: int) -> float:
        key = (run, self.key(kernel, call))
        if key not in self.cache:
            if kernel not in self.timers:
                self.timers[kernel] = self.module.time_evaluator(kernel, self.device, number=NUMBER, repeat=1)
            self.cache[key] = float(self.timers[kernel](*self.args(kernel, call)).mean) * 1e3
        return self.cache[key]


def profile_remote(engine: Engine, record_engine: Engine, workload: Workload = Workload(),
                   progress: Callable[[str, int, int], None] | None = None) -> dict:
    """Profile `engine` (an Engine on an RPC session); `record_engine`: a local llvm Engine of the
    same model and quantization, whose kernel call sequence the per-kernel mode times."""
    from ..rpc import describe, upload_library

    if engine.remote is None:
        raise ValueError("profile_remote needs an Engine opened with remote=<RPC session>")
    manifest, llvm_manifest = engine.manifest, record_engine.manifest
    for field in ("config_hash", "quantization"):
        if manifest.get(field) != llvm_manifest.get(field):
            raise ArtifactError(f"{record_engine.artifact}: field '{field}' is {llvm_manifest.get(field)!r}, the artifact's is {manifest.get(field)!r}: both must come from the same model config and quantization")
    where = describe(engine.remote)
    prompt, gen_len, warmup = workload.prompt(engine), workload.gen_len, workload.warmup
    calls = record_calls(record_engine, workload)
    mapping = map_kernels(sorted({c.kernel for c in calls}), llvm_manifest, manifest)
    kernels = [mapping[c.kernel] for c in calls]
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="mlcpipe-rpc-kernels-") as tmp:
        module = upload_library(engine.remote, kernel_library(engine.artifact, manifest, Path(tmp)), where)
    kernels_load_ms = (time.perf_counter() - started) * 1e3
    params = kernel_params(engine.artifact, manifest)
    pool = _RemoteCalls(module, engine.device, params)
    rtt = round_trip_ms(engine.remote)
    low_steps: list[dict] = []
    steps: list[dict] = []
    samples: list[dict] = []
    tokens: list[int] = []

    def low_overhead(run: int) -> None:  # the real run on the remote
        nonlocal tokens
        tokens = run_once(engine, prompt, gen_len, None, None, run, low_steps)

    def per_kernel(run: int) -> None:  # device time of every recorded call, laid end to end
        steps.extend(_timed_steps(pool, calls, kernels, run, warmup, workload.prompt_len, samples))

    alternate(warmup, workload.runs, [("low-overhead", low_overhead), ("per-kernel", per_kernel)], progress)
    low = [{"mode": "low-overhead", "run": s["run"], "warmup": s["run"] < warmup, "phase": s["phase"], "step": s["step"],
            "tokens": s["tokens"], "start_ms": s["start_ns"] / 1e6, "ms": s["ns"] / 1e6,
            **({"first_token_ms": s["first_token_ns"] / 1e6} if "first_token_ns" in s else {})} for s in low_steps]
    per_kernel_total = sum(s["ms"] for s in steps if not s["warmup"])
    moved, shapes = _moved_bytes(kernels, calls, uncounted_params(params, manifest))
    roles = {k["name"]: k.get("role", "other") for k in manifest["kernels"]}
    method = {
        "kind": "rpc",
        "remote": where,
        "rpc_round_trip_ms": rtt,
        "metrics": "low-overhead mode: wall time on this machine of each forward step of the real generation on the "
                   "remote, RPC round trips included (a few per step; see rpc_round_trip_ms)",
        "samples": f"per-kernel mode: remote time_evaluator (device time, mean of {NUMBER} launches) of every call of the "
                   "llvm call sequence, on kernels compiled from the artifact's tir/scheduled.json; samples laid end to end",
        "call_sequence": f"recorded on llvm ({record_engine.artifact}): {len(calls)} kernel calls per generation",
        "kernel_map": {k: v for k, v in sorted(mapping.items()) if k != v},
        "kernel_library_ms": kernels_load_ms,
    }
    return document(engine, f"{manifest['target']['kind']} device {engine.device} of {where}", workload.config(),
                    metrics(engine, workload.prompt_len, low_steps, per_kernel_total, warmup, weight_bytes(manifest)), tokens,
                    kernel_table(roles, roles, moved, shapes), {"steps": low + steps, "samples": samples}, {"remote": where}, method)


def _timed_steps(pool: _RemoteCalls, calls: list[RecordedCall], kernels: list[str], run: int, warmup: int, prompt_len: int,
                 samples: list[dict]) -> list[dict]:
    """One per-kernel run: every recorded call timed on the remote (`pool`), in call order, laid
    end to end; its samples appended to `samples`; the step records returned."""
    groups: list[tuple[str, int, list[int]]] = []
    for i, call in enumerate(calls):
        if not groups or groups[-1][:2] != (call.phase, call.step):
            groups.append((call.phase, call.step, []))
        groups[-1][2].append(i)
    steps, clock = [], 0.0
    for phase, step, indices in groups:
        step_start = clock
        for i in indices:
            ms = pool.time_ms(kernels[i], calls[i], run)
            samples.append({"kernel": kernels[i], "parent": calls[i].parent, "phase": phase, "step": step, "run": run,
                            "warmup": run < warmup, "start_ms": clock, "ms": ms})
            clock += ms
        steps.append({"mode": "per-kernel", "run": run, "warmup": run < warmup, "phase": phase, "step": step,
                      "tokens": prompt_len if phase == "prefill" else 1, "start_ms": step_start, "ms": clock - step_start})
    return steps


def _moved_bytes(kernels: list[str], calls: list[RecordedCall], skip: dict[str, set[int]]) -> tuple[dict, dict]:
    """(kernel, phase) -> bytes of its counted tensor arguments, and -> their shapes, from the first such call."""
    moved: dict[tuple[str, str], int] = {}
    shapes: dict[tuple[str, str], list] = {}
    for kernel, call in zip(kernels, calls):
        if (kernel, call.phase) not in moved:
            moved[(kernel, call.phase)] = sum(
                int(np.prod(a.shape)) * tvm.runtime.DataType(a.dtype).bits // 8
                for pos, a in enumerate(call.args) if isinstance(a, RecordedTensor) and pos not in skip.get(kernel, set()))
            shapes[(kernel, call.phase)] = [list(a.shape) if isinstance(a, RecordedTensor) else None for a in call.args]
    return moved, shapes

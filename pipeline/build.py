"""config -> model -> quantize -> passes -> schedules -> target build -> artifact directory."""

from __future__ import annotations

import json
import math
import os
import shutil
import time
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

import numpy as np
import tvm
from tvm import relax

from mlcpipe.schedules import schedule_pass

from .artifact import ARTIFACT_FORMAT, MANIFEST, RUNTIME_CONFIG, TENSOR_CACHE, ArtifactError, atomic_directory, check_not_inside, file_digests, write_json
from .backends import backend
from .kernel_info import kernel_roles, kv_cache_kernel_slots, launch_config
from .config import ModelConfig, artifacts_root, kv_cache_bytes
from .mlc_contract import MLC_MODEL_TYPES, mlc_chat_config
from .model.create import create_model
from .model.sampler import attach_sampler
from .passes import run_pipeline
from .passes.function_table import DEFAULT_MAX_BATCH_SIZE, AttachMetadata, add_kv_cache_alias
from .passes.kv_cache_fixes import WINDOW_ATTR
from .quantization import Quantization
from .reference import KERNELS as REFERENCE_KERNELS
from .reference import LIBRARY as REFERENCE_LIBRARY
from .reference import build_reference
from .tuning import TuningDB, default_db_path
from .targets import TargetSpec, required_cpu_flags

TIR_SNAPSHOTS = {"fuse-tir": "unscheduled.json", "schedule": "scheduled.json"}


def primfuncs_only(mod: tvm.IRModule) -> tvm.IRModule:
    return tvm.IRModule({gv: f for gv, f in mod.functions_items() if isinstance(f, tvm.tirx.PrimFunc)})


def default_output(config: ModelConfig, quant: Quantization, target: TargetSpec) -> Path:
    """artifacts/<model>-<quant>-<target> ($MLCPIPE_ARTIFACTS overrides the artifacts dir)."""
    return artifacts_root() / f"{config.name}-{quant.name}-{target.name}"


def export_model(config: ModelConfig, quant: Quantization, target: tvm.target.Target):
    """(Relax module, named parameters): the model's functions plus `create_tir_paged_kv_cache`
    (MLC-LLM's name for `create_paged_kv_cache`, same kernels)."""
    with target:
        model = create_model(config, quant, target)
        mod, named_params, _ = model.export_tvm(spec=model.get_default_spec(), allow_extern=True)
    mod = attach_sampler(mod, target, config.vocab_size, max_batch_size(config))  # MLC-LLM's sampler functions
    if config.sliding_window:  # the window TVM's KV cache kernels are made with (passes/kv_cache_fixes.py)
        mod = mod.with_attr(WINDOW_ATTR, config.sliding_window)
    return add_kv_cache_alias(mod), named_params


def max_batch_size(config: ModelConfig) -> int:
    """Sequences one batched call may take, as the library's metadata states it (MLC-LLM's
    runtime caps its batch at this): the config's `max_batch_size` if it has one, else MLC's
    default."""
    return int(getattr(config, "max_batch_size", None) or DEFAULT_MAX_BATCH_SIZE)


def variable_bounds(config: ModelConfig) -> dict[str, int]:
    """Upper bounds of the functions' symbolic dims (as MLC-LLM's compile states them)."""
    return {
        "seq_len": config.prefill_chunk_size,
        "batch_size": max_batch_size(config),
        "total_seq_len": config.context_window_size,
    }


def model_metadata(config: ModelConfig, quant: Quantization, named_params) -> dict[str, Any]:
    """What `_metadata` returns, less `memory_usage` (added by the pass after memory planning):
    the fields MLC-LLM's ModelMetadata::FromJSON reads (cpp/metadata/model.cc)."""
    return {
        "model_type": MLC_MODEL_TYPES[config.architecture],
        "quantization": quant.name,
        "context_window_size": config.context_window_size,
        "sliding_window_size": -1,
        "attention_sink_size": -1,
        "prefill_chunk_size": config.prefill_chunk_size,
        "tensor_parallel_shards": 1,
        "pipeline_parallel_stages": 1,
        "disaggregation": False,
        "kv_state_kind": "kv_cache",
        "max_batch_size": max_batch_size(config),
        "params": [
            {"name": name, "shape": [int(s) for s in param.shape], "dtype": str(param.dtype),
             "preprocs": [], "pipeline_stages": [0]}
            for name, param in named_params
        ],
        "kv_cache": {
            "num_hidden_layers": config.num_hidden_layers,
            "num_attention_heads": config.num_attention_heads,
            "num_key_value_heads": config.num_key_value_heads,
            "head_dim": config.head_dim,
        },
    }


def _arg_record(param) -> dict[str, Any]:
    try:
        shape = [int(s) if isinstance(s, tvm.tirx.IntImm) else str(s) for s in param.shape]
        return {"shape": shape, "dtype": str(param.dtype)}
    except AttributeError:  # a handle or scalar parameter, not a typed buffer
        return {"shape": None, "dtype": None}


def _kernel_records(mod: tvm.IRModule) -> list[dict[str, Any]]:
    return [
        {"name": gv.name_hint, "args": [_arg_record(p) for p in func.params]}
        for gv, func in sorted(mod.functions_items(), key=lambda item: item[0].name_hint)
        if isinstance(func, tvm.tirx.PrimFunc)
    ]


def package_versions() -> dict[str, str]:
    out = {"tvm": tvm.__version__}
    for dist in ("apache-tvm", "apache-tvm-ffi", "mlcpipe"):
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            out[dist] = "unknown"
    return out


def runtime_config(config: ModelConfig, quant: Quantization) -> dict[str, Any]:
    """The artifact's mlc-chat-config.json (MLC-LLM's format plus mlcpipe's runtime fields; no
    tokenizer files beside it: those go with the converted weights)."""
    return mlc_chat_config(config, quant)


def keep_params(artifact: Path, tmp: Path, expected: list[tuple[str, list[int], str]], log=print) -> None:
    """A rebuild without --weights: hard-link the artifact's `params/` into the new one (`tmp`)
    when its tensors are exactly `expected` (name, shape, dtype); else refuse, one line."""
    params = Path(artifact) / "params"
    if not params.is_dir() or not any(params.iterdir()):
        return
    try:
        cache = json.loads((params / TENSOR_CACHE).read_text())
        stored = [(r["name"], [int(d) for d in r["shape"]], str(r["dtype"])) for shard in cache["records"] for r in shard["records"]]
    except (OSError, ValueError, KeyError, TypeError):
        stored = None
    if stored != expected:
        why = "unreadable tensor-cache.json" if stored is None else next(
            (f"tensor {a[0]!r} is {a[1]} {a[2]}, this build needs {b[1]} {b[2]}" for a, b in zip(stored, expected) if a != b),
            f"{len(stored)} tensors, this build needs {len(expected)}")
        raise ArtifactError(f"{params}: the existing weights do not fit this build ({why}); pass --weights to convert new ones, "
                            "or move params/ away to build without weights")
    for dirpath, _, filenames in os.walk(params):
        dest = tmp / "params" / Path(dirpath).relative_to(params)
        dest.mkdir(parents=True, exist_ok=True)
        for name in filenames:
            try:
                os.link(Path(dirpath) / name, dest / name)
            except OSError:
                shutil.copy2(Path(dirpath) / name, dest / name)
    log(f"[mlcpipe] keeping {params} (no --weights given; its {len(stored)} tensors fit this build)")


def build(
    config: ModelConfig,
    quant: Quantization,
    target: TargetSpec,
    output: Path | None = None,
    dump_ir: bool = False,
    weights: str | None = None,
    log=print,
    manifest_extra: dict[str, Any] | None = None,
    tuning_db: Path | None = None,
) -> Path:
    """Compile `config` at `quant` (its scheme: ModelConfig.scheme) for `target` into an artifact directory; return its path.

    With `weights` (a Hugging Face directory or "synthetic") the converted weights are written
    to `<artifact>/params/` as well; without, a rebuild keeps the artifact's existing `params/`
    when they fit the new build's parameters (else a one-line error: nothing is dropped).
    `output` must be new, empty or an mlcpipe artifact (`artifact.check_writable`); it is
    locked while building and replaced in one step. Nothing is left behind if any step fails. The manifest's
    `files` maps every other file of the artifact to its SHA-256 and size (`mlcpipe verify`);
    `manifest_extra` adds keys to the manifest (e.g. the nightly cache key). Schedules take
    their knobs from the tuning database (`tuning_db`, default artifacts/tuning/<target>.json
    when it exists); the manifest records each kernel's rule, knobs and their source.
    """
    output = Path(output) if output else default_output(config, quant, target)
    if weights is not None and str(weights) != "synthetic":
        check_not_inside(output, Path(weights), "--output", "--weights")
    db = TuningDB.load(tuning_db or default_db_path(target.name))
    tuning = db.table(target.target)  # its records checked before anything is built
    started = time.perf_counter()
    with atomic_directory(output, kind="artifact") as tmp:
        _make_room(config, quant, output, tmp, weights, log)
        log(f"[mlcpipe] exporting {config.name} ({quant.name}) for {target.name} {target.target}")
        kv = kv_cache_bytes(config.as_dict(), config.context_window_size, np.dtype(quant.model_dtype).itemsize)
        log(f"[mlcpipe] its KV cache at context_window_size {config.context_window_size}: {kv / 2**20:.1f} MiB (run allocates it whole)")
        compiled = _compile(config, quant, target, db, tuning, tmp, dump_ir, log, started)
        build_seconds = time.perf_counter() - started
        write_json(tmp / RUNTIME_CONFIG, compiled.chat_config)
        if weights is not None:
            from .weights import convert_weights

            convert_weights(config, quant, weights, tmp / "params", log=log, final=output / "params")
        write_json(tmp / MANIFEST, _manifest(config, quant, target, compiled, db if tuning else None, build_seconds, manifest_extra, tmp))
    log(f"[mlcpipe] built {output} in {build_seconds:.1f}s")
    return output


def _make_room(config: ModelConfig, quant: Quantization, output: Path, tmp: Path, weights: str | None, log) -> None:
    """Before the minutes of compiling: room for the library, its sources and references (the
    margin) and the converted weights where they are written too; without `weights`, the
    existing artifact's params/ kept when they fit (keep_params)."""
    from .weights import check_free_space, expected_parameters

    expected = expected_parameters(config, quant)
    weight_bytes = sum(math.prod(shape) * np.dtype(dtype).itemsize for _, shape, dtype in expected) if weights is not None else 0
    check_free_space(tmp, weight_bytes, "the artifact and its weights" if weights is not None else "the artifact")
    if weights is None:
        keep_params(output, tmp, [(n, list(shape), dtype) for n, shape, dtype in expected], log)


@dataclass
class _Compiled:
    """What the compile phases leave for the manifest."""

    mod: tvm.IRModule  # after the last phase
    named_params: list
    kernels: list[dict[str, Any]]  # the fused kernels' records, with role, launch and schedule
    kv_slots: list
    schedules: dict[str, Any]  # kernel -> the rule and knobs it got
    chat_config: dict[str, Any]


def _compile(config: ModelConfig, quant: Quantization, target: TargetSpec, db: TuningDB, tuning: dict, tmp: Path, dump_ir: bool, log,
             started: float) -> _Compiled:
    """Export, the pass phases (fused kernels and TIR snapshots recorded on the way), the
    target's codegen and export into `tmp`, and the reference kernels of `mlcpipe check`."""
    tvm_target = target.tvm_target()
    mod, named_params = export_model(config, quant, tvm_target)
    phases: dict[str, float] = {"export": time.perf_counter() - started}  # seconds per build phase
    mark = [time.perf_counter()]

    def _timed(phase: str) -> None:
        now = time.perf_counter()
        phases[phase] = round(phases.get(phase, 0.0) + now - mark[0], 2)
        mark[0] = now

    fused: list[dict[str, Any]] = []
    kv_slots: list = []
    snapshots: dict[str, tvm.IRModule] = {}
    schedules: dict[str, Any] = {}
    (tmp / "tir").mkdir()

    def _record(phase: str, phase_mod: tvm.IRModule) -> None:
        _timed(phase)
        if phase == "fuse-tir":
            kv_slots.extend(kv_cache_kernel_slots(phase_mod))
            roles = kernel_roles(phase_mod, [name for name, _ in named_params])
            fused.extend({**k, "role": roles[k["name"]]} for k in _kernel_records(phase_mod))
        if phase in TIR_SNAPSHOTS:  # the kernels before/after scheduling (`mlcpipe check` builds on them)
            snapshots[phase] = primfuncs_only(phase_mod)
            (tmp / "tir" / TIR_SNAPSHOTS[phase]).write_text(tvm.ir.save_json(snapshots[phase]))

    log("[mlcpipe] running passes: " + " -> ".join(("fuse-high-level", "lower", "fuse-tir", "schedule", "finalize")))
    if tuning:
        log(f"[mlcpipe] tuning database {db.path}: {len(tuning)} tuned kernels for this target")
    target_backend = backend(target.kind)
    with tvm.transform.PassContext(config=target_backend.pipeline_config(target.options)):
        mod = run_pipeline(
            mod, tvm_target, dump_dir=tmp / "ir" if dump_ir else None, on_phase=_record,
            schedule=schedule_pass(target.kind, tuning, schedules.__setitem__),
            after_memory_plan=AttachMetadata(model_metadata(config, quant, named_params), variable_bounds(config)),
        )
    _timed("finalize")  # the passes after the last recorded phase
    log("[mlcpipe] generating code")
    with tvm_target, target_backend.compile_context(target), tvm.transform.PassContext(config=target_backend.PASS_CONFIG):
        executable = relax.build(mod, tvm_target, relax_pipeline=None)
    target_backend.export(executable, target, tmp)
    if target_backend.SOURCE_FILE:
        (tmp / target_backend.SOURCE_FILE).write_text(target_backend.kernel_source(executable))
    _timed("codegen")
    log("[mlcpipe] compiling the reference kernels of `mlcpipe check`")
    chat_config = runtime_config(config, quant)
    build_reference(snapshots["fuse-tir"], [gv.name_hint for gv in snapshots["schedule"].get_global_vars()],
                    chat_config["model_config"], quant.model_dtype,
                    target_backend.HOST_CPU, tmp / "reference")
    launch = launch_config(mod)
    for kernel in fused:
        kernel["launch"] = launch.get(kernel["name"])
        kernel["schedule"] = schedules.get(kernel["name"])
    _timed("reference")
    log("[mlcpipe] build phases: " + ", ".join(f"{name} {seconds:.1f} s" for name, seconds in phases.items()))
    return _Compiled(mod, named_params, fused, kv_slots, schedules, chat_config)


def _manifest(config: ModelConfig, quant: Quantization, target: TargetSpec, compiled: _Compiled, db: TuningDB | None, build_seconds: float,
              manifest_extra: dict[str, Any] | None, tmp: Path) -> dict[str, Any]:
    """The artifact's manifest.json (written last: `files` digests every other file of `tmp`);
    `db`: the tuning database the build applied, if it had records for the target."""
    target_backend = backend(target.kind)
    return {
        "format": ARTIFACT_FORMAT,
        "model": config.name,
        "display_name": config.display_name,
        "quantization": quant.name,
        "target_name": target.name,
        "target": target.target,
        "target_options": target.options,
        **({"cpu_flags": flags} if (flags := required_cpu_flags(target.target)) is not None else {}),
        "versions": package_versions(),
        "config_hash": config.config_hash(),
        "library": target_backend.LIBRARY,
        "kernel_source": target_backend.SOURCE_FILE,
        "reference": {"library": REFERENCE_LIBRARY, "kernels": REFERENCE_KERNELS},
        "functions": sorted(gv.name_hint for gv, f in compiled.mod.functions_items() if isinstance(f, relax.Function)),
        "kernels": compiled.kernels,
        "kv_cache_kernels": compiled.kv_slots,
        "tuning_db": {"path": str(db.path), "sha256": db.digest(), "tuned_kernels": sum(
            1 for r in compiled.schedules.values() if r and r["source"] == "tuning")} if db is not None else None,
        "parameters": [
            {"name": name, "shape": [int(s) for s in param.shape], "dtype": param.dtype}
            for name, param in compiled.named_params
        ],
        "build_seconds": round(build_seconds, 2),
        **(manifest_extra or {}),
        "files": file_digests(tmp),
    }

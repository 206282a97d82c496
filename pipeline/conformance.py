"""Kernel conformance: every kernel of an artifact run on its target with seeded random inputs of
its real shapes, compared against the same (unscheduled) PrimFunc on llvm, and against NumPy for
the fused dequantize-NT_matmul kernels. In the spirit of llama.cpp's test-backend-ops."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import numpy as np
import tvm

from .artifact import RUN_FIELDS, RUNTIME_CONFIG, read_json, read_manifest, verified, verified_library
from .config import short_repr
from .errors import ArtifactError
from .kernel_inputs import kernel_args, symbolic_dims
from .quantization import QUANTIZATIONS, TOLERANCE
from .roles import WEIGHT_ROLES

# Kernels the KV cache carries but mlcpipe's runtime never calls: tree attention (speculative
# decoding) and page copies (sequence forking / compaction).
_NOT_RANDOMIZABLE = re.compile(r"^(batch_tree_attn|tree_attn|copy_single_page|compact_kv_copy|tir_kv_cache_debug)")


@dataclasses.dataclass
class KernelResult:
    kernel: str
    role: str
    sizes: str
    status: str  # pass, FAIL, skip, compiled, static
    max_abs: float | None = None
    max_rel: float | None = None
    note: str = ""


@dataclasses.dataclass
class CheckReport:
    artifact: str
    target: str
    executed: bool
    results: list[KernelResult]
    summary: str

    @property
    def ok(self) -> bool:
        return not any(r.status == "FAIL" for r in self.results)

    def table(self) -> str:
        head = ("Kernel", "Role", "Sizes", "Max abs err", "Max rel err", "Status", "Note")
        rows = [
            (r.kernel, r.role, r.sizes, _fmt(r.max_abs), _fmt(r.max_rel), r.status, r.note)
            for r in self.results
        ]
        widths = [max(len(str(x)) for x in col) for col in zip(head, *rows)]
        line = lambda cells: "| " + " | ".join(str(c).ljust(w) for c, w in zip(cells, widths)) + " |"  # noqa: E731
        sep = "|" + "|".join("-" * (w + 2) for w in widths) + "|"
        return "\n".join([line(head), sep, *(line(r) for r in rows)])


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.2e}"


def _load_tir(artifact: Path, manifest: dict, name: str) -> tvm.IRModule:
    if not (artifact / "tir" / name).is_file():
        raise ArtifactError(f"{artifact}: tir/{name} missing (artifact built by an older mlcpipe? rebuild it)")
    return tvm.ir.load_json(verified(artifact, manifest, f"tir/{name}", "files").read_text())


def kernel_pattern(pattern: str | None) -> re.Pattern | None:
    """--kernels as a compiled regex; ValueError (one line) when it is not one."""
    if pattern is None:
        return None
    try:
        return re.compile(pattern)
    except re.error as exc:
        raise ValueError(f"--kernels {short_repr(pattern)}: not a regular expression ({exc})") from None


_COMPILED: dict[str, tvm.runtime.Module] = {}


def run_compiled(func: tvm.tirx.PrimFunc, target: tvm.target.Target, device, args: list, key: str | None = None) -> list:
    """Compile `func` for `target` (cached under `key`), run it on `device`, return every arg."""
    lib = _COMPILED.get(key) if key else None
    if lib is None:
        lib = tvm.compile(tvm.IRModule({"main": func.with_attr("global_symbol", "main")}), target=target)
        if key:
            _COMPILED[key] = lib
    tensors = [tvm.runtime.tensor(a, device) if isinstance(a, np.ndarray) else a for a in args]
    lib["main"](*tensors)
    device.sync()
    return [t.numpy() if isinstance(t, tvm.runtime.Tensor) else t for t in tensors]


def run_on_llvm(func: tvm.tirx.PrimFunc, args: list, key: str | None = None) -> list:
    from .targets import load_target

    return run_compiled(func, load_target("llvm").tvm_target(), tvm.cpu(), args, key=f"llvm:{key}" if key else None)


def _attention_counterparts(config: dict, dtype: str) -> dict[str, tvm.tirx.PrimFunc]:
    """GPU paged-attention kernel name -> TVM's CPU kernel with the same signature and contract
    (the one the llvm build runs, checked end to end against the NumPy Llama)."""
    from tvm.relax.frontend.nn.llm import kv_cache as kc

    cfg = config["model_config"]
    h_kv, h_q, d = cfg["num_key_value_heads"], cfg["num_attention_heads"], cfg["head_dim"]
    rope = cfg.get("rope_scaling") or {}
    return {
        "batch_prefill_paged_kv": kc._attention_prefill_cpu(h_kv, h_q, d, dtype, False, rope),
        "batch_decode_paged_kv": kc._attention_decode_cpu(h_kv, h_q, d, dtype, False, rope),
        "batch_prefill_ragged_kv": kc._attention_prefill_ragged_cpu(h_kv, h_q, d, d, dtype, rope),
        "tir_attention_merge_state": kc._merge_state_inplace_cpu(dtype),
        "batch_prefill_paged_kv_sliding_window": kc._attention_prefill_cpu(h_kv, h_q, d, dtype, True, rope),
        "batch_decode_paged_kv_sliding_window": kc._attention_decode_cpu(h_kv, h_q, d, dtype, True, rope),
    }


def numpy_dequant_matmul(name: str, quant: str, args: list[np.ndarray]) -> np.ndarray | None:
    """NumPy result of a fused_dequantize..._NT_matmul[_cast][_add] kernel, or None if its
    argument list is not (q_weight, q_scale, x[, residual], out)."""
    scheme = QUANTIZATIONS[quant]
    if not hasattr(scheme, "dequantize_weight") or len(args) not in (4, 5):
        return None
    q_weight, q_scale, x = args[0], args[1], args[2]
    if q_weight.dtype != np.uint32:
        return None
    w = scheme.dequantize_weight(q_weight, q_scale)
    out = args[-1]
    y = x.astype(np.float32) @ w.T
    if out.dtype != np.float32:
        y = y.astype(out.dtype)
    if len(args) == 5 and "add" in name:
        y = (y + args[3]).astype(out.dtype)
    return y.astype(out.dtype)


def _copy(args: list) -> list:
    return [a.copy() if isinstance(a, np.ndarray) else a for a in args]


def _model_dtype(manifest: dict) -> str:
    return QUANTIZATIONS[manifest["quantization"]].model_dtype


def _is_thread_bound(func: tvm.tirx.PrimFunc) -> bool:
    return "thread_binding" in func.script() or "launch_thread" in func.script()


def _compare(got: list, want: list, tolerance: dict[str, float] | None = None) -> tuple[float, float, bool]:
    worst_abs, worst_rel, ok = 0.0, 0.0, True
    for g, w in zip(got, want):
        if not isinstance(w, np.ndarray):
            continue
        if g.dtype.kind in "iu":
            if not np.array_equal(g, w):
                return float("inf"), float("inf"), False
            continue
        g32, w32 = g.astype(np.float64), w.astype(np.float64)
        if not np.all(np.isfinite(g32) == np.isfinite(w32)):
            return float("inf"), float("inf"), False
        finite = np.isfinite(w32)
        diff = np.abs(g32 - w32)[finite]
        if diff.size == 0:
            continue
        scale = max(np.abs(w32[finite]).max(), 1e-6)
        err_abs, err_rel = float(diff.max()), float(diff.max() / scale)
        worst_abs, worst_rel = max(worst_abs, err_abs), max(worst_rel, err_rel)
        ok &= err_rel <= {**TOLERANCE, **(tolerance or {})}.get(str(g.dtype), TOLERANCE["float32"])
    return worst_abs, worst_rel, ok


def _skip_reason(name: str, reference: tvm.tirx.PrimFunc) -> str:
    """Why `check` does not run kernel `name` ("" when it does)."""
    if _NOT_RANDOMIZABLE.match(name):
        return "tree attention / page copies: unused by the mlcpipe runtime"
    if _is_thread_bound(reference):
        return "no llvm reference for this GPU-only kernel"
    return ""


def check_artifact(artifact: str | Path, sizes: tuple[int, ...] = (1, 7), pattern: str | None = None, seed: int = 0, progress=None,
                   options=None) -> CheckReport:
    """Every kernel of the artifact's shipped library run on its device (the backend's
    `kernel_runner`: here, over TVM RPC, or in a WebGPU runtime, per `options`), or the backend's
    static checks where it cannot run."""
    from .backends import RunOptions, backend

    artifact = Path(artifact)
    regex = kernel_pattern(pattern)
    manifest = read_manifest(artifact, RUN_FIELDS)
    kind = manifest["target"]["kind"]
    options = options or RunOptions()
    device = backend(kind)
    # what is checked is what ships: the library (and the files the checks read) as built, or nothing
    verified_library(artifact, manifest)
    if manifest.get("kernel_source"):
        verified(artifact, manifest, manifest["kernel_source"], "kernel_source")
    roles = {k["name"]: k.get("role", "other") for k in manifest["kernels"]}
    unscheduled = _load_tir(artifact, manifest, "unscheduled.json")
    scheduled = _load_tir(artifact, manifest, "scheduled.json")
    chat_config = read_json(verified(artifact, manifest, RUNTIME_CONFIG, "files"), RUNTIME_CONFIG)
    # GPU attention kernels are checked against llvm's (kernels on the host CPU are llvm's)
    counterparts = _attention_counterparts(chat_config, _model_dtype(manifest)) if not device.HOST_CPU else {}
    model_config = chat_config["model_config"]
    heads = {"H": model_config["num_attention_heads"], "D": model_config["head_dim"]}
    results: list[KernelResult] = []
    names = sorted(gv.name_hint for gv in scheduled.get_global_vars())
    if regex is not None:
        names = [n for n in names if regex.search(n)]
    if not names:
        raise ArtifactError(f"--kernels {short_repr(pattern)}: matches none of the {len(scheduled.get_global_vars())} kernels of {artifact}")
    run = device.kernel_runner(artifact, manifest, options)
    if run is None:
        rows = device.static_checks(artifact, manifest, names, roles)
        results = [KernelResult(name, role, "-", status, note=note) for name, role, status, note in rows]
        return CheckReport(str(artifact), kind, False, results, device.not_executed(options))
    skips = {name: _skip_reason(name, counterparts.get(name, unscheduled[name])) for name in names}
    if all(skips.values()):  # a check that runs nothing proves nothing
        if hasattr(run, "close"):
            run.close()
        which = f"--kernels {short_repr(pattern)}: matches only" if pattern else f"{artifact}: has only"
        raise ArtifactError(f"{which} kernels check skips ({', '.join(names[:3])}{', ...' if len(names) > 3 else ''}): "
                            "no kernel would run")
    try:
        for index, name in enumerate(names):
            if progress:
                progress(index, len(names), name)
            func_u = unscheduled[name]
            role = roles.get(name, "other")
            if skips[name]:
                results.append(KernelResult(name, role, "-", "skip", note=skips[name]))
                continue
            reference = counterparts.get(name, func_u)
            for size in sizes if symbolic_dims(func_u) else (sizes[0],):
                args, label = kernel_args(func_u, size, seed=seed, heads=heads)
                if not symbolic_dims(func_u):
                    label = "static"
                want = run_on_llvm(reference, _copy(args), key=f"{artifact}:{name}")
                note = "llvm ref: TVM CPU kernel" if name in counterparts else ""
                if role in WEIGHT_ROLES and "dequantize" in name:
                    expected = numpy_dequant_matmul(name, manifest["quantization"], args)
                    if expected is not None:
                        _, rel_np, ok_np = _compare([expected], [want[-1]])
                        note = f"llvm vs numpy {rel_np:.1e}" + ("" if ok_np else " MISMATCH")
                        if not ok_np:
                            results.append(KernelResult(name, role, label, "FAIL", None, rel_np, note))
                            continue
                try:
                    got = run(name, _copy(args))
                except Exception as exc:  # a kernel that cannot run is a failure, reported
                    results.append(KernelResult(name, role, label, "FAIL", note=f"{type(exc).__name__}: {str(exc).splitlines()[0][:120] if str(exc) else ''}"))
                    continue
                err_abs, err_rel, ok = _compare(got, want, getattr(run, "tolerance", None))
                results.append(KernelResult(name, role, label, "pass" if ok else "FAIL", err_abs, err_rel, note))
    finally:
        if hasattr(run, "close"):
            run.close()
    executed = sum(r.status in ("pass", "FAIL") for r in results)
    passed = sum(r.status == "pass" for r in results)
    skipped = sum(r.status == "skip" for r in results)
    where = kind
    if options.remote is not None:
        from .rpc import describe

        where = f"{kind} on {describe(options.remote)}"
    elif getattr(run, "adapter", None):
        where = f"{kind} on {run.adapter} ({run.adapter_info.get('description') or run.adapter_info.get('device', '')})"
    summary = f"{where}: executed {executed} kernel runs, {passed} passed, {executed - passed} failed, {skipped} kernels skipped"
    return CheckReport(str(artifact), kind, True, results, summary)


def report_json(report: CheckReport) -> str:
    return json.dumps({"artifact": report.artifact, "target": report.target, "executed": report.executed,
                       "summary": report.summary, "results": [dataclasses.asdict(r) for r in report.results]}, indent=2)

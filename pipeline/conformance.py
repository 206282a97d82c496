"""Kernel conformance: every kernel of an artifact run on its target with seeded random inputs of
its real shapes, compared against the reference the artifact ships (its kernels before
scheduling, compiled for a portable llvm CPU: pipeline/reference.py), and against NumPy for the
fused dequantize-NT_matmul kernels. Run side only: TVM's runtime library, no compiler. In the
spirit of llama.cpp's test-backend-ops."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import numpy as np

from .artifact import RUN_FIELDS, RUNTIME_CONFIG, read_json, read_manifest, verified, verified_library
from .config import short_repr
from .device import tvm_runtime as rt
from .errors import ArtifactError
from .kernel_inputs import kernel_args, kernel_args_bytes, symbolic_dims
from .quantization import TOLERANCE, Quantization, quantization
from .roles import WEIGHT_ROLES

# /proc/cpuinfo flags a reference library's llvm CPU needs (pipeline/targets.py PORTABLE_MCPU)
REFERENCE_CPU_FLAGS = {"x86-64-v3": ("avx2", "fma", "f16c", "bmi2", "movbe"), "generic": ()}


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


def kernel_pattern(pattern: str | None) -> re.Pattern | None:
    """--kernels as a compiled regex; ValueError (one line) when it is not one."""
    if pattern is None:
        return None
    try:
        return re.compile(pattern)
    except re.error as exc:
        raise ValueError(f"--kernels {short_repr(pattern)}: not a regular expression ({exc})") from None


class Reference:
    """An artifact's reference record (reference/kernels.json: every kernel's signature, and its
    reference or why it is skipped) and kernels (reference/kernels.so: its digest checked here,
    loaded at the first run once this CPU is known to run it)."""

    def __init__(self, artifact: Path, manifest: dict):
        record = manifest.get("reference")
        if not isinstance(record, dict) or not {"library", "kernels"} <= set(record):
            raise ArtifactError(f"{artifact}: no reference kernels (built by an older mlcpipe? rebuild it)")
        data = read_json(verified(artifact, manifest, record["kernels"], "reference"), "reference record")
        if not isinstance(data, dict) or not isinstance(data.get("kernels"), dict) or not isinstance(data.get("target"), dict):
            raise ArtifactError(f"{artifact / record['kernels']}: not a reference record of `mlcpipe build`; rebuild the artifact")
        self.kernels: dict[str, dict] = data["kernels"]
        self.target = data["target"]
        self._path = verified(artifact, manifest, record["library"], "reference")  # a corrupt library can crash the process
        self._library = None

    def signature(self, name: str) -> dict:
        return self.kernels[name]["signature"]

    def run(self, name: str, args: list) -> list:
        """Kernel `name`'s reference on this CPU; every argument after the call."""
        if self._library is None:
            _check_cpu(self.target, self._path)
            self._library = rt.load_module(self._path)
        device = rt.device("cpu")
        tensors = [rt.tensor(a, device) if isinstance(a, np.ndarray) else a for a in args]
        self._library[name](*tensors)
        return [rt.to_numpy(t) if rt.is_tensor(t) else t for t in tensors]


def _check_cpu(target: dict, library: Path) -> None:
    """One line when this CPU cannot run the reference library's code (x86-64-v3: AVX2 ...)."""
    needed = REFERENCE_CPU_FLAGS.get(str(target.get("mcpu")))
    if needed is None:
        raise ArtifactError(f"{library}: built for llvm CPU {short_repr(target.get('mcpu'))}; "
                            f"allowed: {', '.join(REFERENCE_CPU_FLAGS)} (rebuild the artifact)")
    from .targets import missing_cpu_flags

    missing = missing_cpu_flags(needed)  # not Linux: none, the loader's own error stands
    if missing:
        raise ArtifactError(f"{library}: the reference kernels need a {target['mcpu']} CPU; this one lacks {', '.join(missing)}")


def numpy_dequant_matmul(name: str, quant: Quantization, args: list[np.ndarray]) -> np.ndarray | None:
    """NumPy result of a fused_dequantize..._NT_matmul[_cast][_add] kernel, or None if its
    argument list is not (q_weight, q_scale, x[, residual], out)."""
    if not hasattr(quant, "dequantize_weight") or len(args) not in (4, 5):
        return None
    q_weight, q_scale, x = args[0], args[1], args[2]
    if q_weight.dtype != np.uint32:
        return None
    w = quant.dequantize_weight(q_weight, q_scale)
    out = args[-1]
    y = x.astype(np.float32) @ w.T
    if out.dtype != np.float32:
        y = y.astype(out.dtype)
    if len(args) == 5 and "add" in name:
        y = (y + args[3]).astype(out.dtype)
    return y.astype(out.dtype)


def _copy(args: list) -> list:
    return [a.copy() if isinstance(a, np.ndarray) else a for a in args]


def _compare(got: list, want: list, tolerance: dict[str, float] | None = None, floor: float = 0.0) -> tuple[float, float, bool]:
    """Worst absolute and relative error of the float outputs (integer outputs: exact) and whether
    each is within its dtype's tolerance (`tolerance` overrides), never below `floor`."""
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
        ok &= err_rel <= max(floor, {**TOLERANCE, **(tolerance or {})}.get(str(g.dtype), TOLERANCE["float32"]))
    return worst_abs, worst_rel, ok


def _check_memory(reference, names: list[str], skips: dict, sizes: tuple[int, ...], heads: dict) -> None:
    """--sizes whose inputs (x3: the reference's and the device's copies, the outputs) do not fit the
    memory left: one line naming the largest, before anything is allocated."""
    from .generation import available_memory

    have = available_memory()
    if have is None:
        return
    need, name, size = max(((kernel_args_bytes(reference.signature(n), s, heads), n, s) for n in names if not skips[n] for s in sizes),
                           default=(0, "", 0))
    if 3 * need > have:
        raise ValueError(f"--sizes {','.join(map(str, sizes))}: kernel {name} at {size} tokens needs {3 * need / 2**30:.1f} GiB "
                         f"of inputs and copies; this machine has {have / 2**30:.1f} GiB available (use smaller --sizes)")


def check_artifact(artifact: str | Path, sizes: tuple[int, ...] = (1, 7), pattern: str | None = None, seed: int = 0, progress=None,
                   options=None) -> CheckReport:
    """Every kernel of the artifact's shipped library run on its device (runtime.kernel_runner:
    here, over TVM RPC, or in a WebGPU runtime, per `options`), or the backend's static checks
    where it cannot run."""
    from .backends import backend
    from .device import RunOptions
    from .runtime import kernel_runner

    artifact = Path(artifact)
    regex = kernel_pattern(pattern)
    manifest = read_manifest(artifact, RUN_FIELDS)
    kind = manifest["target"]["kind"]
    options = options or RunOptions()
    compiled = backend(kind)
    # what is checked is what ships: the library (and the files the checks read) as built, or nothing
    verified_library(artifact, manifest)
    if manifest.get("kernel_source"):
        verified(artifact, manifest, manifest["kernel_source"], "kernel_source")
    roles = {k["name"]: k.get("role", "other") for k in manifest["kernels"]}
    reference = Reference(artifact, manifest)
    chat_config = read_json(verified(artifact, manifest, RUNTIME_CONFIG, "files"), RUNTIME_CONFIG)
    model_config = chat_config["model_config"]
    heads = {"H": model_config["num_attention_heads"], "D": model_config["head_dim"]}
    quant = quantization(manifest["quantization"], f"{artifact}: manifest field 'quantization'")
    results: list[KernelResult] = []
    names = sorted(reference.kernels)
    if regex is not None:
        names = [n for n in names if regex.search(n)]
    if not names:
        raise ArtifactError(f"--kernels {short_repr(pattern)}: matches none of the {len(reference.kernels)} kernels of {artifact}")
    skips = {name: reference.kernels[name]["skip"] for name in names}
    _check_memory(reference, names, skips, sizes, heads)
    window = chat_config["context_window_size"]
    if max(sizes) > window:
        raise ValueError(f"--sizes {','.join(map(str, sizes))}: {max(sizes)} tokens is past the context window of {artifact} "
                         f"({window} tokens): its kernels never see that many (use sizes up to {window})")
    run = kernel_runner(artifact, manifest, options)
    if run is None:
        rows = compiled.static_checks(artifact, manifest, names, roles)
        results = [KernelResult(name, role, "-", status, note=note) for name, role, status, note in rows]
        return CheckReport(str(artifact), kind, False, results, compiled.not_executed(options))
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
            role = roles.get(name, "other")
            if skips[name]:
                results.append(KernelResult(name, role, "-", "skip", note=skips[name]))
                continue
            results += _check_kernel(run, reference, name, role, quant, sizes, seed, heads)
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


def _check_kernel(run, reference: Reference, name: str, role: str, quant: Quantization, sizes: tuple[int, ...], seed: int,
                  heads: dict) -> list[KernelResult]:
    """One kernel at each size (one run for static shapes): the shipped kernel (`run`) against the
    reference kernel, itself checked against NumPy for the fused dequantize matmuls."""
    results = []
    signature = reference.signature(name)
    symbolic = bool(symbolic_dims(signature))
    for size in sizes if symbolic else (sizes[0],):
        args, label = kernel_args(signature, size, seed=seed, heads=heads)
        if not symbolic:
            label = "static"
        want = reference.run(name, _copy(args))
        note = "llvm ref: TVM CPU kernel" if reference.kernels[name]["reference"] == "tvm-cpu" else ""
        if role in WEIGHT_ROLES and "dequantize" in name:
            expected = numpy_dequant_matmul(name, quant, args)
            if expected is not None:
                _, rel_np, ok_np = _compare([expected], [want[-1]])
                note = f"llvm vs numpy {rel_np:.1e}" + ("" if ok_np else " MISMATCH")
                if not ok_np:
                    results.append(KernelResult(name, role, label, "FAIL", None, rel_np, note))
                    continue
        try:
            got = run(name, _copy(args))
        except Exception as exc:  # a kernel that cannot run is a failure, reported
            from .rpc import RemoteStopped

            if isinstance(exc, RemoteStopped):  # the remote's process is gone: no later kernel can run
                raise
            results.append(KernelResult(name, role, label, "FAIL", note=f"{type(exc).__name__}: {str(exc).splitlines()[0][:120] if str(exc) else ''}"))
            continue
        # a float32 output of an f16 model (the lm_head's logits) computes from f16 values: the
        # model dtype's tolerance holds it (the rules' int8 / bf16 activations stay within it)
        err_abs, err_rel, ok = _compare(got, want, getattr(run, "tolerance", None), quant.tolerance)
        results.append(KernelResult(name, role, label, "pass" if ok else "FAIL", err_abs, err_rel, note))
    return results


def report_json(report: CheckReport) -> str:
    return json.dumps({"artifact": report.artifact, "target": report.target, "executed": report.executed,
                       "summary": report.summary, "results": [dataclasses.asdict(r) for r in report.results]}, indent=2)

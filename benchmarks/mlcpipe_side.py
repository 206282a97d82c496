"""mlcpipe's side: build (or reuse) `artifacts/<model>-<quant>-llvm` from the current code, load it
with the seeded synthetic weights, time prefill and decode, and take the per-kernel times of the
decode phase from the profiler (pipeline/profiler/measure.py `profile()`).

An artifact is reused only when it was built by this harness from the same sources: a hash of
pipeline/ + schedules/ + configs/ (+ the tuning database, TVM's version) is kept beside it (artifacts/.bench-cache/<name>.json) with
its build time (artifacts/.bench-cache/, or under $MLCPIPE_ARTIFACTS), so a schedule edit always rebuilds, and a reused build still reports its time.
"""

from __future__ import annotations

import hashlib
import os
import json
import time
from pathlib import Path

from mlcpipe.roles import WEIGHT_ROLES

ROOT = Path(__file__).resolve().parents[1]
CACHE_DIR = ".bench-cache"  # beside the artifacts
GEMV_ROLES = WEIGHT_ROLES  # the decode GEMVs: the kernels that read a weight matrix


def source_hash() -> str:
    """What a build depends on: the sources, the tuning databases `mlcpipe build` applies, TVM."""
    import os

    import tvm

    digest = hashlib.sha256(tvm.__version__.encode())
    files = [p for folder in ("pipeline", "schedules", "configs") for p in sorted((ROOT / folder).rglob("*"))
             if p.suffix in (".py", ".yaml", ".yml", ".json") and "__pycache__" not in p.parts]
    files += sorted((ROOT / "artifacts" / "tuning").glob("*.json"))
    if os.environ.get("MLCPIPE_TUNING_DB"):
        files.append(Path(os.environ["MLCPIPE_TUNING_DB"]))
    for path in files:
        if path.is_file():
            digest.update(str(path).encode())
            digest.update(path.read_bytes())
    return digest.hexdigest()[:20]


def build_artifact(model: str, quant: str, rebuild: bool = False, log=print) -> tuple[Path, float, bool]:
    """(artifact dir, build seconds, reused?)."""
    from mlcpipe.build import build, default_output
    from mlcpipe.config import load_model_config
    from mlcpipe.targets import HOST_CPU_ENV, load_target

    config, target = load_model_config(model), load_target("llvm")
    scheme = config.scheme(quant)
    output = default_output(config, scheme, target)
    if not output.is_absolute():
        output = ROOT / output
    if os.environ.get(HOST_CPU_ENV):  # another CPU class's build (e.g. haswell on an AVX-512 host): its own directory
        output = output.with_name(f"{output.name}-{target.target['mcpu']}")
    stamp = output.parent / CACHE_DIR / f"{output.name}.json"
    key = source_hash() + "-" + str(target.target.get("mcpu"))
    if not rebuild and output.is_dir() and stamp.is_file():
        info = json.loads(stamp.read_text())
        if info.get("source_hash") == key:
            return output, float(info["build_wall_s"]), True
    if output.exists():
        import shutil

        shutil.rmtree(output)
    t0 = time.perf_counter()
    build(config, scheme, target, output=output, log=log)
    wall = time.perf_counter() - t0
    stamp.parent.mkdir(parents=True, exist_ok=True)
    stamp.write_text(json.dumps({"source_hash": key, "build_wall_s": wall}) + "\n")
    return output, wall, False


def _logical_weight_shape(shapes: list) -> list[int] | None:
    """(N, K) of the matmul: N from the output, K from the activation (the first 3-D argument)."""
    acts = [s for s in shapes if s and len(s) == 3]
    return [acts[-1][-1], acts[0][-1]] if len(acts) >= 2 else None


def gemv_kernels(prof: dict, bound_gbps: float | None = None) -> list[dict]:
    """The decode-phase matmul kernels (the fused dequantize GEMVs on q4): bytes per call,
    average time, GB/s and % of the bound, sorted by total time."""
    from mlcpipe.profiler.schema import kernel_stats

    rows = []
    for r in kernel_stats(prof, "decode"):
        if r["role"] not in GEMV_ROLES:
            continue
        nbytes = prof["kernels"].get(r["kernel"], {}).get("bytes", {}).get("decode")
        gbps = nbytes / (r["avg_ms"] / 1e3) / 1e9 if nbytes and r["avg_ms"] > 0 else None
        shapes = prof["kernels"].get(r["kernel"], {}).get("arg_shapes", {}).get("decode") or []
        rows.append({
            "kernel": r["kernel"], "role": r["role"], "calls": r["iterations"], "avg_ms": r["avg_ms"],
            "total_ms": r["total_ms"], "pct_decode": r["pct"], "bytes": nbytes, "gbps": gbps,
            "pct_bound": 100.0 * gbps / bound_gbps if gbps and bound_gbps else None,
            "weight_shape": _logical_weight_shape(shapes),
        })
    return rows


def run(settings, quant: str, rebuild: bool = False):
    """Benchmark one quantization; returns a common.Result."""
    import numpy as np
    import tvm

    from mlcpipe.profiler.core import Workload
    from mlcpipe.profiler.measure import profile
    from mlcpipe.runtime import Engine

    from .common import Result, prompt_tokens, time_prefill

    result = Result("mlcpipe", quant)
    artifact, build_s, reused = build_artifact(settings.model, quant, rebuild, log=lambda *_: None)
    manifest = json.loads((artifact / "manifest.json").read_text())
    engine = Engine(artifact, "synthetic", seed=settings.seed)
    prefill_tokens = prompt_tokens(engine.vocab_size, settings.prefill, settings.seed + 1)
    result.prefill_s = time_prefill(engine.prefill, engine.reset, prefill_tokens, settings.prefill_runs)
    result.prefill_tokens = settings.prefill
    # One low-overhead generation (whole steps timed) and one per-kernel generation, both after a
    # prompt of `context` tokens; the prefill runs above were the warm-up.
    prof = profile(engine, Workload(prompt_len=settings.context, gen_len=settings.decode_steps + 1, runs=1, warmup=0, seed=settings.seed))
    result.decode_ms = [s["ms"] for s in prof["steps"] if s["mode"] == "low-overhead" and s["phase"] == "decode"]
    result.tokens = prof["generated_tokens"]
    result.weight_bytes_per_token = int(prof["metrics"]["weight_bytes"])
    per_kernel_decode = [s["ms"] for s in prof["steps"] if s["mode"] == "per-kernel" and s["phase"] == "decode"]
    result.extra = {
        "artifact": str(artifact.relative_to(ROOT)) if artifact.is_relative_to(ROOT) else str(artifact),
        "build_s": build_s,
        "build_reused": reused,
        "manifest_build_s": manifest.get("build_seconds"),
        "load_s": engine.load_seconds,
        "target": manifest["target"],
        "tvm": manifest.get("versions", {}).get("tvm", tvm.__version__),
        "threads": int(tvm.get_global_func("runtime.NumThreads")()),
        "per_kernel_decode_p50_ms": float(np.median(per_kernel_decode)) if per_kernel_decode else None,
        "gemv_kernels": gemv_kernels(prof),
    }
    result.notes.append(f"TVM {result.extra['tvm']}, mcpu={manifest['target'].get('mcpu')}, {result.extra['threads']} threads")
    result.notes.append(f"build {build_s:.1f} s" + (" (cached, same sources)" if reused else ""))
    return result

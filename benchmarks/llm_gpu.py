"""LLM GPU benchmark (CUDA): mlcpipe's cuda artifacts next to PyTorch fp16 eager and PyTorch int4
(`torch._weight_int4pack_mm`), all with mlcpipe's seeded synthetic weights, in the same run:

- decode: forward steps at a context of DECODE_CONTEXT tokens, the logits left on the GPU, the
  device synchronised after each step (ms and tok/s); mlcpipe's whole greedy step too (logits
  copied to the host, argmax there);
- prefill of 128 and 1024 tokens on a fresh sequence (median of RUNS after a warm-up);
- the decode GEMVs of each artifact (fused dequantize-NT_matmul with one token): per-launch time
  from CUDA-graph replays of launches over rotated weight copies (4x the L2 in all, so weights
  come from HBM as in the model), GB/s of every argument moved, against the GPU's datasheet peak
  and the device-to-device copy measured in the same run (`copy_gbps`);
- CUDA-graph decode: the bundle's `cuda_graph` build (TVM's RewriteCUDAGraph) is a row of its own;
- where does the GPU time go: every kernel's device time (CUPTI, through torch.profiler) over
  PROFILED_STEPS decode steps and one prefill of the longest PREFILL, next to the wall time.

mlcpipe prefills in chunks of the artifact's own prefill_chunk_size (the bundle's `run` step uses a
smaller chunk; the benchmark does not), so prefill 1024 is one pass on both sides.

The bundle's job (pipeline/interface/job.py) calls `mlcpipe_side` per artifact, `torch_side` per model
and `render`; standalone on a GPU machine with a bundle:

    python -m benchmarks.llm_gpu --bundle artifacts/bundle [-o results.md]
"""

from __future__ import annotations

import functools
import json
import math
import statistics
import time
from pathlib import Path

import numpy as np

PREFILL = (128, 1024)
DECODE_CONTEXT = 128
DECODE_STEPS = 64
RUNS = 5
GEMV_LAUNCHES = 64  # launches per captured graph
L2_FACTOR = 4  # weight copies rotated through: this many times the L2 in all
PROFILED_STEPS = 16  # decode steps under the kernel-time profiler


def _prompt(vocab: int, n: int, seed: int) -> list[int]:
    return [int(t) for t in np.random.default_rng(seed).integers(0, vocab, size=n)]


def _median_ms(samples: list[float]) -> float:
    return round(statistics.median(samples), 4)


# ---- mlcpipe ---------------------------------------------------------------------------------------

def mlcpipe_side(engine, artifact: Path, peak_gbps: float | None) -> dict:
    """Prefill, decode and GEMV bandwidth of one artifact's Engine on its device (against the
    peak and the device-to-device copy measured once per process)."""
    out: dict = {"prefill_ms": {}, "engine": f"mlcpipe {engine.manifest['quantization']}"}
    chunk = engine.prefill_chunk
    engine.prefill_chunk = out["prefill_chunk"] = int(engine.config["prefill_chunk_size"])  # the KV cache of reset() takes it
    try:
        _mlcpipe_times(engine, out)
    finally:
        engine.prefill_chunk = chunk
        engine.reset()
    out["copy_gbps"] = copy_gbps()
    out["gemv"] = gemv_bandwidth(artifact, engine.device, peak_gbps, out["copy_gbps"])
    return out


def _mlcpipe_times(engine, out: dict) -> None:
    from mlcpipe.device import tvm_runtime as rt

    for n in PREFILL:
        if n + 1 > engine.context_window:
            continue
        tokens = _prompt(engine.vocab_size, n, seed=1)
        times = []
        for run in range(RUNS + 1):
            engine.reset()
            start = time.perf_counter()
            engine.prefill(tokens)  # ends with the last logits on the host: synchronised
            if run:
                times.append((time.perf_counter() - start) * 1e3)
        out["prefill_ms"][str(n)] = _median_ms(times)
    context = min(DECODE_CONTEXT, engine.context_window - DECODE_STEPS - 2)
    feed = _prompt(engine.vocab_size, DECODE_STEPS + 1, seed=2)
    engine.reset()
    engine.prefill(_prompt(engine.vocab_size, context, seed=3))
    step_ms, greedy_ms = [], []
    for i, token in enumerate(feed[: DECODE_STEPS // 2]):
        start = time.perf_counter()
        engine.forward("decode", np.asarray([token]))
        rt.sync(engine.device)
        if i:
            step_ms.append((time.perf_counter() - start) * 1e3)
    for token in feed[DECODE_STEPS // 2:]:
        start = time.perf_counter()
        int(np.argmax(engine.decode(token)))
        greedy_ms.append((time.perf_counter() - start) * 1e3)
    out["decode_ms"] = _median_ms(step_ms)
    out["decode_tok_s"] = round(1e3 / out["decode_ms"], 1)
    out["greedy_step_ms"] = _median_ms(greedy_ms)
    out["decode_context"] = context
    rest = feed[DECODE_STEPS // 2:]
    out["kernels"] = kernel_times(
        {"decode": (lambda: [engine.forward("decode", np.asarray([t])) for t in rest[:PROFILED_STEPS]], PROFILED_STEPS),
         f"prefill {max(PREFILL)}": (lambda: (engine.reset(), engine.prefill(_prompt(engine.vocab_size, max(PREFILL), seed=1))), 1)},
        lambda: rt.sync(engine.device))


def kernel_times(regions: dict, sync) -> dict:
    """Per region (name -> (fn, steps)): each kernel's device time per step (CUPTI activity records
    through torch.profiler: TVM's launches are seen like torch's), the summed kernel time and the
    wall time per step. An error (no torch, no CUPTI) is reported in place of the tables."""
    try:
        import torch
        from torch.profiler import ProfilerActivity, profile
    except ImportError as exc:
        return {"error": f"ImportError: {exc}"}
    out = {}
    for region, (fn, steps) in regions.items():
        try:
            fn()  # warm-up: the profiler's records are of steady-state calls
            sync()
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                start = time.perf_counter()
                fn()
                sync()
                wall_us = (time.perf_counter() - start) * 1e6
            kernels = {}
            for e in prof.key_averages():
                us = float(getattr(e, "device_time_total", 0.0) or getattr(e, "cuda_time_total", 0.0))
                if us > 0 and e.count:
                    kernels[e.key] = {"calls_per_step": round(e.count / steps, 2), "us_per_step": round(us / steps, 2)}
            busy = sum(k["us_per_step"] for k in kernels.values())
            out[region] = {"steps": steps, "wall_us_per_step": round(wall_us / steps, 1), "kernel_us_per_step": round(busy, 1),
                           "launches_per_step": round(sum(k["calls_per_step"] for k in kernels.values()), 1),
                           "kernels": dict(sorted(kernels.items(), key=lambda kv: -kv[1]["us_per_step"]))}
        except Exception as exc:  # noqa: BLE001 - the timings above stand without this table
            out[region] = {"error": f"{type(exc).__name__}: {' '.join(str(exc).split())[:200]}"}
        torch.cuda.synchronize()
    return out


def decode_gemvs(artifact: Path) -> list[tuple[str, str, dict]]:
    """(kernel, role, signature) of the artifact's weight GEMVs at one token (static shapes)."""
    from mlcpipe.artifact import read_json, read_manifest, verified
    from mlcpipe.kernel_inputs import symbolic_dims
    from mlcpipe.roles import WEIGHT_ROLES

    manifest = read_manifest(artifact)
    record = read_json(verified(artifact, manifest, manifest["reference"]["kernels"], "reference"), "reference record")
    out = []
    for kernel in manifest["kernels"]:
        entry = record["kernels"].get(kernel["name"])
        if kernel.get("role") in WEIGHT_ROLES and "NT_matmul" in kernel["name"] and entry and not symbolic_dims(entry["signature"]):
            out.append((kernel["name"], kernel["role"], entry["signature"]))
    return out


def gemv_bandwidth(artifact: Path, device, peak_gbps: float | None, copy_gbps: float | None = None) -> list[dict]:
    """Per decode GEMV: µs per launch and GB/s, from a CUDA graph of GEMV_LAUNCHES launches over
    weight copies rotated through L2_FACTOR x the L2 (TVM's launches join the graph through
    tvm_ffi's torch stream); without torch, TVM's time evaluator on one input set (L2-warm)."""
    from mlcpipe.artifact import read_manifest, verified_library
    from mlcpipe.device import tvm_runtime as rt
    from mlcpipe.kernel_inputs import random_args

    manifest = read_manifest(artifact)
    library = rt.load_module(verified_library(artifact, manifest))
    torch, l2 = _torch_cuda()
    rows = []
    for name, role, signature in decode_gemvs(artifact):
        args = random_args(signature, {})
        nbytes = sum(a.nbytes for a in args)
        func = library.get_function(name, query_imports=True)
        sets = _input_sets(args, device, torch, l2)
        if torch is not None:
            us, method = _graph_us(torch, func, sets), f"CUDA graph, {len(sets)} rotated copies"
        else:
            evaluate = rt.time_evaluator(library, name, device, number=100, repeat=5)
            us, method = statistics.median(evaluate(*sets[0])) * 1e6, "time evaluator, one input set (L2-warm)"
        gbps = nbytes / (us * 1e-6) / 1e9
        rows.append({"kernel": name, "role": role, "bytes": nbytes, "us": round(us, 3), "gbps": round(gbps, 1),
                     "pct_of_peak": round(100 * gbps / peak_gbps, 1) if peak_gbps else None,
                     "pct_of_copy": round(100 * gbps / copy_gbps, 1) if copy_gbps else None, "method": method})
    return rows


def time_candidates(library, kernel: dict, device, tolerance: float, rounds: int = 3, seed: int = 0) -> dict:
    """One kernel of a remote-tuning index (pipeline/tuning/remote.py) on this GPU: every candidate
    run once on the seeded inputs and its output held against the first candidate's (the rule's
    defaults, what `mlcpipe build` applies untuned) within `tolerance` of the output's scale, then
    the matching ones timed as gemv_bandwidth times a GEMV, in `rounds` interleaved rounds (the
    median per candidate). Returns {"candidates": [{"function", "us", "error"}], "method"}."""
    from mlcpipe.device import tvm_runtime as rt
    from mlcpipe.kernel_inputs import random_args
    from mlcpipe.tuning import outputs_differ

    torch, l2 = _torch_cuda()
    args = random_args(kernel["args"], {}, seed)
    nbytes = sum(a.nbytes for a in args)
    sets = _input_sets(args, device, torch, l2)
    results, want = [], None
    for cand in kernel["candidates"]:
        entry = {"function": cand["function"], "us": None, "error": None}
        results.append(entry)
        try:
            func = library.get_function(cand["function"], query_imports=True)
            func(*sets[0])
            rt.sync(device)
            got = rt.to_numpy(sets[0][-1]).astype(np.float32)
        except Exception as exc:  # noqa: BLE001 - a failing candidate is reported, never chosen
            entry["error"] = " ".join(str(exc).split())[:200] or type(exc).__name__
            continue
        if want is None:
            want = got
        differs = outputs_differ(got, want, tolerance)
        if differs:
            entry["error"] = f"output differs from the defaults' ({differs})"
            continue
        entry["func"] = func
    runnable = [e for e in results if "func" in e]
    samples: dict[str, list[float]] = {e["function"]: [] for e in runnable}
    for _ in range(rounds):
        for e in runnable:
            if torch is not None:
                samples[e["function"]].append(_graph_us(torch, e["func"], sets))
            else:
                evaluate = rt.time_evaluator(library, e["function"], device, number=100, repeat=3)
                samples[e["function"]].append(statistics.median(evaluate(*sets[0])) * 1e6)
    for e in runnable:
        e["us"] = round(statistics.median(samples[e["function"]]), 3)
        del e["func"]
    method = (f"CUDA graph of {GEMV_LAUNCHES} launches, {len(sets)} rotated input copies" if torch is not None
              else "time evaluator, one input set (L2-warm)") + f"; median of {rounds} interleaved rounds"
    return {"candidates": results, "method": method, "bytes": nbytes}


COPY_BYTES = 2**30  # the copy bandwidth's buffer: far beyond any L2


@functools.cache
def copy_gbps(repeat: int = 10) -> float | None:
    """The GPU's device-to-device copy bandwidth through PyTorch (bytes read + written, best of
    `repeat` after a warm-up): the ceiling measured in the same run; None without torch or CUDA."""
    torch, _ = _torch_cuda()
    if torch is None:
        return None
    src = torch.empty(COPY_BYTES, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    dst.copy_(src)
    best = math.inf
    for _ in range(repeat):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        dst.copy_(src)
        end.record()
        torch.cuda.synchronize()
        best = min(best, start.elapsed_time(end) * 1e-3)
    del src, dst
    torch.cuda.empty_cache()
    return round(2 * COPY_BYTES / best / 1e9, 1)


def _torch_cuda():
    """(torch, the GPU's L2 bytes), or (None, 0) without PyTorch or a CUDA device."""
    try:
        import torch

        return torch, torch.cuda.get_device_properties(0).L2_cache_size
    except (ImportError, RuntimeError, AssertionError):
        return None, 0


def _input_sets(args, device, torch, l2: int) -> list[list]:
    """Copies of `args` on `device`: enough to rotate through L2_FACTOR x the L2 (at most
    GEMV_LAUNCHES) for CUDA-graph timing, one without torch."""
    from mlcpipe.device import tvm_runtime as rt

    nbytes = sum(a.nbytes for a in args)
    copies = max(2, min(GEMV_LAUNCHES, math.ceil(L2_FACTOR * l2 / nbytes))) if torch is not None else 1
    return [[rt.tensor(a, device) for a in args] for _ in range(copies)]


def _graph_us(torch, func, sets: list[list]) -> float:
    import tvm_ffi

    for tensors in sets:  # warm-up outside the capture (module load, first launch)
        func(*tensors)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    launches = max(len(sets), GEMV_LAUNCHES // len(sets) * len(sets))
    with tvm_ffi.use_torch_stream(torch.cuda.graph(graph)):
        for i in range(launches):
            func(*sets[i % len(sets)])
    times = []
    for _ in range(6):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / launches)
    return statistics.median(times[1:])


# ---- the exact reference -----------------------------------------------------------------------------

def effective_weights(config, quant: str, seed: int = 0) -> dict[str, np.ndarray]:
    """HF name -> float32 values the `quant` build of the synthetic model computes with: every
    matrix quantized and dequantized as the kernels do it, the rest rounded to the model dtype."""
    from mlcpipe.quantization import quantization

    from .common import hf_weights

    scheme = quantization(quant)
    out = {}
    for name, _, get in hf_weights(config, seed):
        w = get()
        if w.ndim == 2 and hasattr(scheme, "dequantize_weight"):
            out[name] = scheme.dequantize_weight(*scheme.quantize_weight(w))
        else:
            out[name] = w.astype(scheme.model_dtype).astype(np.float32)
    return out


def f32_truth(config, quant: str, prompt: list[int], tokens, seed: int = 0) -> np.ndarray:
    """Float32 logits (steps, vocab) of the prompt's prefill and the decode steps fed `tokens`
    (as the bundle's teacher-forced run), by PyTorch on the CPU in float32 with the exact values of
    the quantized model's weights: what every f16 build is measured against."""
    from .peers.torch_llama import TorchLlama

    model = TorchLlama(config, effective_weights(config, quant, seed), "fp32", max_len=len(prompt) + len(tokens) + 1, device="cpu")
    logits = [model.forward(list(prompt))]
    for token in list(tokens)[:-1]:
        logits.append(model.forward([int(token)]))
    return np.stack([row.float().numpy() for row in logits]).astype(np.float32)


# ---- PyTorch ----------------------------------------------------------------------------------------

# the mlcpipe quantization whose recorded llvm logits a PyTorch mode is held against (the same
# values: fp16 weights; the int4 pack holds mlcpipe's q4 values)
SAME_MODEL = {"fp16": "q0f16", "int4": "q4f16_1"}


def torch_side(artifact: Path, expected: dict[str, Path], modes: tuple[str, ...] = ("fp16", "int4")) -> dict:
    """PyTorch eager on the GPU with the same synthetic weights as the artifact's model: prefill,
    decode (forward steps, synchronised), and its logits of a recorded prompt against the llvm
    logits the bundle recorded for it (`expected`: quantization -> the .npz of `mlcpipe bundle`)."""
    import torch

    from mlcpipe.artifact import RUNTIME_CONFIG
    from mlcpipe.config import parse_model_config

    from .common import hf_weights
    from .peers.torch_llama import TorchLlama

    config = parse_model_config(json.loads((artifact / RUNTIME_CONFIG).read_text())["model_config"], str(artifact))
    weights = {name: get() for name, _, get in hf_weights(config, 0)}
    out = {}
    for mode in modes:
        try:
            model = TorchLlama(config, dict(weights), mode, max_len=max(PREFILL) + DECODE_STEPS + 8, device="cuda")
        except Exception as exc:  # noqa: BLE001 - e.g. an int4 kernel this GPU lacks: said, the rest goes on
            out[mode] = {"error": f"{type(exc).__name__}: {' '.join(str(exc).split())[:200]}"}
            continue
        result: dict = {"engine": f"pytorch {mode}", "prefill_ms": {}}
        if SAME_MODEL[mode] in expected:
            data = np.load(expected[SAME_MODEL[mode]])
            model.reset()
            got = model.forward([int(t) for t in data["prompt"]]).cpu().numpy()
            want = data["logits"][0]
            result["logits_rel_err_vs_llvm"] = {SAME_MODEL[mode]: float(np.abs(got - want).max() / np.abs(want).max())}
            from mlcpipe.interface.job import rel_l2

            result["logits_rel_l2_vs_llvm"] = {SAME_MODEL[mode]: rel_l2(got, want)}
            if "truth" in data.files:
                result["logits_rel_l2_vs_truth"] = {SAME_MODEL[mode]: rel_l2(got, data["truth"][0])}
        for n in PREFILL:
            tokens, times = _prompt(config.vocab_size, n, seed=1), []
            for run in range(RUNS + 1):
                model.reset()
                torch.cuda.synchronize()
                start = time.perf_counter()
                model.forward(tokens)
                torch.cuda.synchronize()
                if run:
                    times.append((time.perf_counter() - start) * 1e3)
            result["prefill_ms"][str(n)] = _median_ms(times)
        model.reset()
        model.forward(_prompt(config.vocab_size, DECODE_CONTEXT, seed=3))
        step_ms = []
        for i, token in enumerate(_prompt(config.vocab_size, DECODE_STEPS, seed=2)):
            torch.cuda.synchronize()
            start = time.perf_counter()
            model.forward([token])
            torch.cuda.synchronize()
            if i:
                step_ms.append((time.perf_counter() - start) * 1e3)
        result["decode_ms"] = _median_ms(step_ms)
        result["decode_tok_s"] = round(1e3 / result["decode_ms"], 1)
        result["weight_bytes_per_token"] = model.weight_bytes_per_token
        out[mode] = result
        del model
        torch.cuda.empty_cache()
    out["torch"] = torch.__version__
    return out


# ---- report -----------------------------------------------------------------------------------------

def render(results: dict, top: int = 12) -> str:
    """Markdown tables of the job's bench results (results[artifact]["bench"], results["pytorch"])."""
    rows = ["| engine | decode ms/token (forward) | decode tok/s | greedy step ms | prefill 128 ms | prefill 1024 ms | logits vs llvm: rel L2 (max rel) |",
            "|---|---|---|---|---|---|---|"]
    gemvs = ["| artifact | kernel | role | MB | µs | GB/s | % of peak | % of copy | method |", "|---|---|---|---|---|---|---|---|---|"]
    for name, record in results.items():
        bench = record.get("bench") or {}
        if name == "pytorch":
            for model, modes in bench.items():
                for mode, r in (modes.items() if isinstance(modes, dict) else ()):
                    if isinstance(r, dict) and "decode_ms" in r:
                        l2, exact = r.get("logits_rel_l2_vs_llvm", {}), r.get("logits_rel_l2_vs_truth", {})
                        versus = ", ".join(f"{q}: {l2[q]:.1e} ({e:.1e})" + (f"; vs f32 truth {exact[q]:.1e}" if q in exact else "")
                                           if q in l2 else f"{q}: ({e:.1e})"
                                           for q, e in r.get("logits_rel_err_vs_llvm", {}).items()) or "-"
                        rows.append(f"| {r['engine']} ({model}) | {r['decode_ms']} | {r['decode_tok_s']} | - | "
                                    f"{r['prefill_ms'].get('128', '-')} | {r['prefill_ms'].get('1024', '-')} | {versus} |")
                    elif isinstance(r, dict) and "error" in r:
                        rows.append(f"| pytorch {mode} ({model}) | {r['error'][:100]} | | | | | |")
            continue
        if "decode_ms" not in bench:
            continue
        label = f"mlcpipe {record['quantization']}" + (f" ({record['variant']})" if record.get("variant") else "")
        run = record.get("run") or {}
        versus = f"{run['rel_l2']:.1e} ({run['max_rel']:.1e})" if "rel_l2" in run else "-"
        if "rel_l2_vs_truth" in run:
            versus += f"; vs f32 truth {run['rel_l2_vs_truth']:.1e}"
        rows.append(f"| {label} ({record['model']}) | {bench['decode_ms']} | {bench['decode_tok_s']} | {bench['greedy_step_ms']} | "
                    f"{bench['prefill_ms'].get('128', '-')} | {bench['prefill_ms'].get('1024', '-')} | {versus} |")
        for g in bench.get("gemv", []):
            gemvs.append(f"| {name} | {g['kernel']} | {g['role']} | {g['bytes'] / 1e6:.2f} | {g['us']} | {g['gbps']} | "
                         f"{_or_dash(g['pct_of_peak'])} | {_or_dash(g.get('pct_of_copy'))} | {g['method']} |")
    return ("## Benchmark (same run)\n\n" + "\n".join(rows) + "\n\n### Decode GEMVs\n\n" + "\n".join(gemvs) + "\n"
            + render_kernels(results, top))


def _or_dash(value) -> str:
    return "-" if value is None else str(value)


def render_kernels(results: dict, top: int = 12) -> str:
    """Where the GPU time goes (the bench's kernel_times), per artifact and region."""
    parts = []
    for name, record in results.items():
        for region, r in ((record.get("bench") or {}).get("kernels") or {}).items():
            if not isinstance(r, dict):
                continue
            if "error" in r:
                parts.append(f"#### {name}: {region}\n\nnot measured: {r['error']}\n")
                continue
            busy = r["kernel_us_per_step"] or 1.0
            lines = [f"#### {name}: {region} (per step, {r['steps']} steps; device time by CUPTI)\n",
                     f"wall {r['wall_us_per_step']} µs, kernels {r['kernel_us_per_step']} µs "
                     f"({100 * r['kernel_us_per_step'] / max(r['wall_us_per_step'], 1e-9):.0f}% of wall), "
                     f"{r['launches_per_step']} launches\n",
                     "| kernel | calls | µs | % of kernel time |", "|---|---|---|---|"]
            for kernel, k in list(r["kernels"].items())[:top]:
                lines.append(f"| {kernel[:60]} | {k['calls_per_step']} | {k['us_per_step']} | {100 * k['us_per_step'] / busy:.1f} |")
            parts.append("\n".join(lines) + "\n")
    return ("\n### Where the GPU time goes\n\n" + "\n".join(parts)) if parts else ""


def main(argv: list[str] | None = None) -> int:
    import argparse

    from mlcpipe.interface.job import main as job

    parser = argparse.ArgumentParser(prog="python -m benchmarks.llm_gpu", description=__doc__.split("\n\n")[0])
    parser.add_argument("--bundle", type=Path, required=True)
    parser.add_argument("--out", type=Path, default=Path("llm-gpu-out"))
    args = parser.parse_args(argv)
    return job(["--bundle", str(args.bundle), "--out", str(args.out), "--steps", "bench"])


if __name__ == "__main__":
    raise SystemExit(main())

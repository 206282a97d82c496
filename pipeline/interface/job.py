"""The one command a lent GPU machine runs: `bash run.sh` of a bundle (`mlcpipe bundle`), with TVM's
runtime libraries and tvm_ffi beside the run-side code, and no apache-tvm. For every bundled
artifact whose device is here, in this order (the most telling first, in case time runs out):

  run      the prompt's prefill and decode steps fed the tokens the llvm build chose at bundle
           time (teacher forcing: one near-tie cannot derail the comparison), each step's logits
           against the float32 truth of the same weights the bundle recorded, at most
           TRUTH_FACTOR x as far from it as the llvm build (without a truth: against the llvm
           logits within the model dtype's tolerance); decided greedy tokens must agree
  check    every kernel of the shipped library on the device against the shipped reference
           kernels on this machine's CPU (`mlcpipe check`)
  profile  `mlcpipe profile`'s per-kernel tables (kernel times: host clock around each kernel,
           the device synchronised before and after)
  bench    benchmarks/llm_gpu.py: decode and prefill next to PyTorch fp16 eager and int4, the
           decode GEMVs' GB/s, CUDA-graph decode next to without

and last, once for the bundle (a candidate that broke the device's context could spoil only what
comes after it):

  tune     (a bundle made with `--tune`) every knob candidate of its kernels, compiled at bundle
           time (pipeline/tuning/remote.py), checked against the defaults' output and timed
           (benchmarks/llm_gpu.time_candidates); the winners become tuning.json, a tuning
           database for `mlcpipe build --tuning-db`

and writes at most 6 files to --out (the device tool returns at most 8): report.md, summary.json,
run.sh's log.txt, and where their steps ran checks.json, profiles.json.gz (artifact -> its
`mlcpipe-profile` JSON) and tuning.json.
Exit 0 when every step ran and passed, 1 when one failed, 2 when the bundle cannot be used.

    python -m mlcpipe.interface.job --bundle DIR --out DIR [--steps run,check,profile,bench,tune]
        [--kinds cuda,llvm] [--budget-s 450]
"""

from __future__ import annotations

import argparse
import gc
import gzip
import json
import os
import platform
import sys
import time
import traceback
from pathlib import Path

import numpy as np

from ..artifact import BUNDLE_INDEX
from ..quantization import TOLERANCE, quantization
from ..device import tvm_runtime as rt

BUNDLE_FORMAT = "mlcpipe-bundle/1"
STEPS = ("run", "check", "profile", "bench", "tune")  # what --steps chooses; "device" (is it here?) always runs first
PROFILE_SIZES = (128, 32, 3)  # prompt tokens, generated tokens, measured runs


class BundleError(ValueError):
    """The bundle cannot be used (one line)."""


# ---- teacher-forced generation (also what `mlcpipe bundle` records on llvm) ----------------------

def teacher_forced(engine, prompt: list[int], steps: int, tokens=None) -> tuple[np.ndarray, np.ndarray]:
    """The prompt's prefill, then `steps - 1` decode steps fed `tokens` (greedy where None);
    returns (the tokens fed, float32 logits (steps, vocab): step i's logits choose token i)."""
    engine.check_tokens(prompt, steps)
    engine.reset()
    logits = [engine.prefill(prompt)]
    fed: list[int] = []
    for i in range(steps):
        fed.append(int(tokens[i]) if tokens is not None else int(np.argmax(logits[-1])))
        if i + 1 < steps:
            logits.append(engine.decode(fed[-1]))
    return np.asarray(fed, dtype=np.int32), np.stack(logits).astype(np.float32)


def compare_logits(got: np.ndarray, want: np.ndarray, tokens: np.ndarray, tolerance: float) -> dict:
    """Per step: ||got - want|| / ||want|| (what is held against the tolerance) and the largest
    error relative to the largest |logit| (reported only: a tail of the whole vocabulary); the
    device's greedy token against the recorded one, where the recorded top two differ by more
    than twice the tolerance (closer ones are near ties either side may break)."""
    rel, l2, agree, decided = [], [], 0, 0
    for g, w, t in zip(got, want, tokens):
        scale = max(float(np.abs(w).max()), 1e-6)
        rel.append(float(np.abs(g.astype(np.float64) - w).max() / scale) if np.all(np.isfinite(g)) else float("inf"))
        l2.append(rel_l2(g, w))
        top2 = np.sort(w)[-2:]
        if top2[1] - top2[0] > 2 * tolerance * scale:
            decided += 1
            agree += int(np.argmax(g) == t)
    return {"rel_l2_per_step": l2, "rel_l2": max(l2), "max_rel_per_step": rel, "max_rel": max(rel), "tolerance": tolerance,
            "tokens_decided": decided, "tokens_agree": agree, "ok": max(l2) <= tolerance and agree == decided}


TRUTH_FACTOR = 2.0  # a device may land this many times as far from the f32 truth as the llvm build


def rel_l2(got: np.ndarray, want: np.ndarray) -> float:
    """||got - want|| / ||want|| in float64; inf where `got` is not finite."""
    if not np.all(np.isfinite(got)):
        return float("inf")
    want = want.astype(np.float64)
    return float(np.linalg.norm(got.astype(np.float64) - want) / max(float(np.linalg.norm(want)), 1e-30))


def against_truth(got: np.ndarray, llvm: np.ndarray, truth: np.ndarray, tolerance: float) -> dict:
    """The device's and the llvm build's distance (relative L2, worst step) from the float32 truth
    of the same weights. Two f16 computations of a deep model can each be as far from it as the
    dtype's tolerance, and so as far from each other (benchmarks/results/h100): a device passes
    when it is at most TRUTH_FACTOR times as far from the truth as the llvm build (and never needs
    to beat the dtype's tolerance)."""
    device = max(rel_l2(g, t) for g, t in zip(got, truth))
    cpu = max(rel_l2(w, t) for w, t in zip(llvm, truth))
    allowed = max(tolerance, TRUTH_FACTOR * cpu)
    return {"rel_l2_vs_truth": device, "llvm_rel_l2_vs_truth": cpu, "allowed_vs_truth": allowed, "truth_ok": device <= allowed}


# ---- the bundle ------------------------------------------------------------------------------------

def load_bundle(path: Path) -> dict:
    index = Path(path) / BUNDLE_INDEX
    try:
        data = json.loads(index.read_text())
    except (OSError, ValueError) as exc:
        raise BundleError(f"{index}: not a bundle of `mlcpipe bundle` ({exc})") from None
    if not isinstance(data, dict) or data.get("format") != BUNDLE_FORMAT or not isinstance(data.get("artifacts"), list):
        raise BundleError(f"{index}: format {data.get('format') if isinstance(data, dict) else None!r}; expected {BUNDLE_FORMAT}")
    return data


def environment() -> dict:
    env = {"python": platform.python_version(), "numpy": np.__version__, "cpu": _cpu_model(), "cpus": os.cpu_count(),
           "tvm_runtime": str(rt.library_dir())}
    from ..device.cuda import cuda_device, datasheet_gbps, runs_here as cuda_present

    if cuda_present():
        gpu = cuda_device()
        env["gpu"] = rt.device_name(gpu)
        env["gpu_memory_gib"] = round(rt.total_memory(gpu) / 2**30, 1)
        env["gpu_peak_gbps"] = datasheet_gbps(env["gpu"])  # None: the target preset's figure (each artifact's peak_gbps)
    else:
        env["gpu"] = "none (no CUDA device TVM's runtime can use)"
    try:
        import torch

        env["torch"] = f"{torch.__version__} (CUDA {torch.version.cuda}, available: {torch.cuda.is_available()})"
    except ImportError:
        env["torch"] = "not installed"
    return env


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


class Job:
    """The steps over the bundle's artifacts, their results, and the files they become."""

    def __init__(self, bundle: Path, out: Path, steps: tuple[str, ...], kinds: tuple[str, ...] | None, budget_s: float):
        self.root, self.out, self.steps = Path(bundle), Path(out), steps
        self.index = load_bundle(self.root)
        self.kinds = kinds
        self.deadline = time.monotonic() + budget_s
        self.env = environment()
        self.results: dict[str, dict] = {}
        self.checks: dict[str, dict] = {}
        self.profiles: dict[str, dict] = {}
        self.sections: list[str] = []
        self.tuning: dict | None = None  # the tune steps' tuning database

    def peak_gbps(self, entry: dict) -> float | None:
        """The bandwidth an entry's % of peak columns are against: its device's here where known
        (a GPU's datasheet figure by its name; the bundle's cuda preset assumes an H100), else the
        target preset's the bundle recorded."""
        from ..device import device

        return device(entry["kind"]).local_peak_gbps() or entry.get("peak_gbps")

    def left_s(self) -> float:
        return self.deadline - time.monotonic()

    def entries(self) -> list[dict]:
        return [a for a in self.index["artifacts"] if self.kinds is None or a["kind"] in self.kinds]

    def _do(self, name: str, step: str, fn) -> None:
        """Run one step of one artifact; its result, or its error in one line, is recorded."""
        record = self.results.setdefault(name, {})
        if self.left_s() <= 0:
            record[step] = {"ok": False, "error": "skipped: the job's time budget is spent"}
            return
        started = time.monotonic()
        try:
            record[step] = fn()
        except Exception as exc:  # noqa: BLE001 - every failure is reported, the job goes on
            first = " ".join(str(exc).split()) or type(exc).__name__
            record[step] = {"ok": False, "error": f"{type(exc).__name__}: {first[:300]}"}
            if not isinstance(exc, ValueError):  # mlcpipe's own errors are one line; anything else is a bug to read
                traceback.print_exc()
        record[step]["seconds"] = round(time.monotonic() - started, 2)
        print(f"[job] {name} {step}: {'ok' if record[step].get('ok') else 'FAILED ' + record[step].get('error', record[step].get('summary', ''))}"
              f" ({record[step]['seconds']} s)", flush=True)

    def run(self) -> int:
        from ..device import RunOptions, device
        from ..runtime import open_engine as open_artifact

        entries = self.entries()
        if not entries:
            raise BundleError(f"{self.root}: no bundled artifact of kind {', '.join(self.kinds or ())}")
        for entry in entries:
            name, path = entry["name"], self.root / entry["dir"]
            engine = None

            def open_engine():
                nonlocal engine
                if engine is None:
                    started = time.monotonic()
                    engine = open_artifact(path, "synthetic", 0, RunOptions(prefill_chunk=entry.get("prefill_chunk")))
                    self.results[name]["load_s"] = round(time.monotonic() - started, 2)
                return engine

            self.results[name] = {"model": entry["model"], "quantization": entry["quantization"], "kind": entry["kind"],
                                  "variant": entry.get("variant", "")}
            self._do(name, "device", lambda: {"ok": True, "device": str(device(entry["kind"]).local_device())})
            if not self.results[name]["device"]["ok"]:
                continue  # nothing of it runs here: said once
            if "run" in self.steps and entry.get("expected"):
                self._do(name, "run", lambda: self._run(entry, open_engine()))
            if "check" in self.steps and entry.get("check", True):
                self._do(name, "check", lambda: self._check(entry, path))
            if "profile" in self.steps and entry.get("profile", True):
                self._do(name, "profile", lambda: self._profile(entry, open_engine()))
            if "bench" in self.steps and entry.get("bench"):
                self._do(name, "bench", lambda: self._bench_mlcpipe(entry, open_engine()))
            del engine
            gc.collect()
        if "bench" in self.steps and any(e.get("bench") for e in entries):
            self._do("pytorch", "bench", lambda: self._bench_peers([e for e in entries if e.get("bench")]))
        if "tune" in self.steps:
            for tune in self.index.get("tune", []):
                if self.kinds is None or tune["kind"] in self.kinds:
                    self.results[tune["name"]] = {"model": tune["model"], "quantization": tune["quantization"], "kind": tune["kind"]}
                    self._do(tune["name"], "tune", lambda: self._tune(tune))
        return self.finish()

    # ---- steps ------------------------------------------------------------------------------
    def _run(self, entry: dict, engine) -> dict:
        data = np.load(self.root / entry["expected"])
        tokens, want = data["tokens"], data["logits"]
        _, got = teacher_forced(engine, [int(t) for t in data["prompt"]], len(tokens), tokens=tokens)
        dtype = quantization(entry["quantization"], f"{self.root / BUNDLE_INDEX}: entry field 'quantization'").model_dtype
        result = compare_logits(got, want, tokens, TOLERANCE[dtype])
        if "truth" in data.files:
            result.update(against_truth(got, want, data["truth"], TOLERANCE[dtype]))
            result["ok"] = result["truth_ok"] and result["tokens_agree"] == result["tokens_decided"]
        result["prompt_tokens"], result["prefill_chunk"] = int(len(data["prompt"])), entry.get("prefill_chunk")
        result["greedy_tokens_here"] = [int(np.argmax(g)) for g in got]
        result["tokens_recorded"] = [int(t) for t in tokens]
        return result

    def _tune(self, tune: dict) -> dict:
        from benchmarks import llm_gpu

        from ..artifact import verify_file
        from ..device import device
        from ..tuning import TUNE_FORMAT, from_remote_timings

        files = self.index.get("files", {})

        def verified(rel: str) -> Path:
            if rel not in files:
                raise BundleError(f"{self.root / BUNDLE_INDEX}: {rel} has no SHA-256 in field 'files'; rebuild the bundle")
            return verify_file(self.root / rel, files[rel]["sha256"], files[rel]["bytes"], str(self.root / BUNDLE_INDEX))

        index = json.loads(verified(f"{tune['dir']}/tune.json").read_text())
        if not isinstance(index, dict) or index.get("format") != TUNE_FORMAT:
            raise BundleError(f"{self.root / tune['dir'] / 'tune.json'}: format {index.get('format') if isinstance(index, dict) else None!r}; "
                              f"expected {TUNE_FORMAT}")
        library = rt.load_module(verified(f"{tune['dir']}/{index['library']}"))
        dev = device(tune["kind"]).local_device()
        tolerance = quantization(index["quantization"], f"{self.root / tune['dir'] / 'tune.json'}: field 'quantization'").tolerance
        timed = {}
        for kernel in index["kernels"]:
            if self.left_s() <= 0:
                break
            timed[kernel["kernel"]] = {**llm_gpu.time_candidates(library, kernel, dev, tolerance, seed=index["seed"]),
                                       "device": self.env.get("gpu", "")}
        db = from_remote_timings(index, timed)
        if self.tuning is None:
            self.tuning = db
        else:
            self.tuning["records"].setdefault(index["target_key"], {}).update(db["records"][index["target_key"]])
        rows = []
        for record in db["records"][index["target_key"]].values():
            nbytes = timed[record["kernel"]]["bytes"]
            rows.append({"kernel": record["kernel"], "default_us": record["default_ms"] and round(record["default_ms"] * 1e3, 3),
                         "best_us": round(record["ms"] * 1e3, 3), "knobs": record["knobs"],
                         "gbps": round(nbytes / (record["ms"] * 1e-3) / 1e9, 1),
                         "candidates": len(record["candidates"]),
                         "failed": sum(1 for c in record["candidates"] if c["error"])})
        return {"ok": len(rows) == len(index["kernels"]), "kernels": rows, "method": next(iter(timed.values()), {}).get("method", "")}

    def _check(self, entry: dict, path: Path) -> dict:
        from ..conformance import check_artifact, report_json

        report = check_artifact(path, (1, 7))
        self.checks[entry["name"]] = json.loads(report_json(report))
        self.sections.append(f"### check: {entry['name']}\n\n{report.table()}\n\n{report.summary}\n")
        failed = [f"{r.kernel} ({r.sizes}): {r.note or r.max_rel}" for r in report.results if r.status == "FAIL"]
        return {"ok": report.ok and report.executed, "summary": report.summary, "failed": failed[:20]}

    def _profile(self, entry: dict, engine) -> dict:
        from ..device import RunOptions
        from ..profiler.core import Workload
        from ..profiler.driver import profile
        from ..profiler.reports import render
        from ..profiler.schema import validate

        prompt_len, gen_len, runs = PROFILE_SIZES
        prompt_len = min(prompt_len, engine.context_window - gen_len - 1)
        data = profile(engine, RunOptions(timed=True), "synthetic", None, Workload(prompt_len, gen_len, runs))
        data["peak_gbps"] = self.peak_gbps(entry)
        data["timing"] = "host clock around each kernel, the device synchronised before and after it"
        validate(data)
        self.profiles[entry["name"]] = data
        with gzip.open(self.out / "profiles.json.gz", "wt") as f:  # one file: the device tool returns at most 8
            json.dump(self.profiles, f)
        self.sections.append(f"### profile: {entry['name']} (kernel times: {data['timing']})\n\n"
                             f"{render(data, 'md', peak_gbps=data['peak_gbps'])}\n")
        metrics = data["metrics"]
        return {"ok": True, "prefill_tok_s": round(metrics["prefill_tok_s"], 1), "decode_tok_s": round(metrics["decode_tok_s"], 1),
                "decode_ms_p50": round(metrics["decode_ms_per_token"]["p50"], 3), "device": data["device"]}

    def _bench_mlcpipe(self, entry: dict, engine) -> dict:
        from benchmarks import llm_gpu

        return {"ok": True, **llm_gpu.mlcpipe_side(engine, self.root / entry["dir"], self.peak_gbps(entry))}

    def _bench_peers(self, entries: list[dict]) -> dict:
        from benchmarks import llm_gpu

        out = {"ok": True}
        for model in sorted({e["model"] for e in entries}):
            mine = [e for e in entries if e["model"] == model]
            expected = {e["quantization"]: self.root / e["expected"] for e in mine if e.get("expected") and not e.get("variant")}
            out[model] = llm_gpu.torch_side(self.root / mine[0]["dir"], expected)
        return out

    # ---- files ------------------------------------------------------------------------------
    def finish(self) -> int:
        ok = all(step.get("ok") for record in self.results.values() for step in record.values() if isinstance(step, dict))
        # the run side imports nothing of the tvm package (its runtime library comes through tvm_ffi)
        self.env["tvm_package_modules"] = sorted(m for m in sys.modules if m == "tvm" or m.startswith("tvm."))[:5]
        summary = {"bundle": self.index.get("created"), "env": self.env, "ok": ok, "results": self.results}
        (self.out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
        if self.checks:  # the device tool returns at most 8 files: none that would be empty
            (self.out / "checks.json").write_text(json.dumps(self.checks, indent=1) + "\n")
        if self.tuning is not None:
            (self.out / "tuning.json").write_text(json.dumps(self.tuning, indent=1) + "\n")
        table = summary_table(self.results)
        env = "\n".join(f"- {k}: {v}" for k, v in self.env.items())
        (self.out / "report.md").write_text(f"# mlcpipe bundle job\n\n{env}\n\n## Summary\n\n{table}\n\n" + tune_table(self.results)
                                            + bench_tables(self.results) + "\n## Details\n\n" + "\n".join(self.sections))
        # the tables again on stdout, the summary last: the device tool returns the output's last
        # 12,000 characters even when the files under $OUT do not come back
        print(tune_table(self.results) + bench_tables(self.results, top=5), flush=True)
        print(table, flush=True)
        print(f"[job] {'ALL PASSED' if ok else 'FAILURES'}; files in {self.out}", flush=True)
        return 0 if ok else 1


def summary_table(results: dict) -> str:
    rows = ["| artifact | run (rel L2 err; tokens) | check | profile (prefill / decode tok/s) | bench |", "|---|---|---|---|---|"]
    for name, record in results.items():
        if not record.get("device", {"ok": True}).get("ok"):
            rows.append(f"| {name} | not run here: {record['device']['error']} | | | |")
            continue
        if "tune" in record:
            r = record["tune"]
            cells = ["ok: " + f"{len(r['kernels'])} kernels (tables below)" if r.get("ok") else f"FAIL: {r.get('error', 'some kernels untimed')[:80]}"]
            rows.append(f"| {name} (tune) | " + " | ".join(cells + ["-"] * 3) + " |")
            continue
        cells = []
        for step in STEPS[:-1]:
            r = record.get(step)
            if r is None:
                cells.append("-")
            elif not r.get("ok") and "error" in r:
                cells.append(f"FAIL: {r['error'][:80]}")
            elif step == "run" and "rel_l2_vs_truth" in r:
                cells.append(f"{'pass' if r['ok'] else 'FAIL'} {r['rel_l2_vs_truth']:.1e} vs f32 truth (llvm {r['llvm_rel_l2_vs_truth']:.1e}, "
                             f"allowed {r['allowed_vs_truth']:.1e}); {r['rel_l2']:.1e} vs llvm; {r['tokens_agree']}/{r['tokens_decided']} tokens")
            elif step == "run":
                cells.append(f"{'pass' if r['ok'] else 'FAIL'} {r['rel_l2']:.1e} (max {r['max_rel']:.1e}; tol {r['tolerance']:.0e}), "
                             f"{r['tokens_agree']}/{r['tokens_decided']} tokens")
            elif step == "check":
                cells.append(("pass: " if r["ok"] else "FAIL: ") + r["summary"].split(": ", 1)[-1])
            elif step == "profile":
                cells.append(f"{r['prefill_tok_s']} / {r['decode_tok_s']}")
            else:
                cells.append("ok" if r.get("ok") else "FAIL")
        rows.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(rows)


def tune_table(results: dict) -> str:
    """The tune steps' winners per kernel (µs per launch, the defaults' and the best's), or nothing."""
    rows = []
    for name, record in results.items():
        for k in (record.get("tune") or {}).get("kernels", []):
            speedup = f"{k['default_us'] / k['best_us']:.2f}x" if k["default_us"] else "-"
            knobs = " ".join(f"{a}={b}" for a, b in sorted(k["knobs"].items()))
            rows.append(f"| {name} | {k['kernel']} | {k['default_us']} | {k['best_us']} | {speedup} | {k['gbps']} | {knobs} | "
                        f"{k['candidates'] - k['failed']}/{k['candidates']} |")
    if not rows:
        return ""
    method = next((r["tune"]["method"] for r in results.values() if r.get("tune", {}).get("method")), "")
    return ("## Tuning (same run)\n\n" + f"{method}\n\n"
            + "| tuned | kernel | default µs | best µs | speed-up | best GB/s | best knobs | candidates ok |\n|---|---|---|---|---|---|---|---|\n"
            + "\n".join(rows) + "\n\n")


def bench_tables(results: dict, top: int = 12) -> str:
    """The benchmark's tables (benchmarks/llm_gpu.py renders them; `top` kernels per kernel-time
    table), or nothing."""
    if not any("bench" in r for r in results.values()):
        return ""
    try:
        from benchmarks import llm_gpu
    except ImportError:
        return ""
    return llm_gpu.render(results, top=top) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m mlcpipe.interface.job", description=__doc__.split("\n\n")[0])
    parser.add_argument("--bundle", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--steps", default=",".join(STEPS), help="comma-separated: " + ", ".join(STEPS))
    parser.add_argument("--kinds", default=None, help="only artifacts of these target kinds (default: all)")
    parser.add_argument("--budget-s", type=float, default=450.0, help="stop starting new steps after this many seconds")
    args = parser.parse_args(argv)
    steps = tuple(s.strip() for s in args.steps.split(",") if s.strip())
    bad = [s for s in steps if s not in STEPS]
    if bad:
        print(f"error: --steps {bad[0]!r}: allowed {', '.join(STEPS)}", file=sys.stderr)
        return 2
    kinds = tuple(k.strip() for k in args.kinds.split(",")) if args.kinds else None
    try:
        args.out.mkdir(parents=True, exist_ok=True)
        return Job(args.bundle, args.out, steps, kinds, args.budget_s).run()
    except BundleError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())

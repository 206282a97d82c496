"""Run the cells of a nightly matrix: each cell's TVM work in worker processes (one target per
process), `jobs` cells at a time, through the content-addressed cache (cache.py).

A cell's output is `<out>/<cell>/` (artifact/, conformance and profile reports, result.json),
created as a temp dir + one exchange; its log is `<out>/logs/<cell>.log` (written aside and moved
in when the cell ends). A failing cell is recorded (result.json with the error and its log tail)
and never stops the others. Ctrl-C stops the workers; a cell it interrupts keeps its previous
directory and log (its partial log is `logs/<cell>.interrupted.log`) and is reported as
"interrupted". Profiles take the machine alone: a profile waits for running builds to finish and
no build starts during it.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..artifact import (MANIFEST, atomic_directory, file_digests, make_temp_dir, read_manifest, remove_leftovers,
                        sha256_file, temp_sibling, write_json)
from ..config import load_model_config
from ..errors import ConfigError, signal_handled
from .. import threads
from ..targets import load_target
from . import cache
from .matrix import Cell
from .reproduce import compare
from .verify import verify_artifact

RESULT = "result.json"
LOG_TAIL_LINES = 20
HEARTBEAT_SECONDS = 30.0
# How often the main thread wakes while cells run. Cell threads block SIGINT, so Ctrl-C interrupts
# the main thread's wait; this bounds the delay should the signal land on another thread (Python
# runs handlers in the main thread only, and a wait blocked for a whole heartbeat let a build
# finish and replace its cell before the KeyboardInterrupt came).
SIGNAL_POLL_SECONDS = 0.2
CHECK_REPORTS = ("conformance.json", "conformance.txt", "profile.json", "profile.md")
REBUILD_DIFFERS = "rebuild-differs"  # a cell's second build's copy of each file that differed


class CellError(RuntimeError):
    """A cell that could not be built or checked (one line; details in its log)."""


class _BuiltMeanwhile(Exception):
    """Another nightly sharing the cache finished the entry while this one waited for its lock."""


class CellInterrupted(CellError):
    """A cell stopped by Ctrl-C or SIGTERM (or its worker by SIGINT / SIGTERM): nothing of it is kept."""


def cell_thread_init() -> None:
    """Cell threads block SIGINT: Ctrl-C goes to the main thread, which stops the workers, and a
    worker inherits the block until it ignores SIGINT (worker.main). A worker that took Ctrl-C
    during its start-up (a KeyboardInterrupt in `site`, exit 1) was reported as a failed cell and
    replaced the previous result."""
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})


class _BuildsAndProfiles:
    """Builds share the machine; a profile takes it alone (waits for builds, blocks new ones)."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._builds = 0
        self._profiling = False
        self._waiting = 0

    @contextlib.contextmanager
    def build(self):
        with self._cond:
            self._cond.wait_for(lambda: not self._profiling and not self._waiting)
            self._builds += 1
        try:
            yield
        finally:
            with self._cond:
                self._builds -= 1
                self._cond.notify_all()

    @contextlib.contextmanager
    def profile(self):
        with self._cond:
            self._waiting += 1
            self._cond.wait_for(lambda: not self._profiling and self._builds == 0)
            self._waiting -= 1
            self._profiling = True
        try:
            yield
        finally:
            with self._cond:
                self._profiling = False
                self._cond.notify_all()


def log_tail(path: Path, lines: int = LOG_TAIL_LINES) -> list[str]:
    try:
        text = Path(path).read_text(errors="replace")
    except OSError:
        return []
    return [ln for ln in text.splitlines() if ln.strip()][-lines:]


class Runner:
    def __init__(self, cells: list[Cell], out: Path, cache_dir: Path, jobs: int = 1,
                 echo: Callable[[str], None] = print) -> None:
        self.cells = cells
        self.out = Path(out)
        self.cache_dir = Path(cache_dir)
        self.jobs = max(1, jobs)
        self.echo = echo
        self.machine = _BuildsAndProfiles()
        self._children: set[subprocess.Popen] = set()
        self._children_lock = threading.Lock()
        self._stopping = threading.Event()
        self._code = cache.code_digest()
        self._started: dict[str, float] = {}
        self.interrupted = False  # Ctrl-C stopped the run

    # ---- worker processes -------------------------------------------------------------------

    def _env(self, alone: bool) -> dict[str, str]:
        """A worker's environment: TVM's threads split between the cells built at once, or every
        CPU for a profile, which has the machine alone (was: every CPU in every worker once the
        CLI had set TVM_NUM_THREADS for itself, so concurrent cells oversubscribed the CPUs)."""
        return {**os.environ, threads.ENV: threads.for_worker(1 if alone else min(self.jobs, len(self.cells)))}

    def _worker(self, cell: Cell, log, work: Path, **spec: Any) -> dict:
        """Run `python -m mlcpipe.nightly.worker` for `cell` with `spec`; its output goes to the log."""
        spec = {"model": cell.model_source, "quant": cell.quant, "preset": cell.target.preset,
                "options": cell.target.options, "result": str(work / "worker-result.json"), **spec}
        spec = {k: (str(v) if isinstance(v, Path) else v) for k, v in spec.items()}
        spec_path = work / "worker-spec.json"
        spec_path.write_text(json.dumps(spec, indent=2, default=str))
        Path(spec["result"]).unlink(missing_ok=True)
        cmd = [sys.executable, "-m", "mlcpipe.nightly.worker", str(spec_path)]
        log.write(f"$ {' '.join(cmd)}  # {', '.join(k for k in ('build', 'conformance', 'profile') if spec.get(k))}\n")
        log.flush()
        with self._children_lock:  # started and registered in one step: stop() sees it, or it is never started
            if self._stopping.is_set():
                raise CellInterrupted("interrupted")
            proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=self._env(alone=bool(spec.get("profile"))),
                                    stdin=subprocess.DEVNULL)
            self._children.add(proc)
        try:
            code = proc.wait()
        finally:
            with self._children_lock:
                self._children.discard(proc)
        log.flush()
        if code != 0 and (self._stopping.is_set() or -code in (signal.SIGINT, signal.SIGTERM)):
            # a SIGTERM sent to the whole group (`timeout`, a service's stop) may reach a worker
            # before the nightly's own handler sets _stopping
            how = "stopped" if self._stopping.is_set() else f"got {signal.Signals(-code).name}"
            raise CellInterrupted(f"interrupted (worker {how})")
        if code != 0:
            tail = [ln for ln in log_tail(Path(log.name), 40) if not ln.startswith(("  File ", "    "))]
            last = tail[-1] if tail else ""
            what = f"killed by signal {-code}" if code < 0 else f"exit {code}"
            raise CellError(f"{'build' if spec.get('build') else 'check'} failed ({what}): {last[:300]}")
        return json.loads(Path(spec["result"]).read_text())

    def stop(self) -> None:
        """Terminate every running worker (Ctrl-C): their temp dirs are never trusted. A worker
        being started meanwhile is either in `_children` here or refused by `_worker`."""
        with self._children_lock:
            self._stopping.set()
            children = list(self._children)
        for proc in children:
            with contextlib.suppress(ProcessLookupError):
                proc.terminate()
        for proc in children:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()

    # ---- one cell ---------------------------------------------------------------------------

    def _build_entry(self, cell: Cell, log, work: Path, key: str, inputs: dict, checks_out: Path) -> dict | None:
        """Build the cell into the cache (temp dir + rename); conformance runs in the same worker.
        None when another nightly sharing the cache built the entry while this one waited for it."""
        try:
            return self._build_new_entry(cell, log, work, key, inputs, checks_out)
        except _BuiltMeanwhile:
            return None

    def _build_new_entry(self, cell: Cell, log, work: Path, key: str, inputs: dict, checks_out: Path) -> dict:
        manifest_extra = {"nightly_cell": cell.id, "cache_key": key, "cache_inputs": inputs}
        conformance = cell.checks.get("conformance")
        with atomic_directory(self.cache_dir / key, wait=True) as entry:
            if cache.lookup_artifact(self.cache_dir, key) is not None:  # checked under the entry's lock
                raise _BuiltMeanwhile
            with self.machine.build():
                result = self._worker(cell, log, work, build={"output": entry / "artifact", "manifest_extra": manifest_extra},
                                      artifact=entry / "artifact", checks_out=checks_out,
                                      conformance=_settings(conformance, ("sizes", "kernels")))
            if "reproducibility" in cell.checks:
                log.write("[nightly] reproducibility: building the cell again in a fresh process\n")
                with self.machine.build():
                    self._worker(cell, log, work, build={"output": entry / "rebuild", "manifest_extra": manifest_extra})
                found = compare(entry / "artifact", entry / "rebuild")
                log.write(f"[nightly] reproducibility: {json.dumps(found)}\n")
                manifest = read_manifest(entry / "artifact")
                manifest["reproducibility"] = {"rebuilt_in_fresh_process": True, **found}
                write_json(entry / "artifact" / MANIFEST, manifest)
                for rel in found["differs"]:  # the second build's copy of each differing file, for diffing
                    if (entry / "rebuild" / rel).is_file():
                        (entry / REBUILD_DIFFERS / rel).parent.mkdir(parents=True, exist_ok=True)
                        shutil.copy2(entry / "rebuild" / rel, entry / REBUILD_DIFFERS / rel)
                shutil.rmtree(entry / "rebuild")
            problems = verify_artifact(entry / "artifact")
            if problems:
                raise CellError(f"built artifact does not verify: {problems[0]}")
        return result

    def _store_checks(self, key: str, ckey: str, stage: Path, results: dict) -> None:
        with atomic_directory(cache.checks_entry(self.cache_dir, key, ckey), wait=True) as entry:
            for name in CHECK_REPORTS:
                if (stage / name).is_file():
                    shutil.copy2(stage / name, entry / name)
            files = file_digests(entry, exclude=(cache.CHECKS_INDEX,))
            write_json(entry / cache.CHECKS_INDEX, {"checks_key": ckey, "results": results, "files": files})

    def _run_cell(self, cell: Cell, log) -> dict:
        target = load_target(cell.target.preset, cell.target.options, where=cell.target.where)
        config = load_model_config(cell.model_source)
        inputs = cache.cache_inputs(config, cell.quant, target, code=self._code)
        key = cache.digest(inputs)
        ckey = cache.checks_key(key, cell.checks)
        log.write(f"[nightly] cell {cell.id}: cache key {key}\n")
        artifact = cache.lookup_artifact(self.cache_dir, key)
        cached = artifact is not None
        cached_checks = cache.lookup_checks(self.cache_dir, key, ckey) if cached else None
        work = make_temp_dir(self.out / cell.id, "work")
        try:
            with atomic_directory(self.out / cell.id) as stage:
                record = self._fill_cell(cell, log, work, stage, key, ckey, inputs, artifact, cached, cached_checks)
        finally:
            shutil.rmtree(work, ignore_errors=True)
        return record

    def _fill_cell(self, cell: Cell, log, work: Path, stage: Path, key: str, ckey: str, inputs: dict,
                   artifact: Path | None, cached: bool, cached_checks: Path | None) -> dict:
        results: dict[str, Any] = {}
        if cached:
            log.write(f"[nightly] cache hit: {artifact}\n")
        else:
            log.write(f"[nightly] cache miss: building into {self.cache_dir / key}\n")
            built = self._build_entry(cell, log, work, key, inputs, stage)
            artifact = cache.artifact_entry(self.cache_dir, key)
            if built is None:  # was: built again and swapped in over the other run's entry
                log.write(f"[nightly] built meanwhile by another nightly sharing the cache: {artifact}\n")
                cached, cached_checks = True, cache.lookup_checks(self.cache_dir, key, ckey)
            else:
                results = built
        if cached_checks is not None:
            log.write(f"[nightly] check results reused: {cached_checks}\n")
            for name in CHECK_REPORTS:
                if (cached_checks / name).is_file():
                    shutil.copy2(cached_checks / name, stage / name)
            results = json.loads((cached_checks / cache.CHECKS_INDEX).read_text())["results"]
        else:
            if cached and "conformance" in cell.checks:
                with self.machine.build():
                    results.update(self._worker(cell, log, work, artifact=artifact, checks_out=stage,
                                                conformance=_settings(cell.checks["conformance"], ("sizes", "kernels"))))
            if "profile" in cell.checks:
                with self.machine.profile():
                    results.update(self._worker(cell, log, work, artifact=artifact, checks_out=stage,
                                                profile=_settings(cell.checks["profile"], ("prompt_len", "gen_len", "runs", "warmup"))))
            if results and all(r.get("status") != "failed" for r in results.values()):
                self._store_checks(key, ckey, stage, results)
        shutil.copytree(artifact, stage / "artifact")
        if (artifact.parent / REBUILD_DIFFERS).is_dir():
            shutil.copytree(artifact.parent / REBUILD_DIFFERS, stage / REBUILD_DIFFERS)
        record = self._record(cell, stage, key, cached, cached_checks is not None, results)
        write_json(stage / RESULT, record)
        if self._stopping.is_set():  # Ctrl-C came while the last worker finished: the cell keeps its previous result
            raise CellInterrupted("interrupted (its work finished, its cell was not replaced)")
        return record

    def _record(self, cell: Cell, stage: Path, key: str, cached: bool, checks_cached: bool, results: dict) -> dict:
        manifest = read_manifest(stage / "artifact")
        files = manifest.get("files", {})
        source = manifest.get("kernel_source")
        repro = manifest.get("reproducibility")
        failed = [name for name, r in results.items() if r.get("status") == "failed"]
        if repro is not None and not repro["identical"]:  # the second build differs: the check fails
            failed.append(f"reproducibility ({', '.join(sorted(repro['differs']))} differ)")
        return {
            **_identity(cell),
            "status": "failed" if failed else "passed",
            "error": f"{', '.join(failed)} check failed" if failed else None,
            "cached": cached,
            "checks_cached": checks_cached,
            "cache_key": key,
            "build_seconds": manifest.get("build_seconds"),
            "seconds": round(time.perf_counter() - self._started[cell.id], 2),
            "artifact": f"{cell.id}/artifact",
            "manifest_sha256": sha256_file(stage / "artifact" / MANIFEST),
            "library": manifest.get("library"),
            "sizes": {
                "library": files.get(manifest.get("library"), {}).get("bytes"),
                "kernel_source": files.get(source, {}).get("bytes") if source else None,
                "total": sum(f["bytes"] for f in files.values()),
            },
            "kernels": len(manifest.get("kernels", [])),
            "conformance": results.get("conformance"),
            "profile": results.get("profile"),
            "reproducibility": None if repro is None else {"identical": repro["identical"], "differs": repro["differs"]},
            "log": f"logs/{cell.id}.log",
        }

    def run_cell(self, cell: Cell) -> dict:
        """Build and check one cell; never raises (a failure is the returned record). An
        interrupted cell leaves `<out>/<cell>/` and its log as they were."""
        self._started[cell.id] = time.perf_counter()
        log_path = self.out / "logs" / f"{cell.id}.log"
        work_log = temp_sibling(log_path)  # moved to log_path when the cell ends
        interrupted = False
        try:
            with open(work_log, "w") as log:
                try:
                    record = self._run_cell(cell, log)
                    os.replace(work_log, log_path)
                    return record
                except Exception as exc:  # noqa: BLE001 - any failure of a cell is reported, not raised
                    interrupted = isinstance(exc, CellInterrupted) or self._stopping.is_set()
                    if not isinstance(exc, (CellError, ConfigError)):
                        traceback.print_exc(file=log)
                    error = str(exc).strip().splitlines()[-1] if str(exc).strip() else type(exc).__name__
                    log.write(f"[nightly] cell {cell.id} {'INTERRUPTED' if interrupted else 'FAILED'}: {error}\n")
            if interrupted:
                os.replace(work_log, self.out / "logs" / f"{cell.id}.interrupted.log")
                return interrupted_record(cell, f"logs/{cell.id}.interrupted.log")
            record = {
                **_identity(cell), "status": "failed", "error": error,
                "seconds": round(time.perf_counter() - self._started[cell.id], 2),
                "log": f"logs/{cell.id}.log", "log_tail": log_tail(work_log),
            }
            with atomic_directory(self.out / cell.id) as stage:
                write_json(stage / RESULT, record)
            os.replace(work_log, log_path)
            return record
        finally:
            work_log.unlink(missing_ok=True)

    # ---- all cells ---------------------------------------------------------------------------

    def run(self) -> list[dict]:
        self.out.mkdir(parents=True, exist_ok=True)
        (self.out / "logs").mkdir(exist_ok=True)
        self.cache_dir.mkdir(parents=True, exist_ok=True)
        remove_leftovers(self.out)  # what killed runs left (dead pids in the names), nothing else
        remove_leftovers(self.out / "logs")
        with cache.CacheLock(self.cache_dir):
            return self._run_all()

    def _run_all(self) -> list[dict]:
        n = len(self.cells)
        self.echo(f"[nightly] {n} cells, {self.jobs} jobs; out {self.out}; cache {self.cache_dir}")
        records: dict[str, dict] = {}
        pool = concurrent.futures.ThreadPoolExecutor(max_workers=self.jobs, thread_name_prefix="cell",
                                                     initializer=cell_thread_init)
        futures: dict[concurrent.futures.Future, Cell] = {}
        try:  # Ctrl-C while the cells are submitted (a thread's start is a wait) is handled too
            for cell in self.cells:
                futures[pool.submit(self.run_cell, cell)] = cell
            pending = set(futures)
            last_line = time.perf_counter()
            while pending:
                done, pending = concurrent.futures.wait(pending, timeout=SIGNAL_POLL_SECONDS,
                                                        return_when=concurrent.futures.FIRST_COMPLETED)
                for future in done:
                    record = future.result()
                    records[record["cell"]] = record
                    self.echo(progress_line(len(records), n, record))
                    last_line = time.perf_counter()
                if pending and time.perf_counter() - last_line >= HEARTBEAT_SECONDS:
                    now = last_line = time.perf_counter()
                    running = [f"{c.id} ({now - self._started[c.id]:.0f} s)" for f, c in futures.items()
                               if f in pending and c.id in self._started]
                    self.echo(f"[nightly] {len(records)}/{n} done; running: {', '.join(running) or '-'}")
        except KeyboardInterrupt:
            signal_handled()  # the report is written after an interrupt by design
            self.echo("[nightly] interrupted: stopping workers (no partial cell is kept; interrupted cells keep their previous result)")
            self.interrupted = True
            self.stop()
            pool.shutdown(wait=True, cancel_futures=True)
            submitted = {cell.id: future for future, cell in futures.items()}
            for cell in self.cells:
                future = submitted.get(cell.id)
                if cell.id not in records:
                    done = future is not None and future.done() and not future.cancelled()
                    records[cell.id] = future.result() if done else interrupted_record(cell, None)
            return [records[c.id] for c in self.cells]
        pool.shutdown(wait=True)
        return [records[c.id] for c in self.cells]


def interrupted_record(cell: Cell, log: str | None) -> dict:
    """What the run reports for a cell Ctrl-C stopped (never written into the cell's directory)."""
    return {**_identity(cell), "status": "interrupted", "error": "interrupted before it finished", "interrupted_log": log}


def _identity(cell: Cell) -> dict:
    return {"cell": cell.id, "model": cell.model, "quantization": cell.quant, "target": cell.target.name,
            "preset": cell.target.preset, "target_options": cell.target.options}


def _settings(check: dict | None, keys: tuple[str, ...]) -> dict | None:
    return None if check is None else {k: check[k] for k in keys}


def progress_line(done: int, total: int, record: dict) -> str:
    word = {"passed": "PASS", "interrupted": "INTERRUPTED"}.get(record["status"], "FAIL")
    head = f"[nightly] [{done}/{total}] {word} {record['cell']} ({record.get('seconds', 0):.1f} s"
    if record["status"] != "passed":
        tail = record.get("log_tail") or []
        lines = [f"{head}): {record.get('error')}; log: {record.get('log')}"]
        return "\n".join(lines + [f"    | {ln}" for ln in tail[-8:]])
    parts = ["cached" if record.get("cached") else f"built in {record.get('build_seconds')} s"]
    if record.get("conformance"):
        parts.append(f"conformance {record['conformance']['status']}")
    if record.get("profile") and record["profile"].get("headline"):
        parts.append(f"decode {record['profile']['headline']['decode_ms_per_token_p50']} ms/token")
    if record.get("reproducibility") and not record["reproducibility"]["identical"]:
        parts.append(f"NOT reproducible: {sorted(record['reproducibility']['differs'])}")
    return f"{head}, {'; '.join(parts)})"

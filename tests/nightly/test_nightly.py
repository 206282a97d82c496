"""`mlcpipe nightly` / `mlcpipe verify` end to end on a small matrix (llama-tiny x 2 quants x llvm,
webgpu, metal, plus a target with a bad option), run as users run it (the CLI, in subprocesses):

  A  killed (SIGKILL to the whole process group) while a build is in progress;
  B  the same command again: finishes the matrix, reuses what A completed, rebuilds what A was
     building, reports the bad cells with their log while the others pass (exit status 1);
  C  into a new directory with --previous B: every good cell comes from the cache; regression table.
Then verify (a flipped byte, a missing file), report-only merging, reproducibility.
"""

from __future__ import annotations

import copy
import json
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest

from mlcpipe.errors import ConfigError
from mlcpipe.nightly.matrix import load_matrix
from mlcpipe.profiler.compare import kernel_rows

from tests.helpers import REPO

MLCPIPE = [sys.executable, "-m", "mlcpipe.cli"]
SNAPSHOT: Path | None = None  # a frozen copy of the source the nightly runs from (see `source`)

MATRIX = """\
models: [llama-tiny]
quantizations: [q4f16_1, q4f32_1]
targets:
  - llvm
  - webgpu
  - metal
  - {name: llvm-badopt, preset: llvm, options: {mcpu: native}}   # refused at build time: a failing cell
checks:
  conformance: {targets: [llvm, webgpu, metal], sizes: [1], kernels: "^fused_dequantize_NT_matmul"}
  profile: {targets: [llvm], prompt_len: 8, gen_len: 4, runs: 3, warmup: 1}
  reproducibility: {targets: [llvm]}
"""
GOOD = [f"llama-tiny-{q}-{t}" for t in ("llvm", "webgpu", "metal") for q in ("q4f16_1", "q4f32_1")]
BAD = [f"llama-tiny-{q}-llvm-badopt" for q in ("q4f16_1", "q4f32_1")]


def _env() -> dict[str, str]:
    env = dict(os.environ)
    if SNAPSHOT is not None:
        env["PYTHONPATH"] = os.pathsep.join([str(SNAPSHOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return env


def mlcpipe(*args, check_rc: int | None = None, **kwargs) -> subprocess.CompletedProcess:
    proc = subprocess.run([*MLCPIPE, *map(str, args)], capture_output=True, text=True, cwd=SNAPSHOT or REPO,
                          env=_env(), **kwargs)
    if check_rc is not None:
        assert proc.returncode == check_rc, f"exit {proc.returncode}\n{proc.stdout}\n{proc.stderr[-4000:]}"
    return proc


def temp_dirs(directory: Path) -> list[Path]:
    return [p for p in directory.iterdir() if ".tmp-" in p.name] if directory.is_dir() else []


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    """The cache key hashes every file under pipeline/ and schedules/: the runs below use a frozen
    copy of the source, so that an edit in the working tree while they run (other work on this
    checkout) cannot turn the second run's cache hits into rebuilds."""
    global SNAPSHOT
    snap = tmp_path_factory.mktemp("src")
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for name in ("pipeline", "schedules", "configs"):
        shutil.copytree(REPO / name, snap / name, ignore=ignore)
    (snap / "node_modules").symlink_to(REPO / "node_modules")  # the checkout's npm packages (WebGPU runner)
    SNAPSHOT = snap
    yield snap
    SNAPSHOT = None


# The tests of these runs are marked dawn and lavapipe: `conformance` runs the matrix's webgpu cells
# in Dawn (f32) and on lavapipe (f16 kernels, where no Dawn adapter here has shader-f16).
@pytest.fixture(scope="module")
def runs(tmp_path_factory, source):
    root = tmp_path_factory.mktemp("nightly")
    matrix = root / "matrix.yaml"
    matrix.write_text(MATRIX)
    cache, n1, n2 = root / ".cache", root / "n1", root / "n2"
    timings = {}

    # A: killed while a build is in progress (a cache temp dir exists) and at least one cell is done
    started = time.perf_counter()
    proc = subprocess.Popen([*MLCPIPE, "nightly", "--matrix", matrix, "--out", n1, "--jobs", "2"], cwd=source, env=_env(),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    killed_keys: set[str] = set()
    try:
        deadline = time.time() + 400
        while time.time() < deadline and proc.poll() is None:
            done = [c for c in GOOD if (n1 / c / "result.json").is_file()]
            building = [p for p in temp_dirs(cache) if p.name.startswith(".") and len(p.name.split(".tmp-")[0]) == 65]
            if done and building:
                killed_keys = {p.name[1:].split(".tmp-")[0] for p in building}
                os.killpg(proc.pid, signal.SIGKILL)
                break
            time.sleep(0.2)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    timings["A (killed)"] = time.perf_counter() - started
    assert killed_keys, "run A finished or timed out before it could be killed mid-build"
    after_kill = {
        "cache_entries": sorted(p.name for p in cache.iterdir() if not p.name.startswith(".")),
        "cells": sorted(p.name for p in n1.iterdir() if (p / "result.json").is_file()),
        "temp_dirs": [p.name for p in temp_dirs(cache) + temp_dirs(n1)],
    }

    started = time.perf_counter()
    b = mlcpipe("nightly", "--matrix", matrix, "--out", n1, "--jobs", "2")
    timings["B (resume)"] = time.perf_counter() - started
    started = time.perf_counter()
    c = mlcpipe("nightly", "--matrix", matrix, "--out", n2, "--jobs", "2", "--previous", n1)
    timings["C (cached)"] = time.perf_counter() - started
    print("nightly timings:", {k: f"{v:.1f} s" for k, v in timings.items()})
    return {"root": root, "matrix": matrix, "cache": cache, "n1": n1, "n2": n2, "b": b, "c": c,
            "killed_keys": killed_keys, "after_kill": after_kill}


def index(path: Path) -> dict:
    return json.loads((path / "index.json").read_text())


def cells(path: Path) -> dict[str, dict]:
    return {r["cell"]: r for r in index(path)["cells"]}


@pytest.mark.dawn
@pytest.mark.lavapipe
def test_interrupted_run_leaves_nothing_trusted(runs):
    """Everything A left under a trusted name is complete; what it was building is rebuilt by B."""
    from mlcpipe.nightly.verify import verify_artifact

    state = runs["after_kill"]
    assert state["temp_dirs"], "A was not killed mid-way"
    for key in state["cache_entries"]:
        assert verify_artifact(runs["cache"] / key / "artifact") == []
    for key in runs["killed_keys"]:
        assert key not in state["cache_entries"]
    by_key = {r.get("cache_key"): r for r in cells(runs["n1"]).values()}
    for key in runs["killed_keys"]:
        assert by_key[key]["cached"] is False, f"{by_key[key]['cell']} was trusted after the kill"
    resumed = [r for r in cells(runs["n1"]).values() if r["cell"] in state["cells"] and r["cell"] in GOOD]
    assert resumed and all(r["cached"] for r in resumed), "cells finished by A are not reused by B"
    assert not temp_dirs(runs["n1"]) and not temp_dirs(runs["cache"])


@pytest.mark.dawn
@pytest.mark.lavapipe
def test_matrix_end_to_end_with_a_failing_cell(runs):
    b, n1 = runs["b"], runs["n1"]
    assert b.returncode == 1, b.stderr[-3000:]
    got = cells(n1)
    assert sorted(got) == sorted(GOOD + BAD)
    for cell in GOOD:
        r = got[cell]
        assert r["status"] == "passed", (cell, r.get("error"), (n1 / r["log"]).read_text()[-2000:])
        manifest = json.loads((n1 / cell / "artifact" / "manifest.json").read_text())
        assert manifest["cache_key"] == r["cache_key"] and manifest["files"]
        assert r["kernels"] == len(manifest["kernels"]) > 0 and r["sizes"]["library"] > 0
        expected = {"llvm": "passed", "webgpu": "passed", "metal": "static-only"}[r["target"]]
        assert r["conformance"]["status"] == expected
    for cell in (c for c in GOOD if c.endswith("-llvm")):
        headline = got[cell]["profile"]["headline"]
        assert headline["decode_ms_per_token_p50"] > 0 and headline["prefill_tok_s"] > 0
        assert (n1 / cell / "profile.json").is_file()
    for cell in BAD:
        r = got[cell]
        assert r["status"] == "failed" and "field 'targets[3].options.mcpu': got 'native'" in r["error"] and r["log_tail"]
        assert (n1 / r["log"]).is_file() and not (n1 / cell / "artifact").exists()
        assert f"FAIL {cell}" in b.stderr
    summary = (n1 / "SUMMARY.md").read_text()
    passed = sum(got[c]["status"] == "passed" for c in GOOD)
    assert f"{passed}/8 cells passed" in summary and "## Failures" in summary and "'native'" in summary
    assert "static-only" in summary


@pytest.mark.dawn
@pytest.mark.lavapipe
def test_second_run_hits_the_cache_for_every_cell(runs):
    c, n2 = runs["c"], runs["n2"]
    assert c.returncode == 1  # the bad cells fail again; nothing else
    got = cells(n2)
    for cell in GOOD:
        assert got[cell]["status"] == "passed" and got[cell]["cached"] and got[cell]["checks_cached"], cell
        assert got[cell]["cache_key"] == cells(runs["n1"])[cell]["cache_key"]
    assert "worker" not in "".join((n2 / "logs" / f"{cell}.log").read_text() for cell in GOOD)


@pytest.mark.dawn
@pytest.mark.lavapipe
def test_regression_table_against_previous(runs):
    n2 = runs["n2"]
    reg = index(n2)["regressions"]
    assert reg and reg["previous"] == str(runs["n1"])
    by_cell = {c["cell"]: c for c in reg["cells"]}
    assert sorted(by_cell) == sorted(GOOD)  # a cell that failed only its reproducibility check too
    llvm = by_cell["llama-tiny-q4f16_1-llvm"]
    assert llvm["sizes"]["library"]["change_pct"] == 0.0 and llvm["new_kernels"] == [] == llvm["removed_kernels"]
    assert llvm["kernel_times"]["verdicts"]["regression"] == 0 and (n2 / llvm["report"]).is_file()
    assert "## Regressions against" in (n2 / "SUMMARY.md").read_text()


@pytest.mark.dawn
@pytest.mark.lavapipe
def test_report_only_flags_a_slower_kernel_and_kernel_changes(runs, tmp_path):
    """Merging (CI's last job) with a doctored profile: a 3x slower decode kernel is a regression;
    a kernel only the previous nightly had is listed as removed. The doctored profile is the previous
    one with that kernel slowed, so the machine's drift between the two nightlies cannot hide it.
    The kernel is the heaviest one whose calls are steady enough for the noise rule to judge 3x
    (tests/profiler test the rule): on a loaded machine a kernel with many stalled calls overlaps
    its own tripled calls (U test p 0.08 once in CI) and is rightly called noise."""
    cur, prev = tmp_path / "cur", tmp_path / "prev"
    shutil.copytree(runs["n2"], cur)
    shutil.copytree(runs["n1"], prev)
    cell = "llama-tiny-q4f16_1-llvm"
    profile = json.loads((prev / cell / "profile.json").read_text())
    decode = [s for s in profile["samples"] if s["phase"] == "decode"]

    def tripled(kernel: str) -> dict:
        out = copy.deepcopy(profile)
        for s in out["samples"]:
            if s["kernel"] == kernel and s["phase"] == "decode":
                s["ms"] *= 3
        return out

    judged = [k for k in {s["kernel"] for s in decode}
              if [r["verdict"] for r in kernel_rows(profile, tripled(k)) if (r["kernel"], r["phase"]) == (k, "decode")] == ["regression"]]
    assert judged, "no decode kernel's calls are steady enough for a 3x slowdown to be significant"
    slow = max(judged, key=lambda k: sum(s["ms"] for s in decode if s["kernel"] == k))
    (cur / cell / "profile.json").write_text(json.dumps(tripled(slow)))
    manifest = json.loads((prev / cell / "artifact" / "manifest.json").read_text())
    manifest["kernels"].append({"name": "retired_kernel", "args": [], "role": "other"})
    (prev / cell / "artifact" / "manifest.json").write_text(json.dumps(manifest))
    proc = mlcpipe("nightly", "--matrix", runs["matrix"], "--out", cur, "--report-only", "--previous", prev)
    assert proc.returncode == 1  # the bad cells
    reg = {c["cell"]: c for c in index(cur)["regressions"]["cells"]}[cell]
    flagged = [r for r in reg["kernel_times"]["rows"] if r["verdict"] == "regression"]
    assert [(r["kernel"], r["phase"]) for r in flagged] == [(slow, "decode")]
    assert flagged[0]["p"] < 0.05 and flagged[0]["change_pct"] > 150
    assert reg["removed_kernels"] == ["retired_kernel"]
    summary = (cur / "SUMMARY.md").read_text()
    assert slow in summary and "regression" in summary and "retired_kernel" in summary
    mlcpipe("verify", cur, check_rc=0)
    # was: the same verdicts against a nightly of another machine (CI runners vary), where a CPU's
    # speed is no regression: now the cell's kernel times are not compared, and the table says why
    profile["device"] = "Another CPU (2 threads)"
    (prev / cell / "profile.json").write_text(json.dumps(profile))
    proc = mlcpipe("nightly", "--matrix", runs["matrix"], "--out", cur, "--report-only", "--previous", prev)
    assert proc.returncode == 1 and f"against {prev}: 0 kernel regressions flagged" in proc.stdout + proc.stderr
    reg = {c["cell"]: c for c in index(cur)["regressions"]["cells"]}[cell]
    assert reg["kernel_times"] == {"not_compared": "the previous profile ran on Another CPU (2 threads) (kind llvm, "
                                   f"mcpu {profile['target']['mcpu']}), this one on {json.loads((cur / cell / 'profile.json').read_text())['device']} "
                                   f"(kind llvm, mcpu {profile['target']['mcpu']})"}
    assert reg["removed_kernels"] == ["retired_kernel"] and not (cur / "regressions" / f"{cell}.md").exists()  # nor the last A/B
    summary = (cur / "SUMMARY.md").read_text()
    assert f"Kernel times not compared (another machine): `{cell}`: the previous profile ran on Another CPU" in summary
    assert slow not in summary.split("### Per-kernel time changes")[1].split("Kernel times not compared")[0]


@pytest.mark.dawn
@pytest.mark.lavapipe
def test_verify_catches_a_flipped_byte_and_a_missing_file(runs, tmp_path):
    nightly = tmp_path / "n"
    shutil.copytree(runs["n2"], nightly)
    proc = mlcpipe("verify", nightly, check_rc=0)
    assert proc.stdout.startswith("ok:")
    artifact = nightly / "llama-tiny-q4f32_1-webgpu" / "artifact"
    mlcpipe("verify", artifact, check_rc=0)
    lib = artifact / "lib.wasm"
    data = bytearray(lib.read_bytes())
    data[len(data) // 2] ^= 0x01
    lib.write_bytes(bytes(data))
    for target in (nightly, artifact):
        proc = mlcpipe("verify", target, check_rc=1)
        assert "lib.wasm" in proc.stderr and "sha256" in proc.stderr
    (nightly / "llama-tiny-q4f16_1-llvm" / "profile.md").unlink()
    proc = mlcpipe("verify", nightly, check_rc=1)
    assert "profile.md: missing" in proc.stderr
    proc = mlcpipe("verify", tmp_path, check_rc=2)
    assert "neither a nightly directory" in proc.stderr
    proc = mlcpipe("verify", artifact.parent, check_rc=2)  # was: "neither a nightly directory nor an artifact"
    assert proc.stderr.strip().endswith(f"a nightly cell, not a nightly directory (index.json) or an artifact (manifest.json); "
                                        f"verify the nightly {nightly.resolve()} or the cell's artifact {artifact}")
    proc = mlcpipe("verify", artifact / "manifest.json", check_rc=2)  # was: "no such directory"
    assert proc.stderr.strip().endswith("manifest.json: not a directory (give the nightly directory or the artifact directory)")


@pytest.mark.dawn
@pytest.mark.lavapipe
def test_reproducible_builds(runs, tmp_path):
    """llvm cells were built twice in fresh processes: identical. Metal: the dylib is a function of
    its objects (re-linking lib.tar's objects elsewhere gives the same bytes), lib.tar is normalised."""
    from mlcpipe.backends.metal import extract_objects, link_dylib

    got = cells(runs["n1"])
    for cell in (c for c in GOOD if c.endswith("-llvm")):  # built (in run A or B) with the reproducibility check
        repro = json.loads((runs["n1"] / cell / "artifact" / "manifest.json").read_text())["reproducibility"]
        assert repro["rebuilt_in_fresh_process"] and repro["files"] >= 4
        assert got[cell]["reproducibility"] == {"identical": repro["identical"], "differs": repro["differs"]}
        # every file, lib.so included (its Relax shape functions: passes/shape_funcs.py)
        assert repro["identical"] and not repro["differs"], repro["differs"]
    artifact = runs["n1"] / "llama-tiny-q4f16_1-metal" / "artifact"
    with tarfile.open(artifact / "lib.tar") as tar:
        assert all(m.mtime == 0 and m.uid == 0 for m in tar.getmembers())
    outputs = []
    for i in range(2):
        (tmp_path / f"objs{i}").mkdir()
        objects = extract_objects(artifact / "lib.tar", (tmp_path / f"objs{i}").resolve())
        if i:
            os.utime(objects[0], (1, 1))
        (tmp_path / f"out{i}").mkdir()
        link_dylib(objects, tmp_path / f"out{i}" / "lib.dylib")
        outputs.append((tmp_path / f"out{i}" / "lib.dylib").read_bytes())
    assert outputs[0] == outputs[1] == (artifact / "lib.dylib").read_bytes()


@pytest.mark.dawn
@pytest.mark.lavapipe
def test_explain_names_what_differs(runs, tmp_path):
    from mlcpipe.backends.binfmt import MachO
    from mlcpipe.nightly.reproduce import explain

    # a Mach-O whose UUID differs (as ld64.lld-14 writes a new one on every link)
    dylib = runs["n1"] / "llama-tiny-q4f16_1-metal" / "artifact" / "lib.dylib"
    other = tmp_path / "lib.dylib"
    data = bytearray(dylib.read_bytes())
    start, end = MachO(bytes(data)).uuid_span()
    data[start:end] = bytes(range(16))
    other.write_bytes(bytes(data))
    assert "LC_UUID differs" in explain(dylib, other)
    # tarballs whose members differ only in mtime
    a, b = tmp_path / "a.tar", tmp_path / "b.tar"
    (tmp_path / "x.o").write_bytes(b"object")
    for path, mtime in ((a, 1), (b, 2)):
        os.utime(tmp_path / "x.o", (mtime, mtime))
        with tarfile.open(path, "w") as tar:
            tar.add(tmp_path / "x.o", arcname="x.o")
    assert "mtime" in explain(a, b)


def test_matrix_errors_are_one_line_before_anything_builds(tmp_path):
    base = "models: [llama-tiny]\nquantizations: [q4f16_1]\ntargets: [llvm]\n"
    cases = {
        base.replace("[llvm]", "[llvm, vulkan]"): "field 'targets[1]': got 'vulkan'; allowed:",
        base.replace("[q4f16_1]", "[q4f16_1, q3f16]"): "field 'quantizations[1]': got 'q3f16'; allowed:",
        base.replace("[llama-tiny]", "[llama-9b]"): "field 'models[0]': got 'llama-9b'; allowed:",
        base + "checks: {profile: {targets: [llvm], runs: 0}}\n": "field 'checks.profile.runs': got 0;",
        base + "checks: {conformance: {targets: [llvm], kernels: '('}}\n": "field 'checks.conformance.kernels': got '('",
        base + "checks: {conformance: {targets: [llvm], sizes: [1, 300]}}\n":
            "field 'checks.conformance.sizes': got 300; at most the context window of model llama-tiny (256 tokens)",
        base + "checks: {profile: {targets: [llvm], prompt_len: 250}}\n":
            "field 'checks.profile.prompt_len': got 250; prompt_len + gen_len (32) must fit the context window of model llama-tiny",
        # were accepted: every kernel checked twice at size 1; the target's check listed twice
        base + "checks: {conformance: {targets: [llvm], sizes: [1, 7, 1]}}\n": "field 'checks.conformance.sizes': got [1, 7, 1]; expected each size once",
        base + "checks: {profile: {targets: [llvm, llvm]}}\n": "field 'checks.profile.targets[1]': got 'llvm'; expected each target once",
        base + "checks: {lint: {}}\n": "field 'checks.lint'",
    }
    from mlcpipe.errors import ConfigError

    path = tmp_path / "m.yaml"
    for text, message in cases.items():
        path.write_text(text)
        with pytest.raises(ConfigError) as err:
            load_matrix(path)
        assert message in str(err.value) and str(path) in str(err.value) and "\n" not in str(err.value)
    proc = mlcpipe("nightly", "--matrix", path, "--out", tmp_path / "out", check_rc=2)  # the CLI: one line, exit 2
    assert proc.stderr.startswith("error: ") and "checks.lint" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "out").exists()
    # was: every cell of the matrix, as with no --cell (a CI job's `--cell "$CELL"` with CELL unset)
    proc = mlcpipe("nightly", "--out", tmp_path / "out", "--cell", " ", check_rc=2)
    assert "Invalid value for --cell: ' ' names no cell; give a cell id (mlcpipe nightly --list-cells)" in proc.stderr
    assert not (tmp_path / "out").exists()


def test_a_bad_target_option_fails_its_cells_naming_the_matrix_field(tmp_path):
    """Were: errors naming flags the user never gave (--mcpu, --arch) or the preset file, and TVM's
    error with the whole target dict; `kind` turned the llvm preset into a cuda target and
    `peak_gbps` was ignored by every report."""
    cases = [  # (target entry, the start of its cell's error after the field)
        ("{preset: llvm, options: {mcpu: bogus}}", "mcpu': got 'bogus'; not a CPU LLVM knows for "),
        ("{preset: llvm, options: {nosuch: 1}}",
         "nosuch': got 1; rejected by TVM for llvm targets: Unknown config option 'nosuch'. Known options: 'kind',"),
        ("{preset: llvm, options: {opt-level: lots}}", "opt-level': got 'lots'; rejected by TVM for llvm targets: Option 'opt-level'"),
        ("{preset: llvm, options: {arch: sm_90}}", "arch': preset llvm: applies to cuda targets only, not llvm"),
        ("{preset: metal, options: {mcpu: znver3}}", "mcpu': preset metal: applies to llvm targets only, not metal"),
        ("{preset: cuda, options: {arch: sm_1}}", "arch': got 'sm_1'; not an arch nvcc compiles for"),
        ("{preset: cuda, options: {fatbin_archs: [sm_90, sm_2]}}", "fatbin_archs': got 'sm_2'; not an arch nvcc compiles for"),
        ("{preset: cuda, options: {cuda_graph: 3}}", "cuda_graph': got 3; expected true or false"),
        ("{preset: webgpu, options: {supports_subgroups: 3}}", "supports_subgroups': got 3; expected true or false"),
        ("{preset: llvm, options: {kind: cuda}}", "kind': got 'cuda'; the preset's kind (llvm) is not an override"),
        ("{preset: llvm, options: {peak_gbps: 50}}", "peak_gbps': got 50; reports take the preset's figure"),
        # was g++'s "ld returned 1" after the whole compile
        ("{preset: llvm, options: {mtriple: riscv64-unknown-linux-gnu}}",
         "mtriple': got 'riscv64-unknown-linux-gnu'; llvm libraries are linked on this machine by its C++ compiler"),
    ]
    matrix = tmp_path / "m.yaml"
    targets = ", ".join(f"{{name: t{i}, {entry[1:]}" for i, (entry, _) in enumerate(cases))
    matrix.write_text(f"models: [llama-tiny]\nquantizations: [q4f16_1]\ntargets: [{targets}]\n")
    assert len(load_matrix(matrix).cells) == len(cases)  # the matrix itself is fine: --list-cells needs no TVM
    proc = mlcpipe("nightly", "--matrix", matrix, "--out", tmp_path / "out", "--jobs", "1", check_rc=1)
    got = cells(tmp_path / "out")
    for i, (entry, message) in enumerate(cases):
        r = got[f"llama-tiny-q4f16_1-t{i}"]
        assert r["status"] == "failed" and r["error"].startswith(f"{matrix}: field 'targets[{i}].options.{message}"), (entry, r["error"])
        assert "\n" not in r["error"] and f"FAIL llama-tiny-q4f16_1-t{i}" in proc.stderr
    # the same options from the command line are still named as flags
    proc = subprocess.run([*MLCPIPE, "build", "--model", "llama-tiny", "--quant", "q4f16_1", "--target", "cuda", "--arch", "sm_1",
                           "--output", tmp_path / "b"], capture_output=True, text=True, cwd=tmp_path, env=_env())
    assert proc.returncode == 2 and proc.stderr.startswith("error: --arch 'sm_1': not an arch nvcc compiles for"), proc.stderr


def test_previous_that_is_out_is_refused(tmp_path):
    """Was: `--out X --previous X` read X's cells for the regression table after the run had
    replaced them: the run compared with itself, "0 kernel regressions flagged" every night."""
    out = tmp_path / "nightly"
    out.mkdir()
    (out / "index.json").write_text("{}")  # what marks a nightly directory for --previous
    (tmp_path / "m.yaml").write_text("models: [llama-tiny]\nquantizations: [q4f16_1]\ntargets: [llvm]\n")
    for previous, extra in ((out, []), (tmp_path / "." / "nightly", ["--report-only"])):
        proc = mlcpipe("nightly", "--matrix", tmp_path / "m.yaml", "--out", out, "--previous", previous, *extra, check_rc=2)
        assert proc.stderr.strip() == (f"error: --previous '{previous}': is --out itself (the regression table would compare "
                                       "the run with itself); give the last nightly's own directory (e.g. artifacts/nightly/<yesterday>)")
    assert sorted(p.name for p in out.iterdir()) == ["index.json"] and not (tmp_path / ".cache").exists()


def test_two_nightlies_sharing_a_cache_build_a_cell_once(tmp_path):
    """Was: both missed the cache, and the second, once the first's entry lock was free, built the
    cell again and swapped its entry in over the first's. Now it finds the entry built meanwhile
    (checked under the lock) and takes it as a cache hit. The first is held stopped mid-build until
    the second is seen waiting for the entry's lock (/proc/locks), so no timing decides the path."""
    matrix, cache, cell = tmp_path / "m.yaml", tmp_path / "cache", "llama-tiny-q4f32_1-llvm"
    matrix.write_text("models: [llama-tiny]\nquantizations: [q4f32_1]\ntargets: [llvm]\n")

    def nightly(out: str, **kwargs) -> subprocess.Popen:
        return subprocess.Popen([*MLCPIPE, "nightly", "--matrix", str(matrix), "--out", str(tmp_path / out), "--cache", str(cache)],
                                cwd=REPO, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kwargs)

    def wait_for(what: str, ready, proc: subprocess.Popen) -> None:
        deadline = time.time() + 120
        while not ready():
            assert time.time() < deadline and proc.poll() is None, f"{what} not seen: {proc.poll()=}"
            time.sleep(0.1)

    first = nightly("a", start_new_session=True)
    try:
        wait_for("the first run's cache build", lambda: cache.is_dir() and any(".tmp-" in p.name for p in cache.iterdir()), first)
        os.killpg(first.pid, signal.SIGSTOP)
        second = nightly("b")
        wait_for("the second run waiting for the entry", lambda: any(
            "->" in line and f" {second.pid} " in line for line in Path("/proc/locks").read_text().splitlines()), second)
    finally:
        os.killpg(first.pid, signal.SIGCONT)
    for proc in (first, second):
        _, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err[-3000:]
    assert not cells(tmp_path / "a")[cell]["cached"] and cells(tmp_path / "b")[cell]["cached"]
    assert "built meanwhile by another nightly sharing the cache" in (tmp_path / "b" / "logs" / f"{cell}.log").read_text()


def test_default_matrix_and_workflow(source):
    import yaml

    ids = [c.id for c in load_matrix().cells]
    families = ["llama-3.2-1b", "qwen2.5-0.5b", "qwen3-0.6b", "gemma-3-1b", "smollm2-1.7b"]
    assert ids == [f"{m}-{q}-{t}" for m in families for t in ("metal", "cuda", "webgpu", "llvm")
                   for q in ("q0f16", "q4f16_1", "q4f32_1")]
    proc = mlcpipe("nightly", "--list-cells", check_rc=0)
    assert json.loads(proc.stdout) == ids
    # with --cell: the cells named, each checked (was: --cell ignored, all 60 listed)
    proc = mlcpipe("nightly", "--list-cells", "--cell", f"{ids[7]},{ids[2]}", "--cell", ids[7], check_rc=0)
    assert json.loads(proc.stdout) == [ids[7], ids[2]]
    proc = mlcpipe("nightly", "--list-cells", "--cell", "zzz", check_rc=2)
    assert proc.stderr.startswith("error: --cell 'zzz': not a cell of ") and proc.stdout == ""
    # a mistyped cell: the closest ids, not all 60 in one line
    with pytest.raises(ConfigError, match=r"--cell 'llama-3.2-1b-q4f32-llvm': not a cell of .*nightly\.yaml "
                                          r"\(closest: llama-3\.2-1b-q4f32_1-llvm, "):
        load_matrix().select(["llama-3.2-1b-q4f32-llvm"])
    with pytest.raises(ConfigError, match=r"--cell 'zzz': .* \(60 cells: mlcpipe nightly --matrix .*nightly\.yaml --list-cells\)$"):
        load_matrix().select(["qwen3-0.6b-q0f16-llvm", "zzz"])
    flow = yaml.safe_load((REPO / ".github" / "workflows" / "nightly.yml").read_text())
    assert flow[True]["schedule"][0]["cron"]
    build = flow["jobs"]["build"]
    assert "fromJSON" in build["strategy"]["matrix"]["cell"]
    steps = " ".join(str(s.get("run", "")) + str(s.get("uses", "")) for job in flow["jobs"].values() for s in job["steps"])
    for command in ("mlcpipe nightly --matrix", "--list-cells", "--cell", "--report-only", "mlcpipe verify",
                    "actions/upload-artifact"):
        assert command in steps


def test_explain_names_functions_when_elf_sizes_differ(tmp_path):
    """Two shared objects whose one function differs in length (as a Relax shape function compiled
    twice sometimes does): the explanation names that function, not only the sizes."""

    from mlcpipe.nightly.reproduce import explain

    libs = []
    longer = "volatile int y = x; " + " ".join(f"y = y * 3 + {k};" for k in range(800)) + " return y;"
    for i, body in enumerate(("return x + 1;", longer)):
        src = tmp_path / f"f{i}.c"
        src.write_text(f"int same(int x) {{ return x - 1; }}\nint shape_func(int x) {{ {body} }}\n")
        lib = tmp_path / f"lib{i}.so"
        subprocess.run(["gcc", "-O0", "-shared", "-fPIC", "-o", str(lib), str(src)], check=True)
        libs.append(lib)
    assert libs[0].stat().st_size != libs[1].stat().st_size
    why = explain(*libs)
    assert why.startswith("sizes ") and "code differs in shape_func (" in why and "same (" not in why, why


def test_a_build_that_is_not_reproducible_fails_its_cell(tmp_path, monkeypatch):
    """The reproducibility check can fail a cell: here the comparison of the two builds says lib.so
    differs (as the llvm shape functions did before passes/shape_funcs.py); the cell fails and says why."""
    from mlcpipe.nightly import runner as nightly_runner

    matrix = tmp_path / "m.yaml"
    matrix.write_text("models: [llama-tiny]\nquantizations: [q4f32_1]\ntargets: [llvm]\n"
                      "checks: {reproducibility: {targets: [llvm]}}\n")
    [cell] = load_matrix(matrix).cells
    compared = []

    def differs(first, second):
        compared.append((first, second))
        return {"identical": False, "files": 4, "excluded": {}, "differs": {"lib.so": "code differs in shape_func"}}

    monkeypatch.setattr(nightly_runner, "compare", differs)
    record = nightly_runner.Runner([cell], tmp_path / "out", tmp_path / "cache").run()[0]
    assert compared and record["status"] == "failed", record
    assert "reproducibility (lib.so differ" in record["error"]
    assert record["reproducibility"] == {"identical": False, "differs": {"lib.so": "code differs in shape_func"}}


def test_ctrl_c_while_a_worker_starts_stops_it(tmp_path, monkeypatch):
    """Was: stop() (Ctrl-C) read the running workers while a cell thread was between its check and
    starting the next one; that worker was never stopped and its cell was rebuilt and replaced
    after Ctrl-C. Now starting and registering a worker is one step under the lock stop() takes."""
    import threading
    from types import SimpleNamespace

    from mlcpipe.nightly import runner as runner_module

    runner = runner_module.Runner([], tmp_path / "out", tmp_path / "cache")
    real = subprocess.Popen

    def popen(cmd, **kwargs):  # Ctrl-C lands while the worker is being started
        threading.Thread(target=runner.stop, daemon=True).start()
        time.sleep(0.3)
        return real(["sleep", "5"], **kwargs)

    monkeypatch.setattr(runner_module.subprocess, "Popen", popen)
    cell = SimpleNamespace(model_source="llama-tiny", quant="q4f32_1", target=SimpleNamespace(preset="llvm", options={}))
    (tmp_path / "work").mkdir()
    started = time.perf_counter()
    with open(tmp_path / "log", "w") as log, pytest.raises(runner_module.CellInterrupted, match="worker stopped"):
        runner._worker(cell, log, tmp_path / "work", build={"output": str(tmp_path / "a")})
    assert time.perf_counter() - started < 4, "the worker ran on after Ctrl-C"
    with open(tmp_path / "log", "a") as log, pytest.raises(runner_module.CellInterrupted, match="^interrupted$"):
        runner._worker(cell, log, tmp_path / "work")  # once stopping, no worker starts


def test_ctrl_c_while_cells_run_stops_the_run_at_once(tmp_path, monkeypatch):
    """Was: Ctrl-C's SIGINT could land on a cell thread; Python runs the handler in the main thread,
    which slept in a wait for a whole heartbeat (30 s) meanwhile, so a build could finish and
    replace its cell after Ctrl-C (test_outputs' Ctrl-C test failed that way once in CI). Now cell
    threads block SIGINT (it interrupts the main thread's wait) and the main thread wakes every
    SIGNAL_POLL_SECONDS: the run stops well inside a heartbeat, the cell is reported interrupted
    and keeps what it had."""
    import signal
    from types import SimpleNamespace

    from mlcpipe.nightly import runner as runner_module

    cell = SimpleNamespace(id="c1", model="llama-tiny", quant="q4f32_1", target=SimpleNamespace(name="llvm", preset="llvm", options={}))
    runner = runner_module.Runner([], tmp_path / "out", tmp_path / "cache")
    runner.cells = [cell]
    monkeypatch.setattr(runner_module, "HEARTBEAT_SECONDS", 60.0)
    finished, masks = [], []

    def run_cell(c):
        runner._started[c.id] = time.perf_counter()
        time.sleep(0.5)  # the main thread is waiting on the cells by now
        masks.append(signal.pthread_sigmask(signal.SIG_BLOCK, []))
        os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C: to the process, sent from this (cell) thread
        if runner._stopping.wait(20):  # what stop() sets
            return runner_module.interrupted_record(c, None)
        finished.append(c.id)  # the "build" ran to its end: it would have replaced the cell
        return {"cell": c.id, "status": "passed"}

    monkeypatch.setattr(runner, "run_cell", run_cell)
    # SIGINT as in a terminal: Python's handler, unblocked (the cell threads inherit the mask),
    # whatever the suite inherited (a shell's background job, `cmd &`, starts with SIGINT ignored)
    inherited = (signal.getsignal(signal.SIGINT), signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT}))
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        started = time.perf_counter()
        (record,) = runner._run_all()
    finally:
        signal.signal(signal.SIGINT, inherited[0])
        signal.pthread_sigmask(signal.SIG_SETMASK, inherited[1])
    assert time.perf_counter() - started < 5, (f"the main thread reacted to Ctrl-C only at its next heartbeat "
                                               f"(the worker had SIGINT {inherited[0]}, blocked: {signal.SIGINT in inherited[1]})")
    assert runner.interrupted and record["status"] == "interrupted" and not finished
    assert signal.SIGINT in masks[0], "a cell thread can take Ctrl-C's SIGINT"


def test_ctrl_c_as_a_worker_starts_leaves_it_running(tmp_path, monkeypatch):
    """Was: Ctrl-C that reached a worker while its interpreter started (before it ignores SIGINT)
    raised KeyboardInterrupt in `site` (exit 1): the cell was reported failed and replaced the
    previous result (test_outputs' Ctrl-C test failed so in CI; reproduced here under load). Now a
    worker inherits the cell thread's SIGINT block and ignores SIGINT before unblocking it: a
    SIGINT sent to it at once is lost, it runs to its end, and it leaves SIGINT ignored and
    unblocked for what it runs."""
    import concurrent.futures
    from types import SimpleNamespace

    from mlcpipe.nightly import runner as runner_module

    runner = runner_module.Runner([], tmp_path / "out", tmp_path / "cache")
    real = subprocess.Popen

    def popen(cmd, **kwargs):  # the worker, and Ctrl-C at once: its interpreter is starting
        proc = real(cmd, **kwargs)
        os.kill(proc.pid, signal.SIGINT)
        return proc

    monkeypatch.setattr(runner_module.subprocess, "Popen", popen)
    cell = SimpleNamespace(model_source="llama-tiny", quant="q4f32_1", target=SimpleNamespace(preset="llvm", options={}))
    (tmp_path / "work").mkdir()
    with concurrent.futures.ThreadPoolExecutor(1, initializer=runner_module.cell_thread_init) as pool, \
            open(tmp_path / "log", "w") as log:
        result = pool.submit(runner._worker, cell, log, tmp_path / "work").result(timeout=300)
    assert result == {}, (tmp_path / "log").read_text()[-3000:]
    probe = ("import signal, sys; from mlcpipe.nightly import worker; worker.main([]) == 2 or "
             "sys.exit(3); print(signal.getsignal(signal.SIGINT) is signal.SIG_IGN, "
             "signal.SIGINT in signal.pthread_sigmask(signal.SIG_BLOCK, []))")
    with concurrent.futures.ThreadPoolExecutor(1, initializer=runner_module.cell_thread_init) as pool:
        done = pool.submit(subprocess.run, [sys.executable, "-c", probe], capture_output=True, text=True, timeout=120).result()
    assert done.stdout.split() == ["True", "False"], done.stderr[-2000:]

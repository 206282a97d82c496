"""Output safety: mlcpipe writes only into directories it created (or empty / new ones), never over
its inputs, replaces a directory in one step, removes what killed runs left, and locks what it
writes. One section per defect class: foreign files under --output, output equal to source (and
the model name as a path), interrupted swap, racing writers. A refusal is one line, exit 2, and
nothing on disk changes."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import yaml

from mlcpipe.artifact import atomic_directory
from mlcpipe.config import MODELS_DIR, ConfigError, load_model_config
from mlcpipe.nightly.verify import verify_artifact

from tests.helpers.checkpoints import random_hf_weights, write_hf_checkpoint
from tests.helpers.fs import snapshot

REPO = Path(__file__).resolve().parent.parent
TINY = yaml.safe_load((MODELS_DIR / "llama-tiny.yaml").read_text())
MATRIX = "models: [llama-tiny]\nquantizations: [q0f32]\ntargets: [llvm]\n"
CELL = "llama-tiny-q0f32-llvm"


def mlcpipe(*args, env: dict | None = None, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mlcpipe.cli", *map(str, args)], capture_output=True, text=True,
                          env={**os.environ, **(env or {})}, **kwargs)


def start(*args, **kwargs) -> subprocess.Popen:
    """mlcpipe in its own process group, with SIGINT as a terminal's foreground job has it (default,
    unblocked), whatever the suite inherited: a suite started as a shell's background job (`cmd &`)
    has SIGINT ignored, and its nightly then ignored the test's Ctrl-C."""
    return subprocess.Popen([sys.executable, "-m", "mlcpipe.cli", *map(str, args)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env={**os.environ},
                            start_new_session=True, preexec_fn=sigint_as_in_a_terminal, **kwargs)


def sigint_as_in_a_terminal() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})


def one_line_error(proc: subprocess.CompletedProcess, *fragments: str) -> str:
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert proc.returncode == 2, f"exit {proc.returncode}\n{proc.stderr[-3000:]}"
    assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
    return lines[0]


def wait_for(predicate, seconds: float, what: str) -> None:
    deadline = time.time() + seconds
    while time.time() < deadline:
        if predicate():
            return
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def building(parent: Path, name: str) -> bool:
    return any(p.name.startswith(f".{name}.tmp-") for p in parent.iterdir()) if parent.is_dir() else False


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    """One tiny artifact (with params/), one converted weights dir and one HF checkpoint, built once."""
    root = tmp_path_factory.mktemp("made")
    config = load_model_config("llama-tiny")
    hf = write_hf_checkpoint(root / "hf", config, random_hf_weights(config, seed=0))
    (hf / "tokenizer.json").write_text("{}")  # a checkpoint holds more than tensors
    art, weights = root / "art", root / "weights"
    proc = mlcpipe("build", "--model", "llama-tiny", "--quant", "q0f32", "--output", art, "--weights", "synthetic")
    assert proc.returncode == 0, proc.stderr[-3000:]
    proc = mlcpipe("convert-weights", "--model", "llama-tiny", "--quant", "q0f32", "--source", "synthetic", "--output", weights)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return {"art": art, "weights": weights, "hf": hf}


def user_dir(path: Path) -> Path:
    (path / "sub").mkdir(parents=True)
    (path / "notes.txt").write_text("the user's notes\n")
    (path / "sub" / "data.csv").write_text("1,2,3\n")
    return path


# ---- foreign files under --output ----------------------------------------------------------------
# Each case: (prepare(tmp, made) -> (args, the directory it names), what the one error line says).

def _build(out):
    return ["build", "--model", "llama-tiny", "--quant", "q0f32", "--output", out]


def _convert(out, source="synthetic"):
    return ["convert-weights", "--model", "llama-tiny", "--quant", "q0f32", "--source", source, "--output", out]


def _nightly(tmp, out, *extra):
    (tmp / "m.yaml").write_text(MATRIX)
    return ["nightly", "--matrix", tmp / "m.yaml", "--out", out, *extra]


def _copy(src: Path, dst: Path, extra: str | None = None) -> Path:
    shutil.copytree(src, dst)
    if extra:
        (dst / extra).write_text("mine\n")
    return dst


def _symlink(tmp):
    (tmp / "link").symlink_to(user_dir(tmp / "docs"))
    return _build(tmp / "link"), tmp / "docs"


def _artifacts_root(tmp, made):
    root = tmp / "artifacts"
    _copy(made["art"], root / "llama-tiny-q0f32-llvm")
    (root / "tuning").mkdir()
    (root / "tuning" / "llvm.json").write_text("{}")
    return _build(root), root


def _onto_file(tmp):
    (tmp / "notes.txt").write_text("the user's notes\n")
    return _build(tmp / "notes.txt"), tmp


def _foreign_cache(tmp):
    user_dir(tmp / "runs" / ".cache")  # the default cache of --out runs/n1 is runs/.cache
    return _nightly(tmp, tmp / "runs" / "n1"), tmp / "runs"


FOREIGN = {
    "build into a user's directory": (lambda t, m: (_build(user_dir(t / "docs")), t / "docs"), "(e.g. notes.txt)"),
    "build onto a file": (lambda t, m: _onto_file(t), "it is a file, not a directory"),
    "build through a symlink to a user's directory": (lambda t, m: _symlink(t), "(e.g. notes.txt)"),
    "build onto the artifacts root": (_artifacts_root, "mlcpipe did not create (e.g. llama-tiny-q0f32-llvm/lib.so)"),
    "build onto an artifact holding a user's file": (
        lambda t, m: (_build(_copy(m["art"], t / "a", "notes.txt")), t / "a"), "(e.g. notes.txt)"),
    "build onto a weights directory": (
        lambda t, m: (_build(_copy(m["weights"], t / "w")), t / "w"), "it is an mlcpipe weights directory, not an mlcpipe artifact"),
    "convert-weights onto an artifact (lib.so)": (
        lambda t, m: (_convert(_copy(m["art"], t / "a")), t / "a"), "it is an mlcpipe artifact, not an mlcpipe weights directory"),
    "convert-weights into a user's directory": (lambda t, m: (_convert(user_dir(t / "docs")), t / "docs"), "(e.g. notes.txt)"),
    "convert-weights onto weights holding a user's file": (
        lambda t, m: (_convert(_copy(m["weights"], t / "w", "notes.txt")), t / "w"), "(e.g. notes.txt)"),
    "nightly --out a user's directory": (lambda t, m: (_nightly(t, user_dir(t / "docs")), t / "docs"), "(--out): it holds files"),
    "nightly --out an artifact": (lambda t, m: (_nightly(t, _copy(m["art"], t / "a")), t / "a"), "not an mlcpipe nightly directory"),
    "nightly whose default cache is a user's directory": (lambda t, m: _foreign_cache(t), "(--cache): it holds files"),
    "nightly --cache inside --out": (lambda t, m: (_nightly(t, t / "n", "--cache", t / "n" / "cache"), t / "n"),
                                     "(--cache): the cache and --out"),
    "nightly --report-only into a user's directory": (
        lambda t, m: (_nightly(t, user_dir(t / "docs"), "--report-only"), t / "docs"), "it holds no nightly results"),
}


@pytest.mark.parametrize("case", list(FOREIGN))
def test_foreign_output_is_refused_and_nothing_is_lost(case, made, tmp_path):
    """Was: the directory was replaced (the user's files deleted), exit 0."""
    prepare, message = FOREIGN[case]
    args, named = prepare(tmp_path, made)
    before = snapshot(tmp_path)
    proc = mlcpipe(*args)
    line = one_line_error(proc, "refusing to write", message)
    assert "choose" in line
    assert snapshot(tmp_path) == before, "files changed, appeared or were lost"


def test_output_under_a_file_is_one_line(tmp_path):
    """An --output whose parent is a file: one line (was: a traceback, exit 1)."""
    (tmp_path / "notes.txt").write_text("the user's notes\n")
    before = snapshot(tmp_path)
    for args in (_build(tmp_path / "notes.txt" / "art"), _convert(tmp_path / "notes.txt" / "w")):
        one_line_error(mlcpipe(*args), f"cannot write {tmp_path}/notes.txt/", f"{tmp_path}/notes.txt is not a directory")
    assert snapshot(tmp_path) == before


def test_verify_checks_weights_converted_after_the_build(made, tmp_path):
    """An artifact built without weights, then given params/ (run's default weights directory) by
    convert-weights: verify checks them against their own tensor cache (was: every params file
    reported as 'not listed in the manifest (unexpected file)')."""
    art = tmp_path / "art"
    assert mlcpipe(*_build(art)).returncode == 0
    assert mlcpipe(*_convert(art / "params")).returncode == 0
    assert verify_artifact(art) == []
    shard = sorted((art / "params").glob("params_shard_*.bin"))[0]
    shard.write_bytes(shard.read_bytes()[:-1])
    (art / "params" / "notes.txt").write_text("mine\n")
    problems = verify_artifact(art)
    assert len(problems) == 2 and "the shard is truncated or was replaced" in problems[0], problems
    assert problems[1].endswith("params/notes.txt: not listed in tensor-cache.json (unexpected file)")


def test_rebuild_without_weights_keeps_params(made, tmp_path):
    """Was: rebuilding an artifact without --weights dropped its params/. Now they are kept when
    they fit the new build, and a build they do not fit is refused (one line; nothing changes)."""
    art = _copy(made["art"], tmp_path / "art")
    params = snapshot(art / "params")
    proc = mlcpipe(*_build(art))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert snapshot(art / "params") == params and verify_artifact(art) == []
    assert "params/tensor-cache.json" in json.loads((art / "manifest.json").read_text())["files"]
    # weights converted into the artifact after it was built are mlcpipe's too: kept by a rebuild
    proc = mlcpipe(*_convert(art / "params"), "--seed", "1")
    assert proc.returncode == 0, proc.stderr[-3000:]
    params = snapshot(art / "params")
    proc = mlcpipe(*_build(art))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert snapshot(art / "params") == params and verify_artifact(art) == []
    before = snapshot(tmp_path)
    proc = mlcpipe("build", "--model", "llama-tiny", "--quant", "q4f32_1", "--output", art)
    one_line_error(proc, f"{art}/params: the existing weights do not fit this build", "pass --weights")
    assert snapshot(tmp_path) == before


# ---- output equal to (or inside, or around) the source -------------------------------------------

def _ckpt(tmp, made) -> Path:
    return Path(shutil.copytree(made["hf"], tmp / "ckpt"))


def _link_to_ckpt(tmp, made):
    (tmp / "link").symlink_to(_ckpt(tmp, made))
    return _convert(tmp / "link", tmp / "ckpt")


SOURCES = {
    "convert --output is --source": (lambda t, m: _convert(_ckpt(t, m), t / "ckpt"), "is the --source directory"),
    "convert --output inside --source": (lambda t, m: _convert(_ckpt(t, m) / "mlc", t / "ckpt"), "lies inside the --source directory"),
    "convert --output contains --source": (lambda t, m: _convert(t, _ckpt(t, m)), "contains the --source directory"),
    "convert --output a symlink to --source": (_link_to_ckpt, "is the --source directory"),
    "build --output is --weights": (lambda t, m: [*_build(_ckpt(t, m)), "--weights", t / "ckpt"], "is the --weights directory"),
}


@pytest.mark.parametrize("case", list(SOURCES))
def test_output_over_its_source_is_refused(case, made, tmp_path):
    """Was: `convert-weights --output` equal to `--source` replaced the checkpoint with the
    converted weights (exit 0)."""
    prepare, message = SOURCES[case]
    args = prepare(tmp_path, made)
    before = snapshot(tmp_path)
    one_line_error(mlcpipe(*args), "refusing to write", message)
    assert snapshot(tmp_path) == before


BAD_NAMES = ["../../escaped", "a/b", "..", ".", "/tmp/abs", ".hidden", "with space", "", "x" * 129, 7]


@pytest.mark.parametrize("name", BAD_NAMES)
def test_model_name_must_be_one_safe_path_component(name, tmp_path):
    """Was: `name: ../../x` built into artifacts/../../x-...; a '/' crashed a nightly without summary."""
    path = tmp_path / "model.yaml"
    path.write_text(yaml.safe_dump({**TINY, "name": name}))
    with pytest.raises(ConfigError, match=r"field 'name': got .*; expected a name of letters, digits") as info:
        load_model_config(str(path))
    assert str(info.value).startswith(str(path)) and "\n" not in str(info.value)


def test_bad_model_name_builds_nothing_anywhere(tmp_path):
    """The CLI (default output artifacts/<name>-...) and the nightly refuse before writing."""
    escaping, slashed = tmp_path / "escaping.yaml", tmp_path / "slashed.yaml"
    escaping.write_text(yaml.safe_dump({**TINY, "name": "../../escaped"}))
    slashed.write_text(yaml.safe_dump({**TINY, "name": "team/tiny"}))
    (tmp_path / "m1.yaml").write_text(MATRIX.replace("[llama-tiny]", f"[{slashed}]"))
    (tmp_path / "m2.yaml").write_text(MATRIX.replace("[llvm]", "[{name: ../up, preset: llvm}]"))
    arts = tmp_path / "a" / "b" / "arts"
    arts.mkdir(parents=True)
    before = snapshot(tmp_path)
    one_line_error(mlcpipe("build", "--model", escaping, "--quant", "q0f32", env={"MLCPIPE_ARTIFACTS": str(arts)}),
                   "field 'name': got '../../escaped'")
    one_line_error(mlcpipe("nightly", "--matrix", tmp_path / "m1.yaml", "--out", tmp_path / "n"), "field 'models[0]'",
                   "field 'name': got 'team/tiny'")
    one_line_error(mlcpipe("nightly", "--matrix", tmp_path / "m2.yaml", "--out", tmp_path / "n"), "field 'targets[0].name': got '../up'")
    assert snapshot(tmp_path) == before


# ---- interrupted swap -------------------------------------------------------------------------------

SWAP = textwrap.dedent('''
    import json, os, shutil, signal, sys
    from pathlib import Path
    import mlcpipe.artifact as A

    final, version, kill_at = Path(sys.argv[1]), sys.argv[2], sys.argv[3]
    armed, steps = False, [0]

    def counted(fn):
        def step(*args, **kwargs):
            out = fn(*args, **kwargs)
            if armed:
                steps[0] += 1
                if str(steps[0]) == kill_at:
                    os.kill(os.getpid(), signal.SIGKILL)
            return out
        return step

    os.rename, os.replace, shutil.rmtree = counted(os.rename), counted(os.replace), counted(shutil.rmtree)
    if hasattr(A, "_rename_exchange"):
        A._rename_exchange = counted(A._rename_exchange)
    if os.environ.get("NO_RENAMEAT2"):
        A._rename_exchange = lambda a, b: False  # the fallback of systems without renameat2
    with A.atomic_directory(final) as tmp:
        (tmp / "lib.so").write_text(version * 4096)
        (tmp / "tir").mkdir()
        (tmp / "tir" / "scheduled.json").write_text(version)
        (tmp / "manifest.json").write_text(json.dumps({"format": "mlcpipe-artifact/1", "version": version,
                                                       "files": A.file_digests(tmp)}))
        if kill_at == "body":
            os.kill(os.getpid(), signal.SIGKILL)
        armed = True
''')


def swap(final: Path, version: str, kill_at: str = "never", fallback: bool = False) -> int:
    env = {**os.environ, **({"NO_RENAMEAT2": "1"} if fallback else {})}
    return subprocess.run([sys.executable, "-c", SWAP, str(final), version, kill_at], env=env).returncode


def version_of(final: Path) -> str:
    assert verify_artifact(final) == [], verify_artifact(final)  # complete: every listed file, nothing else
    return json.loads((final / "manifest.json").read_text())["version"]


@pytest.mark.parametrize("kill_at", ["body", "1", "2", "3"])
def test_killed_swap_leaves_a_complete_artifact_and_the_next_run_cleans_up(kill_at, tmp_path):
    """SIGKILL while writing, or after each rename / exchange / delete of the replacement: the
    directory is always a whole artifact (old or new), and the next writer removes the leftovers.
    Was: a kill between the two renames left no artifact; `.X.tmp-*`/`.X.old-*` stayed forever."""
    final = tmp_path / "art"
    assert swap(final, "1") == 0 and version_of(final) == "1"
    code = swap(final, "2", kill_at)
    assert code in (0, -signal.SIGKILL)
    assert version_of(final) in ("1", "2")
    with atomic_directory(final) as tmp:
        (tmp / "manifest.json").write_text("{}")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["art"], "leftovers of the killed run remain"


def test_killed_two_rename_fallback_is_restored_by_the_next_run(tmp_path):
    """Without renameat2 a kill between `final -> .old-` and `tmp -> final` leaves no `final`;
    the next writer (even one that fails) renames the old artifact back."""
    final = tmp_path / "art"
    assert swap(final, "1") == 0
    assert swap(final, "2", "1", fallback=True) == -signal.SIGKILL
    with pytest.raises(RuntimeError):
        with atomic_directory(final):
            raise RuntimeError("this build fails")
    assert version_of(final) == "1"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["art"]


def test_build_killed_mid_way_keeps_the_old_artifact_and_is_cleaned_up(made, tmp_path):
    """kill -9 of a real `mlcpipe build` over an artifact: the old one is intact; the next build
    removes the temp dir it left (was: `.art.tmp-*` stayed, nothing removed them)."""
    art = _copy(made["art"], tmp_path / "art")
    proc = start(*_build(art))
    try:
        wait_for(lambda: building(tmp_path, "art") or proc.poll() is not None, 120, "the build's temp dir")
        os.killpg(proc.pid, signal.SIGKILL)
    finally:
        proc.wait()
    assert building(tmp_path, "art"), "the build ended before it could be killed"
    assert verify_artifact(art) == []
    proc = mlcpipe(*_build(art))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["art"] and verify_artifact(art) == []
    assert (art / "params" / "tensor-cache.json").is_file()


# ---- racing writers ------------------------------------------------------------------------------

RECORDS = textwrap.dedent('''
    import sys, time
    from pathlib import Path
    from mlcpipe.tuning import TuningDB

    db_path, me, n = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3])
    db = TuningDB.load(db_path)  # both writers read the database before either writes it
    for i in range(n):
        db.put({"kind": "llvm", "mcpu": "x"}, f"{me}-{i}", {"kernel": f"k{i}", "rule": "DecodeGEMVFloat", "knobs": {"rows": i}})
    (db_path.parent / f"ready-{me}").touch()
    while not (db_path.parent / "go").exists():
        time.sleep(0.01)
    db.save()
''')


def test_two_writers_of_one_tuning_database_keep_every_record(tmp_path):
    """Was: each `tune` saved what it had loaded plus its own records: the later save dropped
    the other's."""
    from mlcpipe.tuning import TuningDB

    db_path = tmp_path / "db.json"
    first = TuningDB(db_path)
    first.put({"kind": "llvm", "mcpu": "x"}, "old", {"kernel": "k", "rule": "DecodeGEMVFloat", "knobs": {}})
    first.save()
    procs = [subprocess.Popen([sys.executable, "-c", RECORDS, str(db_path), me, "40"]) for me in ("a", "b")]
    wait_for(lambda: all((tmp_path / f"ready-{me}").exists() for me in "ab"), 60, "both writers loaded")
    (tmp_path / "go").touch()
    assert [p.wait(60) for p in procs] == [0, 0]
    table = TuningDB.load(db_path).table({"kind": "llvm", "mcpu": "x"})
    assert sorted(table) == sorted(["old", *(f"{me}-{i}" for me in "ab" for i in range(40))])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["db.json", "go", "ready-a", "ready-b"]


def test_a_saved_tuning_database_stays_a_symlink_with_its_permissions(tmp_path):
    """Was: the save renamed a new file over the path: a linked database was cut off its target
    and a 0600 one became world-readable."""
    from mlcpipe.tuning import TuningDB

    real, link = tmp_path / "shared" / "db.json", tmp_path / "db.json"
    real.parent.mkdir()
    real.write_text('{"schema": "mlcpipe-tuning", "version": 1, "records": {}}')
    real.chmod(0o600)
    link.symlink_to(real)
    db = TuningDB.load(link)
    db.put({"kind": "llvm", "mcpu": "x"}, "sig", {"kernel": "k", "rule": "DecodeGEMVFloat", "knobs": {}})
    db.save()
    assert link.is_symlink() and oct(real.stat().st_mode & 0o777) == "0o600"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["db.json", "shared"]  # nothing left beside the link
    assert list(TuningDB.load(real).table({"kind": "llvm", "mcpu": "x"})) == ["sig"]


def test_two_tune_commands_on_one_database(tmp_path):
    """Two real `mlcpipe tune` runs on one --db at once (different kernels): both sets survive."""
    db = tmp_path / "db.json"
    args = ["tune", "--model", "llama-tiny", "--quant", "q4f32_1", "--db", db, "--budget", "1", "--kernels"]
    procs = [start(*args, pattern) for pattern in ("^fused_dequantize1_NT", "^fused_dequantize2_NT")]
    outs = [p.communicate(timeout=300) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [o[1][-2000:] for o in outs]
    (table,) = json.loads(db.read_text())["records"].values()
    kernels = {r["kernel"] for r in table.values()}
    assert any(k.startswith("fused_dequantize1_NT") for k in kernels) and any(k.startswith("fused_dequantize2_NT") for k in kernels)


@pytest.mark.parametrize("second", ["build", "convert-weights"])
def test_a_second_writer_of_one_output_is_refused(second, made, tmp_path):
    """While a real `mlcpipe build` writes an artifact (held stopped mid-build), another build or
    convert-weights onto it fails with one line naming the writer's pid; the first completes.
    Was: both ran, the last rename won."""
    art = _copy(made["art"], tmp_path / "art")
    first = start(*_build(art))
    try:
        wait_for(lambda: building(tmp_path, "art") or first.poll() is not None, 120, "the first build's temp dir")
        os.killpg(first.pid, signal.SIGSTOP)
        before = snapshot(tmp_path)
        args = _build(art) if second == "build" else _convert(art)
        one_line_error(mlcpipe(*args), f"refusing to write {art}: it is being written by another mlcpipe (pid {first.pid})")
        assert snapshot(tmp_path) == before
    finally:
        os.killpg(first.pid, signal.SIGCONT)
        _, err = first.communicate(timeout=300)
    assert first.returncode == 0, err[-3000:]
    assert verify_artifact(art) == [] and sorted(p.name for p in tmp_path.iterdir()) == ["art"]


def _leftovers(*dirs: Path) -> list[str]:
    return [p.name for d in dirs if d.is_dir() for p in d.iterdir() if ".tmp-" in p.name or ".work-" in p.name]


def _cell_state(out: Path) -> dict[str, str]:
    return snapshot(out / CELL) | {"log": hashlib.sha256((out / "logs" / f"{CELL}.log").read_bytes()).hexdigest()}


@pytest.fixture(scope="module")
def nightlies(tmp_path_factory):
    """n: a good nightly. 1) A rerun (fresh cache: it rebuilds) gets Ctrl-C mid-build. 2) Another
    rerun is held stopped mid-build while a second nightly and a --report-only try the same --out,
    then resumed to the end. What each step left is recorded for the tests."""
    root = tmp_path_factory.mktemp("nightlies")
    (root / "m.yaml").write_text(MATRIX)
    out, got = root / "n", {}
    good = mlcpipe("nightly", "--matrix", root / "m.yaml", "--out", out, "--cache", root / "c1")
    assert good.returncode == 0, good.stderr[-3000:]
    got["kept"] = _cell_state(out)

    def rerun_stopped_mid_build(cache: Path) -> subprocess.Popen:
        """A rerun into an empty cache (so it rebuilds), stopped once its cache build has begun."""
        proc = start("nightly", "--matrix", root / "m.yaml", "--out", out, "--cache", cache)
        try:
            wait_for(lambda: bool(_leftovers(cache)) or proc.poll() is not None, 120, "the rerun's cache build")
            assert proc.poll() is None, f"the rerun ended before its cache build was seen: {proc.communicate()[1][-3000:]}"
            os.killpg(proc.pid, signal.SIGSTOP)
        except BaseException:
            with contextlib.suppress(ProcessLookupError):  # it may have ended: keep the first error
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            raise
        return proc

    def interrupted_mid_build(signum: int, cache: Path) -> dict:
        """A rerun stopped mid-build gets `signum` on its whole group (Ctrl-C in a terminal; a
        `timeout` or a service's stop for SIGTERM), delivered as it resumes: no timing decides the
        outcome (a worker being started as it lands is stopped too, and a cell whose work finished
        meanwhile is not replaced)."""
        (out / "logs" / f"{CELL}.interrupted.log").unlink(missing_ok=True)
        rerun = rerun_stopped_mid_build(cache)
        os.killpg(rerun.pid, signum)
        os.killpg(rerun.pid, signal.SIGCONT)
        _, err = rerun.communicate(timeout=120)
        return {"code": rerun.returncode, "stderr": err, "cell": _cell_state(out),
                "index": json.loads((out / "index.json").read_text()), "summary": (out / "SUMMARY.md").read_text(),
                "verify": mlcpipe("verify", out), "partial_log": (out / "logs" / f"{CELL}.interrupted.log").is_file(),
                "leftovers": _leftovers(root, out, out / "logs", cache)}

    got["ctrl_c"] = interrupted_mid_build(signal.SIGINT, root / "c2")
    got["sigterm"] = interrupted_mid_build(signal.SIGTERM, root / "c5")  # a fresh cache, as below

    first = rerun_stopped_mid_build(root / "c4")  # a fresh cache: the Ctrl-C'd rerun may have finished its entry in c2
    try:
        before = snapshot(root)
        got["second"] = mlcpipe("nightly", "--matrix", root / "m.yaml", "--out", out, "--cache", root / "c3")
        got["report"] = mlcpipe("nightly", "--matrix", root / "m.yaml", "--out", out, "--report-only")
        got["unchanged"] = snapshot(root) == before
    finally:
        os.killpg(first.pid, signal.SIGCONT)
        _, err = first.communicate(timeout=300)
    got["first"] = {"pid": first.pid, "code": first.returncode, "stderr": err, "verify": mlcpipe("verify", out),
                    "status": json.loads((out / "index.json").read_text())["cells"][0]["status"]}
    got["out"], got["root"] = out, root
    return got


def test_ctrl_c_keeps_the_previous_cells(nightlies):
    """Was: Ctrl-C replaced the previous good cell with an "interrupted" stub. Now the cell keeps
    its directory and log, the summary says "interrupted", exit 130, and nothing is left over."""
    got = nightlies["ctrl_c"]
    assert got["cell"] == nightlies["kept"], "the previous good cell (directory or log) changed"
    assert got["code"] == 130, got["stderr"][-3000:]
    (record,) = got["index"]["cells"]
    assert record["status"] == "interrupted" and record["previous_status"] == "passed"
    assert "keeps the previous run's result" in record["error"]
    assert "1 interrupted" in got["summary"] and got["partial_log"]
    assert got["verify"].returncode == 0, got["verify"].stderr
    assert got["leftovers"] == []


def test_sigterm_keeps_the_previous_cells_and_writes_the_report(nightlies):
    """Was: SIGTERM (`timeout`, a CI job's cancel, a service's stop) killed the nightly on the spot:
    no report of the run, its workers' temp dirs left behind, and a worker that died of it before
    the nightly could be reported as a failed cell. Now it stops as for Ctrl-C, with exit 143."""
    got = nightlies["sigterm"]
    assert got["cell"] == nightlies["kept"], "the previous good cell (directory or log) changed"
    assert got["code"] == 143 and "Terminated." in got["stderr"].splitlines(), got["stderr"][-3000:]
    (record,) = got["index"]["cells"]
    assert record["status"] == "interrupted" and record["previous_status"] == "passed", record
    assert "1 interrupted" in got["summary"] and got["partial_log"]
    assert got["verify"].returncode == 0, got["verify"].stderr
    assert got["leftovers"] == []


def test_sigterm_mid_build_removes_the_temp_dir(tmp_path):
    """Was: SIGTERM killed a build on the spot; its temp dir (the whole artifact, weights included)
    stayed until the next build of that output. Now it is removed as for Ctrl-C, exit 143."""
    proc = start("build", "--model", "llama-tiny", "--quant", "q4f32_1", "--output", tmp_path / "art", "--weights", "synthetic")
    wait_for(lambda: bool(_leftovers(tmp_path)) or proc.poll() is not None, 120, "the build's temp dir")
    assert proc.poll() is None, f"the build ended before its temp dir was seen: {proc.communicate()[1][-3000:]}"
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 143 and "Terminated." in err.splitlines(), err[-3000:]
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_two_nightlies_on_one_out(nightlies):
    """Was: both ran, deleting each other's cells (the first failed on its vanished work dir),
    and reported success. Now the second (and a --report-only) fails with one line, the first
    completes."""
    pid = nightlies["first"]["pid"]
    for proc in (nightlies["second"], nightlies["report"]):
        one_line_error(proc, f"refusing to write {nightlies['out']} (--out): it is being written by another mlcpipe (pid {pid})")
    assert nightlies["unchanged"] and not (nightlies["root"] / "c3").exists()
    first = nightlies["first"]
    assert first["code"] == 0 and first["status"] == "passed", first["stderr"][-3000:]
    assert first["verify"].returncode == 0, first["verify"].stderr

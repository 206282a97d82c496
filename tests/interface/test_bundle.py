"""`mlcpipe bundle` and its job, tested here rather than hoped for on a GPU machine: the bundle is
unpacked into a fresh folder and run by a Python that has no apache-tvm (a new venv with NumPy and
ml_dtypes only); its llvm part runs, checks and profiles there and gives the normal run's tokens;
its cuda part ends in one line per artifact where there is no GPU; the size limit holds."""

from __future__ import annotations

import gzip
import json
import os
import re
import shutil
import subprocess
import sys
import venv
from importlib import metadata
from pathlib import Path

import numpy as np
import pytest

from mlcpipe.config import MODELS_DIR
from mlcpipe.device.cuda import runs_here as cuda_present
from tests.helpers.cli import mlcpipe
from tests.helpers.hardware import NO_CUDA

SET = "llama-tiny:q4f32_1"
pytestmark = pytest.mark.nvcc  # the bundle ships cuda builds


@pytest.fixture(scope="module")
def bundle(tmp_path_factory):
    from mlcpipe.interface.bundle import bundle as make

    out = tmp_path_factory.mktemp("bundle") / "b"
    # --set by YAML path, the rest by name: the bundle names the model by its config
    path, size = make(out, sets=[f"{MODELS_DIR / 'llama-tiny.yaml'}:q4f32_1"], graph=[SET], cpu_models=["llama-tiny"], bench_models=["llama-tiny"], python="current",
                      prompt_len=200, prefill_chunk=64, steps=5, tune=[SET], tune_target="llvm",
                      tune_overrides={"mcpu": "haswell"}, tune_budget=3, log=lambda *_: None)
    return path, size


@pytest.fixture(scope="module")
def bare_python(tmp_path_factory) -> tuple[Path, dict]:
    """A new venv without pip or apache-tvm, seeing only NumPy and ml_dtypes of this one."""
    import ml_dtypes

    root = tmp_path_factory.mktemp("bare")
    venv.create(root / "venv", with_pip=False)
    deps = root / "deps"
    deps.mkdir()
    for module in (np, ml_dtypes):
        source = Path(module.__file__).parent
        (deps / source.name).symlink_to(source)
        libs = source.parent / f"{source.name}.libs"
        if libs.is_dir():
            (deps / libs.name).symlink_to(libs)
    python = root / "venv" / "bin" / "python"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "MLCPIPE_", "VIRTUAL_ENV"))}
    env.update({"PYTHONPATH": str(deps), "MLCPIPE_PYTHON": str(python)})
    assert subprocess.run([str(python), "-c", "import tvm_ffi"], env=env, capture_output=True).returncode != 0
    assert subprocess.run([str(python), "-c", "import tvm"], env=env, capture_output=True).returncode != 0
    return python, env


def test_bundle_runs_without_apache_tvm(bundle, bare_python, tmp_path):
    path, _ = bundle
    unpacked = tmp_path / "unpacked"
    shutil.copytree(path, unpacked, symlinks=True)
    python, env = bare_python
    out = tmp_path / "out"
    done = subprocess.run(["bash", str(unpacked / "run.sh")], capture_output=True, text=True, env={**env, "OUT": str(out)}, cwd=tmp_path)
    assert (out / "summary.json").is_file(), done.stdout[-3000:] + done.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    results = summary["results"]
    assert summary["env"]["tvm_package_modules"] == [], "the run side imported the tvm package"
    portable = results["llama-tiny-q4f32_1-llvm-portable"]
    assert portable["run"]["ok"] and portable["run"]["max_rel"] < 1e-4 and portable["run"]["rel_l2"] < 1e-4 and portable["run"]["tokens_decided"] >= 3, portable["run"]
    # the bundle recorded the float32 truth (PyTorch is in the test extra): the run is held against it
    assert portable["run"]["rel_l2_vs_truth"] <= portable["run"]["allowed_vs_truth"], portable["run"]
    assert 0 < portable["run"]["llvm_rel_l2_vs_truth"] < 1e-2, portable["run"]  # tiny q4f32_1: f32 arithmetic throughout
    assert portable["check"]["ok"], portable["check"]
    assert portable["profile"]["ok"] and portable["profile"]["decode_tok_s"] > 0
    assert "llama-tiny-q4f32_1-llvm-portable" in json.loads(gzip.decompress((out / "profiles.json.gz").read_bytes())) and (out / "log.txt").is_file()
    assert "### profile: llama-tiny-q4f32_1-llvm-portable" in (out / "report.md").read_text()
    # the tune step: every candidate compiled at bundle time checked and timed here, the winners a
    # tuning database that `mlcpipe build --tuning-db` takes
    tune = results["llama-tiny-q4f32_1-llvm-tune"]["tune"]
    assert tune["ok"] and len(tune["kernels"]) >= 4 and all(k["best_us"] <= k["default_us"] for k in tune["kernels"]), tune
    from mlcpipe.tuning import TuningDB

    index = json.loads((unpacked / "tune" / "llama-tiny-q4f32_1" / "tune.json").read_text())
    table = TuningDB.load(out / "tuning.json").table(index["target"])
    assert sorted(r["kernel"] for r in table.values()) == sorted(k["kernel"] for k in tune["kernels"])
    assert all(r["default_ms"] == r["candidates"][0]["ms"] and r["ms"] == min(c["ms"] for c in r["candidates"]) for r in table.values())
    assert "## Tuning (same run)" in (out / "report.md").read_text()
    cuda = [name for name, r in results.items() if r.get("kind") == "cuda" and "tune" not in r]
    assert sorted(cuda) == ["llama-tiny-q4f32_1-cuda", "llama-tiny-q4f32_1-cuda-cuda-graph"]
    if not cuda_present():  # the CUDA parts end in their one-line error, the job says it failed
        assert done.returncode == 1, done.stdout + done.stderr
        for name in cuda:
            assert set(results[name]["device"]) == {"ok", "error", "seconds"} and not results[name]["device"]["ok"]
            assert re.fullmatch("ArtifactError: " + NO_CUDA.lstrip("^"), results[name]["device"]["error"]), results[name]["device"]
            assert set(results[name]) == {"model", "quantization", "kind", "variant", "device"}
    assert len(list(out.iterdir())) <= 8

    # `mlcpipe run` from the bundle, in the bare Python, gives the normal install's tokens
    art = unpacked / "artifacts" / "llama-tiny-q4f32_1-llvm-portable"
    args = ["run", "--artifact", str(art), "--weights", "synthetic", "--prompt-tokens", "3,1,4,1,5", "--max-new-tokens", "8"]
    bare_env = {**env, "PYTHONPATH": f"{unpacked / 'site'}:{env['PYTHONPATH']}", "MLCPIPE_TVM_RUNTIME": str(unpacked / "tvm_runtime")}
    bare = subprocess.run([str(python), "-m", "mlcpipe.cli", *args], capture_output=True, text=True, env=bare_env)
    normal = mlcpipe(*args)
    assert bare.returncode == 0 and normal.returncode == 0, bare.stderr + normal.stderr
    assert bare.stdout.split() == normal.stdout.split() and len(bare.stdout.split()[-1].split(",")) == 8


def test_tune_step_refuses_a_changed_library(bundle, tmp_path):
    """The tune step loads no candidate library whose bytes differ from the bundle's record."""
    path, _ = bundle
    copy = tmp_path / "b"
    shutil.copytree(path, copy, symlinks=True)
    with open(copy / "tune" / "llama-tiny-q4f32_1" / "tune.so", "ab") as f:
        f.write(b"\0")
    out = tmp_path / "out"
    done = subprocess.run(["bash", str(copy / "run.sh"), "--steps", "tune", "--kinds", "llvm"], capture_output=True, text=True,
                          env={**os.environ, "OUT": str(out), "MLCPIPE_PYTHON": sys.executable})
    assert done.returncode == 1, done.stdout + done.stderr
    error = json.loads((out / "summary.json").read_text())["results"]["llama-tiny-q4f32_1-llvm-tune"]["tune"]["error"]
    assert "tune.so" in error and "corrupt or was replaced" in error, error
    assert not (out / "tuning.json").exists()


def test_bundle_holds_what_the_gpu_needs(bundle):
    path, size = bundle
    index = json.loads((path / "bundle.json").read_text())
    entries = {a["name"]: a for a in index["artifacts"]}
    graph, plain = entries["llama-tiny-q4f32_1-cuda-cuda-graph"], entries["llama-tiny-q4f32_1-cuda"]
    assert plain["manifest_target"]["arch"] == "sm_90" and graph["check"] is False
    # TVM's RewriteCUDAGraph put capture / replay into the cuda_graph build's VM code only
    uses_graphs = [b"vm.builtin.cuda_graph.run_or_capture" in (path / a["dir"] / "lib.so").read_bytes() for a in (graph, plain)]
    assert uses_graphs == [True, False]
    for entry in entries.values():
        art = path / entry["dir"]
        assert not (art / "tir").exists() and (art / "reference" / "kernels.so").is_file()
        expected = np.load(path / entry["expected"])
        assert expected["logits"].shape == (5, 512) and len(expected["prompt"]) == 200 and int(expected["prefill_chunk"]) == 64
    runtime = {p.name for p in (path / "tvm_runtime").iterdir()}
    assert {"libtvm_runtime.so", "libtvm_runtime_cuda.so"} <= runtime <= {"libtvm_runtime.so", "libtvm_runtime_cuda.so", "libcudart.so.13"}
    everything = [p.relative_to(path).as_posix() for p in path.rglob("*") if p.is_file()]
    assert not [p for p in everything if "libtvm_compiler" in p or p.startswith("site/tvm/")]
    assert set(index["files"]) | {"bundle.json"} == set(everything)
    assert size == sum((path / p).stat().st_size for p in everything) and size < 25 * 2**20


def test_bundle_size_limit_and_bad_input(bundle, tmp_path):
    from mlcpipe.errors import ArtifactError
    from mlcpipe.interface.bundle import bundle as make

    out = tmp_path / "small"
    with pytest.raises(ArtifactError, match=r"^bundle .*small: \d+\.\d MiB; allowed at most 1 MiB"):
        make(out, sets=[SET], graph=[], cpu_models=[], python="current", steps=2, max_mib=1, log=lambda *_: None)
    assert not out.exists() and list(tmp_path.iterdir()) == []  # nothing left behind
    # from another working directory too (was: ModuleNotFoundError for the checkout's benchmarks/, a traceback)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    bad = mlcpipe("bundle", "--set", SET, "--graph", SET, "--cpu-model", "llama-tiny", "--python", "current", "--steps", "2",
                  "--max-mib", "1", "--out", str(out), cwd=elsewhere)
    assert bad.returncode == 2 and bad.stderr.strip().splitlines()[-1].startswith(f"error: bundle {out}: "), bad.stderr[-2000:]
    assert "allowed at most 1 MiB" in bad.stderr and not out.exists() and list(elsewhere.iterdir()) == []
    bad = mlcpipe("bundle", "--set", "llama-tiny", "--out", str(out))
    assert bad.returncode == 2 and "'llama-tiny': expected MODEL:QUANT[,QUANT...]" in bad.stderr
    bad = mlcpipe("bundle", "--set", "llama-tiny:q9", "--out", str(out))
    assert bad.returncode == 2 and bad.stderr.strip().splitlines() == ["error: --set 'q9': unknown quantization; allowed: "
                                                                       "['q0f16', 'q0f32', 'q4f16_1', 'q4f32_1']"]
    bad = mlcpipe("bundle", "--set", "nosuch:q4f16_1", "--out", str(out))  # the flag that named it
    assert bad.returncode == 2 and bad.stderr.startswith("error: --set 'nosuch': no such config in ")
    # refused before any build (each used to build first, then fail or do nothing, or ship what fails on the device)
    other = tmp_path / "other.yaml"  # another model under llama-tiny's name
    other.write_text((MODELS_DIR / "llama-tiny.yaml").read_text().replace("rms_norm_eps:", "rms_norm_eps: 0.001 #"))
    for flags, message in ((["--set", SET], "Invalid value for --set: 'llama-tiny:q4f32_1': llama-tiny:q4f32_1 is given twice"),
                           (["--set", f"{MODELS_DIR / 'llama-tiny.yaml'}:q4f16_1,q4f32_1"], "llama-tiny:q4f32_1 is given twice"),
                           (["--set", f"{other}:q4f16_1"], f"{other} and {MODELS_DIR / 'llama-tiny.yaml'} are both named 'llama-tiny'"),
                           (["--graph", "llama-tiny:q4f16_1"], "Invalid value for --graph: llama-tiny:q4f16_1: not in the bundle's --set"),
                           (["--ffi-wheel", str(other)], f"Invalid value for --ffi-wheel: '{other}': not a wheel"),
                           *((["--ffi-wheel", str(_fake_ffi_wheel(tmp_path, version, tag))], message) for version, tag, message in (
                               (FFI_VERSION, "cp311-cp311-manylinux_2_28_x86_64", "built for cp311-cp311-manylinux_2_28_x86_64; the "
                                                                                  "device needs CPython 3.12 on x86-64 Linux"),
                               (FFI_VERSION, "cp312-cp312-macosx_11_0_arm64", "the device needs CPython 3.12 on x86-64 Linux"),
                               ("0.1.15", "cp312-cp312-manylinux_2_28_x86_64", f"apache-tvm-ffi 0.1.15; the run side is tested with {FFI_VERSION}"))),
                           (["--bench-model", "nosuch"], "Invalid value for --bench-model: 'nosuch': not a model of the bundle's --set (llama-tiny)"),
                           (["--cpu-model", "llama-3.2-1b"], "Invalid value for --cpu-model: 'llama-3.2-1b': not a model of"),
                           (["--prefill-chunk", "129"], "Invalid value for --prefill-chunk: 129: llama-tiny's prefill_chunk_size is 128"),
                           (["--python", "2.7"], "Invalid value for --python: '2.7': expected a Python version such as 3.12 (3.9 or later)"),
                           (["--out", str(bundle[0] / "artifacts")], "refusing to write")):
        bad = mlcpipe("bundle", "--set", SET, *(["--out", str(out)] if "--out" not in flags else []), *flags)
        assert bad.returncode == 2 and message in bad.stderr and "[mlcpipe] building" not in bad.stderr, (flags, bad.stderr[-2000:])
    # a folder mlcpipe did not make is not replaced
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep")
    bad = mlcpipe("bundle", "--set", SET, "--graph", SET, "--python", "current", "--out", str(tmp_path / "mine"))
    assert bad.returncode == 2 and "holds files mlcpipe did not create" in bad.stderr
    assert (tmp_path / "mine" / "notes.txt").read_text() == "keep"


FFI_VERSION = metadata.version("apache-tvm-ffi")


def _fake_ffi_wheel(folder: Path, version: str, tag: str) -> Path:
    """A wheel shaped like apache-tvm-ffi's, of `version`, tagged `tag` (its code is not run)."""
    import zipfile

    path = folder / f"apache_tvm_ffi-{version}-{tag}.whl"
    with zipfile.ZipFile(path, "w") as wheel:
        wheel.writestr("tvm_ffi/__init__.py", "")
        wheel.writestr(f"apache_tvm_ffi-{version}.dist-info/METADATA", f"Metadata-Version: 2.1\nName: apache-tvm-ffi\nVersion: {version}\n")
        wheel.writestr(f"apache_tvm_ffi-{version}.dist-info/WHEEL", f"Wheel-Version: 1.0\nRoot-Is-Purelib: false\nTag: {tag}\n")
    return path


def test_bundle_needs_a_checkout(tmp_path, monkeypatch):
    """An installed mlcpipe (no checkout beside it) has no benchmarks/ to pack: one line."""
    from mlcpipe import config
    from mlcpipe.errors import ArtifactError
    from mlcpipe.interface.bundle import bundle as make

    monkeypatch.setattr(config, "IN_CHECKOUT", False)
    with pytest.raises(ArtifactError, match=r"mlcpipe bundle packs the run-side code of a checkout; .* is an installed mlcpipe"):
        make(tmp_path / "b", sets=[SET], graph=[], cpu_models=[], python="current", log=lambda *_: None)
    assert list(tmp_path.iterdir()) == []


def test_run_sh_refuses_another_python(bundle, tmp_path):
    """run.sh compares the Python it finds with the one the bundle's tvm_ffi is built for (here
    this one's; a copy of run.sh saying 3.99 stands for a bundle made for another)."""
    path, _ = bundle
    mine = f"{sys.version_info[0]}.{sys.version_info[1]}"
    script = (path / "run.sh").read_text()
    assert f'want="{mine}"' in script
    (tmp_path / "run.sh").write_text(script.replace(f'want="{mine}"', 'want="3.99"'))
    done = subprocess.run(["bash", str(tmp_path / "run.sh")], capture_output=True, text=True, cwd=tmp_path,
                          env={**os.environ, "MLCPIPE_PYTHON": sys.executable, "OUT": str(tmp_path / "o")})
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith(f"error: {sys.executable} is Python {sys.version.split()[0]}; this bundle's tvm_ffi is built for Python 3.99")
    assert not (tmp_path / "o").exists()


@pytest.mark.long
def test_default_bundle_fits_the_device_limit():
    """The default set (1B at q4f16_1, q4f32_1, q0f16, its cuda_graph q4f16_1, llama-tiny, and the
    1B's decode GEMV candidates, as `mlcpipe bundle` makes it) for the device's Python 3.12: at
    most 60 MiB (the device takes 64 MiB with the checkout)."""
    from mlcpipe.interface.bundle import DEFAULT_TUNE, bundle as make

    path, size = make(tune=DEFAULT_TUNE, log=print)
    assert size <= 60 * 2**20
    index = json.loads((path / "bundle.json").read_text())
    assert [t["kernels"] for t in index["tune"]] == [5, 5, 5]
    assert index["python"] == "3.12" and any(p.name.startswith("core.cpython-312") for p in (path / "site" / "tvm_ffi").iterdir())

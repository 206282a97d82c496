"""TVM's runtime through tvm_ffi alone (pipeline/device/tvm_runtime.py) and the run side's imports:
`run`, `check` and `profile` of an llvm artifact never import the tvm package."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import ml_dtypes
import numpy as np
import pytest

from mlcpipe.device import tvm_runtime as rt
from tests.helpers.cli import mlcpipe

# A meta-path finder that makes `import tvm` (and any tvm.*) fail: what runs under it cannot have
# imported TVM's Python package, compiler or not.
NO_TVM = textwrap.dedent("""
    import sys
    class NoTVM:
        def find_spec(self, name, path=None, target=None):
            if name == "tvm" or name.startswith("tvm."):
                raise ImportError("tvm is blocked in this test")
    sys.meta_path.insert(0, NoTVM())
    from mlcpipe.cli import main
    sys.argv = ["mlcpipe", *sys.argv[1:]]
    main()
""")


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16", "int32", "uint32"])
def test_tensor_round_trip_and_view(dtype):
    rng = np.random.default_rng(0)
    array = (rng.standard_normal((3, 8)) * 100).astype(ml_dtypes.bfloat16 if dtype == "bfloat16" else dtype)
    dev = rt.device("cpu")
    t = rt.tensor(array, dev)
    assert tuple(t.shape) == (3, 8) and str(t.dtype) == dtype
    back = rt.to_numpy(t)
    assert back.dtype == array.dtype and np.array_equal(back.view(np.uint8), array.view(np.uint8))
    assert np.array_equal(rt.to_numpy(rt.view(t, (24,))).view(np.uint8), array.reshape(-1).view(np.uint8))
    assert rt.dtype_bytes(dtype) == array.dtype.itemsize


def test_missing_runtime_library_is_one_line(tmp_path):
    code = ("import os, sys; from mlcpipe.device import tvm_runtime as rt\n"
            "try:\n    rt.load_runtime()\nexcept rt.RuntimeUnavailable as e:\n    print(e); sys.exit(3)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env={**os.environ, rt.ENV: str(tmp_path)})
    assert out.returncode == 3, out.stderr
    assert out.stdout.strip() == f"{tmp_path / rt.CORE}: missing (TVM's runtime library; ${rt.ENV} or the installed apache-tvm)"


def test_run_check_profile_never_import_tvm(tiny_llvm_q4f32, tmp_path):
    """The commands a GPU machine runs work with `import tvm` impossible: tokens equal the normal
    run's, every kernel checked against the shipped reference, a profile written."""
    art = str(tiny_llvm_q4f32)
    blocked = tmp_path / "no_tvm.py"
    blocked.write_text(NO_TVM)
    args = ["run", "--artifact", art, "--weights", "synthetic", "--prompt-tokens", "5,6,7,8", "--max-new-tokens", "6"]
    normal = mlcpipe(*args)
    assert normal.returncode == 0, normal.stderr
    # the installed runtime library, named (the blocker also refuses to locate the package)
    env = {**os.environ, rt.ENV: str(rt.library_dir())}
    without = subprocess.run([sys.executable, str(blocked), *args], capture_output=True, text=True, env=env)
    assert without.returncode == 0, without.stderr
    assert without.stdout.splitlines()[-1] == normal.stdout.splitlines()[-1]
    check = subprocess.run([sys.executable, str(blocked), "check", "--artifact", art, "--json"], capture_output=True, text=True, env=env)
    assert check.returncode == 0, check.stderr
    report = json.loads(check.stdout)
    ran = [r for r in report["results"] if r["status"] in ("pass", "FAIL")]
    assert report["executed"] and len(ran) > 40 and all(r["status"] == "pass" for r in ran)
    saved = tmp_path / "profile.json"
    profile = subprocess.run([sys.executable, str(blocked), "profile", "--artifact", art, "--weights", "synthetic", "--runs", "1",
                              "--prompt-len", "16", "--gen-len", "4", "--save-json", str(saved)], capture_output=True, text=True, env=env)
    assert profile.returncode == 0, profile.stderr
    assert json.loads(saved.read_text())["generated_tokens"]


def test_check_refuses_an_artifact_without_reference(tiny_llvm_q4f32, tmp_path):
    import shutil

    copy = tmp_path / "art"
    shutil.copytree(tiny_llvm_q4f32, copy)
    manifest = json.loads((copy / "manifest.json").read_text())
    del manifest["reference"]
    (copy / "manifest.json").write_text(json.dumps(manifest))
    out = mlcpipe("check", "--artifact", str(copy))
    assert out.returncode == 2
    assert out.stderr.strip() == f"error: {copy}: no reference kernels (built by an older mlcpipe? rebuild it)"

"""pipeline/runtime.py: the Engine on TVM's runtime, and the one place that picks the runtime an
artifact runs in (`open_engine`, `kernel_runner`): TVM's here or over RPC, or a WebGPU runtime."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from mlcpipe.device import RunOptions
from mlcpipe.runtime import Engine, kernel_runner, open_engine


@pytest.fixture(scope="module")
def tiny_llvm():
    from mlcpipe.interface.artifacts import ensure_artifact

    return ensure_artifact("llama-tiny", "q4f32_1", "llvm", log=lambda *_: None)


def test_open_engine_gives_tvms_engine_for_llvm(tiny_llvm):
    engine = open_engine(tiny_llvm, "synthetic", 0, RunOptions(prefill_chunk=8))
    assert isinstance(engine, Engine) and engine.prefill_chunk == 8
    direct = Engine(tiny_llvm, "synthetic", prefill_chunk=8)
    prompt = [1, 5, 9, 2, 7, 3, 4, 11, 6, 8, 10]  # longer than the chunk
    with pytest.raises(ValueError, match=r"no sequence to prefill: reset\(\) starts one"):
        engine.prefill(prompt)  # once a null KV cache and a segfault
    engine.reset()
    direct.reset()
    np.testing.assert_array_equal(engine.prefill(prompt), direct.prefill(prompt))
    assert engine.generate(prompt, 4) == direct.generate(prompt, 4)


def test_web_options_are_refused_for_tvms_runtime(tiny_llvm):
    for options in (RunOptions(adapter="gles"), RunOptions(browser=True)):
        with pytest.raises(ValueError, match=r"^--adapter / --browser choose a WebGPU runtime: they apply to webgpu artifacts only$"):
            open_engine(tiny_llvm, "synthetic", 0, options)
        with pytest.raises(ValueError, match="apply to webgpu artifacts only"):
            kernel_runner(tiny_llvm, json.loads((tiny_llvm / "manifest.json").read_text()), options)


def test_rpc_is_refused_for_a_webgpu_artifact(tiny_llvm, tmp_path):
    """The manifest names the runtime: a webgpu one is never handed to TVM's RPC (checked before anything loads)."""
    copy = tmp_path / "web"
    shutil.copytree(tiny_llvm, copy)
    manifest = json.loads((copy / "manifest.json").read_text())
    manifest["target"] = {"kind": "webgpu"}
    (copy / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ValueError, match=r"^--rpc runs TVM's runtime \(llvm, cuda, metal artifacts\); a webgpu artifact runs in a WebGPU"):
        open_engine(copy, "synthetic", 0, RunOptions(remote=object()))
    with pytest.raises(ValueError, match="--rpc runs TVM's runtime"):
        kernel_runner(copy, manifest, RunOptions(remote=object()))


def test_kernel_runner_runs_a_shipped_kernel_here_and_none_where_it_cannot(tiny_llvm):
    manifest = json.loads((tiny_llvm / "manifest.json").read_text())
    run = kernel_runner(tiny_llvm, manifest, RunOptions())
    name = next(k["name"] for k in manifest["kernels"] if k["name"].startswith("rms_norm"))
    from mlcpipe.conformance import Reference
    from mlcpipe.kernel_inputs import kernel_args

    reference = Reference(tiny_llvm, manifest)
    args, _ = kernel_args(reference.signature(name), 3, seed=0, heads={"H": 4, "D": 16})
    got = run(name, [a.copy() if isinstance(a, np.ndarray) else a for a in args])
    want = reference.run(name, [a.copy() if isinstance(a, np.ndarray) else a for a in args])
    np.testing.assert_allclose(got[-1], want[-1], rtol=1e-5, atol=1e-5)
    metal = {**manifest, "target": {"kind": "metal"}}
    assert kernel_runner(tiny_llvm, metal, RunOptions()) is None  # Metal runs only on a Mac (over --rpc)

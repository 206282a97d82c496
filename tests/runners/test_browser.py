"""The WebGPU runner in headless Chromium (`WebGPUEngine(..., browser=True)`: web/browser_runner.mjs
driving /usr/bin/chromium with puppeteer-core; the page fetches lib.wasm and the weights over HTTP
from 127.0.0.1): the same logits as Dawn for node on SwiftShader, kernel timestamps, and the
runner's one-line errors.

A tiny Llama with the 1B's attention shape (head_dim 64, 8 query / 2 KV heads), q4f32_1 (SwiftShader
has no shader-f16). One prefill chunk only (prompt <= prefill_chunk_size). Skipped where node,
Chromium or the npm packages (`npm ci`) are missing.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
import yaml

from mlcpipe.build import build
from mlcpipe.config import MODELS_DIR, load_model_config
from mlcpipe.errors import RunnerError
from mlcpipe.runners.webgpu.dawn import WebGPUEngine
from mlcpipe.targets import load_target
from mlcpipe.quantization import quantization

CHUNK = 16
PROMPT = [int(t) for t in np.random.default_rng(11).integers(0, 512, size=CHUNK)]  # one prefill chunk


pytestmark = pytest.mark.browser(skip_if_missing=True)


@pytest.fixture(scope="module")
def artifact(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("webgpu-browser")
    raw = yaml.safe_load((MODELS_DIR / "llama-tiny.yaml").read_text())
    raw.update(name="llama-tiny-browser", prefill_chunk_size=CHUNK, head_dim=64, num_attention_heads=8, hidden_size=256)
    (root / "llama-tiny-browser.yaml").write_text(yaml.safe_dump(raw))
    config = load_model_config(str(root / "llama-tiny-browser.yaml"))
    return build(config, quantization("q4f32_1"), load_target("webgpu"), output=root / "artifact", weights="synthetic", log=lambda *_: None)


@pytest.fixture(scope="module")
def node_logits(artifact) -> np.ndarray:
    """The prompt's last logits from Dawn for node on SwiftShader."""
    with WebGPUEngine(artifact, adapter="swiftshader") as engine:
        engine.reset()
        return engine.prefill(PROMPT)


@pytest.fixture(scope="module")
def browser_engine(artifact):
    with WebGPUEngine(artifact, adapter="swiftshader", browser=True) as engine:
        yield engine


def test_browser_page_runs_on_swiftshader(browser_engine):
    info = browser_engine.adapter_info
    assert browser_engine.adapter == "swiftshader"
    assert info["architecture"] == "swiftshader" and info["fallback"], info
    assert "Chrome/" in info["browser"], info
    assert "shader-f16" not in info["features"]


def test_browser_logits_match_node(browser_engine, node_logits):
    assert browser_engine.prefill_chunk == CHUNK and len(PROMPT) <= CHUNK
    browser_engine.reset()
    got = browser_engine.prefill(PROMPT)
    assert got.shape == node_logits.shape == (512,)
    rel = np.abs(got - node_logits).max() / np.abs(node_logits).max()
    print(f"browser vs node (SwiftShader): max relative logit error {rel:.2e}")
    assert rel < 1e-4


def test_browser_timestamps(browser_engine, artifact):
    assert "timestamp-query" in browser_engine.adapter_info["features"]  # Chromium's SwiftShader adapter has it
    kernels = {k["name"] for k in json.loads((artifact / "manifest.json").read_text())["kernels"]}
    browser_engine.reset()
    browser_engine.timed = True
    try:
        browser_engine.prefill(PROMPT[:5])
        prefill = list(browser_engine.last_kernels)
        browser_engine.decode(PROMPT[5])
        decode = list(browser_engine.last_kernels)
    finally:
        browser_engine.timed = False
    for step in (prefill, decode):
        assert step, "no kernel timestamps came back"
        assert {name for name, _ in step} <= kernels, {name for name, _ in step} - kernels
        assert all(ns >= 0 for _, ns in step) and sum(ns for _, ns in step) > 0
    browser_engine.decode(PROMPT[6])
    assert browser_engine.last_kernels == []  # untimed again
    assert browser_engine.runner.request("errors")["errors"] == []


def _one_line_error(artifact, **kwargs) -> str:
    with pytest.raises(RunnerError) as info:
        WebGPUEngine(artifact, browser=True, **kwargs).close()
    message = str(info.value)
    assert "\n" not in message, message
    return message


def test_browser_errors(artifact, monkeypatch, tmp_path):
    assert "allowed swiftshader, gpu or auto" in _one_line_error(artifact, adapter="gles")
    monkeypatch.setenv("MLCPIPE_CHROMIUM", str(tmp_path / "no-chromium"))
    assert "needs Chromium at" in _one_line_error(artifact, adapter="swiftshader")
    monkeypatch.setenv("MLCPIPE_CHROMIUM", shutil.which("false") or "/bin/false")
    assert "did not start" in _one_line_error(artifact, adapter="swiftshader")


def test_browser_gpu_refuses_a_software_adapter(artifact):
    """--adapter gpu in the browser: where Chromium offers only SwiftShader, one clear line."""
    probe = subprocess.run(["sh", "-c", "ls /dev/dri/renderD* /dev/nvidia0 2>/dev/null"], capture_output=True, text=True)
    if probe.stdout.strip():
        pytest.skip("this machine may have a GPU")
    assert "no GPU adapter: Chromium offers only" in _one_line_error(artifact, adapter="gpu")


def test_browser_runs_one_kernel(browser_engine):
    """The `kernel` op: one kernel of the shipped lib.wasm (rms_norm) on tensors sent as base64."""
    from mlcpipe.runners.webgpu.dawn import b64, unb64

    rng = np.random.default_rng(0)
    x = rng.standard_normal((1, 1, 256)).astype("float32")
    w = rng.standard_normal(256).astype("float32")
    args = [{"tensor": True, "shape": list(a.shape), "dtype": "float32", "bytes": b64(a)} for a in (x, w, np.zeros_like(x))]
    outs = browser_engine.runner.request("kernel", name="rms_norm", args=args)["outputs"]
    got = unb64(outs[2], "float32", x.shape)
    want = x / np.sqrt((x.astype("float64") ** 2).mean(-1, keepdims=True) + 1e-5) * w
    assert np.abs(got - want).max() / np.abs(want).max() < 1e-5
    assert np.array_equal(unb64(outs[0], "float32", x.shape), x)


def test_cli_profile_browser_prints_the_phase_reports(artifact):
    """`mlcpipe profile --browser`: the real run in the page, seed 002's per-phase GPU profile
    reports and metrics lines on stdout, the page's console on stderr."""
    from tests.helpers.cli import mlcpipe

    proc = mlcpipe("profile", "--artifact", str(artifact), "--browser", "--prompt-len", "8", "--gen-len", "3", "--runs", "1")
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = proc.stdout
    assert "[Profile] Prefill (prefill):" in out and "[Profile] Decode (N=" in out and "GPU Profile Report" in out
    assert "[Perf] TTFT:" in out and "tok/s" in out
    assert "[browser:log] [GPU]" in proc.stderr

"""The full Llama-3.2-1B q4f32_1 webgpu artifact run whole in Dawn (OpenGL ES on llvmpipe): the
llvm build's greedy tokens from the same synthetic weights, with prefill chunks of 16 tokens so
every chunk after the first attends to cached pages; and `mlcpipe check` passes every kernel it
executes. Long (minutes on 2 cores): `python -m pytest -m long tests/runners/test_dawn_1b.py`."""

from __future__ import annotations

import numpy as np
import pytest

from mlcpipe.build import build
from mlcpipe.config import load_model_config
from mlcpipe.conformance import check_artifact
from mlcpipe.runners.webgpu.dawn import WebGPUEngine
from mlcpipe.runtime import Engine
from mlcpipe.targets import load_target
from mlcpipe.quantization import quantization

pytestmark = [pytest.mark.long, pytest.mark.dawn]

PROMPT = [int(t) for t in np.random.default_rng(0).integers(0, 128256, size=40)]
STEPS = 4


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory):
    root = tmp_path_factory.mktemp("llama-1b")
    config = load_model_config("llama-3.2-1b")
    quiet = lambda *_: None  # noqa: E731
    return (build(config, quantization("q4f32_1"), load_target("webgpu"), output=root / "webgpu", log=quiet),
            build(config, quantization("q4f32_1"), load_target("llvm"), output=root / "llvm", log=quiet))  # fmt: skip


def test_1b_webgpu_generates_the_llvm_tokens(artifacts):
    webgpu, llvm = artifacts
    want: list[np.ndarray] = []
    tokens = Engine(llvm, "synthetic").generate(PROMPT, STEPS, on_logits=lambda step, logits: want.append(logits))
    got: list[np.ndarray] = []
    with WebGPUEngine(webgpu, "synthetic", adapter="gles", prefill_chunk=16) as engine:
        assert engine.generate(PROMPT, STEPS, on_logits=lambda step, logits: got.append(logits)) == tokens
    for g, w in zip(got, want):
        assert np.abs(g - w).max() / np.abs(w).max() < 1e-4


def test_1b_webgpu_check_passes_every_kernel_it_runs(artifacts):
    report = check_artifact(artifacts[0], sizes=(1, 7))
    ran = [r for r in report.results if r.status in ("pass", "FAIL")]
    assert report.executed and len(ran) >= 30, report.summary
    assert report.ok, report.table()

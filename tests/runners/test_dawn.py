"""WebGPU artifacts run whole in a real WebGPU runtime (Dawn for node + TVM's web runtime) on both
software adapters: a tiny Llama with Llama-3.2-1B's attention shape (head_dim 64, 4 query heads
per KV head), prompts longer than the prefill chunk, logits and greedy tokens against the NumPy
Llama; `mlcpipe run --save-logits` and the one-line errors of the runner."""

from __future__ import annotations

import dataclasses
import re

import numpy as np
import pytest
from click.testing import CliRunner

from mlcpipe.build import build
from mlcpipe.cli import main
from mlcpipe.quantization import QUANTIZATIONS
from mlcpipe.runners.webgpu import dawn
from mlcpipe.errors import RunnerError
from mlcpipe.runners.webgpu.dawn import WebGPUEngine
from mlcpipe.targets import load_target
from mlcpipe.weights import convert_weights
from mlcpipe.quantization import quantization

from tests.helpers.hardware import NO_CUDA
from tests.helpers.checkpoints import hf_config, random_hf_weights, write_hf_checkpoint
from tests.helpers.reference_checks import as_model_sees_it, check_against_reference
from tests.helpers.reference_llama import ReferenceLlama

ADAPTERS = ["gles", "swiftshader"]
# max |logit error| / max |logit| for f32 models. llvmpipe (GLES) computes f32 exactly as the
# CPU does; SwiftShader's exp / inverseSqrt / division are its own approximations (within the
# ULP bounds Vulkan allows), ~1e-4 of the largest logit after a few layers.
TOLERANCE = {"gles": 1e-4, "swiftshader": 5e-4}
CHUNK = 16
PROMPT = [int(t) for t in np.random.default_rng(7).integers(0, 512, size=2 * CHUNK + 9)]  # three chunks


@pytest.fixture(scope="module")
def gqa_config(tiny_config):
    """The tiny Llama with the 1B's attention shape: head_dim 64, 8 query / 2 KV heads."""
    return dataclasses.replace(tiny_config, name="llama-tiny-gqa4", hidden_size=256, num_attention_heads=8,
                               head_dim=64, prefill_chunk_size=CHUNK)


@pytest.fixture(scope="module", params=["q4f32_1", "q0f32"])
def model(request, gqa_config, tmp_path_factory):
    quant = request.param
    tmp = tmp_path_factory.mktemp(f"webgpu-run-{quant}")
    weights = random_hf_weights(gqa_config, seed=3)
    hf_dir = write_hf_checkpoint(tmp / "hf", gqa_config, weights, shards=1)
    params = convert_weights(gqa_config, quantization(quant), hf_dir, tmp / "weights", log=lambda *_: None)
    artifact = build(gqa_config, quantization(quant), load_target("webgpu"), output=tmp / "artifact", log=lambda *_: None)
    seen = as_model_sees_it(quant, weights)
    return quant, artifact, params, lambda: ReferenceLlama(hf_config(gqa_config), seen)  # a fresh KV state per use


@pytest.mark.dawn
@pytest.mark.parametrize("adapter", ADAPTERS)
def test_webgpu_artifact_matches_numpy_past_the_prefill_chunk(model, adapter):
    quant, artifact, params, make_ref = model
    ref = make_ref()
    with WebGPUEngine(artifact, params, adapter=adapter) as engine:
        assert engine.prefill_chunk == CHUNK and len(PROMPT) > 2 * CHUNK
        worst, mismatches = check_against_reference(engine, ref, QUANTIZATIONS[quant].model_dtype, PROMPT, 6, TOLERANCE[adapter])
        print(f"{quant} on {adapter}: worst relative logit error {worst:.2e}")
        assert mismatches == 0
        # a second turn: a prefill chunk of several tokens after the first turn's context
        ref_turn = ref.forward([5, 6, 7, 8, 9])[-1]
        got_turn = engine.prefill([5, 6, 7, 8, 9])
        assert np.abs(got_turn - ref_turn).max() / np.abs(ref_turn).max() < TOLERANCE[adapter]


@pytest.mark.dawn
def test_cli_run_webgpu_save_logits(model, tmp_path):
    quant, artifact, params, make_ref = model
    ref = make_ref()
    out = tmp_path / "logits.npy"
    result = CliRunner().invoke(main, ["run", "--artifact", str(artifact), "--weights", str(params), "--adapter", "gles",
                                       "--prompt-tokens", ",".join(map(str, PROMPT)), "--max-new-tokens", "3",
                                       "--save-logits", str(out)])
    assert result.exit_code == 0, result.output
    logits = np.load(out)
    assert logits.shape == (3, 512) and logits.dtype == np.float32
    tokens = [int(t) for t in result.output.strip().splitlines()[-1].split(",")]
    want = ref.forward(PROMPT)[-1]
    for step, token in enumerate(tokens):
        assert np.abs(logits[step] - want).max() / np.abs(want).max() < 1e-4
        assert token == int(np.argmax(want))
        want = ref.forward([token])[-1]


@pytest.mark.dawn
def test_runner_errors_are_one_line(model, monkeypatch, tmp_path):
    _, artifact, params, _ = model
    with pytest.raises(RunnerError, match="--adapter 'metal'"):
        WebGPUEngine(artifact, params, adapter="metal")
    # no GPU here: --adapter gpu is refused before node starts
    result = CliRunner().invoke(main, ["run", "--artifact", str(artifact), "--weights", str(params), "--adapter", "gpu",
                                       "--prompt-tokens", "1,2,3"])
    assert result.exit_code == 2 and result.output.strip().splitlines()[-1].startswith("error: --adapter gpu: no GPU with a Vulkan driver here")
    # an adapter whose system package is missing
    monkeypatch.setattr(dawn, "SWIFTSHADER_ICD", tmp_path / "vk_swiftshader_icd.json")
    with pytest.raises(RunnerError, match="--adapter swiftshader needs .*chromium"):
        WebGPUEngine(artifact, params, adapter="swiftshader")
    # a webgpu artifact is not a TVM RPC artifact
    result = CliRunner().invoke(main, ["run", "--artifact", str(artifact), "--weights", str(params), "--rpc", "127.0.0.1:1",
                                       "--prompt-tokens", "1,2,3"])
    assert result.exit_code == 2 and result.output.strip().splitlines()[-1].startswith("error:")
    monkeypatch.setenv("PATH", str(tmp_path))  # no node on PATH
    result = CliRunner().invoke(main, ["run", "--artifact", str(artifact), "--weights", str(params), "--adapter", "gles",
                                       "--prompt-tokens", "1,2,3"])
    assert result.exit_code == 2
    assert result.output.strip().splitlines()[-1].startswith("error: node (Node.js) not found")


@pytest.mark.dawn
def test_check_webgpu_on_swiftshader(model):
    """`mlcpipe check --adapter swiftshader`: every kernel of lib.wasm in Dawn's Vulkan backend."""
    from mlcpipe.device import RunOptions
    from mlcpipe.conformance import check_artifact

    _, artifact, _, _ = model
    report = check_artifact(artifact, sizes=(7,), options=RunOptions(adapter="swiftshader"))
    assert report.executed and report.ok, report.table()
    assert report.summary.startswith("webgpu on swiftshader") and "0 failed" in report.summary


@pytest.mark.nvcc
@pytest.mark.long  # a tiny cuda build for an error path; tests/device/test_bundle.py runs cuda artifacts' run side by default
def test_cuda_artifact_without_a_gpu_is_one_line(gqa_config, tmp_path):
    """A cuda artifact where no CUDA device is: `run` says so in one line; `check` falls back to
    nvcc/ptxas and says NOT EXECUTED."""
    import tvm

    if tvm.cuda(0).exist:
        pytest.skip("this machine has a CUDA device")
    artifact = build(gqa_config, quantization("q4f32_1"), load_target("cuda"), output=tmp_path / "cuda", log=lambda *_: None)
    result = CliRunner().invoke(main, ["run", "--artifact", str(artifact), "--weights", "synthetic", "--prompt-tokens", "1,2,3"])
    assert result.exit_code == 2
    assert re.fullmatch("error: " + NO_CUDA.lstrip("^"), result.output.strip().splitlines()[-1]), result.output

"""`mlcpipe run` samples through the library's own sampler functions on the device
(apply_penalty_inplace, softmax_with_temperature, argsort_probs, sample_with_top_p): the tokens
equal a NumPy sampler's on the logits the run saved, with the same seeded uniform draws and the
penalties over the generated tokens; on llvm and on webgpu (Dawn, GLES). The tiny Llama has its own
lm_head (tied random embeddings make every step repeat the last token) and the 1B's attention
shape; the prompt is longer than the prefill chunk."""

from __future__ import annotations

import dataclasses
from collections import Counter

import numpy as np
import pytest
from click.testing import CliRunner

from mlcpipe.build import build
from mlcpipe.cli import main
from mlcpipe.generation import Sampling
from mlcpipe.targets import load_target
from mlcpipe.weights import convert_weights
from mlcpipe.quantization import quantization

from tests.helpers.checkpoints import random_hf_weights, write_hf_checkpoint
from tests.helpers.sampler_reference import argsort_ref, penalty_ref, softmax_ref

QUANT = "q4f32_1"
CHUNK = 16
PROMPT = ",".join(str(t) for t in np.random.default_rng(31).integers(3, 512, size=CHUNK + 5))
STEPS = 12
QUIET = {"log": lambda *_: None}


@pytest.fixture(scope="module")
def model(tiny_config, tmp_path_factory):
    config = dataclasses.replace(tiny_config, name="llama-tiny-sampling", hidden_size=256, num_attention_heads=8,
                                 head_dim=64, prefill_chunk_size=CHUNK, tie_word_embeddings=False)
    tmp = tmp_path_factory.mktemp("sampling")
    hf_dir = write_hf_checkpoint(tmp / "hf", config, random_hf_weights(config, seed=29), shards=1)
    return config, convert_weights(config, quantization(QUANT), hf_dir, tmp / "weights", **QUIET), tmp


@pytest.fixture(scope="module")
def artifacts(model):
    config, _, tmp = model
    return {kind: build(config, quantization(QUANT), load_target(kind), output=tmp / kind, **QUIET) for kind in ("llvm", "webgpu")}


def numpy_sampling(logits: np.ndarray, sampling: Sampling) -> tuple[list[int], float]:
    """Tokens a NumPy sampler draws from each step's logits (the model's, before penalties), and
    the smallest distance of a draw from a CDF step edge (float32 sums must not flip a pick)."""
    rng = np.random.default_rng(sampling.seed)
    generated: Counter = Counter()
    tokens, closest = [], 1.0
    for row in logits:
        uniform = float(np.float32(rng.random()))
        x = row[None, :].astype(np.float32)
        if sampling.penalized and generated:
            ids = np.int32(sorted(generated))
            x = penalty_ref(x, np.int32([0]), np.zeros(ids.size, np.int32), ids, np.int32([generated[t] for t in ids]),
                            np.float32([[sampling.presence_penalty, sampling.frequency_penalty, sampling.repetition_penalty]]))
        probs = softmax_ref(x, np.float32([sampling.temperature])).astype(np.float32)
        order = argsort_ref(probs)[0]
        c = np.cumsum(probs[0, order].astype(np.float64))
        reach = np.nonzero(c >= sampling.top_p)[0]
        cutoff = int(reach[0]) if reach.size else c.size - 1
        point = uniform * c[cutoff]
        j = min(int(np.searchsorted(c, point, side="right")), cutoff)
        if sampling.temperature > 0:
            closest = min(closest, float(np.min(np.abs(c[: cutoff + 1] - point))))
        tokens.append(int(order[j]))
        generated[tokens[-1]] += 1
    return tokens, closest


def run_cli(artifact, weights, tmp_path, *flags: str) -> tuple[list[int], np.ndarray]:
    out = tmp_path / f"logits-{abs(hash(flags))}.npy"
    result = CliRunner().invoke(main, ["run", "--artifact", str(artifact), "--weights", str(weights), "--prompt-tokens", PROMPT,
                                       "--max-new-tokens", str(STEPS), "--save-logits", str(out), *flags])
    assert result.exit_code == 0, result.output
    return [int(t) for t in result.output.strip().splitlines()[-1].split(",")], np.load(out)


SAMPLINGS = [
    Sampling(temperature=0.9, top_p=0.8, seed=5),
    Sampling(temperature=1.3, top_p=1.0, repetition_penalty=1.5, presence_penalty=0.4, frequency_penalty=0.3, seed=11),
    Sampling(temperature=0.0, repetition_penalty=3.0),  # greedy on penalised logits
]


def flags_of(sampling: Sampling) -> list[str]:
    return ["--temperature", str(sampling.temperature), "--top-p", str(sampling.top_p), "--repetition-penalty",
            str(sampling.repetition_penalty), "--presence-penalty", str(sampling.presence_penalty),
            "--frequency-penalty", str(sampling.frequency_penalty), "--seed", str(sampling.seed)]


@pytest.mark.parametrize("kind", ["llvm", pytest.param("webgpu", marks=pytest.mark.dawn)])
def test_run_samples_on_the_device_like_numpy(kind, model, artifacts, tmp_path):
    _, weights, _ = model
    device = ["--adapter", "gles"] if kind == "webgpu" else []
    greedy, greedy_logits = run_cli(artifacts[kind], weights, tmp_path, *device)
    assert greedy == [int(np.argmax(row)) for row in greedy_logits]
    for sampling in SAMPLINGS:
        tokens, logits = run_cli(artifacts[kind], weights, tmp_path, *device, *flags_of(sampling))
        want, closest = numpy_sampling(logits, sampling)
        print(f"{kind} {sampling}: {tokens} (closest draw to a CDF edge {closest:.1e})")
        assert closest > 1e-5, "a draw on a CDF edge: pick another seed"
        assert tokens == want, f"{kind} {sampling}: device {tokens} vs NumPy {want}"
        assert tokens != greedy, "sampling that changes nothing proves nothing"
    # the seed decides the draws: the same seed repeats them, another seed changes them
    first, _ = run_cli(artifacts[kind], weights, tmp_path, *device, *flags_of(SAMPLINGS[0]))
    again, _ = run_cli(artifacts[kind], weights, tmp_path, *device, *flags_of(SAMPLINGS[0]))
    other, _ = run_cli(artifacts[kind], weights, tmp_path, *device, *flags_of(dataclasses.replace(SAMPLINGS[0], seed=6)))
    assert first == again != other


@pytest.mark.parametrize(("flags", "message"), [
    (["--top-p", "0"], "--top-p 0.0: allowed a number in (0, 1]"),
    (["--temperature", "-1"], "--temperature -1.0: allowed a number >= 0 (0: greedy)"),
    (["--repetition-penalty", "0"], "--repetition-penalty 0.0: allowed a number > 0 (1: none)"),
    (["--temperature", "nan"], "--temperature nan: allowed a number >= 0 (0: greedy)"),
    (["--seed", str(2**63)], "--seed 9223372036854775808: allowed an integer in [0, 2**63)"),
])
def test_bad_sampling_flags_are_one_line_errors(flags, message, artifacts, model):
    _, weights, _ = model
    result = CliRunner().invoke(main, ["run", "--artifact", str(artifacts["llvm"]), "--weights", str(weights),
                                       "--prompt-tokens", "5,6", *flags])
    assert result.exit_code == 2
    assert result.output.strip().splitlines() == [f"error: {message}"]

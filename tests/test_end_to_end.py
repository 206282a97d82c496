"""Tiny Llama checkpoint (HF layout, random weights) -> convert -> build for llvm -> run, with
logits of prefill and 8 decode steps checked against an independent NumPy Llama."""

from __future__ import annotations

import numpy as np
import pytest

from mlcpipe.build import build
from mlcpipe.quantization import QUANTIZATIONS
from mlcpipe.runtime import Engine
from mlcpipe.targets import load_target
from mlcpipe.weights import convert_weights
from mlcpipe.quantization import quantization

from tests.helpers.checkpoints import hf_config, random_hf_weights, write_hf_checkpoint
from tests.helpers.reference_checks import PROMPT, as_model_sees_it, check_against_reference
from tests.helpers.reference_llama import ReferenceLlama

DECODE_STEPS = 8


@pytest.mark.parametrize("quant", [pytest.param("q0f32", marks=pytest.mark.long), "q0f16", "q4f32_1", "q4f16_1"])
def test_tiny_llama_matches_numpy_reference(quant, tiny_config, tmp_path):
    weights = random_hf_weights(tiny_config, seed=1)
    hf_dir = write_hf_checkpoint(tmp_path / "hf", tiny_config, weights, shards=2)
    params = convert_weights(tiny_config, quantization(quant), hf_dir, tmp_path / "weights", log=lambda *_: None)
    artifact = build(tiny_config, quantization(quant), load_target("llvm"), output=tmp_path / "artifact", log=lambda *_: None)

    engine = Engine(artifact, params)
    ref = ReferenceLlama(hf_config(tiny_config), as_model_sees_it(quant, weights))
    dtype = QUANTIZATIONS[quant].model_dtype
    worst, mismatches = check_against_reference(engine, ref, dtype, PROMPT, DECODE_STEPS)
    print(f"{quant}: worst relative logit error {worst:.2e}, greedy mismatches {mismatches}")
    assert mismatches == 0 or dtype == "float16"

    # greedy generation through the public API gives the reference's argmax chain
    tokens = engine.generate(PROMPT, 4)
    ref2 = ReferenceLlama(hf_config(tiny_config), as_model_sees_it(quant, weights))
    logits = ref2.forward(PROMPT)[-1]
    expected = []
    for _ in range(4):
        expected.append(int(np.argmax(logits)))
        logits = ref2.forward([expected[-1]])[-1]
    if dtype == "float32":
        assert tokens == expected
    else:
        assert sum(a == b for a, b in zip(tokens, expected)) >= 3

"""pipeline/weights.py: a Hugging Face checkpoint (written here, random weights) converted into
the tensor cache MLC-LLM loads, read back and checked tensor by tensor against NumPy's
quantization of the checkpoint's own values; a changed shard is refused."""

from __future__ import annotations

import json

import numpy as np
import pytest

from mlcpipe.errors import ArtifactError
from mlcpipe.quantization import QUANTIZATIONS
from mlcpipe.weights import convert_weights, expected_parameters, load_stored_weights, synthetic_stored
from mlcpipe.quantization import quantization
from tests.helpers.checkpoints import random_hf_weights, write_hf_checkpoint


@pytest.mark.parametrize("quant", ["q4f16_1", "q0f32"])
def test_converted_checkpoint_reads_back_as_numpy_quantizes_it(quant, tiny_config, tmp_path):
    hf = random_hf_weights(tiny_config, seed=3)
    source = write_hf_checkpoint(tmp_path / "hf", tiny_config, hf, shards=2)
    out = convert_weights(tiny_config, quantization(quant), source, tmp_path / "w", log=lambda *_: None)
    stored = load_stored_weights(out)
    assert [(n, tuple(a.shape), str(a.dtype)) for n, a in stored.items()] == expected_parameters(tiny_config, quantization(quant))
    scheme = QUANTIZATIONS[quant]
    q_proj = "model.layers.1.self_attn.q_proj.weight"
    want = scheme.quantize_param("model.layers.1.self_attn.qkv_proj.weight", np.concatenate(
        [hf[q_proj], hf[q_proj.replace("q_proj", "k_proj")], hf[q_proj.replace("q_proj", "v_proj")]]))
    assert want and set(want) <= set(stored), (sorted(want), sorted(stored)[:8])
    for name, array in want.items():
        np.testing.assert_array_equal(stored[name], array, err_msg=name)  # bit for bit, the fused qkv included
    norm = "model.layers.0.input_layernorm.weight"
    np.testing.assert_allclose(stored[norm].astype(np.float32), hf[norm], rtol=1e-3)
    chat = json.loads((out / "mlc-chat-config.json").read_text())
    assert chat["quantization"] == quant and chat["model_config"]["num_hidden_layers"] == tiny_config.num_hidden_layers


def test_synthetic_weights_are_seeded_and_a_changed_shard_is_refused(tiny_config, tmp_path):
    out = convert_weights(tiny_config, quantization("q4f32_1"), "synthetic", tmp_path / "w", seed=5, log=lambda *_: None)
    stored = load_stored_weights(out)
    again = synthetic_stored(tiny_config, quantization("q4f32_1"), seed=5)
    assert all(np.array_equal(stored[n], again[n]) for n in stored)
    assert not np.array_equal(synthetic_stored(tiny_config, quantization("q4f32_1"), seed=6)["model.embed_tokens.q_weight"],
                              stored["model.embed_tokens.q_weight"])
    shard = next(p for p in out.iterdir() if p.suffix == ".bin")
    data = bytearray(shard.read_bytes())
    data[100] ^= 0xFF
    shard.write_bytes(bytes(data))
    with pytest.raises(ArtifactError, match=rf"{shard.name}: sha256 .* does not match"):
        load_stored_weights(out)

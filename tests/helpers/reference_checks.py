"""An engine's logits against the NumPy Llama (tests/helpers/reference_llama.py): the weights as the
quantized model sees them, and prefill + greedy decode compared step by step."""

from __future__ import annotations

import numpy as np

from mlcpipe.quantization import QUANTIZATIONS
from mlcpipe.runtime import Engine

from .reference_llama import ReferenceLlama

PROMPT = [3, 17, 101, 7, 255, 42, 9]  # the end-to-end and tuning tests' prompt
# max |logit error| / max |logit|: float32 models compute in f32 (reference in f64);
# float16 models keep activations in f16 (accumulation in f32).
# f16 models on this CPU prefill with bf16 AMX tiles (schedules/llvm/gemm_amx.py), PyTorch's bf16
# precision: up to ~6e-3 of the largest logit on these random tiny models (5e-3 held with f32
# GEMMs). The q4 decode GEMV's two int8 activation planes (~16 bits) stay within f16 rounding.
# f32 models keep f32 arithmetic end to end.
TOLERANCE = {"float32": 1e-4, "float16": 1e-2}


def as_model_sees_it(quant: str, hf_weights: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Each HF tensor round-tripped through the quantization (rows quantize independently,
    so this equals what fused qkv / gate_up tensors hold)."""
    scheme = QUANTIZATIONS[quant]
    out = {}
    for name, w in hf_weights.items():
        if w.ndim == 2 and hasattr(scheme, "quantize_weight"):
            out[name] = scheme.dequantize_weight(*scheme.quantize_weight(w))
        else:
            out[name] = w.astype(scheme.model_dtype).astype(np.float32)
    return out


def check_against_reference(engine: Engine, ref: ReferenceLlama, dtype: str, prompt, steps, tolerance: float | None = None):
    tolerance = TOLERANCE[dtype] if tolerance is None else tolerance
    engine.check_tokens(prompt, steps)
    engine.reset()
    got = engine.prefill(prompt)
    want = ref.forward(prompt)[-1]
    errors, mismatches = [], 0
    for step in range(steps + 1):
        scale = np.abs(want).max()
        err = np.abs(got - want).max() / scale
        errors.append(err)
        assert err < tolerance, f"step {step}: relative logit error {err:.2e}"
        token = int(np.argmax(got))
        top2 = np.sort(want)[-2:]
        if token != int(np.argmax(want)):
            # a greedy mismatch is only acceptable when the reference itself is within tolerance
            assert top2[1] - top2[0] <= 2 * tolerance * scale, f"step {step}: greedy token differs"
            mismatches += 1
        if step == steps:
            break
        got = engine.decode(token)
        want = ref.forward([token])[-1]
    return max(errors), mismatches

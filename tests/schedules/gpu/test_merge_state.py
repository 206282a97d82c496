"""TVM's attention-state merge (`tir_attention_merge_state`) on WebGPU: the kernels our build
produces, run on lavapipe (wgpu) against NumPy at Llama-3.2-1B's attention shape (32 query / 8
KV heads, head_dim 64) and at the tiny GQA-4 model's (8 / 2, head_dim 64).

TVM 0.27's GPU `_merge_state_inplace` reads and writes S[token, head] from the head_dim / 4
threads of a row without a barrier; lavapipe's 8-lane subgroups run 16 of them at head_dim 64 in
two groups, the second of which merges with the already merged S (errors ~2.5, and wrong
logits for every prefill chunk that follows context). Our build swaps the kernel for the
race-free one in schedules/gpu/merge_state.py; these tests fail without that replacement.

`test_prefill_chunk_after_context` runs what the paged KV cache runs for a prefill chunk on top
of cached tokens: the ragged prefill kernel (causal, over the chunk), the paged prefill kernel
(over the cached pages), and the merge, compared with NumPy attention over the whole sequence.
"""

from __future__ import annotations

import numpy as np
import pytest
import tvm

from mlcpipe.build import export_model
from mlcpipe.config import parse_model_config
from mlcpipe.passes import run_pipeline
from mlcpipe.runners.webgpu import lavapipe as runner
from mlcpipe.targets import load_target
from mlcpipe.schedules import schedule_pass
from mlcpipe.quantization import quantization


HEAD_DIM = 64
PAGE = 16
CASES = {  # name: (query heads, KV heads, quantization)
    "1b-q4f32_1": (32, 8, "q4f32_1"),
    "1b-q4f16_1": (32, 8, "q4f16_1"),
    "tiny-gqa4-q4f32_1": (8, 2, "q4f32_1"),
}
KERNELS = ("tir_attention_merge_state", "batch_prefill_paged_kv", "batch_prefill_ragged_kv")


def _config(heads: int, kv_heads: int):
    """One small layer with the attention of the case (the KV-cache kernels depend on nothing else)."""
    raw = {
        "name": f"attn-{heads}-{kv_heads}", "architecture": "llama", "hidden_size": 256, "intermediate_size": 64,
        "num_hidden_layers": 1, "num_attention_heads": heads, "num_key_value_heads": kv_heads, "head_dim": HEAD_DIM,
        "vocab_size": 64, "rms_norm_eps": 1e-5, "rope_theta": 500000.0, "context_window_size": 256,
        "prefill_chunk_size": 16, "page_size": PAGE, "quantizations": ["q4f32_1", "q4f16_1"],
    }
    return parse_model_config(raw, "<test>")


@pytest.fixture(scope="module", params=list(CASES))
def case(request):
    """(heads, kv_heads, dtype, {kernel: scheduled PrimFunc}) as the webgpu build schedules them."""
    heads, kv_heads, quant = CASES[request.param]
    target = load_target("webgpu").tvm_target()
    mod, _ = export_model(_config(heads, kv_heads), quantization(quant), target)
    mod = run_pipeline(mod, target, schedule=schedule_pass("webgpu"), until="schedule")
    dtype = "float16" if quant.endswith("f16_1") else "float32"
    return heads, kv_heads, dtype, {name: mod[name] for name in KERNELS}


def _tol(dtype: str) -> float:
    return 2e-2 if dtype == "float16" else 1e-4


def _merge_numpy(v, s, v_other, s_other):
    s_max = np.maximum(s, s_other)
    a, b = np.exp2(s - s_max), np.exp2(s_other - s_max)
    v = (v.astype(np.float64) * a[..., None] + v_other.astype(np.float64) * b[..., None]) / (a + b)[..., None]
    return v, np.log2(a + b) + s_max


@pytest.mark.lavapipe(skip_if_missing=True)
@pytest.mark.parametrize("tokens", [1, 7, 16])
def test_merge_state_matches_numpy(case, tokens):
    heads, _, dtype, kernels = case
    rng = np.random.default_rng(tokens)
    v, v_other = (rng.standard_normal((tokens, heads, HEAD_DIM)).astype(dtype) for _ in range(2))
    s, s_other = ((rng.standard_normal((tokens, heads)) * 4).astype(np.float32) for _ in range(2))
    want_v, want_s = _merge_numpy(v, s, v_other, s_other)
    target = load_target("webgpu").tvm_target()
    got_v, got_s, _, _ = runner.run_primfunc(kernels["tir_attention_merge_state"], target, [v.copy(), s.copy(), v_other, s_other])
    err_v = np.abs(got_v.astype(np.float64) - want_v).max()
    err_s = np.abs(got_s.astype(np.float64) - want_s).max()
    assert err_v <= _tol(dtype) * np.abs(want_v).max(), f"V: max abs err {err_v:.3e}"
    assert err_s <= 1e-5 * np.abs(want_s).max(), f"S: max abs err {err_s:.3e}"


@pytest.mark.lavapipe(skip_if_missing=True)
def test_prefill_chunk_after_context(case):
    """A 7-token chunk after 21 cached tokens (two pages, the second partly filled)."""
    heads, kv_heads, dtype, kernels = case
    context, n = 21, 7
    num_pages = -(-context // PAGE)
    rng = np.random.default_rng(0)
    target = load_target("webgpu").tvm_target()
    sm_scale = HEAD_DIM**-0.5

    q = rng.standard_normal((n, heads, HEAD_DIM)).astype(dtype)
    k_all = rng.standard_normal((context + n, kv_heads, HEAD_DIM)).astype(dtype)
    v_all = rng.standard_normal((context + n, kv_heads, HEAD_DIM)).astype(dtype)
    # the cached tokens in pages (pages, K/V, kv head, slot, dim), page order shuffled
    page_ids = np.array([3, 1], np.int32)[:num_pages]
    pages = rng.standard_normal((4, 2, kv_heads, PAGE, HEAD_DIM)).astype(dtype)
    for pos in range(context):
        page, slot = page_ids[pos // PAGE], pos % PAGE
        pages[page, 0, :, slot] = k_all[pos]
        pages[page, 1, :, slot] = v_all[pos]
    i32 = lambda *values: np.array(values, np.int32)  # noqa: E731
    positions = np.arange(context, context + n, dtype=np.int32)
    scalars = [0, 1.0, 10000.0, sm_scale]  # rotary_mode 0 (RoPE applied before the append), scale, theta, sm_scale

    # the chunk over itself, causal; then the chunk over the cached pages; then the merge
    out, lse = np.zeros((n, heads, HEAD_DIM), dtype), np.zeros((n, heads), np.float32)
    ragged = runner.run_primfunc(kernels["batch_prefill_ragged_kv"], target, [
        q, i32(0, n), k_all[context:].copy(), v_all[context:].copy(), i32(0, n), positions, i32(context), out, lse, 1, *scalars])
    out, lse = ragged[7], ragged[8]
    tmp, tmp_lse = np.zeros((n, heads, HEAD_DIM), dtype), np.zeros((n, heads), np.float32)
    paged = runner.run_primfunc(kernels["batch_prefill_paged_kv"], target, [
        q, i32(0, n), pages, i32(0, num_pages), page_ids, i32(context - (num_pages - 1) * PAGE), i32(0), positions,
        tmp, tmp_lse, 0, *scalars])
    tmp, tmp_lse = paged[8], paged[9]
    got, got_lse, _, _ = runner.run_primfunc(kernels["tir_attention_merge_state"], target, [out, lse, tmp, tmp_lse])

    group = heads // kv_heads
    qf, kf, vf = (x.astype(np.float64) for x in (q, k_all, v_all))
    want = np.zeros((n, heads, HEAD_DIM))
    want_lse = np.zeros((n, heads))
    for h in range(heads):
        scores = qf[:, h] @ kf[:, h // group].T * sm_scale  # (n, context + n)
        scores[np.arange(context + n)[None, :] > context + np.arange(n)[:, None]] = -np.inf
        top = scores.max(axis=1, keepdims=True)
        weights = np.exp(scores - top)
        want[:, h] = weights @ vf[:, h // group] / weights.sum(axis=1, keepdims=True)
        want_lse[:, h] = (np.log(weights.sum(axis=1)) + top[:, 0]) / np.log(2)
    err = np.abs(got.astype(np.float64) - want).max()
    err_lse = np.abs(got_lse - want_lse).max()
    assert err <= _tol(dtype) * np.abs(want).max(), f"attention output: max abs err {err:.3e}"
    assert err_lse <= (1e-2 if dtype == "float16" else 1e-4) * np.abs(want_lse).max(), f"lse: max abs err {err_lse:.3e}"


def test_cuda_and_metal_kernels_have_the_barrier():
    """Codegen only (no GPU): the replacement applies to the CUDA and Metal builds too, with the
    barrier between the read of S and its store."""
    from mlcpipe.schedules import REPLACEMENTS
    from tvm.relax.frontend.nn.llm import kv_cache

    for kind, target, barrier in (
        ("cuda", tvm.target.Target({"kind": "cuda", "arch": "sm_90"}), "__syncthreads();"),
        ("metal", tvm.target.Target("apple/m2-gpu"), "threadgroup_barrier("),
    ):
        with target:
            func = kv_cache._merge_state_inplace(32, HEAD_DIM, "float16", target, "tir_attention_merge_state")
            mod = tvm.IRModule({"tir_attention_merge_state": func})
            mod, replaced = REPLACEMENTS[kind]["MergeStateBarrier"](mod)
        assert replaced == ["tir_attention_merge_state"]
        lib = tvm.compile(mod, target=target)
        source = lib.mod.imports[0].inspect_source() if hasattr(lib, "mod") else lib.imports[0].inspect_source()
        read, write = source.index("S_ptr[("), source.rindex("S_ptr[(")  # S read first, stored last
        assert barrier in source and read < source.index(barrier) < write, kind

"""The sampler functions every library carries (pipeline/model/sampler.py), as WebLLM and MLC-LLM
call them: softmax_with_temperature, argsort_probs, sample_with_top_p, apply_penalty_inplace,
apply_logit_bias_inplace, apply_bitmask_inplace. Each against NumPy through the Relax VM of the
tiny llvm build and of sampler-only llvm modules at realistic vocabularies (5000: a partial
bitmask word and every sort kernel; 128256: Llama 3's); every sampler kernel of a webgpu library
against its reference on llvm in Dawn (`mlcpipe check`)."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
import tvm
from tvm import relax

from mlcpipe.build import build
from mlcpipe.model import sampler
from mlcpipe.passes import run_pipeline
from mlcpipe.targets import load_target
from mlcpipe.schedules import schedule_pass
from mlcpipe.quantization import quantization

from tests.helpers.sampler_reference import LOWEST, argsort_ref, bitmask_ref, penalty_ref, softmax_ref, top_p_ref

CPU = tvm.cpu()


def tensor(a: np.ndarray):
    return tvm.runtime.tensor(np.ascontiguousarray(a), CPU)


@pytest.fixture(scope="module")
def llvm_artifact(tiny_config, tmp_path_factory):
    out = tmp_path_factory.mktemp("sampler") / "tiny-q4f32_1-llvm"
    return build(tiny_config, quantization("q4f32_1"), load_target("llvm"), output=out, log=lambda *_: None)


@pytest.fixture(scope="module")
def tiny_vm(llvm_artifact):
    return relax.VirtualMachine(tvm.runtime.load_module(str(llvm_artifact / "lib.so")), CPU)


_SAMPLER_VMS: dict[int, relax.VirtualMachine] = {}


def sampler_vm(vocab: int) -> relax.VirtualMachine:
    """The six functions alone for `vocab`, through mlcpipe's pass pipeline, built for llvm."""
    if vocab not in _SAMPLER_VMS:
        target = load_target("llvm").tvm_target()
        mod = run_pipeline(sampler.attach_sampler(tvm.IRModule(), target, vocab), target, schedule=schedule_pass("llvm"))
        _SAMPLER_VMS[vocab] = relax.VirtualMachine(relax.build(mod, target, relax_pipeline=None), CPU)
    return _SAMPLER_VMS[vocab]


@pytest.fixture(params=["tiny", 5000, 128256], ids=lambda p: f"vocab-{p}")
def vm_and_vocab(request, tiny_vm, tiny_config):
    if request.param == "tiny":
        return tiny_vm, tiny_config.vocab_size
    return sampler_vm(request.param), request.param


# ---- inputs -------------------------------------------------------------------------------------------

def pack_bitmask(allowed: np.ndarray) -> np.ndarray:
    """(rows, V) bool -> (rows, ceil(V/32)) int32 words, token v at bit v % 32 of word v // 32."""
    rows, vocab = allowed.shape
    padded = np.zeros((rows, -(-vocab // 32) * 32), np.uint64)
    padded[:, :vocab] = allowed
    words = (padded.reshape(rows, -1, 32) << np.arange(32, dtype=np.uint64)).sum(axis=2)
    return words.astype(np.uint32).view(np.int32)


# ---- the functions ------------------------------------------------------------------------------------

def test_library_has_the_functions_with_sampler_kernels(llvm_artifact):
    manifest = json.loads((llvm_artifact / "manifest.json").read_text())
    assert set(sampler.FUNCTIONS) <= set(manifest["functions"])
    kernels = {k["name"]: k for k in manifest["kernels"] if k["name"].startswith(sampler.KERNEL_PREFIX)}
    assert {k["role"] for k in kernels.values()} == {"sampler"}
    assert {"sampler_softmax_chunk_stats", "sampler_argsort_tiles", "sampler_top_p_pick", "sampler_apply_penalty",
            "sampler_apply_logit_bias", "sampler_apply_bitmask"} <= set(kernels)
    assert all(k["schedule"]["rule"] == "SamplerCPU" for k in kernels.values())


def test_softmax_with_temperature(vm_and_vocab):
    vm, vocab = vm_and_vocab
    rng = np.random.default_rng(1)
    logits = (rng.standard_normal((5, vocab)) * 3).astype(np.float32)
    logits[1, [3, vocab // 2, vocab - 1]] = logits[1].max() + 1  # a three-way tie for the maximum
    logits[4, rng.choice(vocab, vocab // 3, replace=False)] = LOWEST  # bitmask-masked entries
    temperature = np.float32([0.7, 0.0, 1e-6, 1.3, 0.5])  # 0 and WebLLM's clamp 1e-6: greedy
    probs = vm["softmax_with_temperature"](tensor(logits[:, None, :]), tensor(temperature)).numpy()
    assert probs.shape == (5, 1, vocab) and probs.dtype == np.float32
    want = softmax_ref(logits, temperature)
    np.testing.assert_allclose(probs[:, 0, :], want, rtol=1e-4, atol=1e-7)
    assert np.array_equal(np.nonzero(probs[1, 0])[0], [3, vocab // 2, vocab - 1])
    assert np.all(probs[1, 0][probs[1, 0] > 0] == np.float32(1 / 3))
    assert probs[2, 0, logits[2].argmax()] == 1 and np.count_nonzero(probs[2, 0]) == 1
    assert np.all(probs[4, 0][logits[4] == LOWEST] == 0)


def test_argsort_probs(vm_and_vocab):
    vm, vocab = vm_and_vocab
    rng = np.random.default_rng(2)
    probs = rng.dirichlet(np.full(vocab, 0.3), size=4).astype(np.float32)
    probs[1] = 0
    probs[1, vocab // 3] = 1  # greedy: one-hot, everything else tied at 0
    ties = rng.random(vocab) < 0.25
    probs[2, ties] = np.float32(1e-4)
    probs[3] = np.round(probs[3] * 1000) / 1000  # many equal values
    sorted_probs, sorted_indices = (t.numpy() for t in vm["argsort_probs"](tensor(probs)))
    order = argsort_ref(probs)
    assert sorted_indices.dtype == np.int32 and sorted_indices.shape == (4, vocab)
    assert np.array_equal(sorted_indices, order)
    assert np.array_equal(sorted_probs, np.take_along_axis(probs, order, axis=1))
    assert np.array_equal(sorted_indices[1, :4], [vocab // 3, 0, 1, 2])


def test_sample_with_top_p_is_the_inverse_cdf(vm_and_vocab):
    vm, vocab = vm_and_vocab
    rng = np.random.default_rng(3)
    logits = rng.standard_normal((4, vocab)) * np.array([[4.0], [1.0], [8.0], [2.0]])
    probs = np.exp(logits - logits.max(axis=1, keepdims=True))
    probs = (probs / probs.sum(axis=1, keepdims=True)).astype(np.float32)
    probs[3] = 0
    probs[3, 7] = 1  # a greedy row (temperature 0)
    sorted_indices = argsort_ref(probs)
    sorted_probs = np.take_along_axis(probs, sorted_indices, axis=1)
    top_p = np.float32([0.9, 1.0, 0.5, 0.95])
    uniform = np.float32([0.05, 0.31, 0.62, 0.97, 0.5, 0.77, 0.013, 0.999])
    sample_indices = np.int32([0, 0, 1, 1, 2, 2, 3, 3])
    want, uniform = top_p_ref(sorted_probs, sorted_indices, uniform, sample_indices, top_p)
    got = vm["sample_with_top_p"](tensor(sorted_probs), tensor(sorted_indices), tensor(uniform), tensor(sample_indices),
                                  tensor(top_p)).numpy()
    assert got.dtype == np.int32 and got.shape == (8,)
    assert np.array_equal(got, want)
    assert np.all(got[6:] == 7)
    # WebLLM gives top_p = -1 to rows it does not sample from: their nucleus is the top token
    top_p[:] = -1
    got = vm["sample_with_top_p"](tensor(sorted_probs), tensor(sorted_indices), tensor(uniform), tensor(sample_indices),
                                  tensor(top_p)).numpy()
    assert np.array_equal(got, sorted_indices[sample_indices, 0])


def test_webllm_sampling_at_temperature_zero_is_argmax(vm_and_vocab):
    """WebLLM's chain (llm_chat.ts sampleTokenFromLogits): softmax at max(temperature, 1e-6),
    argsort, sample_with_top_p with a uniform sample: temperature 0 gives the argmax token."""
    vm, vocab = vm_and_vocab
    rng = np.random.default_rng(4)
    for top_p, u in ((1.0, 0.999), (0.9, 0.4), (1e-5, 0.0)):
        logits = rng.standard_normal((1, 1, vocab)).astype(np.float32)
        probs = vm["softmax_with_temperature"](tensor(logits), tensor(np.float32([1e-6])))
        probs = probs.numpy().reshape(1, vocab)
        sorted_probs, sorted_indices = vm["argsort_probs"](tensor(probs))
        token = vm["sample_with_top_p"](sorted_probs, sorted_indices, tensor(np.float32([u])), tensor(np.int32([0])),
                                        tensor(np.float32([top_p]))).numpy()
        assert token[0] == logits.argmax()


def test_apply_penalty_inplace(vm_and_vocab):
    vm, vocab = vm_and_vocab
    rng = np.random.default_rng(5)
    logits = rng.standard_normal((3, vocab)).astype(np.float32)
    seq_ids = np.int32([2, 0])  # sequence s lives in row seq_ids[s]
    pos2seq_id = np.int32([0, 0, 0, 1, 1])
    token_ids = np.int32([5, 1, vocab - 1, 5, 0])
    token_cnt = np.int32([1, 3, 2, 4, 1])
    penalties = np.float32([[0.5, 0.25, 1.2], [-0.3, 0.1, 0.8]])  # presence, frequency, repetition
    logits[2, 1] = 0.2  # turns negative after the presence / frequency penalty
    want = penalty_ref(logits, seq_ids, pos2seq_id, token_ids, token_cnt, penalties)
    buf = tensor(logits)
    vm["apply_penalty_inplace"](buf, tensor(seq_ids), tensor(pos2seq_id), tensor(token_ids), tensor(token_cnt), tensor(penalties))
    np.testing.assert_allclose(buf.numpy(), want, rtol=1e-6)
    assert np.array_equal(buf.numpy()[1], logits[1])  # a row no sequence maps to is untouched
    assert buf.numpy()[2, 1] == np.float32((np.float32(0.2) - np.float32(0.5 + 3 * 0.25)) * np.float32(1.2))


def test_apply_logit_bias_inplace(vm_and_vocab):
    vm, vocab = vm_and_vocab
    rng = np.random.default_rng(6)
    logits = rng.standard_normal((2, vocab)).astype(np.float32)
    pos2seq_id = np.int32([0, 1, 1])
    token_ids = np.int32([vocab - 1, 0, 9])
    bias = np.float32([-100.0, 2.5, 0.75])
    want = logits.copy()
    want[pos2seq_id, token_ids] += bias
    buf = tensor(logits)
    vm["apply_logit_bias_inplace"](buf, tensor(pos2seq_id), tensor(token_ids), tensor(bias))
    assert np.array_equal(buf.numpy(), want)


def test_apply_bitmask_inplace(vm_and_vocab):
    vm, vocab = vm_and_vocab
    rng = np.random.default_rng(7)
    logits = rng.standard_normal((3, vocab)).astype(np.float32)
    allowed = rng.random((3, vocab)) < 0.3
    allowed[:, -1] = True  # the last (possibly partial) word
    bitmask = pack_bitmask(allowed)
    assert bitmask.shape == (3, -(-vocab // 32))
    seq_ids = np.int32([2, 0])
    buf = tensor(logits)
    vm["apply_bitmask_inplace"](buf, tensor(seq_ids), tensor(bitmask))
    got = buf.numpy()
    assert np.array_equal(got, bitmask_ref(logits, seq_ids, bitmask))
    assert np.array_equal(got[1], logits[1])
    assert np.all(got[2][~allowed[2]] == LOWEST) and np.array_equal(got[2][allowed[2]], logits[2][allowed[2]])


def test_sort_plan_covers_the_network():
    assert sampler.sort_plan(512) == [("tiles", 0, 0)]
    plan = sampler.sort_plan(128256)
    assert sampler.padded_length(128256) == 131072 and sampler.sort_tile(128256) == 2048
    assert plan[0] == ("tiles", 0, 0) and plan[-1] == ("merge", 131072, 0)
    assert sum(kind == "global" for kind, _, _ in plan) == 21 and sum(kind == "merge" for kind, _, _ in plan) == 6


# ---- WebGPU: the shipped kernels in Dawn -----------------------------------------------------------

def _webgpu_check(config, tmp_path):
    from mlcpipe.conformance import check_artifact

    artifact = build(config, quantization("q4f32_1"), load_target("webgpu"), output=tmp_path / "webgpu", log=lambda *_: None)
    report = check_artifact(artifact, sizes=(1, 7), pattern="^sampler_")
    assert report.executed and report.ok, report.table()
    assert all(r.role == "sampler" and r.status == "pass" for r in report.results), report.table()
    return {r.kernel for r in report.results}


@pytest.mark.dawn
def test_webgpu_sampler_kernels_pass_check(tiny_config, tmp_path):
    ran = _webgpu_check(tiny_config, tmp_path)
    assert ran == {"sampler_softmax_chunk_stats", "sampler_softmax_merge", "sampler_softmax_normalize",
                   "sampler_argsort_tiles", "sampler_top_p_chunk_sums", "sampler_top_p_pick", "sampler_apply_penalty",
                   "sampler_apply_logit_bias", "sampler_apply_bitmask"}


@pytest.mark.dawn
def test_webgpu_sort_across_tiles_passes_check(tiny_config, tmp_path):
    """Vocabulary 5000: padded to 8192 = 4 tiles, so the sort's cross-tile steps and in-tile
    merges run too; a partial bitmask word and partial softmax / top-p chunks."""
    ran = _webgpu_check(dataclasses.replace(tiny_config, vocab_size=5000), tmp_path)
    assert {"sampler_argsort_global", "sampler_argsort_merge", "sampler_argsort_merge_final"} <= ran


@pytest.mark.dawn
@pytest.mark.long
def test_webgpu_sampler_kernels_at_llama3_vocab(tiny_config, tmp_path):
    _webgpu_check(dataclasses.replace(tiny_config, vocab_size=128256), tmp_path)

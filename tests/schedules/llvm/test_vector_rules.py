"""The explicit-vector CPU rules (VNNI q4 GEMV, float GEMV, AMX prefill GEMM), the injective-kernel
rule and the fast exp lowering: numerics on real computation against NumPy / the unscheduled
kernels, at several knob settings and full 1B shapes, and None where a rule does not apply."""

from __future__ import annotations

import re

import numpy as np
import pytest
import tvm
from tvm.script import tirx as T

from mlcpipe.kernel_info import random_args
from mlcpipe.targets import load_target
from mlcpipe.tuning.knobs import unscheduled_kernels
from mlcpipe.schedules.analysis import match_nt_matmul as match
from mlcpipe.schedules.llvm import fast_exp
from mlcpipe.schedules.llvm.elementwise import Elementwise
from mlcpipe.schedules.llvm.gemm_amx import PrefillGEMMAMX
from mlcpipe.schedules.llvm.gemv_float import DecodeGEMVFloat
from mlcpipe.schedules.llvm.gemv_q4_vnni import DecodeGEMVQ4VNNI
from mlcpipe.schedules.llvm.rope import RopeTable
from mlcpipe.schedules.llvm.row_norm import RowNorm
from mlcpipe.quantization import quantization

TARGET = load_target("llvm").tvm_target()
NO_VNNI = tvm.target.Target({"kind": "llvm", "mcpu": "skylake-avx512"})
NO_AMX = tvm.target.Target({"kind": "llvm", "mcpu": "cascadelake"})  # VNNI, no AMX
# The kernels run on this machine's CPU: VNNI / AMX instructions need the hardware (this project's
# machines, Sapphire Rapids, have both; elsewhere those rules decline and the f32 rules run).
HAS_VNNI = tvm.target.codegen.target_has_features("avx512vnni", TARGET)
HAS_AMX = tvm.target.codegen.target_has_features("amx-bf16", TARGET)
needs_vnni = pytest.mark.skipif(not HAS_VNNI, reason="this CPU has no AVX512-VNNI")
needs_amx = pytest.mark.skipif(not HAS_AMX, reason="this CPU has no AMX-BF16")
# The AVX2-only class (Zen 3): its int8 arithmetic (VPMADDUBSW + VPMADDWD) runs on any AVX2 host as a
# Haswell build (a znver3 build may use AMD-only SSE4A, e.g. `insertq`: an illegal instruction on Intel)
AVX2 = tvm.target.Target({"kind": "llvm", "mcpu": "haswell"})
needs_avx2 = pytest.mark.skipif(not tvm.target.codegen.target_has_features("avx2", TARGET), reason="this CPU has no AVX2")
INT8_TARGETS = [pytest.param(TARGET, marks=needs_vnni, id="host-vnni"), pytest.param(AVX2, marks=needs_avx2, id="haswell")]


def _build(func, target=TARGET):
    return tvm.compile(tvm.IRModule({"main": func.with_attr("global_symbol", "main")}), target=target)


def _outputs(func, args, target=TARGET):
    tensors = [tvm.runtime.tensor(a.copy()) for a in args]
    _build(func, target)["main"](*tensors)
    return tensors[-1].numpy().astype(np.float32)


@pytest.fixture(scope="module")
def kernels(tiny_config):
    return {q: unscheduled_kernels(tiny_config, quantization(q), TARGET) for q in ("q4f16_1", "q4f32_1", "q0f16", "q0f32")}


def _decode(kernels):
    return {n: f for n, f in kernels.items() if "NT_matmul" in n and "seq_len" not in f.script()}


def _prefill(kernels):
    return {n: f for n, f in kernels.items() if "NT_matmul" in n and "seq_len" in f.script()}


def int8_activation_gemv(args, info, planes: int = 2) -> np.ndarray:
    """What DecodeGEMVQ4VNNI computes, in NumPy: x in units of a = max|x| / 127 per weight group,
    plane 0 = round(x / a), plane 1 = round(256 * residual) clipped to +-127 (round half to even),
    exact integer dot products with (q - 7) per plane, then f32 scales."""
    params = list(info.func.params)
    x = args[params.index(info.x)].reshape(-1).astype(np.float32)
    w = args[params.index(info.weight)]
    s = args[params.index(info.scale)].astype(np.float32)
    n, k, g = info.n, info.k, info.group_size
    amax = np.abs(x.reshape(-1, g)).max(1).astype(np.float32)
    inv = np.where(amax > 0, np.float32(127) / np.maximum(amax, np.float32(1e-30)), 0).astype(np.float32)
    scaled = (x * np.repeat(inv, g)).astype(np.float32)
    high = np.rint(scaled)
    low = np.clip(np.rint((scaled - high) * np.float32(256)), -127, 127)
    q = ((w[:, :, None] >> (4 * np.arange(8, dtype=np.uint32))) & 15).reshape(n, k).astype(np.int64)
    dots = ((q - 7) * high.astype(np.int64)).reshape(n, -1, g).sum(2).astype(np.float64)
    if planes == 2:
        dots += ((q - 7) * low.astype(np.int64)).reshape(n, -1, g).sum(2) / 256.0
    return (dots * s * (amax / np.float32(127))).sum(1)


def _emulated_kernel(args, info, planes: int = 2) -> np.ndarray:
    """int8_activation_gemv through the kernel's epilogue (cast to f16, residual add in f16)."""
    y = int8_activation_gemv(args, info, planes)
    out = args[-1]
    if out.dtype == np.float16:
        y = y.astype(np.float16)
        if len(info.func.params) == 5:  # o_proj / down: + residual
            y = (y + args[-2].reshape(-1)).astype(np.float16)
    return y.astype(np.float64)


@pytest.mark.parametrize("target", INT8_TARGETS)
@pytest.mark.parametrize("knobs", [{}, {"rows": 1, "prefetch": 0, "planes": 1}, {"rows": 4, "prefetch": 16}])
def test_vnni_gemv_is_exact_int8_activation_arithmetic(knobs, target, kernels):
    taken = 0
    for name, func in _decode(kernels["q4f16_1"]).items():
        sch = DecodeGEMVQ4VNNI(**knobs).apply(func, target, False)
        assert sch is not None, name
        args = random_args(func, {}, seed=5)
        got = _outputs(sch.mod["main"], args, target)
        exact = _outputs(func, args)
        planes = knobs.get("planes", 2)
        # one int8 plane stays within ~1% of the max; two planes (~16-bit activations) within f16 rounding
        np.testing.assert_allclose(got, exact, atol=(2e-2 if planes == 1 else 3e-3) * np.abs(exact).max(), err_msg=name)
        want = _emulated_kernel(args, match(func), planes)  # the same arithmetic in NumPy: equal up to f16 rounding
        np.testing.assert_allclose(got.reshape(-1), want, rtol=2e-3, atol=2e-3 * np.abs(want).max(), err_msg=name)
        taken += 1
    assert taken >= 4


@pytest.mark.parametrize("target", INT8_TARGETS)
def test_vnni_gemv_full_size_shapes(target):
    """Llama-3.2-1B gate_up (16384x2048, cast epilogue) and down (2048x8192, cast + residual add)."""
    from mlcpipe.config import load_model_config

    taken = 0
    for name, func in _decode(unscheduled_kernels(load_model_config("llama-3.2-1b"), quantization("q4f16_1"), TARGET)).items():
        info = match(func)
        if (info.n, info.k) not in ((16384, 2048), (2048, 8192)):
            continue
        args = random_args(func, {}, seed=1)
        got = _outputs(DecodeGEMVQ4VNNI().apply(func, target, False).mod["main"], args, target)  # the CPU's defaults
        want = _emulated_kernel(args, info)
        np.testing.assert_allclose(got.reshape(-1), want, rtol=2e-3, atol=2e-3 * np.abs(want).max(), err_msg=name)
        taken += 1
    assert taken == 2


@needs_avx2
@pytest.mark.parametrize("knobs", [{}, {"grouped": 0}, {"planes": 1}, {"rows": 2, "prefetch": 0}])
def test_avx2_gemv_group_tail_full_size(knobs, kernels):
    """AVX2 with groups of 32 and K % 512 == 0 (the 1B's shapes): the f32 tail per weight group (one
    scale x activation-scale product per group, spread to the words by VPERMPS, the q - 7 offset as
    one group term); equal to the NumPy emulation of the int8 arithmetic with it (default) and
    without it (grouped=0), with one plane and other row knobs. Shapes it does not fit (the tiny
    model's K = 128) keep the per-word tail."""
    from mlcpipe.config import load_model_config

    rule = DecodeGEMVQ4VNNI(**knobs)
    grouped = knobs.get("grouped", 1) == 1
    taken = 0
    for name, func in _decode(unscheduled_kernels(load_model_config("llama-3.2-1b"), quantization("q4f16_1"), AVX2)).items():
        info = match(func)
        if (info.n, info.k) not in ((16384, 2048), (2048, 8192)):
            continue
        assert ("grouped" in rule.knob_space(func, AVX2)) and ("grouped" not in rule.knob_space(func, NO_AMX))
        func_s = rule.apply(func, AVX2, False).mod["main"]
        assert ("a_group" in func_s.script()) == grouped, name
        if grouped:
            asm = _build(func_s, AVX2).mod.inspect_source("s")
            assert len(re.findall(r"\bvpermps\s", asm)) >= 8 and "vcvtph2ps" in asm, name  # 8 per 64 words, 2 conversions of 16 scales
        args = random_args(func, {}, seed=4)
        want = _emulated_kernel(args, info, knobs.get("planes", 2))
        np.testing.assert_allclose(_outputs(func_s, args, AVX2).reshape(-1), want, rtol=2e-3, atol=2e-3 * np.abs(want).max(), err_msg=name)
        taken += 1
    assert taken == 2
    tiny = next(iter(_decode(kernels["q4f16_1"]).values()))
    assert "a_group" not in rule.apply(tiny, AVX2, False).mod["main"].script() and "grouped" not in rule.knob_space(tiny, AVX2)


def test_gemv_defaults_follow_the_cpu_and_the_activation_size():
    """Unset `rows`: 2 interleaved rows on an AMX CPU (tuned there), 1 sequential stream elsewhere.
    Prefetched weights go to L1 while the activation a row re-reads fits beside them (gate_up,
    K = 2048), to L2 when it does not (down, K = 8192): checked in each build's assembly."""
    from mlcpipe.config import load_model_config
    from mlcpipe.schedules.llvm.microkernels import gemv_default_rows

    spr = tvm.target.Target({"kind": "llvm", "mcpu": "sapphirerapids"})
    zen4 = tvm.target.Target({"kind": "llvm", "mcpu": "znver4"})
    assert (gemv_default_rows(spr), gemv_default_rows(zen4), gemv_default_rows(NO_AMX)) == (2, 1, 1)
    decode = _decode(unscheduled_kernels(load_model_config("llama-3.2-1b"), quantization("q4f16_1"), zen4))
    by_k = {match(f).k: f for f in decode.values() if match(f).n in (16384, 2048)}
    for target, rows in ((zen4, 1), (spr, 2)):
        for k, hint in ((2048, "prefetcht0"), (8192, "prefetcht1")):
            sch = DecodeGEMVQ4VNNI().apply(by_k[k], target, False)
            text = sch.mod["main"].script()
            assert ("task * 2 + r" in text) == (rows == 2), (str(target), k)
            asm = tvm.compile(tvm.IRModule({"main": sch.mod["main"].with_attr("global_symbol", "main")}), target=target).mod.inspect_source("s")
            other = {"prefetcht0": "prefetcht1", "prefetcht1": "prefetcht0"}[hint]
            assert hint in asm and other not in asm, (str(target), k)


@pytest.mark.parametrize("quant", ["q0f16", "q0f32"])
@pytest.mark.parametrize("knobs", [{}, {"rows": 1, "prefetch": 0}, {"rows": 4, "prefetch": 4}])
def test_float_gemv_keeps_numerics(quant, knobs, kernels):
    taken = 0
    for name, func in _decode(kernels[quant]).items():
        sch = DecodeGEMVFloat(**knobs).apply(func, TARGET, False)
        assert sch is not None, name
        args = random_args(func, {}, seed=3)
        want = _outputs(func, args)
        tol = 2e-3 if quant == "q0f16" else 1e-5  # same f32 products and sums, other order
        np.testing.assert_allclose(_outputs(sch.mod["main"], args), want, rtol=tol, atol=tol * np.abs(want).max(), err_msg=name)
        taken += 1
    assert taken >= 4


@needs_amx
@pytest.mark.parametrize("quant", ["q4f16_1", "q0f16"])
# K in one chunk / several (accumulators kept between chunks); tasks one by one / in groups of 2
# (the next task's weights decoded while the current one's tiles compute); the defaults: q4 one
# by one, unquantized in groups
@pytest.mark.parametrize("k_chunk, group", [(2048, 0), (128, 2), (128, 1)])
def test_amx_prefill_gemm_keeps_numerics(quant, k_chunk, group, kernels):
    taken = chunks = 0
    for name, func in _prefill(kernels[quant]).items():
        sch = PrefillGEMMAMX(k_chunk=k_chunk, group=group, low_batch=0).apply(func, TARGET, False)  # AMX at any token count
        assert sch is not None, name
        chunks += match(func).k // min(k_chunk, match(func).k)
        for tokens in (1, 7, 40):  # a partial 32-token block, two blocks
            args = random_args(func, {"seq_len": tokens}, seed=3)
            want = _outputs(func, args)
            got = _outputs(sch.mod["main"], args)
            # bf16 operands (8-bit mantissa), f32 accumulation
            np.testing.assert_allclose(got, want, atol=1e-2 * np.abs(want).max(), err_msg=f"{name} {tokens}")
            assert np.abs(got - want).max() > 0 or tokens == 1  # it really ran in bf16, not a copy of the reference
        taken += 1
    # qkv, o_proj, gate_up, down and batch_verify's lm_head; the tiny down_proj (K 256) runs in two chunks
    assert taken == 5 and (chunks > 5 or k_chunk == 2048)


@needs_amx
@needs_vnni
@pytest.mark.parametrize("quant, low_batch", [("q4f16_1", 4), ("q4f16_1", 8), ("q0f16", 4)])
def test_amx_rule_few_token_branch_is_the_gemv_arithmetic_per_token(quant, low_batch, kernels):
    """Up to `low_batch` tokens, the prefill kernel takes its GEMV branch (one pass of exactly 1-4
    tokens, or passes of 4 with a partial last one): for q4 each token's row equals the NumPy
    emulation of the VNNI arithmetic, unquantized rows the f32 kernel; more tokens take the AMX
    tiles (bf16 operands)."""
    taken = 0
    for name, func in _prefill(kernels[quant]).items():
        info = match(func)
        sch = PrefillGEMMAMX(low_batch=low_batch).apply(func, TARGET, False)
        lib_func = sch.mod["main"]
        params = list(func.params)
        for tokens in (1, 2, 3, 4, 5, 7, 9):
            args = random_args(func, {"seq_len": tokens}, seed=tokens)
            got = _outputs(lib_func, args).reshape(tokens, -1)
            exact = _outputs(func, args).reshape(tokens, -1)
            if tokens > low_batch:  # AMX: bf16 operands
                np.testing.assert_allclose(got, exact, atol=1e-2 * np.abs(exact).max(), err_msg=f"{name} {tokens}")
                continue
            if not info.quantized:  # f32 products and sums, as the kernel's own (other order)
                np.testing.assert_allclose(got, exact, rtol=2e-3, atol=2e-3 * np.abs(exact).max(), err_msg=f"{name} {tokens}")
                continue
            for t in range(tokens):
                row = list(args)
                row[params.index(info.x)] = args[params.index(info.x)][:, t : t + 1]
                if len(params) == 5:  # the residual input of o_proj / down
                    row[-2] = args[-2][:, t : t + 1]
                want = _emulated_kernel(row, info)
                np.testing.assert_allclose(got[t], want, rtol=2e-3, atol=2e-3 * np.abs(want).max(), err_msg=f"{name} {tokens} {t}")
        taken += 1
    assert taken == 5  # with batch_verify's lm_head


@needs_amx
def test_amx_prefill_full_size_down_proj():
    from mlcpipe.config import load_model_config

    funcs = _prefill(unscheduled_kernels(load_model_config("llama-3.2-1b"), quantization("q4f16_1"), TARGET))
    name, func = next((n, f) for n, f in funcs.items() if (match(f).n, match(f).k) == (2048, 8192))
    args = random_args(func, {"seq_len": 33}, seed=2)
    want = _outputs(func, args)
    np.testing.assert_allclose(_outputs(PrefillGEMMAMX().apply(func, TARGET, False).mod["main"], args), want,
                               atol=1e-2 * np.abs(want).max(), err_msg=name)


@needs_amx
def schedule_func_rule(func, target) -> str:
    from mlcpipe.schedules import schedule_func

    return schedule_func(func, target)[1]["rule"]


def test_vector_rules_decline_what_they_do_not_handle(kernels):
    q4_decode = next(iter(_decode(kernels["q4f16_1"]).values()))
    q4_prefill = next(iter(_prefill(kernels["q4f16_1"]).values()))
    q0_decode = next(iter(_decode(kernels["q0f16"]).values()))
    f32_prefill = next(iter(_prefill(kernels["q4f32_1"]).values()))
    f32_decode = next(iter(_decode(kernels["q4f32_1"]).values()))
    norm = next(f for n, f in kernels["q4f16_1"].items() if n.startswith("rms_norm"))
    # CPU features: AVX-512 without VNNI -> the float q4 rule; no AMX -> the VNNI int8 GEMM, neither -> the f32 GEMM;
    # AVX2 only (no AVX-512) -> both int8 rules on VPMADDUBSW
    assert schedule_func_rule(q4_decode, AVX2) == "DecodeGEMVQ4VNNI" and schedule_func_rule(q4_prefill, AVX2) == "PrefillGEMMQ4VNNI"
    assert DecodeGEMVQ4VNNI().apply(q4_decode, NO_VNNI, False) is None
    assert PrefillGEMMAMX().apply(q4_prefill, NO_AMX, False) is None
    from mlcpipe.schedules import schedule_func

    assert schedule_func(q4_decode, NO_VNNI)[1]["rule"] == "DecodeGEMVQ4F32"  # f32 arithmetic
    assert schedule_func(q4_prefill, NO_AMX)[1]["rule"] == "PrefillGEMMQ4VNNI"  # VNNI int8 GEMM
    assert schedule_func(q4_prefill, NO_VNNI)[1]["rule"] == "PrefillGEMMF32"  # f32 register tiles (AVX-512, no VNNI)
    # shapes and kinds that are not theirs
    assert DecodeGEMVQ4VNNI().apply(q4_prefill, TARGET, False) is None
    assert DecodeGEMVQ4VNNI().apply(q0_decode, TARGET, False) is None
    assert DecodeGEMVFloat().apply(q4_decode, TARGET, False) is None
    assert PrefillGEMMAMX().apply(q4_decode, TARGET, False) is None
    assert PrefillGEMMAMX().apply(f32_prefill, TARGET, False) is None  # f32 activations keep f32 math
    assert DecodeGEMVQ4VNNI().apply(f32_decode, TARGET, False) is None
    assert DecodeGEMVQ4VNNI(rows=3).apply(q4_decode, TARGET, False) is None  # rows must divide N
    webgpu = load_target("webgpu").tvm_target()
    for rule in (DecodeGEMVQ4VNNI(), DecodeGEMVFloat(), PrefillGEMMAMX(), Elementwise()):
        assert rule.apply(norm, TARGET, False) is None
        assert rule.apply(q4_decode, webgpu, False) is None
    assert Elementwise().apply(q4_decode, TARGET, False) is None  # a reduction


def test_elementwise_rule_keeps_numerics(kernels):
    taken = []
    for quant in ("q0f16", "q4f16_1"):
        for name, func in kernels[quant].items():
            sch = Elementwise().apply(func, TARGET, False)
            if sch is None or name.startswith(("tir_kv_cache", "fused_rope", "sampler_")):
                continue  # paged-cache kernels and rope: checked below / through the model tests; the
                # sampler's: SamplerCPU claims them first (tests/model/test_sampler.py)
            # batch functions' kernels (batch_prefill's logit gather: batch_size sequences)
            args = random_args(func, {"seq_len": 37, "batch_size": 3, "num_samples": 3}, seed=3)
            np.testing.assert_array_equal(_outputs(sch.mod["main"], args), _outputs(func, args), err_msg=name)
            taken.append(name)
    assert any("silu" in n for n in taken) and any(n.startswith("take") for n in taken)


@pytest.mark.parametrize("quant", ["q0f16", "q4f32_1"])
def test_row_norm_rule_keeps_numerics(quant, kernels):
    norms = {n: f for n, f in kernels[quant].items() if n.startswith("rms_norm")}
    assert len(norms) == 2  # decode (one row) and prefill (seq_len rows)
    for name, func in norms.items():
        sch = RowNorm().apply(func, TARGET, False)
        assert sch is not None, name
        args = random_args(func, {"seq_len": 37}, seed=4)
        want = _outputs(func, args)
        tol = 2e-3 if quant == "q0f16" else 1e-5
        np.testing.assert_allclose(_outputs(sch.mod["main"], args), want, rtol=tol, atol=tol * np.abs(want).max(), err_msg=name)
    matmul = next(iter(_decode(kernels[quant]).values()))
    assert RowNorm().apply(matmul, TARGET, False) is None  # a reduction with two inputs: the GEMV rules' business
    assert RowNorm().apply(next(f for n, f in kernels[quant].items() if "silu" in n), TARGET, False) is None


def _run_rope(func, qkv, positions, bound_checks=False):
    heads = [int(p.shape[1]) for p in func.params[2:5]]
    tensors = [tvm.runtime.tensor(qkv), tvm.runtime.tensor(positions)]
    tensors += [tvm.runtime.tensor(np.zeros((len(positions), h, qkv.shape[-1]), qkv.dtype)) for h in heads]
    with tvm.transform.PassContext(config={"tirx.instrument_bound_checkers": bound_checks}):
        _build(func)["main"](*tensors, 1)
    return [t.numpy() for t in tensors[2:]]


LLAMA3_SCALING = {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                  "original_max_position_embeddings": 8192}


@pytest.mark.parametrize("scaling, rotary_dim", [({}, None), (LLAMA3_SCALING, None), ({"rope_type": "gptj"}, None), ({}, 32)])
def test_rope_table_rule_is_bit_exact(scaling, rotary_dim):
    """TVM's own rope kernel for several RoPE variants: the table version gives the same bits at
    1, 9 and 128 tokens and reads nothing outside its buffers (TVM's bound checker compiled in)."""
    from tvm.relax.frontend.nn.llm.position_embedding import llama_rope_with_position_map

    func = llama_rope_with_position_map(500000.0, 1.0, 64, 8, 2, "float16", scaling, rotary_dim)
    sch = RopeTable().apply(func, TARGET, False)
    assert sch is not None
    sch.get_sblock("cos_table0"), sch.get_sblock("sin_table1")  # q and k heads share one cos and one sin table
    with pytest.raises(tvm.s_tir.ScheduleError, match="get-block"):  # and there is no third one
        sch.get_sblock("cos_table2")
    rng = np.random.default_rng(5)
    for tokens in (1, 9, 128):
        qkv = rng.standard_normal((tokens, 12, 64)).astype("float16")
        positions = rng.permutation(4000)[:tokens].astype("int32")
        want = _run_rope(func, qkv, positions)
        got = _run_rope(sch.mod["main"], qkv, positions, bound_checks=True)
        for g, w in zip(got, want, strict=True):
            np.testing.assert_array_equal(g, w)
        assert not np.array_equal(want[0], qkv[:, :8])  # the rotation really happened


def test_rope_rules_on_the_model_kernel(kernels):
    func = kernels["q4f16_1"]["fused_rope"]
    from mlcpipe.schedules import schedule_func

    assert schedule_func(func, TARGET)[1]["rule"] == "RopeTable"
    tokens = 37
    qkv_shape = [int(d) if isinstance(d, tvm.tirx.IntImm) else tokens for d in func.params[0].shape]
    qkv = np.random.default_rng(0).standard_normal(qkv_shape).astype("float16")
    positions = np.arange(100, 100 + tokens, dtype="int32")
    want = _run_rope(func, qkv, positions)
    for rule in (RopeTable(), RopeTable(lanes=8, min_parallel=1000), Elementwise()):
        for got, w in zip(_run_rope(rule.apply(func, TARGET, False).mod["main"], qkv, positions), want, strict=True):
            np.testing.assert_array_equal(got, w, err_msg=str(rule))
    assert np.abs(want[0]).max() > 0
    # not a rope: nothing to hoist
    assert RopeTable().apply(next(f for n, f in kernels["q4f16_1"].items() if "silu" in n), TARGET, False) is None
    assert RopeTable().apply(func, load_target("webgpu").tvm_target(), False) is None


def test_fast_exp_accuracy_and_special_values():
    fast_exp.install()
    n = 1 << 16

    @T.prim_func(private=True)
    def exp_kernel(a: T.Buffer((n,), "float32"), b: T.Buffer((n,), "float32")):
        for i in T.parallel(n // 16):
            for j in T.vectorized(16):
                b[i * 16 + j] = T.exp(a[i * 16 + j])

    x = np.concatenate([np.linspace(-90, 89, n - 5), [np.nan, np.inf, -np.inf, 0.0, 88.72]]).astype(np.float32)
    out = tvm.runtime.tensor(np.zeros(n, np.float32))
    lib = _build(exp_kernel)
    lib["main"](tvm.runtime.tensor(x), out)
    got = out.numpy().astype(np.float64)
    with np.errstate(over="ignore"):
        want = np.exp(x.astype(np.float64)).astype(np.float32).astype(np.float64)
    normal = np.isfinite(want) & (x >= -87.3)  # documented range; below it the result flushes to 0
    rel = np.abs(got[normal] - want[normal]) / want[normal]
    worst = np.argmax(rel)
    assert rel.max() < 3e-7, (rel.max(), x[normal][worst], got[normal][worst], want[normal][worst])  # ~2 ulp
    assert np.isnan(got[-5]) and got[-4] == np.inf and got[-3] == 0.0 and got[-2] == 1.0 and np.isfinite(got[-1])
    assert np.all(got[x < -87.4] < 1.2e-38)  # denormal range flushes to 0
    ll = lib.mod.inspect_source("ll")
    assert "llvm.exp" not in ll and "expf" not in ll  # really the polynomial, not libm calls (TVM's default: llvm.exp)

"""CPU schedule rules (schedules/llvm/): numerics against the unscheduled kernel at several knob
settings and token counts, full-size 1B shapes included, and None on what a rule does not take."""

from __future__ import annotations

import dataclasses
import re

import numpy as np
import pytest
import tvm

from mlcpipe.kernel_info import random_args
from mlcpipe.quantization import QUANTIZATIONS
from mlcpipe.targets import load_target
from mlcpipe.tuning.knobs import unscheduled_kernels
from mlcpipe.schedules import RULES, schedule_func
from mlcpipe.schedules.analysis import match_nt_matmul as match
from mlcpipe.schedules.llvm.gemm_dequant import PrefillGEMM
from mlcpipe.schedules.llvm.gemv_q4 import DecodeGEMVQ4
from mlcpipe.schedules.llvm.matmul_nt import MatmulNT
from mlcpipe.quantization import quantization

TARGET = load_target("llvm").tvm_target()


def _run(func: tvm.tirx.PrimFunc, args: list[np.ndarray]) -> np.ndarray:
    lib = tvm.compile(tvm.IRModule({"main": func.with_attr("global_symbol", "main")}), target=TARGET)
    tensors = [tvm.runtime.tensor(a, tvm.cpu()) for a in args]
    lib["main"](*tensors)
    return tensors[-1].numpy().astype(np.float32)


def _check(func, sch, sizes, quant, name):
    args = random_args(func, sizes, seed=3)
    want = _run(func, [a.copy() for a in args])
    got = _run(sch.mod["main"], [a.copy() for a in args])
    tol = QUANTIZATIONS[quant].tolerance
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol * np.abs(want).max(), err_msg=f"{name} {sizes}")
    return float(np.abs(got - want).max() / np.abs(want).max())


@pytest.fixture(scope="module")
def tiny_kernels(tiny_config):
    return {q: unscheduled_kernels(tiny_config, quantization(q), TARGET) for q in ("q4f16_1", "q4f32_1", "q0f16", "q0f32")}


def _matmuls(kernels):
    return {n: f for n, f in kernels.items() if "NT_matmul" in n}


@pytest.mark.parametrize("quant", ["q4f16_1", "q4f32_1"])
@pytest.mark.parametrize("knobs", [{}, {"lanes": 8, "rows": 2}, {"lanes": 16, "rows": 1}, {"rows": 8}])
def test_decode_gemv_q4_keeps_numerics(quant, knobs, tiny_kernels):
    taken = 0
    for name, func in _matmuls(tiny_kernels[quant]).items():
        rule = dataclasses.replace(DecodeGEMVQ4(), **knobs)
        sch = rule.apply(func, TARGET, False)
        if "seq_len" in func.script():  # prefill kernels are not this rule's
            assert sch is None, name
            continue
        assert sch is not None, f"{name}: rule declined a decode GEMV"
        _check(func, sch, {}, quant, name)
        taken += 1
    assert taken >= 4  # qkv, o_proj(+add), gate_up, down(+add), lm_head (tiny q4f32_1: gate_up and lm_head are one kernel)


@pytest.mark.parametrize("quant", ["q4f16_1", "q4f32_1", "q0f16", "q0f32"])
@pytest.mark.parametrize("knobs", [{}, {"tile_n": 16, "block_m": 6, "block_n": 2}, {"lanes": 32, "block_m": 2}])
def test_prefill_gemm_keeps_numerics(quant, knobs, tiny_kernels):
    taken = 0
    for name, func in _matmuls(tiny_kernels[quant]).items():
        sch = dataclasses.replace(PrefillGEMM(), **knobs).apply(func, TARGET, False)
        if "seq_len" not in func.script():
            assert sch is None, f"{name}: decode kernels belong to the GEMV rules"
            continue
        assert sch is not None, name
        for tokens in (1, 7):  # a tail of every block_m, a single token through the prefill path
            _check(func, sch, {"seq_len": tokens}, quant, name)
        taken += 1
    # qkv, o_proj, gate_up, down, and batch_verify's lm_head (logits of every draft token; prefill
    # computes lm_head on one token, a GEMV). At the tiny shapes an f32 lm_head is gate_up's kernel
    # (512x128, f32 out); an f16 model's gate_up casts to f16, so its lm_head is a kernel of its own.
    assert taken == (5 if quant.endswith(("f16", "f16_1")) else 4)


def test_full_size_kernels_keep_numerics():
    """Llama-3.2-1B shapes (gate_up 16384x2048 decode, down 2048x8192 prefill), built the way the
    model builds them."""
    from mlcpipe.config import load_model_config

    config = load_model_config("llama-3.2-1b")
    kernels = unscheduled_kernels(config, quantization("q4f16_1"), TARGET)
    by_shape = {}
    for name, func in _matmuls(kernels).items():
        info = match(func)
        by_shape[(info.n, info.k, "seq_len" in func.script())] = (name, func)
    name, func = by_shape[(16384, 2048, False)]
    for rule in (DecodeGEMVQ4(), DecodeGEMVQ4(lanes=32, rows=8)):
        _check(func, rule.apply(func, TARGET, False), {}, "q4f16_1", name)
    name, func = by_shape[(2048, 8192, True)]
    _check(func, PrefillGEMM().apply(func, TARGET, False), {"seq_len": 9}, "q4f16_1", name)
    name, func = by_shape[(2048, 8192, False)]  # down decode: 4 interleaved rows by default off AMX CPUs
    _check(func, DecodeGEMVQ4().apply(func, TARGET, False), {}, "q4f16_1", name)


def test_decode_gemv_q4_default_rows_follow_the_activation_size():
    """Unset `rows`: 1 row per task without AMX (gate_up, K = 2048: 9 KiB of activation planes per
    row), 4 interleaved rows when a row's planes outgrow half of L1 (down, K = 8192: 36 KiB), and
    2 everywhere on an AMX CPU (tuned there). Read from the parallel loop's extent."""
    from mlcpipe.config import load_model_config

    zen4 = tvm.target.Target({"kind": "llvm", "mcpu": "znver4"})
    spr = tvm.target.Target({"kind": "llvm", "mcpu": "sapphirerapids"})
    kernels = unscheduled_kernels(load_model_config("llama-3.2-1b"), quantization("q4f32_1"), zen4)
    decode = {(match(f).n, match(f).k): f for n, f in _matmuls(kernels).items() if "seq_len" not in f.script()}
    for (n, k), target, rows in (((16384, 2048), zen4, 1), ((2048, 8192), zen4, 4), ((16384, 2048), spr, 2), ((2048, 8192), spr, 2)):
        text = DecodeGEMVQ4().apply(decode[(n, k)], target, False).mod["main"].script()
        assert f"T.parallel({n // rows})" in text, (n, k, str(target))


def test_rules_decline_what_they_do_not_handle(tiny_kernels):
    kernels = tiny_kernels["q4f16_1"]
    norms = [f for n, f in kernels.items() if n.startswith("rms_norm")]
    assert norms
    for rule in (DecodeGEMVQ4(), PrefillGEMM()):
        for func in norms:
            assert rule.apply(func, TARGET, False) is None
            assert rule.knob_space(func, TARGET) == {}
    decode = next(f for n, f in _matmuls(kernels).items() if "seq_len" not in f.script())
    prefill = next(f for n, f in _matmuls(kernels).items() if "seq_len" in f.script())
    # knobs that do not divide the shape: declined, not miscompiled
    assert DecodeGEMVQ4(lanes=64).apply(decode, TARGET, False) is None  # K=128: 16 words
    assert PrefillGEMM(tile_n=48).apply(prefill, TARGET, False) is None
    # other targets are not the CPU rules' business
    webgpu = load_target("webgpu").tvm_target()
    assert DecodeGEMVQ4().apply(decode, webgpu, False) is None
    assert PrefillGEMM().apply(prefill, webgpu, False) is None
    # unquantized decode GEMVs go to the float GEMV rule
    q0_decode = next(f for n, f in _matmuls(tiny_kernels["q0f16"]).items() if "seq_len" not in f.script())
    assert DecodeGEMVQ4().apply(q0_decode, TARGET, False) is None
    scheduled, record = schedule_func(q0_decode, TARGET)
    assert record["rule"] == "DecodeGEMVFloat" and record["source"] == "default"


def test_registry_order_and_knob_spaces(tiny_kernels):
    assert [type(r).__name__ for r in RULES["llvm"]] == [
        "SamplerCPU", "DecodeGEMVQ4VNNI", "DecodeGEMVQ4F32", "DecodeGEMVQ4", "DecodeGEMVFloat", "PrefillGEMMAMX", "PrefillGEMMQ4I8MM", "PrefillGEMMQ4VNNI", "PrefillGEMMBF16", "PrefillGEMMF32", "PrefillGEMM", "MatmulNT", "RowNorm", "RopeTable", "Elementwise"]
    has = tvm.target.codegen.target_has_features
    f32 = "PrefillGEMMF32" if has("avx512f", TARGET) or (has("avx2", TARGET) and has("fma", TARGET)) else "PrefillGEMM"  # f32 register tiles, else portable
    amx = "PrefillGEMMAMX" if has("amx-bf16", TARGET) else f32
    q4_gemv = "DecodeGEMVQ4F32"  # f32 arithmetic, prefetched rows, on every CPU
    int8 = has("avx512vnni", TARGET) or has("avxvnni", TARGET) or (has("avx2", TARGET) and not has("avx512f", TARGET))
    vnni = "DecodeGEMVQ4VNNI" if int8 else q4_gemv
    # q4 prefill of f16 models: AMX where the CPU has it, else int8 dot products (VNNI, AVX2's VPMADDUBSW), else f32
    bf16 = "PrefillGEMMBF16" if has("avx512bf16", TARGET) else f32
    q4_prefill = amx if amx != f32 else ("PrefillGEMMQ4VNNI" if int8 else bf16)
    q0_prefill = amx if amx != f32 else bf16  # f16 models: AMX, else AVX512-BF16, else f32
    expected_rules = {  # f32-activation models keep f32 math
        "q4f16_1": (q4_prefill, vnni), "q4f32_1": (f32, q4_gemv),
        "q0f16": (q0_prefill, "DecodeGEMVFloat"), "q0f32": (f32, "DecodeGEMVFloat"),
    }
    for quant, (prefill_rule, decode_rule) in expected_rules.items():
        for name, func in _matmuls(tiny_kernels[quant]).items():
            _, record = schedule_func(func, TARGET)
            expected = prefill_rule if "seq_len" in func.script() else decode_rule
            assert record["rule"] == expected, f"{quant} {name}"
    for name, func in _matmuls(tiny_kernels["q4f16_1"]).items():
        _, record = schedule_func(func, TARGET)
        expected = record["rule"]
        space = RULES["llvm"][[type(r).__name__ for r in RULES["llvm"]].index(expected)].knob_space(func, TARGET)
        assert all(values for values in space.values())
        assert space
        for knob, default in record["knobs"].items():
            if knob in space:  # knobs `tune` does not search (e.g. VNNI GEMV `planes`, a precision choice) are absent
                assert default is None or default in space[knob], f"{name}: default {knob}={default} not among its candidates"
    assert isinstance(MatmulNT().apply(next(iter(_matmuls(tiny_kernels["q0f16"]).values())), TARGET, False), tvm.s_tir.Schedule)


def _same_attention(theirs, ours, tokens: int) -> None:
    """Run TVM's attention kernel and ours on the same valid paged/ragged inputs; compare the
    output (arg 7, model dtype) and the log2-sum-exp (arg 8)."""
    from mlcpipe.kernel_info import kernel_args

    args, label = kernel_args(theirs, tokens, seed=tokens)
    outs = []
    for func in (theirs, ours):
        lib = tvm.compile(tvm.IRModule({"main": func.with_attr("global_symbol", "main")}), target=TARGET)
        tensors = [tvm.runtime.tensor(a.copy(), tvm.cpu()) if isinstance(a, np.ndarray) else a for a in args]
        lib["main"](*tensors)
        outs.append([tensors[7].numpy().astype(np.float32), tensors[8].numpy()])
    np.testing.assert_allclose(outs[1][0], outs[0][0], atol=2e-3, err_msg=label)
    np.testing.assert_allclose(outs[1][1], outs[0][1], rtol=1e-5, atol=1e-5, err_msg=label)


def test_decode_attention_replacement_matches_tvms_kernel():
    """Our CPU decode attention against TVM's at Llama-3.2-1B shapes (32 query heads, 8 KV heads,
    head_dim 64, pages of 16), with a shuffled page table and 309 tokens of context."""
    from tvm.relax.frontend.nn.llm import kv_cache as kc

    from mlcpipe.schedules.llvm.attention import KERNEL_NAME, decode_attention, replace_attention_kernels

    theirs = kc._attention_decode_cpu(8, 32, 64, "float16", False, {})
    ours = decode_attention(8, 32, 64, 16, "float16")
    for tokens in (1, 300):
        _same_attention(theirs, ours, tokens)
    # the next block's K / V rows (the next page) are prefetched while this block computes
    asm = tvm.compile(tvm.IRModule({"main": ours.with_attr("global_symbol", "main")}), target=TARGET).mod.inspect_source("s")
    assert len(re.findall(r"prefetcht0\s", asm)) >= 2 * 16 * 2  # K and V, 16 rows, 2 lines of 64 B per row
    mod = tvm.IRModule({"tir_attention_decode_cpu": theirs.with_attr("global_symbol", KERNEL_NAME)})
    mod, replaced = replace_attention_kernels(mod)
    assert replaced == ["tir_attention_decode_cpu"]
    odd = kc._attention_decode_cpu(2, 4, 24, "float16", False, {})  # head_dim 24: not a multiple of 16
    _, replaced = replace_attention_kernels(tvm.IRModule({"k": odd.with_attr("global_symbol", KERNEL_NAME)}))
    assert replaced == []


@pytest.mark.parametrize("heads", [(8, 32, 64), (1, 4, 256)], ids=["llama-3.2-1b", "gemma-3-1b"])
@pytest.mark.parametrize("sliding", [False, True], ids=["causal", "sliding-window"])
def test_prefill_paged_attention_replacement_matches_the_passes_kernel(heads, sliding):
    """A chunk's queries over their paged history (a prompt longer than the prefill chunk), ours
    against the passes' kernel (pipeline/passes/kv_cache_fixes.py), at the 1B's and Gemma 3 1B's
    heads, causal and with a window narrower than the history (rows that see nothing included),
    attention-sink rows too; then the schedule swaps it in only where the passes made it."""
    from mlcpipe.kernel_info import kernel_args
    from mlcpipe.passes.kv_cache_fixes import prefill_paged_cpu, replacement
    from mlcpipe.schedules.llvm.attention import prefill_paged_attention, replace_attention_kernels

    kv_heads, qo_heads, head_dim = heads
    for window in ((24, 300) if sliding else (1024,)):
        theirs = prefill_paged_cpu(kv_heads, qo_heads, head_dim, "float16", 16, sliding, window)
        ours = prefill_paged_attention(kv_heads, qo_heads, head_dim, 16, "float16", sliding, window)
        for tokens, sink in ((1, 0), (7, 0), (130, 0), *(((130, 3),) if sliding else ())):
            args, label = kernel_args(theirs, tokens, seed=tokens)
            if sink:  # length_info (3, batch): last page length, window offset, sink rows
                args[5][2, :] = sink
            outs = []
            for func in (theirs, ours):
                lib = tvm.compile(tvm.IRModule({"main": func.with_attr("global_symbol", "main")}), target=TARGET)
                tensors = [tvm.runtime.tensor(a.copy(), tvm.cpu()) if isinstance(a, np.ndarray) else a for a in args]
                lib["main"](*tensors)
                outs.append([tensors[8].numpy().astype(np.float32), tensors[9].numpy()])
            label = f"{label},window={window},sink={sink}"
            assert np.isfinite(outs[1][0]).all(), label
            np.testing.assert_allclose(outs[1][0], outs[0][0], atol=2e-3, err_msg=label)
            np.testing.assert_allclose(outs[1][1], outs[0][1], rtol=1e-5, atol=1e-5, err_msg=label)
            if sliding and window == 24 and tokens == 130:  # the last rows of the chunk see no history
                assert (outs[0][1][-1] == -50000).all() and (outs[1][0][-1] == 0).all(), label
    from tvm.relax.frontend.nn.llm import kv_cache as kc

    name = "batch_prefill_paged_kv_cpu" + ("_sliding_window" if sliding else "")
    tvms = kc._attention_prefill_cpu(kv_heads, qo_heads, head_dim, "float16", sliding, {}).with_attr("global_symbol", name)
    mod, replaced = replace_attention_kernels(tvm.IRModule({"paged": replacement(tvms, window)}))
    assert replaced == ["paged"]
    tvm.ir.assert_structural_equal(mod["paged"], ours.with_attr("global_symbol", name))  # the window it recorded
    assert replace_attention_kernels(tvm.IRModule({"paged": tvms}))[1] == []  # TVM's own (no window recorded): not ours


def test_prefill_ragged_attention_replacement_matches_tvms_kernel():
    """Causal attention of a prompt chunk over itself, 1B shapes, against TVM's CPU kernel."""
    from tvm.relax.frontend.nn.llm import kv_cache as kc

    from mlcpipe.schedules.llvm.attention import RAGGED_KERNEL_NAME, prefill_ragged_attention, replace_attention_kernels

    theirs = kc._attention_prefill_ragged_cpu(8, 32, 64, 64, "float16", {})
    ours = prefill_ragged_attention(8, 32, 64, "float16")
    for tokens in (1, 7, 40):
        _same_attention(theirs, ours, tokens)
    # contiguous ragged rows: no software prefetch (the paged decode kernel's is for the next page)
    asm = tvm.compile(tvm.IRModule({"main": ours.with_attr("global_symbol", "main")}), target=TARGET).mod.inspect_source("s")
    assert "prefetcht0" not in asm
    mod, replaced = replace_attention_kernels(tvm.IRModule({"ragged": theirs.with_attr("global_symbol", RAGGED_KERNEL_NAME)}))
    assert replaced == ["ragged"]

"""WebGPU subgroups for the decode GEMV (GEMVDequant): the opt-in target attribute, the WGSL
TVM generates with it, the kernels run on lavapipe through wgpu against NumPy and the
unscheduled kernels on llvm, the shared-memory fallback, and the runner's refusals.

Kernels run where wgpu finds a WebGPU adapter (Mesa lavapipe); the subgroup ones where it has
the subgroups feature (lavapipe: 8 lanes). Compile-only checks run everywhere.
"""

from __future__ import annotations

import dataclasses
import re

import numpy as np
import pytest
import tvm
from tvm.script import tirx as T

from mlcpipe.errors import ConfigError
from mlcpipe.kernel_info import random_args
from mlcpipe.runners.webgpu import lavapipe as runner
from mlcpipe.targets import load_target
from mlcpipe.schedules.gpu.gemv_dequant import GEMVDequant

from tests.helpers.gpu_kernels import copy_func, decode_gemvs, fused_kernels, run_llvm


def _adapter() -> tuple[str | None, tuple[int, int] | None]:
    """(why no kernel can run here or None, the device's subgroup sizes or None)."""
    try:
        runner.get_device()
    except RuntimeError as exc:  # no wgpu, or no adapter (mesa-vulkan-drivers missing)
        return str(exc), None
    return None, runner.subgroup_sizes()


MISSING, SIZES = _adapter()
needs_adapter = pytest.mark.lavapipe(skip_if_missing=True)
needs_subgroups = pytest.mark.skipif(
    SIZES is None,
    reason=f"the WebGPU adapter has no subgroups feature ({MISSING or 'wgpu'})",
)
# the rule's lanes for this adapter: its narrowest subgroup (TVM's lowering allows 32 at most)
LANES = min(SIZES[0], 32) if SIZES else 8


def webgpu(subgroups: bool) -> tvm.target.Target:
    overrides = {"supports_subgroups": True} if subgroups else None
    return load_target("webgpu", overrides).tvm_target()


# ---- kernels: realistic shapes, small enough for lavapipe ---------------------------------------


def q4f16_gemv(n: int, k: int) -> tvm.tirx.PrimFunc:
    """One token through a q4f16_1 linear with the residual add: dequantize (MLC layout: 8
    nibbles per uint32, w = (q - 7) * scale, group 32) -> NT_matmul (f32) -> cast -> add."""
    words, groups = k // 8, k // 32

    @T.prim_func(s_tir=True)
    def func(
        qw: T.Buffer((T.int64(n), T.int64(words)), "uint32"),
        qs: T.Buffer((T.int64(n), T.int64(groups)), "float16"),
        x: T.Buffer((T.int64(1), T.int64(1), T.int64(k)), "float16"),
        res: T.Buffer((T.int64(1), T.int64(1), T.int64(n)), "float16"),
        out: T.Buffer((T.int64(1), T.int64(1), T.int64(n)), "float16"),
    ):
        T.func_attr({"tirx.noalias": True})
        w = T.sblock_alloc_buffer((T.int64(n), T.int64(k)), "float16")
        acc = T.sblock_alloc_buffer((T.int64(1), T.int64(1), T.int64(n)))
        y = T.sblock_alloc_buffer((T.int64(1), T.int64(1), T.int64(n)), "float16")
        for i, j in T.grid(T.int64(n), T.int64(k)):
            with T.sblock("dequantize"):
                vi, vj = T.axis.remap("SS", [i, j])
                w[vi, vj] = (
                    T.Cast(
                        "float16",
                        qw[vi, vj // T.int64(8)]
                        >> T.Cast("uint32", vj % T.int64(8) * T.int64(4))
                        & T.uint32(15),
                    )
                    - T.float16(7)
                ) * qs[vi, vj // T.int64(32)]
        for b0, b1, i, j in T.grid(T.int64(1), T.int64(1), T.int64(n), T.int64(k)):
            with T.sblock("NT_matmul"):
                v0, v1, vi, vj = T.axis.remap("SSSR", [b0, b1, i, j])
                with T.init():
                    acc[v0, v1, vi] = T.float32(0)
                acc[v0, v1, vi] = acc[v0, v1, vi] + (
                    T.Cast("float32", x[v0, v1, vj]) * T.Cast("float32", w[vi, vj])
                )
        for b0, b1, i in T.grid(T.int64(1), T.int64(1), T.int64(n)):
            with T.sblock("compute"):
                v0, v1, vi = T.axis.remap("SSS", [b0, b1, i])
                y[v0, v1, vi] = T.Cast("float16", acc[v0, v1, vi])
        for b0, b1, i in T.grid(T.int64(1), T.int64(1), T.int64(n)):
            with T.sblock("T_add"):
                v0, v1, vi = T.axis.remap("SSS", [b0, b1, i])
                out[v0, v1, vi] = y[v0, v1, vi] + res[v0, v1, vi]

    return func


def f16_gemv(n: int, k: int) -> tvm.tirx.PrimFunc:
    """One token through an unquantized f16 linear (q0f16): NT_matmul (f32) -> cast."""

    @T.prim_func(s_tir=True)
    def func(
        x: T.Buffer((T.int64(1), T.int64(1), T.int64(k)), "float16"),
        w: T.Buffer((T.int64(n), T.int64(k)), "float16"),
        out: T.Buffer((T.int64(1), T.int64(1), T.int64(n)), "float16"),
    ):
        T.func_attr({"tirx.noalias": True})
        acc = T.sblock_alloc_buffer((T.int64(1), T.int64(1), T.int64(n)))
        for b0, b1, i, j in T.grid(T.int64(1), T.int64(1), T.int64(n), T.int64(k)):
            with T.sblock("NT_matmul"):
                v0, v1, vi, vj = T.axis.remap("SSSR", [b0, b1, i, j])
                with T.init():
                    acc[v0, v1, vi] = T.float32(0)
                acc[v0, v1, vi] = acc[v0, v1, vi] + (
                    T.Cast("float32", x[v0, v1, vj]) * T.Cast("float32", w[vi, vj])
                )
        for b0, b1, i in T.grid(T.int64(1), T.int64(1), T.int64(n)):
            with T.sblock("compute"):
                v0, v1, vi = T.axis.remap("SSS", [b0, b1, i])
                out[v0, v1, vi] = T.Cast("float16", acc[v0, v1, vi])

    return func


# Llama-3.2-1B's hidden size as K, a slice of its output rows as N
Q4 = q4f16_gemv(512, 2048)
F16 = f16_gemv(256, 2048)


def q4_inputs(n: int, k: int, seed: int = 0) -> tuple[list[np.ndarray], np.ndarray]:
    """Arguments of `q4f16_gemv(n, k)` and the NumPy result (f16 weights, f64 dot product)."""
    rng = np.random.default_rng(seed)
    qw = rng.integers(0, 1 << 32, size=(n, k // 8), dtype=np.uint64).astype(np.uint32)
    qs = (rng.random((n, k // 32)) * 0.02 + 0.001).astype(np.float16)
    x = rng.standard_normal((1, 1, k)).astype(np.float16)
    res = rng.standard_normal((1, 1, n)).astype(np.float16)
    shifts = 4 * np.arange(8, dtype=np.uint32)
    q = ((qw[:, :, None] >> shifts) & 15).reshape(n, k)
    w = (q.astype(np.float16) - np.float16(7)) * np.repeat(qs, 32, axis=1)
    y = (w.astype(np.float64) @ x.reshape(k).astype(np.float64)).astype(np.float16)
    want = (y + res.reshape(n)).reshape(1, 1, n)
    return [qw, qs, x, res, np.zeros((1, 1, n), np.float16)], want


def f16_inputs(n: int, k: int, seed: int = 0) -> tuple[list[np.ndarray], np.ndarray]:
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((1, 1, k)).astype(np.float16)
    w = (rng.standard_normal((n, k)) * 0.05).astype(np.float16)
    want = (w.astype(np.float64) @ x.reshape(k).astype(np.float64)).astype(np.float16)
    return [x, w, np.zeros((1, 1, n), np.float16)], want.reshape(1, 1, n)


def schedule(func: tvm.tirx.PrimFunc, target, rule: GEMVDequant) -> tvm.tirx.PrimFunc:
    with target:
        sch = rule.apply(copy_func(func), target, False)
    assert sch is not None, rule
    return sch.mod["main"]


def subgroup_rule() -> GEMVDequant:
    return dataclasses.replace(GEMVDequant.for_target("webgpu"), subgroup=LANES)


def rel_err(got: np.ndarray, want: np.ndarray) -> float:
    got64, want64 = got.astype(np.float64), want.astype(np.float64)
    assert np.isfinite(got64).all()
    return float(np.abs(got64 - want64).max() / np.abs(want64).max())


def wgsl(func: tvm.tirx.PrimFunc, target: tvm.target.Target) -> str:
    mod = tvm.IRModule({"main": func.with_attr("global_symbol", "main")})
    with tvm.transform.PassContext(config={"tirx.disable_cse_tir": True}):
        lib = tvm.tirx.build(mod, target=target)
    return "\n".join(m.inspect_source("") for m in lib.imports if m.kind == "webgpu")


# ---- the opt-in -------------------------------------------------------------------------------


def test_supports_subgroups_is_an_opt_in_of_the_webgpu_preset():
    default = webgpu(False).export()
    assert default["supports_subgroups"] is False and default["thread_warp_size"] == 1
    opted = webgpu(True).export()  # TVM sets thread_warp_size 32 with subgroups
    assert opted["supports_subgroups"] is True and opted["thread_warp_size"] == 32
    fixed = "'thread_warp_size': got 8; TVM 0.27 fixes it to 32"
    with pytest.raises(ConfigError, match=fixed):
        load_target("webgpu", {"supports_subgroups": True, "thread_warp_size": 8})
    with pytest.raises(ConfigError, match="'supports_subgroups': got 'yes'"):
        load_target("webgpu", {"supports_subgroups": "yes"})


def test_rule_picks_one_subgroup_per_row_only_with_subgroups():
    rule = GEMVDequant.for_target("webgpu")

    def fit(rule: GEMVDequant, func: tvm.tirx.PrimFunc, target) -> tuple[int, int, int]:
        return rule._fit(rule._match(func, target), target)  # (threads, rows, vec)

    # Q4: 256 words per row
    shared, target = webgpu(False), webgpu(True)
    assert fit(rule, Q4, shared) == (16, 8, 4)  # the defaults, unchanged
    assert set(rule.knob_space(Q4, shared)) == {"threads", "rows", "vec", "unroll"}
    assert fit(rule, Q4, target) == (32, 1, 4)  # the default lanes: thread_warp_size
    space = rule.knob_space(Q4, target)
    assert set(space) == {"subgroup", "vec", "unroll"}
    assert space["subgroup"] == [4, 8, 16, 32]
    for lanes in space["subgroup"]:
        candidate = dataclasses.replace(rule, subgroup=lanes)
        assert candidate.valid(Q4, target)
        assert fit(candidate, Q4, target) == (lanes, 1, 4)
    # a short row keeps its lanes and narrows its loads: 16 words = 8 lanes x 2 words
    small = q4f16_gemv(64, 128)
    assert fit(dataclasses.replace(rule, subgroup=8), small, target) == (8, 1, 2)


def test_generated_wgsl_reduces_through_subgroup_shuffles():
    target = webgpu(True)
    rule = dataclasses.replace(GEMVDequant.for_target("webgpu"), subgroup=8)
    source = wgsl(schedule(Q4, target, rule), target)
    assert re.search(r"^enable subgroups;$", source, re.MULTILINE)
    assert "@workgroup_size(8, 1, 1)" in source
    assert source.count("subgroupShuffleDown(") == 3  # 8 -> 4 -> 2 -> 1 lanes
    assert "subgroupShuffle(" in source  # the broadcast of the row's sum
    assert "var<workgroup>" not in source and "workgroupBarrier" not in source
    shared = webgpu(False)
    fallback = wgsl(schedule(Q4, shared, GEMVDequant.for_target("webgpu")), shared)
    assert "subgroup" not in fallback
    assert "@workgroup_size(16, 8, 1)" in fallback
    assert "var<workgroup>" in fallback and "workgroupBarrier" in fallback


# ---- on lavapipe -------------------------------------------------------------------------------


@needs_adapter
@needs_subgroups
@pytest.mark.parametrize("kind", ["q4f16_1", "f16"])
def test_gemv_with_subgroups_matches_numpy_and_llvm(kind):
    """The q4f16_1 fused-dequantize GEMV (N 512, with cast + add) and the unquantized f16 one
    (N 256), K 2048, one subgroup of 8 lanes per row on lavapipe."""
    target = webgpu(True)
    kernel, inputs = (Q4, q4_inputs(512, 2048)) if kind == "q4f16_1" else (F16, f16_inputs(256, 2048))
    args, want = inputs
    got = runner.run_primfunc(schedule(kernel, target, subgroup_rule()), target, [a.copy() for a in args])[-1]
    assert got.dtype == np.float16 and rel_err(got, want) < 1e-2
    unscheduled = run_llvm(kernel, [a.copy() for a in args])[-1]
    assert rel_err(got, unscheduled) < 1e-2


@needs_adapter
@needs_subgroups
def test_tiny_model_decode_gemvs_with_subgroups():
    """Every one-token GEMV of the tiny q4f16_1 model (qkv, o_proj + add, gate_up, down + add,
    lm_head) through the subgroup schedule, against the unscheduled kernel on llvm."""
    target = webgpu(True)
    kernels = decode_gemvs(fused_kernels("llama-tiny", "q4f16_1"))
    assert len(kernels) >= 4
    for name, func in sorted(kernels.items()):
        args = random_args(func, {}, seed=0)
        want = run_llvm(func, [a.copy() for a in args])[-1]
        scheduled = schedule(func, target, subgroup_rule())
        got = runner.run_primfunc(scheduled, target, [a.copy() for a in args])[-1]
        assert rel_err(got, want) < (2e-2 if want.dtype == np.float16 else 1e-4), name


@needs_adapter
def test_fallback_without_subgroups_uses_shared_memory_on_lavapipe():
    target = webgpu(False)
    func = schedule(Q4, target, GEMVDequant.for_target("webgpu"))
    args, want = q4_inputs(512, 2048, seed=1)
    got = runner.run_primfunc(func, target, [a.copy() for a in args])[-1]
    assert rel_err(got, want) < 1e-2


@needs_adapter
def test_subgroup_kernel_without_the_feature_is_a_one_line_error():
    target = webgpu(True)
    func = schedule(F16, target, subgroup_rule())
    args, _ = f16_inputs(256, 2048)
    lacks = "enables subgroups .* lacks the subgroups feature"
    with runner.features_hidden("subgroups"), pytest.raises(RuntimeError, match=lacks) as info:
        runner.run_primfunc(func, target, args)
    assert "\n" not in str(info.value)


@needs_adapter
@needs_subgroups
@pytest.mark.skipif(bool(SIZES and SIZES[0] >= 32), reason="subgroups of 32+ lanes")
def test_kernel_wider_than_the_adapter_subgroups_is_refused():
    """The default subgroup schedule (TVM's 32 lanes) would sum wrongly on 8-lane subgroups."""
    target = webgpu(True)
    func = schedule(F16, target, GEMVDequant.for_target("webgpu"))
    args, _ = f16_inputs(256, 2048)
    wider = "built for 32-lane subgroups .* not a single subgroup"
    with pytest.raises(RuntimeError, match=wider) as info:
        runner.run_primfunc(func, target, args)
    assert "\n" not in str(info.value)


@needs_adapter
@needs_subgroups
def test_naga_still_rejects_enable_subgroups(monkeypatch):
    """Pins why the runner drops `enable subgroups;` (PATCH_SUBGROUPS_ENABLE): once this fails,
    wgpu's WGSL front end accepts the directive and the patch can go."""
    monkeypatch.setattr(runner, "PATCH_SUBGROUPS_ENABLE", False)
    runner.clear_pipeline_cache()
    target = webgpu(True)
    func = schedule(F16, target, subgroup_rule())
    args, _ = f16_inputs(256, 2048)
    with pytest.raises(Exception, match="not yet implemented in Naga"):
        runner.run_primfunc(func, target, args)

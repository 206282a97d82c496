"""Fusion passes, the phased pipeline's IR dumps, and the CPU schedule rule's numerics."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
import tvm
from tvm import te

from mlcpipe.build import build, export_model
from mlcpipe.kernel_info import random_args
from mlcpipe.passes import PHASES, phase_passes, run_pipeline
from mlcpipe.quantization import QUANTIZATIONS
from mlcpipe.roles import WEIGHT_ROLES
from mlcpipe.targets import load_target
from mlcpipe.schedules import schedule_pass
from mlcpipe.schedules.llvm.matmul_nt import MatmulNT
from mlcpipe.quantization import quantization

LINEAR_ROLES = set(WEIGHT_ROLES)


@pytest.fixture(scope="module")
def tiny_q4_artifact(tiny_config, tmp_path_factory):
    out = tmp_path_factory.mktemp("art") / "tiny-q4f16_1-llvm"
    return build(tiny_config, quantization("q4f16_1"), load_target("llvm"), output=out, dump_ir=True, log=lambda *_: None)


def test_every_quantized_linear_is_one_fused_kernel(tiny_q4_artifact):
    manifest = json.loads((tiny_q4_artifact / "manifest.json").read_text())
    kernels = {k["name"]: k["role"] for k in manifest["kernels"]}
    linear = {name: role for name, role in kernels.items() if role in LINEAR_ROLES}
    assert set(linear.values()) == LINEAR_ROLES
    for name, role in linear.items():
        assert re.fullmatch(r"fused_dequantize\d*_NT_matmul\d*(_\w+)?", name), name
        if role in ("o_proj", "down"):
            assert name.endswith("_add") or re.search(r"_add\d*$", name), f"{name}: residual add not fused"
    assert not [n for n in kernels if re.fullmatch(r"dequantize\d*", n)], "standalone dequantize kernel left"
    assert kernels["take_dequantize"] == "embedding"


def test_ir_dump_after_each_phase(tiny_q4_artifact):
    dumps = sorted(p.name for p in (tiny_q4_artifact / "ir").iterdir())
    assert dumps == ["00-input.py"] + [f"{i:02d}-{name}.py" for i, name in enumerate(PHASES, start=1)]
    fused = (tiny_q4_artifact / "ir" / "03-fuse-tir.py").read_text()
    lowered = (tiny_q4_artifact / "ir" / "02-lower.py").read_text()
    assert "def dequantize1(" in lowered and "def dequantize1(" not in fused
    # the final decode function never calls a standalone dequantize
    final = (tiny_q4_artifact / "ir" / "05-finalize.py").read_text()
    assert not re.search(r"\bdequantize\d*\b(?!_)", final.split("def decode(")[1].split("@R.function")[0].replace("fused_dequantize", "").replace("take_dequantize", ""))
    assert tuple(name for name, _ in phase_passes(schedule_pass("llvm"))) == PHASES


def test_run_pipeline_stops_after_the_phase_asked(tiny_config):
    target = load_target("llvm").tvm_target()
    mod, _ = export_model(tiny_config, quantization("q4f32_1"), target)
    with pytest.raises(ValueError, match="until='tune': not a phase; allowed: fuse-high-level, lower"):
        run_pipeline(mod, target, until="tune")
    with pytest.raises(ValueError, match="the schedule phase needs a schedule pass"):
        run_pipeline(mod, target, until="schedule")  # passes/ does not pick the schedules: its caller does
    seen = []
    fused = run_pipeline(mod, target, on_phase=lambda name, _: seen.append(name), until="fuse-tir")
    assert seen == ["fuse-high-level", "lower", "fuse-tir"]
    names = [gv.name_hint for gv, f in fused.functions_items() if isinstance(f, tvm.tirx.PrimFunc)]
    assert any(n.startswith("fused_dequantize") and "NT_matmul" in n for n in names)


def _run(func: tvm.tirx.PrimFunc, args: list[np.ndarray]) -> np.ndarray:
    lib = tvm.compile(tvm.IRModule({"main": func.with_attr("global_symbol", "main")}), target=load_target("llvm").tvm_target())
    dev = tvm.cpu()
    tensors = [tvm.runtime.tensor(a, dev) for a in args]
    lib["main"](*tensors)
    return tensors[-1].numpy()


@pytest.mark.parametrize("quant", ["q4f16_1", "q4f32_1", "q0f16"])
def test_matmul_rule_keeps_numerics(quant, tiny_config):
    target = load_target("llvm").tvm_target()
    mod, _ = export_model(tiny_config, quantization(quant), target)
    mod = run_pipeline(mod, target, until="fuse-tir")
    matmuls = [(gv.name_hint, f) for gv, f in mod.functions_items() if isinstance(f, tvm.tirx.PrimFunc) and "NT_matmul" in gv.name_hint]
    assert len(matmuls) >= 8  # 4 linears x (decode, prefill) + lm_head
    for name, func in matmuls:
        sch = MatmulNT().apply(func, target, False)
        assert sch is not None, f"{name}: rule did not apply"
        for seq_len in (1, 7):
            args = random_args(func, {"seq_len": seq_len}, seed=seq_len)
            want = _run(func, [a.copy() for a in args]).astype(np.float32)
            got = _run(sch.mod["main"], [a.copy() for a in args]).astype(np.float32)
            tol = QUANTIZATIONS[quant].tolerance
            np.testing.assert_allclose(got, want, rtol=tol, atol=tol * np.abs(want).max(), err_msg=name)


def test_matmul_rule_declines_what_it_does_not_handle():
    target = load_target("llvm").tvm_target()
    a = te.placeholder((4, 20), "float32", name="A")
    w = te.placeholder((8, 20), "float32", name="W")
    k = te.reduce_axis((0, 20), name="k")
    c = te.compute((4, 8), lambda i, j: te.sum(a[i, k] * w[j, k], axis=k), name="C")
    assert MatmulNT().apply(te.create_prim_func([a, w, c]), target, False) is None  # K % lanes != 0
    x = te.placeholder((4, 32), "float32", name="X")
    y = te.compute((4, 32), lambda i, j: x[i, j] * 2, name="Y")
    assert MatmulNT().apply(te.create_prim_func([x, y]), target, False) is None  # no reduction
    assert MatmulNT().apply(te.create_prim_func([a, w, c]), tvm.target.Target({"kind": "cuda", "arch": "sm_80"}), False) is None

"""`mlcpipe check` on llvm: every kernel against the unscheduled function (and NumPy for the fused
dequantize matmuls); a wrong kernel is caught."""

from __future__ import annotations

import numpy as np
import pytest

from pipeline import conformance
from pipeline.build import build
from pipeline.targets import load_target

from .test_errors import mlcpipe


@pytest.fixture(scope="module")
def llvm_artifact(tiny_config, tmp_path_factory):
    out = tmp_path_factory.mktemp("check") / "tiny-q4f32_1-llvm"
    return build(tiny_config, "q4f32_1", load_target("llvm"), output=out, log=lambda *_: None)


def test_check_passes_every_kernel_on_llvm(llvm_artifact):
    report = conformance.check_artifact(llvm_artifact)
    assert report.ok and report.executed
    ran = {r.kernel for r in report.results if r.status == "pass"}
    fused = [r for r in report.results if r.kernel.startswith("fused_dequantize")]
    assert {r.role for r in fused} == {"qkv", "o_proj", "gate_up", "down", "lm_head"}
    assert all(r.status == "pass" and r.note.startswith("llvm vs numpy") for r in fused)
    assert {"rms_norm", "take_dequantize", "tir_kv_cache_transpose_append"} <= ran
    assert any(r.sizes == "seq_len=7" for r in fused)


def test_check_catches_a_wrong_kernel(llvm_artifact, monkeypatch):
    def perturbed(kind):
        def run(func, target, args):
            out = conformance.run_on_llvm(func, args)
            return [a * np.asarray(1.01, a.dtype) if a.dtype.kind == "f" else a for a in out]
        return run

    monkeypatch.setattr(conformance, "_executor", perturbed)
    report = conformance.check_artifact(llvm_artifact, pattern="NT_matmul|rms_norm")
    assert not report.ok
    assert all(r.status == "FAIL" for r in report.results if r.status != "skip")


def test_check_cli_prints_table(llvm_artifact):
    result = mlcpipe("check", "--artifact", str(llvm_artifact), "--kernels", "rms_norm")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.strip().splitlines()
    assert lines[0].startswith("| Kernel") and "Max abs err" in lines[0] and "Max rel err" in lines[0]
    assert lines[-1].startswith("llvm: executed") and "0 failed" in lines[-1]

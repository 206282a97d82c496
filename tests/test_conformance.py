"""`mlcpipe check` on llvm: every kernel of the shipped lib.so against the unscheduled function (and
NumPy for the fused dequantize matmuls); a wrong kernel is caught."""

from __future__ import annotations

import numpy as np
import pytest

from mlcpipe import conformance
from mlcpipe.build import build
from mlcpipe.roles import WEIGHT_ROLES
from mlcpipe.targets import load_target
from mlcpipe.quantization import quantization

from tests.helpers.cli import mlcpipe


@pytest.fixture(scope="module")
def llvm_artifact(tiny_config, tmp_path_factory):
    out = tmp_path_factory.mktemp("check") / "tiny-q4f32_1-llvm"
    return build(tiny_config, quantization("q4f32_1"), load_target("llvm"), output=out, log=lambda *_: None)


def test_check_passes_every_kernel_on_llvm(llvm_artifact):
    report = conformance.check_artifact(llvm_artifact)
    assert report.ok and report.executed
    ran = {r.kernel for r in report.results if r.status == "pass"}
    fused = [r for r in report.results if r.kernel.startswith("fused_dequantize")]
    assert {r.role for r in fused} == set(WEIGHT_ROLES)
    assert all(r.status == "pass" and r.note.startswith("llvm vs numpy") for r in fused)
    assert {"rms_norm", "take_dequantize", "tir_kv_cache_transpose_append"} <= ran
    assert any(r.sizes == "seq_len=7" for r in fused)


def test_check_runs_the_shipped_library(llvm_artifact, tiny_config, tmp_path):
    """The kernels come from the artifact's lib.so, not from its TIR: a library whose rms_norm was
    built with another epsilon (swapped in, its manifest digest updated to match: a library that
    differs from its digest is refused, tests/test_hostile_inputs.py) fails that kernel, and only the norms."""
    import dataclasses
    import json
    import shutil

    from mlcpipe.artifact import sha256_file

    other = build(dataclasses.replace(tiny_config, rms_norm_eps=0.5), quantization("q4f32_1"), load_target("llvm"),
                  output=tmp_path / "other", log=lambda *_: None)
    swapped = tmp_path / "swapped"
    shutil.copytree(llvm_artifact, swapped)
    shutil.copyfile(other / "lib.so", swapped / "lib.so")
    manifest = json.loads((swapped / "manifest.json").read_text())
    manifest["files"]["lib.so"] = {"sha256": sha256_file(swapped / "lib.so"), "bytes": (swapped / "lib.so").stat().st_size}
    (swapped / "manifest.json").write_text(json.dumps(manifest))
    report = conformance.check_artifact(swapped, sizes=(3,), pattern="^rms_norm|NT_matmul")
    status = {r.kernel: r.status for r in report.results}
    assert not report.ok
    assert {k for k, v in status.items() if v == "FAIL"} == {k for k in status if k.startswith("rms_norm")}
    assert any(v == "pass" for k, v in status.items() if "NT_matmul" in k)


def test_check_catches_a_wrong_kernel(llvm_artifact, monkeypatch):
    from mlcpipe import runtime

    def perturbed(artifact, manifest, options):
        def run(name, args):
            out = run_shipped(name, args)
            return [a * np.asarray(1.01, a.dtype) if isinstance(a, np.ndarray) and a.dtype.kind == "f" else a for a in out]
        run_shipped = original(artifact, manifest, options)
        return run

    original = runtime.kernel_runner
    monkeypatch.setattr(runtime, "kernel_runner", perturbed)
    report = conformance.check_artifact(llvm_artifact, pattern="NT_matmul|rms_norm")
    assert not report.ok
    assert all(r.status == "FAIL" for r in report.results if r.status != "skip")


def test_check_refuses_a_pattern_that_matches_nothing(llvm_artifact):
    result = mlcpipe("check", "--artifact", str(llvm_artifact), "--kernels", "no_such_kernel")
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1].startswith("error: --kernels 'no_such_kernel': matches none of the")


def test_check_cli_prints_table(llvm_artifact):
    result = mlcpipe("check", "--artifact", str(llvm_artifact), "--kernels", "rms_norm")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.strip().splitlines()
    assert lines[0].startswith("| Kernel") and "Max abs err" in lines[0] and "Max rel err" in lines[0]
    assert lines[-1].startswith("llvm: executed") and "0 failed" in lines[-1]


def test_a_size_given_twice_is_checked_once(llvm_artifact):
    """--sizes 3,3,1: each kernel with a symbolic dim runs at 3 and at 1, once each, in that order."""
    from mlcpipe.interface.check import check, parse_sizes

    assert parse_sizes(" 3,3, 1,3 ") == (3, 1)
    text, ok = check(llvm_artifact, "3,3,1", "^rms_norm")
    rows = [line.split("|")[3].strip() for line in text.splitlines() if line.startswith("| rms_norm")]
    assert ok and rows == ["static", "seq_len=3", "seq_len=1"], text

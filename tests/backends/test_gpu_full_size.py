"""Llama-3.2-1B q4f16_1 for the GPU targets, through the CLI as a user runs it.

Each is a whole build of the real model (about 30 s for Metal, 45 s for CUDA with its two-arch
nvcc fatbin, 20 s for WebGPU once the web runtime is cached)."""

from __future__ import annotations

import json
import subprocess

import pytest

from mlcpipe.roles import WEIGHT_ROLES

from tests.helpers.cli import mlcpipe

LINEAR_ROLES = set(WEIGHT_ROLES)


def _check_manifest(art, source_file):
    manifest = json.loads((art / "manifest.json").read_text())
    fused = [k for k in manifest["kernels"] if k["role"] in LINEAR_ROLES]
    assert {k["role"] for k in fused} == LINEAR_ROLES
    assert all(k["name"].startswith("fused_dequantize") and "_NT_matmul" in k["name"] for k in fused)
    assert all(k["launch"] and k["launch"]["block"] != ["1", "1", "1"] for k in fused), "launch config missing"
    source = (art / source_file).read_text()
    for kernel in fused:
        assert kernel["name"] in source
    return manifest


def test_headline_metal_build(tmp_path):
    art = tmp_path / "llama-3.2-1b-q4f16_1-metal"
    result = mlcpipe("build", "--quant", "q4f16_1", "--target", "metal", "--output", str(art))
    assert result.returncode == 0, result.stderr
    described = subprocess.run(["file", str(art / "lib.dylib")], capture_output=True, text=True).stdout
    assert "Mach-O 64-bit arm64 dynamically linked shared library" in described
    manifest = _check_manifest(art, "kernels.metal")
    assert manifest["target"]["host"]["mtriple"] == "arm64-apple-macos"
    assert "kernel void fused_dequantize" in (art / "kernels.metal").read_text()


@pytest.mark.parametrize("target, library, source", [pytest.param("cuda", "lib.so", "kernels.cu", marks=[pytest.mark.nvcc, pytest.mark.long]),
                                                      ("webgpu", "lib.wasm", "kernels.wgsl")])
def test_full_size_gpu_build(target, library, source, tmp_path):
    art = tmp_path / f"llama-3.2-1b-q4f16_1-{target}"
    result = mlcpipe("build", "--quant", "q4f16_1", "--target", target, "--output", str(art))
    assert result.returncode == 0, result.stderr
    assert (art / library).stat().st_size > 100_000
    _check_manifest(art, source)
    if target == "cuda":
        from mlcpipe.backends.cuda import verify_fatbin

        assert {"sm_80", "sm_90"} <= set(verify_fatbin(art / library))
    else:
        assert (art / library).read_bytes()[:4] == b"\0asm"

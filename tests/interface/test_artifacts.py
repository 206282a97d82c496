"""pipeline/interface/artifacts.ensure_artifact: `profile --quant`'s build cache is keyed on
everything the build depends on (code, tuning DB, compiler), verified, and built in a child."""

from __future__ import annotations

import pipeline.nightly.cache as cache
from pipeline.artifact import read_manifest
from pipeline.interface.artifacts import ensure_artifact


def test_ensure_artifact_reuses_rebuilds_on_code_change_and_on_corruption(tmp_path, monkeypatch):
    monkeypatch.setenv("MLCPIPE_ARTIFACTS", str(tmp_path))
    logs: list[str] = []
    first = ensure_artifact("llama-tiny", "q4f32_1", "llvm", log=logs.append)
    manifest = read_manifest(first)
    assert manifest["cache_key"] == first.parent.name and (first / manifest["library"]).is_file()
    assert first.is_relative_to(tmp_path / "cache")
    # unchanged inputs: the same artifact, no build
    assert ensure_artifact("llama-tiny", "q4f32_1", "llvm", log=logs.append) == first and logs[-1].startswith("[mlcpipe] reusing")
    # the code changed (the old cache compared only the config hash and target): a new build
    real = cache.code_digest()
    monkeypatch.setattr(cache, "code_digest", lambda root=None: "0" * 64 if real != "0" * 64 else "1" * 64)
    second = ensure_artifact("llama-tiny", "q4f32_1", "llvm", log=logs.append)
    assert second != first and logs[-1].startswith("[mlcpipe] building")
    # a cached library that no longer matches its digest is not used: rebuilt in place
    lib = second / read_manifest(second)["library"]
    data = bytearray(lib.read_bytes())
    data[len(data) // 2] ^= 0xFF
    lib.write_bytes(bytes(data))
    third = ensure_artifact("llama-tiny", "q4f32_1", "llvm", log=logs.append)
    assert third == second and logs[-1].startswith("[mlcpipe] building")
    assert read_manifest(third)["files"][read_manifest(third)["library"]]["sha256"] == cache.sha256_file(lib)

"""pipeline/interface/artifacts.ensure_artifact: `profile --quant`'s build cache is keyed on
everything the build depends on (code, tuning DB, compiler), verified, and built in a child."""

from __future__ import annotations

from pathlib import Path

import mlcpipe.nightly.cache as cache
from mlcpipe.artifact import read_manifest
from mlcpipe.interface.artifacts import ensure_artifact


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


def test_two_processes_wanting_one_entry_build_it_once(tmp_path):
    """Two processes (two `profile --quant` runs, two test workers) ask for the same uncached
    artifact at once: one builds, the other waits and reuses it. Was: the second build was
    refused ("being written by another mlcpipe") and failed."""
    import os
    import subprocess
    import sys

    code = ("from mlcpipe.interface.artifacts import ensure_artifact; "
            "print(ensure_artifact('llama-tiny', 'q4f32_1', 'llvm', log=lambda m: print(m, flush=True)))")
    env = {**os.environ, "MLCPIPE_ARTIFACTS": str(tmp_path)}
    procs = [subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
             for _ in range(2)]
    outs = [p.communicate(timeout=600) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [o[1][-2000:] for o in outs]
    paths = {o[0].splitlines()[-1] for o in outs}
    assert len(paths) == 1
    logs = "".join(o[0] for o in outs)
    assert logs.count("[mlcpipe] building") == 1 and "built meanwhile by another mlcpipe" in logs
    assert [p.name for p in (tmp_path / "cache").iterdir()] == [Path(paths.pop()).parent.name]  # no lock or temp left

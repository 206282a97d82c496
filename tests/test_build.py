"""pipeline/build.py: one build of the tiny model, its manifest checked against what the phases
recorded (every fused kernel with its role, launch and schedule, digests of every file, the
phases' outputs on disk); a bad tuning database is refused before anything is built."""

from __future__ import annotations

import json

import pytest

from mlcpipe.artifact import RUN_FIELDS, file_digests, read_manifest
from mlcpipe.build import build
from mlcpipe.errors import ArtifactError, ConfigError
from mlcpipe.targets import load_target
from mlcpipe.weights import expected_parameters
from mlcpipe.quantization import quantization


@pytest.fixture(scope="module")
def built(tiny_config, tmp_path_factory):
    out = tmp_path_factory.mktemp("build") / "art"
    logs: list[str] = []
    build(tiny_config, quantization("q4f16_1"), load_target("llvm"), out, weights="synthetic", log=logs.append,
          manifest_extra={"note": "extra"}, tuning_db=out.parent / "no-db.json")
    return out, logs


def test_the_manifest_records_what_the_phases_made(built, tiny_config):
    art, logs = built
    manifest = read_manifest(art, RUN_FIELDS)
    assert manifest["quantization"] == "q4f16_1" and manifest["note"] == "extra" and manifest["tuning_db"] is None
    assert [(p["name"], tuple(p["shape"]), p["dtype"]) for p in manifest["parameters"]] == expected_parameters(tiny_config, quantization("q4f16_1"))
    fused = [k for k in manifest["kernels"] if "dequantize" in k["name"] and "NT_matmul" in k["name"]]
    assert fused and all(k["role"] in ("qkv", "o_proj", "gate_up", "down", "lm_head") for k in fused)
    assert all(k["schedule"] and k["schedule"]["rule"] for k in manifest["kernels"] if k["schedule"] is not None)
    assert sum(k["schedule"] is not None for k in manifest["kernels"]) >= len(fused)
    assert {"prefill", "decode", "embed", "create_paged_kv_cache"} <= set(manifest["functions"])
    assert manifest["files"] == file_digests(art)  # every other file, digested as it is on disk
    assert {"tir/scheduled.json", "mlc-chat-config.json", manifest["library"]} <= set(manifest["files"])
    assert any(f.startswith("reference/") for f in manifest["files"]) and any(f.startswith("params/") for f in manifest["files"])
    phases = next(line for line in logs if line.startswith("[mlcpipe] build phases: "))
    assert all(p in phases for p in ("export", "fuse-tir", "schedule", "codegen", "reference"))
    chat = json.loads((art / "mlc-chat-config.json").read_text())
    assert chat["model_config"]["hidden_size"] == tiny_config.hidden_size


def test_a_bad_tuning_database_is_refused_before_anything_is_built(tiny_config, tmp_path):
    from mlcpipe.tuning import target_key

    db = tmp_path / "db.json"
    db.write_text(json.dumps({"schema": "mlcpipe-tuning", "version": 1,
                              "records": {target_key(load_target("llvm").target): {"sig": {"rule": "NoSuchRule", "knobs": {}}}}}))
    logs: list[str] = []
    with pytest.raises((ConfigError, ArtifactError), match="rule 'NoSuchRule' unknown"):
        build(tiny_config, quantization("q4f16_1"), load_target("llvm"), tmp_path / "art", log=logs.append, tuning_db=db)
    assert logs == [] and not (tmp_path / "art").exists()

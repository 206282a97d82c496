"""mlc-chat-config.json as MLC-LLM's runtimes and WebLLM read it, the model directory
`convert-weights` writes for them, and the one-line checks of a model dir and a library."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from mlcpipe.build import build
from mlcpipe.config import load_model_config, parse_model_config
from mlcpipe.conv_templates import CONV_TEMPLATES
from mlcpipe.errors import ArtifactError, ConfigError
from mlcpipe.interface.mlc import mlc_check
from mlcpipe.mlc_contract import (
    DEFAULT_TOKENIZER_INFO,
    REQUIRED_CONFIG_FIELDS,
    REQUIRED_CONV_FIELDS,
    REQUIRED_FUNCTIONS,
    MLCContractError,
    check_library,
    check_model_dir,
    detect_tokenizer_info,
    mlc_chat_config,
)
from mlcpipe.targets import load_target
from mlcpipe.weights import convert_weights
from mlcpipe.quantization import quantization

from tests.helpers.checkpoints import random_hf_weights, write_hf_checkpoint, write_tiny_tokenizer
from tests.helpers.cli import mlcpipe, write_yaml

QUANT = "q4f32_1"
QUIET = {"log": lambda *_: None}
MLC_LLAMA_MODEL_CONFIG = {  # MLC-LLM's LlamaConfig fields
    "hidden_size": 128, "intermediate_size": 256, "num_attention_heads": 4, "num_hidden_layers": 2,
    "rms_norm_eps": 1e-5, "vocab_size": 512, "tie_word_embeddings": True, "position_embedding_base": 500000.0,
    "context_window_size": 256, "prefill_chunk_size": 128, "num_key_value_heads": 2, "head_dim": 32,
    "tensor_parallel_shards": 1, "pipeline_parallel_stages": 1, "max_batch_size": 80,
}


@pytest.fixture(scope="module")
def hf_checkpoint(tiny_config, tmp_path_factory):
    root = tmp_path_factory.mktemp("mlc-hf")
    hf = write_hf_checkpoint(root / "hf", tiny_config, random_hf_weights(tiny_config, seed=5))
    write_tiny_tokenizer(hf, tiny_config)
    return hf


@pytest.fixture(scope="module")
def model_dir(hf_checkpoint, tiny_config, tmp_path_factory):
    return convert_weights(tiny_config, quantization(QUANT), hf_checkpoint, tmp_path_factory.mktemp("mlc-w") / "w", **QUIET)


@pytest.fixture(scope="module")
def artifact(tiny_config, tmp_path_factory):
    return build(tiny_config, quantization(QUANT), load_target("llvm"), output=tmp_path_factory.mktemp("mlc-art") / "art", **QUIET)


def read_config(directory: Path) -> dict:
    return json.loads((Path(directory) / "mlc-chat-config.json").read_text())


def assert_tiny_chat_config(data: dict, tiny_config) -> None:
    assert set(REQUIRED_CONFIG_FIELDS) <= set(data)
    assert data["version"] == "0.1.0"
    assert (data["model_type"], data["quantization"]) == ("llama", QUANT)
    assert (data["vocab_size"], data["context_window_size"], data["prefill_chunk_size"]) == (512, 256, 128)
    assert (data["sliding_window_size"], data["attention_sink_size"], data["tensor_parallel_shards"]) == (-1, -1, 1)
    assert (data["temperature"], data["top_p"], data["repetition_penalty"]) == (1.0, 1.0, 1.0)
    assert (data["presence_penalty"], data["frequency_penalty"]) == (0.0, 0.0)
    assert (data["bos_token_id"], data["eos_token_id"], data["pad_token_id"]) == (1, 2, 0)
    mc = data["model_config"]
    assert {k: mc[k] for k in MLC_LLAMA_MODEL_CONFIG} == MLC_LLAMA_MODEL_CONFIG
    assert mc["rope_scaling"] == tiny_config.rope_scaling.as_dict()
    conv = data["conv_template"]
    assert set(REQUIRED_CONV_FIELDS) <= set(conv)
    assert conv["name"] == "LM" and conv["stop_token_ids"] == [2] and conv["system_prefix_token_ids"] == [1]
    assert conv["roles"] == {"user": "", "assistant": ""} and conv["seps"] == [""] and conv["messages"] == []
    # mlcpipe's own runtime reads these, and the model_config gives the YAML's config back
    assert (data["page_size"], data["model_dtype"], data["hidden_size"]) == (16, "float32", 128)
    back = parse_model_config(mc, "<mlc-chat-config>")
    assert back.config_hash() == tiny_config.config_hash()


def test_convert_weights_writes_mlc_model_dir(model_dir, hf_checkpoint, tiny_config):
    data = check_model_dir(model_dir)
    assert_tiny_chat_config(data, tiny_config)
    assert data["tokenizer_files"] == ["tokenizer.json", "tokenizer_config.json"]
    for name in data["tokenizer_files"]:
        assert (model_dir / name).read_bytes() == (hf_checkpoint / name).read_bytes()
    # as MLC-LLM infers it for a byte-level BPE tokenizer (Llama 3's kind)
    assert data["tokenizer_info"] == {"token_postproc_method": "byte_level", "prepend_space_in_encode": False,
                                      "strip_space_in_decode": False}


def test_cli_convert_weights_dir_passes_check(hf_checkpoint, tmp_path):
    result = mlcpipe("convert-weights", "--model", "llama-tiny", "--quant", "q0f32", "--source", str(hf_checkpoint),
                     "--output", str(tmp_path / "w"))
    assert result.returncode == 0, result.stderr
    data = check_model_dir(tmp_path / "w")
    assert data["quantization"] == "q0f32" and data["tokenizer_files"] == ["tokenizer.json", "tokenizer_config.json"]


def test_synthetic_weights_say_no_tokenizer(tiny_config, tmp_path, model_dir):
    out = convert_weights(tiny_config, quantization("q0f32"), "synthetic", tmp_path / "w", **QUIET)
    data = check_model_dir(out)
    assert data["tokenizer_files"] == [] and data["tokenizer_info"] == DEFAULT_TOKENIZER_INFO
    assert not list(out.glob("tokenizer*"))
    # mlc-check says so (was: "tokenizer files and weight shards present"), and names a real one's
    lines = {}
    mlc_check(None, out, lines.setdefault("synthetic", []).append)
    mlc_check(None, model_dir, lines.setdefault("checkpoint", []).append)
    assert lines["synthetic"] == [f"ok: {out}: mlc-chat-config.json complete (q0f32, conv_template 'LM'), weight shards present; "
                                  "no tokenizer WebLLM loads (tokenizer.json or tokenizer.model; MLC-LLM runs token ids without one)"]
    assert lines["checkpoint"][0].endswith("weight shards present; tokenizer files (tokenizer.json, tokenizer_config.json)")


def test_build_writes_mlc_chat_config(artifact, tiny_config):
    data = read_config(artifact)
    assert_tiny_chat_config(data, tiny_config)
    assert data["tokenizer_files"] == []
    manifest = json.loads((artifact / "manifest.json").read_text())
    assert parse_model_config(data["model_config"], "x").config_hash() == manifest["config_hash"]


def test_build_library_check_names_what_is_missing(artifact):
    functions = set(json.loads((artifact / "manifest.json").read_text())["functions"])
    missing = [f for f in REQUIRED_FUNCTIONS if f not in functions]
    if not missing:
        check_library(artifact)
        return
    with pytest.raises(MLCContractError) as info:
        check_library(artifact)
    message = str(info.value)
    assert "\n" not in message and all(repr(f) in message.split("(has:")[0] for f in missing)


def test_llama_3_2_1b_chat_config():
    config = load_model_config("llama-3.2-1b")
    data = mlc_chat_config(config, quantization("q4f16_1"))
    assert (data["bos_token_id"], data["eos_token_id"], data["temperature"], data["top_p"]) == (128000, 128001, 0.6, 0.9)
    assert (data["vocab_size"], data["model_config"]["position_embedding_base"]) == (128256, 500000.0)
    assert data["model_config"]["rope_scaling"]["rope_type"] == "llama3"
    conv = data["conv_template"]
    assert conv["name"] == "llama-3" and conv["stop_token_ids"] == [128001, 128009]
    assert conv["system_prefix_token_ids"] == [128000] and conv["seps"] == ["<|eot_id|>"]
    assert conv["role_content_sep"] == "<|end_header_id|>\n\n" and conv["roles"]["assistant"] == "<|start_header_id|>assistant"
    assert parse_model_config(data["model_config"], "x").config_hash() == config.config_hash()


def test_tokenizer_info_detection(tmp_path):
    assert detect_tokenizer_info(None) == DEFAULT_TOKENIZER_INFO
    assert detect_tokenizer_info(tmp_path) == DEFAULT_TOKENIZER_INFO  # no tokenizer.json: MLC-LLM's defaults
    (tmp_path / "tokenizer.json").write_text(json.dumps({  # a Llama 2 style (SentencePiece BPE) tokenizer.json
        "normalizer": {"type": "Sequence", "normalizers": [{"type": "Prepend", "prepend": "\u2581"},
                                                          {"type": "Replace", "pattern": {"String": " "}, "content": "\u2581"}]},
        "decoder": {"type": "Sequence", "decoders": [{"type": "Replace", "pattern": {"String": "\u2581"}, "content": " "},
                                                    {"type": "ByteFallback"}, {"type": "Fuse"},
                                                    {"type": "Strip", "content": " ", "start": 1, "stop": 0}]},
    }))
    assert detect_tokenizer_info(tmp_path) == {"token_postproc_method": "byte_fallback", "prepend_space_in_encode": True,
                                               "strip_space_in_decode": True}


def test_yaml_chat_fields_accepted(tmp_path):
    inline = {"system_template": "{system_message}", "roles": {"user": "U:", "assistant": "A:"}, "seps": ["\n", "</s>"],
              "stop_token_ids": [2, 3], "system_prefix_token_ids": None}
    cfg = load_model_config(str(write_yaml(tmp_path, eos_token_id=[2, 3], conv_template=inline, temperature=0,
                                           presence_penalty=-2.0)))
    data = mlc_chat_config(cfg, quantization(QUANT))
    assert data["eos_token_id"] == [2, 3] and data["temperature"] == 0.0 and data["presence_penalty"] == -2.0
    conv = data["conv_template"]
    assert conv["name"] is None and conv["seps"] == ["\n", "</s>"] and conv["system_prefix_token_ids"] is None
    assert conv["role_templates"] == {"user": "{user_message}", "assistant": "{assistant_message}", "tool": "{tool_message}"}
    assert parse_model_config(data["model_config"], "x").config_hash() == cfg.config_hash()
    for name in CONV_TEMPLATES:  # every named template is valid for a vocabulary as large as Gemma 3's
        load_model_config(str(write_yaml(tmp_path, vocab_size=262144, conv_template=name)))
    with pytest.raises(ConfigError, match=r"conv_template.stop_token_ids': got 151643; .* vocab_size=128256"):
        load_model_config(str(write_yaml(tmp_path, vocab_size=128256, conv_template="qwen2")))


@pytest.mark.parametrize(
    "changes, expected",
    [
        ({"temperature": -0.5}, r"field 'temperature': got -0.5; expected a number >= 0"),
        ({"temperature": "hot"}, r"field 'temperature': got 'hot'; expected a number >= 0"),
        ({"top_p": 0}, r"field 'top_p': got 0; expected a number in \(0, 1\]"),
        ({"top_p": 1.5}, r"field 'top_p': got 1.5; expected a number in \(0, 1\]"),
        ({"repetition_penalty": 0}, r"field 'repetition_penalty': got 0; expected a number > 0"),
        ({"presence_penalty": 2.5}, r"field 'presence_penalty': got 2.5; expected a number in \[-2, 2\]"),
        ({"frequency_penalty": True}, r"field 'frequency_penalty': got True; expected a number in \[-2, 2\]"),
        ({"bos_token_id": 512}, r"field 'bos_token_id': got 512; expected a token id in \[0, vocab_size=512\)"),
        ({"pad_token_id": -1}, r"field 'pad_token_id': got -1; expected a token id"),
        ({"eos_token_id": []}, r"field 'eos_token_id': got \[\]; expected a non-empty list of token ids"),
        ({"eos_token_id": [2, 600]}, r"field 'eos_token_id': got 600; expected a token id in \[0, vocab_size=512\)"),
        ({"max_batch_size": 0}, r"field 'max_batch_size': got 0; expected a positive integer"),
        ({"tensor_parallel_shards": 2}, r"field 'tensor_parallel_shards': got 2; allowed: 1"),
        ({"position_embedding_base": 10000.0}, r"field 'position_embedding_base': got 10000.0; must equal rope_theta"),
        ({"conv_template": "llama-9"}, r"field 'conv_template': got 'llama-9'; allowed: a mapping or one of \['LM', 'gemma_instruction', 'llama-3', 'llama-3_1', 'qwen2'\]"),
        ({"conv_template": "llama-3"}, r"field 'conv_template.system_prefix_token_ids': got 128000; expected a token id in \[0, vocab_size=512\)"),
        ({"conv_template": 7}, r"field 'conv_template': got 7; expected a template name or a mapping"),
        ({"conv_template": {"roles": {"user": "U"}, "seps": [""]}}, r"field 'conv_template.roles': got \{'user': 'U'\}; must map 'user' and 'assistant'"),
        ({"conv_template": {"roles": {"user": "U", "assistant": "A"}}}, r"field 'conv_template.seps' is missing"),
        ({"conv_template": {"roles": {"user": "U", "assistant": "A"}, "seps": []}}, r"field 'conv_template.seps': got \[\]; expected a list of 1 or 2 strings"),
        ({"conv_template": {"roles": {"user": "U", "assistant": "A"}, "seps": [""], "stop_tokens": [2]}},
         r"field 'conv_template.stop_tokens': got \[2\]; unknown field"),
        ({"conv_template": {"roles": {"user": "U", "assistant": "A"}, "seps": [""], "stop_token_ids": "2"}},
         r"field 'conv_template.stop_token_ids': got '2'; expected a list of token ids"),
        ({"conv_template": {"roles": {"user": "U", "assistant": "A"}, "seps": [""], "add_role_after_system_message": "yes"}},
         r"field 'conv_template.add_role_after_system_message': got 'yes'; expected true or false"),
    ],
)
def test_bad_chat_fields_are_one_line_errors(tmp_path, changes, expected):
    path = write_yaml(tmp_path, **changes)
    with pytest.raises(ConfigError, match=expected) as info:
        load_model_config(str(path))
    assert str(info.value).startswith(str(path)) and "\n" not in str(info.value)


def test_cli_bad_chat_field_exit_2(tmp_path):
    result = mlcpipe("convert-weights", "--model", str(write_yaml(tmp_path, top_p=2)), "--quant", "q0f32",
                     "--source", "synthetic", "--output", str(tmp_path / "w"))
    assert result.returncode == 2 and len(result.stderr.strip().splitlines()) == 1
    assert "field 'top_p': got 2" in result.stderr and not (tmp_path / "w").exists()


# ---- the checks catch what is missing, in one line ------------------------------------------------
def broken_copy(model_dir: Path, tmp_path: Path) -> Path:
    out = tmp_path / "broken"
    shutil.copytree(model_dir, out)
    return out


def edit_config(directory: Path, edit) -> None:
    data = read_config(directory)
    edit(data)
    (directory / "mlc-chat-config.json").write_text(json.dumps(data))


@pytest.mark.parametrize(
    "edit, expected",
    [
        (lambda d: d.pop("temperature"), r"missing field\(s\) 'temperature' \(MLC-LLM / WebLLM require them\)"),
        (lambda d: (d.pop("sliding_window_size"), d.pop("tokenizer_info")), r"missing field\(s\) 'sliding_window_size', 'tokenizer_info'"),
        (lambda d: d["conv_template"].pop("stop_token_ids"), r"missing field\(s\) 'conv_template.stop_token_ids'"),
        (lambda d: d["model_config"].pop("prefill_chunk_size"), r"missing field\(s\) 'model_config.prefill_chunk_size'"),
        (lambda d: d["tokenizer_info"].pop("token_postproc_method"), r"missing field\(s\) 'tokenizer_info.token_postproc_method'"),
        (lambda d: d.__setitem__("conv_template", "llama-3"), r"field 'conv_template': got 'llama-3'; expected an object"),
        (lambda d: d.__setitem__("vocab_size", 0), r"field 'vocab_size': got 0; expected a positive integer"),
    ],
)
def test_check_model_dir_names_missing_field(model_dir, tmp_path, edit, expected):
    broken = broken_copy(model_dir, tmp_path)
    edit_config(broken, edit)
    with pytest.raises(MLCContractError, match=expected) as info:
        check_model_dir(broken)
    assert "\n" not in str(info.value) and str(info.value).startswith(str(broken))


@pytest.mark.parametrize(
    "remove, expected",
    [
        ("mlc-chat-config.json", r"mlc-chat-config.json missing"),
        ("tensor-cache.json", r"tensor-cache.json missing"),
        ("tokenizer.json", r"tokenizer file\(s\) 'tokenizer.json' listed in 'tokenizer_files' are missing"),
        ("params_shard_0.bin", r"weight shard\(s\) 'params_shard_0.bin' named in tensor-cache.json are missing"),
    ],
)
def test_check_model_dir_names_missing_file(model_dir, tmp_path, remove, expected):
    broken = broken_copy(model_dir, tmp_path)
    (broken / remove).unlink()
    with pytest.raises(MLCContractError, match=expected) as info:
        check_model_dir(broken)
    assert "\n" not in str(info.value)
    assert isinstance(info.value, ArtifactError)  # the CLI reports it as a one-line error


def spoiled_library(artifact: Path, tmp_path: Path, old: bytes, new: bytes, functions: list[str] | None = None) -> Path:
    """A copy of `artifact` whose library has `old` replaced by `new` (same length) and whose
    manifest records the new digest (the digest alone no longer tells), optionally other `functions`."""
    import hashlib

    art = Path(shutil.copytree(artifact, tmp_path / "art"))
    data = (art / "lib.so").read_bytes()
    assert len(old) == len(new) and old in data
    data = data.replace(old, new)
    (art / "lib.so").write_bytes(data)
    manifest = json.loads((art / "manifest.json").read_text())
    manifest["files"]["lib.so"] = {"sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}
    if functions is not None:
        manifest["functions"] = functions
    (art / "manifest.json").write_text(json.dumps(manifest))
    return art


def test_check_library_reads_the_library(artifact):
    manifest = check_library(artifact)
    assert set(REQUIRED_FUNCTIONS) <= set(manifest["functions"])


@pytest.mark.parametrize("drop", ["batch_verify", "_metadata", "apply_bitmask_inplace"])
def test_check_library_names_missing_function(artifact, tmp_path, drop):
    """The function list comes from the library's executable, not from the manifest."""
    listed = [f for f in json.loads((artifact / "manifest.json").read_text())["functions"] if f != drop]
    art = spoiled_library(artifact, tmp_path, drop.encode(), drop[:-1].encode() + b"X", functions=listed)
    with pytest.raises(MLCContractError, match=rf"lib\.so: library lacks function\(s\) '{drop}' that MLC-LLM / WebLLM call") as info:
        check_library(art)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("old, new, expected", [
    (b"\x7fELF", b"\x00asm", r"lib\.so: a wasm file; a llvm artifact's library is ELF \(library of another target\?\)"),
    (b'"quantization": "q4f32_1"', b'"quantization": "q4f16_1"', r"lib\.so: built for quantization 'q4f16_1'; the manifest says 'q4f32_1'"),
    (b'"name": "model.norm.weight"', b'"name": "model.norm.weighX"', r"lib\.so: built for another model \('llama': parameter 'model\.norm\.weighX'"),
    (b"batch_decode", b"batch_decodX", r"lib\.so: lacks function\(s\) 'batch_decode' the manifest lists"),
])
def test_a_library_that_is_not_the_manifests_is_refused(artifact, tmp_path, old, new, expected):
    """Its digest updated in the manifest, a library of another target, quantization or model (or
    build) is still refused, in one line, before TVM loads it: mlc-check, run and check alike."""
    from mlcpipe.artifact import read_manifest, verified_library

    art = spoiled_library(artifact, tmp_path, old, new)
    with pytest.raises(ArtifactError, match=expected):
        check_library(art)
    with pytest.raises(ArtifactError, match=expected):
        verified_library(art, read_manifest(art))


def test_check_library_without_library_or_of_junk(artifact, tmp_path):
    import hashlib

    art = Path(shutil.copytree(artifact, tmp_path / "art"))
    (art / "lib.so").write_bytes(b"junk")
    manifest = json.loads((art / "manifest.json").read_text())
    manifest["files"]["lib.so"] = {"sha256": hashlib.sha256(b"junk").hexdigest(), "bytes": 4}
    (art / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ArtifactError, match=r"lib\.so: not a TVM model library \(unknown, 4 bytes: no Relax VM executable in it\)"):
        check_library(art)
    whole = (artifact / "lib.so").read_bytes()
    for cut in (len(whole) - 100, len(whole) // 2):  # a truncated library would crash the loader (SIGBUS)
        (art / "lib.so").write_bytes(whole[:cut])
        manifest["files"]["lib.so"] = {"sha256": hashlib.sha256(whole[:cut]).hexdigest(), "bytes": cut}
        (art / "manifest.json").write_text(json.dumps(manifest))
        with pytest.raises(ArtifactError, match=rf"lib\.so: truncated ELF library: its headers reach byte \d+, the file has {cut}$"):
            check_library(art)
    (art / "lib.so").unlink()
    with pytest.raises(MLCContractError, match=r"library file 'lib.so' missing"):
        check_library(art)
    with pytest.raises(ArtifactError, match=r"not an mlcpipe artifact"):
        check_library(tmp_path)

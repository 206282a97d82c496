"""Hostile inputs: each case is one command on a corrupted, malformed, out-of-range or escaping
input. Every one must end with exit status 2, exactly one `error:` line on stderr naming the
input (file / field / value), and the case's directory unchanged: the input intact, nothing
written. CASES is the table (its length is the count of hostile inputs tried)."""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import resource
import shutil
import struct
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from safetensors.numpy import save_file

from mlcpipe.config import CONFIG_DIR, MODELS_DIR
from mlcpipe.quantization import quantization

from tests.helpers.checkpoints import random_hf_weights, write_hf_checkpoint, write_tiny_tokenizer
from tests.helpers.fs import snapshot

QUANT = "q4f32_1"  # the shared artifact's quantization
CASES: dict[str, tuple] = {}


def case(subprocess_run: bool = False, memory_gb: int | None = None):
    """Register a case: fn(ctx) -> (argv, regex the error line must match). `subprocess_run`:
    run it in its own process (it may crash the interpreter without its fix); `memory_gb`: with
    that address-space limit (a case that could eat the machine without its fix)."""

    def register(fn):
        CASES[fn.__name__] = (fn, subprocess_run or memory_gb is not None, memory_gb)
        return fn

    return register


# ---- shared inputs ------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def shared(tiny_config, tmp_path_factory):
    from mlcpipe.build import build
    from mlcpipe.targets import load_target
    from mlcpipe.weights import convert_weights

    root = tmp_path_factory.mktemp("hostile")
    art = build(tiny_config, quantization(QUANT), load_target("llvm"), output=root / "art", weights="synthetic", log=lambda *_: None)
    hf = write_hf_checkpoint(root / "hf", tiny_config, random_hf_weights(tiny_config, seed=1))
    write_tiny_tokenizer(hf, tiny_config)
    weights = convert_weights(tiny_config, quantization(QUANT), hf, root / "w", log=lambda *_: None)
    return SimpleNamespace(art=art, hf=hf, w=weights, cfg=tiny_config)


class Ctx:
    """A case's own directory, with copies of the shared inputs to spoil."""

    def __init__(self, tmp: Path, shared):
        self.tmp, self.shared = tmp, shared

    def art(self) -> Path:
        return Path(shutil.copytree(self.shared.art, self.tmp / "art", symlinks=True))

    def hf(self) -> Path:
        return Path(shutil.copytree(self.shared.hf, self.tmp / "hf"))

    def weights(self) -> Path:
        return Path(shutil.copytree(self.shared.w, self.tmp / "w"))

    def write(self, name: str, content: str | bytes) -> Path:
        path = self.tmp / name
        path.write_bytes(content.encode() if isinstance(content, str) else content)
        return path

    def model_yaml(self, text: str) -> Path:
        return self.write("model.yaml", (MODELS_DIR / "llama-tiny.yaml").read_text() + text)

    def edit_json(self, path: Path, change) -> Path:
        data = json.loads(path.read_text())
        change(data)
        path.write_text(json.dumps(data))
        return path

    def checkpoint(self, change=None, dtype=np.float32) -> Path:
        """A HF checkpoint of llama-tiny whose weights `change(weights)` spoiled."""
        weights = random_hf_weights(self.shared.cfg, seed=2)
        if change:
            change(weights)
        return write_hf_checkpoint(self.tmp / "hf", self.shared.cfg, weights, dtype=dtype)

    def profile(self, name: str, change=None, **header) -> Path:
        data = valid_profile(**header)
        if change:
            change(data)
        return self.write(name, json.dumps(data))


def valid_profile(model: str = "llama-tiny", quantization: str = QUANT) -> dict:
    steps = [{"mode": "low-overhead", "run": 0, "warmup": False, "phase": "decode", "step": i, "tokens": 1,
              "start_ms": float(i), "ms": 1.0 + 0.01 * i} for i in range(12)]
    samples = [{"kernel": k, "parent": "vm", "phase": "decode", "step": i, "run": 0, "warmup": False, "start_ms": float(i),
                "ms": 0.1 + 0.001 * i} for i in range(12) for k in ("rms_norm", "NT_matmul")]
    return {"schema": "mlcpipe-profile", "version": 1, "model": model, "display_name": model, "quantization": quantization,
            "target": {"kind": "llvm"}, "target_name": "llvm", "device": "cpu", "num_layers": 2,
            "config": {"prompt_len": 4, "gen_len": 12, "runs": 1, "warmup_runs": 0, "seed": 0, "threads": 1},
            "metrics": {"ttft_ms": 2.0, "decode_ms_per_token": {"p50": 1.0, "p95": 1.1}}, "generated_tokens": [],
            "kernels": {"rms_norm": {"role": "norm"}, "NT_matmul": {"role": "qkv"}}, "steps": steps, "samples": samples}


def flip_byte(path: Path, offset: int) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0xFF
    path.write_bytes(bytes(data))


def elf_section(path: Path, wanted: str) -> tuple[int, int]:
    """(file offset, size) of an ELF64 little-endian section, e.g. '.text'."""
    data = path.read_bytes()
    shoff, = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3A)
    sections = [struct.unpack_from("<IIQQQQ", data, shoff + i * shentsize) for i in range(shnum)]
    names_at = sections[shstrndx][4]
    for name, _, _, _, offset, size in sections:
        if data[names_at + name: data.index(b"\0", names_at + name)].decode() == wanted:
            return offset, size
    raise AssertionError(f"{path}: no {wanted} section")


def safetensors_parts(path: Path) -> tuple[dict, bytes]:
    data = path.read_bytes()
    (n,) = struct.unpack_from("<Q", data)
    return json.loads(data[8: 8 + n]), data[8 + n:]


def write_safetensors(path: Path, header, body: bytes) -> None:
    raw = json.dumps(header).encode() if not isinstance(header, bytes) else header
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + body)


def spoil_safetensors(ctx: Ctx, change) -> list[str]:
    """convert-weights of a checkpoint whose model.safetensors header `change(header, body)` spoiled."""
    hf = ctx.checkpoint()
    header, body = safetensors_parts(hf / "model.safetensors")
    result = change(header, body)
    write_safetensors(hf / "model.safetensors", *(result or (header, body)))
    return ["convert-weights", "--model", "llama-tiny", "--quant", QUANT, "--source", str(hf), "--output", str(ctx.tmp / "out")]


def run_args(art: Path, *extra: str) -> list[str]:
    return ["run", "--artifact", str(art), "--prompt-tokens", "1,2,3", "--max-new-tokens", "2", *extra]


PROFILE_SMALL = ["--prompt-len", "4", "--gen-len", "2", "--runs", "1", "--warmup", "0"]
SHA = r"sha256 [0-9a-f]{16}\.\.\. does not match [0-9a-f]{16}\.\.\. recorded in "


# ---- corrupt library / shards: verified against their recorded digests before use ---------------

@case(subprocess_run=True)
def run_shard_with_flipped_byte(ctx):
    art = ctx.art()
    flip_byte(art / "params" / "params_shard_0.bin", 1000)
    return run_args(art), r"params_shard_0\.bin: " + SHA + r".*params/tensor-cache\.json"


@case(subprocess_run=True)
def run_shard_truncated(ctx):
    art = ctx.art()
    shard = art / "params" / "params_shard_0.bin"
    shard.write_bytes(shard.read_bytes()[:-100])
    return run_args(art), r"params_shard_0\.bin: \d+ bytes, .*tensor-cache\.json records \d+"


@case(subprocess_run=True)
def run_mlc_cache_md5_mismatch(ctx):
    """A tensor cache as MLC writes it (md5sum only) is checked against its MD5."""
    weights = ctx.weights()
    ctx.edit_json(weights / "tensor-cache.json", lambda c: [s.pop("sha256", None) for s in c["records"]])
    flip_byte(weights / "params_shard_0.bin", 7)
    return run_args(ctx.art(), "--weights", str(weights)), r"params_shard_0\.bin: md5 [0-9a-f]{16}\.\.\. does not match"


@case(subprocess_run=True)
def run_library_with_flipped_code_byte(ctx):
    art = ctx.art()
    offset, size = elf_section(art / "lib.so", ".text")
    flip_byte(art / "lib.so", offset + size // 2)
    return run_args(art), r"lib\.so: " + SHA + r".*manifest\.json"


@case(subprocess_run=True)
def run_library_with_zeroed_code(ctx):
    art = ctx.art()
    offset, size = elf_section(art / "lib.so", ".text")
    data = bytearray((art / "lib.so").read_bytes())
    data[offset: offset + size] = bytes(size)
    (art / "lib.so").write_bytes(bytes(data))
    return run_args(art), r"lib\.so: " + SHA


@case(subprocess_run=True)
def run_library_of_junk(ctx):
    art = ctx.art()
    (art / "lib.so").write_bytes(np.random.default_rng(0).bytes((art / "lib.so").stat().st_size))
    return run_args(art), r"lib\.so: " + SHA


@case(subprocess_run=True)
def run_runtime_config_edited(ctx):
    art = ctx.art()
    ctx.edit_json(art / "mlc-chat-config.json", lambda c: c.update(prefill_chunk_size=64))
    return run_args(art), r"mlc-chat-config\.json: (sha256 [0-9a-f]{16}\.\.\. does not match|\d+ bytes, .*records \d+)"


@case(subprocess_run=True)
def profile_library_with_zeroed_code(ctx):
    art = ctx.art()
    offset, size = elf_section(art / "lib.so", ".text")
    data = bytearray((art / "lib.so").read_bytes())
    data[offset: offset + size] = bytes(size)
    (art / "lib.so").write_bytes(bytes(data))
    return ["profile", "--artifact", str(art), *PROFILE_SMALL], r"lib\.so: " + SHA


@case(subprocess_run=True)
def profile_shard_with_flipped_byte(ctx):
    art = ctx.art()
    flip_byte(art / "params" / "params_shard_0.bin", 5)
    return ["profile", "--artifact", str(art), "--weights", str(art / "params"), *PROFILE_SMALL], r"params_shard_0\.bin: " + SHA


@case(subprocess_run=True)
def check_library_of_junk(ctx):
    art = ctx.art()
    (art / "lib.so").write_bytes(np.random.default_rng(1).bytes((art / "lib.so").stat().st_size))
    return ["check", "--artifact", str(art), "--kernels", "rms_norm"], r"lib\.so: " + SHA


@case(subprocess_run=True)
def check_library_truncated(ctx):
    art = ctx.art()
    (art / "lib.so").write_bytes((art / "lib.so").read_bytes()[:4096])
    return ["check", "--artifact", str(art), "--kernels", "rms_norm"], r"lib\.so: 4096 bytes, .*manifest\.json records \d+"


def _library_with_its_digest(ctx, change) -> Path:
    """A copy of the artifact whose lib.so `change(bytes)` replaced, the manifest's digest updated to match."""
    art = ctx.art()
    data = change((art / "lib.so").read_bytes())
    (art / "lib.so").write_bytes(data)
    ctx.edit_json(art / "manifest.json", lambda m: m["files"].update({"lib.so": {"sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}}))
    return art


@case(subprocess_run=True)
def mlc_check_library_of_junk_with_its_digest(ctx):
    art = _library_with_its_digest(ctx, lambda data: b"junk")
    return ["mlc-check", "--artifact", str(art)], r"lib\.so: not a TVM model library \(unknown, 4 bytes"


@case(subprocess_run=True)
def run_library_truncated_with_its_digest(ctx):
    art = _library_with_its_digest(ctx, lambda data: data[: len(data) * 3 // 4])
    return run_args(art), r"lib\.so: truncated ELF library: its headers reach byte \d+"


@case(subprocess_run=True)
def check_library_of_another_quantization(ctx):
    art = _library_with_its_digest(ctx, lambda data: data.replace(b'"quantization": "q4f32_1"', b'"quantization": "q0f32__"'))
    return ["check", "--artifact", str(art), "--kernels", "rms_norm"], r"lib\.so: built for quantization 'q0f32__'; the manifest says 'q4f32_1'"


@case()
def check_sizes_beyond_memory(ctx):
    return (["check", "--artifact", str(ctx.shared.art), "--sizes", "1,100000000"],
            r"--sizes 1,100000000: kernel \S+ at 100000000 tokens needs [\d.]+ GiB of inputs and copies; this machine has [\d.]+ GiB available")


@case()
def check_sizes_past_the_context_window(ctx):
    return (["check", "--artifact", str(ctx.shared.art), "--sizes", "1,100000"],
            r"--sizes 1,100000: 100000 tokens is past the context window of \S+ \(256 tokens\): its kernels never see that many")


@case(subprocess_run=True)
def run_with_tvm_num_threads_not_a_number(ctx):
    return [{"TVM_NUM_THREADS": "abc"}, "run", "--artifact", str(ctx.shared.art), "--weights", "synthetic", "--prompt-tokens", "1,2"], \
        r"environment TVM_NUM_THREADS='abc': expected a number of threads from 1 to \d+ "


@case(subprocess_run=True)
def build_with_tuning_db_env_naming_no_file(ctx):
    """$MLCPIPE_TUNING_DB with a typo: the build was untuned without a word (--tuning-db is checked)."""
    return ([{"MLCPIPE_TUNING_DB": str(ctx.tmp / "tunning.json")}, "build", "--model", "llama-tiny", "--quant", QUANT,
             "--output", str(ctx.tmp / "out")], r"environment MLCPIPE_TUNING_DB='.*tunning\.json': no such file")


@case(subprocess_run=True)
def build_with_configs_env_naming_no_folder(ctx):
    """$MLCPIPE_CONFIGS with a typo: was "--model 'llama-tiny': no such config in .../models; available: []"."""
    return ([{"MLCPIPE_CONFIGS": str(ctx.tmp / "confgs")}, "build", "--model", "llama-tiny", "--quant", QUANT, "--output", str(ctx.tmp / "out")],
            r"environment MLCPIPE_CONFIGS='.*confgs': expected a folder holding models/ and targets/ \(it replaces mlcpipe's configs/\), or unset it")


@case(subprocess_run=True)
def build_with_a_preset_peak_gbps_not_a_number(ctx):
    """An edited preset: was "could not convert string to float: 'fast'" (no file, no field); -5 was taken."""
    configs = Path(shutil.copytree(CONFIG_DIR, ctx.tmp / "configs"))
    preset = configs / "targets" / "llvm.yaml"
    preset.write_text(re.sub(r"(?m)^peak_gbps: .*$", "peak_gbps: fast", preset.read_text()))
    return ([{"MLCPIPE_CONFIGS": str(configs)}, "build", "--model", "llama-tiny", "--quant", QUANT, "--output", str(ctx.tmp / "out")],
            r"llvm\.yaml: field 'peak_gbps': got 'fast'; expected a number of GB/s > 0")


@case(subprocess_run=True)
def build_metal_with_source_date_epoch_not_a_number(ctx):
    """It was read as 0: a 'reproducible' library under another date than the one set."""
    return ([{"SOURCE_DATE_EPOCH": "yesterday"}, "build", "--model", "llama-tiny", "--quant", QUANT, "--target", "metal",
             "--output", str(ctx.tmp / "out")], r"environment SOURCE_DATE_EPOCH='yesterday': expected seconds since 1970")


@case(subprocess_run=True)
def build_webgpu_with_cache_dir_a_file(ctx):
    return ([{"MLCPIPE_CACHE_DIR": str(ctx.write("cache", "a file"))}, "build", "--model", "llama-tiny", "--quant", QUANT,
             "--target", "webgpu", "--output", str(ctx.tmp / "out")], r"environment MLCPIPE_CACHE_DIR='.*cache': not a directory")


@case()
def yaml_duplicate_key(ctx):
    path = ctx.model_yaml("vocab_size: 1024\n")
    return _build_yaml(ctx, path), r"key 'vocab_size' appears twice \(first on line \d+\); a key may appear once"


@case()
def yaml_vocab_size_beyond_any_model(ctx):
    path = ctx.write("model.yaml", (MODELS_DIR / "llama-tiny.yaml").read_text().replace("vocab_size: 512", "vocab_size: 1000000000000"))
    return _build_yaml(ctx, path), r"field 'vocab_size': got 1000000000000; expected a positive integer <= 4194304"


@case()
def check_reference_record_edited(ctx):
    art = ctx.art()
    (art / "reference" / "kernels.json").write_text((art / "reference" / "kernels.json").read_text() + " ")
    return ["check", "--artifact", str(art), "--kernels", "rms_norm"], r"reference/kernels\.json: .*bytes, .*manifest\.json records"


@case(subprocess_run=True)
def check_reference_library_of_junk(ctx):
    art = ctx.art()
    library = art / "reference" / "kernels.so"
    library.write_bytes(np.random.default_rng(2).bytes(library.stat().st_size))
    return ["check", "--artifact", str(art), "--kernels", "rms_norm"], r"reference/kernels\.so: " + SHA


# ---- check that would run nothing; its flags ----------------------------------------------------

@case()
def check_kernels_matching_only_skipped_kernels(ctx):
    return (["check", "--artifact", str(ctx.art()), "--kernels", "tree_attn"],
            r"--kernels 'tree_attn': matches only kernels check skips \(batch_tree_attn.*\): no kernel would run")


@case()
def check_kernels_not_a_regex(ctx):
    return ["check", "--artifact", str(ctx.art()), "--kernels", "("], r"--kernels '\(': not a regular expression \(missing \)"


@case()
def check_sizes_empty(ctx):
    return ["check", "--artifact", str(ctx.art()), "--sizes", " , "], r"--sizes ' , ': expected comma-separated token counts >= 1"


@case()
def check_sizes_not_numbers(ctx):
    return ["check", "--artifact", str(ctx.art()), "--sizes", "a,b"], r"--sizes 'a,b': expected comma-separated token counts"


@case()
def tune_kernels_not_a_regex(ctx):
    return (["tune", "--model", "llama-tiny", "--quant", QUANT, "--kernels", "[", "--db", str(ctx.tmp / "db.json")],
            r"--kernels '\[': not a regular expression")


# ---- paths read from tensor-cache.json / manifests stay inside their directory ------------------

@case()
def run_cache_path_climbing_out(ctx):
    art = ctx.art()
    ctx.edit_json(art / "params" / "tensor-cache.json", lambda c: c["records"][0].update(dataPath="../../../../etc/passwd"))
    return run_args(art), r"tensor-cache\.json: field 'records\[0\]\.dataPath': got '\.\./\.\./\.\./\.\./etc/passwd'; a path must stay inside"


@case()
def run_cache_path_absolute(ctx):
    art = ctx.art()
    ctx.edit_json(art / "params" / "tensor-cache.json", lambda c: c["records"][0].update(dataPath="/etc/passwd"))
    return run_args(art), r"field 'records\[0\]\.dataPath': got '/etc/passwd'; a path must stay inside"


@case()
def run_shard_symlink_out_of_the_directory(ctx):
    """The shard is the right bytes, but lives outside the weights directory (a symlink)."""
    art = ctx.art()
    shard = art / "params" / "params_shard_0.bin"
    shutil.move(shard, ctx.tmp / "elsewhere.bin")
    shard.symlink_to(ctx.tmp / "elsewhere.bin")
    return run_args(art), r"field 'records\[0\]\.dataPath': got 'params_shard_0\.bin'; it resolves to .*elsewhere\.bin, outside"


@case()
def run_manifest_library_out_of_the_artifact(ctx):
    """The manifest names a library outside the artifact (its recorded digest forged to match)."""
    art = ctx.art()
    shutil.copyfile(art / "lib.so", ctx.tmp / "other.so")

    def forge(m):
        m["library"] = "../other.so"
        m["files"]["../other.so"] = m["files"]["lib.so"]
    ctx.edit_json(art / "manifest.json", forge)
    return run_args(art), r"manifest\.json: field 'library': got '\.\./other\.so'; a path must stay inside"


@case()
def mlc_check_cache_path_climbing_out(ctx):
    weights = ctx.weights()
    ctx.edit_json(weights / "tensor-cache.json", lambda c: c["records"][0].update(dataPath="../../../../../etc/passwd"))
    return ["mlc-check", "--model-dir", str(weights)], r"field 'records\[0\]\.dataPath': got '\.\./\.\./\.\./\.\./\.\./etc/passwd'"


@case()
def mlc_check_tokenizer_file_climbing_out(ctx):
    weights = ctx.weights()
    ctx.edit_json(weights / "mlc-chat-config.json", lambda c: c["tokenizer_files"].append("../../../../../etc/passwd"))
    return ["mlc-check", "--model-dir", str(weights)], r"field 'tokenizer_files': got '\.\./\.\./\.\./\.\./\.\./etc/passwd'"


# ---- manifests ------------------------------------------------------------------------------------

@case()
def run_artifact_built_without_weights(ctx):  # was: "--weights ART/params: tensor-cache.json missing", a flag never given
    art = ctx.art()
    shutil.rmtree(art / "params")
    return run_args(art), r"art: built without weights \(no params/tensor-cache\.json\): pass --weights DIR .* or --weights synthetic"


@case()
def run_manifest_empty_object(ctx):
    art = ctx.art()
    (art / "manifest.json").write_text("{}")
    return run_args(art), r"manifest\.json: field 'model' is missing"


@case()
def run_manifest_of_another_format(ctx):
    """An artifact of a newer mlcpipe (its manifest's format) was read as this one's."""
    art = ctx.art()
    manifest = json.loads((art / "manifest.json").read_text())
    (art / "manifest.json").write_text(json.dumps({**manifest, "format": "mlcpipe-artifact/2"}))
    return run_args(art), r"manifest\.json: field 'format': got 'mlcpipe-artifact/2'; this mlcpipe reads mlcpipe-artifact/1 \(rebuild the artifact with it\)"


@case()
def check_manifest_a_list(ctx):
    art = ctx.art()
    (art / "manifest.json").write_text("[]")
    return ["check", "--artifact", str(art)], r"manifest\.json: corrupt manifest: expected a JSON object, got list"


@case()
def run_manifest_parameters_not_a_list(ctx):
    art = ctx.art()
    ctx.edit_json(art / "manifest.json", lambda m: m.update(parameters="all of them"))
    return run_args(art), r"manifest\.json: field 'parameters': got 'all of them'; expected a list"


@case()
def run_manifest_without_digests(ctx):
    art = ctx.art()
    ctx.edit_json(art / "manifest.json", lambda m: m.pop("files"))
    return run_args(art), r"manifest\.json: field 'files' is missing"


# ---- checkpoint numbers: finite, within the target dtype ---------------------------------------

def _convert(ctx, hf: Path, quant: str = QUANT) -> list[str]:
    return ["convert-weights", "--model", "llama-tiny", "--quant", quant, "--source", str(hf), "--output", str(ctx.tmp / "out")]


@case()
def convert_nan_weight(ctx):
    hf = ctx.checkpoint(lambda w: w["model.layers.0.mlp.down_proj.weight"].__setitem__((3, 5), np.nan))
    return _convert(ctx, hf), r"model\.safetensors: tensor 'model\.layers\.0\.mlp\.down_proj\.weight': 1 NaN and 0 Inf values of 32768"


@case()
def convert_inf_weight_in_f16_checkpoint(ctx):
    hf = ctx.checkpoint(lambda w: w["model.embed_tokens.weight"].__setitem__((0, 0), -np.inf), dtype=np.float16)
    return _convert(ctx, hf, "q0f16"), r"tensor 'model\.embed_tokens\.weight': 0 NaN and 1 Inf values of 65536"


@case()
def convert_q4f16_weight_beyond_f16(ctx):
    hf = ctx.checkpoint(lambda w: w["model.layers.1.self_attn.o_proj.weight"].__setitem__((0, 1), 1e5))
    return (_convert(ctx, hf, "q4f16_1"),
            r"tensor 'model\.layers\.1\.self_attn\.o_proj\.weight': max \|value\| 100000 \(1 values above 65504\); "
            r"q4f16_1 stores float16 \(allowed: \|value\| <= 65504\)")


@case()
def convert_q0f16_norm_beyond_f16(ctx):
    hf = ctx.checkpoint(lambda w: w["model.norm.weight"].__setitem__(3, -7e4))
    return _convert(ctx, hf, "q0f16"), r"tensor 'model\.norm\.weight': max \|value\| 70000 .*allowed: \|value\| <= 65504"


@case()
def convert_q4f16_scale_rounding_past_f16(ctx):
    """65500 fits float16, but its group's scale 65500 / 7 rounds up to 9360, and 7 * 9360 does not."""
    hf = ctx.checkpoint(lambda w: w["model.layers.0.mlp.up_proj.weight"].__setitem__((2, 2), 65500.0))
    return _convert(ctx, hf, "q4f16_1"), r"parameter 'model\.layers\.0\.mlp\.gate_up_proj\.q_scale' is not finite in float16"


# ---- malformed safetensors ------------------------------------------------------------------------

def _sharded(ctx, change=None, shards: int = 2) -> Path:
    weights = random_hf_weights(ctx.shared.cfg, seed=2)
    if change:
        change(weights)
    return write_hf_checkpoint(ctx.tmp / "hf", ctx.shared.cfg, weights, shards=shards)


@case()
def convert_index_naming_a_missing_shard(ctx):
    hf = _sharded(ctx)
    (hf / "model-00002-of-00002.safetensors").unlink()
    return _convert(ctx, hf), r"model\.safetensors\.index\.json: shard 'model-00002-of-00002\.safetensors' is missing \(\d+ tensors need it"


@case()
def convert_index_naming_the_wrong_shard(ctx):
    hf = _sharded(ctx)
    ctx.edit_json(hf / "model.safetensors.index.json", lambda d: d["weight_map"].update({"model.norm.weight": "model-00001-of-00002.safetensors"}))
    return _convert(ctx, hf), r"index\.json: tensor 'model\.norm\.weight' is not in 'model-00001-of-00002\.safetensors', the shard it names"


@case()
def convert_index_climbing_out(ctx):
    hf = _sharded(ctx)
    ctx.edit_json(hf / "model.safetensors.index.json", lambda d: d["weight_map"].update({"model.norm.weight": "../x.safetensors"}))
    return _convert(ctx, hf), r"index\.json: field 'weight_map\.model\.norm\.weight': got '\.\./x\.safetensors'; expected a \*\.safetensors file name"


@case()
def convert_tensor_in_two_files_without_index(ctx):
    hf = ctx.checkpoint()
    save_file({"model.norm.weight": np.ones(ctx.shared.cfg.hidden_size, np.float32)}, str(hf / "model-stale.safetensors"))
    return _convert(ctx, hf), r"tensor 'model\.norm\.weight' is in both 'model-stale\.safetensors' and 'model\.safetensors' \(no model\.safetensors\.index\.json"


@case()
def convert_checkpoint_of_pytorch_pickles(ctx):  # was: "no *.safetensors files", not a word on what was there
    hf = ctx.checkpoint()
    (hf / "model.safetensors").rename(hf / "pytorch_model.bin")
    return _convert(ctx, hf), r"hf: no \*\.safetensors files \(found pytorch_model\.bin: PyTorch pickles and GGUF are not read; save the checkpoint as safetensors"


@case()
def convert_checkpoint_with_an_extra_layer(ctx):
    layers = ctx.shared.cfg.num_hidden_layers

    def extra(w):
        for name in [n for n in w if n.startswith("model.layers.0.")]:
            w[name.replace("model.layers.0.", f"model.layers.{layers}.")] = w[name].copy()
    hf = ctx.checkpoint(extra)
    return _convert(ctx, hf), rf"\d+ tensors the model \(llama-tiny, {layers} layers\) does not use: 'model\.layers\.{layers}\..*--allow-unused"


@case()
def safetensors_empty_file(ctx):
    hf = ctx.checkpoint()
    (hf / "model.safetensors").write_bytes(b"")
    return _convert(ctx, hf), r"model\.safetensors: truncated safetensors file \(0 bytes"


@case()
def safetensors_header_length_2_pow_62(ctx):
    hf = ctx.checkpoint()
    data = (hf / "model.safetensors").read_bytes()
    (hf / "model.safetensors").write_bytes(struct.pack("<Q", 2**62) + data[8:])
    return _convert(ctx, hf), r"model\.safetensors: corrupt safetensors header: length 4611686018427387904 bytes"


@case()
def safetensors_header_not_utf8(ctx):
    return spoil_safetensors(ctx, lambda h, b: (b"\xff\xfe{}", b"")), r"model\.safetensors: corrupt safetensors header: not UTF-8"


@case()
def safetensors_header_a_list(ctx):
    return spoil_safetensors(ctx, lambda h, b: ([1, 2], b"")), r"model\.safetensors: corrupt safetensors header: expected a JSON object, got list"


@case()
def safetensors_offsets_reversed(ctx):
    def change(h, b):
        info = h["model.norm.weight"]
        info["data_offsets"] = info["data_offsets"][::-1]
    return spoil_safetensors(ctx, change), r"tensor 'model\.norm\.weight': data_offsets \[\d+, \d+\] outside the \d+ data bytes"


@case()
def safetensors_offsets_overlapping(ctx):
    """gate_proj's header points at up_proj's bytes (same shape): both would read one tensor."""
    def change(h, b):
        h["model.layers.0.mlp.gate_proj.weight"]["data_offsets"] = h["model.layers.0.mlp.up_proj.weight"]["data_offsets"]
    return spoil_safetensors(ctx, change), r"model\.safetensors: tensor 'model\.layers\.0\.mlp\.(gate|up)_proj\.weight': data_offsets .* overlaps"


@case()
def safetensors_offsets_past_the_data(ctx):
    def change(h, b):
        start, end = h["model.norm.weight"]["data_offsets"]
        h["model.norm.weight"]["data_offsets"] = [start + len(b), end + len(b)]
    return spoil_safetensors(ctx, change), r"tensor 'model\.norm\.weight': data_offsets .* outside the \d+ data bytes"


@case()
def safetensors_shape_larger_than_its_bytes(ctx):
    return (spoil_safetensors(ctx, lambda h, b: h["model.norm.weight"].update(shape=[256])),
            r"tensor 'model\.norm\.weight': data_offsets \[\d+, \d+\] hold 512 bytes; shape \[256\] F32 needs 1024")


@case()
def safetensors_data_truncated(ctx):
    return spoil_safetensors(ctx, lambda h, b: (h, b[:-4096])), r"model\.safetensors: tensor '.*': data_offsets .* outside the \d+ data bytes"


@case()
def import_config_name_blank(ctx):  # was: an empty --name fell back to the file's stem without a word ('' is now a usage error)
    return (["import-config", str(ctx.checkpoint()), "-o", str(ctx.tmp / "model.yaml"), "--name", " "],
            r"model\.yaml: field 'name': got ' '; expected a name of letters, digits")


@case()
def hf_config_a_list(ctx):
    hf = ctx.checkpoint()
    (hf / "config.json").write_text("[1, 2]")
    return _convert(ctx, hf), r"config\.json: expected a JSON object at top level, got list"


@case()
def hf_config_not_json(ctx):
    hf = ctx.checkpoint()
    (hf / "config.json").write_text('{"hidden_size": 128,')
    return _convert(ctx, hf), r"config\.json: corrupt Hugging Face config: "


@case()
def hf_config_number_as_text(ctx):
    hf = ctx.checkpoint()
    ctx.edit_json(hf / "config.json", lambda c: c.update(rms_norm_eps="tiny"))
    return _convert(ctx, hf), r"config\.json: field 'rms_norm_eps': got 'tiny'; expected a positive number"


# ---- tokenizer.json ------------------------------------------------------------------------------

@case()
def run_prompt_with_truncated_tokenizer(ctx):
    text = (ctx.shared.hf / "tokenizer.json").read_text()
    tok = ctx.write("tokenizer.json", text[: len(text) // 2])
    return (run_args(ctx.art())[:3] + ["--prompt", "hello", "--tokenizer", str(tok)],
            r"tokenizer\.json: corrupt tokenizer\.json \(the `tokenizers` package cannot read it: ")


@case()
def run_prompt_with_tokenizer_a_list(ctx):
    tok = ctx.write("tokenizer.json", "[]")
    return run_args(ctx.art())[:3] + ["--prompt", "hello", "--tokenizer", str(tok)], r"tokenizer\.json: corrupt tokenizer\.json"


@case()
def convert_with_a_tokenizer_that_is_not_one(ctx):
    hf = ctx.checkpoint()
    (hf / "tokenizer.json").write_text(json.dumps({"model": {"type": "Nonsense"}}))
    return _convert(ctx, hf), r"hf/tokenizer\.json: corrupt tokenizer\.json \(the `tokenizers` package cannot read it"


# ---- tuning database ------------------------------------------------------------------------------

def _tuning_db(ctx, records_of_target) -> list[str]:
    from mlcpipe.targets import load_target
    from mlcpipe.tuning import target_key

    key = target_key(load_target("llvm").target)
    db = ctx.write("db.json", json.dumps({"schema": "mlcpipe-tuning", "version": 1, "records": {key: records_of_target}}))
    return ["build", "--model", "llama-tiny", "--quant", QUANT, "--tuning-db", str(db), "--output", str(ctx.tmp / "out")]


@case()
def tuning_db_table_a_list(ctx):
    return _tuning_db(ctx, []), r"db\.json: field 'records\..*': got \[\]; expected an object"


@case()
def tuning_db_unknown_knob(ctx):
    return (_tuning_db(ctx, {"sig": {"rule": "RowNorm", "knobs": {"lanez": 8}}}),
            r"db\.json: record sig of target .*: knob 'lanez' is not a knob of RowNorm; allowed: \['lanes', 'min_rows_parallel'\]")


@case()
def tuning_db_knob_as_text(ctx):
    return (_tuning_db(ctx, {"sig": {"rule": "RowNorm", "knobs": {"lanes": "16"}}}),
            r"db\.json: record sig of target .*: knob lanes: got '16'; expected an integer >= 0")


@case()
def tuning_db_unknown_rule(ctx):
    return _tuning_db(ctx, {"sig": {"rule": "FastestEver", "knobs": {}}}), r"db\.json: record sig .*: rule 'FastestEver' unknown; allowed on llvm: "


@case()
def tuning_db_tuned_for_another_cpu(ctx):
    """Was: built untuned without a word (its records are keyed by another mcpu: tuned on another machine)."""
    db = ctx.write("db.json", json.dumps({"schema": "mlcpipe-tuning", "version": 1,
                                          "records": {'{"kind":"llvm","mcpu":"bdver4"}': {"sig": {"rule": "RowNorm", "knobs": {"lanes": 8}}}}}))
    return (["build", "--model", "llama-tiny", "--quant", QUANT, "--tuning-db", str(db), "--output", str(ctx.tmp / "out")],
            r"--tuning-db .*db\.json: no records for this build's target \{\"kind\":\"llvm\",\"mcpu\":\"[\w.-]+\"\}; "
            r"it holds \{\"kind\":\"llvm\",\"mcpu\":\"bdver4\"\} \(tune this target with `mlcpipe tune`, or build for one of those\)")


@case()
def tuning_db_not_utf8(ctx):
    db = ctx.write("db.json", b'{"schema": "\xff"}')
    return (["build", "--model", "llama-tiny", "--quant", QUANT, "--tuning-db", str(db), "--output", str(ctx.tmp / "out")],
            r"db\.json: not a tuning database \(.*utf-8")


# ---- profiles ---------------------------------------------------------------------------------------

def _compare(ctx, change=None, **header) -> list[str]:
    return ["profile", "compare", str(ctx.profile("a.json")), str(ctx.profile("b.json", change, **header))]


@case()
def compare_samples_not_a_list(ctx):
    return _compare(ctx, lambda p: p.update(samples={})), r"b\.json: field 'samples': got \{\}; expected a list"


@case()
def compare_sample_duration_as_text(ctx):
    return _compare(ctx, lambda p: p["samples"][3].update(ms="fast")), r"b\.json: field 'samples\[3\]\.ms': got 'fast'; expected a finite number"


@case()
def compare_sample_duration_nan(ctx):
    return _compare(ctx, lambda p: p["samples"][0].update(ms=math.nan)), r"b\.json: field 'samples\[0\]\.ms': got nan"


@case()
def render_peak_gbps_negative(ctx):
    path = ctx.profile("p.json", lambda p: p.update(peak_gbps=-5))
    return ["profile", "render", str(path)], r"p\.json: field 'peak_gbps': got -5; expected a positive finite number or null"


@case()
def render_peak_gbps_as_text(ctx):
    path = ctx.profile("p.json", lambda p: p.update(peak_gbps="fast"))
    return ["profile", "render", str(path)], r"p\.json: field 'peak_gbps': got 'fast'"


@case()
def compare_sample_without_kernel(ctx):
    return _compare(ctx, lambda p: p["samples"][5].pop("kernel")), r"b\.json: field 'samples\[5\]\.kernel' is missing"


@case()
def compare_step_not_an_object(ctx):
    return _compare(ctx, lambda p: p["steps"].append(7)), r"b\.json: field 'steps\[12\]': got 7; expected an object"


@case()
def compare_decode_percentiles_a_list(ctx):
    return (_compare(ctx, lambda p: p["metrics"].update(decode_ms_per_token=[1, 2])),
            r"b\.json: field 'metrics\.decode_ms_per_token': got \[1, 2\]")


@case()
def compare_different_models(ctx):
    return _compare(ctx, model="llama-3.2-1b"), r"a\.json and .*b\.json: different model \('llama-tiny' vs 'llama-3\.2-1b'\).*--allow-different"


@case()
def compare_different_quantizations(ctx):
    return _compare(ctx, quantization="q0f16"), r"different quantization \('q4f32_1' vs 'q0f16'\)"


@case()
def compare_output_is_a_directory(ctx):
    (ctx.tmp / "reports").mkdir()
    return _compare(ctx) + ["-o", str(ctx.tmp / "reports")], r"-o .*reports: is a directory; give a file name such as"


@case()
def render_output_is_a_directory(ctx):
    (ctx.tmp / "reports").mkdir()
    return ["profile", "render", str(ctx.profile("a.json")), "-o", str(ctx.tmp / "reports")], r"-o .*reports: is a directory"


@case()
def profile_output_is_a_directory(ctx):
    art = ctx.art()
    (ctx.tmp / "reports").mkdir()
    return ["profile", "--artifact", str(art), *PROFILE_SMALL, "-o", str(ctx.tmp / "reports")], r"-o .*reports: is a directory"


@case()
def profile_output_is_the_artifact_directory(ctx):  # was: "is a directory; give a file name such as <art>/report.md"
    art = ctx.art()
    return ["profile", "--artifact", str(art), *PROFILE_SMALL, "-o", str(art)], r"-o .*art: is inside the input --artifact .*art; write the output elsewhere$"


@case()
def save_logits_is_the_artifact_directory(ctx):
    art = ctx.art()
    return run_args(art, "--save-logits", str(art)), r"--save-logits .*art: is inside the input --artifact .*art; write the output elsewhere$"


@case()
def compare_output_is_its_input(ctx):
    argv = _compare(ctx)
    return argv + ["-o", argv[2]], r"-o .*a\.json: is the input BEFORE .*a\.json; write the output elsewhere"


@case()
def render_output_is_its_input(ctx):
    path = str(ctx.profile("a.json"))
    return ["profile", "render", path, "-o", path], r"-o .*a\.json: is the input PROFILE_JSON"


@case()
def profile_report_and_json_on_one_path(ctx):
    art = ctx.art()
    out = str(ctx.tmp / "p.json")
    return (["profile", "--artifact", str(art), *PROFILE_SMALL, "-o", out, "--save-json", out],
            r"--save-json .*p\.json: is also -o's output; give each output its own file")


@case()
def save_logits_over_the_artifacts_library(ctx):
    art = ctx.art()
    return run_args(art, "--save-logits", str(art / "lib.so")), r"--save-logits .*lib\.so: is inside the input --artifact .*art"


@case()
def profile_json_over_the_artifacts_manifest(ctx):
    art = ctx.art()
    return (["profile", "--artifact", str(art), *PROFILE_SMALL, "--save-json", str(art / "manifest.json")],
            r"--save-json .*manifest\.json: is inside the input --artifact .*art")


@case()
def save_logits_into_the_weights_directory(ctx):
    art, weights = ctx.art(), ctx.weights()
    shard = sorted(weights.glob("params_shard_*.bin"))[0]
    return (run_args(art, "--weights", str(weights), "--save-logits", str(shard)),
            r"--save-logits .*params_shard_0\.bin: is inside the input --weights .*w")


@case()
def save_logits_over_the_tokenizer(ctx):
    art, tokenizer = ctx.art(), ctx.tmp / "tokenizer.json"
    shutil.copy(ctx.shared.hf / "tokenizer.json", tokenizer)
    return (run_args(art, "--tokenizer", str(tokenizer), "--save-logits", str(tokenizer)),
            r"--save-logits .*tokenizer\.json: is the input --tokenizer .*tokenizer\.json; write the output elsewhere")


# ---- YAML ------------------------------------------------------------------------------------------

def _build_yaml(ctx, path: Path) -> list[str]:
    return ["build", "--model", str(path), "--quant", QUANT, "--output", str(ctx.tmp / "out")]


@case(memory_gb=4)
def yaml_billion_laughs(ctx):
    """~600 bytes that expand to 10^9 strings once anything walks the value (here str(display_name))."""
    lines = ["  - &l0 [lol, lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
    lines += [f"  - &l{i} [{', '.join([f'*l{i - 1}'] * 10)}]" for i in range(1, 10)]
    text = (MODELS_DIR / "llama-tiny.yaml").read_text().replace("display_name: Llama Tiny", "display_name:\n" + "\n".join(lines))
    return _build_yaml(ctx, ctx.write("bomb.yaml", text)), r"bomb\.yaml: invalid YAML \(line \d+, column \d+\): alias '\*l0' not allowed"


@case()
def yaml_alias(ctx):
    text = (MODELS_DIR / "llama-tiny.yaml").read_text().replace("name: llama-tiny", "name: &n llama-tiny").replace(
        "display_name: Llama Tiny", "display_name: *n")
    return _build_yaml(ctx, ctx.write("alias.yaml", text)), r"alias\.yaml: invalid YAML \(line \d+, column \d+\): alias '\*n' not allowed"


@case()
def yaml_of_2_mib(ctx):
    path = ctx.model_yaml("bogus: " + "x" * (2 << 20) + "\n")
    return _build_yaml(ctx, path), r"model\.yaml: \d+ bytes; a model config file may have at most 1048576 bytes"


@case()
def yaml_huge_value_quoted_short(ctx):
    path = ctx.model_yaml("bogus: " + "x" * 900_000 + "\n")
    return _build_yaml(ctx, path), r"model\.yaml: field 'bogus': got 'xxxx+\.\.\.\(cut\); unknown field"


@case()
def yaml_not_utf8(ctx):
    return _build_yaml(ctx, ctx.write("model.yaml", b"name: \xff\xfe\n")), r"model\.yaml: invalid YAML: not UTF-8 text"


@case()
def yaml_nested_too_deeply(ctx):
    return _build_yaml(ctx, ctx.write("model.yaml", "name: " + "[" * 100_000 + "\n")), r"model\.yaml: invalid YAML"


@case()
def yaml_keys_of_mixed_types(ctx):
    return _build_yaml(ctx, ctx.model_yaml("1: one\nzz: two\n")), r"model\.yaml: field '1': got 'one'; unknown field"


@case()
def tune_kernels_matching_nothing(ctx):  # was: "0 kernels tuned", exit 0 (check refused the same typo)
    return (["tune", "--model", "llama-tiny", "--quant", "q4f16_1", "--kernels", "rms_nrom", "--db", str(ctx.tmp / "db.json")],
            r"^error: --kernels 'rms_nrom': matches none of the \d+ kernels of llama-tiny q4f16_1$")


@case()
def tune_kernels_with_nothing_to_tune(ctx):  # was: "0 kernels tuned", exit 0, and an empty database written
    return (["tune", "--model", "llama-tiny", "--quant", "q4f16_1", "--kernels", "^rms_norm", "--db", str(ctx.tmp / "db.json")],
            r"^error: --kernels '\^rms_norm': the 2 kernels of llama-tiny q4f16_1 \(rms_norm, rms_norm1\): nothing to tune "
            r"\(no llvm rule with knobs takes them")


# ---- CUDA archs, checked before nvcc runs ------------------------------------------------------------

@case()
def build_cuda_arch_sm_12(ctx):
    return (["build", "--model", "llama-tiny", "--quant", "q4f16_1", "--target", "cuda", "--arch", "sm_12", "--output", str(ctx.tmp / "out")],
            r"--arch 'sm_12': not an arch nvcc compiles for; allowed: .*sm_80.*sm_90")


@case()
def build_llvm_with_a_cuda_arch(ctx):  # was: TVM's rejection, its whole list of llvm options
    return (["build", "--model", "llama-tiny", "--quant", "q4f16_1", "--arch", "sm_90", "--output", str(ctx.tmp / "out")],
            r"^error: --target llvm: 'arch' \(--arch\) applies to cuda targets only, not llvm$")


@case()
def build_cuda_with_an_mcpu(ctx):  # was: built, with 'mcpu' taken as an attribute of the cuda target
    return (["build", "--model", "llama-tiny", "--quant", "q4f16_1", "--target", "cuda", "--mcpu", "znver3", "--output", str(ctx.tmp / "out")],
            r"^error: --target cuda: 'mcpu' \(--mcpu\) applies to llvm targets only, not cuda$")


@case()
def tune_cuda_with_an_mcpu(ctx):
    return (["tune", "--model", "llama-tiny", "--quant", "q4f16_1", "--target", "cuda", "--mcpu", "haswell", "--db", str(ctx.tmp / "db.json")],
            r"^error: --target cuda: 'mcpu' \(--mcpu\) applies to llvm targets only, not cuda$")


@case()
def build_cuda_fatbin_arch_junk(ctx):
    return (["build", "--model", "llama-tiny", "--quant", "q4f16_1", "--target", "cuda", "--fatbin-archs", "sm_80,sm_9o",
             "--output", str(ctx.tmp / "out")], r"--fatbin-archs 'sm_9o': not an arch nvcc compiles for")


@case()
def build_cuda_fatbin_archs_not_archs(ctx):  # was: blamed configs/targets/cuda.yaml for the flag's value
    return (["build", "--model", "llama-tiny", "--quant", "q4f16_1", "--target", "cuda", "--fatbin-archs", "sm_90,foo",
             "--output", str(ctx.tmp / "out")], r"^error: --fatbin-archs: got \['sm_90', 'foo'\]; expected a list of sm_XY archs")


@case(subprocess_run=True)
def build_llvm_32_bit_cpu(ctx):  # was: LLVM aborted the process at code generation (exit 1)
    return (["build", "--model", "llama-tiny", "--quant", "q4f16_1", "--mcpu", "pentium4", "--output", str(ctx.tmp / "out")],
            r"^error: --mcpu 'pentium4'; a 32-bit-only CPU")


# ---- the table -------------------------------------------------------------------------------------------

def _limit(gb: int):
    def apply():
        resource.setrlimit(resource.RLIMIT_AS, (gb << 30, gb << 30))
    return apply


def invoke(argv: list, own_process: bool, memory_gb: int | None) -> tuple[int, str]:
    env = argv.pop(0) if argv and isinstance(argv[0], dict) else {}  # a case's environment (own process only)
    assert own_process or not env
    if own_process:
        proc = subprocess.run([sys.executable, "-m", "mlcpipe.cli", *argv], capture_output=True, text=True, timeout=300,
                              env={**os.environ, **env}, preexec_fn=_limit(memory_gb) if memory_gb else None)
        return proc.returncode, proc.stderr
    from click.testing import CliRunner

    from mlcpipe.cli import main

    result = CliRunner().invoke(main, argv)
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        return result.exit_code, result.stderr + f"\nuncaught {type(result.exception).__name__}: {result.exception}"[:2000]
    return result.exit_code, result.stderr


@pytest.mark.parametrize("name", list(CASES))
def test_hostile_input(name, shared, tmp_path):
    fn, own_process, memory_gb = CASES[name]
    argv, expected = fn(Ctx(tmp_path, shared))
    before = snapshot(tmp_path)
    code, stderr = invoke(argv, own_process, memory_gb)
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert code == 2, f"exit {code}: {stderr[-3000:]}"
    assert len(lines) == 1 and lines[0].startswith("error: "), stderr[-3000:]
    assert len(lines[0]) <= 1000, lines[0][:1000]
    assert re.search(expected, lines[0]), lines[0]
    assert snapshot(tmp_path) == before, "the input changed or something was written"


# ---- what the checks let through ---------------------------------------------------------------------

def test_shards_record_sha256_and_mlc_md5_caches_still_load(shared, tmp_path):
    """convert-weights records each shard's SHA-256 beside MLC's md5sum; a cache with the md5sum
    only (as MLC-LLM writes it) is verified by MD5 and loads the same tensors."""
    from mlcpipe.weights import load_stored_weights

    cache = json.loads((shared.w / "tensor-cache.json").read_text())
    for shard in cache["records"]:
        data = (shared.w / shard["dataPath"]).read_bytes()
        assert shard["sha256"] == hashlib.sha256(data).hexdigest() and shard["md5sum"] == hashlib.md5(data).hexdigest()
    mlc = Path(shutil.copytree(shared.w, tmp_path / "mlc"))
    for shard in cache["records"]:
        del shard["sha256"]
    (mlc / "tensor-cache.json").write_text(json.dumps(cache))
    ours, theirs = load_stored_weights(shared.w), load_stored_weights(mlc)
    assert ours.keys() == theirs.keys() and all(np.array_equal(ours[k], theirs[k]) for k in ours)


def test_f32_quantizations_take_weights_beyond_f16(shared, tmp_path):
    """The float16 bound applies to the f16 quantizations only: q4f32_1 stores 1e5 as it is."""
    from mlcpipe.weights import convert_weights, load_stored_weights

    weights = random_hf_weights(shared.cfg, seed=2)
    weights["model.norm.weight"][0] = 1e5
    hf = write_hf_checkpoint(tmp_path / "hf", shared.cfg, weights)
    stored = load_stored_weights(convert_weights(shared.cfg, quantization("q4f32_1"), hf, tmp_path / "w", log=lambda *_: None))
    assert stored["model.norm.weight"][0] == np.float32(1e5)


def test_a_failed_write_leaves_the_earlier_file_whole(tmp_path, monkeypatch):
    """Outputs go to a temp file beside the target and are renamed: a full disk (ENOSPC at the
    flush) is one line naming the file, the earlier report intact and no temp file left."""
    import errno
    import os

    from mlcpipe.artifact import write_file_atomic
    from mlcpipe.errors import ArtifactError

    report = tmp_path / "report.md"
    report.write_text("the earlier report\n")

    def full(fd):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "fsync", full)
    with pytest.raises(ArtifactError, match=r"report\.md: could not write it: No space left on device \(nothing was changed\)$"):
        write_file_atomic(report, "x" * 100_000)
    assert report.read_text() == "the earlier report\n" and sorted(p.name for p in tmp_path.iterdir()) == ["report.md"]
    monkeypatch.undo()
    write_file_atomic(report, "new")
    assert report.read_text() == "new" and oct(report.stat().st_mode & 0o777) == "0o644"


def test_the_index_decides_which_file_a_tensor_comes_from(shared, tmp_path):
    """A stale shard beside an indexed checkpoint is not read; without an index, `--allow-unused`
    converts a checkpoint with an extra layer and lists what it left out."""
    from mlcpipe.weights import convert_weights, load_stored_weights

    weights = random_hf_weights(shared.cfg, seed=2)
    hf = write_hf_checkpoint(tmp_path / "hf", shared.cfg, weights, shards=2)
    save_file({"model.norm.weight": np.full(shared.cfg.hidden_size, 3.0, np.float32)}, str(hf / "model-stale.safetensors"))
    stored = load_stored_weights(convert_weights(shared.cfg, quantization("q0f32"), hf, tmp_path / "w", log=lambda *_: None))
    assert np.array_equal(stored["model.norm.weight"], weights["model.norm.weight"])
    layers = shared.cfg.num_hidden_layers
    weights[f"model.layers.{layers}.mlp.down_proj.weight"] = weights["model.layers.0.mlp.down_proj.weight"]
    weights["model.layers.0.self_attn.rotary_emb.inv_freq"] = np.ones(4, np.float32)  # a buffer, not a parameter: ignored
    hf = write_hf_checkpoint(tmp_path / "hf2", shared.cfg, weights)
    logged = []
    mlcpipe_out = convert_weights(shared.cfg, quantization("q0f32"), hf, tmp_path / "w2", log=logged.append, allow_unused=True)
    assert any(f"1 checkpoint tensors left out: model.layers.{layers}.mlp.down_proj.weight" in line for line in logged)
    assert np.array_equal(load_stored_weights(mlcpipe_out)["model.norm.weight"], weights["model.norm.weight"])


def test_safetensors_metadata_and_shards_are_read(shared, tmp_path):
    """Valid files pass the header checks: `__metadata__`, several shards, an empty tensor."""
    from mlcpipe.weights import SafetensorsDir

    weights = random_hf_weights(shared.cfg, seed=4)
    hf = write_hf_checkpoint(tmp_path / "hf", shared.cfg, weights, shards=3)
    save_file({"empty": np.zeros((0, 4), np.float32), "one": np.ones(3, np.float16)}, str(hf / "extra.safetensors"),
              metadata={"format": "pt"})
    index = json.loads((hf / "model.safetensors.index.json").read_text())
    index["weight_map"].update({"empty": "extra.safetensors", "one": "extra.safetensors"})
    (hf / "model.safetensors.index.json").write_text(json.dumps(index))
    tensors = SafetensorsDir(hf)
    assert tensors.get("empty").shape == (0, 4) and tensors.get("one").tolist() == [1, 1, 1]
    assert np.array_equal(tensors.get("model.norm.weight"), weights["model.norm.weight"])


def test_a_kv_cache_beyond_memory_is_refused_before_allocation(shared, monkeypatch):
    """run / profile on the CPU: a context window whose KV cache does not fit the memory left is one
    line saying how much it needs, before TVM allocates (not std::bad_alloc)."""
    from mlcpipe import runtime
    from mlcpipe.errors import ArtifactError

    engine = runtime.Engine(shared.art, "synthetic")
    need = engine.kv_cache_bytes()
    cfg = shared.cfg
    assert need == cfg.num_hidden_layers * 2 * cfg.num_key_value_heads * cfg.head_dim * cfg.context_window_size * 4  # q4f32_1: f32 cache
    monkeypatch.setattr(runtime, "available_memory", lambda: need - 1)
    with pytest.raises(ArtifactError, match=rf"its KV cache \({cfg.context_window_size} tokens, context_window_size\) needs [\d.]+ GiB; "
                                             r"this machine has [\d.]+ GiB available \(rebuild with a smaller context_window_size\)$"):
        engine.generate([1, 2, 3], 2)
    monkeypatch.setattr(runtime, "available_memory", lambda: need)
    assert len(engine.generate([1, 2, 3], 2)) == 2


def test_a_kv_cache_beyond_gpu_memory_is_refused_before_allocation(shared, monkeypatch):
    """On a GPU (a backend whose memory is not this machine's) the check asks the device what is
    free; a device API that does not say lets the allocation decide."""
    from mlcpipe import runtime
    from mlcpipe.device import llvm as llvm_device
    from mlcpipe.device import tvm_runtime as rt
    from mlcpipe.errors import ArtifactError

    engine = runtime.Engine(shared.art, "synthetic")
    need = engine.kv_cache_bytes()
    monkeypatch.setattr(llvm_device, "HOST_MEMORY", False)  # the llvm artifact stands in for a GPU one
    monkeypatch.setattr(runtime, "available_memory", lambda: pytest.fail("asked this machine for a GPU's memory"))
    monkeypatch.setattr(rt, "device_name", lambda dev: "NVIDIA H100 80GB HBM3")
    monkeypatch.setattr(rt, "available_memory", lambda dev: need - 1)
    with pytest.raises(ArtifactError, match=r"needs [\d.]+ GiB; NVIDIA H100 80GB HBM3 has [\d.]+ GiB available \(rebuild"):
        engine.generate([1, 2, 3], 2)
    monkeypatch.setattr(rt, "available_memory", lambda dev: None)
    assert len(engine.generate([1, 2, 3], 2)) == 2
    monkeypatch.undo()
    free = rt.available_memory(rt.device("cpu"))  # the real query: a number or nothing, never an exception
    assert free is None or free > 0


def test_prompt_tokens_are_comma_separated_ids_without_gaps(shared):
    """`--prompt-tokens 1,,2` is a usage error (exit 2), not the prompt 1,2."""
    from click.testing import CliRunner

    from mlcpipe.cli import main
    from mlcpipe.errors import OptionValueError
    from mlcpipe.interface.run import parse_tokens

    assert parse_tokens("1, 2,3") == [1, 2, 3]
    for bad in ("1,,2", "1,2,", "-1", "1.5", ""):
        with pytest.raises(OptionValueError, match="expected comma-separated non-negative integers"):
            parse_tokens(bad)
    result = CliRunner().invoke(main, ["run", "--artifact", str(shared.art), "--weights", "synthetic", "--prompt-tokens", "1,,2"])
    assert result.exit_code == 2 and "'1,,2': expected comma-separated non-negative integers" in result.stderr


def test_a_full_disk_during_convert_is_one_line_and_leaves_nothing(shared, tmp_path, monkeypatch):
    """ENOSPC while the shards are written: one line naming the file, exit 2, no output directory."""
    import errno

    from click.testing import CliRunner

    from mlcpipe import weights
    from mlcpipe.cli import main

    def full(directory):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(directory / "params_shard_0.bin"))

    monkeypatch.setattr(weights, "add_shard_digests", full)
    result = CliRunner().invoke(main, ["convert-weights", "--model", "llama-tiny", "--quant", "q0f32", "--source", "synthetic",
                                       "--output", str(tmp_path / "w")])
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.exit_code == 2 and len(lines) == 1, result.stderr
    assert re.fullmatch(r"error: \S+params_shard_0\.bin: No space left on device", lines[0]), lines[0]
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # the temp directory is gone, no `w`


def test_token_ids_need_no_tokenizers_package(shared, monkeypatch):
    """`run --prompt-tokens` with weights holding a tokenizer.json runs where `tokenizers` is not
    installed (ids need no tokenizer); `--prompt` still says what it needs."""
    import mlcpipe.tokenizer as tokenizer_module
    from mlcpipe.errors import ArtifactError
    from mlcpipe.interface.run import run

    monkeypatch.setattr(tokenizer_module, "tokenizers_installed", lambda: False)
    assert (shared.w / "tokenizer.json").is_file()
    text, ids = run(shared.art, str(shared.w), prompt_tokens="1,2,3", max_new_tokens=2)
    assert text is None and len(ids) == 2
    monkeypatch.setitem(sys.modules, "tokenizers", None)  # `import tokenizers` fails as if not installed
    with pytest.raises(ArtifactError, match=r"tokenizer\.json: reading it needs the `tokenizers` package"):
        run(shared.art, str(shared.w), prompt="hi", max_new_tokens=2)


def test_convert_checks_free_space_before_any_work(shared, tmp_path, monkeypatch):
    """Too little room for the weights it will write: one line before any tensor is read, no output."""
    import collections

    from mlcpipe import weights
    from mlcpipe.errors import ArtifactError

    usage = collections.namedtuple("usage", "total used free")
    monkeypatch.setattr(weights.shutil, "disk_usage", lambda path: usage(1 << 30, 1 << 30, 10 << 20))
    monkeypatch.setattr(weights, "logical_weights", lambda *a, **k: pytest.fail("read tensors before checking the space"))
    with pytest.raises(ArtifactError, match=r": 0\.01 GiB free; about 0\.\d+ GiB needed for the converted weights$"):
        weights.convert_weights(shared.cfg, quantization("q0f32"), shared.hf, tmp_path / "w", log=lambda *_: None)
    assert not (tmp_path / "w").exists() and [p.name for p in tmp_path.iterdir()] == []


@pytest.mark.parametrize("weights", [None, "synthetic"])
def test_build_checks_free_space_before_compiling(shared, tmp_path, monkeypatch, weights):
    """Too little room for the artifact (and the weights it would convert): one line before the
    export, nothing left behind."""
    import collections

    from mlcpipe import build as build_module
    from mlcpipe import weights as weights_module
    from mlcpipe.errors import ArtifactError
    from mlcpipe.targets import load_target

    usage = collections.namedtuple("usage", "total used free")
    monkeypatch.setattr(weights_module.shutil, "disk_usage", lambda path: usage(1 << 30, 1 << 30, 10 << 20))
    monkeypatch.setattr(build_module, "export_model", lambda *a, **k: pytest.fail("compiled before checking the space"))
    what = "the artifact and its weights" if weights else "the artifact"
    with pytest.raises(ArtifactError, match=rf": 0\.01 GiB free; about 0\.\d+ GiB needed for {what}$"):
        build_module.build(shared.cfg, quantization(QUANT), load_target("llvm"), output=tmp_path / "art", weights=weights, log=lambda *_: None)
    assert [p.name for p in tmp_path.iterdir()] == []


def test_an_artifact_for_a_cpu_this_one_lacks_is_refused_before_loading(shared, tmp_path, monkeypatch):
    """Was: run / check / profile of an llvm artifact built for a CPU with features this one lacks
    (e.g. --mcpu sapphirerapids on a Zen 4) stopped the process on an illegal instruction (exit 132,
    no message); tune --mcpu of such a CPU too. The manifest records the /proc/cpuinfo flags the
    code needs; a CPU without one of them is the one line below. This machine is made to lack one."""
    from mlcpipe import runtime, targets
    from mlcpipe.errors import ArtifactError, ConfigError
    from mlcpipe.interface.tune import tune

    manifest = json.loads((shared.art / "manifest.json").read_text())
    needed = manifest["cpu_flags"]
    assert needed == targets.required_cpu_flags(manifest["target"]) and not targets.missing_cpu_flags(needed)
    assert "avx2" in needed or "asimd" in needed  # every CPU this project builds for
    real = targets.cpu_flags
    lacking = needed[-1]
    monkeypatch.setattr(targets, "cpu_flags", lambda text: real(text) - {lacking})
    message = rf"^{re.escape(str(shared.art))}: built for CPU '{manifest['target']['mcpu']}', whose code needs {lacking}: this CPU lacks them"
    with pytest.raises(ArtifactError, match=message):
        runtime.Engine(shared.art, "synthetic")
    with pytest.raises(ArtifactError, match=message):
        runtime.library_kernel_runner(shared.art, manifest)
    with pytest.raises(ConfigError, match=rf"^--mcpu '{manifest['target']['mcpu']}': its code needs {lacking}, which this CPU lacks"):
        tune("llama-tiny", QUANT, "llvm", mcpu=manifest["target"]["mcpu"], db_path=tmp_path / "db.json")
    assert not (tmp_path / "db.json").exists()
    edited = Path(shutil.copytree(shared.art, tmp_path / "art"))
    (edited / "manifest.json").write_text(json.dumps({**manifest, "cpu_flags": "avx2"}))
    with pytest.raises(ArtifactError, match="manifest field 'cpu_flags': expected a list of /proc/cpuinfo flags"):
        runtime.Engine(edited, "synthetic")
    monkeypatch.setattr(targets, "cpu_flags", real)
    assert len(runtime.Engine(shared.art, "synthetic").generate([1, 2, 3], 2)) == 2


def test_the_cpu_flags_an_llvm_target_needs():
    from mlcpipe.targets import required_cpu_flags

    x86 = {"kind": "llvm", "mtriple": "x86_64-linux-gnu"}
    assert required_cpu_flags({**x86, "mcpu": "haswell"}) == ["avx2", "f16c", "fma"]
    assert required_cpu_flags({**x86, "mcpu": "x86-64-v3"}) == ["avx2", "f16c", "fma"]  # the reference kernels' CPU
    spr = required_cpu_flags({**x86, "mcpu": "sapphirerapids"})
    assert {"amx_bf16", "amx_tile", "avx512_fp16", "avx512f", "avx512_vnni", "avx2"} <= set(spr)
    assert set(spr) - set(required_cpu_flags({**x86, "mcpu": "sapphirerapids", "mattr": ["-avx512fp16", "-amx-bf16"]})) == {
        "avx512_fp16", "amx_bf16"}
    assert "avx512f" not in required_cpu_flags({**x86, "mcpu": "znver3"})
    assert required_cpu_flags({"kind": "llvm", "mtriple": "aarch64-linux-gnu", "mcpu": "generic", "mattr": ["+dotprod"]}) == [
        "asimd", "asimddp"]
    assert required_cpu_flags({"kind": "cuda", "arch": "sm_90"}) is None

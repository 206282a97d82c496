"""Bad input: one clear line naming file/field/value and what is allowed, exit status 2, and
no half-written artifact."""

from __future__ import annotations

import re
import signal
import subprocess
import sys

import numpy as np
import pytest
import tvm

from mlcpipe.artifact import atomic_directory
from mlcpipe.config import load_model_config
from mlcpipe.errors import ArtifactError, ConfigError
from mlcpipe.targets import detect_host_cpu, load_target
from mlcpipe.weights import convert_weights
from mlcpipe.quantization import quantization

from tests.helpers.checkpoints import random_hf_weights, write_hf_checkpoint
from tests.helpers.cli import mlcpipe, write_yaml


@pytest.mark.parametrize(
    "changes, expected",
    [
        ({"hidden_size": -128}, r"field 'hidden_size': got -128; expected a positive integer"),
        ({"num_attention_heads": 3}, r"field 'num_attention_heads': got 3; must divide hidden_size \(128\)"),
        ({"num_key_value_heads": 3}, r"field 'num_key_value_heads': got 3; must divide num_attention_heads"),
        ({"vocab_size": None}, r"field 'vocab_size' is missing"),
        ({"quantizations": ["q3f16_0"]}, r"field 'quantizations': got 'q3f16_0'; allowed: \['q0f16'"),
        ({"architecture": "gpt2"}, r"field 'architecture': got 'gpt2'; allowed: \['llama', 'qwen2', 'qwen3', 'gemma3'\]"),
        ({"hidden_sise": 12}, r"field 'hidden_sise': got 12; unknown field"),
        ({"rope_scaling": {"rope_type": "yarn"}}, r"field 'rope_scaling.rope_type': got 'yarn'"),
        ({"prefill_chunk_size": 4096}, r"field 'prefill_chunk_size': got 4096; must be <= context_window_size"),
        ({"page_size": 8}, r"field 'page_size': got 8; allowed: 16 \(TVM's paged KV cache kernels"),
    ],
)
def test_config_errors_name_file_field_value(tmp_path, changes, expected):
    path = write_yaml(tmp_path, **changes)
    with pytest.raises(ConfigError, match=expected) as info:
        load_model_config(str(path))
    assert str(info.value).startswith(str(path)) and "\n" not in str(info.value)


def test_bad_yaml_names_line(tmp_path):
    path = tmp_path / "broken.yaml"
    path.write_text("name: x\nhidden_size: [1, 2\n")
    with pytest.raises(ConfigError, match=r"broken.yaml: invalid YAML \(line \d+, column \d+\)"):
        load_model_config(str(path))


def test_unknown_model_name_lists_available():
    with pytest.raises(ConfigError, match=r"no such config .*available: \[.*'llama-3.2-1b'"):
        load_model_config("llama-9b")


def test_group_size_checked_for_q4(tmp_path):
    from mlcpipe.quantization import QUANTIZATIONS

    cfg = load_model_config(str(write_yaml(tmp_path, hidden_size=120, num_attention_heads=4, head_dim=30)))
    with pytest.raises(ConfigError, match=r"field 'hidden_size': got 120; q4f16_1 needs a multiple of its group size 32"):
        cfg.scheme("q4f16_1")
    assert cfg.scheme("q0f16") is QUANTIZATIONS["q0f16"]  # unquantized takes any size


def test_the_interface_resolves_a_quantization_once(tmp_path):
    """A name becomes its scheme (one line naming the allowed ones otherwise); the model must list it."""
    from mlcpipe.quantization import GroupQuantize, quantization

    assert isinstance(quantization("q4f16_1"), GroupQuantize) and quantization("q4f16_1").model_dtype == "float16"
    with pytest.raises(ConfigError, match=r"^--quant 'q3f16_0': unknown quantization; allowed: \['q0f16', 'q0f32', 'q4f16_1', 'q4f32_1'\]$"):
        quantization("q3f16_0")
    with pytest.raises(ConfigError, match=r"^art: manifest field 'quantization' 'q9': unknown quantization; allowed: "):
        quantization("q9", "art: manifest field 'quantization'")
    cfg = load_model_config(str(write_yaml(tmp_path, quantizations=["q0f16"])))
    with pytest.raises(ConfigError, match=r"field 'quantizations' does not list 'q4f16_1'; listed: \['q0f16'\]"):
        cfg.scheme("q4f16_1")


def test_llvm_target_names_the_cpu():
    assert load_target("llvm").target["mcpu"] not in ("native", "auto")
    assert detect_host_cpu("flags\t: fpu avx2 fma f16c avx512f avx512bw avx512vl avx512_fp16 amx_bf16\n") == "sapphirerapids"
    assert detect_host_cpu("flags\t: fpu avx2 fma f16c\n") == "haswell"
    assert detect_host_cpu("flags\t: fpu sse2\n") == "x86-64"
    assert load_target("llvm", {"mcpu": "skylake-avx512"}).target["mcpu"] == "skylake-avx512"
    with pytest.raises(ConfigError, match=r"^--mcpu 'native'; name the CPU"):  # the flag's value, named as the flag
        load_target("llvm", {"mcpu": "native"})


@pytest.mark.parametrize(
    "args, expected",
    [
        (["build", "--model", "llama-tiny", "--quant", "q5f16"], r"--quant 'q5f16': unknown quantization; allowed: \['q0f16', 'q0f32', 'q4f16_1', 'q4f32_1'\]"),
        (["build", "--model", "llama-tiny", "--quant", "q4f16_1", "--target", "vulkan"], r"--target 'vulkan': unknown target; allowed: \[.*'llvm'"),
        (["build", "--model", "nope.yaml", "--quant", "q4f16_1"], r"nope.yaml: model config file not found"),
    ],
)
def test_cli_errors_are_one_line_and_exit_2(tmp_path, args, expected):
    out = tmp_path / "art"
    result = mlcpipe(*args, "--output", str(out))
    assert result.returncode == 2, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    import re

    assert re.search(expected, lines[0]), lines[0]
    assert not out.exists() and not list(tmp_path.glob(".art*"))


def test_failed_build_leaves_nothing(tmp_path):
    final = tmp_path / "artifact"
    with pytest.raises(RuntimeError):
        with atomic_directory(final) as tmp:
            (tmp / "lib.so").write_bytes(b"partial")
            raise RuntimeError("codegen failed")
    assert not final.exists() and list(tmp_path.iterdir()) == []
    # a failing rebuild keeps the previous good artifact intact
    with atomic_directory(final) as tmp:
        (tmp / "manifest.json").write_text("{}")
    with pytest.raises(RuntimeError):
        with atomic_directory(final) as tmp:
            raise RuntimeError("boom")
    assert (final / "manifest.json").read_text() == "{}"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["artifact"]


def test_cli_build_with_bad_mcpu_leaves_nothing(tmp_path):
    out = tmp_path / "art"
    result = mlcpipe("build", "--model", "llama-tiny", "--quant", "q0f32", "--mcpu", "native", "--output", str(out))
    assert result.returncode == 2 and "--mcpu 'native'; name the CPU" in result.stderr
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("argv, hint", [
    (["build", "--model", "llama-tiny", "--quant", "q4f16_1", "--weights", ""], "--weights"),  # was: the current directory as the checkpoint
    (["build", "--model", "llama-tiny", "--quant", "q4f16_1", "--output="], "--output"),  # was: the artifact aimed at the current directory
    (["run", "--artifact", "", "--prompt-tokens", "1"], "--artifact"),
    (["profile", "compare", "a.json", "b.json", "-o", ""], "-o"),  # a group's subcommand
    (["verify", ""], None),
])
def test_an_empty_value_is_a_usage_error(argv, hint):
    """`--weights "$W"` with W unset: a path option took '' as '.', a name option as its default."""
    from click.testing import CliRunner

    from mlcpipe.cli import main

    result = CliRunner().invoke(main, argv, catch_exceptions=False)
    expected = f"Error: Invalid value for {hint}: an empty value (an unset variable?)" if hint else "Error: an empty argument (an unset variable?)"
    assert result.exit_code == 2 and result.output.strip().splitlines()[-1] == expected, result.output


def test_empty_values_that_mean_something_pass():
    """--kernels '' matches every kernel (an empty regex); --rpc-key '' is a server started without a key."""
    import click

    from mlcpipe.cli.check import check
    from mlcpipe.cli.common import refuse_empty_values

    refuse_empty_values(check, click.Context(check), ["--artifact", "a", "--kernels", "", "--rpc-key", "", "--rpc", "h:1"])
    with pytest.raises(click.BadParameter):
        refuse_empty_values(check, click.Context(check), ["--artifact", "a", "--kernels", "", "--sizes", ""])


def test_ctrl_c_inside_a_tvm_callback_is_aborted_not_a_traceback():
    """Ctrl-C while TVM's C++ runs one of our Python passes (the schedule phase) comes back out of
    the FFI as a bare RuntimeError: the command reports click's "Aborted!", no traceback."""
    script = """
import os, signal, tvm
signal.signal(signal.SIGINT, signal.default_int_handler)  # as from a terminal (a test runner's worker may ignore
signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})  # or block SIGINT, and a child inherits both)
from mlcpipe.cli import main

@main.command("interrupt-in-a-pass")
def interrupt_in_a_pass():
    @tvm.ir.transform.module_pass(opt_level=0)
    def ctrl_c(mod, ctx):
        os.kill(os.getpid(), signal.SIGINT)
        return mod
    tvm.ir.transform.Sequential([ctrl_c])(tvm.IRModule())

main(["interrupt-in-a-pass"], prog_name="mlcpipe")
"""
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert (result.returncode, result.stderr.strip()) == (1, "Aborted!"), result.stderr[-2000:]


def test_weight_errors_name_the_tensor(tiny_config, tmp_path):
    weights = random_hf_weights(tiny_config, seed=0)
    bad_shape = dict(weights)
    bad_shape["model.layers.1.mlp.up_proj.weight"] = np.zeros((10, 128), np.float32)
    src = write_hf_checkpoint(tmp_path / "shape", tiny_config, bad_shape)
    with pytest.raises(ArtifactError, match=r"tensor 'model.layers.1.mlp.up_proj.weight' has shape \[10, 128\], expected \[256, 128\]"):
        convert_weights(tiny_config, quantization("q4f16_1"), src, tmp_path / "out1", log=lambda *_: None)

    missing = {k: v for k, v in weights.items() if k != "model.layers.0.self_attn.k_proj.weight"}
    src = write_hf_checkpoint(tmp_path / "missing", tiny_config, missing)
    with pytest.raises(ArtifactError, match=r"tensor 'model.layers.0.self_attn.k_proj.weight' is missing"):
        convert_weights(tiny_config, quantization("q4f16_1"), src, tmp_path / "out2", log=lambda *_: None)

    src = write_hf_checkpoint(tmp_path / "int", tiny_config, {**weights, "model.norm.weight": np.ones(128, np.int32)})
    with pytest.raises(ArtifactError, match=r"tensor 'model.norm.weight' has dtype int32; expected a float dtype"):
        convert_weights(tiny_config, quantization("q0f16"), src, tmp_path / "out3", log=lambda *_: None)

    src = write_hf_checkpoint(tmp_path / "untied", tiny_config, random_hf_weights(tiny_config, untied=True))
    with pytest.raises(ConfigError, match=r"config.json: field 'tie_word_embeddings': got False, but .*llama-tiny.yaml says True"):
        convert_weights(tiny_config, quantization("q0f16"), src, tmp_path / "out4", log=lambda *_: None)
    assert not any(p.name.startswith(("out", ".out")) for p in tmp_path.iterdir())


@pytest.mark.parametrize(("field", "text"), [
    ("rms_norm_eps", ".nan"), ("rope_theta", ".inf"), ("temperature", ".nan"), ("top_p", ".nan"),
    ("repetition_penalty", ".inf"), ("presence_penalty", "-.inf"),
])
def test_nan_and_inf_are_refused(tmp_path, field, text):
    """YAML's .nan / .inf never reach a build (they used to write invalid JSON into
    mlc-chat-config.json): one line naming the field, exit 2, no artifact."""
    path = write_yaml(tmp_path, **{field: float(text.replace(".", ""))})
    assert f"{field}: {text}" in path.read_text()
    proc = mlcpipe("build", "--model", str(path), "--quant", "q4f16_1", "--output", str(tmp_path / "art"))
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {path}: field '{field}': got "), proc.stderr
    assert not (tmp_path / "art").exists()


def test_unknown_mcpu_is_refused(tmp_path):
    """--mcpu is checked against LLVM's CPU list (TVM would build generic code for a name LLVM
    does not know, exit 0). A 32-bit-only one: tests/test_hostile_inputs.py::build_llvm_32_bit_cpu."""
    proc = mlcpipe("build", "--model", "llama-tiny", "--quant", "q4f16_1", "--mcpu", "foobar", "--output", str(tmp_path / "a"))
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [proc.stderr.strip()]
    assert "error: --mcpu 'foobar'; not a CPU LLVM knows for" in proc.stderr
    assert not (tmp_path / "a").exists()


def test_a_32_bit_cpu_is_refused_wherever_it_is_named(tmp_path, monkeypatch):
    """For 64-bit x86 code a CPU without 64-bit mode is refused (was: LLVM aborted the process at
    code generation: 'LLVM ERROR: 64-bit code requested on a subtarget that doesn't support it!',
    exit 1), named where it was set: the preset's field, or $MLCPIPE_HOST_CPU behind `auto`.
    The triples are given, so the answer does not depend on the host."""
    from mlcpipe import targets

    x86, x86_32 = "x86_64-linux-gnu", "i686-linux-gnu"
    assert targets.cpu_problem("pentium4", x86) == f"a 32-bit-only CPU, and {x86} is 64-bit code"
    assert targets.cpu_problem("pentium4", x86_32) is None and targets.cpu_problem("haswell", x86) is None
    monkeypatch.setattr(targets, "TARGETS_DIR", tmp_path)
    (tmp_path / "old.yaml").write_text(f"kind: llvm\nmtriple: {x86}\nmcpu: pentium4\n")
    (tmp_path / "host.yaml").write_text("kind: llvm\nmcpu: auto\n")
    with pytest.raises(ConfigError, match=rf"^{re.escape(str(tmp_path / 'old.yaml'))}: field 'mcpu': got 'pentium4'; a 32-bit-only CPU"):
        load_target("old")
    monkeypatch.setattr(tvm.target.codegen, "llvm_get_system_triple", lambda: x86)
    monkeypatch.setenv(targets.HOST_CPU_ENV, "i686")  # `auto` standing for a 32-bit CPU: refused where it is set
    with pytest.raises(ConfigError, match=r"^environment MLCPIPE_HOST_CPU='i686': a 32-bit-only CPU"):
        load_target("host")


@pytest.mark.parametrize(
    "architecture, changes, expected",
    [
        ("llama", {"sliding_window": 32}, r"field 'sliding_window': got 32; not a field of architecture 'llama' \(it is 'gemma3''s\)"),
        ("qwen3", {"attention_bias": True}, r"field 'attention_bias': got True; allowed: false"),
        ("gemma3", {"prefill_chunk_size": 64, "sliding_window": 32}, r"field 'prefill_chunk_size': got 64; must be <= sliding_window \(32\)"),
        ("gemma3", {"layer_types": ["full_attention"]}, r"field 'layer_types': .*expected num_hidden_layers \(2\) entries"),
        ("gemma3", {"hidden_activation": "relu"}, r"field 'hidden_activation': got 'relu'; allowed: 'gelu_pytorch_tanh', 'silu'"),
        ("gemma3", {"layer_types": ["full_attention"] * 2, "sliding_window_pattern": 2}, r"give layer_types or sliding_window_pattern, not both"),
    ],
)
def test_family_fields_are_checked(tmp_path, architecture, changes, expected):
    path = write_yaml(tmp_path, architecture=architecture, rope_scaling=None, **changes)
    with pytest.raises(ConfigError, match=expected) as info:
        load_model_config(str(path))
    assert str(info.value).startswith(str(path)) and "\n" not in str(info.value)


def test_import_config_refuses_what_the_family_does_not_compute():
    """A Llama checkpoint with biases (attention_bias / mlp_bias) or a Mistral one whose sliding
    window is shorter than the imported context: mlcpipe's llama has neither, so each is refused
    (was: imported; convert-weights --allow-unused then dropped the biases). A context of 0 is
    refused too (was: read as absent, 4096)."""
    from mlcpipe.hf_config import model_yaml

    llama = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 128, "intermediate_size": 256,
             "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 512,
             "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "max_position_embeddings": 32768}
    mistral = {**llama, "architectures": ["MistralForCausalLM"], "model_type": "mistral"}
    for hf, expected in (({**llama, "attention_bias": True}, "field 'attention_bias': got True; allowed: false (llama layers without biases)"),
                         ({**llama, "mlp_bias": True}, "field 'mlp_bias': got True; allowed: false"),
                         ({**mistral, "sliding_window": 1024}, "field 'sliding_window': got 1024; allowed: null or at least the context "
                                                               "window (4096 tokens)"),
                         ({**llama, "max_position_embeddings": 0}, "field 'max_position_embeddings': got 0; expected a positive integer")):
        with pytest.raises(ConfigError, match=re.escape(f"config.json: {expected}")):
            model_yaml(hf, "config.json", "m")
    assert model_yaml({**mistral, "sliding_window": 4096}, "config.json", "m")["architecture"] == "llama"  # never reached
    assert model_yaml({**mistral, "sliding_window": None, "attention_bias": False}, "config.json", "m")["context_window_size"] == 4096


@pytest.mark.parametrize(("signum", "publish"), [(signal.SIGINT, "directory"), (signal.SIGTERM, "directory"), (signal.SIGTERM, "file")])
def test_a_swallowed_interrupt_publishes_nothing(tmp_path, signum, publish):
    """Was (a CI flake of test_sigterm_mid_build_removes_the_temp_dir): a signal that reached a TVM
    callback came back as a bare RuntimeError; an `except Exception` took it for an ordinary failure,
    the command went on, published its output and exited 0. Now nothing is published after an
    unhandled signal (atomic_directory, write_file_atomic), and the command ends as for the signal."""
    script = f"""
import os, signal, sys, tvm
from pathlib import Path
signal.signal(signal.SIGINT, signal.default_int_handler)  # as from a terminal (see the Ctrl-C test above)
signal.signal(signal.SIGTERM, signal.SIG_DFL)
signal.pthread_sigmask(signal.SIG_UNBLOCK, {{signal.SIGINT, signal.SIGTERM}})
from mlcpipe.artifact import atomic_directory, write_file_atomic
from mlcpipe.cli import main

@main.command("swallow")
def swallow():
    @tvm.ir.transform.module_pass(opt_level=0)
    def stopped(mod, ctx):
        os.kill(os.getpid(), {int(signum)})
        return mod
    try:
        tvm.ir.transform.Sequential([stopped])(tvm.IRModule())
    except Exception as exc:  # a fallback that takes any failure for its own
        print("swallowed", type(exc).__name__, flush=True)
    root = Path(sys.argv[1])
    if "{publish}" == "file":
        write_file_atomic(root / "file", "b")
    else:
        with atomic_directory(root / "out") as tmp:
            (tmp / "a").write_text("a")

main(["swallow"], prog_name="mlcpipe")
"""
    result = subprocess.run([sys.executable, "-c", script, str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert result.stdout.split() == ["swallowed", "RuntimeError"], result.stdout + result.stderr[-2000:]
    want = (1, "Aborted!") if signum == signal.SIGINT else (143, "Terminated.")
    assert (result.returncode, result.stderr.strip().splitlines()[-1]) == want, result.stderr[-2000:]
    assert list(tmp_path.iterdir()) == []

"""pipeline/config.py's folders: where configs are found and artifacts go, in the checkout and in
mlcpipe installed from its wheel (not editable) used from another directory: one import name
(`mlcpipe`), the shipped configs found, a user's own configs/models/ folder searched first, and
artifacts go to ./artifacts there, never into site-packages or the checkout."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import REPO


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """(site dir holding the installed wheel, the `mlcpipe` script there)."""
    root = tmp_path_factory.mktemp("install")
    src = root / "src"  # a clean copy: no artifacts/ or build/ of the checkout goes into the wheel
    shutil.copytree(REPO, src, ignore=shutil.ignore_patterns(".git", ".venv", "artifacts", "build", "node_modules", "__pycache__",
                                                             "*.egg-info", ".pytest_cache", "weights"))
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
    subprocess.run([*pip, "wheel", "--no-deps", "--no-build-isolation", "-w", str(root / "dist"), str(src)], check=True,
                   capture_output=True, cwd=root)
    (wheel,) = (root / "dist").glob("mlcpipe-*.whl")
    subprocess.run([*pip, "install", "--no-deps", "--no-compile", "--target", str(root / "site"), str(wheel)], check=True,
                   capture_output=True, cwd=root)
    return root / "site", root / "site" / "bin" / "mlcpipe"


def _env(site: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MLCPIPE_")}
    env["PYTHONPATH"] = str(site)
    return env


def test_the_wheel_runs_from_another_directory(installed, tmp_path):
    site, script = installed
    env = _env(site)
    where = subprocess.run([sys.executable, "-c", "import mlcpipe, mlcpipe.schedules as s; print(mlcpipe.__file__); print(s.__file__)"],
                           env=env, cwd=tmp_path, capture_output=True, text=True, check=True)
    assert all(line.startswith(str(site)) for line in where.stdout.split()), where.stdout  # not the checkout
    # one import name in site-packages: no generic `pipeline` / `schedules` for other distributions to collide with
    assert sorted(p.name for p in site.iterdir() if p.is_dir() and not p.name.endswith((".dist-info", ".data"))) == ["bin", "mlcpipe"]
    for name in ("pipeline", "schedules"):
        gone = subprocess.run([sys.executable, "-c", f"import {name}"], env=env, cwd=tmp_path, capture_output=True, text=True)
        assert gone.returncode != 0 and "ModuleNotFoundError" in gone.stderr, name
    assert sorted(p.name for p in (site / "mlcpipe" / "configs" / "models").glob("*.yaml")) == sorted(
        p.name for p in (REPO / "configs" / "models").glob("*.yaml"))

    def mlcpipe(*args: str) -> subprocess.CompletedProcess:
        done = subprocess.run([str(script), *args], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=900)
        assert done.returncode == 0, f"mlcpipe {' '.join(args)}: {done.stderr[-3000:]}"
        return done

    # a shipped config by name
    mlcpipe("convert-weights", "--model", "llama-tiny", "--quant", "q4f32_1", "--source", "synthetic", "--output", "w")
    assert (tmp_path / "w" / "tensor-cache.json").is_file()
    # the user's own config folder, searched first: build, run, profile into ./artifacts
    own = tmp_path / "configs" / "models"
    own.mkdir(parents=True)
    text = (REPO / "configs" / "models" / "llama-tiny.yaml").read_text()
    (own / "my-tiny.yaml").write_text(text.replace("name: llama-tiny", "name: my-tiny"))
    mlcpipe("build", "--model", "my-tiny", "--quant", "q4f32_1", "--target", "llvm")
    art = tmp_path / "artifacts" / "my-tiny-q4f32_1-llvm"
    assert (art / "manifest.json").is_file()
    tokens = mlcpipe("run", "--artifact", str(art), "--weights", "w", "--prompt-tokens", "1,2,3", "--max-new-tokens", "3")
    assert len(tokens.stdout.strip().splitlines()[-1].split(",")) == 3
    report = mlcpipe("profile", "--artifact", str(art), "--weights", "w", "--prompt-len", "4", "--gen-len", "2", "--runs", "1",
                     "--warmup", "0")
    assert "Kernel" in report.stdout
    assert not (site / "artifacts").exists() and not list(site.glob("*.yaml"))  # nothing written into the install
    # an unknown name lists both folders
    bad = subprocess.run([str(script), "build", "--model", "nope", "--quant", "q4f32_1", "--target", "llvm"], env=env, cwd=tmp_path,
                         capture_output=True, text=True)
    assert bad.returncode == 2 and f"no such config in {own}, {site / 'mlcpipe' / 'configs' / 'models'}" in bad.stderr, bad.stderr
    assert "'my-tiny'" in bad.stderr and "'llama-tiny'" in bad.stderr


def test_folders_in_the_checkout(tmp_path, monkeypatch):
    from mlcpipe import config

    monkeypatch.delenv("MLCPIPE_ARTIFACTS", raising=False)
    assert config.IN_CHECKOUT and config.artifacts_root() == REPO / "artifacts" and config.CONFIG_DIR == REPO / "configs"
    monkeypatch.setenv("MLCPIPE_ARTIFACTS", str(tmp_path / "a"))
    assert config.artifacts_root() == tmp_path / "a"
    monkeypatch.chdir(tmp_path)
    assert config.model_dirs() == [config.MODELS_DIR]
    (tmp_path / "configs" / "models").mkdir(parents=True)
    (tmp_path / "configs" / "models" / "llama-tiny.yaml").write_text("name: mine\n")
    assert config.model_dirs() == [tmp_path / "configs" / "models", config.MODELS_DIR]
    assert config.resolve_model_path("llama-tiny") == tmp_path / "configs" / "models" / "llama-tiny.yaml"  # the user's first
    assert config.resolve_model_path("qwen3-tiny") == config.MODELS_DIR / "qwen3-tiny.yaml"


def test_a_directory_named_like_a_config_does_not_hide_it(tmp_path, monkeypatch):
    """Was: `build --model llama-tiny` in a folder holding an artifact built with `--output
    llama-tiny` failed with "llama-tiny: model config file not found"; `--model ''` said
    ": model config file not found"."""
    from mlcpipe import config

    monkeypatch.chdir(tmp_path)
    (tmp_path / "llama-tiny").mkdir()
    (tmp_path / "nosuch").mkdir()
    assert config.resolve_model_path("llama-tiny") == config.MODELS_DIR / "llama-tiny.yaml"
    with pytest.raises(config.ConfigError, match=r"^--model 'nosuch': no such config in .* \(nosuch here is a directory, not a model YAML\)"):
        config.resolve_model_path("nosuch")
    with pytest.raises(config.ConfigError, match=r"^--model '': empty; give a config name \(.*llama-tiny.*\) or a YAML file's path$"):
        config.resolve_model_path("")
    (tmp_path / "mine").write_text("name: mine\n")  # a YAML without the suffix, named by its path
    assert config.resolve_model_path("mine") == Path("mine")

"""Running mlcpipe as a user does: the CLI in a subprocess, and a model YAML edited from llama-tiny's."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import yaml

from mlcpipe.config import MODELS_DIR

TINY = yaml.safe_load((MODELS_DIR / "llama-tiny.yaml").read_text())


def mlcpipe(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "mlcpipe.cli", *args], capture_output=True, text=True, cwd=cwd,
        env={**os.environ},
    )


def write_yaml(tmp_path: Path, **changes) -> Path:
    raw = {**TINY, **changes}
    for key in [k for k, v in changes.items() if v is None]:
        raw.pop(key)
    path = tmp_path / "model.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path

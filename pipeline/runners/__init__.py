"""Executors that run generated kernels on devices reachable from this machine."""

from __future__ import annotations

import os
from pathlib import Path


def node_modules() -> Path:
    """The npm packages the runners import: $MLCPIPE_NODE_MODULES, else the checkout's
    node_modules (package.json at the repository root, installed by `npm ci`)."""
    env = os.environ.get("MLCPIPE_NODE_MODULES")
    return Path(env) if env else Path(__file__).resolve().parents[2] / "node_modules"

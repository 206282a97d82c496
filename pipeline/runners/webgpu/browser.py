"""`--browser`: the WebGPU runner in headless Chromium (`js/browser_runner.mjs`) instead of Dawn for
node. Same protocol, driven by `dawn.DawnRunner(adapter, browser=True)`.

Chromium picks its adapter: `swiftshader` (its own SwiftShader: `--use-webgpu-adapter=swiftshader`),
`gpu` (a GPU through Dawn's Vulkan backend; refused when Chromium offers only a software adapter)
or `auto` (whatever Chromium gives). The `open` reply's `adapter` says what the page got.
Chromium is /usr/bin/chromium (Debian package chromium) unless MLCPIPE_CHROMIUM names another.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from ...errors import RunnerError
from .. import node_modules

BROWSER_RUNNER = Path(__file__).resolve().parent / "js" / "browser_runner.mjs"
BROWSER_ADAPTERS = ("swiftshader", "gpu", "auto")
DEFAULT_CHROMIUM = "/usr/bin/chromium"
_SETUP_HINT = "run scripts/setup-debian.sh (it installs node, chromium and `npm ci`)"


def chromium_path() -> Path:
    return Path(os.environ.get("MLCPIPE_CHROMIUM") or DEFAULT_CHROMIUM)


def browser_command(adapter: str | None) -> tuple[str, list[str], dict[str, str]]:
    """(adapter, argv, env) of the browser runner; RunnerError (one line) when it cannot start."""
    adapter = "auto" if adapter in (None, "auto") else adapter
    if adapter not in BROWSER_ADAPTERS:
        raise RunnerError(f"--browser --adapter {adapter}: Chromium picks its WebGPU adapter; allowed swiftshader, gpu or auto")
    node = shutil.which("node")
    if node is None:
        raise RunnerError(f"node (Node.js) not found on PATH, needed to drive Chromium: {_SETUP_HINT}")
    modules = node_modules()
    missing = [m for m in ("puppeteer-core", "@mlc-ai/web-runtime") if not (modules / m).is_dir()]
    if missing:
        raise RunnerError(f"npm package(s) {', '.join(missing)} not found in {modules}: {_SETUP_HINT}")
    chromium = chromium_path()
    if not (chromium.is_file() and os.access(chromium, os.X_OK)):
        raise RunnerError(f"--browser needs Chromium at {chromium} (Debian package chromium, or MLCPIPE_CHROMIUM=<binary>): {_SETUP_HINT}")
    env = dict(os.environ)
    env["MLCPIPE_CHROMIUM"] = str(chromium)
    return adapter, [node, str(BROWSER_RUNNER)], env

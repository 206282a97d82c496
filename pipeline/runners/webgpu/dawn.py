"""Drive `js/node_runner.mjs`: an artifact's lib.wasm on a real WebGPU runtime (Dawn in node).

Adapters: `gles` (Dawn's OpenGL ES backend on Mesa llvmpipe, compatibility mode), `swiftshader`
(Dawn's Vulkan backend on SwiftShader, Chrome's fallback adapter; timestamp queries), `gpu`
(Dawn's Vulkan backend on a real GPU). `auto` takes the first of gpu, swiftshader, gles found.
"""

from __future__ import annotations

import base64
import json
import os
import re
import shutil
import subprocess
import tempfile
import threading
from collections import deque
from pathlib import Path

import numpy as np

from ...artifact import RUN_FIELDS, RUNTIME_CONFIG, read_manifest, verified_library
from ...errors import ArtifactError, RunnerError
from ...generation import Generation
from ...tensor_cache import check_parameters
from .. import node_modules

RUNNER = Path(__file__).resolve().parent / "js" / "node_runner.mjs"
ADAPTERS = ("gles", "swiftshader", "gpu")
SWIFTSHADER_ICD = Path("/usr/lib/chromium/vk_swiftshader_icd.json")
# check tolerances per adapter: SwiftShader's exp / sin / cos / inverseSqrt are approximations
# within Vulkan's precision bounds (sin/cos: 2^-11 absolute), ~2e-4 of a RoPE output
ADAPTER_TOLERANCE = {"swiftshader": {"float32": 5e-4}}
_SETUP_HINT = "run scripts/setup-debian.sh (it installs node, the adapters' system packages and `npm ci`)"


def _gpu_present() -> bool:
    """A GPU's Vulkan driver can be used: an NVIDIA device with its ICD, or a DRM render node."""
    dirs = [Path("/usr/share/vulkan/icd.d"), Path("/etc/vulkan/icd.d")]
    icds = [p.name for d in dirs if d.is_dir() for p in d.glob("*.json")]
    nvidia = Path("/dev/nvidia0").exists() and any("nvidia" in name for name in icds)
    render = any(Path("/dev/dri").glob("renderD*")) if Path("/dev/dri").is_dir() else False
    return nvidia or (render and any("lvp" not in n for n in icds))


def adapter_env(adapter: str) -> dict[str, str]:
    """Environment for node so Dawn finds the adapter; RunnerError when it is not installed."""
    env = dict(os.environ)
    if adapter == "gles":
        if not any(Path(d, "libEGL.so.1").exists() for d in ("/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/usr/lib")):
            raise RunnerError(f"--adapter gles needs Mesa's EGL (libEGL.so.1, Debian libegl1 libegl-mesa0): {_SETUP_HINT}")
        env.setdefault("EGL_PLATFORM", "surfaceless")
    elif adapter == "swiftshader":
        if not SWIFTSHADER_ICD.is_file():
            raise RunnerError(f"--adapter swiftshader needs {SWIFTSHADER_ICD} (Debian package chromium): {_SETUP_HINT}")
        env["VK_ICD_FILENAMES"] = str(SWIFTSHADER_ICD)
    elif adapter == "gpu":
        if not _gpu_present() and "VK_ICD_FILENAMES" not in os.environ:
            raise RunnerError("--adapter gpu: no GPU with a Vulkan driver here (no /dev/nvidia0 with NVIDIA's ICD, no /dev/dri "
                              "render node); use --adapter gles or swiftshader")
    else:
        raise RunnerError(f"--adapter {adapter!r}: allowed {', '.join(ADAPTERS)} or auto")
    return env


def resolve_adapter(adapter: str | None, timed: bool = False) -> str:
    """`auto` (or None): a real GPU, else GLES (exact f32, fast), else SwiftShader; with `timed`
    (kernels timed by timestamp queries, which GLES lacks) a GPU, else SwiftShader."""
    if adapter not in (None, "auto"):
        adapter_env(adapter)
        return adapter
    for candidate in ("gpu", "swiftshader") if timed else ("gpu", "gles", "swiftshader"):
        try:
            adapter_env(candidate)
            return candidate
        except RunnerError:
            continue
    raise RunnerError(f"no WebGPU adapter: neither a GPU's Vulkan driver, SwiftShader nor Mesa's EGL is installed; {_SETUP_HINT}")


def b64(array: np.ndarray) -> str:
    return base64.b64encode(np.ascontiguousarray(array).tobytes()).decode()


def unb64(text: str, dtype: str, shape) -> np.ndarray:
    return np.frombuffer(base64.b64decode(text), dtype=dtype).reshape(shape).copy()


class DawnRunner:
    """One node process holding one WebGPU device and (after `open`) one model session."""

    def __init__(self, adapter: str | None = None, browser: bool = False, timed: bool = False, console=None):
        """`console(line)`: sees the runtime's console lines (the page's, `[browser:log] ...`)."""
        self._console = console
        if browser:  # headless Chromium (js/browser_runner.mjs, same protocol): see browser.py
            from .browser import browser_command

            self.adapter, argv, env = browser_command(adapter)
        else:
            self.adapter = resolve_adapter(adapter, timed)
            node = shutil.which("node")
            if node is None:
                raise RunnerError(f"node (Node.js) not found on PATH, needed to run webgpu artifacts: {_SETUP_HINT}")
            modules = node_modules()
            if not (modules / "webgpu").is_dir() or not (modules / "@mlc-ai" / "web-runtime").is_dir():
                raise RunnerError(f"npm packages webgpu and @mlc-ai/web-runtime not found in {modules}: {_SETUP_HINT}")
            argv, env = [node, str(RUNNER)], adapter_env(self.adapter)
        env["MLCPIPE_NODE_MODULES"] = str(node_modules())
        self._stderr: deque[str] = deque(maxlen=50)
        self.proc = subprocess.Popen(
            argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            env=env, text=True, bufsize=1,
        )
        threading.Thread(target=self._drain, daemon=True).start()

    def _drain(self) -> None:
        for line in self.proc.stderr:
            self._stderr.append(line.rstrip())
            if self._console is not None and line.startswith("[browser:"):
                self._console(line.rstrip())

    def request(self, op: str, **fields) -> dict:
        if self.proc.poll() is not None:
            raise RunnerError(f"the WebGPU runner exited ({self.proc.returncode}): {self._last_stderr()}")
        try:
            self.proc.stdin.write(json.dumps({"op": op, **fields}) + "\n")
            self.proc.stdin.flush()
            line = self.proc.stdout.readline()
        except BrokenPipeError:
            line = ""
        if not line:
            self.proc.wait(timeout=10)
            raise RunnerError(f"the WebGPU runner exited ({self.proc.returncode}) during {op}: {self._last_stderr()}")
        reply = json.loads(line)
        if not reply.get("ok"):
            raise RunnerError(f"webgpu ({self.adapter}) {op}: {reply.get('error')}")
        return reply

    def _last_stderr(self) -> str:
        lines = [s for s in self._stderr if s.strip()]
        return lines[-1][:300] if lines else "no output"

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                self.proc.stdin.write(json.dumps({"op": "close"}) + "\n")
                self.proc.stdin.flush()
                self.proc.wait(timeout=20)
            except (BrokenPipeError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def kernel_of(entry_point: str) -> str:
    """The TIR function a WGSL entry point belongs to (`<func>_kernel`, `<func>_kernel_1`, ...)."""
    return re.sub(r"_kernel(_\d+)?$", "", entry_point)


class WebGPUEngine(Generation):
    """A webgpu artifact run whole in Dawn (node): weights from disk, paged KV cache, chunked
    prefill, decode. With `timed`, every kernel of each step is timed by timestamp queries
    (`last_kernels`: [(kernel, ns)] of the last step)."""

    def __init__(self, artifact: str | Path, weights: str | Path | None = None, seed: int = 0, adapter: str | None = None,
                 browser: bool = False, prefill_chunk: int | None = None, timed_adapter: bool = False, console=None):
        self._open_artifact(artifact, prefill_chunk)
        self.hidden = int(self.config["model_config"]["hidden_size"])
        self.timed = False
        self.last_kernels: list[tuple[str, int]] = []
        self._tmp = None
        weights_dir = self._weights_dir(weights, seed)
        check_tensor_cache(weights_dir, self.manifest["parameters"])
        library = verified_library(self.artifact, self.manifest)  # node reads the file itself
        self.runner = DawnRunner(adapter, browser=browser, timed=timed_adapter, console=console)
        self.adapter = self.runner.adapter
        try:
            reply = self.runner.request(
                "open", adapter=self.adapter, wasm=str(library), weights=str(weights_dir),
                params=[p["name"] for p in self.manifest["parameters"]],
                needs_f16=any(p["dtype"] == "float16" for p in self.manifest["parameters"]),
            )
        except RunnerError:
            self.close()
            raise
        self.adapter_info = reply["adapter"]
        self.load_seconds = (reply["load_ms"] + reply["weights_ms"]) / 1e3
        self.weight_bytes = sum(int(np.prod(p["shape"])) * np.dtype(p["dtype"]).itemsize for p in self.manifest["parameters"])

    def _weights_dir(self, weights, seed: int) -> Path:
        weights = self._weights_or_params(weights)
        if str(weights) != "synthetic":
            return Path(weights)
        from ...config import parse_model_config
        from ...weights import convert_weights

        self._tmp = tempfile.TemporaryDirectory(prefix="mlcpipe-synthetic-")
        cfg = parse_model_config(self.config["model_config"], str(self.artifact / RUNTIME_CONFIG))
        return convert_weights(cfg, self.quant, "synthetic", Path(self._tmp.name) / "params", seed=seed, log=lambda *_: None)

    def reset(self) -> None:
        self.runner.request("reset", sizes=[1, self.context_window, self.prefill_chunk, int(self.config["page_size"]), 0])

    def _step(self, kind: str, tokens: np.ndarray) -> np.ndarray:
        reply = self.runner.request("forward", kind=kind, tokens=[int(t) for t in tokens], hidden=self.hidden, timed=self.timed)
        self.last_kernels = [(kernel_of(name), int(ns)) for name, ns in reply["kernels"]]
        self.last_step_ms = float(reply["ms"])
        return unb64(reply["logits"], "float32", (-1,))

    def _sample(self, logits, sampling, penalty, uniform: float) -> int:
        fields = {"logits": b64(np.ascontiguousarray(logits, dtype=np.float32)), "temperature": sampling.temperature,
                  "top_p": sampling.top_p, "uniform": uniform, "penalty": None}
        if penalty is not None:
            fields["penalty"] = {"token_ids": penalty.token_ids.tolist(), "token_cnt": penalty.token_cnt.tolist(),
                                 "penalties": penalty.penalties.reshape(-1).tolist()}
        return int(self.runner.request("sample", **fields)["token"])

    def close(self) -> None:
        if getattr(self, "runner", None) is not None:
            self.runner.close()
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class KernelRunner:
    """Kernels of an artifact's shipped lib.wasm run one by one in Dawn (for `mlcpipe check`)."""

    def __init__(self, artifact: str | Path, adapter: str | None = None, browser: bool = False):
        manifest = read_manifest(Path(artifact), RUN_FIELDS)
        library = verified_library(Path(artifact), manifest)  # node reads the file itself
        self.runner = DawnRunner(adapter, browser=browser)
        self.adapter = self.runner.adapter
        try:
            reply = self.runner.request("open", adapter=self.adapter, wasm=str(library), weights=None,
                                        params=[], needs_f16=any(p["dtype"] == "float16" for p in manifest["parameters"]))
        except RunnerError:
            self.runner.close()
            raise
        self.adapter_info = reply["adapter"]
        self.tolerance = ADAPTER_TOLERANCE.get(self.adapter, {})

    def __call__(self, name: str, args: list) -> list:
        """Run kernel `name` on NumPy arrays / scalars; returns the arguments after the call."""
        wire = []
        for a in args:
            if isinstance(a, np.ndarray):
                wire.append({"tensor": True, "shape": list(a.shape), "dtype": str(a.dtype), "bytes": b64(a)})
            else:
                wire.append({"value": a, "dtype": "int32" if isinstance(a, (int, np.integer)) else "float32"})
        reply = self.runner.request("kernel", name=name, args=wire)
        return [unb64(o, a.dtype, a.shape) if isinstance(a, np.ndarray) else a for o, a in zip(reply["outputs"], args)]

    def close(self) -> None:
        self.runner.close()


def check_tensor_cache(weights_dir: Path, parameters: list[dict]) -> None:
    """Every parameter the artifact takes is in the tensor cache with its shape and dtype, and
    every shard matches its digest (node reads the shards itself)."""
    from ...weights import verify_tensor_cache

    check_parameters(Path(weights_dir), parameters)
    verify_tensor_cache(Path(weights_dir))
"""WebLLM itself (npm @mlc-ai/web-llm, pinned in package.json) running an mlcpipe webgpu build in
headless Chromium: the page (js/webllm.html) gives WebLLM a `model_list` record whose `model` is
the converted weights directory and `model_lib` the artifact's lib.wasm, both served from
127.0.0.1 by js/browser_runner.mjs, and asks for one completion. mlcpipe's own contract checks
(`mlc_contract`) run first, so a missing function or config field is one line here, not a
failure deep in WebLLM.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ...backends import kinds_with
from ...errors import RunnerError
from ...mlc_contract import WEBLLM_TOKENIZERS, check_library, check_model_dir, check_pair
from .. import node_modules
from .dawn import DawnRunner


@dataclass(frozen=True)
class Completion:
    text: str
    finish_reason: str
    prompt_tokens: int
    completion_tokens: int
    adapter: dict
    browser: str


def webllm_complete(artifact: str | Path, model_dir: str | Path, prompt: str, max_tokens: int, *,
                    temperature: float = 0.0, top_p: float = 1.0, repetition_penalty: float = 1.0,
                    presence_penalty: float = 0.0, frequency_penalty: float = 0.0, seed: int | None = None,
                    ignore_eos: bool = False, adapter: str | None = "swiftshader", console=None) -> Completion:
    """One `engine.completions.create` of WebLLM on `artifact` (a webgpu build) + `model_dir`."""
    manifest = check_library(artifact)
    if manifest.get("target", {}).get("kind") not in kinds_with("WEBGPU_RUNTIME"):
        raise RunnerError(f"{artifact}: WebLLM runs webgpu builds (lib.wasm); this one is {manifest.get('target', {}).get('kind')!r}")
    chat_config = check_model_dir(model_dir)
    check_pair(Path(artifact), Path(model_dir), chat_config)  # WebLLM would fail inside the page
    files = chat_config["tokenizer_files"]
    if not set(files) & set(WEBLLM_TOKENIZERS):  # MLC-LLM runs token ids without one; WebLLM's reload throws
        raise RunnerError(f"{model_dir}: WebLLM needs {' or '.join(WEBLLM_TOKENIZERS)} in 'tokenizer_files' (got {files}); "
                          "convert-weights from a Hugging Face checkpoint with its tokenizer copies them")
    if not (node_modules() / "@mlc-ai" / "web-llm").is_dir():
        raise RunnerError(f"npm package @mlc-ai/web-llm not found in {node_modules()}: run scripts/setup-debian.sh (npm ci)")
    library = Path(artifact) / manifest["library"]
    with DawnRunner(adapter, browser=True, console=console) as runner:
        out = runner.request(
            "webllm", wasm=str(library), model_dir=str(model_dir), adapter=runner.adapter, prompt=prompt,
            max_tokens=max_tokens, temperature=temperature, top_p=top_p, repetition_penalty=repetition_penalty,
            presence_penalty=presence_penalty, frequency_penalty=frequency_penalty, seed=seed, ignore_eos=ignore_eos,
        )
    usage = out.get("usage") or {}
    return Completion(out["text"], out.get("finish_reason"), usage.get("prompt_tokens", -1),
                      usage.get("completion_tokens", -1), out.get("adapter") or {}, out.get("browser", ""))

"""`mlcpipe mlc-check` and `mlcpipe webllm`: a build and model directory as MLC-LLM / WebLLM see them."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path


def mlc_check(artifact: Path | None, model_dir: Path | None, echo: Callable[[str], None] = print) -> None:
    """Check the library and/or model directory against what MLC-LLM's runtimes and WebLLM read;
    `echo` gets one `ok:` line per check passed, as it passes."""
    from ..mlc_contract import WEBLLM_TOKENIZERS, check_library, check_model_dir, check_pair

    if artifact is not None:
        manifest = check_library(artifact)
        echo(f"ok: {artifact}: {manifest['library']} exports every function MLC-LLM / WebLLM call")
    if model_dir is not None:
        data = check_model_dir(model_dir)
        files = data["tokenizer_files"]
        tokenizer = (f"tokenizer files ({', '.join(files)})" if set(files) & set(WEBLLM_TOKENIZERS) else
                     f"no tokenizer WebLLM loads ({' or '.join(WEBLLM_TOKENIZERS)}; MLC-LLM runs token ids without one)")
        # was "tokenizer files ... present" for synthetic weights, which have none: WebLLM cannot load them
        echo(f"ok: {model_dir}: mlc-chat-config.json complete ({data['quantization']}, "
             f"conv_template {data['conv_template'].get('name')!r}), weight shards present; {tokenizer}")
    if artifact is not None and model_dir is not None:  # what a runtime given both binds together
        count = check_pair(artifact, model_dir, data)
        echo(f"ok: {model_dir}: holds the {count} parameters {artifact}'s library takes, with their shapes and dtypes")


def webllm(artifact: Path, model_dir: Path, prompt: str, max_new_tokens: int = 16, *, temperature: float = 0.0,
           top_p: float = 1.0, seed: int | None = None, adapter: str = "swiftshader",
           log: Callable[[str], None] = print) -> str:
    """Complete `prompt` with WebLLM itself (headless Chromium) on the build; returns the text."""
    from ..generation import Sampling
    from ..runners.webgpu.webllm import webllm_complete

    Sampling(temperature=temperature, top_p=top_p)  # the same one-line checks as run
    out = webllm_complete(artifact, model_dir, prompt, max_new_tokens, temperature=temperature, top_p=top_p, seed=seed,
                          adapter=adapter, console=log)
    log(f"[webllm] {out.browser} on {out.adapter.get('description') or out.adapter}: {out.prompt_tokens} prompt tokens, "
        f"{out.completion_tokens} generated ({out.finish_reason})")
    return out.text

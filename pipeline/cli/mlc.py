"""`mlcpipe mlc-check` and `mlcpipe webllm`: arguments only (pipeline/interface/mlc.py does the work)."""

from __future__ import annotations

from pathlib import Path

import click

from .common import Command, log


@click.command("mlc-check", cls=Command)
@click.option("--artifact", type=click.Path(path_type=Path), default=None, help="Artifact whose library MLC-LLM / WebLLM would load.")
@click.option("--model-dir", type=click.Path(path_type=Path), default=None, help="Model directory from convert-weights.")
def mlc_check(artifact, model_dir):
    """Check a library and/or model directory against what MLC-LLM's runtimes and WebLLM read."""
    from ..interface.mlc import mlc_check as check_for_mlc

    if artifact is None and model_dir is None:
        raise click.UsageError("give --artifact and/or --model-dir")
    check_for_mlc(artifact, model_dir, echo=click.echo)


@click.command("webllm", cls=Command)
@click.option("--artifact", type=click.Path(path_type=Path), required=True, help="A webgpu artifact (lib.wasm).")
@click.option("--model-dir", type=click.Path(path_type=Path), required=True, help="Model directory from convert-weights.")
@click.option("--prompt", required=True, help="Text prompt (a plain completion: no conversation template).")
@click.option("--max-new-tokens", default=16, show_default=True, type=click.IntRange(min=1))
@click.option("--temperature", type=float, default=0.0, show_default=True)
@click.option("--top-p", type=float, default=1.0, show_default=True)
@click.option("--seed", type=click.IntRange(0, 2**53 - 1), default=None,
              help="WebLLM's sampling seed (a JavaScript safe integer; negative ones fail in its generator).")
@click.option("--adapter", type=click.Choice(["auto", "swiftshader", "gpu"]), default="swiftshader", show_default=True)
def webllm(artifact, model_dir, prompt, max_new_tokens, temperature, top_p, seed, adapter):
    """Load the build in WebLLM itself (headless Chromium) and complete a prompt."""
    from ..interface.mlc import webllm as complete

    click.echo(complete(artifact, model_dir, prompt, max_new_tokens, temperature=temperature, top_p=top_p, seed=seed,
                        adapter=adapter, log=log))

"""`mlcpipe run`: arguments only (pipeline/interface/run.py does the work)."""

from __future__ import annotations

from pathlib import Path

import click

from .common import Command, device_options


@click.command("run", cls=Command)
@click.option("--artifact", type=click.Path(path_type=Path), required=True, help="Artifact directory from `mlcpipe build`.")
@click.option("--weights", default=None, help="Weights dir from convert-weights, or 'synthetic' (default: <artifact>/params).")
@click.option("--prompt-tokens", default=None, help="Comma-separated token ids.")
@click.option("--prompt", default=None, help="Text prompt (needs --tokenizer or tokenizer.json in the weights dir).")
@click.option("--tokenizer", type=click.Path(path_type=Path), default=None, help="tokenizer.json to encode/decode text.")
@click.option("--max-new-tokens", default=16, show_default=True, type=click.IntRange(min=1))
@click.option("--weights-seed", type=click.IntRange(min=0), default=None, help="Seed for --weights synthetic (default 0).")
@click.option("--temperature", type=float, default=None,
              help="Sample on the device with the library's sampler kernels at this temperature (0: greedy). "
                   "Without any sampling flag: greedy.")
@click.option("--top-p", type=float, default=None, help="Nucleus sampling: keep the most probable tokens up to this mass (default 1).")
@click.option("--repetition-penalty", type=float, default=None, help="Divide positive / multiply negative logits of generated tokens (default 1: none).")
@click.option("--presence-penalty", type=float, default=None, help="Subtract from the logits of generated tokens (default 0).")
@click.option("--frequency-penalty", type=float, default=None, help="Subtract this times each generated token's count (default 0).")
@click.option("--seed", type=int, default=None, help="Seed of the sampler's random draws (default 0); same seed, same tokens.")
@click.option("--save-logits", type=click.Path(path_type=Path), default=None, metavar="FILE.npy",
              help="Write the logits of every generated step (float32, (max_new_tokens, vocab_size)) here.")
@click.option("--prefill-chunk", type=click.IntRange(min=1), default=None,
              help="Prefill in chunks of this many tokens (at most the artifact's prefill_chunk_size, the default).")
@device_options
def run(artifact, weights, prompt_tokens, prompt, tokenizer, max_new_tokens, weights_seed, temperature, top_p,  # noqa: PLR0913
        repetition_penalty, presence_penalty, frequency_penalty, seed, save_logits, prefill_chunk,
        rpc, rpc_tracker, rpc_key, adapter, browser):
    """Generate (greedy, or sampled with the sampling flags); the last line of output is the
    generated token ids."""
    from ..interface.run import run as generate

    sampling = {"temperature": temperature, "top_p": top_p, "repetition_penalty": repetition_penalty,
                "presence_penalty": presence_penalty, "frequency_penalty": frequency_penalty, "seed": seed}
    text, out = generate(artifact, weights, prompt_tokens=prompt_tokens, prompt=prompt, tokenizer=tokenizer,
                         max_new_tokens=max_new_tokens, weights_seed=weights_seed, sampling=sampling,
                         save_logits=save_logits, prefill_chunk=prefill_chunk, rpc=rpc, rpc_tracker=rpc_tracker,
                         rpc_key=rpc_key, adapter=adapter, browser=browser)
    if text is not None:
        click.echo(text)
    click.echo(",".join(str(t) for t in out))

"""`mlcpipe profile` (+ `render`, `compare`): arguments only (pipeline/interface/profile.py does the work)."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from .common import DEFAULT_MODEL, Group, PositiveFinite, device_options, log

PROFILE_FORMATS = ["md", "text", "json", "csv", "trace", "html", "events", "phase"]


def _progress_bar(length: int, label: str):
    return click.progressbar(length=length, label=label, file=sys.stderr, show_pos=True)


@click.group("profile", cls=Group, invoke_without_command=True)
@click.option("--artifact", type=click.Path(path_type=Path), default=None, help="Artifact directory to profile.")
@click.option("--model", default=DEFAULT_MODEL, show_default=True, help="With --quant/--target: config to build (cached) and profile.")
@click.option("--quant", default=None, help="Build (or reuse) artifacts/<model>-<quant>-<target> and profile it.")
@click.option("--target", "target_name", default="llvm", show_default=True)
@click.option("--weights", default="synthetic", show_default=True, help="Weights dir from convert-weights, or 'synthetic'.")
@click.option("--prompt-len", default=None, show_default="128; webgpu 32", type=click.IntRange(min=1))
@click.option("--gen-len", default=None, show_default="32; webgpu 8", type=click.IntRange(min=1))
@click.option("--runs", default=None, show_default="3; webgpu 2", type=click.IntRange(min=1))
@click.option("--warmup", default=1, show_default=True, type=click.IntRange(min=0))
@click.option("--format", "fmt", type=click.Choice(PROFILE_FORMATS), default=None, show_default="md; phase with --browser")
@click.option("--peak-gbps", type=PositiveFinite(), default=None, help="Peak memory bandwidth for the bandwidth columns (default: a local GPU's datasheet figure by its name, else the target preset's).")
@click.option("-o", "--output", type=click.Path(path_type=Path), default=None, help="Write the report here (default: stdout).")
@click.option("--save-json", type=click.Path(path_type=Path), default=None, help="Also keep the raw profile JSON here.")
@device_options
@click.pass_context
def profile(ctx, artifact, model, quant, target_name, weights, prompt_len, gen_len, runs, warmup, fmt, peak_gbps, output, save_json,  # noqa: PLR0913
            rpc, rpc_tracker, rpc_key, adapter, browser):
    """Profile a model run: kernel statistics tables (see also `profile compare`)."""
    if ctx.invoked_subcommand is not None:
        return
    from ..interface.profile import profile as profile_run

    if (artifact is None) == (quant is None):
        raise click.UsageError(("--artifact and --quant exclude each other: " if artifact else "") +
                               "give --artifact DIR, or --quant (with --model/--target) to build and profile")
    text = profile_run(artifact, model, quant, target_name, weights, prompt_len=prompt_len, gen_len=gen_len, runs=runs,
                       warmup=warmup, fmt=fmt, peak_gbps=peak_gbps, output=output, save_json=save_json, rpc=rpc,
                       rpc_tracker=rpc_tracker, rpc_key=rpc_key, adapter=adapter, browser=browser, log=log,
                       progress_bar=_progress_bar)
    if output:
        click.echo(str(output), err=True)
    else:
        click.echo(text)


@profile.command("render")
@click.argument("profile_json", type=click.Path(path_type=Path, exists=True, dir_okay=False))
@click.option("--format", "fmt", type=click.Choice(PROFILE_FORMATS), default="md", show_default=True)
@click.option("--peak-gbps", type=PositiveFinite(), default=None, help="Peak memory bandwidth (default: the profile's).")
@click.option("-o", "--output", type=click.Path(path_type=Path), default=None)
def profile_render(profile_json, fmt, peak_gbps, output):
    """Render a saved profile JSON in another format."""
    from ..interface.profile import render

    text = render(profile_json, fmt, peak_gbps, output)
    if not output:
        click.echo(text)


@profile.command("compare")
@click.argument("before", type=click.Path(path_type=Path, exists=True, dir_okay=False))
@click.argument("after", type=click.Path(path_type=Path, exists=True, dir_okay=False))
@click.option("-o", "--output", type=click.Path(path_type=Path), default=None)
@click.option("--allow-different", is_flag=True, help="Compare profiles of different models or quantizations (refused by default).")
def profile_compare(before, after, output, allow_different):
    """A/B report of two profile JSON files (per-kernel Δ with a significance test)."""
    from ..interface.profile import compare

    text = compare(before, after, output, allow_different)
    if not output:
        click.echo(text)

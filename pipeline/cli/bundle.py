"""`mlcpipe bundle`: arguments only (pipeline/interface/bundle.py does the work)."""

from __future__ import annotations

from pathlib import Path

import click

from .common import Command, log


@click.command("bundle", cls=Command)
@click.option("--set", "sets", multiple=True, metavar="MODEL:QUANT[,QUANT...]",
              help="Models and quantizations to ship as cuda (sm_90) artifacts; repeatable "
                   "(default: llama-3.2-1b:q4f16_1,q4f32_1,q0f16 and llama-tiny:q4f16_1).")
@click.option("--graph", multiple=True, metavar="MODEL:QUANT",
              help="Also ship these built with cuda_graph (default: llama-3.2-1b:q4f16_1 when --set is not given).")
@click.option("--cpu-model", "cpu_models", multiple=True, help="Also ship these --set models' portable llvm builds (default: llama-tiny where it is in the set).")
@click.option("--bench-model", "bench_models", multiple=True,
              help="Benchmark these --set models against PyTorch on the GPU (default: llama-3.2-1b where it is in the set).")
@click.option("--python", default="3.12", show_default=True,
              help="Python version of the device machine (its tvm_ffi wheel is downloaded), or 'current'.")
@click.option("--ffi-wheel", type=click.Path(path_type=Path, dir_okay=False, exists=True), default=None,
              help="The apache-tvm-ffi wheel to ship instead of downloading one.")
@click.option("--prompt-len", default=300, show_default=True, type=click.IntRange(min=1),
              help="Prompt tokens of the recorded llvm run (cut to the model's context window).")
@click.option("--prefill-chunk", default=None, show_default="128, or the set's smallest prefill_chunk_size", type=click.IntRange(min=1),
              help="Prefill chunk of the recorded run and of the run on the device.")
@click.option("--steps", default=6, show_default=True, type=click.IntRange(min=1, max=64), help="Recorded steps (prefill + decodes).")
@click.option("--max-mib", default=60.0, show_default=True, type=click.FloatRange(min=1), help="Refuse a bundle larger than this.")
@click.option("--tune", multiple=True, metavar="MODEL:QUANT[,QUANT...]",
              help="Compile the knob candidates of these decode GEMVs (static-shape kernels) for the job's tune "
                   "step to time on the GPU; repeatable (default: llama-3.2-1b:q4f16_1,q4f32_1,q0f16 when --set "
                   "is not given).")
@click.option("--tune-budget", default=32, show_default=True, type=click.IntRange(min=1), help="Knob candidates per kernel.")
@click.option("--out", type=click.Path(path_type=Path), default=None, help="Bundle folder (default artifacts/bundle).")
def bundle(sets, graph, cpu_models, bench_models, python, ffi_wheel, prompt_len, prefill_chunk, steps, max_mib, tune, tune_budget, out):  # noqa: PLR0913
    """Pack cuda artifacts, their references and the llvm expectations with TVM's runtime alone and
    the run-side code: one folder whose run.sh does all the GPU work on a machine without apache-tvm."""
    from ..interface import bundle as work

    path, size = work.bundle(out, sets=sets or work.DEFAULT_SETS, graph=graph or (() if sets else work.DEFAULT_GRAPH),
                             cpu_models=cpu_models or None, bench_models=bench_models or None,
                             python=python, ffi_wheel=ffi_wheel, prompt_len=prompt_len, prefill_chunk=prefill_chunk,
                             steps=steps, max_mib=max_mib, tune=tune or (() if sets else work.DEFAULT_TUNE), tune_budget=tune_budget,
                             log=log)
    click.echo(f"{path} ({size / 2**20:.1f} MiB)")

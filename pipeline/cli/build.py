"""`mlcpipe build`: arguments only (pipeline/interface/build.py does the work)."""

from __future__ import annotations

from pathlib import Path

import click

from .common import DEFAULT_MODEL, Command, log


@click.command("build", cls=Command)
@click.option("--model", default=DEFAULT_MODEL, show_default=True, help="Config name in configs/models/ or a YAML path.")
@click.option("--quant", required=True, help="q0f16, q0f32, q4f16_1 or q4f32_1.")
@click.option("--target", "target_name", default="llvm", show_default=True, help="Target preset in configs/targets/.")
@click.option("--mcpu", default=None, help="llvm: the CPU to build for instead of this one (e.g. skylake-avx512; portable: x86-64-v3, for any AVX2 machine).")
@click.option("--arch", default=None, help="cuda: the arch code is generated for (e.g. sm_90).")
@click.option("--fatbin-archs", default=None, help="cuda: comma-separated archs in the fatbin (default sm_80,sm_90).")
@click.option("--cuda-graph", is_flag=True, help="cuda: capture decode's static kernel runs as CUDA graphs (TVM's RewriteCUDAGraph).")
@click.option("--output", type=click.Path(path_type=Path), default=None, help="Artifact directory (default artifacts/<model>-<quant>-<target>/).")
@click.option("--weights", default=None, help="Also convert weights into <artifact>/params: a HF checkpoint dir or 'synthetic'.")
@click.option("--dump-ir", is_flag=True, help="Write the IR after each pipeline phase into <artifact>/ir/.")
@click.option("--tuning-db", type=click.Path(path_type=Path, dir_okay=False), default=None,
              help="Tuning database from `mlcpipe tune` (default artifacts/tuning/<target>.json when present).")
def build(model, quant, target_name, mcpu, arch, fatbin_archs, cuda_graph, output, weights, dump_ir, tuning_db):  # noqa: PLR0913
    """Compile a model into an artifact directory (library + manifest + runtime config)."""
    from ..interface.build import build as build_artifact

    archs = [a.strip() for a in fatbin_archs.split(",") if a.strip()] if fatbin_archs else None
    path = build_artifact(model, quant, target_name, mcpu=mcpu, arch=arch, fatbin_archs=archs, cuda_graph=cuda_graph, output=output,
                          weights=weights, dump_ir=dump_ir, tuning_db=tuning_db, log=log)
    click.echo(str(path))

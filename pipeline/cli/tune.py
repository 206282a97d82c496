"""`mlcpipe tune`: arguments only (pipeline/interface/tune.py does the work)."""

from __future__ import annotations

from pathlib import Path

import click

from .common import DEFAULT_MODEL, Command, log


@click.command("tune", cls=Command)
@click.option("--model", default=DEFAULT_MODEL, show_default=True, help="Config name in configs/models/ or a YAML path.")
@click.option("--quant", required=True, help="q0f16, q0f32, q4f16_1 or q4f32_1.")
@click.option("--target", "target_name", default="llvm", show_default=True, help="Target preset (timed: llvm here, cuda on a GPU machine).")
@click.option("--mcpu", default=None, help="llvm: override the detected host CPU.")
@click.option("--arch", default=None, help="cuda: the arch to tune for (e.g. sm_90).")
@click.option("--db", "db_path", type=click.Path(path_type=Path, dir_okay=False), default=None,
              help="Tuning database to update (default artifacts/tuning/<target>.json).")
@click.option("--kernels", "pattern", default=None, help="Only kernels whose name matches this regex.")
@click.option("--budget", default=8, show_default=True, type=click.IntRange(min=1), help="Knob candidates timed per kernel and rule (defaults included; every rule that takes the kernel competes).")
@click.option("--tokens", default=None, type=click.IntRange(min=1),
              help="Token count bound to prefill kernels' symbolic dim (default 128, or the model's prefill_chunk_size when smaller).")
@click.option("--tuner", type=click.Choice(["knobs", "metaschedule"]), default="knobs", show_default=True,
              help="knobs: time our rules' knob candidates; metaschedule: TVM MetaSchedule search (static-shape kernels), "
                   "kept where faster than our schedule.")
@click.option("--trials", default=32, show_default=True, type=click.IntRange(min=1), help="metaschedule: candidates searched per kernel.")
def tune(model, quant, target_name, mcpu, arch, db_path, pattern, budget, tokens, tuner, trials):  # noqa: PLR0913
    """Time schedule knob candidates (or a MetaSchedule search) per kernel; store the winners for `mlcpipe build`."""
    from ..interface.tune import tune as run_tune

    click.echo(run_tune(model, quant, target_name, mcpu=mcpu, arch=arch, db_path=db_path, pattern=pattern, budget=budget,
                        tokens=tokens, tuner=tuner, trials=trials, log=log))

"""`mlcpipe` command line (MLC-LLM's `cli/`): each module declares click commands, checks the
arguments' syntax and calls one function of `pipeline/interface/`, where the work lives."""

from __future__ import annotations

import click

from . import build, bundle, check, convert_weights, import_config, mlc, nightly, profile, run, tune
from .common import UserErrors


@click.group(cls=UserErrors)
@click.option("--threads", type=click.IntRange(min=1), default=None,
              help="CPU threads for TVM's runtime (default: $TVM_NUM_THREADS, else every CPU available).")
def main(threads: int | None) -> None:
    """mlcpipe: YAML model -> quantized, fused TVM kernels -> artifacts -> runtime."""
    from ..interface import configure_process

    configure_process(threads)


for _command in (build.build, tune.tune, convert_weights.convert_weights, run.run, check.check, profile.profile,
                 nightly.nightly, nightly.verify, mlc.mlc_check, mlc.webllm, bundle.bundle,
                 import_config.import_config):
    main.add_command(_command)
del _command

"""What a knob tuner tries, on the compile side: the model's kernels before scheduling, and the
order of their knob candidates (`mlcpipe tune` times them here, `mlcpipe bundle --tune` on another
machine)."""

from __future__ import annotations

import itertools
import random
import re

import tvm

from ..config import ModelConfig, short_repr
from ..quantization import Quantization


class TuneError(ValueError):
    pass


def matching_kernels(kernels: dict[str, tvm.tirx.PrimFunc], pattern: str | None, what: str) -> list[tuple[str, tvm.tirx.PrimFunc]]:
    """The kernels (sorted by name) whose name matches `pattern` (all without one); a pattern that
    matches none is a TuneError naming how many kernels `what` has (a typo, not zero work)."""
    regex = re.compile(pattern) if pattern else None
    chosen = [(name, func) for name, func in sorted(kernels.items()) if regex is None or regex.search(name)]
    if not chosen:
        raise TuneError(f"--kernels {short_repr(pattern)}: matches none of the {len(kernels)} kernels of {what}")
    return chosen


def nothing_tuned(pattern: str | None, chosen: list[tuple[str, tvm.tirx.PrimFunc]], what: str, why: str) -> str:
    """The one line for a tune of the `chosen` kernels that found nothing to store (then no database is written)."""
    names = [name for name, _ in chosen]
    shown = ", ".join(names[:4]) + (f" and {len(names) - 4} more" if len(names) > 4 else "")
    which = f"--kernels {short_repr(pattern)}: the" if pattern else "the"
    return f"{which} {len(names)} kernel{'s' * (len(names) > 1)} of {what} ({shown}): nothing to tune ({why})"


def unscheduled_kernels(config: ModelConfig, quant: Quantization, target: tvm.target.Target) -> dict[str, tvm.tirx.PrimFunc]:
    """The model's PrimFuncs after fusion (dequantize fused into its matmul), before scheduling."""
    from ..build import export_model
    from ..passes import run_pipeline

    mod, _ = export_model(config, quant, target)
    mod = run_pipeline(mod, target, until="fuse-tir")
    return {gv.name_hint: f for gv, f in mod.functions_items() if isinstance(f, tvm.tirx.PrimFunc)}


def shuffled(space: dict[str, list], default: dict, budget: int, seed: int) -> list[dict]:
    """Up to `budget` knob sets: the defaults, then the other combinations in a seeded random order."""
    names = sorted(space)
    grid = [dict(zip(names, values)) for values in itertools.product(*(space[n] for n in names))]
    base = {k: default[k] for k in names}
    rest = [g for g in grid if g != base]
    random.Random(seed).shuffle(rest)
    return [base] + rest[: max(0, budget - 1)]


def candidates(space: dict[str, list], default: dict, budget: int, seed: int) -> list[dict]:
    """Up to `budget` knob sets: the defaults, then each knob moved alone (in `space` order), then
    random combinations (`shuffled`'s order)."""
    base = {k: default[k] for k in sorted(space)}
    out = [base]
    for name in sorted(space):
        out += [{**base, name: v} for v in space[name] if v != base[name]]
    out += [c for c in shuffled(space, default, len(out) + budget, seed) if c not in out]
    return out[:budget]

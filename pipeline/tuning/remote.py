"""Knob candidates compiled here and timed on another machine: `mlcpipe bundle --tune` packs every
candidate of a model's static-shape kernels (the decode GEMVs) as one library plus `tune.json`,
and the bundle job's `tune` step (pipeline/interface/job.py) checks and times them on the GPU and
writes a tuning database (`tuning.json`, `from_remote_timings`) that `mlcpipe build --tuning-db`
applies. The format of tune.json: docs/tuning.md.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from pathlib import Path

import tvm

from ..config import ModelConfig
from ..kernel_info import signature_of, symbolic_dims
from ..quantization import Quantization
from ..targets import TargetSpec
from . import TUNE_FORMAT, target_key
from .candidates import candidates, matching_kernels, unscheduled_kernels

LIBRARY = "tune.so"
INDEX = "tune.json"


def prepare(config: ModelConfig, quant: Quantization, target: TargetSpec, out_dir: Path, pattern: str | None = None,
            budget: int = 32, seed: int = 0, log: Callable[[str], None] = print) -> dict:
    """Schedule up to `budget` knob candidates (`candidates`: the defaults first) of every static-shape kernel
    matching `pattern` that a rule with knobs takes, compile them into `out_dir`/tune.so (one
    function per candidate) and describe them in `out_dir`/tune.json; returns that index."""
    from mlcpipe.schedules import RULES, with_knobs
    from mlcpipe.schedules.signature import kernel_signature

    from ..backends import backend

    tvm_target = target.tvm_target()
    funcs: dict[str, tvm.tirx.PrimFunc] = {}
    kernels = []
    for name, func in matching_kernels(unscheduled_kernels(config, quant, tvm_target), pattern, f"{config.name} {quant.name}"):
        if symbolic_dims(func):
            continue  # the device side times one shape: a symbolic dim has none
        contenders = [(r, r.knob_space(func, tvm_target)) for r in RULES[target.kind]
                      if hasattr(r, "knob_space") and r.apply(func, tvm_target, False) is not None]
        contenders = [(r, space) for r, space in contenders if space]
        if not contenders:
            continue
        listed = []
        for rule, space in contenders:
            for knobs in candidates(space, dataclasses.asdict(rule), budget, seed):
                sch = with_knobs(rule, knobs).apply(func, tvm_target, False)
                valid = getattr(with_knobs(rule, knobs), "valid", None)
                if sch is None or (listed and valid is not None and not valid(func, tvm_target)):
                    continue  # declined, or shrunk to another candidate's schedule (the defaults stay)
                symbol = f"k{len(kernels)}_c{len(listed)}"
                funcs[symbol] = sch.mod["main"].with_attr("global_symbol", symbol)
                listed.append({"function": symbol, "rule": type(rule).__name__, "knobs": knobs})
        first = contenders[0][0]
        kernels.append({"kernel": name, "signature": kernel_signature(func), "args": signature_of(func),
                        "default_rule": type(first).__name__,
                        "default_knobs": {k: dataclasses.asdict(first)[k] for k in contenders[0][1]},
                        "candidates": listed})
        log(f"[tune] {name}: {len(listed)} candidates")
    if not kernels:
        raise ValueError(f"{config.name} {quant.name} on {target.name}: no static-shape kernel with knobs"
                         + (f" matches {pattern!r}" if pattern else ""))
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    be = backend(target.kind)
    be.install_lowerings()
    with be.compile_context(target), tvm_target:
        lib = tvm.compile(tvm.IRModule(funcs), target=tvm_target)
    be.export(lib, target, out_dir, LIBRARY)
    index = {"format": TUNE_FORMAT, "model": config.name, "quantization": quant.name, "target": target.target,
             "target_key": target_key(target.target), "target_name": target.name, "seed": seed,
             "library": LIBRARY, "kernels": kernels}
    (out_dir / INDEX).write_text(json.dumps(index, indent=1) + "\n")
    return index

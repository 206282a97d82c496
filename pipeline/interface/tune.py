"""`mlcpipe tune`: schedule knob candidates (or a MetaSchedule search) timed per kernel, the
winners stored in the tuning database for `mlcpipe build`."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from ..errors import ConfigError, OptionValueError
from .build import target_overrides

DEFAULT_TOKENS = 128


def tune(model: str, quant: str, target_name: str, *, mcpu: str | None = None, arch: str | None = None,
         db_path: Path | None = None, pattern: str | None = None, budget: int = 8, tokens: int | None = None,
         tuner: str = "knobs", trials: int = 32, log: Callable[[str], None] = print) -> str:
    """Tune the kernels matching `pattern`; returns the report (table and a summary line). `tokens`
    (prefill kernels): default 128, or the model's prefill_chunk_size when smaller."""
    from ..config import load_model_config
    from ..conformance import kernel_pattern
    from ..targets import cpu_code_target, load_target, missing_cpu_flags, required_cpu_flags
    from ..tuning import TuningDB, default_db_path

    kernel_pattern(pattern)
    config = load_model_config(model)
    scheme = config.scheme(quant)
    if tokens is None:
        tokens = min(DEFAULT_TOKENS, config.prefill_chunk_size)
    if tuner == "knobs" and tokens > config.prefill_chunk_size:  # the engine prefills in chunks of at most that
        raise OptionValueError(f"{tokens}: past the prefill chunk of {config.name} (prefill_chunk_size "
                               f"{config.prefill_chunk_size}): its prefill kernels never see more tokens in one call", "--tokens")
    target = load_target(target_name, target_overrides(mcpu, arch))
    missing = missing_cpu_flags(required_cpu_flags(target.target) or [])
    if missing:  # was: the first timed kernel stopped the process on an illegal instruction
        cpu = (cpu_code_target(target.target) or {}).get("mcpu")
        where = f"--mcpu {cpu!r}" if mcpu else f"CPU {cpu!r} of the {target_name} preset"
        raise ConfigError(f"{where}: its code needs {', '.join(missing)}, which this CPU lacks (/proc/cpuinfo flags), "
                          "and tune times kernels here; tune on such a CPU, or build for it untuned")
    db = TuningDB.load(db_path or default_db_path(target.name))
    if tuner == "metaschedule":
        from ..tuning.metaschedule import report, tune_metaschedule

        results = tune_metaschedule(config, scheme, target, db, pattern=pattern, trials=trials, log=log)
        kept = sum(r.kept for r in results)
        return f"{report(results)}\n\n{len(results)} kernels searched, {kept} MetaSchedule schedules kept; database: {db.path}"
    from ..tuning.knobs import report, tune as run_tune

    results = run_tune(config, scheme, target, db, pattern=pattern, budget=budget, tokens=tokens, log=log)
    return f"{report(results)}\n\n{len(results)} kernels tuned; database: {db.path}"

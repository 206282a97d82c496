"""`mlcpipe build`: a model config, quantization and target preset compiled into an artifact."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from ..errors import OptionValueError


def target_overrides(mcpu: str | None, arch: str | None = None, fatbin_archs: list[str] | None = None,
                     cuda_graph: bool = False) -> dict:
    """The preset keys the command line overrides (those given, non-empty)."""
    overrides = {"mcpu": mcpu, "arch": arch, "fatbin_archs": fatbin_archs, "cuda_graph": cuda_graph}
    return {k: v for k, v in overrides.items() if v}


def build(model: str, quant: str, target_name: str, *, mcpu: str | None = None, arch: str | None = None,
          fatbin_archs: list[str] | None = None, cuda_graph: bool = False, output: Path | None = None,
          weights: str | None = None, dump_ir: bool = False, tuning_db: Path | None = None,
          log: Callable[[str], None] = print) -> Path:
    """Compile `model` into an artifact directory; returns its path."""
    from ..build import build as compile_model
    from ..config import load_model_config
    from ..targets import load_target

    config = load_model_config(model)
    scheme = config.scheme(quant)
    target = load_target(target_name, target_overrides(mcpu, arch, fatbin_archs, cuda_graph))
    if tuning_db is not None and not tuning_db.is_file():
        raise OptionValueError(f"{tuning_db}: no such file", "--tuning-db")
    if tuning_db is not None:
        check_db_tunes(tuning_db, target.target)
    else:
        from ..tuning import check_db_to_read

        check_db_to_read()
    return compile_model(config, scheme, target, output=output, dump_ir=dump_ir, weights=weights, log=log, tuning_db=tuning_db)


def check_db_tunes(path: Path, target: dict) -> None:
    """A database named on the command line holds records for this build's target (was: one tuned
    for another --mcpu / --arch built untuned without a word; the default database stays optional)."""
    from ..errors import ConfigError
    from ..tuning import TuningDB, target_key

    key = target_key(target)
    held = sorted(TuningDB.load(path).records)
    if key not in held:
        raise ConfigError(f"--tuning-db {path}: no records for this build's target {key}; it holds "
                          f"{', '.join(held) if held else 'none'} (tune this target with `mlcpipe tune`, or build for one of those)")

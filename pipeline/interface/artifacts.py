"""ensure_artifact: a built artifact for (model, quant, target) from the content-addressed cache.

The key is the nightly cache's (pipeline/nightly/cache.py): model config file, quantization,
resolved target, the source of pipeline/ and schedules/, the target's tuning database and the
tvm / tvm-ffi / mlcpipe versions, so a code, tuning or compiler change means a new build. The
build runs in a child process: the compiler's memory never counts as the caller's (a profile's
peak RSS is the model's).
"""

from __future__ import annotations

import multiprocessing
from pathlib import Path

from ..artifact import write_lock
from ..config import ModelConfig, artifacts_root, load_model_config
from ..errors import ArtifactError
from ..nightly.cache import artifact_entry, cache_inputs, digest, lookup_artifact
from ..targets import load_target


def default_cache_dir() -> Path:
    """artifacts/cache ($MLCPIPE_ARTIFACTS overrides the artifacts dir)."""
    return artifacts_root() / "cache"


def ensure_artifact(model: str | ModelConfig, quant: str, target_name: str, cache_dir: Path | None = None, log=print,
                    overrides: dict | None = None) -> Path:
    """The cached artifact whose key matches today's inputs, else a fresh build into the cache
    (`overrides`: preset keys set on top of the preset, as `build`'s options set them)."""
    config = model if isinstance(model, ModelConfig) else load_model_config(model)
    config.scheme(quant)  # one line now, not a failed child build
    target = load_target(target_name, overrides)
    inputs = cache_inputs(config, quant, target)
    key = digest(inputs)
    cache_dir = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    found = lookup_artifact(cache_dir, key)
    if found is not None:
        log(f"[mlcpipe] reusing {found} (cache key {key[:12]})")
        return found
    entry = artifact_entry(cache_dir, key)
    # one builder per key: another mlcpipe wanting the same entry waits here, then reuses it
    with write_lock(entry.parent / "ensure", wait=True, role=" (the build cache)"):
        found = lookup_artifact(cache_dir, key)
        if found is not None:
            log(f"[mlcpipe] reusing {found}, built meanwhile by another mlcpipe (cache key {key[:12]})")
            return found
        log(f"[mlcpipe] building {config.name} {quant} {target_name} into {entry} (cache key {key[:12]})")
        child = multiprocessing.get_context("spawn").Process(
            target=_build, args=(config, quant, target_name, str(entry), {"cache_key": key, "cache_inputs": inputs}, overrides))
        child.start()
        child.join()
        if child.exitcode != 0 or lookup_artifact(cache_dir, key) is None:
            again = (f"run `mlcpipe build --model {config.source} --quant {quant} --target {target_name}` to see why"
                     if str(config.source).endswith((".yaml", ".yml")) else "the build's own error is above")  # not from an artifact's config
            raise ArtifactError(f"building {config.name} {quant} for {target_name} failed (exit {child.exitcode}); {again}")
    return entry


def _build(config: ModelConfig, quant: str, target_name: str, output: str, extra: dict, overrides: dict | None = None) -> None:
    """The child's build. The config itself, not its file: an artifact's runtime config (a profile's
    llvm twin of a GPU artifact) is no YAML a child could load again."""
    from ..build import build

    build(config, config.scheme(quant), load_target(target_name, overrides), output=Path(output), manifest_extra=extra,
          log=lambda _m: None)

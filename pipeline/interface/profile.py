"""`mlcpipe profile`: profile a model run (kernel statistics), render a saved profile, or compare two."""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable
from pathlib import Path

from .device import device_of, remote_stops, run_options


class _NoBar:
    def update(self, steps: int) -> None:
        del steps


def _no_progress_bar(length: int, label: str):
    del length, label
    return contextlib.nullcontext(_NoBar())


def output_file(path: Path | None, flag: str, example: str) -> Path | None:
    """A file the command will write (-o, --save-json), checked before any work."""
    from ..artifact import check_output_file

    return None if path is None else check_output_file(path, flag, example)


def profile(artifact: Path | None, model: str, quant: str | None, target_name: str, weights: str, *,  # noqa: PLR0913
            prompt_len: int | None = None, gen_len: int | None = None, runs: int | None = None, warmup: int = 1,
            fmt: str | None = None, peak_gbps: float | None = None, output: Path | None = None,
            save_json: Path | None = None, rpc: str | None = None, rpc_tracker: str | None = None,
            rpc_key: str | None = None, adapter: str | None = None, browser: bool = False,
            log: Callable[[str], None] = print, progress_bar=_no_progress_bar) -> str:
    """Profile `artifact` (or the cached build of model/quant/target); the report is written to
    `output` when given, and returned. `progress_bar(length, label)`: a context manager giving an
    object with `update(n)`."""
    from ..artifact import RUN_FIELDS, read_manifest
    from ..profiler.core import Workload
    from ..profiler.driver import profile as profile_engine
    from ..profiler.reports import render
    from ..profiler.schema import save_profile
    from ..runtime import open_engine

    from ..artifact import check_distinct_paths, write_file_atomic

    def check_outputs() -> None:  # not into the artifact or the weights (a report over manifest.json)
        inputs = {"--artifact": artifact, "--weights": Path(weights) if weights not in (None, "synthetic") else None}
        check_distinct_paths({}, {"-o": output, "--save-json": save_json}, inputs)

    check_outputs()  # first: "-o ART: is a directory; ... such as ART/report.md" named a file inside the input
    output_file(output, "-o", "report.md")
    output_file(save_json, "--save-json", "profile.json")
    if artifact is None:  # the compile side only when there is no artifact to profile
        from .artifacts import ensure_artifact

        artifact = ensure_artifact(model, quant, target_name, log=log)
        check_outputs()
    manifest = read_manifest(artifact, RUN_FIELDS)
    device = device_of(artifact)
    options = dataclasses.replace(run_options(rpc, rpc_tracker, rpc_key, adapter, browser), timed=True, console=log)
    if browser and fmt is None:
        fmt = "phase"  # the browser harness's per-phase GPU profile reports and metrics lines
    prompt_len, gen_len, runs = (v if v is not None else d for v, d in zip((prompt_len, gen_len, runs), device.PROFILE_DEFAULTS))
    total = (warmup + runs) * 2

    def llvm_twin() -> Path:  # the same model built for llvm (profiles over RPC record its call sequence)
        from ..artifact import model_config_of
        from .artifacts import ensure_artifact

        return ensure_artifact(model_config_of(artifact), manifest["quantization"], "llvm", log=log)

    with remote_stops(options, artifact):
        engine = open_engine(artifact, weights, 0, options)
        try:
            with progress_bar(total, f"profiling {manifest['target']['kind']}") as bar:
                data = profile_engine(engine, options, weights, llvm_twin, Workload(prompt_len, gen_len, runs, warmup),
                                      progress=lambda label, done, n: bar.update(1))
        finally:
            if hasattr(engine, "close"):
                engine.close()
    if peak_gbps is None:
        from ..device import peak_gbps as default_peak

        peak_gbps = default_peak(manifest["target"]["kind"], data["target_name"], here=rpc is None and rpc_tracker is None)
    data["peak_gbps"] = peak_gbps
    if save_json:
        save_profile(data, save_json)
    text = render(data, fmt or "md", peak_gbps=peak_gbps)
    if output:
        write_file_atomic(output, text)
    return text


def render(profile_json: Path, fmt: str = "md", peak_gbps: float | None = None, output: Path | None = None) -> str:
    """A saved profile JSON in another format; written to `output` when given, and returned."""
    from ..profiler.reports import render as render_profile
    from ..artifact import check_distinct_paths, write_file_atomic
    from ..profiler.schema import load_profile

    output_file(output, "-o", "report.md")
    check_distinct_paths({"PROFILE_JSON": profile_json}, {"-o": output})
    data = load_profile(profile_json)
    text = render_profile(data, fmt, peak_gbps=peak_gbps if peak_gbps is not None else data.get("peak_gbps"))
    if output:
        write_file_atomic(output, text)
    return text


def compare(before: Path, after: Path, output: Path | None = None, allow_different: bool = False) -> str:
    """A/B report of two profile JSON files; written to `output` when given, and returned."""
    from ..profiler.compare import check_comparable
    from ..profiler.compare import compare as compare_profiles
    from ..artifact import check_distinct_paths, write_file_atomic
    from ..profiler.schema import load_profile

    output_file(output, "-o", "compare.md")
    check_distinct_paths({"BEFORE": before, "AFTER": after}, {"-o": output})
    a, b = load_profile(before), load_profile(after)
    if not allow_different:
        check_comparable(a, b, str(before), str(after))
    text = compare_profiles(a, b, name_a=before.stem, name_b=after.stem)
    if output:
        write_file_atomic(output, text)
    return text

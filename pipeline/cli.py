"""`mlcpipe` command line: argument parsing only; the work lives in the pipeline modules."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import click

DEFAULT_MODEL = "llama-3.2-1b"


def _log(message: str) -> None:
    click.echo(message, err=True)


MAX_ERROR_CHARS = 2000


def _fail(exc: Exception) -> None:
    message = " ".join(str(exc).split("\n"))  # one line, whatever raised it
    if len(message) > MAX_ERROR_CHARS:
        message = message[: MAX_ERROR_CHARS - 8] + "...(cut)"
    click.echo(f"error: {message}", err=True)
    sys.exit(2)


class _UserErrors(click.Group):
    """Turn known user-facing errors into a one-line message and exit status 2."""

    def invoke(self, ctx):
        from .errors import ArtifactError, ConfigError, ProfileError

        try:
            return super().invoke(ctx)
        except (ConfigError, ArtifactError, ProfileError, ValueError) as exc:
            _fail(exc)


@click.group(cls=_UserErrors)
@click.option("--threads", type=click.IntRange(min=1), default=None,
              help="CPU threads for TVM's runtime (default: $TVM_NUM_THREADS, else every CPU available).")
def main(threads: int | None) -> None:
    """mlcpipe: YAML model -> quantized, fused TVM kernels -> artifacts -> runtime."""
    from .threads import configure

    configure(threads)


def _target_overrides(mcpu: str | None, arch: str | None = None, fatbin_archs: str | None = None) -> dict:
    overrides = {"mcpu": mcpu, "arch": arch}
    if fatbin_archs:
        overrides["fatbin_archs"] = [a.strip() for a in fatbin_archs.split(",") if a.strip()]
    return {k: v for k, v in overrides.items() if v}


@main.command()
@click.option("--model", default=DEFAULT_MODEL, show_default=True, help="Config name in configs/models/ or a YAML path.")
@click.option("--quant", required=True, help="q0f16, q0f32, q4f16_1 or q4f32_1.")
@click.option("--target", "target_name", default="llvm", show_default=True, help="Target preset in configs/targets/.")
@click.option("--mcpu", default=None, help="llvm: override the detected host CPU (e.g. skylake-avx512).")
@click.option("--arch", default=None, help="cuda: the arch code is generated for (e.g. sm_90).")
@click.option("--fatbin-archs", default=None, help="cuda: comma-separated archs in the fatbin (default sm_80,sm_90).")
@click.option("--output", type=click.Path(path_type=Path), default=None, help="Artifact directory (default artifacts/<model>-<quant>-<target>/).")
@click.option("--weights", default=None, help="Also convert weights into <artifact>/params: a HF checkpoint dir or 'synthetic'.")
@click.option("--dump-ir", is_flag=True, help="Write the IR after each pipeline phase into <artifact>/ir/.")
@click.option("--tuning-db", type=click.Path(path_type=Path, dir_okay=False), default=None,
              help="Tuning database from `mlcpipe tune` (default artifacts/tuning/<target>.json when present).")
def build(model, quant, target_name, mcpu, arch, fatbin_archs, output, weights, dump_ir, tuning_db):  # noqa: PLR0913
    """Compile a model into an artifact directory (library + manifest + runtime config)."""
    from .build import build as run_build
    from .config import load_model_config
    from .targets import load_target

    config = load_model_config(model)
    target = load_target(target_name, _target_overrides(mcpu, arch, fatbin_archs))
    if tuning_db is not None and not tuning_db.is_file():
        raise click.BadParameter(f"{tuning_db}: no such file", param_hint="--tuning-db")
    path = run_build(config, quant, target, output=output, dump_ir=dump_ir, weights=weights, log=_log, tuning_db=tuning_db)
    click.echo(str(path))


@main.command()
@click.option("--model", default=DEFAULT_MODEL, show_default=True, help="Config name in configs/models/ or a YAML path.")
@click.option("--quant", required=True, help="q0f16, q0f32, q4f16_1 or q4f32_1.")
@click.option("--target", "target_name", default="llvm", show_default=True, help="Target preset (timed: llvm here, cuda on a GPU machine).")
@click.option("--mcpu", default=None, help="llvm: override the detected host CPU.")
@click.option("--arch", default=None, help="cuda: the arch to tune for (e.g. sm_90).")
@click.option("--db", "db_path", type=click.Path(path_type=Path, dir_okay=False), default=None,
              help="Tuning database to update (default artifacts/tuning/<target>.json).")
@click.option("--kernels", "pattern", default=None, help="Only kernels whose name matches this regex.")
@click.option("--budget", default=8, show_default=True, type=click.IntRange(min=1), help="Knob candidates timed per kernel (defaults included).")
@click.option("--tokens", default=128, show_default=True, type=click.IntRange(min=1), help="Token count bound to prefill kernels' symbolic dim.")
@click.option("--tuner", type=click.Choice(["knobs", "metaschedule"]), default="knobs", show_default=True,
              help="knobs: time our rules' knob candidates; metaschedule: TVM MetaSchedule search (static-shape kernels), "
                   "kept where faster than our schedule.")
@click.option("--trials", default=32, show_default=True, type=click.IntRange(min=1), help="metaschedule: candidates searched per kernel.")
def tune(model, quant, target_name, mcpu, arch, db_path, pattern, budget, tokens, tuner, trials):  # noqa: PLR0913
    """Time schedule knob candidates (or a MetaSchedule search) per kernel; store the winners for `mlcpipe build`."""
    from .conformance import kernel_pattern
    from .config import check_quantization, load_model_config
    from .targets import load_target
    from .tuning import TuningDB, default_db_path

    kernel_pattern(pattern)
    config = load_model_config(model)
    check_quantization(config, quant)
    target = load_target(target_name, _target_overrides(mcpu, arch))
    db = TuningDB.load(db_path or default_db_path(target.name))
    if tuner == "metaschedule":
        from .tune_metaschedule import report, tune_metaschedule

        results = tune_metaschedule(config, quant, target, db, pattern=pattern, trials=trials, log=_log)
        kept = sum(r.kept for r in results)
        click.echo(report(results))
        click.echo(f"\n{len(results)} kernels searched, {kept} MetaSchedule schedules kept; database: {db.path}")
        return
    from .tune import report, tune as run_tune

    results = run_tune(config, quant, target, db, pattern=pattern, budget=budget, tokens=tokens, log=_log)
    click.echo(report(results))
    click.echo(f"\n{len(results)} kernels tuned; database: {db.path}")


@main.command("convert-weights")
@click.option("--model", default=DEFAULT_MODEL, show_default=True, help="Config name in configs/models/ or a YAML path.")
@click.option("--quant", required=True, help="q0f16, q0f32, q4f16_1 or q4f32_1.")
@click.option("--source", required=True, help="Hugging Face checkpoint dir (config.json + *.safetensors) or 'synthetic'.")
@click.option("--output", type=click.Path(path_type=Path), required=True, help="Output dir for shards + tensor-cache.json.")
@click.option("--seed", default=0, show_default=True, help="Seed for --source synthetic.")
def convert_weights(model, quant, source, output, seed):
    """Quantize weights into MLC's tensor-cache format."""
    from .config import load_model_config
    from .weights import convert_weights as run_convert

    config = load_model_config(model)
    click.echo(str(run_convert(config, quant, source, output, seed=seed, log=_log)))


def _parse_tokens(text: str) -> list[int]:
    try:
        return [int(t) for t in text.replace(" ", "").split(",") if t != ""]
    except ValueError:
        raise click.BadParameter(f"{text!r}: expected comma-separated integers, e.g. 1,2,3") from None


def _parse_sizes(text: str) -> tuple[int, ...]:
    """--sizes: comma-separated token counts >= 1 (ValueError: one line)."""
    from .config import short_repr

    try:
        sizes = tuple(int(t) for t in text.replace(" ", "").split(",") if t != "")
    except ValueError:
        sizes = ()
    if not sizes or any(s < 1 for s in sizes):
        raise ValueError(f"--sizes {short_repr(text)}: expected comma-separated token counts >= 1, e.g. 1,7")
    return sizes


def _output_file(path: Path | None, flag: str, example: str) -> Path | None:
    """A file the command will write (-o, --save-json), checked before any work."""
    from .artifact import check_output_file

    return None if path is None else check_output_file(path, flag, example)


def _device_options(command):
    """Where the artifact runs: --rpc / --rpc-tracker / --rpc-key (TVM's runtime on another machine:
    llvm, cuda, metal) or --adapter / --browser (a WebGPU runtime for webgpu artifacts)."""
    options = [
        click.option("--rpc", default=None, metavar="HOST:PORT",
                     help="Upload the library to this TVM RPC server and run it there (e.g. a Mac for metal artifacts)."),
        click.option("--rpc-tracker", default=None, metavar="HOST:PORT", help="Get an RPC server from this TVM tracker (with --rpc-key)."),
        click.option("--rpc-key", default=None, help="Key of the RPC server (rpc_server --key) or of the tracker's device."),
        click.option("--adapter", type=click.Choice(["auto", "gles", "swiftshader", "gpu"]), default=None,
                     help="webgpu: Dawn adapter (gles: OpenGL ES on llvmpipe; swiftshader: Vulkan on SwiftShader; gpu: a real GPU; "
                          "default auto: gpu, else swiftshader, else gles)."),
        click.option("--browser", is_flag=True, help="webgpu: run in headless Chromium (page on 127.0.0.1) instead of node."),
    ]
    for option in reversed(options):
        command = option(command)
    return command


def _run_options(rpc, rpc_tracker, rpc_key, adapter, browser, prefill_chunk=None):
    from .backends import RunOptions
    from .rpc import open_session

    if (rpc or rpc_tracker) and (adapter or browser):
        raise click.UsageError("--rpc/--rpc-tracker run TVM's runtime elsewhere; --adapter/--browser choose a WebGPU runtime here: give one kind")
    return RunOptions(remote=open_session(rpc, rpc_tracker, rpc_key), adapter=adapter, browser=browser, prefill_chunk=prefill_chunk)


def _backend_of(artifact: Path):
    from .artifact import RUN_FIELDS, read_manifest
    from .backends import backend

    return backend(read_manifest(artifact, RUN_FIELDS)["target"]["kind"])


@main.command()
@click.option("--artifact", type=click.Path(path_type=Path), required=True, help="Artifact directory from `mlcpipe build`.")
@click.option("--weights", default=None, help="Weights dir from convert-weights, or 'synthetic' (default: <artifact>/params).")
@click.option("--prompt-tokens", default=None, help="Comma-separated token ids.")
@click.option("--prompt", default=None, help="Text prompt (needs --tokenizer or tokenizer.json in the weights dir).")
@click.option("--tokenizer", type=click.Path(path_type=Path), default=None, help="tokenizer.json to encode/decode text.")
@click.option("--max-new-tokens", default=16, show_default=True, type=click.IntRange(min=1))
@click.option("--weights-seed", default=0, show_default=True, help="Seed for --weights synthetic.")
@click.option("--temperature", type=float, default=None,
              help="Sample on the device with the library's sampler kernels at this temperature (0: greedy). "
                   "Without any sampling flag: greedy.")
@click.option("--top-p", type=float, default=None, help="Nucleus sampling: keep the most probable tokens up to this mass (default 1).")
@click.option("--repetition-penalty", type=float, default=None, help="Divide positive / multiply negative logits of generated tokens (default 1: none).")
@click.option("--presence-penalty", type=float, default=None, help="Subtract from the logits of generated tokens (default 0).")
@click.option("--frequency-penalty", type=float, default=None, help="Subtract this times each generated token's count (default 0).")
@click.option("--seed", type=int, default=None, help="Seed of the sampler's random draws (default 0); same seed, same tokens.")
@click.option("--save-logits", type=click.Path(path_type=Path), default=None, metavar="FILE.npy",
              help="Write the logits of every generated step (float32, (max_new_tokens, vocab_size)) here.")
@click.option("--prefill-chunk", type=click.IntRange(min=1), default=None,
              help="Prefill in chunks of this many tokens (at most the artifact's prefill_chunk_size, the default).")
@_device_options
def run(artifact, weights, prompt_tokens, prompt, tokenizer, max_new_tokens, weights_seed, temperature, top_p,  # noqa: PLR0913
        repetition_penalty, presence_penalty, frequency_penalty, seed, save_logits, prefill_chunk,
        rpc, rpc_tracker, rpc_key, adapter, browser):
    """Generate (greedy, or sampled with the sampling flags); the last line of output is the
    generated token ids."""
    from .generation import Sampling
    from .runtime import check_logits_path
    from .runtime import save_logits as write_logits
    from .tokenizer import find_tokenizer

    if save_logits is not None:
        check_logits_path(save_logits)
    if (prompt_tokens is None) == (prompt is None):
        raise click.UsageError("give exactly one of --prompt-tokens or --prompt")
    tok = find_tokenizer(tokenizer, weights)
    if prompt is not None:
        if tok is None:
            raise click.UsageError("--prompt needs a tokenizer: pass --tokenizer path/to/tokenizer.json")
        tokens = tok.encode(prompt)
    else:
        tokens = _parse_tokens(prompt_tokens)
    flags = {"temperature": temperature, "top_p": top_p, "repetition_penalty": repetition_penalty,
             "presence_penalty": presence_penalty, "frequency_penalty": frequency_penalty, "seed": seed}
    given = {k: v for k, v in flags.items() if v is not None}
    sampling = Sampling(**given) if given else None
    options = _run_options(rpc, rpc_tracker, rpc_key, adapter, browser, prefill_chunk)
    engine = _backend_of(artifact).open_engine(artifact, weights, weights_seed, options)
    try:
        logits = []
        out = engine.generate(tokens, max_new_tokens, on_logits=lambda step, values: logits.append(values), sampling=sampling)
    finally:
        if hasattr(engine, "close"):
            engine.close()
    if save_logits is not None:
        write_logits(save_logits, logits)
    if tok is not None:
        click.echo(tok.decode(out))
    click.echo(",".join(str(t) for t in out))


@main.command()
@click.option("--artifact", type=click.Path(path_type=Path), required=True, help="Artifact directory from `mlcpipe build`.")
@click.option("--sizes", default="1,7", show_default=True, help="Values bound to symbolic dims (tokens).")
@click.option("--kernels", "pattern", default=None, help="Only kernels whose name matches this regex.")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@_device_options
def check(artifact, sizes, pattern, as_json, rpc, rpc_tracker, rpc_key, adapter, browser):  # noqa: PLR0913
    """Kernel conformance: every kernel of the shipped library run on its device, compared with llvm / NumPy."""
    from .artifact import RUN_FIELDS, read_manifest
    from .conformance import check_artifact, kernel_pattern, report_json

    def progress(i, n, name):
        click.echo(f"[{i + 1}/{n}] {name}", err=True)

    read_manifest(artifact, RUN_FIELDS)  # a bad --artifact is reported before connecting
    kernel_pattern(pattern)
    size_list = _parse_sizes(sizes)
    options = _run_options(rpc, rpc_tracker, rpc_key, adapter, browser)
    report = check_artifact(artifact, size_list, pattern, progress=progress, options=options)
    click.echo(report_json(report) if as_json else report.table() + "\n\n" + report.summary)
    sys.exit(0 if report.ok else 1)


PROFILE_FORMATS = ["md", "text", "json", "csv", "trace", "html", "events", "phase"]


@main.group(invoke_without_command=True)
@click.option("--artifact", type=click.Path(path_type=Path), default=None, help="Artifact directory to profile.")
@click.option("--model", default=DEFAULT_MODEL, show_default=True, help="With --quant/--target: config to build (cached) and profile.")
@click.option("--quant", default=None, help="Build (or reuse) artifacts/<model>-<quant>-<target> and profile it.")
@click.option("--target", "target_name", default="llvm", show_default=True)
@click.option("--weights", default="synthetic", show_default=True, help="Weights dir from convert-weights, or 'synthetic'.")
@click.option("--prompt-len", default=None, show_default="128; webgpu 32", type=click.IntRange(min=1))
@click.option("--gen-len", default=None, show_default="32; webgpu 8", type=click.IntRange(min=1))
@click.option("--runs", default=None, show_default="3; webgpu 2", type=click.IntRange(min=1))
@click.option("--warmup", default=1, show_default=True, type=click.IntRange(min=0))
@click.option("--format", "fmt", type=click.Choice(PROFILE_FORMATS), default=None, show_default="md; phase with --browser")
@click.option("--peak-gbps", type=float, default=None, help="Peak memory bandwidth for the bandwidth columns (default: target preset).")
@click.option("-o", "--output", type=click.Path(path_type=Path), default=None, help="Write the report here (default: stdout).")
@click.option("--save-json", type=click.Path(path_type=Path), default=None, help="Also keep the raw profile JSON here.")
@_device_options
@click.pass_context
def profile(ctx, artifact, model, quant, target_name, weights, prompt_len, gen_len, runs, warmup, fmt, peak_gbps, output, save_json,  # noqa: PLR0913
            rpc, rpc_tracker, rpc_key, adapter, browser):
    """Profile a model run: kernel statistics tables (see also `profile compare`)."""
    if ctx.invoked_subcommand is not None:
        return
    from .artifact import RUN_FIELDS, read_manifest
    from .interface.artifacts import ensure_artifact
    from .profiler.reports import render
    from .profiler.schema import save_profile

    if (artifact is None) == (quant is None):
        raise click.UsageError("give --artifact DIR, or --quant (with --model/--target) to build and profile")
    _output_file(output, "-o", "report.md")
    _output_file(save_json, "--save-json", "profile.json")
    if artifact is None:
        artifact = ensure_artifact(model, quant, target_name, log=_log)
    manifest = read_manifest(artifact, RUN_FIELDS)
    device = _backend_of(artifact)
    options = dataclasses.replace(_run_options(rpc, rpc_tracker, rpc_key, adapter, browser), timed=True, console=_log)
    if browser and fmt is None:
        fmt = "phase"  # the browser harness's per-phase GPU profile reports and metrics lines
    prompt_len, gen_len, runs = (v if v is not None else d for v, d in zip((prompt_len, gen_len, runs), device.PROFILE_DEFAULTS))
    total = (warmup + runs) * 2

    def llvm_twin() -> Path:  # the same model built for llvm (profiles over RPC record its call sequence)
        from .artifact import model_config_of

        return ensure_artifact(model_config_of(artifact), manifest["quantization"], "llvm", log=_log)

    engine = device.open_engine(artifact, weights, 0, options)
    try:
        with click.progressbar(length=total, label=f"profiling {manifest['target']['kind']}", file=sys.stderr, show_pos=True) as bar:
            data = device.profile(engine, options, weights, llvm_twin, prompt_len=prompt_len, gen_len=gen_len, runs=runs,
                                  warmup=warmup, progress=lambda label, done, n: bar.update(1))
    finally:
        if hasattr(engine, "close"):
            engine.close()
    if peak_gbps is None:
        from .targets import preset_peak_gbps

        peak_gbps = preset_peak_gbps(data["target_name"])
    data["peak_gbps"] = peak_gbps
    if save_json:
        save_profile(data, save_json)
    text = render(data, fmt or "md", peak_gbps=peak_gbps)
    if output:
        output.write_text(text)
        click.echo(str(output), err=True)
    else:
        click.echo(text)


@profile.command("render")
@click.argument("profile_json", type=click.Path(path_type=Path, exists=True, dir_okay=False))
@click.option("--format", "fmt", type=click.Choice(PROFILE_FORMATS), default="md", show_default=True)
@click.option("--peak-gbps", type=float, default=None)
@click.option("-o", "--output", type=click.Path(path_type=Path), default=None)
def profile_render(profile_json, fmt, peak_gbps, output):
    """Render a saved profile JSON in another format."""
    from .profiler.reports import render
    from .profiler.schema import load_profile

    _output_file(output, "-o", "report.md")
    data = load_profile(profile_json)
    text = render(data, fmt, peak_gbps=peak_gbps if peak_gbps is not None else data.get("peak_gbps"))
    if output:
        output.write_text(text)
    else:
        click.echo(text)


@profile.command("compare")
@click.argument("before", type=click.Path(path_type=Path, exists=True, dir_okay=False))
@click.argument("after", type=click.Path(path_type=Path, exists=True, dir_okay=False))
@click.option("-o", "--output", type=click.Path(path_type=Path), default=None)
@click.option("--allow-different", is_flag=True, help="Compare profiles of different models or quantizations (refused by default).")
def profile_compare(before, after, output, allow_different):
    """A/B report of two profile JSON files (per-kernel Δ with a significance test)."""
    from .profiler.compare import check_comparable, compare
    from .profiler.schema import load_profile

    _output_file(output, "-o", "compare.md")
    a, b = load_profile(before), load_profile(after)
    if not allow_different:
        check_comparable(a, b, str(before), str(after))
    text = compare(a, b, name_a=before.stem, name_b=after.stem)
    if output:
        output.write_text(text)
    else:
        click.echo(text)


@main.command()
@click.option("--matrix", "matrix_path", type=click.Path(path_type=Path), default=None, help="Nightly matrix YAML (default configs/nightly.yaml).")
@click.option("--out", type=click.Path(path_type=Path), default=None, help="Output directory, e.g. artifacts/nightly/2026-11-21 (required unless --list-cells).")
@click.option("--jobs", type=click.IntRange(min=1), default=None, help="Cells built at once, each in its own processes (default: cores / 2).")
@click.option("--previous", type=click.Path(path_type=Path, file_okay=False), default=None, help="Last nightly's directory: add the regression table.")
@click.option("--cell", "cells", multiple=True, help="Only this cell (repeatable or comma-separated), e.g. one CI job per cell.")
@click.option("--cache", "cache_dir", type=click.Path(path_type=Path, file_okay=False), default=None, help="Content-addressed cell cache (default <out>/../.cache).")
@click.option("--report-only", is_flag=True, help="Build nothing: merge the cell directories in --out into index.json/SUMMARY.md.")
@click.option("--list-cells", is_flag=True, help="Print the matrix's cell ids as a JSON list (for a CI matrix) and exit.")
def nightly(matrix_path, out, jobs, previous, cells, cache_dir, report_only, list_cells):  # noqa: PLR0913
    """Build every model x quant x target cell of a matrix (cached, checked, verified) with a report."""
    import json as _json

    from .nightly import list_cells as matrix_cells
    from .nightly import run_nightly

    if list_cells:
        click.echo(_json.dumps(matrix_cells(matrix_path)))
        return
    if out is None:
        raise click.UsageError("--out DIR is required")
    wanted = [c.strip() for value in cells for c in value.split(",") if c.strip()]
    sys.exit(run_nightly(matrix_path, out, jobs=jobs, previous=previous, cells=wanted, cache_dir=cache_dir,
                         report_only=report_only, echo=_log))


@main.command()
@click.argument("directory", type=click.Path(path_type=Path))
def verify(directory):
    """Re-check the SHA-256 of every file of a nightly directory or a single artifact."""
    from .nightly.verify import verify as run_verify

    result = run_verify(directory)
    for problem in result.problems:
        click.echo(f"error: {problem}", err=True)
    if not result.ok:
        click.echo(f"{directory}: {len(result.problems)} problem(s) in {result.kind} ({result.files} files listed)", err=True)
        sys.exit(1)
    click.echo(f"ok: {directory}: {result.kind}, {result.files} files match their SHA-256")


@main.command("mlc-check")
@click.option("--artifact", type=click.Path(path_type=Path), default=None, help="Artifact whose library MLC-LLM / WebLLM would load.")
@click.option("--model-dir", type=click.Path(path_type=Path), default=None, help="Model directory from convert-weights.")
def mlc_check(artifact, model_dir):
    """Check a library and/or model directory against what MLC-LLM's runtimes and WebLLM read."""
    from .mlc_contract import check_library, check_model_dir

    if artifact is None and model_dir is None:
        raise click.UsageError("give --artifact and/or --model-dir")
    if artifact is not None:
        manifest = check_library(artifact)
        click.echo(f"ok: {artifact}: {manifest['library']} exports every function MLC-LLM / WebLLM call")
    if model_dir is not None:
        data = check_model_dir(model_dir)
        click.echo(f"ok: {model_dir}: mlc-chat-config.json complete ({data['quantization']}, "
                   f"conv_template {data['conv_template'].get('name')!r}), tokenizer files and weight shards present")


@main.command()
@click.option("--artifact", type=click.Path(path_type=Path), required=True, help="A webgpu artifact (lib.wasm).")
@click.option("--model-dir", type=click.Path(path_type=Path), required=True, help="Model directory from convert-weights.")
@click.option("--prompt", required=True, help="Text prompt (a plain completion: no conversation template).")
@click.option("--max-new-tokens", default=16, show_default=True, type=click.IntRange(min=1))
@click.option("--temperature", type=float, default=0.0, show_default=True)
@click.option("--top-p", type=float, default=1.0, show_default=True)
@click.option("--seed", type=int, default=None, help="WebLLM's sampling seed.")
@click.option("--adapter", type=click.Choice(["auto", "swiftshader", "gpu"]), default="swiftshader", show_default=True)
def webllm(artifact, model_dir, prompt, max_new_tokens, temperature, top_p, seed, adapter):
    """Load the build in WebLLM itself (headless Chromium) and complete a prompt."""
    from .generation import Sampling
    from .runners.webllm import webllm_complete

    Sampling(temperature=temperature, top_p=top_p)  # the same one-line checks as run
    out = webllm_complete(artifact, model_dir, prompt, max_new_tokens, temperature=temperature, top_p=top_p, seed=seed,
                          adapter=adapter, console=_log)
    _log(f"[webllm] {out.browser} on {out.adapter.get('description') or out.adapter}: {out.prompt_tokens} prompt tokens, "
         f"{out.completion_tokens} generated ({out.finish_reason})")
    click.echo(out.text)


if __name__ == "__main__":
    main()

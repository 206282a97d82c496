"""`mlcpipe` command line: argument parsing only; the work lives in the pipeline modules."""

from __future__ import annotations

import sys
from pathlib import Path

import click

DEFAULT_MODEL = "llama-3.2-1b"


def _log(message: str) -> None:
    click.echo(message, err=True)


def _fail(exc: Exception) -> None:
    click.echo(f"error: {exc}", err=True)
    sys.exit(2)


class _UserErrors(click.Group):
    """Turn known user-facing errors into a one-line message and exit status 2."""

    def invoke(self, ctx):
        from .artifact import ArtifactError
        from .config import ConfigError

        try:
            return super().invoke(ctx)
        except (ConfigError, ArtifactError, ValueError) as exc:
            _fail(exc)


@click.group(cls=_UserErrors)
def main() -> None:
    """mlcpipe: YAML model -> quantized, fused TVM kernels -> artifacts -> runtime."""


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
def build(model, quant, target_name, mcpu, arch, fatbin_archs, output, weights, dump_ir):  # noqa: PLR0913
    """Compile a model into an artifact directory (library + manifest + runtime config)."""
    from .build import build as run_build
    from .config import load_model_config
    from .targets import load_target

    config = load_model_config(model)
    target = load_target(target_name, _target_overrides(mcpu, arch, fatbin_archs))
    path = run_build(config, quant, target, output=output, dump_ir=dump_ir, weights=weights, log=_log)
    click.echo(str(path))


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


@main.command()
@click.option("--artifact", type=click.Path(path_type=Path), required=True, help="Artifact directory from `mlcpipe build`.")
@click.option("--weights", default=None, help="Weights dir from convert-weights, or 'synthetic' (default: <artifact>/params).")
@click.option("--prompt-tokens", default=None, help="Comma-separated token ids.")
@click.option("--prompt", default=None, help="Text prompt (needs --tokenizer or tokenizer.json in the weights dir).")
@click.option("--tokenizer", type=click.Path(path_type=Path), default=None, help="tokenizer.json to encode/decode text.")
@click.option("--max-new-tokens", default=16, show_default=True, type=click.IntRange(min=1))
@click.option("--seed", default=0, show_default=True, help="Seed for --weights synthetic.")
def run(artifact, weights, prompt_tokens, prompt, tokenizer, max_new_tokens, seed):
    """Greedy generation; the last line of output is the generated token ids."""
    from .runtime import Engine
    from .tokenizer import find_tokenizer

    if (prompt_tokens is None) == (prompt is None):
        raise click.UsageError("give exactly one of --prompt-tokens or --prompt")
    tok = find_tokenizer(tokenizer, weights)
    if prompt is not None:
        if tok is None:
            raise click.UsageError("--prompt needs a tokenizer: pass --tokenizer path/to/tokenizer.json")
        tokens = tok.encode(prompt)
    else:
        tokens = _parse_tokens(prompt_tokens)
    engine = Engine(artifact, weights, seed=seed)
    out = engine.generate(tokens, max_new_tokens)
    if tok is not None:
        click.echo(tok.decode(out))
    click.echo(",".join(str(t) for t in out))


@main.command()
@click.option("--artifact", type=click.Path(path_type=Path), required=True, help="Artifact directory from `mlcpipe build`.")
@click.option("--sizes", default="1,7", show_default=True, help="Values bound to symbolic dims (tokens).")
@click.option("--kernels", "pattern", default=None, help="Only kernels whose name matches this regex.")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
def check(artifact, sizes, pattern, as_json):
    """Kernel conformance: run every kernel on the target, compare with llvm / NumPy."""
    from .conformance import check_artifact, report_json

    def progress(i, n, name):
        click.echo(f"[{i + 1}/{n}] {name}", err=True)

    report = check_artifact(artifact, tuple(int(s) for s in _parse_tokens(sizes)), pattern, progress=progress)
    click.echo(report_json(report) if as_json else report.table() + "\n\n" + report.summary)
    sys.exit(0 if report.ok else 1)


if __name__ == "__main__":
    main()

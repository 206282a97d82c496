"""`mlcpipe bundle`: what a GPU machine without apache-tvm needs to check, run, profile and benchmark
mlcpipe's CUDA artifacts with one command, packed into one folder:

    run.sh                  the command (`bash run.sh`; results to $OUT): the job of pipeline/interface/job.py
    bundle.json             what is inside, and what each artifact's job steps are
    artifacts/<name>/       the artifacts (cuda for `arch`, one fatbin arch; portable llvm ones), less tir/
    expected/<model>-<quant>.npz  the llvm build's prompt, tokens and logits of the same synthetic weights
    site/                   the run-side code (pipeline/, benchmarks/, configs/), tvm_ffi built for the
                            device's Python, and the pure-Python packages it needs
    tvm_runtime/            libtvm_runtime.so, libtvm_runtime_cuda.so, libcudart (no compiler)
    tune/<model>-<quant>/   (--tune) knob candidates of the static-shape kernels, compiled here and
                            timed by the job's tune step (pipeline/tuning/remote.py)

Artifacts come from the build cache (`ensure_artifact`: rebuilt only when code or config change).
The folder is written beside its final place and renamed over it; at most `max_mib`.
"""

from __future__ import annotations

import datetime
import json
import importlib.util
import os
import re
import shutil
import subprocess
import sys
import zipfile
from collections.abc import Callable
from importlib import metadata
from pathlib import Path

import numpy as np

from ..artifact import BUNDLE_INDEX, RUN_FIELDS, atomic_directory, check_writable, file_digests, read_manifest, write_json
from ..config import REPO_ROOT, artifacts_root, load_model_config, short_repr
from .job import BUNDLE_FORMAT, teacher_forced
from ..errors import ArtifactError, OptionValueError

DEFAULT_SETS = ("llama-3.2-1b:q4f16_1,q4f32_1,q0f16", "llama-tiny:q4f16_1")
DEFAULT_GRAPH = ("llama-3.2-1b:q4f16_1",)  # also built with cuda_graph, for decode with and without
DEFAULT_CPU = ("llama-tiny",)  # also shipped as a portable llvm build (runs on any x86-64-v3 CPU)
PREFILL_CHUNK = 128  # the recorded run's and the device run's, by default
DEFAULT_BENCH = ("llama-3.2-1b",)  # benchmarked against PyTorch on the GPU
DEFAULT_TUNE = ("llama-3.2-1b:q4f16_1,q4f32_1,q0f16",)  # decode GEMV knob candidates timed on the GPU
TUNE_BUDGET = 32  # candidates per kernel (the defaults first)
CUDA_ARCH = "sm_90"  # Hopper: H100 and H200
PORTABLE_MCPU = "haswell"  # AVX2 + FMA + F16C: the llvm builds a bundle ships run on any recent x86-64
DEVICE_PYTHON = "3.12"  # /opt/torch/.venv/bin/python3 of the lent GPU machines
MAX_MIB = 60
PURE_PACKAGES = ("typing_extensions", "yaml", "click")  # tvm_ffi's, the config reader's, the CLI's
FFI_LEFT_OUT = {"include", "src", "3rdparty", "cython", "stub", "share", "__pycache__", "CMakeLists.txt"}
CODE = {"pipeline": "mlcpipe", "benchmarks": "benchmarks"}  # the checkout's run-side folders -> their import names


def parse_sets(texts: tuple[str, ...] | list[str], flag: str = "--set", configs: dict | None = None) -> list[tuple[str, str]]:
    """["model:q1,q2", ...] -> [(name, quant), ...]: a model (config name or YAML path) by its
    config's name, each pair checked against the config; `configs` gets name -> ModelConfig."""
    configs = {} if configs is None else configs
    pairs = []
    for text in texts:
        model, sep, quants = text.partition(":")
        if not sep or not model or not quants.strip(","):
            raise OptionValueError(f"{short_repr(text)}: expected MODEL:QUANT[,QUANT...], e.g. llama-tiny:q4f16_1", flag)
        config = load_model_config(model, flag)
        known = configs.setdefault(config.name, config)
        if Path(known.source).resolve() != Path(config.source).resolve():
            raise OptionValueError(f"{short_repr(text)}: {config.source} and {known.source} are both named {config.name!r} "
                                   "(the bundle names artifacts by model name)", flag)
        for quant in (q.strip() for q in quants.split(",") if q.strip()):
            config.scheme(quant, flag)
            if (config.name, quant) in pairs:  # was: built, then the second copy failed ("File exists") after the builds
                raise OptionValueError(f"{short_repr(text)}: {config.name}:{quant} is given twice", flag)
            pairs.append((config.name, quant))
    return pairs


def _entry_name(model: str, quant: str, kind: str, variant: str = "") -> str:
    return "-".join(p for p in (model, quant, kind, variant) if p)


def _copy_artifact(src: Path, dest: Path) -> None:
    """The artifact as the run side needs it: everything but the TIR snapshots (compile side)."""
    shutil.copytree(src, dest, ignore=lambda d, names: ["tir"] if Path(d) == src else [])


def _python_files(src: Path, dest: Path) -> None:
    for path in sorted(src.rglob("*.py")):
        if "__pycache__" in path.parts:
            continue
        target = dest / path.relative_to(src)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(path, target)


def _pure_package(name: str, dest: Path) -> None:
    """A pure-Python package (or module) as installed here, its Python files only (PyYAML's C
    extension is optional: it falls back to its pure-Python loader)."""
    spec = importlib.util.find_spec(name)
    if spec is None or spec.origin is None:
        raise ArtifactError(f"bundle: the Python package {name!r} is not installed here (pip install {name})")
    origin = Path(spec.origin)
    if spec.submodule_search_locations:
        _python_files(origin.parent, dest / name)
    else:
        shutil.copy2(origin, dest / origin.name)


def _ffi_from_dir(src: Path, dest: Path) -> None:
    def ignore(directory, names):
        return [n for n in names if n in FFI_LEFT_OUT or n.endswith((".pyi", ".pyc"))]

    shutil.copytree(src, dest / "tvm_ffi", ignore=ignore)


def _ffi_wheel(version: str, python: str, cache: Path, log) -> Path:
    """The apache-tvm-ffi wheel of `version` for CPython `python` (x86-64 manylinux), downloaded
    once into `cache`."""
    tag = "cp" + python.replace(".", "")
    found = sorted(cache.glob(f"apache_tvm_ffi-{version}-{tag}-*.whl"))
    if found:
        return found[0]
    cache.mkdir(parents=True, exist_ok=True)
    log(f"[mlcpipe] downloading apache-tvm-ffi=={version} for Python {python}")
    command = [sys.executable, "-m", "pip", "download", "-q", f"apache-tvm-ffi=={version}", "--no-deps", "--only-binary=:all:",
               "--python-version", python, "--implementation", "cp", "--platform", "manylinux_2_28_x86_64",
               "--platform", "manylinux_2_17_x86_64", "--platform", "manylinux2014_x86_64", "-d", str(cache)]
    done = subprocess.run(command, capture_output=True, text=True)
    found = sorted(cache.glob(f"apache_tvm_ffi-{version}-{tag}-*.whl"))
    if done.returncode != 0 or not found:
        last = (done.stderr.strip().splitlines() or ["no wheel"])[-1]
        raise ArtifactError(f"bundle: cannot get apache-tvm-ffi=={version} for Python {python}: {last} "
                            "(give one with --ffi-wheel, or --python current)")
    return found[0]


def check_ffi_wheel(wheel: Path, version: str, python: str) -> None:
    """--ffi-wheel is an apache-tvm-ffi wheel of `version` (the one tested here) for CPython `python`
    on x86-64 Linux, holding tvm_ffi/: checked before any build (a wrong one failed on the device)."""
    name, flag = short_repr(str(wheel), 300), "--ffi-wheel"  # a path: cut only when absurd
    try:
        with zipfile.ZipFile(wheel) as archive:
            names = archive.namelist()
            info = next((n for n in names if re.fullmatch(r"apache_tvm_ffi-[^/]+\.dist-info/WHEEL", n)), None)
            meta = next((n for n in names if re.fullmatch(r"apache_tvm_ffi-[^/]+\.dist-info/METADATA", n)), None)
            if info is None or meta is None or not any(n.startswith("tvm_ffi/") for n in names):
                raise OptionValueError(f"{name}: not an apache-tvm-ffi wheel (no apache_tvm_ffi-*.dist-info, or no tvm_ffi/)", flag)
            tags = re.findall(r"^Tag: (\S+)$", archive.read(info).decode("utf-8", "replace"), re.M)
            found = re.search(r"^Version: (\S+)$", archive.read(meta).decode("utf-8", "replace"), re.M)
    except (zipfile.BadZipFile, OSError) as exc:
        raise OptionValueError(f"{name}: not a wheel ({exc})", flag) from None
    if found is None or found.group(1) != version:
        raise OptionValueError(f"{name}: apache-tvm-ffi {found.group(1) if found else '(no version)'}; the run side is tested "
                               f"with {version} (the version installed here)", flag)
    want = int(python.split(".")[1])

    def fits(tag: str) -> bool:
        interpreter, abi, platform = (tag.split("-") + ["", ""])[:3]
        minor = re.fullmatch(r"cp3(\d+)", interpreter)
        return bool(minor) and (int(minor.group(1)) == want or abi == "abi3" and int(minor.group(1)) <= want) \
            and "linux" in platform and "x86_64" in platform

    if not any(fits(tag) for tag in tags):
        raise OptionValueError(f"{name}: built for {', '.join(tags) or 'no tag'}; the device needs CPython {python} on x86-64 Linux", flag)


def _ffi_from_wheel(wheel: Path, dest: Path) -> None:
    with zipfile.ZipFile(wheel) as archive:
        for info in archive.infolist():
            parts = Path(info.filename).parts
            if not parts or parts[0] != "tvm_ffi" or info.is_dir() or set(parts) & FFI_LEFT_OUT or info.filename.endswith(".pyi"):
                continue
            target = dest / info.filename
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(archive.read(info))
            if info.external_attr >> 16 & 0o111:
                target.chmod(0o755)


def _tvm_runtime(dest: Path) -> None:
    """TVM's runtime library and cuda's (the backend's RUNTIME_LIBRARIES), with the libcudart it links."""
    from ..backends.cuda import CUDART, RUNTIME_LIBRARIES
    from ..device.tvm_runtime import CORE, library_dir

    dest.mkdir()
    for name in (CORE, *RUNTIME_LIBRARIES):
        shutil.copy2(library_dir() / name, dest / name)
    cudart = _find_cudart(CUDART, library_dir() / RUNTIME_LIBRARIES[0])
    if cudart is not None:
        shutil.copy2(cudart, dest / CUDART)


def _find_cudart(name: str, linking: Path) -> Path | None:
    """`name` as the loader finds it for `linking` here (ldd), else the CUDA toolkit's."""
    try:
        out = subprocess.run(["ldd", str(linking)], capture_output=True, text=True).stdout
    except OSError:
        out = ""
    for line in out.splitlines():
        if line.strip().startswith(name) and "=>" in line:
            path = line.split("=>", 1)[1].split("(")[0].strip()
            if Path(path).is_file():
                return Path(path)
    for root in (os.environ.get("CUDA_HOME"), "/usr/local/cuda"):
        for sub in ("lib64", "lib"):
            if root and (Path(root) / sub / name).is_file():
                return Path(root) / sub / name
    return None


RUN_SH = """#!/usr/bin/env bash
# mlcpipe bundle {created}: the GPU work in one command, on a machine without apache-tvm.
#   bash run.sh [--steps run,check,profile,bench,tune] [--kinds cuda,llvm] [--budget-s 450]
# Results go to $OUT (else ./bundle-out); the job: pipeline/interface/job.py.
set -uo pipefail
here="$(cd "$(dirname "${{BASH_SOURCE[0]}}")" && pwd)"
want="{python}"  # the Python this bundle's tvm_ffi is built for
py="${{MLCPIPE_PYTHON:-/opt/torch/.venv/bin/python3}}"
[ -x "$py" ] || py="$(command -v python3)"
if [ "$("$py" -c 'import sys; print("%d.%d" % sys.version_info[:2])')" != "$want" ]; then
  echo "error: $py is Python $("$py" -c 'import platform; print(platform.python_version())'); this bundle's tvm_ffi is built for Python $want (set MLCPIPE_PYTHON, or rebuild with mlcpipe bundle --python)" >&2
  exit 2
fi
export PYTHONPATH="$here/site${{PYTHONPATH:+:$PYTHONPATH}}" MLCPIPE_TVM_RUNTIME="$here/tvm_runtime" TVM_USE_RUNTIME_LIB=1 PYTHONUNBUFFERED=1
out="${{OUT:-$PWD/bundle-out}}"
mkdir -p "$out"
"$py" -m mlcpipe.interface.job --bundle "$here" --out "$out" "$@" 2>&1 | tee "$out/log.txt"
exit "${{PIPESTATUS[0]}}"
"""


def _f32_truth(model: str, artifact: Path, quant: str, prompt: list[int], tokens, log) -> np.ndarray | None:
    """The float32 logits of the same steps with the quantized model's exact weight values
    (benchmarks.llm_gpu.f32_truth, PyTorch on the CPU), or None without PyTorch: the job holds a
    device against it, with the llvm build's own distance as the scale (pipeline/interface/job.py)."""
    try:
        import torch  # noqa: F401
    except ImportError:
        log("[mlcpipe] no PyTorch here: the bundle records no float32 truth (the job compares with the llvm logits alone)")
        return None
    from benchmarks.llm_gpu import f32_truth

    from ..artifact import RUNTIME_CONFIG
    from ..config import parse_model_config

    config = parse_model_config(json.loads((Path(artifact) / RUNTIME_CONFIG).read_text())["model_config"], str(artifact))
    log(f"[mlcpipe] recording the float32 truth of {model} {quant} (PyTorch on the CPU)")
    return f32_truth(config, quant, prompt, tokens)


def _expected(config, quant: str, prompt_len: int, prefill_chunk: int, steps: int, log) -> dict[str, np.ndarray]:
    """What the llvm build of this machine computes for the bundle's prompt and weights (and the
    float32 truth, where PyTorch is installed)."""
    from ..device import RunOptions
    from ..runtime import open_engine
    from .artifacts import ensure_artifact

    model = config.name
    art = ensure_artifact(config, quant, "llvm", log=log)
    engine = open_engine(art, "synthetic", 0, RunOptions(prefill_chunk=prefill_chunk))
    length = min(prompt_len, engine.context_window - steps - 1)
    prompt = [int(t) for t in np.random.default_rng(0).integers(0, engine.vocab_size, size=length)]
    log(f"[mlcpipe] recording the llvm tokens and logits of {model} {quant} ({length} prompt tokens, {steps} steps)")
    tokens, logits = teacher_forced(engine, prompt, steps)
    record = {"prompt": np.asarray(prompt, np.int32), "tokens": tokens, "logits": logits, "prefill_chunk": np.int32(engine.prefill_chunk)}
    truth = _f32_truth(model, art, quant, prompt, tokens, log)
    if truth is not None:
        record["truth"] = truth
    return record


def _tune_candidates(config, quant: str, kind: str, overrides: dict, root: Path, budget: int, log) -> dict:
    """The knob candidates of the model's (`config`) static-shape kernels at `quant` for the `kind`
    preset with `overrides`, compiled into root/tune/<model>-<quant> (pipeline/tuning/remote.py);
    the bundle index's entry."""
    from ..targets import load_target
    from ..tuning.remote import prepare

    target = load_target(kind, overrides)
    model = config.name
    rel = f"tune/{model}-{quant}"
    log(f"[mlcpipe] compiling the knob candidates of {model} {quant} for {kind} (at most {budget} per kernel)")
    index = prepare(config, config.scheme(quant), target, root / rel, budget=budget, log=log)
    return {"name": _entry_name(model, quant, kind, "tune"), "model": model, "quantization": quant, "kind": kind, "dir": rel,
            "kernels": len(index["kernels"])}


def _site(site: Path, python: str, python_version: str, ffi_wheel: Path | None, log) -> str:
    """The run-side code, the pure-Python packages it needs and tvm_ffi for the device's Python,
    into `site`; returns the apache-tvm-ffi version."""
    import tvm_ffi

    from .artifacts import default_cache_dir

    for folder, package in CODE.items():
        _python_files(REPO_ROOT / folder, site / package)
    shutil.copytree(REPO_ROOT / "configs", site / "configs")
    for name in PURE_PACKAGES:
        _pure_package(name, site)
    ffi_version = metadata.version("apache-tvm-ffi")
    if python == "current" and ffi_wheel is None:
        _ffi_from_dir(Path(tvm_ffi.__file__).parent, site)
    else:
        _ffi_from_wheel(ffi_wheel or _ffi_wheel(ffi_version, python_version, default_cache_dir().parent / "wheels", log), site)
    return ffi_version


def _run_options(pairs: list[tuple[str, str]], configs: dict, cpu_models, bench_models, prefill_chunk: int | None, steps: int,
                 prompt_len: int, python: str) -> tuple[list[str], list[str], int, str]:
    """(cpu models, bench models, prefill chunk, device Python version), checked before any build:
    --cpu-model / --bench-model name models of the --set (others did nothing), --prefill-chunk fits
    each one's prefill_chunk_size (it failed after the builds), --python is 3.9 or later."""
    minor = re.fullmatch(r"3\.(\d+)", python)
    if python != "current" and not (minor and int(minor.group(1)) >= 9):
        raise OptionValueError(f"{short_repr(python)}: expected a Python version such as 3.12 (3.9 or later), or 'current'", "--python")
    models = list(dict.fromkeys(model for model, _ in pairs))
    chunks = {model: configs[model].prefill_chunk_size for model in models}
    if prefill_chunk is None:  # 128, or less where a model of the set prefills less at once
        prefill_chunk = min(PREFILL_CHUNK, *chunks.values())
    if not 1 <= steps <= 64 or prompt_len < 1 or prefill_chunk < 1:
        raise OptionValueError(f"--steps {steps} / --prompt-len {prompt_len} / --prefill-chunk {prefill_chunk}: "
                               "allowed steps 1..64, the others >= 1")
    for model, chunk in chunks.items():
        if prefill_chunk > chunk:
            raise OptionValueError(f"{prefill_chunk}: {model}'s prefill_chunk_size is {chunk}; allowed 1..{chunk}", "--prefill-chunk")
    cpu_models = [m for m in DEFAULT_CPU if m in models] if cpu_models is None else list(cpu_models)
    bench_models = [m for m in DEFAULT_BENCH if m in models] if bench_models is None else list(bench_models)
    for flag, names in (("--cpu-model", cpu_models), ("--bench-model", bench_models)):
        for name in names:
            if name not in models:
                raise OptionValueError(f"{short_repr(name)}: not a model of the bundle's --set ({', '.join(models)})", flag)
    return cpu_models, bench_models, prefill_chunk, f"{sys.version_info[0]}.{sys.version_info[1]}" if python == "current" else python


def bundle(out: Path | None = None, sets: list[str] | tuple[str, ...] = DEFAULT_SETS, graph: list[str] | tuple[str, ...] = DEFAULT_GRAPH,
           cpu_models: list[str] | tuple[str, ...] | None = None, bench_models: list[str] | tuple[str, ...] | None = None,
           python: str = DEVICE_PYTHON, ffi_wheel: Path | None = None,
           prompt_len: int = 300, prefill_chunk: int | None = None, steps: int = 6, max_mib: float = MAX_MIB,
           tune: list[str] | tuple[str, ...] = (), tune_budget: int = TUNE_BUDGET, tune_target: str = "cuda",
           tune_overrides: dict | None = None, log: Callable[[str], None] = print) -> tuple[Path, int]:
    """Build (or reuse) the artifacts, record the llvm expectations, compile the `tune` pairs'
    knob candidates for the `tune_target` preset with `tune_overrides` (default: the bundle's
    cuda arch), pack; returns (folder, bytes). `cpu_models` / `bench_models`: None for the defaults
    that are in the sets; `prefill_chunk`: None for PREFILL_CHUNK or the set's smallest chunk."""
    from ..config import IN_CHECKOUT
    from ..targets import preset_peak_gbps
    from .artifacts import ensure_artifact

    if not IN_CHECKOUT:  # it packs the checkout's run-side code (pipeline/, benchmarks/, configs/)
        raise ArtifactError(f"mlcpipe bundle packs the run-side code of a checkout; {REPO_ROOT} is an installed mlcpipe "
                            "(run it from a clone: pip install -e .)")
    if str(REPO_ROOT) not in sys.path:  # its benchmarks/ (the f32 truth here, the job there) from any working directory
        sys.path.append(str(REPO_ROOT))
    configs: dict = {}  # model name -> its config (--set, --tune and --graph may give a YAML path)
    pairs = parse_sets(sets, configs=configs)
    tune_pairs = parse_sets(tune, "--tune", configs)
    if tune_budget < 1:
        raise OptionValueError(f"{tune_budget}: allowed at least 1", "--tune-budget")
    graph_pairs = set(parse_sets(graph, "--graph", configs))
    if not graph_pairs <= set(pairs):
        raise OptionValueError("{}:{}: not in the bundle's --set".format(*sorted(graph_pairs - set(pairs))[0]), "--graph")
    cpu_models, bench_models, prefill_chunk, python_version = _run_options(pairs, configs, cpu_models, bench_models, prefill_chunk,
                                                                         steps, prompt_len, python)
    if ffi_wheel is not None:
        check_ffi_wheel(Path(ffi_wheel), metadata.version("apache-tvm-ffi"), python_version)
    out = Path(out) if out is not None else artifacts_root() / "bundle"
    check_writable(out, "bundle")  # before the builds; atomic_directory checks it again at the end
    cuda = {"arch": CUDA_ARCH, "fatbin_archs": [CUDA_ARCH]}
    entries: list[tuple[dict, Path]] = []
    for model, quant in pairs:
        found = ensure_artifact(configs[model], quant, "cuda", log=log, overrides=cuda)
        entries.append(({"model": model, "quantization": quant, "kind": "cuda", "bench": model in bench_models}, found))
        if (model, quant) in graph_pairs:
            found = ensure_artifact(configs[model], quant, "cuda", log=log, overrides={**cuda, "cuda_graph": True})
            entries.append(({"model": model, "quantization": quant, "kind": "cuda", "variant": "cuda-graph", "check": False,
                             "profile": False, "bench": model in bench_models}, found))
        if model in cpu_models:
            found = ensure_artifact(configs[model], quant, "llvm", log=log, overrides={"mcpu": PORTABLE_MCPU})
            entries.append(({"model": model, "quantization": quant, "kind": "llvm", "variant": "portable"}, found))
    expected = {(model, quant): _expected(configs[model], quant, prompt_len, prefill_chunk, steps, log) for model, quant in pairs}
    created = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    with atomic_directory(out, kind="bundle") as tmp:
        index = []
        for entry, src in entries:
            name = _entry_name(entry["model"], entry["quantization"], entry["kind"], entry.get("variant", ""))
            _copy_artifact(src, tmp / "artifacts" / name)
            (tmp / "expected").mkdir(exist_ok=True)
            record = expected[(entry["model"], entry["quantization"])]
            recorded = f"expected/{entry['model']}-{entry['quantization']}.npz"  # one per model and quantization
            if not (tmp / recorded).exists():
                np.savez(tmp / recorded, **record)
            manifest = read_manifest(src, RUN_FIELDS)
            index.append({**entry, "name": name, "dir": f"artifacts/{name}", "expected": recorded,
                          "prefill_chunk": int(record["prefill_chunk"]), "manifest_target": manifest["target"],
                          "peak_gbps": preset_peak_gbps(manifest.get("target_name", ""))})
        tuned = [_tune_candidates(configs[model], quant, tune_target, cuda if tune_overrides is None else tune_overrides, tmp, tune_budget, log)
                 for model, quant in tune_pairs]
        ffi_version = _site(tmp / "site", python, python_version, ffi_wheel, log)
        _tvm_runtime(tmp / "tvm_runtime")
        (tmp / "run.sh").write_text(RUN_SH.format(created=created, python=python_version))
        (tmp / "run.sh").chmod(0o755)
        write_json(tmp / BUNDLE_INDEX, {
            "format": BUNDLE_FORMAT, "created": created, "python": python_version, "apache-tvm-ffi": ffi_version,
            "prompt_len": prompt_len, "steps": steps, "artifacts": index, "tune": tuned,
            "files": file_digests(tmp, exclude=(BUNDLE_INDEX,)),
        })
        size = sum(p.stat().st_size for p in tmp.rglob("*") if p.is_file() and not p.is_symlink())
        if size > max_mib * 2**20:
            raise ArtifactError(f"bundle {out}: {size / 2**20:.1f} MiB; allowed at most {max_mib:g} MiB "
                                "(fewer --set entries, or raise --max-mib where the device takes more)")
    log(f"[mlcpipe] bundle {out}: {len(index)} artifacts, {size / 2**20:.1f} MiB; on the GPU machine: bash {out.name}/run.sh")
    return out, size

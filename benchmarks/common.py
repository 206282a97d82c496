"""What every engine of the benchmark shares: the model config, the same seeded synthetic weights
under their Hugging Face names, the prompt, the timing protocol and the result record."""

from __future__ import annotations

import dataclasses
import os
import statistics
import time
from collections.abc import Callable, Iterator

import numpy as np

# Environment variables that fix a worker's thread count, whatever library it uses.
THREAD_VARS = ("TVM_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")


@dataclasses.dataclass
class Settings:
    """One benchmark run's shapes, shared by every engine."""

    model: str = "llama-3.2-1b"
    threads: int = 2
    context: int = 300  # decode is timed after a prompt of this many tokens
    prefill: int = 128  # prefill is timed on a fresh sequence of this many tokens
    decode_steps: int = 32
    prefill_runs: int = 3  # timed prefills (median), after one untimed warm-up
    seed: int = 0  # weights seed (pipeline.weights.synthetic_source) and prompt seed
    bandwidth_gib: float = 2.0  # size of the array the bandwidth bound reads


@dataclasses.dataclass
class Result:
    """One engine/dtype row of the table."""

    engine: str  # "mlcpipe", "pytorch", "llama.cpp"
    dtype: str  # quantization / dtype label
    prefill_s: float | None = None  # median seconds for `prefill` tokens
    prefill_tokens: int = 0
    decode_ms: list[float] = dataclasses.field(default_factory=list)  # every timed decode step
    weight_bytes_per_token: int = 0  # weight bytes one decode step reads
    notes: list[str] = dataclasses.field(default_factory=list)
    extra: dict = dataclasses.field(default_factory=dict)  # engine-specific (build seconds, kernels, ...)
    error: str | None = None
    tokens: list[int] = dataclasses.field(default_factory=list)  # greedy tokens after the context prompt

    @property
    def decode_p50_ms(self) -> float | None:
        return statistics.median(self.decode_ms) if self.decode_ms else None

    @property
    def prefill_tok_s(self) -> float | None:
        return self.prefill_tokens / self.prefill_s if self.prefill_s else None


def load_config(model: str):
    from mlcpipe.config import load_model_config

    return load_model_config(model)


def hf_weights(config, seed: int = 0) -> Iterator[tuple[str, tuple[int, ...], Callable[[], np.ndarray]]]:
    """(HF tensor name, shape, loader of the float32 array) for every tensor of the checkpoint,
    the same seeded values mlcpipe's `--weights synthetic` uses (pipeline.weights.synthetic_source)."""
    from mlcpipe.model import WEIGHT_MAPS
    from mlcpipe.weights import synthetic_source

    get = synthetic_source(config, seed)
    for ws in WEIGHT_MAPS[config.architecture](config):
        for name, shape in zip(ws.hf_names, ws.hf_shapes):
            yield name, tuple(shape), (lambda n=name, s=tuple(shape): get(n, s))


def prompt_tokens(vocab_size: int, n: int, seed: int = 0) -> list[int]:
    """The random prompt every engine gets: the same ids as pipeline.profiler.measure.profile()
    draws for `seed`, so the greedy tokens of every engine can be compared."""
    return [int(t) for t in np.random.default_rng(seed).integers(0, vocab_size, size=n)]


def thread_env(threads: int) -> dict[str, str]:
    env = dict(os.environ)
    env.update({var: str(threads) for var in THREAD_VARS})
    return env


def time_prefill(run: Callable[[list[int]], object], reset: Callable[[], None], tokens: list[int], runs: int) -> float:
    """Median seconds of `runs` prefills of `tokens` on a fresh sequence, after one warm-up."""
    times = []
    for i in range(runs + 1):
        reset()
        t0 = time.perf_counter()
        run(tokens)
        if i:
            times.append(time.perf_counter() - t0)
    return statistics.median(times)


def time_decode(prefill: Callable[[list[int]], np.ndarray], decode: Callable[[int], np.ndarray],
                reset: Callable[[], None], context: list[int], steps: int) -> tuple[list[float], list[int]]:
    """Prefill `context` (untimed), then `steps` greedy decode steps, each timed (ms).
    Returns (ms per step, the greedy tokens: the first from the prefill logits)."""
    reset()
    logits = prefill(context)
    token = int(np.argmax(logits))
    tokens, ms = [token], []
    for _ in range(steps):
        t0 = time.perf_counter()
        logits = decode(token)
        ms.append((time.perf_counter() - t0) * 1e3)
        token = int(np.argmax(logits))
        tokens.append(token)
    return ms, tokens


def cpu_model() -> str:
    """The CPU's model name (/proc/cpuinfo), else what platform says."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    import platform

    return platform.processor() or platform.machine()


def cpu_llvm() -> str:
    """The llvm target's CPU name (LLVM's host detection) and the features the CPU rules key on."""
    import tvm

    from mlcpipe.targets import load_target

    target = tvm.target.Target(load_target("llvm").target)
    has = [f for f in ("avx2", "fma", "avx512f", "avx512vnni", "avx512bf16", "avx512fp16", "amx-bf16", "avxvnni",
                       "neon", "dotprod", "i8mm", "bf16") if tvm.target.codegen.target_has_features(f, target)]
    return f"{target.attrs.get('mcpu', '?')} ({', '.join(has) or 'baseline'})"

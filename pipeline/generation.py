"""Token checks, chunked prefill and generation (greedy, or sampled on the device), shared by
every engine.

An engine provides `vocab_size`, `context_window`, `prefill_chunk`, `reset()`,
`_step(kind, tokens) -> logits` ("prefill" or "decode", float32 logits of the last token) and
`_sample(logits, sampling, penalty, uniform) -> token`, which runs the library's own sampler
functions (apply_penalty_inplace, softmax_with_temperature, argsort_probs, sample_with_top_p:
what MLC-LLM's engine and WebLLM call) on the device.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .artifact import RUN_FIELDS, RUNTIME_CONFIG, TENSOR_CACHE, read_json, read_manifest, verified
from .config import kv_cache_bytes
from .errors import ArtifactError
from .quantization import quantization


def checked_prefill_chunk(requested: int | None, built: int) -> int:
    """A runtime prefill chunk: at most the one the artifact was built for (its buffers' size)."""
    if requested is None:
        return built
    if not 1 <= requested <= built:
        raise ValueError(f"--prefill-chunk {requested}: allowed 1..{built} (prefill_chunk_size of the artifact)")
    return requested


SAMPLER_FUNCTIONS = ("apply_penalty_inplace", "softmax_with_temperature", "argsort_probs", "sample_with_top_p")


@dataclass(frozen=True)
class Sampling:
    """`mlcpipe run`'s sampling flags (MLC-LLM's / WebLLM's meaning). Penalties apply to the
    tokens generated so far, as in their engines; `seed` seeds the uniform draw of every step."""

    temperature: float = 0.0
    top_p: float = 1.0
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    seed: int = 0

    def __post_init__(self):
        checks = (
            ("temperature", self.temperature >= 0, "a number >= 0 (0: greedy)"),
            ("top-p", 0 < self.top_p <= 1, "a number in (0, 1]"),
            ("repetition-penalty", self.repetition_penalty > 0, "a number > 0 (1: none)"),
            ("presence-penalty", -2 <= self.presence_penalty <= 2, "a number in [-2, 2]"),
            ("frequency-penalty", -2 <= self.frequency_penalty <= 2, "a number in [-2, 2]"),
            ("seed", 0 <= self.seed < 2**63, "an integer in [0, 2**63)"),
        )
        for flag, ok, allowed in checks:
            value = getattr(self, flag.replace("-", "_"))
            if not ok or value != value:  # NaN fails every comparison but the last
                raise ValueError(f"--{flag} {value}: allowed {allowed}")

    @property
    def penalized(self) -> bool:
        return self.repetition_penalty != 1 or self.presence_penalty != 0 or self.frequency_penalty != 0


@dataclass(frozen=True)
class PenaltyInputs:
    """apply_penalty_inplace's arguments for one sequence (row 0) and the tokens it generated."""

    token_ids: np.ndarray  # (t,) int32
    token_cnt: np.ndarray  # (t,) int32
    penalties: np.ndarray  # (1, 3) float32: presence, frequency, repetition

    @staticmethod
    def of(sampling: Sampling, generated: Counter) -> "PenaltyInputs | None":
        if not sampling.penalized or not generated:
            return None
        ids = sorted(generated)
        return PenaltyInputs(np.asarray(ids, dtype=np.int32), np.asarray([generated[t] for t in ids], dtype=np.int32),
                             np.asarray([[sampling.presence_penalty, sampling.frequency_penalty,
                                          sampling.repetition_penalty]], dtype=np.float32))


def available_memory() -> int | None:
    """Bytes this machine can still give a process (MemAvailable), None where unknown."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


class Generation(ABC):
    vocab_size: int
    context_window: int
    prefill_chunk: int

    def _open_artifact(self, artifact, prefill_chunk: int | None) -> None:
        """The artifact's manifest and runtime config, and the sizes generation checks against."""
        self.artifact = Path(artifact)
        self.manifest = read_manifest(self.artifact, RUN_FIELDS)
        self.config = read_json(verified(self.artifact, self.manifest, RUNTIME_CONFIG, "files"), RUNTIME_CONFIG)
        self.quant = quantization(self.manifest["quantization"], f"{self.artifact}: manifest field 'quantization'")
        self.vocab_size = int(self.config["vocab_size"])
        self.context_window = int(self.config["context_window_size"])
        self.prefill_chunk = checked_prefill_chunk(prefill_chunk, int(self.config["prefill_chunk_size"]))

    def _weights_or_params(self, weights) -> Path | str:
        """`weights` as given, or the artifact's own params/ (`build --weights`) when none is: an
        artifact built without weights is refused naming the artifact, not a --weights never typed."""
        if weights is not None:
            return weights
        params = self.artifact / "params"
        if not (params / TENSOR_CACHE).is_file():
            raise ArtifactError(f"{self.artifact}: built without weights (no params/{TENSOR_CACHE}): pass --weights DIR (from "
                                "`mlcpipe convert-weights`) or --weights synthetic, or build with --weights")
        return params

    def kv_cache_bytes(self) -> int:
        """Bytes of the KV cache `reset` allocates: every layer's K and V pages for the whole
        context window, in the model's dtype (f16 models 2 bytes, f32 models 4)."""
        return kv_cache_bytes(self.config["model_config"], self.context_window, np.dtype(self.quant.model_dtype).itemsize)

    def check_tokens(self, tokens: Sequence[int], max_new_tokens: int = 0) -> None:
        if len(tokens) == 0:
            raise ValueError("prompt is empty: give at least one token id")
        bad = [t for t in tokens if not 0 <= int(t) < self.vocab_size]
        if bad:
            raise ValueError(f"token id {bad[0]} is out of range: allowed 0..{self.vocab_size - 1} (vocab_size {self.vocab_size})")
        total = len(tokens) + max_new_tokens
        if total > self.context_window:
            raise ValueError(
                f"prompt of {len(tokens)} tokens + {max_new_tokens} new tokens = {total} exceeds the "
                f"context window of {self.context_window} tokens (context_window_size in the model config)"
            )

    @abstractmethod
    def reset(self) -> None:
        """Start a new sequence in a fresh KV cache."""

    @abstractmethod
    def _step(self, kind: str, tokens: np.ndarray) -> np.ndarray:
        """One forward pass of `tokens` ("prefill" chunk or "decode"): last token's logits."""

    @abstractmethod
    def _sample(self, logits: np.ndarray, sampling: Sampling, penalty: PenaltyInputs | None, uniform: float) -> int:
        """One token from `logits` by the library's sampler functions on the device."""

    def prefill(self, tokens: Sequence[int]) -> np.ndarray:
        """Run the prompt (in chunks of prefill_chunk_size); logits of its last token."""
        self.check_tokens(tokens)
        tokens = np.asarray(tokens, dtype=np.int64)
        logits = None
        for start in range(0, len(tokens), self.prefill_chunk):
            logits = self._step("prefill", tokens[start : start + self.prefill_chunk])
        return logits

    def decode(self, token: int) -> np.ndarray:
        self.check_tokens([token])
        return self._step("decode", np.asarray([token]))

    def generate(self, prompt: Sequence[int], max_new_tokens: int, on_logits=None,
                 sampling: Sampling | None = None) -> list[int]:
        """Greedy generation (argmax here), or with `sampling` each token drawn by the library's
        sampler on the device; `on_logits(step, logits)` sees the model's logits of every step
        (before any penalty)."""
        self.check_tokens(prompt, max_new_tokens)
        if sampling is not None:
            missing = [f for f in SAMPLER_FUNCTIONS if f not in self.manifest.get("functions", [])]
            if missing:
                raise ValueError(f"{self.artifact}: the library has no {missing[0]} (built before mlcpipe had sampler "
                                 f"kernels); rebuild it to sample, or drop the sampling flags for greedy")
        self.reset()
        rng = np.random.default_rng(sampling.seed) if sampling is not None else None
        generated: Counter = Counter()
        logits = self.prefill(prompt)
        out: list[int] = []
        for step in range(max_new_tokens):
            if on_logits is not None:
                on_logits(step, logits)
            if sampling is None:
                out.append(int(np.argmax(logits)))
            else:
                uniform = float(np.float32(rng.random()))
                out.append(int(self._sample(logits, sampling, PenaltyInputs.of(sampling, generated), uniform)))
                generated[out[-1]] += 1
            if step + 1 < max_new_tokens:
                logits = self.decode(out[-1])
        return out

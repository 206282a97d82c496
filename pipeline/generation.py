"""Token checks, chunked prefill and greedy generation, shared by every engine.

An engine provides `vocab_size`, `context_window`, `prefill_chunk`, `reset()` and
`_step(kind, tokens) -> logits` ("prefill" or "decode", float32 logits of the last token).
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from .artifact import RUNTIME_CONFIG, read_manifest


def checked_prefill_chunk(requested: int | None, built: int) -> int:
    """A runtime prefill chunk: at most the one the artifact was built for (its buffers' size)."""
    if requested is None:
        return built
    if not 1 <= requested <= built:
        raise ValueError(f"--prefill-chunk {requested}: allowed 1..{built} (prefill_chunk_size of the artifact)")
    return requested


class Generation(ABC):
    vocab_size: int
    context_window: int
    prefill_chunk: int

    def _open_artifact(self, artifact, prefill_chunk: int | None) -> None:
        """The artifact's manifest and runtime config, and the sizes generation checks against."""
        self.artifact = Path(artifact)
        self.manifest = read_manifest(self.artifact)
        self.config = json.loads((self.artifact / RUNTIME_CONFIG).read_text())
        self.vocab_size = int(self.config["vocab_size"])
        self.context_window = int(self.config["context_window_size"])
        self.prefill_chunk = checked_prefill_chunk(prefill_chunk, int(self.config["prefill_chunk_size"]))

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

    def generate(self, prompt: Sequence[int], max_new_tokens: int, on_logits=None) -> list[int]:
        """Greedy generation; `on_logits(step, logits)` sees the logits of every step."""
        self.check_tokens(prompt, max_new_tokens)
        self.reset()
        logits = self.prefill(prompt)
        out: list[int] = []
        for step in range(max_new_tokens):
            if on_logits is not None:
                on_logits(step, logits)
            out.append(int(np.argmax(logits)))
            if step + 1 < max_new_tokens:
                logits = self.decode(out[-1])
        return out

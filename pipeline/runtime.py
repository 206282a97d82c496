"""Load an artifact + weights and generate greedily with the paged KV cache."""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import tvm
from tvm import relax

from .artifact import RUNTIME_CONFIG, ArtifactError, read_manifest
from .weights import TENSOR_CACHE


def _device_for(target_kind: str) -> tvm.runtime.Device:
    if target_kind == "llvm":
        return tvm.cpu()
    if target_kind == "cuda" and tvm.cuda(0).exist:
        return tvm.cuda(0)
    runnable = ["llvm"] + (["cuda"] if tvm.cuda(0).exist else [])
    raise ArtifactError(f"artifact target '{target_kind}' cannot run on this machine (runnable here: {', '.join(runnable)})")


class Engine:
    """A compiled model with its weights, ready to prefill and decode one sequence at a time."""

    def __init__(self, artifact: str | Path, weights: str | Path | None = None, seed: int = 0):
        self.artifact = Path(artifact)
        self.manifest = read_manifest(self.artifact)
        self.config = json.loads((self.artifact / RUNTIME_CONFIG).read_text())
        self.vocab_size = int(self.config["vocab_size"])
        self.context_window = int(self.config["context_window_size"])
        self.prefill_chunk = int(self.config["prefill_chunk_size"])
        self.device = _device_for(self.manifest["target"]["kind"])
        started = time.perf_counter()
        lib = tvm.runtime.load_module(str(self.artifact / self.manifest["library"]))
        self.vm = relax.VirtualMachine(lib, self.device)
        self.params = self._load_params(weights, seed)
        self.load_seconds = time.perf_counter() - started
        self._embed, self._prefill, self._decode = (self.vm[n] for n in ("embed", "prefill", "decode"))
        self.kv_cache = None

    # ---- weights ---------------------------------------------------------------------------
    def _load_params(self, weights, seed: int) -> list[tvm.runtime.Tensor]:
        if weights is None:
            weights = self.artifact / "params"
        if str(weights) == "synthetic":
            arrays = self._synthetic_params(seed)
        else:
            from .weights import load_stored_weights

            if not (Path(weights) / TENSOR_CACHE).is_file():
                raise ArtifactError(f"--weights {weights}: {TENSOR_CACHE} missing; run `mlcpipe convert-weights` or pass --weights synthetic")
            arrays = load_stored_weights(Path(weights))
        params = []
        for spec in self.manifest["parameters"]:
            name = spec["name"]
            if name not in arrays:
                raise ArtifactError(f"--weights {weights}: parameter '{name}' is missing")
            array = arrays[name]
            if list(array.shape) != spec["shape"] or str(array.dtype) != spec["dtype"]:
                raise ArtifactError(
                    f"--weights {weights}: parameter '{name}' is {list(array.shape)} {array.dtype}; "
                    f"the artifact expects {spec['shape']} {spec['dtype']} (built for another model or quantization?)"
                )
            params.append(tvm.runtime.tensor(array, self.device))
        return params

    def _synthetic_params(self, seed: int) -> dict[str, np.ndarray]:
        from .config import parse_model_config
        from .quantization import QUANTIZATIONS
        from .weights import logical_weights

        cfg = parse_model_config(self.config["model_config"], str(self.artifact / RUNTIME_CONFIG))
        scheme = QUANTIZATIONS[self.manifest["quantization"]]
        stored: dict[str, np.ndarray] = {}
        for name, weight in logical_weights(cfg, "synthetic", seed):
            stored.update(scheme.quantize_param(name, weight))
        return stored

    # ---- generation ------------------------------------------------------------------------
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

    def reset(self) -> None:
        create = self.vm["create_paged_kv_cache"]
        sizes = (1, self.context_window, self.prefill_chunk, int(self.config["page_size"]), 0)
        self.kv_cache = create(*(tvm.runtime.ShapeTuple([n]) for n in sizes))
        tvm.get_global_func("vm.builtin.kv_state_add_sequence")(self.kv_cache, 0)

    def _forward(self, func, tokens: np.ndarray) -> np.ndarray:
        ids = tvm.runtime.tensor(tokens.astype("int32"), self.device)
        embed = self._embed(ids, self.params)
        embed = embed._create_view((1, len(tokens), embed.shape[-1]))
        begin = tvm.get_global_func("vm.builtin.kv_state_begin_forward")
        end = tvm.get_global_func("vm.builtin.kv_state_end_forward")
        begin(self.kv_cache, tvm.runtime.ShapeTuple([0]), tvm.runtime.ShapeTuple([len(tokens)]))
        logits, self.kv_cache = func(embed, self.kv_cache, self.params)
        end(self.kv_cache)
        return logits.numpy().reshape(-1)

    def prefill(self, tokens: Sequence[int]) -> np.ndarray:
        """Run the prompt (in chunks of prefill_chunk_size); logits of its last token."""
        self.check_tokens(tokens)
        tokens = np.asarray(tokens, dtype=np.int64)
        logits = None
        for start in range(0, len(tokens), self.prefill_chunk):
            logits = self._forward(self._prefill, tokens[start : start + self.prefill_chunk])
        return logits

    def decode(self, token: int) -> np.ndarray:
        self.check_tokens([token])
        return self._forward(self._decode, np.asarray([token]))

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

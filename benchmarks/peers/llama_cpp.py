"""llama.cpp peer, through llama-cpp-python's low-level API (built from source, CPU only):
the same synthetic weights as a GGUF (gguf_model.py), F16 or Q4_0; token ids fed in a
llama_batch, one sequence, n_threads = n_threads_batch = the benchmark's thread count."""

from __future__ import annotations

import ctypes
import time

import numpy as np

LABELS = {"f16": "F16", "q4_0": "Q4_0 (pure)", "q4_k_m": "Q4_K_M"}


class LlamaCpp:
    def __init__(self, path, threads: int, n_ctx: int, n_batch: int, extra_bufts: bool = True):
        """`extra_bufts`: llama.cpp's repacked CPU weight layouts (AMX / interleaved Q4_0), its fast path."""
        import llama_cpp as L

        self.L = L
        self._quiet = L.llama_log_callback(lambda level, text, data: None)  # keep a reference
        L.llama_log_set(self._quiet, ctypes.c_void_p(0))
        L.llama_backend_init()
        mp = L.llama_model_default_params()
        mp.n_gpu_layers = 0
        mp.use_extra_bufts = extra_bufts
        self.model = L.llama_model_load_from_file(str(path).encode(), mp)
        if not self.model:
            raise RuntimeError(f"llama.cpp could not load {path}")
        cp = L.llama_context_default_params()
        cp.n_ctx, cp.n_batch, cp.n_ubatch, cp.n_seq_max = n_ctx, n_batch, n_batch, 1
        cp.n_threads = cp.n_threads_batch = threads
        cp.no_perf = False
        self.ctx = L.llama_init_from_model(self.model, cp)
        if not self.ctx:
            raise RuntimeError("llama_init_from_model failed")
        self.n_vocab = L.llama_vocab_n_tokens(L.llama_model_get_vocab(self.model))
        self.batch = L.llama_batch_init(n_batch, 0, 1)
        self.n_batch, self.pos = n_batch, 0
        self.model_bytes = int(L.llama_model_size(self.model))
        self.system_info = L.llama_print_system_info().decode(errors="replace")

    def reset(self) -> None:
        self.L.llama_memory_clear(self.L.llama_get_memory(self.ctx), True)
        self.pos = 0

    def forward(self, tokens) -> np.ndarray:
        """Append `tokens`; float32 logits of the last one."""
        n = len(tokens)
        if n > self.n_batch:
            raise ValueError(f"{n} tokens exceed n_batch {self.n_batch}")
        b = self.batch
        b.n_tokens = n
        for i, tok in enumerate(tokens):
            b.token[i], b.pos[i], b.n_seq_id[i] = int(tok), self.pos + i, 1
            b.seq_id[i][0] = 0
            b.logits[i] = i == n - 1
        rc = self.L.llama_decode(self.ctx, b)
        if rc != 0:
            raise RuntimeError(f"llama_decode returned {rc}")
        self.pos += n
        ptr = self.L.llama_get_logits_ith(self.ctx, -1)
        return np.ctypeslib.as_array(ptr, shape=(self.n_vocab,)).copy()

    def close(self) -> None:
        self.L.llama_batch_free(self.batch)
        self.L.llama_free(self.ctx)
        self.L.llama_model_free(self.model)


def _probe(path, threads: int) -> str | None:
    """Load `path` with the extra buffer types and decode a few tokens in a child process: the
    llama.cpp of llama-cpp-python 0.3.36 built with GGML_NATIVE on an AMX CPU (Sapphire Rapids)
    segfaults at the first llama_decode of Q4_0 weights repacked for AMX (tiny and 1B models).
    None if it works, else what happened."""
    import subprocess
    import sys

    code = (f"from benchmarks.peers.llama_cpp import LlamaCpp; e = LlamaCpp({str(path)!r}, {threads}, 64, 16); "
            "e.forward([1, 2, 3, 4, 5, 6, 7, 8]); e.forward([9]); print('ok')")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=900)
    if proc.returncode == 0 and "ok" in proc.stdout:
        return None
    return f"exit status {proc.returncode}" + (" (segfault)" if proc.returncode in (-11, 139) else "")


def run(settings, qtype: str):
    """Benchmark one GGUF type ("f16", "q4_0"); returns a common.Result."""
    from importlib import metadata

    from ..common import Result, load_config, prompt_tokens, time_decode, time_prefill
    from .gguf_model import gguf_path

    result = Result("llama.cpp", LABELS[qtype])
    config = load_config(settings.model)
    t0 = time.perf_counter()
    path = gguf_path(config, qtype, settings.seed, settings.threads)
    gguf_s = time.perf_counter() - t0
    n_batch = max(settings.context, settings.prefill)
    failure = _probe(path, settings.threads)
    engine = LlamaCpp(path, settings.threads, settings.context + settings.decode_steps + 8, n_batch, extra_bufts=failure is None)
    if failure:
        result.notes.append(f"llama.cpp's repacked weights (the AMX buffer type GGML_NATIVE compiles in on this CPU) crash at the "
                            f"first llama_decode ({failure}): loaded with use_extra_bufts=false, i.e. plain {LABELS[qtype].split()[0]} kernels")
    try:
        prefill = prompt_tokens(config.vocab_size, settings.prefill, settings.seed + 1)
        result.prefill_s = time_prefill(engine.forward, engine.reset, prefill, settings.prefill_runs)
        result.prefill_tokens = settings.prefill
        context = prompt_tokens(config.vocab_size, settings.context, settings.seed)
        result.decode_ms, result.tokens = time_decode(engine.forward, lambda t: engine.forward([t]), engine.reset,
                                                      context, settings.decode_steps)
        result.weight_bytes_per_token = engine.model_bytes
        features = [f.strip() for f in engine.system_info.split("|") if "= 1" in f]
        version = metadata.version("llama-cpp-python")
        result.extra = {"gguf": str(path), "gguf_prepare_s": gguf_s, "llama_cpp_python": version,
                        "system_info": engine.system_info}
        result.notes.append(f"llama-cpp-python {version} (built here, GGML_NATIVE), n_threads {settings.threads}")
        if features:
            result.notes.append("CPU features " + " ".join(f.split("=")[0].strip() for f in features[:12]))
    finally:
        engine.close()
    return result

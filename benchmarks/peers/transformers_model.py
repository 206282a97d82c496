"""PyTorch peer for every architecture: transformers' own model (`AutoModelForCausalLM.from_config`
of the same config) with mlcpipe's seeded synthetic weights, eager, fp32 or bf16, on the CPU.
Its KV cache is transformers' DynamicCache."""

from __future__ import annotations

import numpy as np
import torch

MODES = ("fp32", "bf16")


def load(config, mode: str, seed: int = 0):
    """The transformers model of `config` in `mode`, with `--weights synthetic`'s values."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from mlcpipe.hf_config import transformers_fields

    from ..common import hf_weights

    if mode not in MODES:
        raise ValueError(f"mode {mode!r}: the transformers peer runs {', '.join(MODES)}")
    model_type, fields = transformers_fields(config)
    model = AutoModelForCausalLM.from_config(AutoConfig.for_model(model_type, **fields)).eval()
    state = {name: torch.from_numpy(get()) for name, _, get in hf_weights(config, seed)}
    if config.tie_word_embeddings:
        state["lm_head.weight"] = state["model.embed_tokens.weight"]
    model.load_state_dict(state, strict=True)
    return model.to(torch.float32 if mode == "fp32" else torch.bfloat16)


class Session:
    """Feed tokens to one sequence; float32 logits of the last one."""

    def __init__(self, model):
        self.model, self.cache = model, None

    def reset(self) -> None:
        self.cache = None

    @torch.inference_mode()
    def forward(self, tokens) -> np.ndarray:
        out = self.model(torch.tensor([list(tokens)]), past_key_values=self.cache, use_cache=True)
        self.cache = out.past_key_values
        return out.logits[0, -1].float().numpy()


def run(settings, mode: str):
    """Benchmark one mode; returns a common.Result."""
    import time

    from ..common import Result, load_config, prompt_tokens, time_decode, time_prefill

    torch.set_num_threads(settings.threads)
    config = load_config(settings.model)
    started = time.perf_counter()
    session = Session(load(config, mode, settings.seed))
    result = Result("pytorch", f"{mode} (transformers)")
    load_s = time.perf_counter() - started
    prefill = prompt_tokens(config.vocab_size, settings.prefill, settings.seed + 1)
    result.prefill_s = time_prefill(session.forward, session.reset, prefill, settings.prefill_runs)
    result.prefill_tokens = settings.prefill
    context = prompt_tokens(config.vocab_size, settings.context, settings.seed)
    result.decode_ms, result.tokens = time_decode(session.forward, lambda t: session.forward([t]), session.reset, context,
                                                  settings.decode_steps)
    params = sum(p.numel() * p.element_size() for p in session.model.parameters())
    result.weight_bytes_per_token = params
    result.extra = {"load_s": load_s, "torch": torch.__version__, "threads": torch.get_num_threads()}
    result.notes.append(f"transformers {__import__('transformers').__version__} {config.architecture}, eager, DynamicCache")
    return result

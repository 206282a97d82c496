"""`mlcpipe run`: generate tokens with an artifact (greedy, or sampled on the device)."""

from __future__ import annotations

from pathlib import Path

from ..errors import OptionError, OptionValueError
from .device import remote_stops, run_options


def parse_tokens(text: str) -> list[int]:
    """--prompt-tokens: comma-separated token ids (non-negative integers; no empty entries)."""
    parts = text.replace(" ", "").split(",")
    if not all(p.isascii() and p.isdigit() for p in parts):
        raise OptionValueError(f"{text!r}: expected comma-separated non-negative integers, e.g. 1,2,3")
    return [int(p) for p in parts]


def run(artifact: Path, weights: str | None = None, *, prompt_tokens: str | None = None, prompt: str | None = None,
        tokenizer: Path | None = None, max_new_tokens: int = 16, weights_seed: int | None = None, sampling: dict | None = None,
        save_logits: Path | None = None, prefill_chunk: int | None = None, rpc: str | None = None,
        rpc_tracker: str | None = None, rpc_key: str | None = None, adapter: str | None = None,
        browser: bool = False) -> tuple[str | None, list[int]]:
    """Generate from the prompt; returns (the decoded text when a tokenizer is known, the token ids).
    `sampling`: the sampling flags given (temperature, top_p, ..., seed); none: greedy."""
    from ..generation import Sampling
    from ..runtime import check_logits_path, open_engine
    from ..runtime import save_logits as write_logits
    from ..tokenizer import find_tokenizer

    if save_logits is not None:
        from ..artifact import check_distinct_paths

        check_distinct_paths({"--tokenizer": tokenizer}, {"--save-logits": save_logits},
                             {"--artifact": artifact, "--weights": Path(weights) if weights not in (None, "synthetic") else None})
        check_logits_path(save_logits)  # after: its "such as DIR/logits.npy" must not name a file inside an input
    if weights_seed is not None and weights != "synthetic":
        raise OptionError("--weights-seed applies to --weights synthetic only (these weights are read from files)")
    if (prompt_tokens is None) == (prompt is None):
        raise OptionError("give exactly one of --prompt-tokens or --prompt")
    tok = find_tokenizer(tokenizer, weights, needed=prompt is not None)
    if prompt is not None:
        if tok is None:
            raise OptionError("--prompt needs a tokenizer: pass --tokenizer path/to/tokenizer.json")
        tokens = tok.encode(prompt)
    else:
        tokens = parse_tokens(prompt_tokens)
    given = {k: v for k, v in (sampling or {}).items() if v is not None}
    sampler = Sampling(**given) if given else None
    options = run_options(rpc, rpc_tracker, rpc_key, adapter, browser, prefill_chunk)
    with remote_stops(options, artifact):
        engine = open_engine(artifact, weights, weights_seed or 0, options)
        try:
            logits = []
            out = engine.generate(tokens, max_new_tokens, on_logits=lambda step, values: logits.append(values), sampling=sampler)
        finally:
            if hasattr(engine, "close"):
                engine.close()
    if save_logits is not None:
        write_logits(save_logits, logits)
    return (tok.decode(out) if tok is not None else None), out

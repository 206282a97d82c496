"""Write mlcpipe's seeded synthetic Llama weights as a GGUF file llama.cpp loads (arch "llama"),
as F16, then Q4_0 through llama.cpp's own quantizer.

What the llama arch expects, as llama.cpp's convert_hf_to_gguf.py writes it:
- q/k projection rows permuted for llama.cpp's "normal" (interleaved-pair) RoPE, from HF's
  rotate-half layout (`_permute`, the converter's LlamaModel.permute);
- llama3 rope scaling as a `rope_freqs.weight` tensor of per-frequency divisors;
- tied embeddings: no `output.weight`, llama.cpp reads `token_embd.weight` for the lm_head;
- a tokenizer section: a synthetic SentencePiece ("llama") vocab of `vocab_size` tokens
  (<unk>, <s>, </s>, the 256 byte tokens, then placeholders); the benchmark feeds token ids.
Q4_0 is written with `pure` (every matrix Q4_0, token_embd/output too), as q4f16_1 quantizes
every matrix; llama.cpp's default would keep the tied output at Q6_K. Q4_K_M is llama.cpp's own
recipe (not pure), the 4-bit type most of its users run.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

FORMAT_VERSION = 1  # bump when the file layout written here changes (cached files are keyed by it)
TYPES = {"f16": "F16", "q4_0": "Q4_0", "q4_k_m": "Q4_K_M"}


def _permute(w: np.ndarray, n_head: int) -> np.ndarray:
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def rope_factors(config) -> np.ndarray | None:
    """llama3 scaling as llama.cpp's converter computes it: the divisor of each frequency."""
    s = config.rope_scaling
    if s is None:
        return None
    dim = config.head_dim
    freqs = 1.0 / (config.rope_theta ** (np.arange(0, dim, 2, dtype=np.float32) / dim))
    low_wavelen = s.original_max_position_embeddings / s.low_freq_factor
    high_wavelen = s.original_max_position_embeddings / s.high_freq_factor
    out = []
    for freq in freqs:
        wavelen = 2 * math.pi / freq
        if wavelen < high_wavelen:
            out.append(1.0)
        elif wavelen > low_wavelen:
            out.append(s.factor)
        else:
            smooth = (s.original_max_position_embeddings / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor)
            out.append(1 / ((1 - smooth) / s.factor + smooth))
    return np.asarray(out, dtype=np.float32)


def _tokenizer(writer, vocab_size: int) -> None:
    import gguf

    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    types = [gguf.TokenType.UNKNOWN, gguf.TokenType.CONTROL, gguf.TokenType.CONTROL] + [gguf.TokenType.BYTE] * 256
    if vocab_size < len(tokens):
        raise ValueError(f"vocab_size {vocab_size} is smaller than the {len(tokens)} special + byte tokens")
    tokens += [f"\u2581t{i}" for i in range(len(tokens), vocab_size)]
    types += [gguf.TokenType.NORMAL] * (vocab_size - len(types))
    writer.add_tokenizer_model("llama")
    writer.add_token_list(tokens)
    writer.add_token_scores([0.0] * vocab_size)
    writer.add_token_types(types)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_unk_token_id(0)
    writer.add_add_bos_token(False)


def write_f16(config, path: Path, seed: int = 0) -> Path:
    """The model's seeded synthetic weights (benchmarks.common.hf_weights) as an F16 GGUF."""
    import gguf

    from ..common import hf_weights

    c = config
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_name(f"{c.name} (mlcpipe synthetic, seed {seed})")
    writer.add_context_length(c.context_window_size)
    writer.add_embedding_length(c.hidden_size)
    writer.add_block_count(c.num_hidden_layers)
    writer.add_feed_forward_length(c.intermediate_size)
    writer.add_head_count(c.num_attention_heads)
    writer.add_head_count_kv(c.num_key_value_heads)
    writer.add_key_length(c.head_dim)
    writer.add_value_length(c.head_dim)
    writer.add_rope_dimension_count(c.head_dim)
    writer.add_rope_freq_base(c.rope_theta)
    writer.add_layer_norm_rms_eps(c.rms_norm_eps)
    writer.add_vocab_size(c.vocab_size)
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    _tokenizer(writer, c.vocab_size)
    names = {
        "model.embed_tokens.weight": "token_embd.weight",
        "model.norm.weight": "output_norm.weight",
        "lm_head.weight": "output.weight",
    }
    per_layer = {
        "self_attn.q_proj.weight": "attn_q.weight", "self_attn.k_proj.weight": "attn_k.weight",
        "self_attn.v_proj.weight": "attn_v.weight", "self_attn.o_proj.weight": "attn_output.weight",
        "mlp.gate_proj.weight": "ffn_gate.weight", "mlp.up_proj.weight": "ffn_up.weight",
        "mlp.down_proj.weight": "ffn_down.weight", "input_layernorm.weight": "attn_norm.weight",
        "post_attention_layernorm.weight": "ffn_norm.weight",
    }
    factors = rope_factors(c)
    if factors is not None:
        writer.add_tensor("rope_freqs.weight", factors)
    for hf_name, _, get in hf_weights(c, seed):
        w = get()
        if hf_name in names:
            name = names[hf_name]
        else:
            _, _, layer, rest = hf_name.split(".", 3)
            name = f"blk.{layer}.{per_layer[rest]}"
            if rest == "self_attn.q_proj.weight":
                w = _permute(w, c.num_attention_heads)
            elif rest == "self_attn.k_proj.weight":
                w = _permute(w, c.num_key_value_heads)
        writer.add_tensor(name, np.ascontiguousarray(w.astype(np.float16 if w.ndim == 2 else np.float32)))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def quantize(src: Path, dst: Path, qtype: str, threads: int) -> Path:
    """llama.cpp's quantizer (llama_model_quantize), every matrix to `qtype`."""
    import llama_cpp

    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = {"q4_0": llama_cpp.LLAMA_FTYPE_MOSTLY_Q4_0, "q4_k_m": llama_cpp.LLAMA_FTYPE_MOSTLY_Q4_K_M}[qtype]
    params.nthread = threads
    params.pure = qtype == "q4_0"  # Q4_K_M: llama.cpp's own mix (some tensors Q6_K), as users run it
    rc = llama_cpp.llama_model_quantize(str(src).encode(), str(dst).encode(), params)
    if rc != 0:
        raise RuntimeError(f"llama_model_quantize({src} -> {dst}, {qtype}) returned {rc}")
    return dst


def gguf_path(config, qtype: str, seed: int, threads: int = 2, cache_dir: Path | None = None, log=print) -> Path:
    """The cached GGUF of `config`'s synthetic weights at `qtype` (TYPES), written if missing."""
    from ..mlcpipe_side import ROOT

    cache_dir = Path(cache_dir or ROOT / "artifacts" / "gguf")
    cache_dir.mkdir(parents=True, exist_ok=True)
    stem = f"{config.name}-{config.config_hash()}-seed{seed}-v{FORMAT_VERSION}"
    f16 = cache_dir / f"{stem}-f16.gguf"
    if not f16.is_file():
        log(f"[bench] writing {f16}")
        write_f16(config, f16.with_suffix(".tmp"), seed).rename(f16)
    if qtype == "f16":
        return f16
    out = cache_dir / f"{stem}-{qtype}.gguf"
    if not out.is_file():
        log(f"[bench] quantizing {out}")
        quantize(f16, out.with_suffix(".tmp"), qtype, threads).rename(out)
    return out

"""Named conversation templates, in MLC-LLM's `Conversation` format (the `conv_template` object of
mlc-chat-config.json). A model YAML names one (`conv_template: llama-3`) or gives a mapping with
the same fields; both are validated by `pipeline.config.parse_conv_template`. The prompt a
runtime builds from a template: docs/model.md.

Kept in code (not under configs/) so that the nightly cache key, which hashes every file under
pipeline/, changes when a template does.
"""

from __future__ import annotations

from typing import Any

# Llama 3 instruct format (<|begin_of_text|> = 128000, <|end_of_text|> = 128001, <|eot_id|> = 128009).
_LLAMA3_SYSTEM = "<|start_header_id|>system<|end_header_id|>\n\n{system_message}<|eot_id|>"

CONV_TEMPLATES: dict[str, dict[str, Any]] = {
    "llama-3": {
        "system_template": _LLAMA3_SYSTEM,
        "system_message": "You are a helpful, respectful and honest assistant.",
        "system_prefix_token_ids": [128000],
        "add_role_after_system_message": True,
        "roles": {"user": "<|start_header_id|>user", "assistant": "<|start_header_id|>assistant"},
        "seps": ["<|eot_id|>"],
        "role_content_sep": "<|end_header_id|>\n\n",
        "role_empty_sep": "<|end_header_id|>\n\n",
        "stop_str": ["<|end_of_text|>", "<|eot_id|>"],
        "stop_token_ids": [128001, 128009],
    },
    # Llama 3.1 / 3.2 instruct: as llama-3 plus the ipython (tool) role and <|eom_id|> (128008).
    "llama-3_1": {
        "system_template": _LLAMA3_SYSTEM,
        "system_message": "You are a helpful, respectful and honest assistant.",
        "system_prefix_token_ids": [128000],
        "add_role_after_system_message": True,
        "roles": {
            "user": "<|start_header_id|>user",
            "assistant": "<|start_header_id|>assistant",
            "tool": "<|start_header_id|>ipython",
        },
        "seps": ["<|eot_id|>"],
        "role_content_sep": "<|end_header_id|>\n\n",
        "role_empty_sep": "<|end_header_id|>\n\n",
        "stop_str": [],
        "stop_token_ids": [128001, 128008, 128009],
    },
    # ChatML as Qwen2 / Qwen2.5 / Qwen3 use it (<|endoftext|> = 151643, <|im_end|> = 151645).
    "qwen2": {
        "system_template": "<|im_start|>system\n{system_message}<|im_end|>\n",
        "system_message": "You are a helpful assistant.",
        "add_role_after_system_message": True,
        "roles": {"user": "<|im_start|>user", "assistant": "<|im_start|>assistant"},
        "seps": ["<|im_end|>\n"],
        "role_content_sep": "\n",
        "role_empty_sep": "\n",
        "stop_str": ["<|endoftext|>", "<|im_end|>"],
        "stop_token_ids": [151643, 151645],
    },
    # Gemma instruction turns (MLC-LLM's gemma_instruction: <bos> = 2 first; stop at <eos> = 1, <end_of_turn> = 107).
    "gemma_instruction": {
        "system_template": "{system_message}",
        "system_message": "",
        "system_prefix_token_ids": [2],
        "add_role_after_system_message": True,
        "roles": {"user": "<start_of_turn>user", "assistant": "<start_of_turn>model"},
        "seps": ["<end_of_turn>\n"],
        "role_content_sep": "\n",
        "role_empty_sep": "\n",
        "stop_str": ["<end_of_turn>"],
        "stop_token_ids": [1, 107],
    },
    # Plain completion (MLC-LLM's "LM"): the text as is, bos 1 before it, stop at eos 2.
    "LM": {
        "system_template": "{system_message}",
        "system_message": "",
        "system_prefix_token_ids": [1],
        "add_role_after_system_message": True,
        "roles": {"user": "", "assistant": ""},
        "seps": [""],
        "role_content_sep": "",
        "role_empty_sep": "",
        "stop_str": [],
        "stop_token_ids": [2],
    },
}

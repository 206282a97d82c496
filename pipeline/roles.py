"""The roles kernels play in a model, named once: the build gives each kernel its role
(pipeline/kernel_info.py, recorded in the manifest), `mlcpipe check` picks the weight kernels it
also checks against NumPy, the profiler's reports group and order by role, and the tests use the
same names.

Weight roles come first: the kernels that read one weight matrix, told exactly by the parameter
they read. The others are told by the (TVM-given) kernel name.
"""

from __future__ import annotations

import re

# parameter name fragment -> role of the kernel that reads it
ROLE_OF_PARAM = (
    ("qkv_proj", "qkv"),
    ("o_proj", "o_proj"),
    ("gate_up_proj", "gate_up"),
    ("down_proj", "down"),
    ("lm_head", "lm_head"),
)
WEIGHT_ROLES = tuple(role for _, role in ROLE_OF_PARAM)
EMBEDDING_PARAM = "embed_tokens"  # read by the embedding, and by a tied lm_head (a matmul)

# kernel name pattern -> role, first match wins
ROLE_OF_NAME = (
    (r"^sampler_", "sampler"),  # pipeline/model/sampler.py
    (r"attention|batch_prefill|batch_decode|tree_attn|merge_state", "attention"),
    (r"kv_cache_transpose_append|transpose_append", "kv append"),
    (r"rms_norm|layer_norm", "norm"),
    (r"rope|rotary", "rope"),
    (r"silu", "swiglu"),
    (r"take", "embedding"),
)
OTHER = "other"

# every role, in report order: weight roles, then the others
ROLES = (*WEIGHT_ROLES, "attention", "kv append", "norm", "rope", "swiglu", "embedding", "sampler", OTHER)


def role_by_name(kernel: str) -> str:
    for pattern, role in ROLE_OF_NAME:
        if re.search(pattern, kernel):
            return role
    return OTHER


def role_of_param(param: str, kernel: str) -> str:
    """The role of `kernel`, the first parameter it reads being `param`."""
    if EMBEDDING_PARAM in param:
        return "lm_head" if "matmul" in kernel else "embedding"
    for key, role in ROLE_OF_PARAM:
        if key in param:
            return role
    return role_by_name(kernel)

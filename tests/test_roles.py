"""One role list (pipeline/roles.py): the build's kernel classification, `mlcpipe check`, the
profiler's reports and the benchmarks take their role names from it."""

from __future__ import annotations

from mlcpipe import roles
from mlcpipe.roles import ROLES, WEIGHT_ROLES, role_by_name, role_of_param


def test_check_build_and_profiler_share_the_role_list():
    from benchmarks import mlcpipe_side
    from mlcpipe import conformance, kernel_info
    from mlcpipe.profiler import reports

    assert reports.ROLES is ROLES
    assert conformance.WEIGHT_ROLES is WEIGHT_ROLES and mlcpipe_side.GEMV_ROLES is WEIGHT_ROLES
    assert kernel_info.role_of_param is role_of_param and kernel_info.role_by_name is role_by_name


def test_every_role_the_classification_gives_is_listed():
    assert ROLES[: len(WEIGHT_ROLES)] == WEIGHT_ROLES == ("qkv", "o_proj", "gate_up", "down", "lm_head")
    given = {role for _, role in roles.ROLE_OF_PARAM} | {role for _, role in roles.ROLE_OF_NAME} | {roles.OTHER}
    assert given <= set(ROLES) and len(set(ROLES)) == len(ROLES)
    assert role_of_param("model.layers.3.mlp.gate_up_proj.q_weight", "fused_dequantize2_NT_matmul2_cast2") == "gate_up"
    assert role_of_param("model.embed_tokens.q_weight", "fused_dequantize_NT_matmul4_cast3") == "lm_head"  # tied
    assert role_of_param("model.embed_tokens.q_weight", "take_dequantize") == "embedding"
    assert role_by_name("rms_norm1") == "norm" and role_by_name("sampler_softmax_merge") == "sampler"
    assert role_by_name("something_else") == "other"

"""GPU (CUDA, Metal, WebGPU) schedule rules, per target: ours first, then TVM dlight's.

Order (`rules_for`): SamplerGPU (sampler.py: every sampler kernel), GEMVDequant (gemv_dequant.py:
one-token GEMV, int4 dequantize fused, or unquantized f16/f32), then dlight's Matmul, GEMV,
LowBatchGEMV, Reduction, GeneralReduction and Fallback, in MLC-LLM's order. Multi-token GEMV and
rms_norm stay dlight's (docs/schedules.md says why).
Each rule is a dataclass whose fields are its knobs; `Rule.for_target(kind)` gives the target's
defaults and `rule.knob_space(func, target)` the candidate values for one kernel.
"""

from tvm.s_tir import dlight as dl

from .gemv_dequant import GEMVDequant
from .sampler import SamplerGPU


def _dlight_rules() -> list:
    return [
        dl.gpu.Matmul(),
        dl.gpu.GEMV(),
        dl.gpu.LowBatchGEMV(),
        dl.gpu.Reduction(),
        dl.gpu.GeneralReduction(),
        dl.gpu.Fallback(),
    ]


def rules_for(kind: str) -> list:
    """Our rules with `kind`'s default knobs, then dlight's."""
    return [SamplerGPU(), GEMVDequant.for_target(kind), *_dlight_rules()]


CUDA_RULES = rules_for("cuda")
METAL_RULES = rules_for("metal")
WEBGPU_RULES = rules_for("webgpu")

__all__ = ["CUDA_RULES", "METAL_RULES", "WEBGPU_RULES", "GEMVDequant", "SamplerGPU", "rules_for"]

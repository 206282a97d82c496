"""GPU (CUDA, Metal, WebGPU) schedule rules, per target.

Our own rules come first, then TVM dlight's GPU rules as fallbacks, in the order MLC-LLM uses
them: Matmul (prefill GEMM, tensor cores where available), GEMV, LowBatchGEMV, Reduction,
GeneralReduction (norms, softmax), Fallback (thread-binds anything else).

- GEMVDequant (gemv_dequant.py): one-token decode GEMV with the int4 dequantize fused in
  (`fused_dequantizeN_NT_matmulM[_cast][_add]`) and the unquantized f16/f32 NT_matmul.
- SamplerGPU (sampler.py): hand-written GPU forms of the sampler's in-place and sort kernels
  (its softmax / top-p kernels fall through to dlight).
- Multi-token GEMV and rms_norm stay dlight's. Our model has no static 2-8 row GEMV: prefill
  and any batched decode go through the symbolic `seq_len` kernels, which dlight's Matmul takes
  (LowBatchGEMV stays in the list for static small batches). dlight's Reduction already gives
  the rms_norm one block per row (1024 threads on CUDA, coalesced loads, two-level warp-shuffle
  reduce, the normalisation fused after it): a 4 KB row is launch-latency bound either way.

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

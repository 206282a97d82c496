"""GPU (CUDA, Metal, WebGPU) schedule rules.

Until our own GPU rules land (issue 5), every GPU kernel gets TVM dlight's GPU rules in the order
MLC-LLM uses them: Matmul (prefill GEMM, tensor cores where available), GEMV (decode), LowBatchGEMV,
Reduction, GeneralReduction (norms, softmax), Fallback (thread-binds anything else).
"""

from tvm.s_tir import dlight as dl

GPU_RULES = [
    dl.gpu.Matmul(),
    dl.gpu.GEMV(),
    dl.gpu.LowBatchGEMV(),
    dl.gpu.Reduction(),
    dl.gpu.GeneralReduction(),
    dl.gpu.Fallback(),
]

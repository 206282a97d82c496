"""CPU (LLVM) schedule rules, in the order they are tried (LLVM_RULES; the first match wins).

SamplerCPU; the decode GEMVs DecodeGEMVQ4VNNI (q4, int8 dot products), DecodeGEMVQ4F32 (q4, f32, no
AMX), DecodeGEMVQ4 (q4, f32) and DecodeGEMVFloat (unquantized); the prefill GEMMs PrefillGEMMAMX
(AMX bf16 tiles), PrefillGEMMQ4I8MM (q4, aarch64 int8 matrix multiply-accumulate),
PrefillGEMMQ4VNNI (q4, int8 dot products), PrefillGEMMBF16 (bf16 dot products), PrefillGEMMF32
(f32 FMA register tiles, AVX-512) and PrefillGEMM (f32, portable); MatmulNT (any other NT
matmul), RowNorm (rms_norm), RopeTable (RoPE), Elementwise (injective kernels).
Rules import only schedules.base, schedules.analysis and microkernels.py, never each other; the
vectorizable exp (fast_exp.py) is installed by the build (pipeline/backends/llvm.py), not by
importing this package. Each rule in more detail: docs/schedules.md.
"""

from .elementwise import Elementwise
from .gemm_amx import PrefillGEMMAMX
from .gemm_bf16 import PrefillGEMMBF16
from .gemm_dequant import PrefillGEMM
from .gemm_f32 import PrefillGEMMF32
from .gemm_q4_i8mm import PrefillGEMMQ4I8MM
from .gemm_q4_vnni import PrefillGEMMQ4VNNI
from .gemv_float import DecodeGEMVFloat
from .gemv_q4 import DecodeGEMVQ4
from .gemv_q4_f32 import DecodeGEMVQ4F32
from .gemv_q4_vnni import DecodeGEMVQ4VNNI
from .matmul_nt import MatmulNT
from .rope import RopeTable
from .row_norm import RowNorm
from .sampler import SamplerCPU

LLVM_RULES = [SamplerCPU(), DecodeGEMVQ4VNNI(), DecodeGEMVQ4F32(), DecodeGEMVQ4(), DecodeGEMVFloat(), PrefillGEMMAMX(), PrefillGEMMQ4I8MM(), PrefillGEMMQ4VNNI(), PrefillGEMMBF16(), PrefillGEMMF32(), PrefillGEMM(), MatmulNT(), RowNorm(), RopeTable(), Elementwise()]

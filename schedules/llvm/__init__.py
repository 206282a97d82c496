"""CPU (LLVM) schedule rules, most specific first.

DecodeGEMVQ4VNNI  one-token q4 GEMV on AVX512-VNNI: int8 activations, u8 x s8 dot products
DecodeGEMVQ4  one-token q4 GEMV, group scale factored out, nibbles unpacked in registers (f32
              activations: where VNNI is absent, or pinned by a tuning database)
PrefillGEMMAMX  many-token GEMM on AMX bf16 tiles (f16-activation models), weight tile decoded per task;
              1-4 tokens: a branch with the decode GEMVs' arithmetic (low batch)
PrefillGEMMQ4VNNI  many-token q4 GEMM on AVX512-VNNI without AMX: the decode GEMV's int8 arithmetic, tokens in passes
PrefillGEMMBF16  many-token GEMM of f16 models on AVX512-BF16 without AMX (vdpbf16ps), q0f16's prefill
PrefillGEMM   many-token GEMM, weight tile decoded once per task, register-blocked micro-kernel
DecodeGEMVFloat  one-token GEMV with unquantized weights: f32 accumulation, prefetched rows
MatmulNT      any other NT matmul (unquantized decode GEMV, odd shapes): rfactor-vectorised K
RowNorm       per-row reductions + elementwise (rms_norm): reduction once per row, rows in parallel
RopeTable     RoPE: cos / sin hoisted out of the head loop into per-(token, dim) tables
Elementwise   injective kernels (swiglu, casts, KV append): producers inlined, parallel + vectorized
SamplerCPU    (first) the sampler kernels, as written (sampler.py)

Rules import only schedules.base, schedules.analysis and the shared micro-kernels
(microkernels.py), never each other. The vectorizable exp lowering (fast_exp.py) is installed by
the build (pipeline/backends/llvm.py), not by importing this package.
"""

from .elementwise import Elementwise
from .gemm_amx import PrefillGEMMAMX
from .gemm_bf16 import PrefillGEMMBF16
from .gemm_dequant import PrefillGEMM
from .gemm_q4_vnni import PrefillGEMMQ4VNNI
from .gemv_float import DecodeGEMVFloat
from .gemv_q4 import DecodeGEMVQ4
from .gemv_q4_vnni import DecodeGEMVQ4VNNI
from .matmul_nt import MatmulNT
from .rope import RopeTable
from .row_norm import RowNorm
from .sampler import SamplerCPU

LLVM_RULES = [SamplerCPU(), DecodeGEMVQ4VNNI(), DecodeGEMVQ4(), DecodeGEMVFloat(), PrefillGEMMAMX(), PrefillGEMMQ4VNNI(), PrefillGEMMBF16(), PrefillGEMM(), MatmulNT(), RowNorm(), RopeTable(), Elementwise()]

"""CPU (LLVM) schedule rules, most specific first.

DecodeGEMVQ4  one-token q4 GEMV, group scale factored out, nibbles unpacked in registers
PrefillGEMM   many-token GEMM, weight tile decoded once per task, register-blocked micro-kernel
MatmulNT      any other NT matmul (unquantized decode GEMV, odd shapes): rfactor-vectorised K
"""

from .gemm_dequant import PrefillGEMM
from .gemv_q4 import DecodeGEMVQ4
from .matmul_nt import MatmulNT

LLVM_RULES = [DecodeGEMVQ4(), PrefillGEMM(), MatmulNT()]

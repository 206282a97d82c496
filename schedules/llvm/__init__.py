"""CPU (LLVM) schedule rules."""

from .matmul_nt import MatmulNT

LLVM_RULES = [MatmulNT()]

"""CPU decode GEMV with unquantized weights (q0f16, q0f32): y[n] = sum_k x[k] * W[n, k].

Memory-bound: the activation is converted to f32 once per call; per 16 weights of a row, one load
+ convert and one FMA into the row's f32 accumulator; rows interleaved and weight rows
software-prefetched ahead (microkernels.py: the row-GEMV skeleton, `float_chunk`). Products and
sums in f32, as the unscheduled kernel. Handles: llvm, one activation row, unquantized static
[N, K] weight with K % 16 == 0, N % rows == 0. Anything else: None.
Knobs: rows (rows per parallel task, interleaved), prefetch (rows ahead; 0 = off).
"""

from __future__ import annotations

import dataclasses

from tvm import tirx
from tvm.target import Target

from ..analysis import match_on_cpu
from .microkernels import LANES, RowGEMVRule, activation_bytes, activation_f32, extern_gemv, float_chunk, row_loop


@dataclasses.dataclass
class DecodeGEMVFloat(RowGEMVRule):
    def applicable(self, func: tirx.PrimFunc, target: Target):
        info = match_on_cpu(func, target, decode=True)
        if info is None or info.quantized or info.k % LANES or len(info.rows_shape) not in (1, 2):
            return None
        return info

    def build(self, info, target: Target) -> tirx.PrimFunc:
        inputs = info.placeholders()
        x = inputs[info.param_index(info.x)]
        w = inputs[info.param_index(info.weight)]

        def kernel(x32, weight, out):
            chunk, streams = float_chunk(x32, weight)
            return row_loop(info.n, self.rows, info.k // LANES, out, lambda n, c: chunk(n, c, 0), streams, self.prefetch, activation_bytes(info))

        return extern_gemv(info, inputs, [activation_f32(x, info.k), w], kernel)


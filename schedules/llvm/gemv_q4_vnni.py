"""CPU decode GEMV with MLC q4 weights on AVX512-VNNI: int8 activations, u8 x s8 dot products.

y[n] = sum_k x[k] * (q[n, k] - 7) * s[n, k // G]. The float rule (gemv_q4.py) spends ~3 vector
ops per 16 weights on unpacking and converting nibbles; with weights streaming at memory speed
that is what bounds it. Here the activation is split once per call into int8 planes with one
scale per weight group (a[g] = max|x| over the group / 127): p0 = round(x / a) (llama.cpp's Q8
activations) and p1 = round(256 (x / a - p0)), so x = a (p0 + p1 / 256) to ~16 bits, and

    y[n] = sum_g s[n, g] * a[g] * sum_{k in g} (q[n, k] - 7) * (p0[k] + p1[k] / 256)

and the inner sum is exact integer arithmetic on `vpdpbusd` (64 u8 x s8 products per
instruction, 4 adjacent ones summed into each int32 lane). Per 16 packed words (128 weights) of a
row: one load, `w & 0x0F0F0F0F` and `(w >> 4) & 0x0F0F0F0F` (each byte now holds one nibble: the
low nibbles are the even k of the word, the high nibbles the odd k), two vpdpbusd against the
activation bytes pre-arranged to match (even k / odd k, four per word), starting from
-7 * sum(p) of each word so the zero point costs nothing (twice with two planes); then the int32
sums converted and combined (one FMA) and one FMA with the group scales (s[n, g] expanded to the
words of the chunk, times a[g]). The activation planes (per plane K bytes + K/8 words, plus K/8
floats) are built once per call, before the parallel loop over rows. The second plane costs ~2%
here: the kernel is bound by the weight stream. This is written as explicit vector TIR (te.extern) since the arithmetic is not a
reorder of the original loop nest; the epilogue (cast, residual add) is the original one.

Numerics: differs from the f16 kernel by the activation rounding: |error| <= a[g] / 512 per
element with two planes (below f16's own rounding), a[g] / 2 with `planes=1` (~0.4% of the
group's largest activation: llama.cpp's Q4_0 x Q8_0 trade); everything after the integer dot
products is f32. Only models whose
activations are f16 (q4f16_1) take it: f32 models (q4f32_1) keep f32 arithmetic (DecodeGEMVQ4),
and a tuning database can pin that rule for any kernel.

Handles: llvm targets with avx512vnni, one f16 activation row, static N and K, K % 128 == 0, group
size G with G / 8 dividing 16 or 16 dividing G / 8, N % rows == 0. Anything else: None.

Knobs: rows (rows per parallel task, interleaved so their dot-product chains overlap and share
the activation loads), prefetch (rows ahead to software-prefetch weights and scales; 0 = off),
planes (1 or 2 int8 activation planes).
Measured on gate_up 16384x2048 with the weights streaming from DRAM, 2 threads: 13.4 GB/s
without prefetch, 22.6 GB/s 8 rows ahead (a plain vector sum of the same bytes: 16-22 GB/s).
"""

from __future__ import annotations

import dataclasses

from tvm import tirx
from tvm.target import Target

from ..analysis import match_on_cpu
from .microkernels import LANES, RowGEMVRule, extern_gemv, int8_isa, quantize_activation, row_loop, vnni_chunk


@dataclasses.dataclass
class DecodeGEMVQ4VNNI(RowGEMVRule):
    planes: int = 2  # int8 activation planes: 1 = x / a rounded (llama.cpp's Q8), 2 = + residual (~16 bits)

    def applicable(self, func: tirx.PrimFunc, target: Target):
        if not isinstance(func, tirx.PrimFunc) or not self.is_target_available(target):
            return None
        if int8_isa(target) is None:
            return None
        info = match_on_cpu(func, target, decode=True)
        if info is None or info.bits != 4 or info.k % (8 * LANES) or len(info.rows_shape) not in (1, 2):
            return None
        if str(info.x.dtype) != "float16":  # f32 models (q4f32_1) keep f32 activations: DecodeGEMVQ4
            return None
        wpg = info.group_size // 8
        if info.group_size % 8 or not (LANES % wpg == 0 or wpg % LANES == 0):
            return None
        return info

    def build(self, info, target: Target) -> tirx.PrimFunc | None:
        if self.planes not in (1, 2):
            return None
        inputs = info.placeholders()
        x = inputs[info.param_index(info.x)]
        w = inputs[info.param_index(info.weight)]
        s = inputs[info.param_index(info.scale)]
        activation = quantize_activation(x, info.k, info.group_size, self.planes)
        return extern_gemv(info, inputs, [*activation, w, s], lambda *bufs: _kernel(info, self.rows, self.prefetch, self.planes, int8_isa(target), *bufs))


def _kernel(info, rows, prefetch, planes, isa, xlo, xhi, w0, a_word, weight, scale, out):
    """The GEMV body over the extern's buffers."""
    chunk, streams = vnni_chunk(info, planes, xlo, xhi, w0, a_word, weight, scale, isa)
    return row_loop(info.n, rows, info.k // (8 * LANES), out, lambda n, c: chunk(n, c, 0), streams, prefetch)


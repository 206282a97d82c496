"""CPU decode GEMV with MLC q4 weights in f32 arithmetic, on the row-GEMV skeleton.

DecodeGEMVQ4's arithmetic (per 16 packed words of a row: each nibble plane masked in place,
converted and multiplied by the activation pre-scaled by 16^-p, -7 sum(x) as a ninth plane, the
group scales once per 16 words; f32 products and sums) as explicit vectors on microkernels'
row_loop, which interleaves rows and software-prefetches each row's words and scales ahead: the
weights of the 1B's down_proj (K = 8192) did not stream at the bandwidth bound through
DecodeGEMVQ4's loop nest. Takes q4f32_1, and q4f16_1 where the CPU has no int8 dot product
(DecodeGEMVQ4VNNI comes first), on every CPU, AMX ones included (rows: 1 by default; measured: docs/schedules.md).
Handles: llvm, one activation row, static N and K, K % 128 == 0, G / 8 dividing 16 or 16 dividing
G / 8, N % rows == 0. Knobs: rows (rows per task, interleaved), prefetch (rows ahead; 0 = off).
"""

from __future__ import annotations

import dataclasses

from tvm import te, tirx
from tvm.script import tirx as T
from tvm.target import Target

from ..analysis import match_on_cpu
from .microkernels import LANES, RowGEMVRule, chunk_scales, extern_gemv, q4_words_fit, row_loop

PLANES = 9  # 8 nibble planes (x * 16^-p) and -7 * the word's sum of x
PLANE_BYTES = 4 * PLANES  # activation bytes a row re-reads per packed word (the prefetch locality: row_loop)


@dataclasses.dataclass
class DecodeGEMVQ4F32(RowGEMVRule):
    def applicable(self, func: tirx.PrimFunc, target: Target):
        info = match_on_cpu(func, target, decode=True)  # None off llvm targets
        if info is None or not q4_words_fit(info) or len(info.rows_shape) not in (1, 2):
            return None
        return info

    def default_rows(self, target: Target) -> int:
        return 1  # one sequential stream per thread, AMX CPUs included

    def build(self, info, target: Target) -> tirx.PrimFunc:
        inputs = info.placeholders()
        x = inputs[info.param_index(info.x)]
        w = inputs[info.param_index(info.weight)]
        s = inputs[info.param_index(info.scale)]

        def kernel(planes, weight, scale, out):
            chunk, streams = _chunk(info, planes, weight, scale)
            return row_loop(info.n, self.rows, info.k // (8 * LANES), out, chunk, streams, self.prefetch, PLANE_BYTES * info.k // 8)

        return extern_gemv(info, inputs, [activation_planes(x, info.k), w, s], kernel)


def activation_planes(x: te.Tensor, k: int) -> te.Tensor:
    """The activation as f32 planes [K/128 chunks, 9, 16 lanes], lane l being the chunk's word l:
    plane p < 7 holds x[128 c + 8 l + p] * 16^-p, plane 7 x[.. + 7] * 16^-6 (nibble_in_place),
    plane 8 -7 * sum_j x[128 c + 8 l + j]. The powers of 16 are exact."""
    lead = [0] * (len(x.shape) - 1)

    def xf(i):
        return x[(*lead, i)].astype("float32")

    j = te.reduce_axis((0, 8), "j")
    xsum = te.compute((k // 128, LANES), lambda c, l: te.sum(xf(128 * c + 8 * l + j), axis=j), name="xsum")

    def pow16(p):  # 16**-p as an exact float32 (exponent bits), p in 0..6 (nibble 7 is read shifted: 16^-6)
        return tirx.reinterpret("float32", ((127 - 4 * te.min(p, 6)) << 23).astype("int32"))

    return te.compute(
        (k // 128, PLANES, LANES),
        lambda c, p, l: te.if_then_else(p < 8, xf(128 * c + 8 * l + te.min(p, 7)) * pow16(p), tirx.const(-7.0, "float32") * xsum[c, l]),
        name="xplanes",
    )


def nibble_in_place(words, p: int):
    """Nibble p of each word, masked in place (times 16^p); nibble 7 shifted down by 4 (times 16^6)
    so every value is a non-negative int32: AVX2 has no unsigned int -> float conversion."""
    if p == 7:
        return (words >> T.broadcast(T.uint32(4), LANES)) & T.broadcast(T.uint32(15 << 24), LANES)
    return words & T.broadcast(T.uint32(15 << (4 * p)), LANES)


def _chunk(info, planes, weight, scale):
    """(chunk(n, c), streams(n, c)) over the extern's buffers: row n's f32 partial sums for
    packed words 16 c .. 16 c + 15, and the addresses of its words and scales there."""
    scales, scale_index = chunk_scales(info, scale)

    def plane(c, p):
        return planes[c, p, T.ramp(0, 1, LANES)]

    def chunk(n, c):
        words = weight[n, T.ramp(c * LANES, 1, LANES)]
        sums = [plane(c, 8), None]  # two chains: even and odd planes
        for p in range(8):
            nib = T.Cast("float32x16", T.reinterpret("int32x16", nibble_in_place(words, p))) * plane(c, p)
            sums[p % 2] = nib if sums[p % 2] is None else sums[p % 2] + nib
        return (sums[0] + sums[1]) * scales(n, c)

    def streams(n, c):
        return [T.address_of(weight[n, c * LANES]), T.address_of(scale[n, scale_index(c)])]

    return chunk, streams

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
import functools

from tvm import te, tirx
from tvm.script import tirx as T
from tvm.target import Target, codegen

from .dequant_matmul import match_on_cpu
from .row_gemv import LANES, RowGEMVRule, activation_f32_at, extern_gemv, row_loop

NIBBLES = 0x0F0F0F0F
VPDPBUSD = "llvm.x86.avx512.vpdpbusd.512"  # (i32x16 acc, u8x64, s8x64): 4 products per lane
RESIDUAL = 256.0  # the second activation plane counts in units of a / 256


@dataclasses.dataclass
class DecodeGEMVQ4VNNI(RowGEMVRule):
    planes: int = 2  # int8 activation planes: 1 = x / a rounded (llama.cpp's Q8), 2 = + residual (~16 bits)

    def applicable(self, func: tirx.PrimFunc, target: Target):
        if not isinstance(func, tirx.PrimFunc) or target.kind.name != "llvm":
            return None
        if not codegen.target_has_features("avx512vnni", target):
            return None
        info = match_on_cpu(func, target, decode=True)
        if info is None or not info.quantized or info.k % (8 * LANES) or len(info.rows_shape) not in (1, 2):
            return None
        if str(info.x.dtype) != "float16":  # f32 models (q4f32_1) keep f32 activations: DecodeGEMVQ4
            return None
        wpg = info.group_size // 8
        if info.group_size % 8 or not (LANES % wpg == 0 or wpg % LANES == 0):
            return None
        return info

    def build(self, info) -> tirx.PrimFunc | None:
        if self.planes not in (1, 2):
            return None
        inputs = info.placeholders()
        x = inputs[info.param_index(info.x)]
        w = inputs[info.param_index(info.weight)]
        s = inputs[info.param_index(info.scale)]
        activation = quantize_activation(x, info.k, info.group_size, self.planes)
        return extern_gemv(info, inputs, [*activation, w, s], lambda *bufs: _kernel(info, self.rows, self.prefetch, self.planes, *bufs))


def quantize_activation(x: te.Tensor, k: int, group: int, planes: int = 2, tokens=1):
    """The activation planes the kernel reads, for the first `tokens` rows of x (static or
    symbolic): (xlo, xhi) int8 [tokens, planes, K/2] (the even / odd k of each packed word, four
    per word), w0 int32 [tokens, planes, K/8] (-7 * sum of the word's int8 values) and a_word f32
    [tokens, K/8] (the int8 scale a of the word's group). Plane 0 is round(x / a); plane 1 (if
    any) the rounding residual in units of a / 256, so x = a * (p0 + p1 / 256) to ~16 bits."""
    xf = functools.partial(activation_f32_at, x)
    r = te.reduce_axis((0, group), "r")
    amax = te.compute((tokens, k // group), lambda t, g: te.max(te.abs(xf(t, group * g + r)), axis=r), name="amax")
    inv = te.compute(
        (tokens, k // group),
        lambda t, g: te.if_then_else(amax[t, g] > 0, tirx.const(127.0, "float32") / amax[t, g], tirx.const(0.0, "float32")),
        name="inv",
    )
    scaled = te.compute((tokens, k), lambda t, i: xf(t, i) * inv[t, i // group], name="x_scaled")

    def plane(t, p, i):
        high = tirx.nearbyint(scaled[t, i])
        low = tirx.nearbyint((scaled[t, i] - high) * tirx.const(RESIDUAL, "float32"))
        low = te.max(te.min(low, tirx.const(127.0, "float32")), tirx.const(-127.0, "float32"))
        return te.if_then_else(p == 0, high, low).astype("int8")

    xq = te.compute((tokens, planes, k), plane, name="xq")
    xlo = te.compute((tokens, planes, k // 2), lambda t, p, i: xq[t, p, 8 * (i // 4) + 2 * (i % 4)], name="xlo")
    xhi = te.compute((tokens, planes, k // 2), lambda t, p, i: xq[t, p, 8 * (i // 4) + 2 * (i % 4) + 1], name="xhi")
    j = te.reduce_axis((0, 8), "j")
    w0 = te.compute((tokens, planes, k // 8), lambda t, p, w: te.sum(xq[t, p, 8 * w + j].astype("int32") * -7, axis=j), name="w0")
    wpg = group // 8
    a_word = te.compute((tokens, k // 8), lambda t, w: amax[t, w // wpg] / tirx.const(127.0, "float32"), name="a_word")
    return xlo, xhi, w0, a_word


def _kernel(info, rows, prefetch, planes, xlo, xhi, w0, a_word, weight, scale, out):
    """The GEMV body over the extern's buffers."""
    chunk, streams = vnni_chunk(info, planes, xlo, xhi, w0, a_word, weight, scale)
    return row_loop(info.n, rows, info.k // (8 * LANES), out, lambda n, c: chunk(n, c, 0), streams, prefetch)


def vnni_chunk(info, planes, xlo, xhi, w0, a_word, weight, scale):
    """(chunk(n, c, t), streams(n, c)): chunk gives row n's f32 partial dot product with token
    t's activation over packed words 16 c .. 16 c + 15 (16 lanes); streams the addresses of the
    row's weight and scale data for that chunk (for software prefetch)."""
    wpg = info.group_size // 8
    gpc = max(LANES // wpg, 1)  # scale groups per chunk of 16 words
    chunks_per_group = max(wpg // LANES, 1)
    # word l of chunk c belongs to group c * gpc + expand[l] (to group c // chunks_per_group when gpc == 1)
    expand = [lane // wpg for lane in range(LANES)]
    copies = LANES // gpc  # Shuffle cannot widen: it picks from `copies` concatenated copies

    def scale_index(c):
        return c * gpc if gpc > 1 else c // chunks_per_group

    def vec(buf, t, p, start, lanes):
        return buf[t, p, T.ramp(start, 1, lanes)]

    def dot(n, c, t, p):
        """sum over each word's 8 k of (q - 7) * plane p of token t's x: int32 x 16 words"""
        words = weight[n, T.ramp(c * LANES, 1, LANES)]
        mask = T.broadcast(T.uint32(NIBBLES), LANES)
        lo = T.reinterpret("int8x64", words & mask)
        hi = T.reinterpret("int8x64", (words >> T.broadcast(T.uint32(4), LANES)) & mask)
        acc = T.call_llvm_pure_intrin("int32x16", VPDPBUSD, vec(w0, t, p, c * LANES, LANES), lo, T.reinterpret("int8x64", vec(xlo, t, p, c * 64, 64)))
        return T.call_llvm_pure_intrin("int32x16", VPDPBUSD, acc, hi, T.reinterpret("int8x64", vec(xhi, t, p, c * 64, 64)))

    def dots(n, c, t):
        value = T.Cast("float32x16", dot(n, c, t, 0))
        if planes == 2:
            value = value + T.Cast("float32x16", dot(n, c, t, 1)) * T.broadcast(T.float32(1.0 / RESIDUAL), LANES)
        return value

    def group_scales(n, c, t):
        if gpc > 1:
            scales = T.Shuffle([T.Cast(f"float32x{gpc}", scale[n, T.ramp(c * gpc, 1, gpc)])] * copies, expand)
        else:
            scales = T.broadcast(T.Cast("float32", scale[n, scale_index(c)]), LANES)
        return scales * a_word[t, T.ramp(c * LANES, 1, LANES)]

    def chunk(n, c, t):
        return dots(n, c, t) * group_scales(n, c, t)

    def streams(n, c):
        return [T.address_of(weight[n, c * LANES]), T.address_of(scale[n, scale_index(c)])]

    return chunk, streams

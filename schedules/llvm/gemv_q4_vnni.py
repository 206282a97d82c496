"""CPU decode GEMV with MLC q4 weights on int8 dot products: y[n] = sum_k x[k] (q[n, k] - 7) s[n, k // G].

The activation is split once per call into int8 planes with one scale per weight group (plane 0:
llama.cpp's Q8; plane 1: the residual, ~16 bits together); per 16 packed words of a row the
nibbles are masked into bytes and summed exactly by two u8 x s8 dot products per plane, then one
FMA with the group scales (AVX2: both planes in one int32, 256 x plane 0 + plane 1, no float work
per plane). Only f16-activation models (q4f16_1); f32 models keep DecodeGEMVQ4.
Handles: llvm with AVX512-VNNI, AVX-VNNI, AVX2 or aarch64 dotprod, one f16 activation row, static N and
K, K % 128 == 0, G / 8 dividing 16 or 16 dividing G / 8, N % rows == 0. Anything else: None.
Knobs: rows (rows per parallel task, interleaved), prefetch (rows ahead; 0 = off), planes (1 or 2),
grouped (AVX2, groups of 32, K % 512 == 0: the f32 tail per weight group, microkernels.grouped_chunk;
0: per word).
"""

from __future__ import annotations

import dataclasses

from tvm import tirx
from tvm.target import Target

from ..analysis import match_on_cpu
from .microkernels import (BLOCK_GROUPS, GROUP_WORDS, LANES, RowGEMVRule, activation_bytes, extern_gemv, folds_planes, grouped_chunk, groups_fit, int8_isa,
                           quantize_activation, row_loop, vnni_chunk)


@dataclasses.dataclass
class DecodeGEMVQ4VNNI(RowGEMVRule):
    planes: int = 2  # int8 activation planes: 1 = x / a rounded (llama.cpp's Q8), 2 = + residual (~16 bits)
    grouped: int = 1  # AVX2, groups of 32, K % 512 == 0: scales applied per group (1) or per word (0)

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
        isa = int8_isa(target)
        grouped = bool(self.grouped) and groups_fit(info, isa)
        activation = quantize_activation(x, info.k, info.group_size, self.planes, fold=folds_planes(isa, self.planes), grouped=grouped)
        return extern_gemv(info, inputs, [*activation, w, s], lambda *bufs: _kernel(info, self.rows, self.prefetch, self.planes, isa, grouped, *bufs))

    def knob_space(self, func: tirx.PrimFunc, target: Target) -> dict[str, list]:
        space = super().knob_space(func, target)
        info = self.applicable(func, target) if space else None
        return {**space, "grouped": [1, 0]} if info is not None and groups_fit(info, int8_isa(target)) else space


def _kernel(info, rows, prefetch, planes, isa, grouped, *bufs):
    """The GEMV body over the extern's buffers: (xlo, xhi, w0, a_word | a_group, c_group, spread), weight, scale, out."""
    *activation, weight, scale, out = bufs
    if grouped:
        chunk, streams = grouped_chunk(info, planes, *activation, weight, scale)
        steps = info.k // (8 * GROUP_WORDS * BLOCK_GROUPS)
    else:
        chunk, streams = vnni_chunk(info, planes, *activation, weight, scale, isa)
        steps = info.k // (8 * LANES)
    return row_loop(info.n, rows, steps, out, lambda n, c: chunk(n, c, 0), streams, prefetch, activation_bytes(info, planes, grouped))


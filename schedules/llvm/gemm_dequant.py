"""CPU prefill GEMM with the dequantize fused: C[m, n] = sum_k x[m, k] * W[n, k], many tokens m.

Each parallel task decodes its `tile_n` weight rows into an f32 tile (in L2, reused by every
token), the activation is converted to f32 once per call, and a register-blocked micro-kernel of
`block_m` tokens x `block_n` rows of 16-float accumulators runs along K.
Handles: symbolic or static token count, static N, K with N % tile_n == 0 and K % lanes == 0,
group-quantized (any bits) or unquantized weights, any elementwise epilogue; single-row (decode)
kernels are left to the GEMV rules. Anything else: None.
Knobs: tile_n (weight rows per parallel task), block_m, block_n (micro-kernel), lanes (vector width).
"""

from __future__ import annotations

import dataclasses

from tvm import s_tir, te, tirx
from tvm.target import Target

from ..analysis import blocks_after, match_on_cpu
from ..base import CPUScheduleRule
from .microkernels import rebuild


@dataclasses.dataclass
class PrefillGEMM(CPUScheduleRule):
    tile_n: int = 32
    block_m: int = 4
    block_n: int = 4
    lanes: int = 16

    def knob_space(self, func: tirx.PrimFunc, target: Target) -> dict[str, list]:
        info = _applicable(func, target)
        if info is None:
            return {}
        return {
            "tile_n": [v for v in (16, 32, 64) if info.n % v == 0],
            "block_m": [2, 4, 6],
            "block_n": [2, 4],
            "lanes": [v for v in (16, 32) if info.k % v == 0],
        }

    def apply(self, func: tirx.PrimFunc, target: Target, tunable: bool) -> s_tir.Schedule | None:
        del tunable
        info = _applicable(func, target)
        if info is None:
            return None
        if info.n % self.tile_n or self.tile_n % self.block_n or info.k % self.lanes:
            return None
        sch = s_tir.Schedule(_build(info, self.block_m))
        mm = sch.get_sblock("matmul")
        wd, xf = sch.get_sblock("weight_f32"), sch.get_sblock("x_f32")
        loops = sch.get_loops(mm)  # *lead, m, n, k
        m, n, k = loops[-3], loops[-2], loops[-1]
        lead = loops[:-3]
        task, nb, ni = sch.split(n, [None, self.tile_n // self.block_n, self.block_n])
        mo, mi = sch.split(m, [None, self.block_m])
        ko, kv = sch.split(k, [None, self.lanes])
        sch.reorder(task, *lead, mo, nb, ko, mi, ni, kv)
        rf = sch.rfactor(kv, factor_axis=len(lead) + 2)
        # rf loops: task, *lead, mo, nb, ko, mi, ni, kv ; the kv-sum block follows at nb level
        sch.reverse_compute_at(mm, sch.get_loops(rf)[len(lead) + 2])
        for consumer in blocks_after(sch, mm):
            sch.reverse_compute_at(consumer, sch.get_loops(rf)[0])
        sch.compute_at(wd, sch.get_loops(rf)[0])
        sch.parallel(sch.get_loops(rf)[0])
        rf_loops = sch.get_loops(rf)
        sch.vectorize(rf_loops[-1])
        sch.unroll(rf_loops[-2])
        sch.unroll(rf_loops[-3])
        sch.decompose_reduction(rf, rf_loops[-4])
        wd_loops = sch.get_loops(wd)
        _, wk = sch.split(wd_loops[-1], [None, self.lanes])
        sch.vectorize(wk)
        xf_loops = sch.get_loops(xf)
        _, xk = sch.split(xf_loops[-1], [None, self.lanes])
        sch.vectorize(xk)
        return sch


def _applicable(func, target):
    return match_on_cpu(func, target, decode=False)


def _build(info, block_m: int) -> tirx.PrimFunc:
    """TE of the padded GEMM: tokens are padded to a multiple of block_m (zero rows) so the
    micro-kernel needs no bounds checks; the epilogue reads only the real rows."""
    inputs = info.placeholders()
    x = inputs[info.param_index(info.x)]
    w = inputs[info.param_index(info.weight)]
    rows = x.shape[-2]
    padded = (rows + block_m - 1) // block_m * block_m
    xf = te.compute(
        [*x.shape[:-2], padded, x.shape[-1]],
        lambda *i: te.if_then_else(i[-2] < rows, x[i].astype("float32"), tirx.const(0.0, "float32")),
        name="x_f32",
    )
    if info.quantized:
        s = inputs[info.param_index(info.scale)]
        fmt = info.dequantize  # the quantization's constants (values per word, bits, mask, zero point)

        def decode(n, k):
            shift = ((k % fmt.elems_per_word) * fmt.bits).astype(fmt.storage_dtype)
            value = (w[n, k // fmt.elems_per_word] >> shift) & tirx.const(fmt.mask, fmt.storage_dtype)
            zero = tirx.const(float(fmt.zero_point), "float32")
            return (value.astype("float32") - zero) * s[n, k // fmt.group_size].astype("float32")

        wd = te.compute((info.n, info.k), decode, name="weight_f32")
    else:
        wd = te.compute((info.n, info.k), lambda n, k: w[n, k].astype("float32"), name="weight_f32")
    k = te.reduce_axis((0, info.k), "k")
    out_shape = list(xf.shape[:-1]) + [info.n]
    mm = te.compute(out_shape, lambda *i: te.sum(xf[(*i[:-1], k)] * wd[i[-1], k], axis=k), name="matmul")
    return rebuild(info, inputs, mm, padded=True)

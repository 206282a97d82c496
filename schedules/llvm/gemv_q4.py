"""CPU decode GEMV with MLC q4 weights: y[n] = sum_k x[k] * (q[n, k] - 7) * s[n, k // G].

The group scale is factored out (y[n] = sum_g s[n, g] (sum_{k in g} q[n, k] x[k] - 7 sum_{k in g}
x[k])) and the activation is pre-permuted once per call to match the nibbles' places in the packed
words: the inner loop is a mask, an int->float convert and an FMA per nibble plane, all in f32.
Handles: static N, K with K % (8 * lanes) == 0, lanes a multiple of G / 8, one activation row
(decode). Anything else: None. Knobs: lanes (packed words per vector step; None: the widest of 32
(16 without AMX), 16, 8 that fits), rows (rows per parallel task, interleaved; None: per CPU, and
4 on CPUs without AMX where a row's activation planes outgrow L1: `default_rows`).
"""

from __future__ import annotations

import dataclasses

from tvm import s_tir, te, tirx
from tvm.target import Target

from ..analysis import blocks_after, match_on_cpu
from ..base import CPUScheduleRule
from .microkernels import gemv_default_rows, rebuild


@dataclasses.dataclass
class DecodeGEMVQ4(CPUScheduleRule):
    lanes: int | None = None  # None: the widest of 32 (AMX CPUs) or 16 (others), 16, 8 that divides the row's words
    rows: int | None = None  # None: default_rows

    def knob_space(self, func: tirx.PrimFunc, target: Target) -> dict[str, list]:
        info = _applicable(func, target)
        if info is None:
            return {}
        words = info.k // 8
        lanes = [v for v in (8, 16, 32) if words % v == 0 and v % (info.group_size // 8) == 0]
        rows = [v for v in (1, 2, 4, 8) if info.n % v == 0]
        return {"lanes": lanes, "rows": rows}

    def apply(self, func: tirx.PrimFunc, target: Target, tunable: bool) -> s_tir.Schedule | None:
        del tunable
        info = _applicable(func, target)
        if info is None:
            return None
        words_per_group = info.group_size // 8
        rows = self.rows or default_rows(info, target)
        widest = (32, 16, 8) if gemv_default_rows(target) == 2 else (16, 8)
        lanes = self.lanes or next((v for v in widest if (info.k // 8) % v == 0 and v % words_per_group == 0), 0)
        if not lanes:
            return None
        if (info.k // 8) % lanes or lanes % words_per_group or info.n % rows:
            return None
        new = _build(info, lanes)
        sch = s_tir.Schedule(new)
        t, acc, red = sch.get_sblock("t"), sch.get_sblock("acc"), sch.get_sblock("row_sum")
        n, _w, c, g = sch.get_loops(acc)
        task, row = sch.split(n, [None, rows])
        sch.reorder(task, c, row, g, _w)
        sch.compute_at(t, row)
        sch.reverse_compute_at(red, task)
        for consumer in blocks_after(sch, red):
            sch.reverse_compute_at(consumer, task)
        sch.parallel(task)
        t_loops = sch.get_loops(t)  # task, c, row, l, j
        sch.reorder(t_loops[-1], t_loops[-2])
        sch.vectorize(sch.get_loops(t)[-1])
        sch.unroll(sch.get_loops(t)[-2])
        sch.decompose_reduction(t, sch.get_loops(t)[-2])
        a_loops = sch.get_loops(acc)  # task, c, row, g, w
        sch.vectorize(a_loops[-1])
        sch.unroll(a_loops[-2])
        sch.unroll(a_loops[-3])
        sch.decompose_reduction(acc, a_loops[1])
        return sch


SHARED_PLANES = 16 * 1024  # activation-plane bytes per row above which rows are interleaved (half a 32 KiB L1)


def default_rows(info, target: Target) -> int:
    """Unset `rows`: gemv_default_rows, except on CPUs without AMX (1 row) when the 9 f32 planes
    the kernel reads per row (36 bytes per packed word) exceed SHARED_PLANES: 4 interleaved rows
    share each plane load (1B down_proj, K = 8192: 36 KiB per row)."""
    rows = gemv_default_rows(target)
    if rows == 1 and 36 * (info.k // 8) > SHARED_PLANES and info.n % 4 == 0:
        return 4
    return rows


def _applicable(func, target):
    info = match_on_cpu(func, target, decode=True)
    return info if info is not None and info.bits == 4 else None


def _build(info, lanes: int) -> tirx.PrimFunc:
    inputs = info.placeholders()
    x = inputs[info.param_index(info.x)]
    w = inputs[info.param_index(info.weight)]
    s = inputs[info.param_index(info.scale)]
    n_rows, k = info.n, info.k
    chunks = k // (8 * lanes)
    wpg = info.group_size // 8  # packed words per scale group
    groups = lanes // wpg  # groups per chunk
    lead = [0] * (len(x.shape) - 1)

    def xf(idx):
        return x[(*lead, idx)].astype("float32")

    j = te.reduce_axis((0, 8), "j")
    xsum = te.compute((chunks, lanes), lambda c, l: te.sum(xf(8 * (lanes * c + l) + j), axis=j), name="xsum")
    def pow16(p):  # 16**-p as an exact float32 (exponent bits), for p in 0..7
        return tirx.reinterpret("float32", ((127 - 4 * te.min(p, 7)) << 23).astype("int32"))

    # plane p < 8 holds x * 16**-p: the kernel converts the masked word (q << 4p, exact in f32:
    # at most 4 significant bits) instead of shifting it down, one op fewer per plane, same products
    xp = te.compute(
        (chunks, 9, lanes),
        lambda c, p, l: te.if_then_else(
            p < 8, xf(8 * (lanes * c + l) + te.min(p, 7)) * pow16(p), tirx.const(-7.0, "float32") * xsum[c, l]
        ),
        name="xp",
    )
    p = te.reduce_axis((0, 9), "p")
    nibble = lambda n, c, l, p: te.if_then_else(  # noqa: E731
        p < 8,
        (w[n, lanes * c + l] & (tirx.const(15, "uint32") << (te.min(p, 7) * 4).astype("uint32"))).astype("float32"),
        tirx.const(1.0, "float32"),
    )
    t = te.compute((n_rows, chunks, lanes), lambda n, c, l: te.sum(nibble(n, c, l, p) * xp[c, p, l], axis=p), name="t")
    c = te.reduce_axis((0, chunks), "c")
    g = te.reduce_axis((0, groups), "g")
    acc = te.compute(
        (n_rows, wpg),
        lambda n, v: te.sum(s[n, groups * c + g].astype("float32") * t[n, c, wpg * g + v], axis=[c, g]),
        name="acc",
    )
    v = te.reduce_axis((0, wpg), "v")
    out_shape = list(x.shape[:-1]) + [n_rows]
    total = te.compute(out_shape, lambda *i: te.sum(acc[i[-1], v], axis=v), name="row_sum")
    return rebuild(info, inputs, total)

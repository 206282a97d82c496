"""The loop skeleton shared by the explicit-vector CPU GEMV rules (gemv_q4_vnni.py, gemv_float.py).

Those rules compute y[n] = sum over K of one weight row against one activation row with
arithmetic that is not a reordering of the original loop nest (integer dot products, converts of
whole vectors), so they write TIR directly: a `te.extern` stage whose body is built here from
the rule's per-chunk expression, between TE stages that prepare the activation and the
original kernel's epilogue (DequantMatmul.finish).

Skeleton: rows split into parallel tasks of `rows` consecutive rows; per task, one 16-lane f32
accumulator per row; per chunk (one vector step along K) each row adds `chunk(n, c)`; the rows of
a task are interleaved so their independent chains overlap and share the activation loads;
`prefetch` rows ahead, each weight stream is software-prefetched (the hardware prefetchers alone
left these kernels at ~60% of the streaming bandwidth here); finally a shuffle tree sums the lanes.

TVM 0.27 note: every vector value is written as one expression. A TVMScript binding of a vector
(`v = ...` inside the loop) becomes a workspace allocation per parallel task, which costs more
than the arithmetic.
"""

from __future__ import annotations

import abc
import dataclasses
from collections.abc import Callable

from tvm import s_tir, te, tirx
from tvm.s_tir import dlight as dl
from tvm.script import tirx as T
from tvm.target import Target

from .dequant_matmul import blocks_after

LANES = 16  # f32 accumulator lanes (one 512-bit register)


@dataclasses.dataclass
class RowGEMVRule(dl.ScheduleRule, abc.ABC):
    """Base of the explicit-vector GEMV rules: knobs rows and prefetch; subclasses give
    `applicable(func, target) -> DequantMatmul | None` and `build(info) -> PrimFunc`."""

    rows: int = 2  # rows per parallel task, interleaved
    prefetch: int = 8  # software-prefetch each weight stream this many rows ahead (0: off)

    @abc.abstractmethod
    def applicable(self, func: tirx.PrimFunc, target: Target):
        """The matched kernel (DequantMatmul) if this rule takes it, else None."""

    @abc.abstractmethod
    def build(self, info) -> tirx.PrimFunc | None:
        """The rebuilt kernel (extern_gemv), or None when the knobs do not fit."""

    def knob_space(self, func: tirx.PrimFunc, target: Target) -> dict[str, list]:
        info = self.applicable(func, target)
        if info is None:
            return {}
        # `prefetch` is not searched: `mlcpipe tune` times a kernel on inputs that stay in the
        # host's L3 between repeats, where prefetching cannot show what it does for weights
        # streaming from DRAM in the model (set it in a tuning DB by hand if needed)
        return {"rows": [v for v in (1, 2, 4) if info.n % v == 0]}

    def apply(self, func: tirx.PrimFunc, target: Target, tunable: bool) -> s_tir.Schedule | None:
        del tunable
        info = self.applicable(func, target)
        if info is None or info.n % self.rows:
            return None
        func = self.build(info)
        if func is None:
            return None
        sch = s_tir.Schedule(func)
        vectorize_epilogue(sch, info.n)
        return sch


def extern_gemv(info, inputs: list[te.Tensor], ins: list[te.Tensor], body: Callable) -> tirx.PrimFunc:
    """The rebuilt kernel: `body(*in_buffers, out_buffer)` writes the f32 matmul result
    [..., N]; the original epilogue follows."""
    x = inputs[info.param_index(info.x)]
    out_shape = list(x.shape[:-1]) + [info.n]
    mm = te.extern(
        out_shape,
        ins,
        lambda i, o: body(*i, o[0]),
        name="gemv",
        dtype="float32",
        in_buffers=[tirx.decl_buffer(t.shape, t.dtype, name=f"{t.op.name}_buf") for t in ins],
        out_buffers=[tirx.decl_buffer(out_shape, "float32", name="gemv_buf")],
    )
    return info.finish(inputs, mm)


def activation_f32_at(x: te.Tensor, t, i):
    """Token t's activation element i as f32 (x: [..., tokens, K], leading dims of extent 1)."""
    return x[(*([0] * (len(x.shape) - 2)), t, i)].astype("float32")


def lane_sum(v, lanes: int = LANES):
    while lanes > 1:
        lanes //= 2
        v = T.Shuffle([v], list(range(lanes))) + T.Shuffle([v], list(range(lanes, 2 * lanes)))
    return T.Shuffle([v], [0])


def token_row_loop(n_rows: int, rows: int, chunks: int, tokens, per_pass: int, store: Callable, chunk: Callable,
                   streams: Callable, prefetch: int) -> tirx.Stmt:
    """row_loop for a few tokens (`tokens`, may be symbolic): per task of `rows` rows, the tokens
    in passes of `per_pass` (unrolled, rows x per_pass accumulators); every chunk's weight words
    are loaded once per pass and serve all of its tokens (LLVM merges the identical loads and
    nibble unpacking of the unrolled tokens), so the weights stream from memory once and from L1
    for later passes. `chunk(n, c, t)`; `store(t, n, value)` writes token t's result of row n.
    A last, partial pass recomputes its last token for the missing ones and does not store them."""
    tasks = n_rows // rows
    last = n_rows - 1
    n_streams = len(streams(0, 0))
    if n_streams not in (1, 2):
        raise ValueError(f"token_row_loop prefetches one or two streams, got {n_streams}")

    def ahead(n, c, i):
        return T.call_llvm_intrin("void", "llvm.prefetch.p0", streams(T.min(n + prefetch, last), c)[i], 0, 3, 1)

    @T.prim_func(private=True, check_well_formed=False)
    def body():
        for task in T.parallel(tasks):
            for tp in range((tokens + per_pass - 1) // per_pass):
                acc = T.alloc_buffer((rows * per_pass * LANES,), "float32", scope="local")
                for a in T.unroll(rows * per_pass):
                    acc[T.ramp(a * LANES, 1, LANES)] = T.broadcast(T.float32(0), LANES)
                for c in range(chunks):
                    for r in T.unroll(rows):
                        if prefetch > 0:
                            if tp == 0:
                                T.evaluate(ahead(task * rows + r, c, 0))
                                if n_streams == 2:
                                    T.evaluate(ahead(task * rows + r, c, 1))
                        for t in T.unroll(per_pass):
                            a = r * per_pass + t
                            acc[T.ramp(a * LANES, 1, LANES)] = acc[T.ramp(a * LANES, 1, LANES)] + chunk(
                                task * rows + r, c, T.min(tp * per_pass + t, tokens - 1))
                for r in T.unroll(rows):
                    for t in T.unroll(per_pass):
                        if tp * per_pass + t < tokens:
                            store(tp * per_pass + t, task * rows + r, lane_sum(acc[T.ramp((r * per_pass + t) * LANES, 1, LANES)]))

    return body.body


def few_token_rows(info, tokens, low_batch: int, chunk: Callable, streams: Callable, out, rows: int = 2, per_pass: int = 4,
                   prefetch: int = 8) -> tirx.Stmt:
    """C rows (flat [tokens * N] `out`) of up to `low_batch` tokens by a decode GEMV's arithmetic
    (`chunk`, `streams` of one 16-lane step: q4 words or f16 weights): the GEMM rules decode every
    weight row whatever the token count (~4 GEMVs' cost); here the weights stream once for all
    tokens, in passes of exactly 1..per_pass tokens (a wider pass would compute the missing ones)."""

    def store(t, n, value):
        T.buffer_store(out, value.astype(out.dtype), [t * info.n + n])

    chunks = info.k // (8 * LANES) if info.quantized else info.k // LANES

    def loop(width):
        return token_row_loop(info.n, rows, chunks, tokens, width, store, chunk, streams, prefetch)

    stmt = loop(min(low_batch, per_pass))
    for exact in reversed(range(1, min(low_batch, per_pass))):
        stmt = tirx.IfThenElse(tokens == exact, loop(exact), stmt)
    return stmt


def row_loop(n_rows: int, rows: int, chunks: int, out, chunk: Callable, streams: Callable, prefetch: int) -> tirx.Stmt:
    """for each task of `rows` rows (parallel): acc[r] += chunk(n, c) for c < chunks; out[.., n] = sum(acc[r]).
    `streams(n, c)` lists the addresses (T.address_of) of row n's data for chunk c, prefetched
    `prefetch` rows ahead (0: no software prefetch). One token: token_row_loop with one pass."""
    lead = [0] * (len(out.shape) - 1)

    def store(t, n, value):
        T.buffer_store(out, value, [*lead, n])

    return token_row_loop(n_rows, rows, chunks, 1, 1, store, lambda n, c, t: chunk(n, c), streams, prefetch)


def vectorize_epilogue(sch, n: int) -> None:
    """The epilogue blocks after the extern (cast, residual add): one fused loop each, 16 lanes."""
    for block in blocks_after(sch, sch.get_sblock("gemv")):
        loop = sch.fuse(*sch.get_loops(block))
        if n % LANES == 0:
            sch.vectorize(sch.split(loop, [None, LANES])[1])

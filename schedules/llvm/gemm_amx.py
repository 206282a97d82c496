"""CPU prefill GEMM on AMX (bf16 tiles): C[m, n] = sum_k x[m, k] * W[n, k], many tokens m.

The f32 FMA micro-kernel (gemm_dequant.py) peaks near 160 GFLOP/s on two cores; one AMX
`tdpbf16ps` multiplies a 16x32 by a 32x16 bf16 tile into 16x16 f32 accumulators (8192 MACs).
Computed as C^T = W . X^T so the weight is the row-major "A" operand and only the activation
needs AMX's pair-interleaved "B" layout:

- per call (TE): the activation to bf16 in layout xb[k / 2, m, k % 2] (tokens padded to 32 with
  zeros), in the same K order as the decoded weight rows below;
- per parallel task of 32 weight rows: decode them to bf16 once (q4: for each 16 packed words
  and nibble plane j, ((w >> 4j) & 15) - 7 times the group scale, i.e. K permuted within each
  128-block as position 16 j + l <-> k = 8 l + j; unquantized: converted), a tile in L2 reused by
  every token block;
- per 32 tokens: 2 x 2 accumulator tiles (tmm0-3) over K in steps of 32: two weight tiles
  (tmm4-5) and two activation tiles (tmm6-7) loaded, four tdpbf16ps; stored into C^T [N, M],
  which the original epilogue reads transposed.
- K in chunks of `k_chunk` (default 2048), the outer loop, with all tasks of a chunk in one
  parallel loop: a thread then re-reads only its activation chunk (2048 x 128 tokens x 2 B =
  512 KiB, L2-resident) from task to task. With the whole K per task (down_proj: K = 8192, a
  2 MiB activation), every task streamed the activation from L3: 12.1 ms at 128 tokens, 6.0 ms
  chunked. Accumulator tiles are saved to and reloaded from a per-(task, token block) buffer
  between chunks. Decoded weight rows are padded by 64 bytes so a tile's 16 rows do not share
  one L1 set.
- while the first token block's tiles compute, the next task's weight rows are software-
  prefetched into L2 (prefetcht1), so that task's decode reads L2 instead of DRAM: the decode
  phase does not overlap the tile phase otherwise (q0f16 gate_up at 128 tokens, interleaved
  runs: 21.2 -> 19.3 ms median; q4 weights are a quarter of the bytes: within noise).
- the C^T block goes into C rows with strided 16-lane loads (was a scalar 32 x 32 loop).

AMX state needs the kernel's permission (Linux: arch_prctl ARCH_REQ_XCOMP_PERM for XTILEDATA);
the kernel asks for it itself at entry (one syscall per call), so any process can run it, and
raises a TVM error (instead of dying on SIGILL) where the OS refuses.

Numerics: bf16 operands (8-bit mantissa) with f32 accumulation, as PyTorch's bf16 CPU path; so
this rule takes only models whose activations are f16 (q4f16_1, q0f16): f32 models keep the
f32 GEMM.

Handles: llvm targets with amx-bf16 and avx512bf16 (weights rounded to bf16 by vcvtneps2bf16), many-token NT matmul with f16 activation, static N % 32 == 0,
K % 128 == 0 (q4, MLC group size dividing 128 words-wise) or K % 32 == 0 (unquantized).
Anything else: None. Knobs: k_chunk (the tile shape is fixed by AMX; 2 x 2 tiles per step).
"""

from __future__ import annotations

import dataclasses

from tvm import s_tir, te, tirx
from tvm.s_tir import dlight as dl
from tvm.script import tirx as T
from tvm.target import Target, codegen

from .dequant_matmul import blocks_after, match_on_cpu
from .row_gemv import LANES

TILE = 16  # AMX tile: 16 rows x 64 bytes (32 bf16 along K)
BLOCK = 2 * TILE  # weight rows per task and tokens per step (2 x 2 tiles)
ARCH_PRCTL, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA = 158, 0x1023, 18
CVT_BF16 = "llvm.x86.avx512bf16.cvtneps2bf16.512"
K_CHUNKS = (512, 1024, 2048, 4096, 8192)
ROW_PAD = 32  # bf16 elements after each decoded weight row: rows 64 bytes off a 4 KiB multiple, so
# the 16 rows of a tile load do not all fall into one L1 set


@dataclasses.dataclass
class PrefillGEMMAMX(dl.ScheduleRule):
    k_chunk: int = 2048

    def knob_space(self, func: tirx.PrimFunc, target: Target) -> dict[str, list]:
        info = _applicable(func, target)
        if info is None:
            return {}
        chunks = [c for c in K_CHUNKS if c < info.k and info.k % c == 0 and c % _k_step(info) == 0]
        return {"k_chunk": [*chunks, info.k]} if chunks else {}  # K in one piece only: nothing to tune

    def apply(self, func: tirx.PrimFunc, target: Target, tunable: bool) -> s_tir.Schedule | None:
        del tunable
        info = _applicable(func, target)
        if info is None:
            return None
        chunk = min(self.k_chunk, info.k)
        if info.k % chunk or chunk % _k_step(info):
            return None
        sch = s_tir.Schedule(_build(info, chunk))
        sch.parallel(sch.get_loops(sch.get_sblock("x_bf16"))[0])
        epilogue = blocks_after(sch, sch.get_sblock("gemm_amx"))
        if len(epilogue) > 1:  # read C straight from the kernel's buffer
            sch.compute_inline(epilogue[0])
            epilogue = epilogue[1:]
        for block in epilogue:
            loops = sch.get_loops(block)
            sch.parallel(sch.fuse(*loops[:-1]))
            sch.vectorize(sch.split(loops[-1], [None, LANES])[1])
        return sch


def _applicable(func, target):
    if not isinstance(func, tirx.PrimFunc) or target.kind.name != "llvm":
        return None
    if not (codegen.target_has_features("amx-bf16", target) and codegen.target_has_features("avx512bf16", target)):
        return None
    info = match_on_cpu(func, target, decode=False)
    if info is None or str(info.x.dtype) != "float16" or len(info.rows_shape) != 2 or info.n % BLOCK:
        return None
    if info.quantized:
        wpg = info.group_size // 8
        if info.k % 128 or info.group_size % 8 or LANES % wpg:
            return None
    elif info.k % BLOCK:
        return None
    return info


def _k_step(info) -> int:
    """K granularity of the weight decode: a 128-block of q4 (its K permutation), else a tile."""
    return 128 if info.quantized else BLOCK


def k_order(info):
    """Position P of the decoded weight row -> k (the same permutation is applied to x)."""
    if not info.quantized:
        return lambda p: p
    return lambda p: 8 * (LANES * (p // 128) + p % LANES) + (p % 128) // LANES


def _bf16_bits(value):
    """Round-to-nearest-even f32 -> bf16, as uint16 bits (finite inputs)."""
    u = tirx.reinterpret("uint32", value)
    rounded = (u + tirx.const(0x7FFF, "uint32") + ((u >> tirx.const(16, "uint32")) & tirx.const(1, "uint32"))) >> tirx.const(16, "uint32")
    return rounded.astype("uint16")


def _build(info, chunk: int) -> tirx.PrimFunc:
    inputs = info.placeholders()
    x = inputs[info.param_index(info.x)]
    w = inputs[info.param_index(info.weight)]
    tokens = x.shape[-2]
    padded = (tokens + BLOCK - 1) // BLOCK * BLOCK
    order = k_order(info)
    xb = te.compute(
        (info.k // 2, padded, 2),
        lambda kp, m, p: te.if_then_else(
            m < tokens, _bf16_bits(x[0, te.min(m, tokens - 1), order(2 * kp + p)].astype("float32")), tirx.const(0, "uint16")
        ),
        name="x_bf16",
    )
    ins = [xb, w] + ([inputs[info.param_index(info.scale)]] if info.quantized else [])
    # C as a flat [padded * N] buffer: a 2-D extern buffer with a symbolic row stride was read
    # back with the wrong stride by the following stage (TVM 0.27), a flat one is not
    c = te.extern(
        (padded * info.n,),
        ins,
        lambda i, o: _kernel(info, padded, chunk, i[0], i[1], i[2] if info.quantized else None, o[0]),
        name="gemm_amx",
        dtype="float32",
        in_buffers=[tirx.decl_buffer(t.shape, t.dtype, name=f"{t.op.name}_buf") for t in ins],
        out_buffers=[tirx.decl_buffer((padded * info.n,), "float32", name="c_buf")],
    )
    mm = te.compute((*x.shape[:-1], info.n), lambda b, m, n: c[m * info.n + n], name="matmul")
    return info.finish(inputs, mm)


def _kernel(info, padded, chunk, xb, weight, scale, out):
    k, n_total = info.k, info.n
    d_stride = chunk + ROW_PAD
    row_bytes = tirx.const(d_stride * 2, "int64")
    acc_stride = tirx.const(BLOCK * 4, "int64")
    xb_stride = (padded * 4).astype("int64")
    m_blocks = padded // BLOCK
    tasks = n_total // BLOCK
    chunks = k // chunk
    acc_size = BLOCK * BLOCK  # one 32 x 32 f32 block of C^T per (task, token block)

    def tile(op, *args):
        return T.call_llvm_intrin("void", f"llvm.x86.{op}", *args)

    def decode_q4(n, c, j):
        wpg = info.group_size // 8
        gpc = LANES // wpg
        words = weight[n, T.ramp(c * LANES, 1, LANES)]
        nib = T.Cast("float32x16", (words >> T.broadcast(T.uint32(4 * j), LANES)) & T.broadcast(T.uint32(15), LANES))
        if gpc > 1:
            scales = T.Shuffle([T.Cast(f"float32x{gpc}", scale[n, T.ramp(c * gpc, 1, gpc)])] * (LANES // gpc), [lane // wpg for lane in range(LANES)])
        else:
            scales = T.broadcast(T.Cast("float32", scale[n, c]), LANES)
        return (nib - T.broadcast(T.float32(7), LANES)) * scales

    # software prefetch of the next task's weight rows (the same chunk), spread over the first
    # token block's K steps: the decode of a task then reads L2, not DRAM (q0f16: 128 KiB a task)
    words_per_line = 64 // (4 if info.quantized else 2)  # packed q4 words / f16 values per 64 B
    row_elems = chunk // 8 if info.quantized else chunk
    lines_per_row = max(row_elems // words_per_line, 1)
    lines_per_kb = (BLOCK * lines_per_row + chunk // BLOCK - 1) // (chunk // BLOCK)

    def next_line(task, kc, j):
        row = T.min((task + 1) * BLOCK + j // lines_per_row, n_total - 1)
        return T.address_of(weight[row, kc * row_elems + (j % lines_per_row) * words_per_line])

    def bf16(v):  # 16 f32 -> 16 bf16 bits, round to nearest even: one vcvtneps2bf16
        return T.reinterpret("uint16x16", T.call_llvm_pure_intrin("bfloat16x16", CVT_BF16, v))

    quantized = info.quantized
    # accumulator tile t (W rows 16 (t // 2).., tokens 16 (t % 2)..) at this offset of a 32 x 32 block
    def at(task, mb, t):
        return (task * m_blocks + mb) * acc_size + (t // 2) * TILE * BLOCK + (t % 2) * TILE

    @T.prim_func(private=True, check_well_formed=False)
    def body():
        assert T.call_extern("int64", "syscall", T.int64(ARCH_PRCTL), T.int64(ARCH_REQ_XCOMP_PERM), T.int64(XFEATURE_XTILEDATA)) == T.int64(0), (
            "AMX tiles are not available to this process (arch_prctl ARCH_REQ_XCOMP_PERM failed): rebuild for this CPU/OS"
        )
        acc = T.alloc_buffer((tasks * m_blocks * acc_size,), "float32")
        # K in chunks, all tasks per chunk: a thread's activation chunk stays in its L2 across tasks
        for kc in range(chunks):
            for task in T.parallel(tasks):
                d = T.alloc_buffer((BLOCK * d_stride,), "uint16")  # flat: a 2-D one would be compacted to the columns written
                cfg = T.alloc_buffer((64,), "uint8", scope="local")
                for i in range(64):
                    cfg[i] = T.uint8(0)
                cfg[0] = T.uint8(1)
                for t in range(8):
                    cfg[16 + 2 * t] = T.uint8(64)
                    cfg[48 + t] = T.uint8(TILE)
                T.evaluate(tile("ldtilecfg", T.address_of(cfg[0])))
                for r in range(BLOCK):
                    if quantized:
                        for c in range(chunk // 128):
                            for j in T.unroll(8):
                                d[T.ramp(r * d_stride + c * 128 + j * LANES, 1, LANES)] = bf16(decode_q4(task * BLOCK + r, kc * (chunk // 128) + c, j))
                    else:
                        for c in range(chunk // LANES):
                            d[T.ramp(r * d_stride + c * LANES, 1, LANES)] = bf16(T.Cast("float32x16", weight[task * BLOCK + r, T.ramp(kc * chunk + c * LANES, 1, LANES)]))
                for mb in range(m_blocks):
                    if kc == 0:
                        T.evaluate(tile("tilezero", T.int8(0)))
                        T.evaluate(tile("tilezero", T.int8(1)))
                        T.evaluate(tile("tilezero", T.int8(2)))
                        T.evaluate(tile("tilezero", T.int8(3)))
                    else:
                        T.evaluate(tile("tileloadd64", T.int8(0), T.address_of(acc[at(task, mb, 0)]), acc_stride))
                        T.evaluate(tile("tileloadd64", T.int8(1), T.address_of(acc[at(task, mb, 1)]), acc_stride))
                        T.evaluate(tile("tileloadd64", T.int8(2), T.address_of(acc[at(task, mb, 2)]), acc_stride))
                        T.evaluate(tile("tileloadd64", T.int8(3), T.address_of(acc[at(task, mb, 3)]), acc_stride))
                    for kb in range(chunk // BLOCK):
                        if mb == 0:  # the next task's weight rows, into L2 while the tiles compute
                            for p in range(lines_per_kb):
                                T.evaluate(T.call_llvm_intrin("void", "llvm.prefetch.p0", next_line(task, kc, kb * lines_per_kb + p), 0, 2, 1))
                        kp = kc * (chunk // 2) + kb * TILE
                        T.evaluate(tile("tileloadd64", T.int8(4), T.address_of(d[kb * BLOCK]), row_bytes))
                        T.evaluate(tile("tileloadd64", T.int8(5), T.address_of(d[TILE * d_stride + kb * BLOCK]), row_bytes))
                        T.evaluate(tile("tileloadd64", T.int8(6), T.address_of(xb[kp, mb * BLOCK, 0]), xb_stride))
                        T.evaluate(tile("tileloadd64", T.int8(7), T.address_of(xb[kp, mb * BLOCK + TILE, 0]), xb_stride))
                        T.evaluate(tile("tdpbf16ps", T.int8(0), T.int8(4), T.int8(6)))
                        T.evaluate(tile("tdpbf16ps", T.int8(1), T.int8(4), T.int8(7)))
                        T.evaluate(tile("tdpbf16ps", T.int8(2), T.int8(5), T.int8(6)))
                        T.evaluate(tile("tdpbf16ps", T.int8(3), T.int8(5), T.int8(7)))
                    T.evaluate(tile("tilestored64", T.int8(0), T.address_of(acc[at(task, mb, 0)]), acc_stride))
                    T.evaluate(tile("tilestored64", T.int8(1), T.address_of(acc[at(task, mb, 1)]), acc_stride))
                    T.evaluate(tile("tilestored64", T.int8(2), T.address_of(acc[at(task, mb, 2)]), acc_stride))
                    T.evaluate(tile("tilestored64", T.int8(3), T.address_of(acc[at(task, mb, 3)]), acc_stride))
                    if kc == chunks - 1:  # the C^T block transposed into C rows
                        for m in range(BLOCK):
                            for h in range(2):
                                out[T.ramp((mb * BLOCK + m) * n_total + task * BLOCK + h * TILE, 1, TILE)] = acc[T.ramp((task * m_blocks + mb) * acc_size + h * TILE * BLOCK + m, BLOCK, TILE)]
                T.evaluate(tile("tilerelease"))

    return body.body

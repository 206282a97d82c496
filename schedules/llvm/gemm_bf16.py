"""CPU prefill GEMM of f16 models on bf16 dot products (`vdpbf16ps` / BFDOT), for CPUs without AMX.

Computed as C^T: the activation and each task's `block_n` weight rows (f16, or q4 as (q - 7) * s)
become nearest-even bf16 pairs; the micro-kernel holds block_n x `token_vecs` vectors of 16
tokens' f32 sums in registers, one dot product per row and pair. Up to `low_batch` tokens (x86,
f16 weights) a branch runs the f32 decode GEMV's FMAs. Handles: llvm with avx512bf16 or aarch64
bf16; many-token NT matmul, f16 activations, f16 or q4 weights, K % 32 == 0 (q4: % 128).
Knobs: block_n, token_vecs (None: the ISA's default), low_batch (0: off), prefetch (1: the next
task's weight rows into L2 during the first token block; 0: off).
"""

from __future__ import annotations

import dataclasses

from tvm import s_tir, te, tirx
from tvm.script import tirx as T
from tvm.target import Target, codegen

from ..analysis import match_on_cpu
from ..base import CPUScheduleRule
from .microkernels import (LANES, activation_f32, activation_f32_at, few_token_rows, float_chunk, prefetch_next_task, q4_chunk_values, q4_words_fit, rebuild,
                           schedule_extern_epilogue, store_transposed, tile_rows, tile_vector, zero_tile)

CVT_BF16 = "llvm.x86.avx512bf16.cvtneps2bf16.512"
CVT2_BF16 = "mlcpipe_cvtne2ps2bf16"  # (f32x16 lo, f32x16 hi) -> the 32 values as bf16, in order: 16 u32 pairs
DPBF16 = "mlcpipe_dpbf16ps"  # (f32x16 acc, i32x16 a, i32x16 b): acc[i] += a.bf16[2i] b.bf16[2i] + a.bf16[2i+1] b.bf16[2i+1]
X86_IR = r"""
declare <16 x float> @llvm.x86.avx512bf16.dpbf16ps.512(<16 x float>, <32 x bfloat>, <32 x bfloat>)
define linkonce_odr <16 x float> @mlcpipe_dpbf16ps(<16 x float> %acc, <16 x i32> %a, <16 x i32> %b) #0 {
  %ab = bitcast <16 x i32> %a to <32 x bfloat>
  %bb = bitcast <16 x i32> %b to <32 x bfloat>
  %r = call <16 x float> @llvm.x86.avx512bf16.dpbf16ps.512(<16 x float> %acc, <32 x bfloat> %ab, <32 x bfloat> %bb)
  ret <16 x float> %r
}
declare <32 x bfloat> @llvm.x86.avx512bf16.cvtne2ps2bf16.512(<16 x float>, <16 x float>)
define linkonce_odr <16 x i32> @mlcpipe_cvtne2ps2bf16(<16 x float> %lo, <16 x float> %hi) #0 {
  %r = call <32 x bfloat> @llvm.x86.avx512bf16.cvtne2ps2bf16.512(<16 x float> %hi, <16 x float> %lo)
  %ri = bitcast <32 x bfloat> %r to <16 x i32>
  ret <16 x i32> %ri
}
attributes #0 = { alwaysinline nounwind "target-features"="+avx512f,+avx512bf16" }
"""


def _arm_ir() -> str:
    """DPBF16 on aarch64: the 16 lanes as four 128-bit BFDOTs (4 f32 lanes, 2 bf16 products each)."""
    def quarter(v: str, ty: str, i: int) -> str:
        lanes = ", ".join(f"i32 {4 * i + j}" for j in range(4))
        return f"shufflevector <16 x {ty}> %{v}, <16 x {ty}> poison, <4 x i32> <{lanes}>"

    body = []
    for i in range(4):
        body += [f"%acc{i} = {quarter('acc', 'float', i)}", f"%a{i}i = {quarter('a', 'i32', i)}", f"%b{i}i = {quarter('b', 'i32', i)}",
                 f"%a{i} = bitcast <4 x i32> %a{i}i to <8 x bfloat>", f"%b{i} = bitcast <4 x i32> %b{i}i to <8 x bfloat>",
                 f"%r{i} = call <4 x float> @llvm.aarch64.neon.bfdot.v4f32.v8bf16(<4 x float> %acc{i}, <8 x bfloat> %a{i}, <8 x bfloat> %b{i})"]
    eight = ", ".join(f"i32 {i}" for i in range(8))
    body += [f"%lo = shufflevector <4 x float> %r0, <4 x float> %r1, <8 x i32> <{eight}>",
             f"%hi = shufflevector <4 x float> %r2, <4 x float> %r3, <8 x i32> <{eight}>",
             "%r = shufflevector <8 x float> %lo, <8 x float> %hi, <16 x i32> <" + ", ".join(f"i32 {i}" for i in range(16)) + ">",
             "ret <16 x float> %r"]
    return ("declare <4 x float> @llvm.aarch64.neon.bfdot.v4f32.v8bf16(<4 x float>, <8 x bfloat>, <8 x bfloat>)\n"
            "define linkonce_odr <16 x float> @mlcpipe_dpbf16ps(<16 x float> %acc, <16 x i32> %a, <16 x i32> %b) #0 {\n"
            + "".join(f"  {line}\n" for line in body) + "}\n"
            'attributes #0 = { alwaysinline nounwind "target-features"="+neon,+bf16" }\n')


ARM_IR = _arm_ir()
# accumulators (16 f32 lanes each) that fit the vector registers with the pair's operands
MAX_ACCUMULATORS = {"x86": 24, "arm": 4}  # arm: 4 NEON registers per 16 lanes
DEFAULT_TILE = {"x86": (8, 2), "arm": (4, 1)}  # (block_n, token_vecs)


def _isa(target: Target) -> str | None:
    """'x86' (AVX512-BF16), 'arm' (aarch64 BF16: BFDOT) or None."""
    if codegen.target_has_features("avx512bf16", target):
        return "x86"
    triple = str(target.attrs.get("mtriple", "") or "")
    if triple.startswith("aarch64") and codegen.target_has_features("bf16", target):
        return "arm"
    return None


@dataclasses.dataclass
class PrefillGEMMBF16(CPUScheduleRule):
    block_n: int | None = None  # weight rows per task and micro-kernel (None: the ISA's default, DEFAULT_TILE)
    token_vecs: int | None = None  # 16-token vectors per micro-kernel (None: the ISA's default)
    low_batch: int = 4  # x86, f16 weights, up to this many tokens: the f32 decode GEMV's FMAs (0: off)
    prefetch: int = 1  # 1: prefetch the next task's weight rows while the first token block computes (0: off)

    def knob_space(self, func: tirx.PrimFunc, target: Target) -> dict[str, list]:
        info = _applicable(func, target)
        if info is None:
            return {}
        if _isa(target) == "arm":
            return {"block_n": [v for v in (1, 2, 4) if info.n % v == 0], "token_vecs": [1, 2], "prefetch": [1, 0]}
        return {"block_n": [v for v in (4, 6, 8) if info.n % v == 0], "token_vecs": [2, 3, 4], "prefetch": [1, 0]}

    def apply(self, func: tirx.PrimFunc, target: Target, tunable: bool) -> s_tir.Schedule | None:
        del tunable
        info = _applicable(func, target)
        if info is None:
            return None
        isa = _isa(target)
        block_n, token_vecs = (v if v is not None else d for v, d in zip((self.block_n, self.token_vecs), DEFAULT_TILE[isa]))
        if block_n < 1 or token_vecs < 1 or info.n % block_n or block_n * token_vecs > MAX_ACCUMULATORS[isa] or self.low_batch < 0 or self.prefetch not in (0, 1):
            return None
        sch = s_tir.Schedule(_build(info, block_n, token_vecs, isa, self.low_batch if isa == "x86" and not info.quantized else 0, self.prefetch))
        sch.parallel(sch.get_loops(sch.get_sblock("x_bf16"))[0])
        return schedule_extern_epilogue(sch, "gemm_bf16", LANES)


def _applicable(func, target):
    if not isinstance(func, tirx.PrimFunc) or target.kind.name != "llvm":
        return None
    if _isa(target) is None:
        return None
    info = match_on_cpu(func, target, decode=False)
    if info is None or str(info.x.dtype) != "float16" or len(info.rows_shape) != 2 or info.k % 32:
        return None
    if info.quantized and not q4_words_fit(info):
        return None
    if not info.quantized and str(info.weight.dtype) != "float16":
        return None
    return info


def _pair_order(info):
    """Natural k of the first element of packed pair p (the second is k + 1). q4: within each
    128-block, pair 16 j + l holds nibbles 2j, 2j+1 of word l (k = 8 l + 2 j), so a row's words
    decode into contiguous vectors; f16: k = 2 p."""
    if not info.quantized:
        return lambda p: 2 * p
    return lambda p: (p // 64) * 128 + (p % 16) * 8 + ((p % 64) // 16) * 2


def _build(info, block_n: int, token_vecs: int, isa: str, low_batch: int, prefetch: int) -> tirx.PrimFunc:
    inputs = info.placeholders()
    x = inputs[info.param_index(info.x)]
    tokens = x.shape[-2]
    per_block = LANES * token_vecs
    padded = (tokens + per_block - 1) // per_block * per_block
    order = _pair_order(info)

    def pair(b, p, v, lane):
        t = (b * token_vecs + v) * LANES + lane

        def bf(i):
            value = activation_f32_at(x, te.min(t, tokens - 1), i)
            return te.if_then_else(t < tokens, _bf16_scalar(value), tirx.const(0, "uint32"))
        return bf(order(p)) | (bf(order(p) + 1) << tirx.const(16, "uint32"))

    # [token block, pair, token vector, 16 tokens]: the micro-kernel's loads of one pair are adjacent
    xb = te.compute((padded // per_block, info.k // 2, token_vecs, LANES), pair, name="x_bf16")
    ins = [xb, inputs[info.param_index(info.weight)]]
    if info.quantized:
        ins.append(inputs[info.param_index(info.scale)])
    if low_batch:  # the few-token branch's f32 activation (one token's when it does not run)
        ins.append(activation_f32(x, info.k, tirx.Select(tokens <= low_batch, tokens, tirx.const(1, str(tokens.ty)))))

    def body(i, o):
        many = _kernel(info, padded, block_n, token_vecs, isa, prefetch, *i[:2 + info.quantized], o[0])
        if not low_batch:
            return many
        chunk, streams = float_chunk(i[2], i[1])
        return tirx.IfThenElse(tokens <= low_batch, few_token_rows(info, tokens, low_batch, chunk, streams, o[0]), many)

    c = te.extern(
        (padded * info.n,), ins, body, name="gemm_bf16",
        dtype="float32", in_buffers=[tirx.decl_buffer(t.shape, t.dtype, name=f"{t.op.name}_buf") for t in ins],
        out_buffers=[tirx.decl_buffer((padded * info.n,), "float32", name="c_buf")],
    )
    mm = te.compute((*x.shape[:-1], info.n), lambda b, m, n: c[m * info.n + n], name="matmul")
    return rebuild(info, inputs, mm)


def _bf16_scalar(value):
    bits = T.reinterpret("uint32", value)
    return (bits + tirx.const(0x7FFF, "uint32") + ((bits >> tirx.const(16, "uint32")) & tirx.const(1, "uint32"))) >> tirx.const(16, "uint32")


def _kernel(info, padded, block_n, token_vecs, isa, prefetch, xb, weight, *rest):
    """C^T blocks: per task `block_n` weight rows (converted to bf16 pairs, L1), per block of
    16 token_vecs tokens block_n x token_vecs accumulators of 16 tokens each."""
    scale, out = (rest[0], rest[1]) if info.quantized else (None, rest[0])
    n_total, k = info.n, info.k
    pairs = k // 2
    u = T.uint32

    def vb(v):
        return T.broadcast(u(v), LANES)

    def bf16(v):  # 16 f32 -> 16 bf16 bits (u16), round to nearest even (x86: one vcvtneps2bf16)
        if isa == "x86":
            return T.reinterpret("uint16x16", T.call_llvm_pure_intrin("bfloat16x16", CVT_BF16, v))
        bits = T.reinterpret("uint32x16", v)
        return T.Cast("uint16x16", (bits + vb(0x7FFF) + ((bits >> vb(16)) & vb(1))) >> vb(16))

    def pairs_of(lo, hi):  # 16 + 16 bf16 -> 16 u32 pairs (lo in the low half)
        return T.reinterpret("uint32x16", T.Shuffle([bf16(lo), bf16(hi)], [i // 2 + (i % 2) * LANES for i in range(2 * LANES)]))

    def convert(wb, wf, wh, sf, task, r, c):
        """Row r of the task, 16 pairs (f16) or 64 pairs (q4: 16 words) at chunk c."""
        n = task * block_n + r
        if not info.quantized and isa == "x86":  # 32 f16 in order -> 16 pairs: two converts, one vcvtne2ps2bf16
            lo, hi = (T.Cast("float32x16", wh[T.ramp(n * k + c * 2 * LANES + h * LANES, 1, LANES)]) for h in (0, 1))
            T.buffer_store(wb, T.call_extern("uint32x16", CVT2_BF16, lo, hi), [T.ramp(r * pitch + c * LANES, 1, LANES)])
            return
        if not info.quantized:
            word = wf[T.ramp(n * pairs + c * LANES, 1, LANES)]
            lo = T.Cast("float32x16", T.reinterpret("float16x16", T.Cast("uint16x16", word & vb(0xFFFF))))
            hi = T.Cast("float32x16", T.reinterpret("float16x16", T.Cast("uint16x16", word >> vb(16))))
            T.buffer_store(wb, pairs_of(lo, hi), [T.ramp(r * pitch + c * LANES, 1, LANES)])
            return
        values = q4_chunk_values(info, wf, sf, n, c)
        for j in range(4):
            T.buffer_store(wb, pairs_of(values[2 * j], values[2 * j + 1]), [T.ramp(r * pitch + c * 64 + j * LANES, 1, LANES)])

    def pair_step(accs, wb, xf, mb, p):
        xv = [T.reinterpret("int32x16", xf[T.ramp(((mb * pairs + p) * token_vecs + v) * LANES, 1, LANES)]) for v in range(token_vecs)]
        for r in range(block_n):
            wv = T.reinterpret("int32x16", T.broadcast(wb[r * pitch + p], LANES))
            for v in range(token_vecs):
                acc, lanes = tile_vector(accs, block_n, token_vecs, r, v)
                T.buffer_store(acc, T.call_extern("float32x16", DPBF16, acc[lanes], wv, xv[v]), [lanes])

    chunk = LANES if not info.quantized else 64  # pairs converted per step
    pitch = pairs + LANES  # row pitch of the converted rows: not a multiple of 4 KiB (L1 sets)

    @T.prim_func(private=True, check_well_formed=False)
    def body():
        xf = T.decl_buffer((padded * pairs,), "uint32", data=xb.data)
        wf = T.decl_buffer((n_total * (k // 8 if info.quantized else pairs),), "uint32", data=weight.data)
        wh = T.decl_buffer((n_total * (k // 4 if info.quantized else k),), "float16", data=weight.data)  # f16 view (read for f16 rows)
        sf = T.decl_buffer((n_total * (k // max(info.group_size, 1)),), str(scale.dtype) if info.quantized else "float16",
                           data=scale.data if info.quantized else weight.data)
        for task in T.parallel(n_total // block_n):
            wb = T.alloc_buffer((block_n * pitch,), "uint32")
            with T.attr(T.int32(0), "pragma_import_llvm", X86_IR if isa == "x86" else ARM_IR):
                for r in range(block_n):
                    for c in range(pairs // chunk):
                        convert(wb, wf, wh, sf, task, r, c)
                for mb in range(padded // (LANES * token_vecs)):
                    acc0 = T.alloc_buffer((tile_rows(block_n) * token_vecs * LANES,), "float32")  # stack arrays (tile_rows)
                    acc1 = T.alloc_buffer((tile_rows(block_n) * token_vecs * LANES,), "float32")
                    zero_tile((acc0, acc1), block_n, token_vecs)
                    for p in range(pairs):
                        if prefetch > 0:
                            if mb == 0:  # LLVM unswitches this: the other blocks' loop has no prefetch
                                if info.quantized:
                                    prefetch_next_task(wf, (task + 1) * block_n * (k // 8), block_n * (k // 8), p, pairs, 4)
                                else:
                                    prefetch_next_task(wh, (task + 1) * block_n * k, block_n * k, p, pairs, 2)
                        pair_step((acc0, acc1), wb, xf, mb, p)
                    store_transposed(out, (acc0, acc1), n_total, task * block_n, block_n, token_vecs, mb)

    return body.body

"""TIR pieces of the sampler kernels, written once for their reference form (sampler.py) and their
GPU form (schedules/gpu/sampler.py): the sort's order, a bitonic pair's positions and its
compare-exchange, the lowest float32, and how a sampler kernel is recognised (SAMPLER_ATTR)."""

from __future__ import annotations

from tvm import tirx
from tvm.script import tirx as T

from .sampler_spec import SAMPLER_ATTR


def sampler_info(func) -> dict | None:
    """A sampler kernel's record (kind and sizes, as sampler.py sets SAMPLER_ATTR), else None."""
    if not isinstance(func, tirx.PrimFunc) or func.attrs is None or SAMPLER_ATTR not in func.attrs:
        return None
    return {str(k): (str(v) if str(k) == "kind" else int(v)) for k, v in func.attrs[SAMPLER_ATTR].items()}


def lowest_f32(exact_literal: bool = True):
    """The lowest float32, bit-exact as the reference kernel writes it on llvm. Printers that
    write the constant exactly (LLVM, CUDA's hex float) take the literal; the WGSL and MSL
    printers write 7 digits (-3.402823e+38), so there it is the bit pattern (0xff7fffff)."""
    if exact_literal:
        return T.min_value("float32")
    return tirx.reinterpret("float32", tirx.IntImm("int32", -8388609))


def better(key_a, idx_a, key_b, idx_b):
    """(key_a, idx_a) comes first in the sorted row: larger key, or equal key and smaller index."""
    return tirx.Or(key_a > key_b, tirx.And(key_a == key_b, idx_a < idx_b))


def out_of_order(desc, key_lo, idx_lo, key_hi, idx_hi):
    """The pair (lo, hi) is out of order: hi comes first where the run is descending (desc), lo
    first elsewhere. (Written as a select: LLVM codegen of bool == bool emits an fcmp.)"""
    if isinstance(desc, tirx.IntImm):  # a run known to be descending (or ascending): no select
        return better(key_hi, idx_hi, key_lo, idx_lo) if desc.value else better(key_lo, idx_lo, key_hi, idx_hi)
    return tirx.Select(desc, better(key_hi, idx_hi, key_lo, idx_lo), better(key_lo, idx_lo, key_hi, idx_hi))


def pair_lo(p, log_j):
    """The lower position of pair `p` of a bitonic step at distance 2^log_j."""
    return T.shift_left(T.shift_right(p, log_j), log_j + 1) + T.bitwise_and(p, T.shift_left(1, log_j) - 1)


@T.macro
def exchange_rows(keys, idx, row, lo, hi, desc):
    """Compare-exchange of (lo, hi) in row `row` of the (key, index) buffers."""
    key_lo: T.let[T.float32] = keys[row, lo]
    key_hi: T.let[T.float32] = keys[row, hi]
    idx_lo: T.let[T.int32] = idx[row, lo]
    idx_hi: T.let[T.int32] = idx[row, hi]
    if out_of_order(desc, key_lo, idx_lo, key_hi, idx_hi):
        keys[row, lo] = key_hi
        keys[row, hi] = key_lo
        idx[row, lo] = idx_hi
        idx[row, hi] = idx_lo


@T.macro
def exchange_tile(keys, idx, lo, hi, desc):
    """Compare-exchange of (lo, hi) in a tile's (key, index) buffers (workgroup memory)."""
    key_lo: T.let[T.float32] = keys[lo]
    key_hi: T.let[T.float32] = keys[hi]
    idx_lo: T.let[T.int32] = idx[lo]
    idx_hi: T.let[T.int32] = idx[hi]
    if out_of_order(desc, key_lo, idx_lo, key_hi, idx_hi):
        keys[lo] = key_hi
        keys[hi] = key_lo
        idx[lo] = idx_hi
        idx[hi] = idx_lo

"""A vectorizable exp for llvm targets (softmax in attention, sigmoid in swiglu).

Registers (above TVM's own priority) a lowering of `exp` to arithmetic that vectorizes instead of
one libm `expf` call per lane: within 2 ulp of expf on [-87.3, 88.72283], 0 below, +inf above,
NaN for NaN; f16 / bf16 computed in f32. `install()` is idempotent and process-wide; importing
this module (or `schedules`) installs nothing: the build (pipeline/backends/llvm.py,
`install_lowerings`) and `mlcpipe tune` call it. No knobs. The algorithm: docs/schedules.md.
"""

from __future__ import annotations

import contextlib

from tvm import tirx

LEVEL = 120  # above TVM's own llvm registration
LOG2E = 1.44269504088896341
LN2_HI = 0.693359375
LN2_LO = -2.12194440e-4
POLY = (1.9875691500e-4, 1.3981999507e-3, 8.3334519073e-3, 4.1665795894e-2, 1.6666665459e-1, 5.0000001201e-1)
_installed = False
_suspended = 0


def exp_f32(x, lanes: int = 1):
    """e^x for a float32 TIR expression (`lanes` > 1: a float32xlanes vector), vectorizable."""
    suffix = f"x{lanes}" if lanes > 1 else ""
    f32, i32 = f"float32{suffix}", f"int32{suffix}"

    def c(value):
        value = tirx.const(value, "float32")
        return tirx.Broadcast(value, lanes) if lanes > 1 else value

    hi_limit, lo_limit = c(88.72283), c(-87.3)  # log(FLT_MAX); below -87.3 the result is denormal: 0
    clamped = tirx.max(tirx.min(x, hi_limit), lo_limit)
    n = tirx.floor(clamped * c(LOG2E) + c(0.5))
    r = clamped - n * c(LN2_HI) - n * c(LN2_LO)
    p = c(POLY[0])
    for coef in POLY[1:]:
        p = p * r + c(coef)
    p = p * r * r + r + c(1.0)
    def ci(value):
        value = tirx.const(value, "int32")
        return tirx.Broadcast(value, lanes) if lanes > 1 else value

    # 2^n from the exponent bits; n reaches 128 just below the overflow threshold, where 2^n
    # itself is not a float: build 2^(n-1) and double it for n > 0
    ni = n.astype(i32)
    positive = ni > ci(0)
    exponent = tirx.Select(positive, ni - ci(1), ni)
    scale = tirx.reinterpret(f32, (exponent + ci(127)) << ci(23))
    value = p * scale * tirx.Select(positive, c(2.0), c(1.0))
    value = tirx.Select(x > hi_limit, c(float("inf")), value)
    value = tirx.Select(x < lo_limit, c(0.0), value)
    return tirx.Select(tirx.isnan(x), x, value)


def _split_dtype(dtype: str) -> tuple[str, int]:
    base, _, lanes = dtype.partition("x")
    return base, int(lanes) if lanes else 1


def _lower_exp(op):
    x = op.args[0]
    dtype = str(op.ty.dtype) if hasattr(op, "ty") else str(op.dtype)
    if _suspended:  # TVM's own llvm lowering (intrin_rule_llvm.cc)
        return tirx.call_llvm_pure_intrin(dtype, "llvm.exp", x)
    base, lanes = _split_dtype(dtype)
    if base == "float32":
        return exp_f32(x, lanes)
    if base in ("float16", "bfloat16"):
        suffix = f"x{lanes}" if lanes > 1 else ""
        return exp_f32(x.astype(f"float32{suffix}"), lanes).astype(dtype)
    return None  # float64 and others: TVM's own lowering


@contextlib.contextmanager
def suspended():
    """Inside: `exp` lowers as TVM's own llvm rule has it (`mlcpipe check`'s reference kernels)."""
    global _suspended
    _suspended += 1
    try:
        yield
    finally:
        _suspended -= 1


def install() -> None:
    global _installed
    if not _installed:
        tirx.register_intrin_lowering("tirx.exp", target="llvm", f=_lower_exp, level=LEVEL)
        _installed = True

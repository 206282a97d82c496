/*
 * mlcpipe: IEEE-754 binary float width conversions (half <-> float <-> double) as templates,
 * round-to-nearest-even, for building TVM's web runtime from the wheel's sources.
 * Written for mlcpipe (the apache-tvm wheel does not ship this header).
 *
 *   __extendXfYf2__<SrcT, SrcRep, SrcSigBits, DstT, DstRep, DstSigBits>(a)   narrow -> wide
 *   __truncXfYf2__<SrcT, SrcRep, SrcSigBits, DstT, DstRep, DstSigBits>(a)    wide -> narrow
 * SrcT/DstT are the value types (an integer type when the value is carried as raw bits, e.g.
 * uint16_t for half); SrcRep/DstRep the unsigned integers of the same width.
 */
#ifndef MLCPIPE_BUILTIN_FP16_H_
#define MLCPIPE_BUILTIN_FP16_H_

#include <cstdint>
#include <cstring>

namespace mlcpipe_fp {
template <typename Rep, int SigBits>
struct Layout {
  static constexpr int kBits = static_cast<int>(sizeof(Rep) * 8);
  static constexpr int kExpBits = kBits - SigBits - 1;
  static constexpr int kExpMax = (1 << kExpBits) - 1;  // all-ones exponent: inf / nan
  static constexpr int kBias = kExpMax >> 1;
  static constexpr Rep kSigMask = (static_cast<Rep>(1) << SigBits) - 1;
};

template <typename To, typename From>
inline To BitCast(const From& from) {
  static_assert(sizeof(To) == sizeof(From), "size mismatch");
  To to;
  std::memcpy(&to, &from, sizeof(To));
  return to;
}

// Shift right by `shift` bits, rounding to nearest, ties to even.
template <typename Rep>
inline Rep ShiftRound(Rep value, int shift) {
  if (shift <= 0) return value;
  if (shift >= static_cast<int>(sizeof(Rep) * 8)) return 0;
  Rep quotient = value >> shift;
  Rep remainder = value & ((static_cast<Rep>(1) << shift) - 1);
  Rep half = static_cast<Rep>(1) << (shift - 1);
  if (remainder > half || (remainder == half && (quotient & 1))) ++quotient;
  return quotient;
}
}  // namespace mlcpipe_fp

template <typename SRC_T, typename SRC_REP_T, int SRC_SIG_BITS, typename DST_T, typename DST_REP_T,
          int DST_SIG_BITS>
static inline DST_T __extendXfYf2__(SRC_T a) {
  using S = mlcpipe_fp::Layout<SRC_REP_T, SRC_SIG_BITS>;
  using D = mlcpipe_fp::Layout<DST_REP_T, DST_SIG_BITS>;
  static_assert(DST_SIG_BITS >= SRC_SIG_BITS && D::kExpBits >= S::kExpBits, "not a widening");
  const SRC_REP_T bits = mlcpipe_fp::BitCast<SRC_REP_T>(a);
  const DST_REP_T sign = static_cast<DST_REP_T>(bits >> (S::kBits - 1)) << (D::kBits - 1);
  const int exp = static_cast<int>((bits >> SRC_SIG_BITS) & static_cast<SRC_REP_T>(S::kExpMax));
  DST_REP_T sig = static_cast<DST_REP_T>(bits & S::kSigMask);
  DST_REP_T out;
  if (exp == S::kExpMax) {  // inf or nan (payload kept)
    out = (static_cast<DST_REP_T>(D::kExpMax) << DST_SIG_BITS) | (sig << (DST_SIG_BITS - SRC_SIG_BITS));
  } else if (exp == 0) {
    if (sig == 0) {
      out = 0;
    } else {  // subnormal source: normalise
      int e = 1 - S::kBias;
      while (!(sig & (static_cast<DST_REP_T>(1) << SRC_SIG_BITS))) {
        sig <<= 1;
        --e;
      }
      sig &= static_cast<DST_REP_T>(S::kSigMask);
      out = (static_cast<DST_REP_T>(e + D::kBias) << DST_SIG_BITS) | (sig << (DST_SIG_BITS - SRC_SIG_BITS));
    }
  } else {
    out = (static_cast<DST_REP_T>(exp - S::kBias + D::kBias) << DST_SIG_BITS) |
          (sig << (DST_SIG_BITS - SRC_SIG_BITS));
  }
  return mlcpipe_fp::BitCast<DST_T>(static_cast<DST_REP_T>(out | sign));
}

template <typename SRC_T, typename SRC_REP_T, int SRC_SIG_BITS, typename DST_T, typename DST_REP_T,
          int DST_SIG_BITS>
static inline DST_T __truncXfYf2__(SRC_T a) {
  using S = mlcpipe_fp::Layout<SRC_REP_T, SRC_SIG_BITS>;
  using D = mlcpipe_fp::Layout<DST_REP_T, DST_SIG_BITS>;
  static_assert(DST_SIG_BITS <= SRC_SIG_BITS && D::kExpBits <= S::kExpBits, "not a narrowing");
  const SRC_REP_T bits = mlcpipe_fp::BitCast<SRC_REP_T>(a);
  const DST_REP_T sign = static_cast<DST_REP_T>(bits >> (S::kBits - 1)) << (D::kBits - 1);
  const int exp = static_cast<int>((bits >> SRC_SIG_BITS) & static_cast<SRC_REP_T>(S::kExpMax));
  const SRC_REP_T sig = bits & S::kSigMask;
  const DST_REP_T inf = static_cast<DST_REP_T>(D::kExpMax) << DST_SIG_BITS;
  DST_REP_T out;
  if (exp == S::kExpMax) {  // inf, or a quiet nan keeping the top payload bits
    out = inf;
    if (sig != 0) {
      out |= (static_cast<DST_REP_T>(1) << (DST_SIG_BITS - 1)) |
             static_cast<DST_REP_T>(sig >> (SRC_SIG_BITS - DST_SIG_BITS));
    }
  } else if (exp == 0) {  // zero or source subnormal: far below the narrow type's range
    out = 0;
  } else {
    const int e = exp - S::kBias + D::kBias;  // biased exponent in the narrow type
    if (e >= D::kExpMax) {
      out = inf;
    } else if (e > 0) {  // normal; a rounding carry moves into the exponent (up to inf)
      const SRC_REP_T rounded = mlcpipe_fp::ShiftRound<SRC_REP_T>(sig, SRC_SIG_BITS - DST_SIG_BITS);
      out = (static_cast<DST_REP_T>(e) << DST_SIG_BITS) + static_cast<DST_REP_T>(rounded);
    } else {  // subnormal in the narrow type (rounding may give the smallest normal)
      const SRC_REP_T full = sig | (static_cast<SRC_REP_T>(1) << SRC_SIG_BITS);
      out = static_cast<DST_REP_T>(mlcpipe_fp::ShiftRound<SRC_REP_T>(full, SRC_SIG_BITS - DST_SIG_BITS + 1 - e));
    }
  }
  return mlcpipe_fp::BitCast<DST_T>(static_cast<DST_REP_T>(out | sign));
}

#endif  // MLCPIPE_BUILTIN_FP16_H_

// Internal: the exact reduction kernels behind strait::ReduceInPlace and DivideInPlace, written
// once as templates and compiled three times (reduce.cc for the baseline, reduce_avx2.cc and
// reduce_avx512.cc with those instruction sets) so that the compiler vectorises the same source
// for each. The kernels use only IEEE operations in a fixed order and select-based NaN/zero
// handling, and FMA contraction is off project-wide, so every table gives the same bits; the
// tests hold them to that.
//
// Semantics beyond strait/reduce.h, identical in every table:
// - max/min are IEEE 754-2019 maximum/minimum: NaN if either operand is NaN, and
//   max(-0, +0) = +0, min(-0, +0) = -0 in either order. The NaN returned is inout's if inout is
//   NaN, else in's, bits unchanged (float32/float64; narrow types re-round it like any value).
// - sum/prod of float32/float64: a NaN result is inout's NaN quieted if inout is NaN, else in's
//   quieted, else the hardware's default NaN (inf - inf, 0 * inf).
//
// Kernels read `count` elements from `in` and read/write `count` elements of `inout`; pointers
// may be unaligned, and `in` may equal `inout` (partial overlap is not allowed). They never
// allocate, never block and are thread-safe.
//
// A translation unit that instantiates the kernels defines STRAIT_REDUCE_NS to a name of its own
// before including this header (see reduce.cc): every template below then lives in a namespace
// private to that unit, so the linker can never merge an AVX-512 instantiation into the scalar
// path (an ODR violation that would crash on older CPUs).
#ifndef STRAIT_LIB_CODEC_REDUCE_IMPL_H_
#define STRAIT_LIB_CODEC_REDUCE_IMPL_H_

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>

#if defined(__F16C__)
#include <immintrin.h>
#endif

#include "codec/kernels.h"
#include "codec/numeric.h"
#include "strait/types.h"

namespace strait::codec_internal {

// inout[i] = op(inout[i], in[i]).
using ReduceFn = void (*)(const void* in, void* inout, size_t count);
// data[i] /= divisor (divisor != 0).
using DivideFn = void (*)(void* data, size_t count, uint64_t divisor);

// kSum, kProd, kMax, kMin: the ops with a kernel (kAvg is a sum followed by a divide).
inline constexpr int kNumExactReduceOps = 4;

struct ReduceTable {
  ReduceFn reduce[kNumDataTypes][kNumExactReduceOps];
  DivideFn divide[kNumDataTypes];
};

const ReduceTable& ScalarReduceTable() noexcept;
#if defined(STRAIT_CODEC_X86) && STRAIT_CODEC_X86
const ReduceTable& Avx2ReduceTable() noexcept;    // call only where the CPU has AVX2 + F16C
const ReduceTable& Avx512ReduceTable() noexcept;  // call only where the CPU has AVX-512 F/BW/VL/DQ
#endif
// The table for `isa`, or nullptr when this build or this CPU lacks it (scalar always exists).
const ReduceTable* ReduceTableFor(Isa isa) noexcept;
// The table ReduceInPlace uses: ActiveIsa()'s, chosen once.
const ReduceTable& ActiveReduceTable() noexcept;

}  // namespace strait::codec_internal

#if defined(STRAIT_REDUCE_NS)

namespace strait::codec_internal::STRAIT_REDUCE_NS {

// ---- Operations -----------------------------------------------------------------------------

enum class Op : int { kSum = 0, kProd = 1, kMax = 2, kMin = 3 };

template <typename T>
inline T LoadAt(const unsigned char* p, size_t i) {
  T v;
  std::memcpy(&v, p + i * sizeof(T), sizeof(T));
  return v;
}

template <typename T>
inline void StoreAt(unsigned char* p, size_t i, T v) {
  std::memcpy(p + i * sizeof(T), &v, sizeof(T));
}

template <typename F>
using FloatBitsT = std::conditional_t<sizeof(F) == 4, uint32_t, uint64_t>;

template <typename F>
inline FloatBitsT<F> BitsOf(F f) {
  FloatBitsT<F> u;
  std::memcpy(&u, &f, sizeof(u));
  return u;
}

template <typename F>
inline F FromBits(FloatBitsT<F> u) {
  F f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
}

// IEEE 754-2019 maximum/minimum: NaN if either operand is NaN (the inout operand `a`'s NaN when
// both are), and max(-0, +0) = +0, min(-0, +0) = -0 whichever operand is which. Equal operands
// differ at most in the sign of zero, so AND (max) / OR (min) of the bits picks the right zero.
// Every branch is a select so that the vectoriser can use blends; no result depends on it.
template <typename F, bool kIsMax>
inline F FloatMaxMin(F a, F b) {
  const F pick = kIsMax ? (a > b ? a : b) : (a < b ? a : b);
  const F tie = FromBits<F>(kIsMax ? (BitsOf(a) & BitsOf(b)) : (BitsOf(a) | BitsOf(b)));
  F r = a == b ? tie : pick;
  r = b != b ? b : r;
  r = a != a ? a : r;
  return r;
}

// c ? a : b as mask arithmetic. Written as ?: GCC turns it into a branch, sinks the floating-point
// operation that computes `a` into it, and then will not if-convert a block that "could trap",
// which leaves the loop scalar.
template <typename U>
inline U Select(bool c, U a, U b) {
  const U m = U{0} - static_cast<U>(c);
  return (a & m) | (b & ~m);
}

// a + b or a * b with a NaN chosen deterministically: x86 returns the first operand's NaN when
// both are NaN, but the compiler may swap the operands of a commutative operation differently in
// each build. So: a's NaN (quieted) if a is NaN, else b's (quieted), else the hardware's result.
template <Op kOp, typename F>
inline F FloatArith(F a, F b) {
  using U = FloatBitsT<F>;
  constexpr U kQuiet = U{1} << (sizeof(F) == 4 ? 22 : 51);
  const F r = kOp == Op::kSum ? a + b : a * b;
  return FromBits<F>(
      Select<U>(a != a, BitsOf(a) | kQuiet, Select<U>(b != b, BitsOf(b) | kQuiet, BitsOf(r))));
}

template <Op kOp, typename F>
inline F FloatApply(F a, F b) {
  if constexpr (kOp == Op::kSum || kOp == Op::kProd) {
    return FloatArith<kOp>(a, b);
  } else {
    return FloatMaxMin<F, kOp == Op::kMax>(a, b);
  }
}

// ---- Narrow-float conversions in select form ----------------------------------------------------
//
// Bit-for-bit the same functions as numeric.h's HalfToFloat, FloatToHalf, E4m3ToFloat,
// FloatToE4m3 and FloatToE5m2 (round to nearest even), rewritten so that every case is computed
// and the answer picked with selects: GCC does not if-convert numeric.h's early returns, and
// without that the fp16 and fp8 loops stay scalar. The tests compare them with numeric.h.
// bfloat16 needs no rewrite: numeric.h's functions already vectorise.

inline float HalfToFloatSel(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  const uint32_t mant = h & 0x3ffu;
  // Subnormal: mant * 2^-24 is exact. Converting through int32 lets AVX2 use cvtdq2ps.
  const uint32_t sub =
      sign | numeric::FloatBits(static_cast<float>(static_cast<int32_t>(mant)) * 0x1p-24f);
  const uint32_t inf_nan = sign | 0x7f800000u | (mant << 13) | (mant != 0 ? 0x400000u : 0u);
  const uint32_t normal = sign | ((exp + 112) << 23) | (mant << 13);
  const uint32_t r = Select(exp == 0, sub, Select(exp == 31, inf_nan, normal));
  return numeric::BitsFloat(r);
}

inline uint16_t FloatToHalfSel(float f) {
  uint32_t x = numeric::FloatBits(f);
  const uint32_t sign = (x >> 16) & 0x8000u;
  x &= 0x7fffffffu;
  const uint32_t nan = sign | 0x7e00u | ((x >> 13) & 0x3ffu);
  const uint32_t inf = sign | 0x7c00u;
  // Below 2^-14: adding 0.5f (ulp 2^-24) rounds to the subnormal grid; see numeric.h.
  const uint32_t sub = sign | (numeric::FloatBits(numeric::BitsFloat(x) + 0.5f) - 0x3f000000u);
  const uint32_t normal = sign | ((x + 0xc8000fffu + ((x >> 13) & 1u)) >> 13);
  uint32_t r = Select(x < 0x38800000u, sub, normal);
  r = Select(x >= 0x47800000u, inf, r);
  r = Select(x > 0x7f800000u, nan, r);
  return static_cast<uint16_t>(r);
}

inline float E4m3ToFloatSel(uint8_t b) {
  const uint32_t sign = static_cast<uint32_t>(b & 0x80u) << 24;
  const uint32_t exp = (b >> 3) & 0xfu;
  const uint32_t mant = b & 0x7u;
  const uint32_t sub =
      sign | numeric::FloatBits(static_cast<float>(static_cast<int32_t>(mant)) * 0x1p-9f);
  const uint32_t normal = sign | ((exp + 120) << 23) | (mant << 20);
  uint32_t r = Select(exp == 0, sub, normal);
  r = Select((b & 0x7fu) == 0x7fu, sign | 0x7fc00000u, r);
  return numeric::BitsFloat(r);
}

inline uint8_t FloatToE4m3Sel(float f) {
  uint32_t x = numeric::FloatBits(f);
  const uint32_t sign = (x >> 24) & 0x80u;
  x &= 0x7fffffffu;
  // Below 2^-6 the result is a multiple of 2^-9: 2^14 + x rounds to that grid (ulp 2^-9) exactly
  // as numeric.h's nearbyint(x * 2^9) does, ties to even included.
  const uint32_t sub = sign | (numeric::FloatBits(numeric::BitsFloat(x) + 16384.0f) - 0x46800000u);
  const uint32_t y = (x + 0x7ffffu + ((x >> 20) & 1u)) & 0xfff00000u;
  const uint32_t normal = sign | ((((y >> 23) - 120) << 3) & 0xffu) | ((y >> 20) & 0x7u);
  uint32_t r = Select(x < 0x3c800000u, sub, normal);
  r = Select(x >= 0x43e00000u, sign | 0x7eu, r);
  r = Select(x > 0x7f800000u, sign | 0x7fu, r);
  return static_cast<uint8_t>(r);
}

inline float E5m2ToFloatSel(uint8_t b) {
  return HalfToFloatSel(static_cast<uint16_t>(b << 8));
}

inline uint8_t FloatToE5m2Sel(float f) {
  uint32_t x = numeric::FloatBits(f);
  const uint32_t sign = (x >> 24) & 0x80u;
  x &= 0x7fffffffu;
  // Below 2^-14 the result is a multiple of 2^-16: 128 + x rounds to that grid (ulp 2^-16).
  const uint32_t sub = sign | (numeric::FloatBits(numeric::BitsFloat(x) + 128.0f) - 0x43000000u);
  const uint32_t y = x + 0xfffffu + ((x >> 21) & 1u);
  const uint32_t normal = sign | ((((y >> 23) - 112) << 2) & 0xffu) | ((y >> 21) & 0x3u);
  uint32_t r = Select(x < 0x38800000u, sub, normal);
  r = Select(x >= 0x47700000u, sign | 0x7cu, r);
  r = Select(x > 0x7f800000u, sign | 0x7eu, r);
  return static_cast<uint8_t>(r);
}

// ---- Element kinds ----------------------------------------------------------------------------

// Two's-complement integers: sum and product in the unsigned type (wrap, no UB), comparisons in
// the element's own signedness.
template <typename T>
struct IntElem {
  using Storage = T;
  static constexpr bool kBlocked = false;
  using U = std::make_unsigned_t<T>;
  // Promote narrow unsigned types to unsigned int, not int, so that products cannot overflow int.
  using Wide = std::conditional_t<(sizeof(U) < sizeof(unsigned)), unsigned, U>;

  template <Op kOp>
  static T Apply(T a, T b) {
    if constexpr (kOp == Op::kSum) {
      return static_cast<T>(static_cast<U>(static_cast<Wide>(static_cast<U>(a)) +
                                           static_cast<Wide>(static_cast<U>(b))));
    } else if constexpr (kOp == Op::kProd) {
      return static_cast<T>(static_cast<U>(static_cast<Wide>(static_cast<U>(a)) *
                                           static_cast<Wide>(static_cast<U>(b))));
    } else if constexpr (kOp == Op::kMax) {
      return a < b ? b : a;
    } else {
      return b < a ? b : a;
    }
  }

  struct Divider {
    uint64_t d;
    explicit Divider(uint64_t divisor) : d(divisor) {}
    T operator()(T x) const {
      if constexpr (std::is_signed_v<T>) {
        // Divide magnitudes so that INT64_MIN and divisors above INT64_MAX need no special case;
        // the quotient truncates toward zero as C++ division does.
        const int64_t wx = x;
        const uint64_t mag = wx < 0 ? 0 - static_cast<uint64_t>(wx) : static_cast<uint64_t>(wx);
        const uint64_t q = mag / d;
        return static_cast<T>(wx < 0 ? 0 - q : q);
      } else {
        return static_cast<T>(static_cast<uint64_t>(x) / d);
      }
    }
  };
};

// float32 / float64: IEEE arithmetic in the element type.
template <typename F>
struct FloatElem {
  using Storage = F;
  static constexpr bool kBlocked = false;

  template <Op kOp>
  static F Apply(F a, F b) {
    return FloatApply<kOp>(a, b);
  }

  struct Divider {
    F d;
    explicit Divider(uint64_t divisor) : d(static_cast<F>(divisor)) {}
    F operator()(F x) const { return x / d; }
  };
};

// float16, bfloat16, fp8: widened to fp32 with numeric.h's conversions (or their select-form
// twins above), combined in fp32 and rounded back to nearest even. fp32 carries at least 2p + 2
// bits for each of these formats, so the double rounding of a sum or product is innocuous: the
// result is the correctly rounded narrow result (e4m3 saturates at +-448 instead), except for
// bfloat16 products that fall among fp32's subnormals, which are merely deterministic.
// Widens a run of narrow elements into fp32 and rounds a run back, with the conversion functions
// given: single-purpose loops like these vectorise far better than one loop that converts,
// combines and converts back.
template <typename S, float (*kToFloat)(S), S (*kFromFloat)(float)>
struct LoopConv {
  static void Widen(const unsigned char* __restrict src, float* __restrict dst, size_t n) {
    for (size_t i = 0; i < n; ++i) dst[i] = kToFloat(LoadAt<S>(src, i));
  }
  static void Narrow(const float* __restrict src, unsigned char* __restrict dst, size_t n) {
    for (size_t i = 0; i < n; ++i) StoreAt<S>(dst, i, kFromFloat(src[i]));
  }
};

#if defined(__F16C__)
// float16 with the F16C instructions, eight at a time. vcvtph2ps is exact and vcvtps2ph with an
// immediate round-to-nearest-even gives numeric.h's bits for every input, NaNs included (numeric.h
// was checked against F16C exhaustively, and the tests compare this table with the scalar one).
struct HalfConvF16c {
  static void Widen(const unsigned char* __restrict src, float* __restrict dst, size_t n) {
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
      const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + 2 * i));
      _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(h));
    }
    for (; i < n; ++i) dst[i] = HalfToFloatSel(LoadAt<uint16_t>(src, i));
  }
  static void Narrow(const float* __restrict src, unsigned char* __restrict dst, size_t n) {
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
      const __m128i h = _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT);
      _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + 2 * i), h);
    }
    for (; i < n; ++i) StoreAt<uint16_t>(dst, i, FloatToHalfSel(src[i]));
  }
};
#endif

// float16, bfloat16, fp8: widened to fp32 with numeric.h's conversions (or bit-identical ones:
// the select-form twins above, F16C), combined in fp32 and rounded back to nearest even, a block
// at a time through fp32 buffers on the stack. fp32 carries at least 2p + 2 bits for each of these
// formats, so the double rounding of a sum or product is innocuous: the result is the correctly
// rounded narrow result (e4m3 saturates at +-448 instead), except for bfloat16 products that fall
// among fp32's subnormals, which are merely deterministic.
template <typename S, typename Conv>
struct NarrowElem {
  using Storage = S;
  using Converter = Conv;
  static constexpr bool kBlocked = true;
};

// ---- Loops ------------------------------------------------------------------------------------

// Separate functions with __restrict parameters so that the vectoriser needs no runtime alias
// check; the in == inout case gets its own loop (it is safe to vectorise, but a generic overlap
// check would send it down the scalar fallback).
template <typename E, Op kOp>
[[gnu::always_inline]] inline void ReduceDisjoint(const unsigned char* __restrict in,
                                                  unsigned char* __restrict inout, size_t count) {
  using S = typename E::Storage;
  for (size_t i = 0; i < count; ++i) {
    StoreAt<S>(inout, i, E::template Apply<kOp>(LoadAt<S>(inout, i), LoadAt<S>(in, i)));
  }
}

template <typename E, Op kOp>
[[gnu::always_inline]] inline void ReduceSelf(unsigned char* __restrict inout, size_t count) {
  using S = typename E::Storage;
  for (size_t i = 0; i < count; ++i) {
    const S v = LoadAt<S>(inout, i);
    StoreAt<S>(inout, i, E::template Apply<kOp>(v, v));
  }
}

// Narrow types: widen a block of each operand into fp32 on the stack, combine, round back. Both
// operands are widened before anything is written, so in == inout needs no special case.
inline constexpr size_t kNarrowBlock = 256;

template <Op kOp>
[[gnu::always_inline]] inline void CombineBlock(float* __restrict acc, const float* __restrict x,
                                                size_t n) {
  for (size_t i = 0; i < n; ++i) acc[i] = FloatApply<kOp>(acc[i], x[i]);
}

template <typename E, Op kOp>
[[gnu::always_inline]] inline void ReduceBlocked(const unsigned char* in, unsigned char* inout,
                                                 size_t count) {
  using S = typename E::Storage;
  using Conv = typename E::Converter;
  alignas(64) float acc[kNarrowBlock];
  alignas(64) float x[kNarrowBlock];
  for (size_t base = 0; base < count; base += kNarrowBlock) {
    const size_t n = count - base < kNarrowBlock ? count - base : kNarrowBlock;
    Conv::Widen(inout + base * sizeof(S), acc, n);
    Conv::Widen(in + base * sizeof(S), x, n);
    CombineBlock<kOp>(acc, x, n);
    Conv::Narrow(acc, inout + base * sizeof(S), n);
  }
}

// `flatten` inlines numeric.h's conversions too, so that this unit emits no out-of-line copy of
// them compiled for its instruction set.
template <typename E, Op kOp>
[[gnu::flatten]] void ReduceKernel(const void* in, void* inout, size_t count) {
  auto* dst = static_cast<unsigned char*>(inout);
  if constexpr (E::kBlocked) {
    ReduceBlocked<E, kOp>(static_cast<const unsigned char*>(in), dst, count);
  } else if (in == inout) {
    ReduceSelf<E, kOp>(dst, count);
  } else {
    ReduceDisjoint<E, kOp>(static_cast<const unsigned char*>(in), dst, count);
  }
}

template <typename E>
[[gnu::flatten]] void DivideKernel(void* data, size_t count, uint64_t divisor) {
  using S = typename E::Storage;
  auto* p = static_cast<unsigned char*>(data);
  if constexpr (E::kBlocked) {
    using Conv = typename E::Converter;
    const float d = static_cast<float>(divisor);
    alignas(64) float buf[kNarrowBlock];
    for (size_t base = 0; base < count; base += kNarrowBlock) {
      const size_t n = count - base < kNarrowBlock ? count - base : kNarrowBlock;
      Conv::Widen(p + base * sizeof(S), buf, n);
      for (size_t i = 0; i < n; ++i) buf[i] = buf[i] / d;
      Conv::Narrow(buf, p + base * sizeof(S), n);
    }
  } else {
    const typename E::Divider div(divisor);
    for (size_t i = 0; i < count; ++i) StoreAt<S>(p, i, div(LoadAt<S>(p, i)));
  }
}

// ---- Table ------------------------------------------------------------------------------------

#if defined(__F16C__)
using Half = NarrowElem<uint16_t, HalfConvF16c>;
#else
using Half = NarrowElem<uint16_t, LoopConv<uint16_t, HalfToFloatSel, FloatToHalfSel>>;
#endif
using Bf16 = NarrowElem<uint16_t, LoopConv<uint16_t, numeric::Bf16ToFloat, numeric::FloatToBf16>>;
using E4m3 = NarrowElem<uint8_t, LoopConv<uint8_t, E4m3ToFloatSel, FloatToE4m3Sel>>;
using E5m2 = NarrowElem<uint8_t, LoopConv<uint8_t, E5m2ToFloatSel, FloatToE5m2Sel>>;

template <typename E>
constexpr void FillRow(ReduceTable& t, DataType type) {
  const auto row = static_cast<int>(type);
  t.reduce[row][static_cast<int>(Op::kSum)] = &ReduceKernel<E, Op::kSum>;
  t.reduce[row][static_cast<int>(Op::kProd)] = &ReduceKernel<E, Op::kProd>;
  t.reduce[row][static_cast<int>(Op::kMax)] = &ReduceKernel<E, Op::kMax>;
  t.reduce[row][static_cast<int>(Op::kMin)] = &ReduceKernel<E, Op::kMin>;
  t.divide[row] = &DivideKernel<E>;
}

constexpr ReduceTable MakeReduceTable() {
  ReduceTable t{};
  FillRow<IntElem<int8_t>>(t, DataType::kInt8);
  FillRow<IntElem<uint8_t>>(t, DataType::kUint8);
  FillRow<IntElem<int32_t>>(t, DataType::kInt32);
  FillRow<IntElem<uint32_t>>(t, DataType::kUint32);
  FillRow<IntElem<int64_t>>(t, DataType::kInt64);
  FillRow<IntElem<uint64_t>>(t, DataType::kUint64);
  FillRow<Half>(t, DataType::kFloat16);
  FillRow<FloatElem<float>>(t, DataType::kFloat32);
  FillRow<FloatElem<double>>(t, DataType::kFloat64);
  FillRow<Bf16>(t, DataType::kBfloat16);
  FillRow<E4m3>(t, DataType::kFloat8E4M3);
  FillRow<E5m2>(t, DataType::kFloat8E5M2);
  return t;
}

}  // namespace strait::codec_internal::STRAIT_REDUCE_NS

#endif  // defined(STRAIT_REDUCE_NS)

#endif  // STRAIT_LIB_CODEC_REDUCE_IMPL_H_

// Internal: bit-exact scalar conversions between fp32 and the narrow float formats (float16,
// bfloat16, fp8 e4m3 and e5m2), written with integer operations only so that the AVX2/AVX-512
// kernels and the CUDA kernels can reproduce them instruction for instruction. These functions are
// the reference: every vector path must give the same bits.
//
// Rounding is to nearest, ties to even, everywhere. NaN inputs give a quiet NaN of the same sign
// (float16/bfloat16: payload truncated, as x86's F16C does; fp8: the canonical NaN). Overflow:
// float16 and bfloat16 and e5m2 go to infinity (IEEE); e4m3 (the "fn" variant, which has no
// infinity) saturates to +-448.
#ifndef STRAIT_LIB_CODEC_NUMERIC_H_
#define STRAIT_LIB_CODEC_NUMERIC_H_

#include <cmath>
#include <cstdint>
#include <cstring>

// `static`: each translation unit gets its own copy. The AVX2/AVX-512 files include this header
// too, and an `inline` function emitted there (with vector instructions) could be the copy the
// linker keeps for the baseline code, which would then crash on older CPUs.
#if defined(__CUDACC__)
#define STRAIT_HD static __host__ __device__ __forceinline__
#else
#define STRAIT_HD static inline
#endif

namespace strait::numeric {

STRAIT_HD uint32_t FloatBits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  return u;
#endif
}

STRAIT_HD float BitsFloat(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
#endif
}

// ---- float16 -------------------------------------------------------------------------------

STRAIT_HD float HalfToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  const uint32_t mant = h & 0x3ffu;
  if (exp == 0) {
    // Zero or subnormal: mant * 2^-24 is exact in fp32.
    return BitsFloat(sign | FloatBits(static_cast<float>(mant) * 0x1p-24f));
  }
  if (exp == 31) return BitsFloat(sign | 0x7f800000u | (mant << 13) | (mant ? 0x400000u : 0u));
  return BitsFloat(sign | ((exp + 112) << 23) | (mant << 13));
}

STRAIT_HD uint16_t FloatToHalf(float f) {
  uint32_t x = FloatBits(f);
  const uint32_t sign = (x >> 16) & 0x8000u;
  x &= 0x7fffffffu;
  if (x > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u | ((x >> 13) & 0x3ffu));
  if (x >= 0x47800000u) return static_cast<uint16_t>(sign | 0x7c00u);  // >= 65536: inf
  if (x < 0x38800000u) {
    // Below 2^-14: the result is a subnormal. Adding 0.5f aligns the value so that the FPU's
    // own round-to-nearest-even lands on a multiple of 2^-24; the low bits are the mantissa.
    const float t = BitsFloat(x) + 0.5f;
    return static_cast<uint16_t>(sign | (FloatBits(t) - 0x3f000000u));
  }
  // Normal: rebias the exponent and round the 13 dropped bits to nearest even. A carry out of
  // the mantissa correctly bumps the exponent (up to infinity at 65520).
  const uint32_t odd = (x >> 13) & 1u;
  x += 0xc8000fffu + odd;  // ((15 - 127) << 23) + 0xfff, modulo 2^32
  return static_cast<uint16_t>(sign | (x >> 13));
}

// ---- bfloat16 ------------------------------------------------------------------------------

STRAIT_HD float Bf16ToFloat(uint16_t b) {
  return BitsFloat(static_cast<uint32_t>(b) << 16);
}

STRAIT_HD uint16_t FloatToBf16(float f) {
  const uint32_t x = FloatBits(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((x >> 16) | 0x40u);
  return static_cast<uint16_t>((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}

// ---- fp8 e4m3 (fn: no infinity, 0x7f/0xff are NaN, max 448) ---------------------------------

STRAIT_HD float E4m3ToFloat(uint8_t b) {
  const uint32_t sign = static_cast<uint32_t>(b & 0x80u) << 24;
  const uint32_t exp = (b >> 3) & 0xfu;
  const uint32_t mant = b & 0x7u;
  if (exp == 15 && mant == 7) return BitsFloat(sign | 0x7fc00000u);
  if (exp == 0) return BitsFloat(sign | FloatBits(static_cast<float>(mant) * 0x1p-9f));
  return BitsFloat(sign | ((exp + 120) << 23) | (mant << 20));
}

// `bits20`: 0x7ffff + odd for round-to-nearest-even (see FloatToE4m3), or 20 random bits for
// stochastic rounding. `sub_add`: 0 for nearest (the subnormal path uses rint), or a uniform
// [0, 1) for stochastic (floor(x * 2^9 + u)). Input magnitude is clamped to 448 first.
STRAIT_HD uint8_t FloatToE4m3Impl(float f, bool stochastic, uint32_t rand_bits20, float rand_unit) {
  uint32_t x = FloatBits(f);
  const uint32_t sign = (x >> 24) & 0x80u;
  x &= 0x7fffffffu;
  if (x > 0x7f800000u) return static_cast<uint8_t>(sign | 0x7fu);
  if (x >= 0x43e00000u) return static_cast<uint8_t>(sign | 0x7eu);  // >= 448 (inf too): saturate
  if (x < 0x3c800000u) {
    // Below 2^-6: subnormal, a multiple of 2^-9. The scaling by 2^9 is exact.
    const float scaled = BitsFloat(x) * 512.0f;
    const float q = stochastic ? std::floor(scaled + rand_unit) : std::nearbyint(scaled);
    return static_cast<uint8_t>(sign | static_cast<uint32_t>(q));
  }
  x += stochastic ? (rand_bits20 & 0xfffffu) : (0x7ffffu + ((x >> 20) & 1u));
  x &= 0xfff00000u;
  // 448 is exactly representable and nothing below it rounds above it, so no saturation here.
  const uint32_t exp = (x >> 23) - 120;
  return static_cast<uint8_t>(sign | (exp << 3) | ((x >> 20) & 0x7u));
}

STRAIT_HD uint8_t FloatToE4m3(float f) {
  return FloatToE4m3Impl(f, false, 0, 0.0f);
}

// ---- fp8 e5m2 (IEEE-like: has infinity and NaN, max 57344) -----------------------------------

STRAIT_HD float E5m2ToFloat(uint8_t b) {
  return HalfToFloat(static_cast<uint16_t>(b) << 8);
}

STRAIT_HD uint8_t FloatToE5m2(float f) {
  uint32_t x = FloatBits(f);
  const uint32_t sign = (x >> 24) & 0x80u;
  x &= 0x7fffffffu;
  if (x > 0x7f800000u) return static_cast<uint8_t>(sign | 0x7eu);
  if (x >= 0x47700000u) return static_cast<uint8_t>(sign | 0x7cu);  // >= 61440 rounds to inf
  if (x < 0x38800000u) {
    // Below 2^-14: subnormal, a multiple of 2^-16.
    const float q = std::nearbyint(BitsFloat(x) * 65536.0f);
    return static_cast<uint8_t>(sign | static_cast<uint32_t>(q));
  }
  x += 0xfffffu + ((x >> 21) & 1u);
  const uint32_t exp = (x >> 23) - 112;
  return static_cast<uint8_t>(sign | (exp << 2) | ((x >> 21) & 0x3u));
}

}  // namespace strait::numeric

#endif  // STRAIT_LIB_CODEC_NUMERIC_H_

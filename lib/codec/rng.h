// Internal: the counter-based random numbers behind stochastic rounding.
//
// A draw is a pure function of (seed, element index): no state, no order, so that every CPU
// vector width, every thread split and the CUDA kernels give the same bits for the same element.
// Only 32-bit integer add, xor, shift and multiply (low 32 bits) are used, which AVX2
// (_mm256_mullo_epi32), AVX-512 (_mm512_mullo_epi32) and CUDA all have.
//
// Exact definition (the GPU kernels must reproduce it bit for bit; all arithmetic mod 2^32):
//
//   Mix32(h):  h ^= h >> 16;  h *= 0x85ebca6b;  h ^= h >> 13;  h *= 0xc2b2ae35;  h ^= h >> 16;
//              (the murmur3 fmix32 finaliser: a bijection on 32 bits with full avalanche)
//
//   Key from the 64-bit seed (computed once per call):
//     k0 = Mix32(lo32(seed) ^ 0x9e3779b9)
//     k1 = Mix32((hi32(seed) ^ 0x7f4a7c15) + k0)
//
//   Bits for the 64-bit element index i:
//     h = Mix32(lo32(i) ^ k0)
//     h = Mix32(h ^ hi32(i) ^ k1)
//     return h
//
//   Unit(bits) = float(bits >> 8) * 2^-24, uniform on the 2^24 multiples of 2^-24 in [0, 1)
//   (both steps are exact in fp32).
//
// For element j of one quantize call the index is params.index_offset + j (j counts from the
// call's first element, across blocks), so a tensor encoded in chunks draws what it would draw
// encoded whole. int8/int4 use Unit(bits); fp8 e4m3 uses the same draw twice: bits & 0xfffff for
// the normal range and Unit(bits) for the subnormal range (see kernels_scalar.cc).
//
// Two rounds of Mix32 per draw are far more than stochastic rounding needs; what matters is that
// neighbouring indices and neighbouring seeds give unrelated bits, which the tests check coarsely.
#ifndef STRAIT_LIB_CODEC_RNG_H_
#define STRAIT_LIB_CODEC_RNG_H_

#include <cstdint>

#include "codec/numeric.h"  // STRAIT_HD

namespace strait::rng {

struct Key {
  uint32_t k0;
  uint32_t k1;
};

inline constexpr uint32_t kMixMul1 = 0x85ebca6bu;
inline constexpr uint32_t kMixMul2 = 0xc2b2ae35u;
inline constexpr uint32_t kSeedSalt0 = 0x9e3779b9u;
inline constexpr uint32_t kSeedSalt1 = 0x7f4a7c15u;

STRAIT_HD uint32_t Mix32(uint32_t h) {
  h ^= h >> 16;
  h *= kMixMul1;
  h ^= h >> 13;
  h *= kMixMul2;
  h ^= h >> 16;
  return h;
}

STRAIT_HD Key KeyFromSeed(uint64_t seed) {
  const uint32_t k0 = Mix32(static_cast<uint32_t>(seed) ^ kSeedSalt0);
  const uint32_t k1 = Mix32((static_cast<uint32_t>(seed >> 32) ^ kSeedSalt1) + k0);
  return Key{k0, k1};
}

// The index split into halves, so that vector code (which carries lo/hi per lane) and scalar code
// share one definition.
STRAIT_HD uint32_t BitsFromHalves(Key key, uint32_t index_lo, uint32_t index_hi) {
  const uint32_t h = Mix32(index_lo ^ key.k0);
  return Mix32(h ^ index_hi ^ key.k1);
}

STRAIT_HD uint32_t Bits(Key key, uint64_t index) {
  return BitsFromHalves(key, static_cast<uint32_t>(index), static_cast<uint32_t>(index >> 32));
}

// Uniform in [0, 1): 24 random bits, exact in fp32.
STRAIT_HD float Unit(uint32_t bits) {
  return static_cast<float>(bits >> 8) * 0x1p-24f;
}

}  // namespace strait::rng

#endif  // STRAIT_LIB_CODEC_RNG_H_

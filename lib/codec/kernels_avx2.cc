// AVX2 (+F16C) kernels: the arithmetic of kernels_scalar.cc, eight lanes at a time, producing
// byte-identical codes, scales and residuals. Called only where DetectIsa() >= kAvx2.
//
// Full blocks are vectorised (a block is a power of two >= 32 elements, so it is whole vectors);
// the last, partial block goes through the scalar reference. Each block is read twice (absmax,
// then quantize); the second read hits L1 for the usual block sizes.
//
// Why the results match the scalar code bit for bit:
//   - every fp32 operation is the same single IEEE operation (no FMA anywhere);
//   - _mm256_cvtps_epi32 rounds under MXCSR like nearbyint, _mm256_floor_ps is floor;
//   - F16C conversions equal numeric.h's (the tests check all 65536 halves);
//   - absmax is an integer max of |c| bits, as in the scalar code, so NaN needs no special case;
//   - fp8 e4m3 encode and decode are numeric.h's integer formulas, lane by lane.
// This file deliberately calls no inline function of numeric.h or rng.h: see kernels_common.h.
#include <immintrin.h>

#include <cstring>

#include "codec/kernels.h"
#include "codec/kernels_common.h"

namespace strait::codec_internal {
namespace {

template <DataType kType>
inline __m256 Load8(const void* src, size_t i) {
  const auto* bytes = static_cast<const uint8_t*>(src);
  if constexpr (kType == DataType::kFloat32) {
    return _mm256_loadu_ps(reinterpret_cast<const float*>(bytes + 4 * i));
  } else {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(bytes + 2 * i));
    if constexpr (kType == DataType::kFloat16) {
      return _mm256_cvtph_ps(h);
    } else {
      return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
    }
  }
}

// The compensated input c = src (+ residual).
template <DataType kType, bool kResidual>
inline __m256 LoadC(const void* src, const float* residual, size_t i) {
  __m256 c = Load8<kType>(src, i);
  if constexpr (kResidual) c = _mm256_add_ps(c, _mm256_loadu_ps(residual + i));
  return c;
}

inline __m256i AbsBits(__m256 c) {
  return _mm256_and_si256(_mm256_castps_si256(c), _mm256_set1_epi32(0x7fffffff));
}

inline uint32_t HorizontalMaxU32(__m256i v) {
  __m128i m = _mm_max_epu32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  m = _mm_max_epu32(m, _mm_shuffle_epi32(m, _MM_SHUFFLE(1, 0, 3, 2)));
  m = _mm_max_epu32(m, _mm_shuffle_epi32(m, _MM_SHUFFLE(2, 3, 0, 1)));
  return static_cast<uint32_t>(_mm_cvtsi128_si32(m));
}

inline __m256i Mix32(__m256i h) {
  h = _mm256_xor_si256(h, _mm256_srli_epi32(h, 16));
  h = _mm256_mullo_epi32(h, _mm256_set1_epi32(static_cast<int>(rng::kMixMul1)));
  h = _mm256_xor_si256(h, _mm256_srli_epi32(h, 13));
  h = _mm256_mullo_epi32(h, _mm256_set1_epi32(static_cast<int>(rng::kMixMul2)));
  return _mm256_xor_si256(h, _mm256_srli_epi32(h, 16));
}

// rng::Bits(key, index + lane) for lanes 0..7, carrying into the high half where the low half
// wraps.
inline __m256i RngBits8(rng::Key key, uint64_t index) {
  const __m256i base_lo = _mm256_set1_epi32(static_cast<int>(static_cast<uint32_t>(index)));
  const __m256i lo = _mm256_add_epi32(base_lo, _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
  const __m256i no_carry = _mm256_cmpeq_epi32(_mm256_max_epu32(lo, base_lo), lo);  // -1 or 0
  const __m256i hi = _mm256_add_epi32(
      _mm256_set1_epi32(static_cast<int>(static_cast<uint32_t>(index >> 32) + 1u)), no_carry);
  __m256i h = Mix32(_mm256_xor_si256(lo, _mm256_set1_epi32(static_cast<int>(key.k0))));
  h = _mm256_xor_si256(_mm256_xor_si256(h, hi), _mm256_set1_epi32(static_cast<int>(key.k1)));
  return Mix32(h);
}

inline __m256 RngUnit(__m256i bits) {
  return _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_srli_epi32(bits, 8)), _mm256_set1_ps(0x1p-24f));
}

// numeric::FloatToE4m3Impl, lane by lane.
template <bool kStochastic>
inline __m256i EncodeE4m3(__m256 v, __m256i bits) {
  const __m256i x = _mm256_castps_si256(v);
  const __m256i sign = _mm256_and_si256(_mm256_srli_epi32(x, 24), _mm256_set1_epi32(0x80));
  const __m256i ax = _mm256_and_si256(x, _mm256_set1_epi32(0x7fffffff));
  // Subnormal range: a multiple of 2^-9.
  const __m256 scaled = _mm256_mul_ps(_mm256_castsi256_ps(ax), _mm256_set1_ps(512.0f));
  __m256i sub;
  __m256i add;
  if constexpr (kStochastic) {
    sub = _mm256_cvttps_epi32(_mm256_floor_ps(_mm256_add_ps(scaled, RngUnit(bits))));
    add = _mm256_and_si256(bits, _mm256_set1_epi32(0xfffff));
  } else {
    sub = _mm256_cvtps_epi32(scaled);
    add = _mm256_add_epi32(_mm256_set1_epi32(0x7ffff),
                           _mm256_and_si256(_mm256_srli_epi32(ax, 20), _mm256_set1_epi32(1)));
  }
  // Normal range: round the 20 dropped mantissa bits, then rebias: (exp - 120) << 3 | mant is
  // (x >> 20) - (120 << 3).
  const __m256i xn =
      _mm256_and_si256(_mm256_add_epi32(ax, add), _mm256_set1_epi32(static_cast<int>(0xfff00000u)));
  const __m256i norm = _mm256_sub_epi32(_mm256_srli_epi32(xn, 20), _mm256_set1_epi32(960));
  const __m256i is_sub = _mm256_cmpgt_epi32(_mm256_set1_epi32(0x3c800000), ax);
  const __m256i is_sat = _mm256_cmpgt_epi32(ax, _mm256_set1_epi32(0x43dfffff));
  const __m256i is_nan = _mm256_cmpgt_epi32(ax, _mm256_set1_epi32(0x7f800000));
  __m256i mag = _mm256_blendv_epi8(norm, sub, is_sub);
  mag = _mm256_blendv_epi8(mag, _mm256_set1_epi32(0x7e), is_sat);
  mag = _mm256_blendv_epi8(mag, _mm256_set1_epi32(0x7f), is_nan);
  return _mm256_or_si256(mag, sign);
}

// numeric::E4m3ToFloat of codes 0..255 held in int32 lanes.
inline __m256 DecodeE4m3(__m256i code) {
  const __m256i mag = _mm256_and_si256(code, _mm256_set1_epi32(0x7f));
  const __m256i sign = _mm256_slli_epi32(_mm256_and_si256(code, _mm256_set1_epi32(0x80)), 24);
  const __m256i normal = _mm256_add_epi32(_mm256_slli_epi32(mag, 20), _mm256_set1_epi32(120 << 23));
  const __m256i sub = _mm256_castps_si256(_mm256_mul_ps(
      _mm256_cvtepi32_ps(_mm256_and_si256(mag, _mm256_set1_epi32(7))), _mm256_set1_ps(0x1p-9f)));
  __m256i r = _mm256_blendv_epi8(normal, sub, _mm256_cmpgt_epi32(_mm256_set1_epi32(8), mag));
  r = _mm256_blendv_epi8(r, _mm256_set1_epi32(0x7fc00000),
                         _mm256_cmpeq_epi32(mag, _mm256_set1_epi32(0x7f)));
  return _mm256_castsi256_ps(_mm256_or_si256(r, sign));
}

// The code of each lane (int8/int4: q in [-qmax, qmax]; fp8: the e4m3 byte) for v = c * inv.
template <LossyKind kKind, bool kStochastic>
inline __m256i Encode(__m256 v, __m256i bits) {
  if constexpr (kKind == LossyKind::kFp8) {
    return EncodeE4m3<kStochastic>(v, bits);
  } else {
    __m256i q;
    if constexpr (kStochastic) {
      q = _mm256_cvttps_epi32(_mm256_floor_ps(_mm256_add_ps(v, RngUnit(bits))));
    } else {
      q = _mm256_cvtps_epi32(v);
    }
    constexpr int kQ = static_cast<int>(kQmax<kKind>);
    return _mm256_min_epi32(_mm256_max_epi32(q, _mm256_set1_epi32(-kQ)), _mm256_set1_epi32(kQ));
  }
}

// decode(code) of Encode's lanes.
template <LossyKind kKind>
inline __m256 Decode(__m256i q) {
  if constexpr (kKind == LossyKind::kFp8) {
    return DecodeE4m3(q);
  } else {
    return _mm256_cvtepi32_ps(q);
  }
}

// Stores the codes of 32 consecutive elements starting at element j.
template <LossyKind kKind>
inline void StoreCodes32(uint8_t* codes, size_t j, const __m256i q[4]) {
  const __m256i p01 = _mm256_packs_epi32(q[0], q[1]);
  const __m256i p23 = _mm256_packs_epi32(q[2], q[3]);
  const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
  if constexpr (kKind == LossyKind::kFp8) {
    const __m256i b = _mm256_permutevar8x32_epi32(_mm256_packus_epi16(p01, p23), order);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(codes + j), b);
  } else {
    const __m256i b = _mm256_permutevar8x32_epi32(_mm256_packs_epi16(p01, p23), order);
    if constexpr (kKind == LossyKind::kInt8) {
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(codes + j), b);
    } else {
      // Each 16-bit lane holds elements (2k, 2k+1) as bytes; fold them into one byte.
      const __m256i lo = _mm256_and_si256(b, _mm256_set1_epi16(0x000f));
      const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(b, 4), _mm256_set1_epi16(0x00f0));
      const __m256i packed = _mm256_packus_epi16(_mm256_or_si256(lo, hi), _mm256_setzero_si256());
      const __m256i joined = _mm256_permute4x64_epi64(packed, _MM_SHUFFLE(3, 1, 2, 0));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(codes + j / 2), _mm256_castsi256_si128(joined));
    }
  }
}

// Loads the codes of 8 elements starting at element j (a multiple of 8) as int32 lanes
// (int8/int4: the signed value; fp8: the byte).
template <LossyKind kKind>
inline __m256i LoadCodes8(const uint8_t* codes, size_t j) {
  if constexpr (kKind == LossyKind::kInt4) {
    uint32_t w;
    std::memcpy(&w, codes + j / 2, sizeof(w));
    // Move nibble k to the top of lane k, then shift it back down arithmetically.
    const __m256i shifted = _mm256_sllv_epi32(_mm256_set1_epi32(static_cast<int>(w)),
                                              _mm256_setr_epi32(28, 24, 20, 16, 12, 8, 4, 0));
    return _mm256_srai_epi32(shifted, 28);
  } else {
    const __m128i b = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(codes + j));
    if constexpr (kKind == LossyKind::kInt8) return _mm256_cvtepi8_epi32(b);
    return _mm256_cvtepu8_epi32(b);
  }
}

inline size_t CodeOffset(LossyKind kind, size_t element) {
  return kind == LossyKind::kInt4 ? element / 2 : element;
}

template <LossyKind kKind, DataType kType, bool kResidual, bool kStochastic>
void QuantizeBlock(const void* src, float* residual, size_t begin, uint32_t block_size,
                   const QuantParams& params, rng::Key key, float* scales, uint8_t* codes) {
  const size_t end = begin + block_size;
  __m256i m0 = _mm256_setzero_si256();
  __m256i m1 = m0;
  __m256i m2 = m0;
  __m256i m3 = m0;
  for (size_t j = begin; j < end; j += 32) {
    m0 = _mm256_max_epu32(m0, AbsBits(LoadC<kType, kResidual>(src, residual, j)));
    m1 = _mm256_max_epu32(m1, AbsBits(LoadC<kType, kResidual>(src, residual, j + 8)));
    m2 = _mm256_max_epu32(m2, AbsBits(LoadC<kType, kResidual>(src, residual, j + 16)));
    m3 = _mm256_max_epu32(m3, AbsBits(LoadC<kType, kResidual>(src, residual, j + 24)));
  }
  const uint32_t absmax_bits =
      HorizontalMaxU32(_mm256_max_epu32(_mm256_max_epu32(m0, m1), _mm256_max_epu32(m2, m3)));
  const BlockScale bs = ComputeBlockScale(kKind, absmax_bits);
  std::memcpy(scales + begin / block_size, &bs.scale, sizeof(float));

  if (bs.zero_codes) {
    std::memset(codes + CodeOffset(kKind, begin), 0, CodeOffset(kKind, block_size));
    if constexpr (kResidual) {
      const __m256 x = _mm256_set1_ps(0.0f * bs.scale);  // decode(0) * scale
      for (size_t j = begin; j < end; j += 8) {
        _mm256_storeu_ps(residual + j, _mm256_sub_ps(LoadC<kType, kResidual>(src, residual, j), x));
      }
    }
    return;
  }

  const __m256 inv = _mm256_set1_ps(bs.inv);
  const __m256 scale = _mm256_set1_ps(bs.scale);
  for (size_t j = begin; j < end; j += 32) {
    __m256i q[4];
    for (int k = 0; k < 4; ++k) {
      const size_t i = j + 8 * static_cast<size_t>(k);
      const __m256 c = LoadC<kType, kResidual>(src, residual, i);
      __m256i bits = _mm256_setzero_si256();
      if constexpr (kStochastic) bits = RngBits8(key, params.index_offset + i);
      q[k] = Encode<kKind, kStochastic>(_mm256_mul_ps(c, inv), bits);
      if constexpr (kResidual) {
        _mm256_storeu_ps(residual + i, _mm256_sub_ps(c, _mm256_mul_ps(Decode<kKind>(q[k]), scale)));
      }
    }
    StoreCodes32<kKind>(codes, j, q);
  }
}

template <LossyKind kKind, DataType kType, bool kResidual, bool kStochastic>
void QuantizeAll(const void* src, float* residual, size_t count, const QuantParams& params,
                 float* scales, uint8_t* codes) {
  const uint32_t block_size = params.block_size;
  const rng::Key key = kStochastic ? RngKeyFor(params.seed) : rng::Key{0, 0};
  const size_t full = count / block_size * block_size;
  for (size_t begin = 0; begin < full; begin += block_size) {
    QuantizeBlock<kKind, kType, kResidual, kStochastic>(src, residual, begin, block_size, params,
                                                        key, scales, codes);
  }
  if (full < count) {
    QuantizeBlockRef(kKind, src, kType, kResidual ? residual : nullptr, full, count - full, params,
                     scales, codes);
  }
}

template <LossyKind kKind, DataType kType>
void QuantizeType(const void* src, float* residual, size_t count, const QuantParams& params,
                  float* scales, uint8_t* codes) {
  const bool stochastic = params.rounding == Rounding::kStochastic;
  if (residual != nullptr) {
    if (stochastic) {
      QuantizeAll<kKind, kType, true, true>(src, residual, count, params, scales, codes);
    } else {
      QuantizeAll<kKind, kType, true, false>(src, residual, count, params, scales, codes);
    }
  } else if (stochastic) {
    QuantizeAll<kKind, kType, false, true>(src, residual, count, params, scales, codes);
  } else {
    QuantizeAll<kKind, kType, false, false>(src, residual, count, params, scales, codes);
  }
}

template <LossyKind kKind>
void Quantize(const void* src, DataType src_type, float* residual, size_t count,
              const QuantParams& params, float* scales, uint8_t* codes) {
  switch (src_type) {
    case DataType::kBfloat16:
      QuantizeType<kKind, DataType::kBfloat16>(src, residual, count, params, scales, codes);
      break;
    case DataType::kFloat16:
      QuantizeType<kKind, DataType::kFloat16>(src, residual, count, params, scales, codes);
      break;
    default:
      QuantizeType<kKind, DataType::kFloat32>(src, residual, count, params, scales, codes);
      break;
  }
}

template <LossyKind kKind, bool kAccumulate>
void DequantizeAll(const float* scales, const uint8_t* codes, size_t count, uint32_t block_size,
                   float* out) {
  const size_t full = count / block_size * block_size;
  for (size_t begin = 0; begin < full; begin += block_size) {
    float s;
    std::memcpy(&s, scales + begin / block_size, sizeof(s));
    const __m256 scale = _mm256_set1_ps(s);
    for (size_t j = begin; j < begin + block_size; j += 16) {
      __m256 x0 = _mm256_mul_ps(Decode<kKind>(LoadCodes8<kKind>(codes, j)), scale);
      __m256 x1 = _mm256_mul_ps(Decode<kKind>(LoadCodes8<kKind>(codes, j + 8)), scale);
      if constexpr (kAccumulate) {
        x0 = _mm256_add_ps(_mm256_loadu_ps(out + j), x0);
        x1 = _mm256_add_ps(_mm256_loadu_ps(out + j + 8), x1);
      }
      _mm256_storeu_ps(out + j, x0);
      _mm256_storeu_ps(out + j + 8, x1);
    }
  }
  if (full < count) {
    DequantizeBlockRef(kKind, scales, codes, full, count - full, block_size, out, kAccumulate);
  }
}

template <LossyKind kKind>
void Dequantize(const float* scales, const uint8_t* codes, size_t count, uint32_t block_size,
                float* out, bool accumulate) {
  if (accumulate) {
    DequantizeAll<kKind, true>(scales, codes, count, block_size, out);
  } else {
    DequantizeAll<kKind, false>(scales, codes, count, block_size, out);
  }
}

template <DataType kType>
size_t ToFloatVec(const void* src, float* dst, size_t count, bool accumulate) {
  size_t i = 0;
  for (; i + 8 <= count; i += 8) {
    __m256 x = Load8<kType>(src, i);
    if (accumulate) x = _mm256_add_ps(_mm256_loadu_ps(dst + i), x);
    _mm256_storeu_ps(dst + i, x);
  }
  return i;
}

void ToFloat(const void* src, DataType src_type, float* dst, size_t count, bool accumulate) {
  size_t done;
  switch (src_type) {
    case DataType::kBfloat16:
      done = ToFloatVec<DataType::kBfloat16>(src, dst, count, accumulate);
      break;
    case DataType::kFloat16:
      done = ToFloatVec<DataType::kFloat16>(src, dst, count, accumulate);
      break;
    default: done = ToFloatVec<DataType::kFloat32>(src, dst, count, accumulate); break;
  }
  if (done < count) {
    const size_t width = src_type == DataType::kFloat32 ? 4 : 2;
    ScalarKernels().to_float(static_cast<const uint8_t*>(src) + done * width, src_type, dst + done,
                             count - done, accumulate);
  }
}

// numeric::FloatToBf16 of 8 lanes, as 8 uint16 in the low 128 bits.
inline __m128i FloatToBf16x8(__m256 v) {
  const __m256i x = _mm256_castps_si256(v);
  const __m256i hi = _mm256_srli_epi32(x, 16);
  const __m256i rounded =
      _mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(x, _mm256_set1_epi32(0x7fff)),
                                         _mm256_and_si256(hi, _mm256_set1_epi32(1))),
                        16);
  const __m256i is_nan = _mm256_cmpgt_epi32(_mm256_and_si256(x, _mm256_set1_epi32(0x7fffffff)),
                                            _mm256_set1_epi32(0x7f800000));
  const __m256i r =
      _mm256_blendv_epi8(rounded, _mm256_or_si256(hi, _mm256_set1_epi32(0x40)), is_nan);
  const __m256i packed =
      _mm256_permute4x64_epi64(_mm256_packus_epi32(r, r), _MM_SHUFFLE(3, 1, 2, 0));
  return _mm256_castsi256_si128(packed);
}

void FromFloat(const float* src, void* dst, DataType dst_type, size_t count) {
  auto* out = static_cast<uint8_t*>(dst);
  size_t i = 0;
  if (dst_type == DataType::kFloat32) {
    if (count != 0) std::memmove(out, src, count * sizeof(float));
    return;
  }
  for (; i + 8 <= count; i += 8) {
    const __m256 v = _mm256_loadu_ps(src + i);
    const __m128i h = dst_type == DataType::kBfloat16
                          ? FloatToBf16x8(v)
                          : _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + 2 * i), h);
  }
  if (i < count) ScalarKernels().from_float(src + i, out + 2 * i, dst_type, count - i);
}

}  // namespace

const KernelTable& Avx2Kernels() noexcept {
  static constexpr KernelTable kTable = {
      {Quantize<LossyKind::kInt8>, Quantize<LossyKind::kInt4>, Quantize<LossyKind::kFp8>},
      {Dequantize<LossyKind::kInt8>, Dequantize<LossyKind::kInt4>, Dequantize<LossyKind::kFp8>},
      ToFloat,
      FromFloat,
  };
  return kTable;
}

}  // namespace strait::codec_internal

// AVX-512 (F, BW, VL, DQ) kernels: the arithmetic of kernels_scalar.cc, sixteen lanes at a time,
// producing byte-identical codes, scales and residuals. Called only where
// DetectIsa() >= kAvx512.
//
// The structure and the reasons for bit-identity are those of kernels_avx2.cc: full blocks are
// vectorised in two passes (absmax as an integer max of |c| bits, then quantize), the last
// partial block goes through the scalar reference, every fp32 operation is the same single IEEE
// operation, rounding uses MXCSR like nearbyint (_mm512_cvtps_epi32) or rounds down
// (roundscale to -inf), and fp8 e4m3 uses numeric.h's integer formulas. No gathers: e4m3 is
// decoded arithmetically. This file deliberately calls no inline function of numeric.h or rng.h:
// see kernels_common.h.

// GCC 12.2's AVX-512 intrinsics initialise their "undefined" vectors from themselves, which
// -Wmaybe-uninitialized reports at every use (GCC bug 105593, fixed in 12.3 and 13).
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

#include <immintrin.h>

#include <cstring>

#include "codec/kernels.h"
#include "codec/kernels_common.h"

namespace strait::codec_internal {
namespace {

template <DataType kType>
inline __m512 Load16(const void* src, size_t i) {
  const auto* bytes = static_cast<const uint8_t*>(src);
  if constexpr (kType == DataType::kFloat32) {
    return _mm512_loadu_ps(bytes + 4 * i);
  } else {
    const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(bytes + 2 * i));
    if constexpr (kType == DataType::kFloat16) {
      return _mm512_cvtph_ps(h);
    } else {
      return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
    }
  }
}

template <DataType kType, bool kResidual>
inline __m512 LoadC(const void* src, const float* residual, size_t i) {
  __m512 c = Load16<kType>(src, i);
  if constexpr (kResidual) c = _mm512_add_ps(c, _mm512_loadu_ps(residual + i));
  return c;
}

inline __m512i AbsBits(__m512 c) {
  return _mm512_and_si512(_mm512_castps_si512(c), _mm512_set1_epi32(0x7fffffff));
}

inline __m512i Mix32(__m512i h) {
  h = _mm512_xor_si512(h, _mm512_srli_epi32(h, 16));
  h = _mm512_mullo_epi32(h, _mm512_set1_epi32(static_cast<int>(rng::kMixMul1)));
  h = _mm512_xor_si512(h, _mm512_srli_epi32(h, 13));
  h = _mm512_mullo_epi32(h, _mm512_set1_epi32(static_cast<int>(rng::kMixMul2)));
  return _mm512_xor_si512(h, _mm512_srli_epi32(h, 16));
}

// rng::Bits(key, index + lane) for lanes 0..15.
inline __m512i RngBits16(rng::Key key, uint64_t index) {
  const __m512i base_lo = _mm512_set1_epi32(static_cast<int>(static_cast<uint32_t>(index)));
  const __m512i lo = _mm512_add_epi32(
      base_lo, _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15));
  const __mmask16 carry = _mm512_cmplt_epu32_mask(lo, base_lo);
  const __m512i base_hi = _mm512_set1_epi32(static_cast<int>(static_cast<uint32_t>(index >> 32)));
  const __m512i hi = _mm512_mask_add_epi32(base_hi, carry, base_hi, _mm512_set1_epi32(1));
  __m512i h = Mix32(_mm512_xor_si512(lo, _mm512_set1_epi32(static_cast<int>(key.k0))));
  h = _mm512_xor_si512(_mm512_xor_si512(h, hi), _mm512_set1_epi32(static_cast<int>(key.k1)));
  return Mix32(h);
}

inline __m512 RngUnit(__m512i bits) {
  return _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_srli_epi32(bits, 8)), _mm512_set1_ps(0x1p-24f));
}

inline __m512 Floor(__m512 v) {
  return _mm512_roundscale_ps(v, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
}

// numeric::FloatToE4m3Impl, lane by lane.
template <bool kStochastic>
inline __m512i EncodeE4m3(__m512 v, __m512i bits) {
  const __m512i x = _mm512_castps_si512(v);
  const __m512i sign = _mm512_and_si512(_mm512_srli_epi32(x, 24), _mm512_set1_epi32(0x80));
  const __m512i ax = _mm512_and_si512(x, _mm512_set1_epi32(0x7fffffff));
  const __m512 scaled = _mm512_mul_ps(_mm512_castsi512_ps(ax), _mm512_set1_ps(512.0f));
  __m512i sub;
  __m512i add;
  if constexpr (kStochastic) {
    sub = _mm512_cvttps_epi32(Floor(_mm512_add_ps(scaled, RngUnit(bits))));
    add = _mm512_and_si512(bits, _mm512_set1_epi32(0xfffff));
  } else {
    sub = _mm512_cvtps_epi32(scaled);
    add = _mm512_add_epi32(_mm512_set1_epi32(0x7ffff),
                           _mm512_and_si512(_mm512_srli_epi32(ax, 20), _mm512_set1_epi32(1)));
  }
  const __m512i xn =
      _mm512_and_si512(_mm512_add_epi32(ax, add), _mm512_set1_epi32(static_cast<int>(0xfff00000u)));
  const __m512i norm = _mm512_sub_epi32(_mm512_srli_epi32(xn, 20), _mm512_set1_epi32(960));
  const __mmask16 is_sub = _mm512_cmplt_epi32_mask(ax, _mm512_set1_epi32(0x3c800000));
  const __mmask16 is_sat = _mm512_cmpgt_epi32_mask(ax, _mm512_set1_epi32(0x43dfffff));
  const __mmask16 is_nan = _mm512_cmpgt_epi32_mask(ax, _mm512_set1_epi32(0x7f800000));
  __m512i mag = _mm512_mask_blend_epi32(is_sub, norm, sub);
  mag = _mm512_mask_blend_epi32(is_sat, mag, _mm512_set1_epi32(0x7e));
  mag = _mm512_mask_blend_epi32(is_nan, mag, _mm512_set1_epi32(0x7f));
  return _mm512_or_si512(mag, sign);
}

// numeric::E4m3ToFloat of codes 0..255 held in int32 lanes.
inline __m512 DecodeE4m3(__m512i code) {
  const __m512i mag = _mm512_and_si512(code, _mm512_set1_epi32(0x7f));
  const __m512i sign = _mm512_slli_epi32(_mm512_and_si512(code, _mm512_set1_epi32(0x80)), 24);
  const __m512i normal = _mm512_add_epi32(_mm512_slli_epi32(mag, 20), _mm512_set1_epi32(120 << 23));
  const __m512i sub = _mm512_castps_si512(_mm512_mul_ps(
      _mm512_cvtepi32_ps(_mm512_and_si512(mag, _mm512_set1_epi32(7))), _mm512_set1_ps(0x1p-9f)));
  __m512i r =
      _mm512_mask_blend_epi32(_mm512_cmplt_epi32_mask(mag, _mm512_set1_epi32(8)), normal, sub);
  r = _mm512_mask_blend_epi32(_mm512_cmpeq_epi32_mask(mag, _mm512_set1_epi32(0x7f)), r,
                              _mm512_set1_epi32(0x7fc00000));
  return _mm512_castsi512_ps(_mm512_or_si512(r, sign));
}

template <LossyKind kKind, bool kStochastic>
inline __m512i Encode(__m512 v, __m512i bits) {
  if constexpr (kKind == LossyKind::kFp8) {
    return EncodeE4m3<kStochastic>(v, bits);
  } else {
    __m512i q;
    if constexpr (kStochastic) {
      q = _mm512_cvttps_epi32(Floor(_mm512_add_ps(v, RngUnit(bits))));
    } else {
      q = _mm512_cvtps_epi32(v);
    }
    constexpr int kQ = static_cast<int>(kQmax<kKind>);
    return _mm512_min_epi32(_mm512_max_epi32(q, _mm512_set1_epi32(-kQ)), _mm512_set1_epi32(kQ));
  }
}

template <LossyKind kKind>
inline __m512 Decode(__m512i q) {
  if constexpr (kKind == LossyKind::kFp8) {
    return DecodeE4m3(q);
  } else {
    return _mm512_cvtepi32_ps(q);
  }
}

// Stores the codes of 16 consecutive elements starting at element j (a multiple of 16).
template <LossyKind kKind>
inline void StoreCodes16(uint8_t* codes, size_t j, __m512i q) {
  if constexpr (kKind == LossyKind::kInt4) {
    // In each 64-bit lane, element 2k is in bits 0..31 and 2k+1 in bits 32..63.
    const __m512i n = _mm512_and_si512(q, _mm512_set1_epi32(0xf));
    const __m512i pair = _mm512_or_si512(n, _mm512_srli_epi64(n, 28));
    _mm_storel_epi64(reinterpret_cast<__m128i*>(codes + j / 2), _mm512_cvtepi64_epi8(pair));
  } else {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(codes + j), _mm512_cvtepi32_epi8(q));
  }
}

// Loads the codes of 16 elements starting at element j (a multiple of 16) as int32 lanes.
template <LossyKind kKind>
inline __m512i LoadCodes16(const uint8_t* codes, size_t j) {
  if constexpr (kKind == LossyKind::kInt4) {
    // Lanes 0..7 take the first 32 bits, lanes 8..15 the next; nibble k of each goes to the top
    // of its lane, then comes back down arithmetically.
    const __m128i w = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(codes + j / 2));
    const __m512i spread =
        _mm512_permutexvar_epi32(_mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1),
                                 _mm512_castsi128_si512(w));
    const __m512i shifted = _mm512_sllv_epi32(
        spread, _mm512_setr_epi32(28, 24, 20, 16, 12, 8, 4, 0, 28, 24, 20, 16, 12, 8, 4, 0));
    return _mm512_srai_epi32(shifted, 28);
  } else {
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(codes + j));
    if constexpr (kKind == LossyKind::kInt8) return _mm512_cvtepi8_epi32(b);
    return _mm512_cvtepu8_epi32(b);
  }
}

inline size_t CodeOffset(LossyKind kind, size_t element) {
  return kind == LossyKind::kInt4 ? element / 2 : element;
}

template <LossyKind kKind, DataType kType, bool kResidual, bool kStochastic>
void QuantizeBlock(const void* src, float* residual, size_t begin, uint32_t block_size,
                   const QuantParams& params, rng::Key key, float* scales, uint8_t* codes) {
  const size_t end = begin + block_size;
  __m512i m0 = _mm512_setzero_si512();
  __m512i m1 = m0;
  for (size_t j = begin; j < end; j += 32) {
    m0 = _mm512_max_epu32(m0, AbsBits(LoadC<kType, kResidual>(src, residual, j)));
    m1 = _mm512_max_epu32(m1, AbsBits(LoadC<kType, kResidual>(src, residual, j + 16)));
  }
  const auto absmax_bits = static_cast<uint32_t>(_mm512_reduce_max_epu32(_mm512_max_epu32(m0, m1)));
  const BlockScale bs = ComputeBlockScale(kKind, absmax_bits);
  std::memcpy(scales + begin / block_size, &bs.scale, sizeof(float));

  if (bs.zero_codes) {
    std::memset(codes + CodeOffset(kKind, begin), 0, CodeOffset(kKind, block_size));
    if constexpr (kResidual) {
      const __m512 x = _mm512_set1_ps(0.0f * bs.scale);  // decode(0) * scale
      for (size_t j = begin; j < end; j += 16) {
        _mm512_storeu_ps(residual + j, _mm512_sub_ps(LoadC<kType, kResidual>(src, residual, j), x));
      }
    }
    return;
  }

  const __m512 inv = _mm512_set1_ps(bs.inv);
  const __m512 scale = _mm512_set1_ps(bs.scale);
  for (size_t j = begin; j < end; j += 16) {
    const __m512 c = LoadC<kType, kResidual>(src, residual, j);
    __m512i bits = _mm512_setzero_si512();
    if constexpr (kStochastic) bits = RngBits16(key, params.index_offset + j);
    const __m512i q = Encode<kKind, kStochastic>(_mm512_mul_ps(c, inv), bits);
    if constexpr (kResidual) {
      _mm512_storeu_ps(residual + j, _mm512_sub_ps(c, _mm512_mul_ps(Decode<kKind>(q), scale)));
    }
    StoreCodes16<kKind>(codes, j, q);
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
    const __m512 scale = _mm512_set1_ps(s);
    for (size_t j = begin; j < begin + block_size; j += 32) {
      __m512 x0 = _mm512_mul_ps(Decode<kKind>(LoadCodes16<kKind>(codes, j)), scale);
      __m512 x1 = _mm512_mul_ps(Decode<kKind>(LoadCodes16<kKind>(codes, j + 16)), scale);
      if constexpr (kAccumulate) {
        x0 = _mm512_add_ps(_mm512_loadu_ps(out + j), x0);
        x1 = _mm512_add_ps(_mm512_loadu_ps(out + j + 16), x1);
      }
      _mm512_storeu_ps(out + j, x0);
      _mm512_storeu_ps(out + j + 16, x1);
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
  for (; i + 16 <= count; i += 16) {
    __m512 x = Load16<kType>(src, i);
    if (accumulate) x = _mm512_add_ps(_mm512_loadu_ps(dst + i), x);
    _mm512_storeu_ps(dst + i, x);
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

// numeric::FloatToBf16 of 16 lanes.
inline __m256i FloatToBf16x16(__m512 v) {
  const __m512i x = _mm512_castps_si512(v);
  const __m512i hi = _mm512_srli_epi32(x, 16);
  const __m512i rounded =
      _mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(x, _mm512_set1_epi32(0x7fff)),
                                         _mm512_and_si512(hi, _mm512_set1_epi32(1))),
                        16);
  const __mmask16 is_nan = _mm512_cmpgt_epi32_mask(
      _mm512_and_si512(x, _mm512_set1_epi32(0x7fffffff)), _mm512_set1_epi32(0x7f800000));
  const __m512i r =
      _mm512_mask_blend_epi32(is_nan, rounded, _mm512_or_si512(hi, _mm512_set1_epi32(0x40)));
  return _mm512_cvtepi32_epi16(r);
}

void FromFloat(const float* src, void* dst, DataType dst_type, size_t count) {
  auto* out = static_cast<uint8_t*>(dst);
  if (dst_type == DataType::kFloat32) {
    if (count != 0) std::memmove(out, src, count * sizeof(float));
    return;
  }
  size_t i = 0;
  for (; i + 16 <= count; i += 16) {
    const __m512 v = _mm512_loadu_ps(src + i);
    const __m256i h = dst_type == DataType::kBfloat16
                          ? FloatToBf16x16(v)
                          : _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + 2 * i), h);
  }
  if (i < count) ScalarKernels().from_float(src + i, out + 2 * i, dst_type, count - i);
}

}  // namespace

const KernelTable& Avx512Kernels() noexcept {
  static constexpr KernelTable kTable = {
      {Quantize<LossyKind::kInt8>, Quantize<LossyKind::kInt4>, Quantize<LossyKind::kFp8>},
      {Dequantize<LossyKind::kInt8>, Dequantize<LossyKind::kInt4>, Dequantize<LossyKind::kFp8>},
      ToFloat,
      FromFloat,
  };
  return kTable;
}

}  // namespace strait::codec_internal

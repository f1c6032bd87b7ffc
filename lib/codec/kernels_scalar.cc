// The scalar reference kernels: block-wise absmax quantization to int8, int4 and fp8 e4m3, its
// inverse, and fp32 <-> float32/bfloat16/float16 conversion. The AVX2 and AVX-512 kernels and the
// CUDA kernels must produce exactly the bytes this file produces, so the arithmetic is kept
// simple and is specified here in full. Every operation is a single IEEE fp32 operation
// (round to nearest even, no FMA contraction: -ffp-contract=off project-wide).
//
// Quantize, per block of block_size elements (the last block may be short):
//   c[i]    = to_float(src[i])                    (+ residual[i], one fp32 add, if residual)
//   absmax  = bits of max over the block of (bits(c[i]) & 0x7fffffff), compared as integers
//             (for |float| the integer order is the value order; inf and NaN are the largest)
//   qmax    = 127 (int8), 7 (int4), 448 (fp8)
//   if absmax is inf/NaN (bits >= 0x7f800000): scale = quiet NaN 0x7fc00000, every code 0
//   else if absmax < 2^-96 (this includes 0):  scale = 0, every code 0
//   else: scale = absmax / qmax, inv = qmax / absmax (fp32 divisions), and for each element
//     v = c * inv
//     int8/int4, nearest:    q = nearbyint(v)               (ties to even)
//     int8/int4, stochastic: q = floor(v + u)               (u = rng::Unit(bits), fp32 add)
//     then q is clamped to [-qmax, qmax];
//     int8 code = (uint8)(int8)q; int4 code = q & 0xf, element 2k in the low nibble of byte k
//     and 2k+1 in the high nibble (across the whole call, not per block; a lone last element
//     leaves the high nibble 0).
//     fp8: code = numeric::FloatToE4m3Impl(v, stochastic, bits & 0xfffff, rng::Unit(bits)).
//   bits = rng::Bits(rng::KeyFromSeed(seed), index_offset + j) for the call's element j.
//   Scales are fp32, little-endian, stored with memcpy (any alignment).
// Dequantize: x = decode(code) * scale, one fp32 multiply, decode = float(q) for int8/int4 and
//   numeric::E4m3ToFloat for fp8. Accumulate: out = out + x (one fp32 add).
// Error feedback: residual = c - x (one fp32 subtract) with x exactly the dequantized value, so
//   what the receiver decodes plus the new residual is c again up to that one rounding.
//   Blocks with every code 0 follow the same rule: x = 0 * scale (0, or NaN for a NaN block).
// Conversions: numeric.h (fp16/bf16 to float exactly; float to fp16/bf16 round to nearest even).
#include <algorithm>
#include <cmath>
#include <cstring>

#include "codec/kernels.h"
#include "codec/kernels_common.h"
#include "codec/numeric.h"
#include "codec/rng.h"

namespace strait::codec_internal {
namespace {

float LoadF32(const void* p) {
  float f;
  std::memcpy(&f, p, sizeof(f));
  return f;
}

void StoreF32(void* p, float f) {
  std::memcpy(p, &f, sizeof(f));
}

uint16_t LoadU16(const void* p) {
  uint16_t v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

// Element i of `src` as fp32 (exact for all three types).
template <DataType kType>
inline float LoadAs(const void* src, size_t i) {
  const auto* bytes = static_cast<const uint8_t*>(src);
  if constexpr (kType == DataType::kBfloat16) {
    return numeric::Bf16ToFloat(LoadU16(bytes + 2 * i));
  } else if constexpr (kType == DataType::kFloat16) {
    return numeric::HalfToFloat(LoadU16(bytes + 2 * i));
  } else {
    return LoadF32(bytes + 4 * i);
  }
}

float LoadAsFloat(const void* src, DataType type, size_t i) {
  switch (type) {
    case DataType::kBfloat16: return LoadAs<DataType::kBfloat16>(src, i);
    case DataType::kFloat16: return LoadAs<DataType::kFloat16>(src, i);
    default: return LoadAs<DataType::kFloat32>(src, i);
  }
}

// nearbyint(v) for |v| < 2^22 without a libm call (baseline x86-64 has no roundss): adding and
// subtracting 1.5 * 2^23 rounds to an integer in the current rounding mode, as nearbyint does.
// Only the sign of a zero result may differ, and callers convert the result to an integer.
inline float NearbyintSmall(float v) {
  constexpr float kMagic = 0x1.8p23f;
  return (v + kMagic) - kMagic;
}

float Qmax(LossyKind kind) {
  switch (kind) {
    case LossyKind::kInt8: return kQmax<LossyKind::kInt8>;
    case LossyKind::kInt4: return kQmax<LossyKind::kInt4>;
    default: return kQmax<LossyKind::kFp8>;
  }
}

// The code of one element (int8 byte, int4 nibble, or e4m3 byte) for v = c * inv.
template <LossyKind kKind>
inline uint8_t EncodeValue(float v, bool stochastic, uint32_t bits) {
  if constexpr (kKind == LossyKind::kFp8) {
    return numeric::FloatToE4m3Impl(v, stochastic, bits & 0xfffffu, rng::Unit(bits));
  } else {
    constexpr float kQ = kQmax<kKind>;
    float q = stochastic ? std::floor(v + rng::Unit(bits)) : NearbyintSmall(v);
    q = std::min(std::max(q, -kQ), kQ);
    const auto code = static_cast<uint8_t>(static_cast<int8_t>(q));
    return kKind == LossyKind::kInt4 ? static_cast<uint8_t>(code & 0xfu) : code;
  }
}

// decode(code): the value before the multiply by the scale.
template <LossyKind kKind>
inline float DecodeValue(uint8_t code) {
  if constexpr (kKind == LossyKind::kInt8) {
    return static_cast<float>(static_cast<int8_t>(code));
  } else if constexpr (kKind == LossyKind::kInt4) {
    // Sign-extend the nibble.
    return static_cast<float>(static_cast<int>((code & 0xfu) ^ 0x8u) - 8);
  } else {
    return numeric::E4m3ToFloat(code);
  }
}

template <LossyKind kKind>
inline uint8_t LoadCode(const uint8_t* codes, size_t j) {
  if constexpr (kKind != LossyKind::kInt4) return codes[j];
  return static_cast<uint8_t>((codes[j / 2] >> (4 * (j & 1))) & 0xfu);
}

template <LossyKind kKind>
inline void StoreCode(uint8_t* codes, size_t j, uint8_t code) {
  if constexpr (kKind != LossyKind::kInt4) {
    codes[j] = code;
  } else if ((j & 1) == 0) {
    codes[j / 2] = code;  // the high nibble is 0 until element j + 1 sets it
  } else {
    codes[j / 2] = static_cast<uint8_t>(codes[j / 2] | (code << 4));
  }
}

template <LossyKind kKind, DataType kType>
void QuantizeBlock(const void* src, float* residual, size_t begin, size_t n,
                   const QuantParams& params, float* scales, uint8_t* codes) {
  // Pass 1: absmax of the compensated input.
  uint32_t absmax_bits = 0;
  for (size_t i = begin; i < begin + n; ++i) {
    float c = LoadAs<kType>(src, i);
    if (residual != nullptr) c = c + LoadF32(residual + i);
    absmax_bits = std::max(absmax_bits, numeric::FloatBits(c) & kAbsMaskBits);
  }
  const BlockScale bs = ComputeBlockScale(kKind, absmax_bits);
  StoreF32(scales + begin / params.block_size, bs.scale);

  // Pass 2: codes and residuals. c is recomputed exactly as in pass 1.
  const bool stochastic = params.rounding == Rounding::kStochastic;
  const rng::Key key = rng::KeyFromSeed(params.seed);
  for (size_t i = begin; i < begin + n; ++i) {
    uint8_t code = 0;
    float c = 0.0f;
    if (!bs.zero_codes || residual != nullptr) {
      c = LoadAs<kType>(src, i);
      if (residual != nullptr) c = c + LoadF32(residual + i);
    }
    if (!bs.zero_codes) {
      const uint32_t bits = stochastic ? rng::Bits(key, params.index_offset + i) : 0u;
      code = EncodeValue<kKind>(c * bs.inv, stochastic, bits);
    }
    StoreCode<kKind>(codes, i, code);
    if (residual != nullptr) {
      const float x = DecodeValue<kKind>(code) * bs.scale;
      StoreF32(residual + i, c - x);
    }
  }
}

template <LossyKind kKind>
void QuantizeBlockForKind(const void* src, DataType src_type, float* residual, size_t begin,
                          size_t n, const QuantParams& params, float* scales, uint8_t* codes) {
  switch (src_type) {
    case DataType::kBfloat16:
      QuantizeBlock<kKind, DataType::kBfloat16>(src, residual, begin, n, params, scales, codes);
      break;
    case DataType::kFloat16:
      QuantizeBlock<kKind, DataType::kFloat16>(src, residual, begin, n, params, scales, codes);
      break;
    default:
      QuantizeBlock<kKind, DataType::kFloat32>(src, residual, begin, n, params, scales, codes);
      break;
  }
}

template <LossyKind kKind>
void DequantizeBlock(const float* scales, const uint8_t* codes, size_t begin, size_t n,
                     uint32_t block_size, float* out, bool accumulate) {
  const float scale = LoadF32(scales + begin / block_size);
  for (size_t i = begin; i < begin + n; ++i) {
    float x = DecodeValue<kKind>(LoadCode<kKind>(codes, i)) * scale;
    if (accumulate) x = LoadF32(out + i) + x;
    StoreF32(out + i, x);
  }
}

void QuantizeScalar(LossyKind kind, const void* src, DataType src_type, float* residual,
                    size_t count, const QuantParams& params, float* scales, uint8_t* codes) {
  for (size_t begin = 0; begin < count; begin += params.block_size) {
    const size_t n = std::min<size_t>(params.block_size, count - begin);
    QuantizeBlockRef(kind, src, src_type, residual, begin, n, params, scales, codes);
  }
}

template <LossyKind kKind>
void QuantizeKind(const void* src, DataType src_type, float* residual, size_t count,
                  const QuantParams& params, float* scales, uint8_t* codes) {
  QuantizeScalar(kKind, src, src_type, residual, count, params, scales, codes);
}

template <LossyKind kKind>
void DequantizeKind(const float* scales, const uint8_t* codes, size_t count, uint32_t block_size,
                    float* out, bool accumulate) {
  for (size_t begin = 0; begin < count; begin += block_size) {
    const size_t n = std::min<size_t>(block_size, count - begin);
    DequantizeBlockRef(kKind, scales, codes, begin, n, block_size, out, accumulate);
  }
}

void ToFloatScalar(const void* src, DataType src_type, float* dst, size_t count, bool accumulate) {
  for (size_t i = 0; i < count; ++i) {
    float x = LoadAsFloat(src, src_type, i);
    if (accumulate) x = LoadF32(dst + i) + x;
    StoreF32(dst + i, x);
  }
}

void FromFloatScalar(const float* src, void* dst, DataType dst_type, size_t count) {
  auto* out = static_cast<uint8_t*>(dst);
  for (size_t i = 0; i < count; ++i) {
    const float x = LoadF32(src + i);
    if (dst_type == DataType::kFloat32) {
      StoreF32(out + 4 * i, x);
      continue;
    }
    const uint16_t h =
        dst_type == DataType::kBfloat16 ? numeric::FloatToBf16(x) : numeric::FloatToHalf(x);
    std::memcpy(out + 2 * i, &h, sizeof(h));
  }
}

}  // namespace

BlockScale ComputeBlockScale(LossyKind kind, uint32_t absmax_bits) noexcept {
  if (absmax_bits >= kNonFiniteBits) return {numeric::BitsFloat(kNanScaleBits), 0.0f, true};
  if (absmax_bits < kMinAbsmaxBits) return {0.0f, 0.0f, true};
  const float absmax = numeric::BitsFloat(absmax_bits);
  const float qmax = Qmax(kind);
  return {absmax / qmax, qmax / absmax, false};
}

rng::Key RngKeyFor(uint64_t seed) noexcept {
  return rng::KeyFromSeed(seed);
}

void QuantizeBlockRef(LossyKind kind, const void* src, DataType src_type, float* residual,
                      size_t begin, size_t n, const QuantParams& params, float* scales,
                      uint8_t* codes) noexcept {
  switch (kind) {
    case LossyKind::kInt8:
      QuantizeBlockForKind<LossyKind::kInt8>(src, src_type, residual, begin, n, params, scales,
                                             codes);
      break;
    case LossyKind::kInt4:
      QuantizeBlockForKind<LossyKind::kInt4>(src, src_type, residual, begin, n, params, scales,
                                             codes);
      break;
    case LossyKind::kFp8:
      QuantizeBlockForKind<LossyKind::kFp8>(src, src_type, residual, begin, n, params, scales,
                                            codes);
      break;
  }
}

void DequantizeBlockRef(LossyKind kind, const float* scales, const uint8_t* codes, size_t begin,
                        size_t n, uint32_t block_size, float* out, bool accumulate) noexcept {
  switch (kind) {
    case LossyKind::kInt8:
      DequantizeBlock<LossyKind::kInt8>(scales, codes, begin, n, block_size, out, accumulate);
      break;
    case LossyKind::kInt4:
      DequantizeBlock<LossyKind::kInt4>(scales, codes, begin, n, block_size, out, accumulate);
      break;
    case LossyKind::kFp8:
      DequantizeBlock<LossyKind::kFp8>(scales, codes, begin, n, block_size, out, accumulate);
      break;
  }
}

const KernelTable& ScalarKernels() noexcept {
  static constexpr KernelTable kTable = {
      {QuantizeKind<LossyKind::kInt8>, QuantizeKind<LossyKind::kInt4>,
       QuantizeKind<LossyKind::kFp8>},
      {DequantizeKind<LossyKind::kInt8>, DequantizeKind<LossyKind::kInt4>,
       DequantizeKind<LossyKind::kFp8>},
      ToFloatScalar,
      FromFloatScalar,
  };
  return kTable;
}

}  // namespace strait::codec_internal

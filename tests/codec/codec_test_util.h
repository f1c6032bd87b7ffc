// Shared helpers for the codec frame tests: deterministic inputs of every dtype, unaligned
// copies, and readers for the fields and scales of an encoded frame.
#ifndef STRAIT_TESTS_CODEC_CODEC_TEST_UTIL_H_
#define STRAIT_TESTS_CODEC_CODEC_TEST_UTIL_H_

#include <cstdint>
#include <cstring>
#include <random>
#include <span>
#include <vector>

#include "codec/kernels.h"
#include "codec/numeric.h"
#include "strait/codec.h"
#include "strait/types.h"

namespace strait::testing_util {

inline std::vector<DataType> AllDataTypes() {
  std::vector<DataType> all;
  for (int i = 0; i < kNumDataTypes; ++i) all.push_back(static_cast<DataType>(i));
  return all;
}

inline std::vector<DataType> FloatDataTypes() {
  return {DataType::kFloat32, DataType::kBfloat16, DataType::kFloat16};
}

// Gradient-like values: normal(0, sigma), with a few larger outliers.
inline std::vector<float> GradientLike(size_t n, uint64_t seed, float sigma = 1e-3f) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, sigma);
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = normal(rng) * ((i % 97 == 5) ? 30.0f : 1.0f);
  return v;
}

// `n` elements of `dtype` as bytes: gradient-like values for the float types, random bytes for
// the rest.
inline std::vector<uint8_t> MakeInput(DataType dtype, size_t n, uint64_t seed) {
  const size_t size = DataTypeSize(dtype);
  std::vector<uint8_t> bytes(n * size);
  if (dtype == DataType::kFloat32 || dtype == DataType::kBfloat16 || dtype == DataType::kFloat16) {
    const std::vector<float> v = GradientLike(n, seed);
    for (size_t i = 0; i < n; ++i) {
      if (dtype == DataType::kFloat32) {
        std::memcpy(&bytes[4 * i], &v[i], 4);
      } else {
        const uint16_t h =
            dtype == DataType::kBfloat16 ? numeric::FloatToBf16(v[i]) : numeric::FloatToHalf(v[i]);
        std::memcpy(&bytes[2 * i], &h, 2);
      }
    }
  } else {
    std::mt19937_64 rng(seed);
    // Low-entropy high bytes, as real integer tensors have, so zstd has something to find.
    for (size_t i = 0; i < bytes.size(); ++i) {
      bytes[i] = static_cast<uint8_t>((i % size == 0) ? rng() : (rng() % 3));
    }
  }
  return bytes;
}

// Element i of a float32/bfloat16/float16 buffer, as fp32.
inline float ElementAsFloat(const uint8_t* bytes, DataType dtype, size_t i) {
  if (dtype == DataType::kFloat32) {
    float f;
    std::memcpy(&f, bytes + 4 * i, 4);
    return f;
  }
  uint16_t h;
  std::memcpy(&h, bytes + 2 * i, 2);
  return dtype == DataType::kBfloat16 ? numeric::Bf16ToFloat(h) : numeric::HalfToFloat(h);
}

// A copy of `bytes` that starts `offset` bytes past an aligned address, for unaligned-pointer
// tests. The returned span points into `storage`.
inline std::span<uint8_t> Misaligned(std::span<const uint8_t> bytes, size_t offset,
                                     std::vector<uint8_t>* storage) {
  storage->assign(bytes.size() + offset + 64, 0xA5);
  const auto base = reinterpret_cast<uintptr_t>(storage->data());
  const size_t skip = ((64 - base % 64) % 64) + offset;
  if (!bytes.empty()) std::memcpy(storage->data() + skip, bytes.data(), bytes.size());
  return std::span<uint8_t>(storage->data() + skip, bytes.size());
}

inline uint64_t LoadU64(const uint8_t* p) {
  uint64_t v;
  std::memcpy(&v, p, 8);
  return v;
}

inline codec_internal::LossyKind KindOf(CodecId codec) {
  return codec == CodecId::kInt4      ? codec_internal::LossyKind::kInt4
         : codec == CodecId::kFp8E4M3 ? codec_internal::LossyKind::kFp8
                                      : codec_internal::LossyKind::kInt8;
}

// The scales of an uncompressed (not chained) lossy frame.
inline std::vector<float> FrameScales(std::span<const uint8_t> frame, size_t count,
                                      uint32_t block_size) {
  std::vector<float> scales(codec_internal::ScaleCount(count, block_size));
  if (!scales.empty()) {
    std::memcpy(scales.data(), frame.data() + kFrameHeaderSize, scales.size() * sizeof(float));
  }
  return scales;
}

inline bool SameBits(float a, float b) {
  uint32_t x;
  uint32_t y;
  std::memcpy(&x, &a, 4);
  std::memcpy(&y, &b, 4);
  return x == y;
}

}  // namespace strait::testing_util

#endif  // STRAIT_TESTS_CODEC_CODEC_TEST_UTIL_H_

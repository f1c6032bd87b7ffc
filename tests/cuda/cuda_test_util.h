// Shared by the GPU-kernel tests (quant_math_test.cc on the CPU, kernels_test.cc on a GPU): test
// inputs that put every kind of block in every size (zeros, inf, NaN, subnormals, values around
// the 2^-96 cut-off, exact rounding ties, ordinary data of varied magnitude), error-feedback
// residuals, and the CPU codec's scalar reference results to compare against.
#ifndef STRAIT_TESTS_CUDA_CUDA_TEST_UTIL_H_
#define STRAIT_TESTS_CUDA_CUDA_TEST_UTIL_H_

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "codec/kernels.h"
#include "codec/numeric.h"
#include "strait/codec.h"
#include "strait/types.h"

namespace strait::cuda_test {

namespace ci = codec_internal;

inline constexpr CodecId kLossyCodecs[] = {CodecId::kInt8, CodecId::kInt4, CodecId::kFp8E4M3};
inline constexpr DataType kFloatTypes[] = {DataType::kFloat32, DataType::kBfloat16,
                                           DataType::kFloat16};
inline constexpr Rounding kRoundings[] = {Rounding::kNearest, Rounding::kStochastic};
// Odd sizes: a lone element, partial first blocks, block boundaries +-1, many blocks with a
// ragged end (4097 = 16 blocks of 256 + 1: int4 then has a lone last nibble; 9001 ends in a
// partial block of 4096).
inline constexpr size_t kSizes[] = {1, 7, 31, 33, 255, 256, 257, 1000, 4097, 9001};

inline ci::LossyKind KindOf(CodecId codec) {
  return codec == CodecId::kInt4      ? ci::LossyKind::kInt4
         : codec == CodecId::kFp8E4M3 ? ci::LossyKind::kFp8
                                      : ci::LossyKind::kInt8;
}

// Each block gets one of nine patterns, chosen by block index + `pattern`.
inline std::vector<float> MakeInput(size_t count, uint32_t block_size, uint64_t seed, int pattern) {
  std::mt19937_64 gen(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_real_distribution<float> exponent(-3.0f, 3.0f);
  std::vector<float> v(count);
  for (size_t begin = 0; begin < count; begin += block_size) {
    const size_t end = std::min<size_t>(count, begin + block_size);
    const int kind = static_cast<int>((begin / block_size + static_cast<size_t>(pattern)) % 9);
    const float magnitude = std::pow(10.0f, exponent(gen));
    std::uniform_int_distribution<size_t> pos(begin, end - 1);
    for (size_t i = begin; i < end; ++i) {
      switch (kind) {
        case 0: v[i] = (i & 1) ? -0.0f : 0.0f; break;  // zeros of both signs
        case 3: v[i] = normal(gen) * 1e-39f; break;    // fp32 subnormals
        case 4: v[i] = normal(gen) * 1e-30f; break;    // below 2^-96
        case 5: v[i] = normal(gen) * 1e-28f; break;    // just above it
        case 6:                                        // int8 ties (inv == 1)
          v[i] = static_cast<float>(static_cast<int>(normal(gen) * 60.0f)) * 0.5f;
          break;
        default: v[i] = normal(gen) * magnitude; break;
      }
    }
    if (kind == 1) {
      v[pos(gen)] = (gen() & 1) ? std::numeric_limits<float>::infinity()
                                : -std::numeric_limits<float>::infinity();
    }
    if (kind == 2) v[pos(gen)] = (gen() & 1) ? std::nanf("") : -std::nanf("0x123");
    if (kind == 6) v[begin] = 127.0f;
  }
  return v;
}

// A residual as error feedback leaves it: small against the input, some blocks exactly zero.
inline std::vector<float> MakeResidual(const std::vector<float>& input, uint32_t block_size,
                                       uint64_t seed) {
  std::mt19937_64 gen(seed);
  std::uniform_real_distribution<float> u(-0.05f, 0.05f);
  std::vector<float> r(input.size());
  for (size_t i = 0; i < input.size(); ++i) {
    const bool zero_block = (i / block_size) % 4 == 1;
    r[i] = zero_block || !std::isfinite(input[i]) ? 0.0f : u(gen) * std::fabs(input[i]);
  }
  return r;
}

// `values` stored as `type` (float16/bfloat16 rounded to nearest even).
inline std::vector<uint8_t> StoreAs(const std::vector<float>& values, DataType type) {
  const size_t size = DataTypeSize(type);
  std::vector<uint8_t> out(values.size() * size);
  for (size_t i = 0; i < values.size(); ++i) {
    if (type == DataType::kFloat32) {
      std::memcpy(out.data() + 4 * i, &values[i], 4);
    } else {
      const uint16_t h = type == DataType::kBfloat16 ? numeric::FloatToBf16(values[i])
                                                     : numeric::FloatToHalf(values[i]);
      std::memcpy(out.data() + 2 * i, &h, 2);
    }
  }
  return out;
}

inline std::vector<uint8_t> Bytes(const std::vector<float>& v) {
  std::vector<uint8_t> out(v.size() * sizeof(float));
  if (!v.empty()) std::memcpy(out.data(), v.data(), out.size());
  return out;
}

// The CPU codec's scalar reference: the stage (scales then codes) and, with `residual`, the
// updated residual in place.
inline std::vector<uint8_t> ReferenceStage(CodecId codec, DataType type,
                                           const std::vector<uint8_t>& src, float* residual,
                                           size_t count, const ci::QuantParams& params) {
  const ci::LossyKind kind = KindOf(codec);
  const size_t scales = ci::ScaleCount(count, params.block_size);
  std::vector<float> sc(scales);
  std::vector<uint8_t> stage(ci::LossyStageSize(kind, count, params.block_size));
  if (count == 0) return stage;
  ci::ScalarKernels().quantize[static_cast<int>(kind)](src.data(), type, residual, count, params,
                                                       sc.data(), stage.data() + scales * 4);
  std::memcpy(stage.data(), sc.data(), scales * 4);
  return stage;
}

// The CPU reference dequantize of a stage into fp32 (accumulating into `out` when asked).
inline void ReferenceDequantize(CodecId codec, const std::vector<uint8_t>& stage, size_t count,
                                uint32_t block_size, float* out, bool accumulate) {
  const ci::LossyKind kind = KindOf(codec);
  const size_t scales = ci::ScaleCount(count, block_size);
  std::vector<float> sc(scales);
  if (count == 0) return;
  std::memcpy(sc.data(), stage.data(), scales * 4);
  ci::ScalarKernels().dequantize[static_cast<int>(kind)](sc.data(), stage.data() + scales * 4,
                                                         count, block_size, out, accumulate);
}

// Index of the first element where `a` and `b` differ, or -1. Floats must have the same bits,
// except that any NaN matches any NaN: NaN payloads are not portable (x86 propagates an
// operand's payload and compilers may commute the operands of + and *; CUDA arithmetic gives
// the canonical NaN 0x7fffffff), so they are outside the bit-identity contract. Stage bytes do
// not depend on them: a non-finite block's scale is the constant 0x7fc00000 and its codes 0.
inline long FirstFloatDiff(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return static_cast<long>(std::min(a.size(), b.size()));
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::isnan(a[i]) && std::isnan(b[i])) continue;
    if (numeric::FloatBits(a[i]) != numeric::FloatBits(b[i])) return static_cast<long>(i);
  }
  return -1;
}

// As FirstFloatDiff for `count` elements of `type` stored as bytes.
inline long FirstElementDiff(const std::vector<uint8_t>& a, const std::vector<uint8_t>& b,
                             DataType type) {
  const size_t size = DataTypeSize(type);
  if (a.size() != b.size()) return static_cast<long>(std::min(a.size(), b.size()) / size);
  auto load = [&](const std::vector<uint8_t>& v, size_t i) {
    if (type == DataType::kFloat32) {
      float f;
      std::memcpy(&f, v.data() + 4 * i, 4);
      return f;
    }
    uint16_t h;
    std::memcpy(&h, v.data() + 2 * i, 2);
    return type == DataType::kBfloat16 ? numeric::Bf16ToFloat(h) : numeric::HalfToFloat(h);
  };
  for (size_t i = 0; i < a.size() / size; ++i) {
    if (std::isnan(load(a, i)) && std::isnan(load(b, i))) continue;
    if (std::memcmp(a.data() + i * size, b.data() + i * size, size) != 0) {
      return static_cast<long>(i);
    }
  }
  return -1;
}

inline std::string CaseName(CodecId codec, DataType type, Rounding rounding, size_t count,
                            uint32_t block_size, bool feedback) {
  return std::string(CodecName(codec)) + "/" + DataTypeName(type) + "/" +
         (rounding == Rounding::kStochastic ? "stochastic" : "nearest") +
         "/n=" + std::to_string(count) + "/block=" + std::to_string(block_size) +
         (feedback ? "/ef" : "/no-ef");
}

}  // namespace strait::cuda_test

#endif  // STRAIT_TESTS_CUDA_CUDA_TEST_UTIL_H_

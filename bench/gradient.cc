// Gradient-like data generator: see gradient.h for the shape of the data and why it matters.
#include "bench/gradient.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>

#include "strait/codec.h"

namespace strait::bench {
namespace {

constexpr uint64_t kGolden = 0x9E3779B97F4A7C15ull;

// splitmix64's output function: a strong 64-bit mix, so Mix64(key + i * golden) is a
// counter-based generator; element i's draw depends only on (seed, i).
inline uint64_t Mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// Four 12-bit uniforms summed (Irwin-Hall, n = 4) are close enough to normal for data whose
// tails come from the explicit outliers anyway, and cost no libm call.
constexpr float kSumMean = 4.0f * 4095.0f / 2.0f;
// Standard deviation of the sum of four uniform integers in [0, 4095]: sqrt(4 (4096^2 - 1) / 12).
constexpr float kInvSumStd = 1.0f / 2364.5f;

constexpr uint32_t kZeroEvents = 512;   // of 65536: about 1 in 128 is exactly zero
constexpr uint32_t kOutlierEvents = 8;  // of 65536: about 1 in 8192 is an outlier
constexpr uint64_t kMinLayer = 128 * 1024;
constexpr uint64_t kLayerSpread = 640 * 1024;  // layers hold 128K..768K elements

struct Layer {
  uint64_t length;
  float scale;
};

Layer MakeLayer(uint64_t seed, uint64_t index) {
  const uint64_t r = Mix64(Mix64(seed ^ 0x6C61796572ull) + (index + 1) * kGolden);
  const int exponent = static_cast<int>(r % 6) - 3;                       // -3..2
  const float mantissa = 1.0f + static_cast<float>((r >> 8) & 7) / 8.0f;  // 1..1.875
  // ldexp by a small power of two is exact, so the scale is the same everywhere.
  return Layer{kMinLayer + (r >> 16) % (kLayerSpread + 1), std::ldexp(1e-3f * mantissa, exponent)};
}

}  // namespace

void FillGradient(uint64_t seed, std::span<float> out) {
  const uint64_t key = Mix64(seed);
  uint64_t layer_index = 0;
  size_t i = 0;
  while (i < out.size()) {
    const Layer layer = MakeLayer(seed, layer_index++);
    const size_t end = static_cast<size_t>(std::min<uint64_t>(out.size(), i + layer.length));
    for (; i < end; ++i) {
      const uint64_t r = Mix64(key + (static_cast<uint64_t>(i) + 1) * kGolden);
      const auto sum = static_cast<float>((r & 0xFFF) + ((r >> 12) & 0xFFF) + ((r >> 24) & 0xFFF) +
                                          ((r >> 36) & 0xFFF));
      const auto event = static_cast<uint32_t>(r >> 48);
      float v;
      if (event < kZeroEvents) {
        v = 0.0f;
      } else if (event >= 65536 - kOutlierEvents) {
        // Heavy tail: 10..100 x the layer scale, skewed towards the small end.
        const uint64_t r2 = Mix64(r);
        const float u = static_cast<float>(r2 >> 40) * (1.0f / 16777216.0f);
        const float magnitude = (10.0f + 90.0f * (u * u)) * layer.scale;
        v = (r2 & 1) != 0 ? -magnitude : magnitude;
      } else {
        v = ((sum - kSumMean) * kInvSumStd) * layer.scale;
      }
      out[i] = v;
    }
  }
}

std::vector<float> MakeGradient(size_t count, uint64_t seed) {
  std::vector<float> out(count);
  FillGradient(seed, out);
  return out;
}

Status ConvertGradient(std::span<const float> src, DataType dtype, void* dst) {
  if (!IsLossyCodableType(dtype)) {
    return InvalidArgumentError(std::string("gradient data type ") + DataTypeName(dtype) +
                                " is not one of float32, bfloat16, float16");
  }
  if (src.empty()) return Status::Ok();
  if (dtype == DataType::kFloat32) {
    std::memcpy(dst, src.data(), src.size_bytes());
    return Status::Ok();
  }
  return ConvertFromFloat(src.data(), dst, dtype, src.size());
}

StatusOr<std::vector<uint8_t>> GradientAs(std::span<const float> src, DataType dtype) {
  std::vector<uint8_t> out(src.size() * DataTypeSize(dtype));
  STRAIT_RETURN_IF_ERROR(ConvertGradient(src, dtype, out.data()));
  return out;
}

}  // namespace strait::bench

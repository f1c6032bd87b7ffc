// Inputs shared by the hierarchical all-reduce tests (hierarchical_test.cc) and the region
// phases' own tests (region_phases_test.cc): one buffer per node, and fp32 conversions.
#ifndef STRAIT_TESTS_COLLECTIVE_HIERARCHICAL_INPUTS_H_
#define STRAIT_TESTS_COLLECTIVE_HIERARCHICAL_INPUTS_H_

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <utility>
#include <vector>

#include "strait/codec.h"
#include "strait/reduce.h"

namespace strait::collective {

using Buffers = std::vector<std::vector<uint8_t>>;  // [region * m + gateway]

inline std::vector<uint8_t> ToBytes(const std::vector<float>& f, DataType dtype) {
  std::vector<uint8_t> b(f.size() * DataTypeSize(dtype));
  EXPECT_TRUE(ConvertFromFloat(f.data(), b.data(), dtype, f.size()).ok());
  return b;
}
inline std::vector<float> ToFloats(const std::vector<uint8_t>& b, DataType dtype) {
  std::vector<float> f(b.size() / DataTypeSize(dtype));
  EXPECT_TRUE(ConvertToFloat(b.data(), dtype, f.data(), f.size()).ok());
  return f;
}

// Node (r, g)'s input: floats of differing magnitudes, or small integers for integer types.
inline Buffers Inputs(int n, int m, size_t count, DataType dtype) {
  Buffers in;
  for (int node = 0; node < n * m; ++node) {
    std::mt19937 gen(977u + static_cast<uint32_t>(node) * 7919u);
    if (IsLossyCodableType(dtype)) {
      std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
      std::vector<float> v(count);
      for (auto& x : v) x = dist(gen) * (1.0f + static_cast<float>(node));
      in.push_back(ToBytes(v, dtype));
    } else {
      EXPECT_EQ(dtype, DataType::kInt32);
      std::uniform_int_distribution<int32_t> dist(-1000, 1000);
      std::vector<int32_t> v(count);
      for (auto& x : v) x = dist(gen);
      std::vector<uint8_t> b(count * 4);
      if (count > 0) std::memcpy(b.data(), v.data(), b.size());
      in.push_back(std::move(b));
    }
  }
  return in;
}

}  // namespace strait::collective

#endif  // STRAIT_TESTS_COLLECTIVE_HIERARCHICAL_INPUTS_H_

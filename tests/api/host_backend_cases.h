// The all-reduces the host-backend integration test runs, shared by the test (which computes the
// references) and host_backend_rank (which runs them through the C API): the case list and
// every rank's deterministic input. No library needed: the inputs are exact in their types.
#ifndef STRAIT_TESTS_API_HOST_BACKEND_CASES_H_
#define STRAIT_TESTS_API_HOST_BACKEND_CASES_H_

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "strait/strait.h"

namespace strait::api::testing {

struct Case {
  strait_datatype_t dtype;
  strait_redop_t op;
  size_t count;
  bool in_place;
  const char* key;  // nullptr: strait_allreduce (derived key), else strait_allreduce_keyed
};

// Odd counts, both paths (in place and not), sum and max, fp32 and bf16, small and one larger
// than a codec block and an intra-region chunk of several shards.
inline const std::vector<Case>& Cases() {
  static const std::vector<Case> cases = {
      {STRAIT_FLOAT32, STRAIT_SUM, 1, true, nullptr},
      {STRAIT_FLOAT32, STRAIT_SUM, 1001, false, "grad.a"},
      {STRAIT_FLOAT32, STRAIT_MAX, 777, true, nullptr},
      {STRAIT_BFLOAT16, STRAIT_SUM, 333, false, "grad.b"},
      {STRAIT_BFLOAT16, STRAIT_MAX, 5, true, nullptr},
      {STRAIT_FLOAT32, STRAIT_SUM, 100003, false, "grad.big"},
  };
  return cases;
}

inline uint64_t Mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// Rank (region, rank)'s element i of case c, as a float that the case's dtype holds exactly:
// fp32 values carry 24 significant bits (so sums round, and the order of the reduction shows),
// bf16 values 8.
inline float InputValue(int region, int rank, size_t c, size_t i, strait_datatype_t dtype) {
  const uint64_t h =
      Mix((uint64_t(region) << 56) ^ (uint64_t(rank) << 48) ^ (uint64_t(c) << 40) ^ uint64_t(i));
  if (dtype == STRAIT_BFLOAT16) return static_cast<float>((h >> 56) & 0xff) / 32.0f - 4.0f;
  return static_cast<float>((h >> 40) & 0xffffff) / 2097152.0f - 4.0f;
}

// The input bytes of (region, rank) for case c.
inline std::vector<uint8_t> InputBytes(int region, int rank, size_t c) {
  const Case& k = Cases()[c];
  const size_t elem = k.dtype == STRAIT_BFLOAT16 ? 2 : 4;
  std::vector<uint8_t> out(k.count * elem);
  for (size_t i = 0; i < k.count; ++i) {
    const float v = InputValue(region, rank, c, i, k.dtype);
    uint32_t bits = 0;
    std::memcpy(&bits, &v, 4);
    if (k.dtype == STRAIT_BFLOAT16) {
      const uint16_t b = static_cast<uint16_t>(bits >> 16);  // exact: the low bits are zero
      std::memcpy(&out[i * 2], &b, 2);
    } else {
      std::memcpy(&out[i * 4], &bits, 4);
    }
  }
  return out;
}

}  // namespace strait::api::testing

#endif  // STRAIT_TESTS_API_HOST_BACKEND_CASES_H_

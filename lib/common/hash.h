// Stable hashes: the same value on every machine and build (std::hash promises neither), for
// what crosses processes or is pinned by tests: operation ids, job lanes, handle checksums,
// CollNet comm ids, result fingerprints, stochastic-rounding seeds. Not for security.
#ifndef STRAIT_LIB_COMMON_HASH_H_
#define STRAIT_LIB_COMMON_HASH_H_

#include <cstddef>
#include <cstdint>

namespace strait {

inline constexpr uint64_t kFnv1a64Offset = 0xcbf29ce484222325ull;

// FNV-1a, 64 bits, continuing from `h` (chain calls to hash several fields).
inline uint64_t Fnv1a64(const void* data, size_t n, uint64_t h = kFnv1a64Offset) {
  const auto* p = static_cast<const uint8_t*>(data);
  for (size_t i = 0; i < n; ++i) {
    h ^= p[i];
    h *= 0x100000001b3ull;
  }
  return h;
}

// FNV-1a, 32 bits (handle checksums).
inline uint32_t Fnv1a32(const void* data, size_t n) {
  const auto* p = static_cast<const uint8_t*>(data);
  uint32_t h = 2166136261u;
  for (size_t i = 0; i < n; ++i) {
    h ^= p[i];
    h *= 16777619u;
  }
  return h;
}

// splitmix64's step and finaliser: nearby inputs give unrelated outputs.
inline constexpr uint64_t Mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

}  // namespace strait

#endif  // STRAIT_LIB_COMMON_HASH_H_

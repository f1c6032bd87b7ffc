// Little-endian loads and stores for Strait's wire formats. Every integer that Strait puts on a
// wire or into an opaque handle (stream records, collective headers, the NCCL listen handle, the
// local protocol's frames, policy and tunnel messages) is little-endian whatever the host, so
// these helpers are the one place that knows how to write and read them.
//
// Use the fixed-width PutU16/PutU32/PutU64 and GetU16/GetU32/GetU64 for fields whose width is a
// type, and PutLe/GetLe/AppendLe for fields whose width is a number in a table or a parser (up
// to 8 bytes). The pointers need no alignment. All of them are constexpr and usable in constant
// expressions; at run time a little-endian host does the fixed-width ones with one memcpy, which
// compilers turn into a single load or store, and any other host shifts byte by byte.
// Header-only; it depends on nothing but the C++ library, so every module (and the NCCL plugin)
// may include it.
#ifndef STRAIT_LIB_COMMON_ENDIAN_H_
#define STRAIT_LIB_COMMON_ENDIAN_H_

#include <bit>
#include <cassert>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

namespace strait {
namespace endian_internal {

template <typename T>
constexpr void StoreLe(uint8_t* p, T v) noexcept {
  static_assert(std::is_unsigned_v<T>, "wire integers are unsigned");
  // memcpy is not constexpr: constant evaluation takes the portable path.
  if (!std::is_constant_evaluated() && std::endian::native == std::endian::little) {
    std::memcpy(p, &v, sizeof(T));
    return;
  }
  for (size_t i = 0; i < sizeof(T); ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
}

template <typename T>
constexpr T LoadLe(const uint8_t* p) noexcept {
  static_assert(std::is_unsigned_v<T>, "wire integers are unsigned");
  T v{};
  if (!std::is_constant_evaluated() && std::endian::native == std::endian::little) {
    std::memcpy(&v, p, sizeof(T));
    return v;
  }
  for (size_t i = 0; i < sizeof(T); ++i) v = static_cast<T>(v | (T{p[i]} << (8 * i)));
  return v;
}

}  // namespace endian_internal

// Fixed-width stores: write `v` into p[0..N) least significant byte first. Never fail.
constexpr void PutU16(uint8_t* p, uint16_t v) noexcept {
  endian_internal::StoreLe(p, v);
}
constexpr void PutU32(uint8_t* p, uint32_t v) noexcept {
  endian_internal::StoreLe(p, v);
}
constexpr void PutU64(uint8_t* p, uint64_t v) noexcept {
  endian_internal::StoreLe(p, v);
}

// Fixed-width loads: read p[0..N) as a little-endian integer. The caller checks the length.
constexpr uint16_t GetU16(const uint8_t* p) noexcept {
  return endian_internal::LoadLe<uint16_t>(p);
}
constexpr uint32_t GetU32(const uint8_t* p) noexcept {
  return endian_internal::LoadLe<uint32_t>(p);
}
constexpr uint64_t GetU64(const uint8_t* p) noexcept {
  return endian_internal::LoadLe<uint64_t>(p);
}

// Variable-width store: the low `n` bytes of `v` (0 <= n <= 8) into p[0..n), least significant
// first; higher bytes of `v` are dropped, as a field of that width cannot carry them.
constexpr void PutLe(uint8_t* p, uint64_t v, size_t n) noexcept {
  assert(n <= 8 && "a little-endian field is at most 8 bytes");
  for (size_t i = 0; i < n; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
}

// Variable-width load: p[0..n) (0 <= n <= 8) as a little-endian integer, zero-extended.
constexpr uint64_t GetLe(const uint8_t* p, size_t n) noexcept {
  assert(n <= 8 && "a little-endian field is at most 8 bytes");
  uint64_t v = 0;
  for (size_t i = 0; i < n; ++i) v |= uint64_t{p[i]} << (8 * i);
  return v;
}

// Appends the low `n` bytes of `v` (0 <= n <= 8) to `out`, least significant first: for
// messages built field by field. May throw std::bad_alloc, like any push_back.
inline void AppendLe(std::vector<uint8_t>* out, uint64_t v, size_t n) {
  assert(n <= 8 && "a little-endian field is at most 8 bytes");
  for (size_t i = 0; i < n; ++i) out->push_back(static_cast<uint8_t>(v >> (8 * i)));
}

}  // namespace strait

#endif  // STRAIT_LIB_COMMON_ENDIAN_H_

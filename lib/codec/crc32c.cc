// CRC-32C: the portable slicing-by-8 implementation and the one-time choice between it and the
// SSE4.2 implementation in crc32c_hw.cc.
#include "codec/crc32c.h"

#include <array>
#include <cstring>

namespace strait {
namespace codec_internal {
namespace {

// The reflected Castagnoli polynomial.
constexpr uint32_t kPoly = 0x82F63B78u;

using Tables = std::array<std::array<uint32_t, 256>, 8>;

constexpr Tables MakeTables() {
  Tables t{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ kPoly : c >> 1;
    t[0][i] = c;
  }
  for (uint32_t i = 0; i < 256; ++i) {
    for (int s = 1; s < 8; ++s) t[s][i] = (t[s - 1][i] >> 8) ^ t[0][t[s - 1][i] & 0xff];
  }
  return t;
}

constexpr Tables kTables = MakeTables();

uint32_t SoftwareRaw(const uint8_t* p, size_t n, uint32_t crc) {
  while (n > 0 && (reinterpret_cast<uintptr_t>(p) & 7) != 0) {
    crc = (crc >> 8) ^ kTables[0][(crc ^ *p++) & 0xff];
    --n;
  }
  while (n >= 8) {
    uint32_t lo;
    uint32_t hi;
    std::memcpy(&lo, p, 4);
    std::memcpy(&hi, p + 4, 4);
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
    lo = __builtin_bswap32(lo);
    hi = __builtin_bswap32(hi);
#endif
    lo ^= crc;
    crc = kTables[7][lo & 0xff] ^ kTables[6][(lo >> 8) & 0xff] ^ kTables[5][(lo >> 16) & 0xff] ^
          kTables[4][lo >> 24] ^ kTables[3][hi & 0xff] ^ kTables[2][(hi >> 8) & 0xff] ^
          kTables[1][(hi >> 16) & 0xff] ^ kTables[0][hi >> 24];
    p += 8;
    n -= 8;
  }
  while (n-- > 0) crc = (crc >> 8) ^ kTables[0][(crc ^ *p++) & 0xff];
  return crc;
}

bool DetectHardware() {
#if STRAIT_CODEC_X86
  __builtin_cpu_init();
  return __builtin_cpu_supports("sse4.2") && __builtin_cpu_supports("pclmul");
#else
  return false;
#endif
}

bool HardwareAvailable() {
  static const bool available = DetectHardware();
  return available;
}

}  // namespace

uint32_t Crc32cSoftware(const void* data, size_t size, uint32_t seed) noexcept {
  return ~SoftwareRaw(static_cast<const uint8_t*>(data), size, ~seed);
}

bool Crc32cHardwareAvailable() noexcept {
  return HardwareAvailable();
}

uint32_t Crc32cHardware(const void* data, size_t size, uint32_t seed) noexcept {
#if STRAIT_CODEC_X86
  if (HardwareAvailable()) {
    return ~Crc32cSse42Raw(static_cast<const uint8_t*>(data), size, ~seed);
  }
#endif
  return Crc32cSoftware(data, size, seed);
}

const char* Crc32cImplementationName() noexcept {
  return HardwareAvailable() ? "sse4.2" : "software";
}

}  // namespace codec_internal

uint32_t Crc32c(const void* data, size_t size, uint32_t seed) noexcept {
  return codec_internal::Crc32cHardware(data, size, seed);
}

}  // namespace strait

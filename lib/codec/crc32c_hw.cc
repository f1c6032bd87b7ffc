// CRC-32C with the SSE4.2 crc32 instruction. Compiled with -msse4.2 -mpclmul and called only
// after crc32c.cc has checked the CPU.
//
// The crc32 instruction has a latency of three cycles but a throughput of one, so long buffers
// are cut into three equal stripes whose CRCs run interleaved and are then combined: shifting a
// CRC over n zero bytes is a multiplication by x^(8n) mod P, done with one carry-less multiply
// and one crc32 (which reduces a 64-bit product mod P).
#include <nmmintrin.h>
#include <wmmintrin.h>

#include "codec/crc32c.h"
#include "common/endian.h"

namespace strait::codec_internal {
namespace {

constexpr uint32_t kPoly = 0x82F63B78u;

// a * b mod P, both in the reflected representation (bit 31 is x^0).
constexpr uint32_t MultModP(uint32_t a, uint32_t b) {
  uint32_t m = 1u << 31;
  uint32_t p = 0;
  for (;;) {
    if (a & m) {
      p ^= b;
      if ((a & (m - 1)) == 0) break;
    }
    m >>= 1;
    b = (b & 1) ? (b >> 1) ^ kPoly : b >> 1;
  }
  return p;
}

// x^n mod P, reflected.
constexpr uint32_t XPowModP(uint64_t n) {
  uint32_t result = 1u << 31;  // x^0
  uint32_t base = 1u << 30;    // x^1
  while (n != 0) {
    if (n & 1) result = MultModP(result, base);
    base = MultModP(base, base);
    n >>= 1;
  }
  return result;
}

// The clmul of two reflected 32-bit values is their product times x (bit 63 is x^0 in a 64-bit
// reflected value), and crc32 of a 64-bit value with a zero register multiplies by x^32 mod P;
// so shifting over n bytes uses the constant x^(8n - 33).
constexpr uint32_t ShiftConstant(size_t bytes) {
  return XPowModP(8 * uint64_t{bytes} - 33);
}

inline uint32_t Shift(uint32_t crc, uint32_t k) {
  const __m128i product = _mm_clmulepi64_si128(_mm_cvtsi32_si128(static_cast<int>(crc)),
                                               _mm_cvtsi32_si128(static_cast<int>(k)), 0);
  return static_cast<uint32_t>(_mm_crc32_u64(0, static_cast<uint64_t>(_mm_cvtsi128_si64(product))));
}

// Runs whole rounds of three stripes of kStripe bytes each.
template <size_t kStripe>
inline const uint8_t* ThreeWay(const uint8_t* p, size_t* n, uint32_t* crc_io) {
  static_assert(kStripe % 8 == 0);
  constexpr uint32_t kShift1 = ShiftConstant(kStripe);
  constexpr uint32_t kShift2 = ShiftConstant(2 * kStripe);
  uint64_t crc = *crc_io;
  while (*n >= 3 * kStripe) {
    uint64_t c0 = crc;
    uint64_t c1 = 0;
    uint64_t c2 = 0;
    const uint8_t* end = p + kStripe;
    while (p < end) {
      c0 = _mm_crc32_u64(c0, GetU64(p));
      c1 = _mm_crc32_u64(c1, GetU64(p + kStripe));
      c2 = _mm_crc32_u64(c2, GetU64(p + 2 * kStripe));
      p += 8;
    }
    crc = Shift(static_cast<uint32_t>(c0), kShift2) ^ Shift(static_cast<uint32_t>(c1), kShift1) ^
          static_cast<uint32_t>(c2);
    p += 2 * kStripe;
    *n -= 3 * kStripe;
  }
  *crc_io = static_cast<uint32_t>(crc);
  return p;
}

}  // namespace

uint32_t Crc32cSse42Raw(const uint8_t* p, size_t n, uint32_t crc) noexcept {
  while (n > 0 && (reinterpret_cast<uintptr_t>(p) & 7) != 0) {
    crc = _mm_crc32_u8(crc, *p++);
    --n;
  }
  p = ThreeWay<4096>(p, &n, &crc);
  p = ThreeWay<256>(p, &n, &crc);
  uint64_t c = crc;
  while (n >= 8) {
    c = _mm_crc32_u64(c, GetU64(p));
    p += 8;
    n -= 8;
  }
  crc = static_cast<uint32_t>(c);
  while (n-- > 0) crc = _mm_crc32_u8(crc, *p++);
  return crc;
}

}  // namespace strait::codec_internal

// Tests for the little-endian wire helpers: known byte patterns (the wire formats depend on them
// exactly), round trips, unaligned access, and use in constant expressions.
#include "common/endian.h"

#include <gtest/gtest.h>

#include <array>
#include <cstdint>
#include <vector>

namespace strait {
namespace {

TEST(Endian, FixedWidthStoresWriteLeastSignificantByteFirst) {
  std::array<uint8_t, 8> b{};
  PutU16(b.data(), 0x1234);
  EXPECT_EQ(b[0], 0x34);
  EXPECT_EQ(b[1], 0x12);
  PutU32(b.data(), 0x4C525453);  // the stream hello's magic: "STRL" in memory order
  EXPECT_EQ(b[0], 'S');
  EXPECT_EQ(b[1], 'T');
  EXPECT_EQ(b[2], 'R');
  EXPECT_EQ(b[3], 'L');
  PutU64(b.data(), 0x0102030405060708ull);
  EXPECT_EQ(b, (std::array<uint8_t, 8>{8, 7, 6, 5, 4, 3, 2, 1}));
}

TEST(Endian, FixedWidthLoadsReadKnownPatterns) {
  const std::array<uint8_t, 8> b{0xEF, 0xCD, 0xAB, 0x89, 0x67, 0x45, 0x23, 0x01};
  EXPECT_EQ(GetU16(b.data()), 0xCDEFu);
  EXPECT_EQ(GetU32(b.data()), 0x89ABCDEFu);
  EXPECT_EQ(GetU64(b.data()), 0x0123456789ABCDEFull);
  // High bits set in every byte: a load that sign-extends a byte would get these wrong.
  const std::array<uint8_t, 8> high{0x80, 0xFF, 0x81, 0xFE, 0x82, 0xFD, 0x83, 0xFC};
  EXPECT_EQ(GetU16(high.data()), 0xFF80u);
  EXPECT_EQ(GetU32(high.data()), 0xFE81FF80u);
  EXPECT_EQ(GetU64(high.data()), 0xFC83FD82FE81FF80ull);
}

TEST(Endian, FixedWidthRoundTripsAtEveryOffset) {
  // Every offset in a byte buffer, so misaligned pointers are covered; the bytes around the
  // field must stay untouched.
  const uint64_t values[] = {
      0, 1, 0xFF, 0x100, 0x8000000000000000ull, ~0ull, 0xDEADBEEFCAFEF00Dull};
  for (size_t off = 0; off < 8; ++off) {
    for (uint64_t v : values) {
      std::array<uint8_t, 24> b;
      b.fill(0xA5);
      PutU64(b.data() + off, v);
      EXPECT_EQ(GetU64(b.data() + off), v) << off;
      PutU32(b.data() + off + 8, static_cast<uint32_t>(v));
      EXPECT_EQ(GetU32(b.data() + off + 8), static_cast<uint32_t>(v)) << off;
      PutU16(b.data() + off + 12, static_cast<uint16_t>(v >> 16));
      EXPECT_EQ(GetU16(b.data() + off + 12), static_cast<uint16_t>(v >> 16)) << off;
      for (size_t i = 0; i < off; ++i) EXPECT_EQ(b[i], 0xA5) << "byte " << i << " clobbered";
      for (size_t i = off + 14; i < b.size(); ++i) {
        EXPECT_EQ(b[i], 0xA5) << "byte " << i << " clobbered";
      }
    }
  }
}

TEST(Endian, VariableWidthMatchesFixedWidth) {
  const uint64_t v = 0x0123456789ABCDEFull;
  std::array<uint8_t, 8> fixed{};
  std::array<uint8_t, 8> var{};
  PutU64(fixed.data(), v);
  PutLe(var.data(), v, 8);
  EXPECT_EQ(fixed, var);
  for (size_t n = 0; n <= 8; ++n) {
    const uint64_t mask = n == 8 ? ~0ull : (uint64_t{1} << (8 * n)) - 1;
    EXPECT_EQ(GetLe(fixed.data(), n), v & mask) << n;
  }
  EXPECT_EQ(GetLe(fixed.data(), 2), GetU16(fixed.data()));
  EXPECT_EQ(GetLe(fixed.data(), 4), GetU32(fixed.data()));
}

TEST(Endian, VariableWidthStoreWritesOnlyItsBytes) {
  std::array<uint8_t, 6> b;
  b.fill(0xA5);
  PutLe(b.data() + 1, 0xFFEEDDCCBBAAull, 3);  // higher bytes dropped
  EXPECT_EQ(b, (std::array<uint8_t, 6>{0xA5, 0xAA, 0xBB, 0xCC, 0xA5, 0xA5}));
  PutLe(b.data(), 0x1234, 0);
  EXPECT_EQ(b[0], 0xA5);
}

TEST(Endian, AppendLeBuildsMessagesFieldByField) {
  std::vector<uint8_t> out{0x7F};
  AppendLe(&out, 0x0201, 2);
  AppendLe(&out, 0x06050403, 4);
  AppendLe(&out, 0xFFFF07, 1);  // only the low byte fits a 1-byte field
  EXPECT_EQ(out, (std::vector<uint8_t>{0x7F, 0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x07}));
  EXPECT_EQ(GetLe(out.data() + 1, 2), 0x0201u);
  EXPECT_EQ(GetLe(out.data() + 3, 4), 0x06050403u);
}

// The same functions evaluated by the compiler: the constant-evaluation path (shifts) must agree
// with the run-time path (memcpy on little-endian hosts) that the tests above exercise.
constexpr std::array<uint8_t, 14> EncodeAtCompileTime() {
  std::array<uint8_t, 14> b{};
  PutU64(b.data(), 0x0807060504030201ull);
  PutU32(b.data() + 8, 0x0C0B0A09u);
  PutU16(b.data() + 12, 0x0E0Du);
  return b;
}
constexpr std::array<uint8_t, 14> kEncoded = EncodeAtCompileTime();
static_assert(kEncoded[0] == 0x01 && kEncoded[7] == 0x08 && kEncoded[8] == 0x09 &&
              kEncoded[13] == 0x0E);
static_assert(GetU64(kEncoded.data()) == 0x0807060504030201ull);
static_assert(GetU32(kEncoded.data() + 8) == 0x0C0B0A09u);
static_assert(GetU16(kEncoded.data() + 12) == 0x0E0Du);
static_assert(GetLe(kEncoded.data() + 5, 3) == 0x080706u);

TEST(Endian, CompileTimeAndRunTimeAgree) {
  std::array<uint8_t, 14> b{};
  PutU64(b.data(), 0x0807060504030201ull);
  PutU32(b.data() + 8, 0x0C0B0A09u);
  PutU16(b.data() + 12, 0x0E0Du);
  EXPECT_EQ(b, kEncoded);
}

}  // namespace
}  // namespace strait

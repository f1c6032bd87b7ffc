// CRC-32C: published test vectors, chaining through the seed, and the SSE4.2 implementation
// agreeing with the table one on every length and alignment class.
#include "codec/crc32c.h"

#include <gtest/gtest.h>

#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

namespace strait {
namespace {

using codec_internal::Crc32cHardware;
using codec_internal::Crc32cHardwareAvailable;
using codec_internal::Crc32cSoftware;

using CrcFn = uint32_t (*)(const void*, size_t, uint32_t);

struct Impl {
  const char* name;
  CrcFn fn;
  bool available;
};

std::vector<Impl> Impls() {
  return {{"public", [](const void* d, size_t n, uint32_t s) { return Crc32c(d, n, s); }, true},
          {"software", Crc32cSoftware, true},
          {"hardware", Crc32cHardware, Crc32cHardwareAvailable()}};
}

TEST(Crc32c, KnownVectors) {
  // RFC 3720 (iSCSI) appendix B.4 and the usual check value.
  std::vector<uint8_t> zeros(32, 0);
  std::vector<uint8_t> ones(32, 0xff);
  std::vector<uint8_t> up(32);
  std::iota(up.begin(), up.end(), 0);
  std::vector<uint8_t> down(up.rbegin(), up.rend());
  const std::string check = "123456789";
  for (const Impl& impl : Impls()) {
    if (!impl.available) continue;
    SCOPED_TRACE(impl.name);
    EXPECT_EQ(impl.fn(check.data(), check.size(), 0), 0xE3069283u);
    EXPECT_EQ(impl.fn(nullptr, 0, 0), 0u);
    EXPECT_EQ(impl.fn(zeros.data(), zeros.size(), 0), 0x8A9136AAu);
    EXPECT_EQ(impl.fn(ones.data(), ones.size(), 0), 0x62A8AB43u);
    EXPECT_EQ(impl.fn(up.data(), up.size(), 0), 0x46DD794Eu);
    EXPECT_EQ(impl.fn(down.data(), down.size(), 0), 0x113FDB5Cu);
  }
}

TEST(Crc32c, SeedChainsPieces) {
  std::mt19937 rng(7);
  std::vector<uint8_t> data(100000);
  for (auto& b : data) b = static_cast<uint8_t>(rng());
  for (const Impl& impl : Impls()) {
    if (!impl.available) continue;
    SCOPED_TRACE(impl.name);
    const uint32_t whole = impl.fn(data.data(), data.size(), 0);
    for (size_t cut : {size_t{0}, size_t{1}, size_t{7}, size_t{777}, size_t{12288}, size_t{50001},
                       data.size()}) {
      const uint32_t first = impl.fn(data.data(), cut, 0);
      EXPECT_EQ(impl.fn(data.data() + cut, data.size() - cut, first), whole) << "cut " << cut;
    }
  }
}

TEST(Crc32c, HardwareMatchesSoftwareOnEveryLengthClass) {
  if (!Crc32cHardwareAvailable()) GTEST_SKIP() << "no SSE4.2 on this CPU";
  std::mt19937 rng(11);
  std::vector<uint8_t> data(3 * 4096 * 3 + 64);
  for (auto& b : data) b = static_cast<uint8_t>(rng());
  std::vector<size_t> lengths;
  for (size_t n = 0; n <= 1600; ++n) lengths.push_back(n);  // covers the 3 x 256 stripes
  for (size_t n :
       {size_t{3 * 4096 - 1}, size_t{3 * 4096}, size_t{3 * 4096 + 1},
        size_t{3 * 4096 + 3 * 256 + 9}, size_t{2 * 3 * 4096 + 17}, size_t{3 * 3 * 4096}}) {
    lengths.push_back(n);
  }
  for (int i = 0; i < 200; ++i) lengths.push_back(rng() % (data.size() - 8));
  for (size_t n : lengths) {
    for (size_t offset = 0; offset < 8; ++offset) {
      const uint32_t seed = (n % 3 == 0) ? 0 : static_cast<uint32_t>(rng());
      ASSERT_EQ(Crc32cHardware(data.data() + offset, n, seed),
                Crc32cSoftware(data.data() + offset, n, seed))
          << "length " << n << " offset " << offset;
    }
  }
}

TEST(Crc32c, EverySingleBitFlipChangesTheChecksum) {
  std::vector<uint8_t> data(64);
  std::iota(data.begin(), data.end(), 1);
  const uint32_t base = Crc32c(data.data(), data.size());
  for (size_t bit = 0; bit < data.size() * 8; ++bit) {
    data[bit / 8] ^= static_cast<uint8_t>(1u << (bit % 8));
    EXPECT_NE(Crc32c(data.data(), data.size()), base) << "bit " << bit;
    data[bit / 8] ^= static_cast<uint8_t>(1u << (bit % 8));
  }
}

TEST(Crc32c, ImplementationNameMatchesAvailability) {
  EXPECT_STREQ(codec_internal::Crc32cImplementationName(),
               Crc32cHardwareAvailable() ? "sse4.2" : "software");
}

}  // namespace
}  // namespace strait

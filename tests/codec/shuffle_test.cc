// Byte-plane shuffle: the plane layout itself, round trips for every element size and remainder,
// and the vector path giving the scalar path's bytes from unaligned buffers.
#include "codec/shuffle.h"

#include <gtest/gtest.h>

#include <random>
#include <vector>

namespace strait {
namespace {

using codec_internal::ByteShuffle;
using codec_internal::ByteShuffleScalar;
using codec_internal::ByteShuffleVector;
using codec_internal::ByteUnshuffle;
using codec_internal::ByteUnshuffleScalar;
using codec_internal::ByteUnshuffleVector;

std::vector<uint8_t> RandomBytes(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<uint8_t> v(n);
  for (auto& b : v) b = static_cast<uint8_t>(rng());
  return v;
}

std::vector<size_t> Sizes() {
  std::vector<size_t> sizes;
  for (size_t n = 0; n <= 300; ++n) sizes.push_back(n);
  for (size_t n : {1023, 1024, 1025, 4096 + 7, 65536 + 13, 100003}) sizes.push_back(n);
  return sizes;
}

TEST(ByteShuffle, PlanesHoldOneByteOfEveryElement) {
  for (size_t elem : {2, 4, 8}) {
    for (size_t size :
         {size_t{0}, size_t{5}, size_t{16 * 8}, size_t{16 * 8 * 3 + 5}, size_t{999}}) {
      const std::vector<uint8_t> src = RandomBytes(size, static_cast<uint32_t>(size + elem));
      std::vector<uint8_t> dst(size, 0);
      ByteShuffle(src.data(), dst.data(), size, elem);
      const size_t n = size / elem;
      for (size_t i = 0; i < n; ++i) {
        for (size_t p = 0; p < elem; ++p) {
          ASSERT_EQ(dst[p * n + i], src[i * elem + p])
              << "elem " << elem << " size " << size << " element " << i << " plane " << p;
        }
      }
      for (size_t r = n * elem; r < size; ++r) ASSERT_EQ(dst[r], src[r]) << "remainder " << r;
    }
  }
}

TEST(ByteShuffle, RoundTripsEverySizeAndRemainder) {
  for (size_t elem : {1, 2, 3, 4, 8}) {
    for (size_t size : Sizes()) {
      const std::vector<uint8_t> src = RandomBytes(size, static_cast<uint32_t>(size * 9 + elem));
      std::vector<uint8_t> mid(size);
      std::vector<uint8_t> back(size);
      ByteShuffle(src.data(), mid.data(), size, elem);
      ByteUnshuffle(mid.data(), back.data(), size, elem);
      ASSERT_EQ(back, src) << "elem " << elem << " size " << size;
      ByteShuffleScalar(src.data(), mid.data(), size, elem);
      ByteUnshuffleScalar(mid.data(), back.data(), size, elem);
      ASSERT_EQ(back, src) << "scalar, elem " << elem << " size " << size;
    }
  }
}

TEST(ByteShuffle, VectorMatchesScalarOnUnalignedBuffers) {
  if (!codec_internal::ShuffleVectorAvailable()) {
    GTEST_SKIP() << "no vector shuffle on this CPU (or STRAIT_CODEC_ISA=scalar)";
  }
  for (size_t elem : {2, 4, 8}) {
    for (size_t size : Sizes()) {
      for (size_t offset : {0, 1, 3}) {
        const std::vector<uint8_t> src = RandomBytes(size + offset, static_cast<uint32_t>(size));
        std::vector<uint8_t> a(size + offset, 0);
        std::vector<uint8_t> b(size + offset, 0);
        ByteShuffleScalar(src.data() + offset, a.data() + offset, size, elem);
        ByteShuffleVector(src.data() + offset, b.data() + offset, size, elem);
        ASSERT_EQ(a, b) << "shuffle elem " << elem << " size " << size << " offset " << offset;
        ByteUnshuffleScalar(src.data() + offset, a.data() + offset, size, elem);
        ByteUnshuffleVector(src.data() + offset, b.data() + offset, size, elem);
        ASSERT_EQ(a, b) << "unshuffle elem " << elem << " size " << size << " offset " << offset;
      }
    }
  }
}

TEST(ByteShuffle, OtherElementSizesAreACopy) {
  const std::vector<uint8_t> src = RandomBytes(77, 3);
  for (size_t elem : {0, 1, 3, 16}) {
    std::vector<uint8_t> dst(src.size());
    ByteShuffle(src.data(), dst.data(), src.size(), elem);
    EXPECT_EQ(dst, src) << "elem " << elem;
  }
}

}  // namespace
}  // namespace strait

// Tests of the link's pure decisions: codec choice, chunk sizing, stream-count hill climbing.
#include "net/adapt.h"

#include <gtest/gtest.h>

#include <vector>

namespace strait::net {
namespace {

LinkEstimates WithGoodput(double bytes_per_s, int64_t rtt_ns = 0) {
  LinkEstimates e;
  e.goodput_bytes_per_s = bytes_per_s;
  e.rtt_smoothed_ns = rtt_ns;
  return e;
}

const std::vector<CodecProfile> kProfiles = {
    {CodecId::kZstd, 800e6, 1500e6, 1.3},   // lossless, moderate speed
    {CodecId::kInt8, 4000e6, 6000e6, 4.0},  // lossy, fast
    {CodecId::kFp8E4M3, 200e6, 300e6, 4.0},  // lossy, slow here
};

TEST(ChooseCodec, SlowLinkTakesTheBestRatioThatKeepsUp) {
  const std::vector<CodecId> allowed = {CodecId::kNone, CodecId::kZstd, CodecId::kInt8};
  const CodecChoice c = ChooseCodec(WithGoodput(12.5e6), kProfiles, allowed, 64 << 20);
  EXPECT_EQ(c.codec, CodecId::kInt8);
  EXPECT_NEAR(c.expected_seconds, (64 << 20) / 4.0 / 12.5e6, 1e-6);
}

TEST(ChooseCodec, OnlyAllowedCodecsAreConsidered) {
  const std::vector<CodecId> lossless = {CodecId::kNone, CodecId::kZstd};
  EXPECT_EQ(ChooseCodec(WithGoodput(12.5e6), kProfiles, lossless, 1 << 20).codec,
            CodecId::kZstd);
}

TEST(ChooseCodec, FastLinkSendsRawWhenTheCodecIsTheBottleneck) {
  const std::vector<CodecId> lossless = {CodecId::kNone, CodecId::kZstd};
  // 10 GB/s link: zstd at 800 MB/s would take longer than sending raw.
  EXPECT_EQ(ChooseCodec(WithGoodput(10e9), kProfiles, lossless, 1 << 20).codec, CodecId::kNone);
  // fp8 here is slower than its 4x gain on a 1 GB/s link (200 MB/s encode), int8 is not.
  const std::vector<CodecId> lossy = {CodecId::kFp8E4M3, CodecId::kInt8};
  EXPECT_EQ(ChooseCodec(WithGoodput(1e9), kProfiles, lossy, 1 << 20).codec, CodecId::kInt8);
  const std::vector<CodecId> fp8_only = {CodecId::kFp8E4M3};
  EXPECT_EQ(ChooseCodec(WithGoodput(1e9), kProfiles, fp8_only, 1 << 20).codec, CodecId::kNone);
}

TEST(ChooseCodec, RatioBelowThresholdIsNeverWorthIt) {
  const std::vector<CodecProfile> poor = {{CodecId::kZstd, 1e12, 1e12, 1.04}};
  const std::vector<CodecId> allowed = {CodecId::kZstd};
  EXPECT_EQ(ChooseCodec(WithGoodput(1e6), poor, allowed, 1 << 20).codec, CodecId::kNone);
  const std::vector<CodecProfile> enough = {{CodecId::kZstd, 1e12, 1e12, 1.06}};
  EXPECT_EQ(ChooseCodec(WithGoodput(1e6), enough, allowed, 1 << 20).codec, CodecId::kZstd);
}

TEST(ChooseCodec, UnmeasuredLinkUsesTheFallbackBandwidth) {
  const std::vector<CodecId> lossless = {CodecId::kZstd};
  EXPECT_EQ(ChooseCodec(LinkEstimates{}, kProfiles, lossless, 1 << 20, 12.5e6).codec,
            CodecId::kZstd);
  EXPECT_EQ(ChooseCodec(LinkEstimates{}, kProfiles, lossless, 1 << 20, 10e9).codec,
            CodecId::kNone);
}

TEST(ChooseChunkBytes, FollowsBandwidthDelayProduct) {
  // 125 MB/s x 100 ms = 12.5 MB; / 4 streams / 4 = ~781 KB -> 768 KiB.
  EXPECT_EQ(ChooseChunkBytes(WithGoodput(125e6, 100'000'000), 4, 1, 64 << 10, 4 << 20),
            768u << 10);
  EXPECT_EQ(ChooseChunkBytes(WithGoodput(10e9, 100'000'000), 4, 1, 64 << 10, 4 << 20),
            4u << 20);  // clamped
  EXPECT_EQ(ChooseChunkBytes(WithGoodput(1e6, 1'000'000), 4, 1, 64 << 10, 4 << 20),
            64u << 10);
  EXPECT_EQ(ChooseChunkBytes(LinkEstimates{}, 4, 12345, 64 << 10, 4 << 20), 12345u);
}

TEST(StreamCountController, GrowsWhileGoodputGrowsThenSettles) {
  StreamCountController k(1, 1, 16, 0.05, 10);
  // Goodput grows linearly up to 4 streams, then flat.
  auto goodput = [](int streams) { return 100.0 * std::min(streams, 4); };
  int streams = k.streams();
  for (int round = 0; round < 8; ++round) streams = k.Update(goodput(streams), true);
  EXPECT_EQ(streams, 4);
  EXPECT_EQ(k.Update(goodput(streams), false), 4);  // idle rounds change nothing
}

TEST(StreamCountController, ShrinksBackWhenAnAddedStreamDoesNotPay) {
  StreamCountController k(4, 1, 16, 0.05, 100);
  EXPECT_EQ(k.Update(400, true), 5);
  EXPECT_EQ(k.Update(401, true), 4);  // +0.25%: not worth a stream
  EXPECT_EQ(k.Update(400, true), 4);  // holds
}

}  // namespace
}  // namespace strait::net

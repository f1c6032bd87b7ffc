// Tests of the link's pure decisions: codec choice, chunk sizing, the stream-count controller.
#include "net/adapt.h"

#include <gtest/gtest.h>

#include <algorithm>
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

TEST(CodecProfiles, LossyRatiosFollowTheFormat) {
  // int8 on float32: 4 bytes -> 1 byte + 4 bytes of scale per 256 elements.
  EXPECT_DOUBLE_EQ(LossyRatio(CodecId::kInt8, DataType::kFloat32), 4.0 / (1 + 4.0 / 256));
  EXPECT_DOUBLE_EQ(LossyRatio(CodecId::kInt4, DataType::kBfloat16), 2.0 / (0.5 + 4.0 / 256));
  EXPECT_DOUBLE_EQ(LossyRatio(CodecId::kFp8E4M3, DataType::kFloat16, 32), 2.0 / (1 + 4.0 / 32));
  EXPECT_DOUBLE_EQ(LossyRatio(CodecId::kZstd, DataType::kFloat32), 1.0);
  const CodecProfile int8{CodecId::kInt8, 1e9, 2e9, 3.94};
  EXPECT_DOUBLE_EQ(ProfileFor(int8, DataType::kBfloat16).ratio,
                   LossyRatio(CodecId::kInt8, DataType::kBfloat16));
  EXPECT_DOUBLE_EQ(ProfileFor(int8, DataType::kBfloat16).encode_bytes_per_s, 1e9);
  const CodecProfile zstd{CodecId::kZstd, 1e9, 2e9, 1.2};
  EXPECT_DOUBLE_EQ(ProfileFor(zstd, DataType::kBfloat16).ratio, 1.2);
}

TEST(CodecProfiles, MeasuresEveryCodecOnThisMachine) {
  const std::vector<CodecProfile> profiles = MeasureCodecProfiles(64 * 1024);
  ASSERT_EQ(profiles.size(), static_cast<size_t>(kNumCodecs));
  for (int c = 0; c < kNumCodecs; ++c) {
    const CodecProfile& p = profiles[static_cast<size_t>(c)];
    EXPECT_EQ(p.codec, static_cast<CodecId>(c));
    EXPECT_GT(p.encode_bytes_per_s, 0) << CodecName(p.codec);
    EXPECT_GT(p.decode_bytes_per_s, 0) << CodecName(p.codec);
  }
  // Raw costs its header; zstd finds the exponent bytes of gradient noise; lossy as the format.
  EXPECT_LT(profiles[0].ratio, 1.0);
  EXPECT_GT(profiles[1].ratio, kMinUsefulRatio);
  EXPECT_LT(profiles[1].ratio, 2.0);
  EXPECT_DOUBLE_EQ(profiles[2].ratio, LossyRatio(CodecId::kInt8, DataType::kFloat32));
  // Fed to ChooseCodec: a 100 Mbit/s link takes zstd among lossless codecs (any machine encodes
  // faster than 12.5 MB/s, even a debug build with sanitizers).
  const std::vector<CodecId> lossless = {CodecId::kNone, CodecId::kZstd};
  EXPECT_EQ(ChooseCodec(WithGoodput(12.5e6), profiles, lossless, 1 << 20).codec, CodecId::kZstd);
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

TEST(ChooseChunkBytes, UsesThePathRttNotTheQueueBehindWhichPingsWait) {
  // Pings queued behind 8 MiB per stream read 700 ms on a 100 ms path; the kernel's minimum
  // RTT (or, without it, the least ping RTT) is the path.
  LinkEstimates e = WithGoodput(125e6, 700'000'000);
  e.rtt_min_ns = 120'000'000;
  e.tcp_rtt_ns = 400'000'000;
  e.tcp_min_rtt_ns = 100'000'000;
  EXPECT_EQ(PathRttNs(e), 100'000'000);
  EXPECT_EQ(ChooseChunkBytes(e, 4, 1, 64 << 10, 4 << 20), 768u << 10);
  e.tcp_min_rtt_ns = 0;
  EXPECT_EQ(PathRttNs(e), 120'000'000);
  e.rtt_min_ns = 0;
  EXPECT_EQ(PathRttNs(e), 400'000'000);
  e.tcp_rtt_ns = 0;
  EXPECT_EQ(PathRttNs(e), 700'000'000);
}

// Runs the controller against a goodput model for `rounds` busy rounds; returns the K visited
// after each round.
template <typename Goodput>
std::vector<int> RunRounds(StreamCountController& k, int rounds, Goodput goodput) {
  std::vector<int> visited;
  for (int round = 0; round < rounds; ++round) {
    const int streams = k.streams();
    visited.push_back(k.Update(goodput(streams), true));
  }
  return visited;
}

TEST(StreamCountController, DoublesWhileGoodputGrowsThenSettlesOnTheBest) {
  StreamCountController k(1, 1, 64, 0.10, 10);
  // A per-flow cap: goodput linear up to 5 streams, then flat.
  auto goodput = [](int streams) { return 100.0 * std::min(streams, 5); };
  const std::vector<int> visited = RunRounds(k, 8, goodput);
  // Two rounds at the start, then 1 -> 2 (twice the goodput: linear, so the next step
  // quadruples) -> 8 (+150%) -> 16 (+0% in both of its rounds): back to 8, and hold.
  EXPECT_EQ(visited, (std::vector<int>{1, 2, 8, 16, 16, 8, 8, 8}));
  EXPECT_EQ(k.Update(goodput(8), false), 8);  // idle rounds change nothing
  EXPECT_EQ(k.Update(0, true), 8);            // nor rounds without a measurement
}

TEST(StreamCountController, ReachesTensOfStreamsWhenEachStreamIsLossBound) {
  // Cubic at 1% loss on a 100 ms path: ~1.7 Mbit/s per stream up to the link's 96.
  StreamCountController k(4, 1, 64, 0.10, 10);
  auto goodput = [](int streams) { return std::min(1.7e6 * streams, 96e6) / 8; };
  const std::vector<int> visited = RunRounds(k, 6, goodput);
  // Each step doubles the goodput, so after the first doubling K quadruples: 8 -> 32 -> 64.
  EXPECT_EQ(visited, (std::vector<int>{4, 8, 32, 64, 64, 64}));
}

TEST(StreamCountController, MaxStreamsCapsTheDoubling) {
  StreamCountController k(1, 1, 10, 0.10, 10);
  auto goodput = [](int streams) { return 100.0 * streams; };
  EXPECT_EQ(RunRounds(k, 5, goodput), (std::vector<int>{1, 2, 8, 10, 10}));
}

TEST(StreamCountController, SmallGainIsNotWorthTwiceTheStreams) {
  StreamCountController k(4, 1, 64, 0.10, 100);
  EXPECT_EQ(k.Update(450, true), 4);  // the start-up round: not the reference
  EXPECT_EQ(k.Update(400, true), 8);
  EXPECT_EQ(k.Update(420, true), 8);  // +5%: one more round
  EXPECT_EQ(k.Update(430, true), 4);  // +7.5%: not worth four more streams
  EXPECT_EQ(k.Update(400, true), 4);  // holds
  EXPECT_EQ(k.Update(400, true), 4);
}

TEST(StreamCountController, AFailedDoublingGoesBackToItsBaseAndNeverBelow) {
  // BBR: one stream fills the path, more streams fight over the queue and lose goodput. The
  // controller goes back to where it started rather than probing below it.
  StreamCountController k(4, 1, 64, 0.10, 100);
  auto goodput = [](int streams) { return 12e6 * (streams > 4 ? 0.8 : 1.0); };
  EXPECT_EQ(RunRounds(k, 6, goodput), (std::vector<int>{4, 8, 8, 4, 4, 4}));
}

TEST(StreamCountController, GoesBackToAKThatPaid) {
  // 16 -> 32 paid; 64 adds nothing: back to 32.
  StreamCountController k(16, 1, 64, 0.10, 100);
  auto goodput = [](int streams) { return 100.0 * std::min(streams, 32); };
  EXPECT_EQ(RunRounds(k, 6, goodput), (std::vector<int>{16, 32, 64, 64, 32, 32}));
}

TEST(StreamCountController, ProbesUpAgainAfterHolding) {
  StreamCountController k(4, 1, 64, 0.10, 3);
  int cap = 4;  // conditions change while it holds: the cap moves from 4 to 16 streams
  auto goodput = [&cap](int streams) { return 100.0 * std::min(streams, cap); };
  EXPECT_EQ(RunRounds(k, 4, goodput), (std::vector<int>{4, 8, 8, 4}));
  cap = 16;
  // Holds three rounds at 4, then grows while it pays: 8 (linear, so quadruple) -> 32 (+100%)
  // -> 64 (nothing more): back to 32, where 16 would do as well -- the price of growing fast.
  EXPECT_EQ(RunRounds(k, 8, goodput), (std::vector<int>{4, 4, 8, 32, 64, 64, 32, 32}));
}

TEST(StreamCountController, DoublesOnlyWhereGoodputGrewLessThanLinearly) {
  // A policer at a fifth of the link: 4 -> 8 adds 25%, not 85% of the doubling, so 16 is next
  // (not 32); 16 adds nothing: back to 8.
  StreamCountController k(4, 1, 64, 0.10, 100);
  auto goodput = [](int streams) { return 20.0 * std::min(streams, 5); };
  EXPECT_EQ(RunRounds(k, 6, goodput), (std::vector<int>{4, 8, 16, 16, 8, 8}));
}

TEST(StreamCountController, StaysWithinItsBounds) {
  StreamCountController k(8, 4, 12, 0.10, 2);
  auto goodput = [](int streams) { return 100.0 * streams; };
  for (int k_next : RunRounds(k, 20, goodput)) {
    EXPECT_GE(k_next, 4);
    EXPECT_LE(k_next, 12);
  }
  StreamCountController clamped(100, 1, 16);
  EXPECT_EQ(clamped.streams(), 16);
}

}  // namespace
}  // namespace strait::net

// Tests of the link's pure decisions: codec choice, chunk sizing, the stream-count controller.
#include "net/adapt.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
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
  const std::vector<int> visited = RunRounds(k, 9, goodput);
  // Two rounds at the start, then two per step: 1 -> 2 (twice the goodput: linear, so the next
  // step quadruples) -> 8 (+150%) -> 16 (+0%, but no loss right after a step that paid): kept,
  // and hold.
  EXPECT_EQ(visited, (std::vector<int>{1, 2, 2, 8, 8, 16, 16, 16, 16}));
  EXPECT_EQ(k.Update(goodput(16), false), 16);  // idle rounds change nothing
  EXPECT_EQ(k.Update(0, true), 16);             // nor rounds without a measurement
}

TEST(StreamCountController, ReachesTensOfStreamsWhenEachStreamIsLossBound) {
  // Cubic at 1% loss on a 100 ms path: ~1.7 Mbit/s per stream up to the link's 96.
  StreamCountController k(4, 1, 64, 0.10, 10);
  auto goodput = [](int streams) { return std::min(1.7e6 * streams, 96e6) / 8; };
  const std::vector<int> visited = RunRounds(k, 8, goodput);
  // Each step doubles the goodput, so after the first doubling K quadruples: 8 -> 32 -> 64.
  EXPECT_EQ(visited, (std::vector<int>{4, 8, 8, 32, 32, 64, 64, 64}));
}

TEST(StreamCountController, MaxStreamsCapsTheDoubling) {
  StreamCountController k(1, 1, 10, 0.10, 10);
  auto goodput = [](int streams) { return 100.0 * streams; };
  EXPECT_EQ(RunRounds(k, 8, goodput), (std::vector<int>{1, 2, 2, 8, 8, 10, 10, 10}));
}

TEST(StreamCountController, SmallGainIsNotWorthTwiceTheStreams) {
  StreamCountController k(4, 1, 64, 0.10, 100);
  EXPECT_EQ(k.Update(450, true), 4);  // the start-up round: not the reference
  EXPECT_EQ(k.Update(400, true), 8);
  EXPECT_EQ(k.Update(440, true), 8);  // +10%, but one round decides nothing
  EXPECT_EQ(k.Update(384, true), 4);  // mean +3%: not worth four more streams
  EXPECT_EQ(k.Update(400, true), 4);  // holds
  EXPECT_EQ(k.Update(400, true), 4);
}

TEST(StreamCountController, AGainShortOfTheBarTakesAThirdRoundAndKeepsTheStep) {
  StreamCountController k(4, 1, 64, 0.10, 100);
  EXPECT_EQ(k.Update(450, true), 4);
  EXPECT_EQ(k.Update(400, true), 8);
  EXPECT_EQ(k.Update(420, true), 8);
  EXPECT_EQ(k.Update(430, true), 8);  // mean +6.25%: above half the bar, so a third round
  EXPECT_EQ(k.Update(430, true), 8);  // mean +6.7%: kept (going back costs a dip), not grown
  EXPECT_EQ(k.Update(430, true), 8);  // holds
}

TEST(StreamCountController, AFailedDoublingGoesBackToItsBaseAndNeverBelow) {
  // BBR: one stream fills the path, more streams fight over the queue and lose goodput. The
  // controller goes back to where it started rather than probing below it.
  StreamCountController k(4, 1, 64, 0.10, 100);
  auto goodput = [](int streams) { return 12e6 * (streams > 4 ? 0.8 : 1.0); };
  EXPECT_EQ(RunRounds(k, 6, goodput), (std::vector<int>{4, 8, 8, 4, 4, 4}));
}

TEST(StreamCountController, GoesBackToAKThatPaid) {
  // 16 -> 32 paid; 64 loses 10%: back to 32.
  StreamCountController k(16, 1, 64, 0.10, 100);
  auto goodput = [](int streams) {
    return 100.0 * std::min(streams, 32) * (streams > 32 ? 0.9 : 1);
  };
  EXPECT_EQ(RunRounds(k, 6, goodput), (std::vector<int>{16, 32, 32, 64, 64, 32}));
}

TEST(StreamCountController, ProbesUpAgainAfterHolding) {
  StreamCountController k(4, 1, 64, 0.10, 3);
  int cap = 4;  // conditions change while it holds: the cap moves from 4 to 16 streams
  auto goodput = [&cap](int streams) { return 100.0 * std::min(streams, cap); };
  EXPECT_EQ(RunRounds(k, 4, goodput), (std::vector<int>{4, 8, 8, 4}));
  cap = 16;
  // Holds three rounds at 4, then grows while it pays: 8 (linear, so quadruple) -> 32 (+100%)
  // -> 64 (nothing more, nothing less, right after a step that paid): kept, where 16 would do
  // as well -- the price of growing fast and of not trusting a base's first rounds.
  EXPECT_EQ(RunRounds(k, 10, goodput),
            (std::vector<int>{4, 4, 8, 8, 32, 32, 64, 64, 64, 64}));
}

TEST(StreamCountController, DoublesOnlyWhereGoodputGrewLessThanLinearly) {
  // A policer at a fifth of the link: 4 -> 8 adds 25%, not 85% of the doubling, so after its
  // second round 16 is next (not 32); 16 adds nothing and loses 10%: back to 8.
  StreamCountController k(4, 1, 64, 0.10, 100);
  auto goodput = [](int streams) {
    return 20.0 * std::min(streams, 5) * (streams > 8 ? 0.9 : 1);
  };
  EXPECT_EQ(RunRounds(k, 7, goodput), (std::vector<int>{4, 8, 8, 16, 16, 8, 8}));
}

// Feeds the controller scripted goodput: the n-th round at K reads rounds[K][n] (the last one
// repeats once a list runs out); returns the K visited after each round.
std::vector<int> RunScript(StreamCountController& k, int rounds,
                           std::map<int, std::vector<double>> script) {
  std::map<int, size_t> seen;
  std::vector<int> visited;
  int last = k.streams();
  for (int round = 0; round < rounds; ++round) {
    const int streams = k.streams();
    if (streams != last) seen[streams] = 0;  // a new visit starts the K's list again
    last = streams;
    const std::vector<double>& list = script.at(streams);
    const double goodput = list[std::min(seen[streams]++, list.size() - 1)];
    visited.push_back(k.Update(goodput * 1e6 / 8, true));
  }
  return visited;
}

TEST(StreamCountController, NoisyRoundsOfCubicAtATenthPercentLossStillReachSixteen) {
  // Cubic at 0.1% loss, 100 Mbit/s, 100 ms RTT (Mbit/s; fixed-K means 79 at 8, 98 at 16, 104
  // at 32): a loss halves one stream's window, so rounds swing. 8's first round is lucky (92).
  // Judged on single rounds, that round passed 8 and stood as its reference, so 16 (95, 100)
  // never showed +10% and K fell back to 8 for good: 55 Mbit/s in bench/link_vs_iperf.sh.
  // On means, 8 reads 79 and 16 reads 97.5 (+23%); 32 gains +5.6% (a third round: +6%),
  // short of the bar for growing further but enough to keep.
  StreamCountController k(4, 1, 64, 0.10, 100);
  const std::map<int, std::vector<double>> script = {
      {4, {60, 55}}, {8, {92, 66}}, {16, {95, 100}}, {32, {104, 102, 104}}};
  EXPECT_EQ(RunScript(k, 11, script),
            (std::vector<int>{4, 8, 8, 16, 16, 32, 32, 32, 32, 32, 32}));
}

TEST(StreamCountController, NoGainRightAfterAPaidStepKeepsTheStepOnce) {
  // Cubic at 0.1% loss near the link's capacity: 8's rounds read its new streams' start-up
  // (93 Mbit/s, where 8 carry 60-79 once settled), so 16 shows no gain against them. No loss
  // either, right after 4 -> 8 paid: 16 is kept. The next probe (32, no gain) goes back to 16:
  // the rule does not chain, so a path where K does not matter climbs one step at most.
  StreamCountController k(4, 1, 64, 0.10, 2);
  const std::map<int, std::vector<double>> script = {
      {4, {60, 55}}, {8, {93, 92}}, {16, {93, 94, 94, 94}}, {32, {94, 93}}};
  EXPECT_EQ(RunScript(k, 11, script),
            (std::vector<int>{4, 8, 8, 16, 16, 16, 16, 32, 32, 16, 16}));
}

TEST(StreamCountController, ALossRightAfterAPaidStepStillGoesBack) {
  StreamCountController k(4, 1, 64, 0.10, 100);
  const std::map<int, std::vector<double>> script = {{4, {60, 55}}, {8, {93, 92}}, {16, {85, 84}}};
  EXPECT_EQ(RunScript(k, 8, script), (std::vector<int>{4, 8, 8, 16, 16, 8, 8, 8}));
}

TEST(StreamCountController, OneLuckyRoundDoesNotPassAStep) {
  // Goodput does not depend on K (a link-bound path), but 8's first round reads +15%.
  StreamCountController k(4, 1, 64, 0.10, 100);
  const std::map<int, std::vector<double>> script = {{4, {100, 100}}, {8, {115, 100, 98}}};
  EXPECT_EQ(RunScript(k, 7, script), (std::vector<int>{4, 8, 8, 8, 4, 4, 4}));
}

TEST(StreamCountController, AHeldKIsJudgedOnItsRecentMeanNotItsLastRound) {
  // Held at 4, the last round before the probe is a dip (80 against 100): against that round
  // alone, 8's flat 95 would read +19%. Against the mean of the last three (93.3) it is +2%:
  // back to 4.
  StreamCountController k(4, 1, 64, 0.10, 5);
  EXPECT_EQ(k.Update(100, true), 4);
  EXPECT_EQ(k.Update(100, true), 8);
  EXPECT_EQ(k.Update(100, true), 8);
  EXPECT_EQ(k.Update(100, true), 4);  // no gain: hold for five rounds
  EXPECT_EQ(k.Update(100, true), 4);
  EXPECT_EQ(k.Update(100, true), 4);
  EXPECT_EQ(k.Update(100, true), 4);
  EXPECT_EQ(k.Update(100, true), 4);
  EXPECT_EQ(k.Update(80, true), 8);  // the probe
  EXPECT_EQ(k.Update(95, true), 8);
  EXPECT_EQ(k.Update(95, true), 4);
}

TEST(StreamCountController, RoundToRoundNoiseDoesNotGrowKOnABandwidthBoundPath) {
  // BBR filling the link with 4 streams: every K reads 93 Mbit/s +-5% from round to round.
  // Over many probes K never stays above its start.
  StreamCountController k(4, 1, 64, 0.10, 4);
  uint64_t x = 12345;
  int above = 0;
  for (int round = 0; round < 200; ++round) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    const double noise = static_cast<double>(x >> 11) * 0x1.0p-53 * 0.10 - 0.05;
    const int next = k.Update(93e6 / 8 * (1 + noise), true);
    EXPECT_LE(next, 8);
    if (next > 4) ++above;
  }
  // Each probe costs two or three rounds at 8, once every few rounds of holding.
  EXPECT_LT(above, 200 / 2);
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

// Signals of a round on a 40 ms path: the streams' RTT `queue_ms` above it and `loss` of the
// goodput's segments retransmitted.
RoundSignals Path40(double goodput, double queue_ms, double loss = 0) {
  RoundSignals s;
  s.path_rtt_ns = 40'000'000;
  s.stream_rtt_ns = s.path_rtt_ns + static_cast<int64_t>(queue_ms * 1e6);
  s.retrans_per_s = goodput * loss / StreamCountController::kSegmentBytes;
  return s;
}

TEST(QueueBuilding, AStandingQueueIsWellAboveThePathRtt) {
  EXPECT_FALSE(QueueBuilding(40'000'000, 55'000'000));  // 1.25 x 40 ms + 5 ms
  EXPECT_TRUE(QueueBuilding(40'000'000, 56'000'000));
  EXPECT_TRUE(QueueBuilding(40'000'000, 80'000'000));   // a full one-BDP buffer
  // Loopback: a few ms of scheduling jitter over a path of 50 us is no queue.
  EXPECT_FALSE(QueueBuilding(50'000, 3'000'000));
  EXPECT_FALSE(QueueBuilding(0, 80'000'000));  // unknown: never a queue
  EXPECT_FALSE(QueueBuilding(40'000'000, 0));
}

// Two links of one gateway pair through one full 100 Mbit/s bottleneck with a one-BDP buffer:
// each gets its share of the streams (TCP shares per flow), and the buffer stays full (RTT 80
// ms over 40) with a few drops. Returns the largest K either link reached in `rounds` rounds.
int SiblingsMaxK(bool with_signals, int rounds) {
  StreamCountController a(4, 1, 64, 0.10, 3);
  StreamCountController b(4, 1, 64, 0.10, 3);
  int max_k = 4;
  for (int round = 0; round < rounds; ++round) {
    const int ka = a.streams();
    const int kb = b.streams();
    const double ga = 100e6 / 8 * ka / (ka + kb);
    const double gb = 100e6 / 8 * kb / (ka + kb);
    const int na = with_signals ? a.Update(ga, true, Path40(ga, 40, 0.002)) : a.Update(ga, true);
    if (round > 0) {  // b starts a round later: the two links are not in lockstep
      if (with_signals) {
        b.Update(gb, true, Path40(gb, 40, 0.002));
      } else {
        b.Update(gb, true);
      }
    }
    max_k = std::max({max_k, na, b.streams()});
  }
  return max_k;
}

TEST(StreamCountController, AFullPathStopsSiblingLinksStealingShareFromEachOther) {
  // Without the queue signal each doubling "pays" by taking the sibling's share, and the
  // sibling answers in kind (64 streams against 4 on one region pair in straitd).
  EXPECT_GE(SiblingsMaxK(false, 60), 32);
  // With it neither link grows past its start.
  EXPECT_LE(SiblingsMaxK(true, 60), 4);
}

TEST(StreamCountController, DoesNotDoubleFromAQueuedBaseEvenAfterHolding) {
  // The probes after each hold are skipped while the queue stands, even though one more
  // doubling would read +33% (share taken from a sibling).
  StreamCountController k(4, 4, 64, 0.10, 3);
  auto signals = [](double goodput) { return Path40(goodput, 40); };
  for (int round = 0; round < 30; ++round) {
    const int streams = k.streams();
    const double goodput = 100.0 * streams / (streams + 4);
    EXPECT_EQ(k.Update(goodput, true, signals(goodput)), 4) << "round " << round;
  }
  // Once the queue drains, the next probe doubles.
  int next = 4;
  for (int round = 0; round < 4 && next == 4; ++round) next = k.Update(50, true, Path40(50, 1));
  EXPECT_EQ(next, 8);
}

TEST(StreamCountController, AStepThatPaysIntoAQueueIsKeptButNotGrown) {
  StreamCountController k(4, 1, 64, 0.10, 3);
  EXPECT_EQ(k.Update(50, true, Path40(50, 0)), 4);
  EXPECT_EQ(k.Update(50, true, Path40(50, 0)), 8);  // no queue: the link is not full yet
  EXPECT_EQ(k.Update(95, true, Path40(95, 30)), 8);
  EXPECT_EQ(k.Update(95, true, Path40(95, 30)), 8);  // +90%, and now a queue: kept, no 16
  for (int round = 0; round < 10; ++round) EXPECT_EQ(k.Update(95, true, Path40(95, 30)), 8);
  // A queue that was the new streams' start-up: gone two rounds later, and K doubles.
  StreamCountController m(4, 1, 64, 0.10, 3);
  EXPECT_EQ(m.Update(50, true, Path40(50, 0)), 4);
  EXPECT_EQ(m.Update(50, true, Path40(50, 0)), 8);
  EXPECT_EQ(m.Update(90, true, Path40(90, 30)), 8);
  EXPECT_EQ(m.Update(90, true, Path40(90, 30)), 8);  // +80%: measured again
  EXPECT_EQ(m.Update(70, true, Path40(70, 30)), 8);  // start-up: left out
  EXPECT_EQ(m.Update(70, true, Path40(70, 2)), 16);
}

TEST(StreamCountController, TheStepThatFillsThePathIsKeptButNotGrown) {
  // Cubic at 0.1% loss: 8 streams carry 89 Mbit/s without a queue, 16 carry 96 with one (the
  // path is full now): short of the bar but kept, as without signals (going back read 60),
  // and never doubled while the queue stands.
  StreamCountController k(4, 1, 64, 0.10, 3);
  EXPECT_EQ(k.Update(66, true, Path40(66, 1, 0.001)), 4);
  EXPECT_EQ(k.Update(66, true, Path40(66, 1, 0.001)), 8);
  EXPECT_EQ(k.Update(89, true, Path40(89, 2, 0.001)), 8);
  EXPECT_EQ(k.Update(89, true, Path40(89, 2, 0.001)), 16);  // +35%
  EXPECT_EQ(k.Update(96, true, Path40(96, 30, 0.001)), 16);
  EXPECT_EQ(k.Update(96, true, Path40(96, 30, 0.001)), 16);  // +7.9%: a third round
  EXPECT_EQ(k.Update(96, true, Path40(96, 30, 0.001)), 16);  // kept
  for (int round = 0; round < 10; ++round) {
    EXPECT_EQ(k.Update(96, true, Path40(96, 30, 0.001)), 16);
  }
}

TEST(StreamCountController, LossBoundStreamsWithoutAQueueStillReachTens) {
  // Cubic at 1% loss: the streams' RTT stays at the path's, the retransmitted fraction at the
  // path's 1% at any K: growth as without signals.
  StreamCountController k(4, 1, 64, 0.10, 10);
  std::vector<int> visited;
  for (int round = 0; round < 8; ++round) {
    const double goodput = std::min(1.7e6 * k.streams(), 96e6) / 8;
    visited.push_back(k.Update(goodput, true, Path40(goodput, 1, 0.01)));
  }
  EXPECT_EQ(visited, (std::vector<int>{4, 8, 8, 32, 32, 64, 64, 64}));
}

TEST(StreamCountController, RetransmissionsCountAgainstAStep) {
  // No RTT known, but the steps retransmit 5% of their segments where their base lost 0.1%:
  // they overflow the bottleneck's buffer, taking share from the flows beside them.
  RoundSignals base;
  base.retrans_per_s = 100 * 0.001 / StreamCountController::kSegmentBytes;
  RoundSignals step;
  step.retrans_per_s = 76 * 0.05 / StreamCountController::kSegmentBytes;
  // No gain after a step that paid: not kept, back.
  StreamCountController k(2, 2, 64, 0.10, 5);
  EXPECT_EQ(k.Update(50, true, base), 2);
  EXPECT_EQ(k.Update(50, true, base), 4);
  EXPECT_EQ(k.Update(75, true, base), 4);
  EXPECT_EQ(k.Update(75, true, base), 8);  // +50%, no added loss: grows
  EXPECT_EQ(k.Update(76, true, step), 8);
  EXPECT_EQ(k.Update(76, true, step), 4);
  // +20%: the path had room (it is kept) but is full now (no further doubling).
  StreamCountController m(4, 4, 64, 0.10, 5);
  step.retrans_per_s = 120 * 0.05 / StreamCountController::kSegmentBytes;
  EXPECT_EQ(m.Update(100, true, base), 4);
  EXPECT_EQ(m.Update(100, true, base), 8);
  EXPECT_EQ(m.Update(120, true, step), 8);
  EXPECT_EQ(m.Update(120, true, step), 8);
  for (int round = 0; round < 10; ++round) EXPECT_EQ(m.Update(120, true, step), 8);
  // The path's own random loss, the same fraction at every K, does not count.
  StreamCountController r(4, 4, 64, 0.10, 5);
  base.retrans_per_s = 100 * 0.01 / StreamCountController::kSegmentBytes;
  step.retrans_per_s = 120 * 0.012 / StreamCountController::kSegmentBytes;
  EXPECT_EQ(r.Update(100, true, base), 4);
  EXPECT_EQ(r.Update(100, true, base), 8);
  EXPECT_EQ(r.Update(120, true, step), 8);
  EXPECT_EQ(r.Update(120, true, step), 16);
}

TEST(StreamCountController, AStepIntoAPolicedPathThatPaysIsKept) {
  // A per-flow policer at 20% of the link: 4 BBR streams carry 76 Mbit/s without a queue, 8
  // fill the link (96) and stand a queue with 18% retransmissions. The gain is real: kept.
  StreamCountController k(4, 1, 64, 0.10, 5);
  EXPECT_EQ(k.Update(76, true, Path40(76, 1, 0.03)), 4);
  EXPECT_EQ(k.Update(76, true, Path40(76, 1, 0.03)), 8);
  EXPECT_EQ(k.Update(96, true, Path40(96, 100, 0.18)), 8);
  for (int round = 0; round < 10; ++round) {
    EXPECT_EQ(k.Update(96, true, Path40(96, 100, 0.18)), 8);
  }
}

TEST(StreamCountController, AStepThatGrowsInProportionToKPaysWhateverTheLossSays) {
  // Behind a per-flow policer at 20% of the link (strait-wanem, BBR): 1 stream carries 16.8
  // Mbit/s without retransmissions, 2 carry 38.8 with 527/s -- the policer's drops, not a full
  // path. The near-linear gain is accepted (and quadruples); the step that fills the link
  // (8 streams, 96 Mbit/s, a queue) is then kept but not grown.
  auto policed = [](double mbit, double retrans_per_s, double queue_ms) {
    RoundSignals s = Path40(mbit * 1e6 / 8, queue_ms);
    s.retrans_per_s = retrans_per_s;
    return s;
  };
  StreamCountController k(1, 1, 10, 0.10, 5);
  EXPECT_EQ(k.Update(16.8e6 / 8, true, policed(16.8, 23, 1)), 1);
  EXPECT_EQ(k.Update(16.8e6 / 8, true, policed(16.8, 0, 1)), 2);
  EXPECT_EQ(k.Update(38.8e6 / 8, true, policed(38.8, 527, 1)), 2);
  EXPECT_EQ(k.Update(37.2e6 / 8, true, policed(37.2, 206, 1)), 8);
  EXPECT_EQ(k.Update(90e6 / 8, true, policed(90, 900, 60)), 8);
  EXPECT_EQ(k.Update(96e6 / 8, true, policed(96, 900, 60)), 8);
  for (int round = 0; round < 12; ++round) {
    EXPECT_EQ(k.Update(96e6 / 8, true, policed(96, 900, 60)), 8) << "round " << round;
  }
  // The same loss jump with a gain well short of proportional (+30% for twice the streams)
  // is a full path: kept, not grown.
  StreamCountController m(1, 1, 10, 0.10, 5);
  EXPECT_EQ(m.Update(16.8e6 / 8, true, policed(16.8, 0, 1)), 1);
  EXPECT_EQ(m.Update(16.8e6 / 8, true, policed(16.8, 0, 1)), 2);
  EXPECT_EQ(m.Update(21.8e6 / 8, true, policed(21.8, 527, 1)), 2);
  EXPECT_EQ(m.Update(21.8e6 / 8, true, policed(21.8, 527, 1)), 2);
  for (int round = 0; round < 12; ++round) {
    EXPECT_EQ(m.Update(21.8e6 / 8, true, policed(21.8, 527, 1)), 2) << "round " << round;
  }
}

TEST(StreamCountController, AQueueAtTheStartHoldsTheStartingK) {
  // The path is full with the starting K (BBR, cubic without loss): neither more streams nor
  // fewer (halving cost dips of seconds), even when a doubling would read more (share taken
  // from a sibling link).
  StreamCountController k(4, 1, 64, 0.10, 3);
  for (int round = 0; round < 20; ++round) {
    const double goodput = 93.0 * k.streams() / (k.streams() + 4);
    EXPECT_EQ(k.Update(goodput, true, Path40(goodput, 40, 0.15)), 4) << "round " << round;
  }
}

}  // namespace
}  // namespace strait::net

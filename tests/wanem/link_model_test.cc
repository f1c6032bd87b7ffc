// Unit tests of strait-wanem's link model on a fake clock: serialisation, delay and jitter order,
// tail drop, Bernoulli and Gilbert-Elliott loss rates, the per-flow policer, parameter changes,
// and the one-way firewall (syn=drop).
#include "bench/wanem/link_model.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

namespace strait::wanem {
namespace {

constexpr int64_t kUs = 1000;
constexpr int64_t kMs = 1000 * kUs;

std::vector<uint8_t> Bytes(size_t n) { return std::vector<uint8_t>(n, 0xab); }

// Offers one packet of `size` bytes; true when queued.
bool Offer(Link& link, int64_t now, size_t size, const FlowKey* key = nullptr) {
  auto b = Bytes(size);
  return link.Enqueue(now, b, key) == Verdict::kQueued;
}

TEST(LinkModel, SerialisesAtTheConfiguredRate) {
  LinkParams p;
  p.rate_bps = 8'000'000;  // One byte per microsecond.
  Link link(p, 1);
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(Offer(link, 0, 1000));
  EXPECT_EQ(link.NextReleaseNanos(), 1 * kMs);
  EXPECT_FALSE(link.PopDue(1 * kMs - 1).has_value());
  for (int i = 1; i <= 3; ++i) {
    auto pkt = link.PopDue(i * kMs);
    ASSERT_TRUE(pkt.has_value());
    EXPECT_EQ(pkt->release_ns, i * kMs);
    EXPECT_EQ(pkt->data.size(), 1000u);
  }
  // An idle link starts serialising a new packet at its arrival, not at the last departure.
  ASSERT_TRUE(Offer(link, 10 * kMs, 500));
  EXPECT_EQ(link.NextReleaseNanos(), 10 * kMs + 500 * kUs);
}

TEST(LinkModel, AddsDelayAfterSerialisation) {
  LinkParams p;
  p.rate_bps = 8'000'000;
  p.delay_ns = 25 * kMs;
  Link link(p, 1);
  ASSERT_TRUE(Offer(link, 5 * kMs, 1000));
  EXPECT_EQ(link.NextReleaseNanos(), 5 * kMs + 1 * kMs + 25 * kMs);
  EXPECT_FALSE(link.PopDue(31 * kMs - 1).has_value());
  EXPECT_TRUE(link.PopDue(31 * kMs).has_value());
  EXPECT_EQ(link.stats().delivered_packets, 1u);
}

TEST(LinkModel, JitterKeepsFifoOrderUnlessReorderingIsAsked) {
  for (bool reorder : {false, true}) {
    LinkParams p;
    p.delay_ns = 10 * kMs;
    p.jitter_ns = 5 * kMs;
    p.reorder = reorder;
    Link link(p, 7);
    const int n = 2000;
    for (int i = 0; i < n; ++i) ASSERT_TRUE(Offer(link, i * 10 * kUs, 100));
    std::vector<uint64_t> order;
    int64_t last = 0;
    int64_t min_extra = INT64_MAX, max_extra = 0;
    while (auto pkt = link.PopDue(INT64_MAX)) {
      EXPECT_GE(pkt->release_ns, last);
      last = pkt->release_ns;
      const int64_t extra = pkt->release_ns - int64_t(pkt->seq) * 10 * kUs;
      min_extra = std::min(min_extra, extra);
      max_extra = std::max(max_extra, extra);
      order.push_back(pkt->seq);
    }
    ASSERT_EQ(order.size(), size_t(n));
    int inversions = 0;
    for (size_t i = 1; i < order.size(); ++i) inversions += order[i] < order[i - 1];
    EXPECT_GE(min_extra, 5 * kMs);
    if (reorder) {
      EXPECT_GT(inversions, n / 4) << "jitter of +-5 ms over 10 us spacing must reorder";
      EXPECT_LE(max_extra, 15 * kMs);
    } else {
      EXPECT_EQ(inversions, 0);
      // Clamping only ever waits for the packet before, so nothing exceeds the largest draw.
      EXPECT_LE(max_extra, 15 * kMs);
    }
  }
}

TEST(LinkModel, TailDropsAtTheQueueLimit) {
  LinkParams p;
  p.rate_bps = 8'000'000;
  p.queue_limit_bytes = 10'000;
  Link link(p, 1);
  int queued = 0;
  for (int i = 0; i < 20; ++i) queued += Offer(link, 0, 1000);
  EXPECT_EQ(queued, 10);
  EXPECT_EQ(link.stats().packets[int(Verdict::kQueueFull)], 10u);
  EXPECT_EQ(link.BacklogBytes(0), 10'000u);
  // After 3 ms three packets have left the serialiser, so three more fit.
  queued = 0;
  for (int i = 0; i < 5; ++i) queued += Offer(link, 3 * kMs, 1000);
  EXPECT_EQ(queued, 3);
}

TEST(LinkModel, DefaultQueueLimitIsOneBandwidthDelayProduct) {
  LinkParams p;
  p.rate_bps = 100'000'000;
  p.delay_ns = 50 * kMs;
  EXPECT_EQ(DefaultQueueLimit(p), 1'250'000u);  // 100 Mbit/s x 100 ms RTT.
  p.delay_ns = 0;
  EXPECT_EQ(DefaultQueueLimit(p), 64u * 1024);  // Floor.
  Link link(p, 1);
  EXPECT_EQ(link.queue_limit_bytes(), 64u * 1024);
}

TEST(LinkModel, BernoulliLossRateWithinStatisticalBounds) {
  LinkParams p;
  p.loss = 0.01;
  Link link(p, 42);
  const int n = 200'000;
  for (int i = 0; i < n; ++i) Offer(link, i, 100);
  const double lost = double(link.stats().packets[int(Verdict::kLost)]) / n;
  const double sigma = std::sqrt(0.01 * 0.99 / n);
  EXPECT_NEAR(lost, 0.01, 5 * sigma);
  EXPECT_EQ(link.queued_packets(), size_t(n) - link.stats().packets[int(Verdict::kLost)]);
}

TEST(LinkModel, GilbertElliottLossRateAndBurstLength) {
  LinkParams p;
  p.ge.p = 0.01;
  p.ge.r = 0.25;  // Mean burst 4 packets.
  p.ge.loss_bad = 1.0;
  p.ge.loss_good = 0.0;
  Link link(p, 3);
  const int n = 400'000;
  int bursts = 0;
  bool prev_lost = false;
  int lost = 0;
  for (int i = 0; i < n; ++i) {
    const bool l = !Offer(link, i, 100);
    lost += l;
    if (l && !prev_lost) ++bursts;
    prev_lost = l;
  }
  const double expected = p.ge.StationaryLoss();
  EXPECT_NEAR(expected, 0.01 / 0.26, 1e-12);
  EXPECT_NEAR(double(lost) / n, expected, expected * 0.1);
  EXPECT_NEAR(double(lost) / bursts, 1.0 / p.ge.r, 0.4);
}

TEST(LinkModel, SameSeedSameLossPattern) {
  LinkParams p;
  p.loss = 0.1;
  Link a(p, 9), b(p, 9), c(p, 10);
  int same = 0, diff = 0;
  for (int i = 0; i < 1000; ++i) {
    const bool la = Offer(a, i, 10), lb = Offer(b, i, 10), lc = Offer(c, i, 10);
    same += la == lb;
    diff += la != lc;
  }
  EXPECT_EQ(same, 1000);
  EXPECT_GT(diff, 0);
}

TEST(LinkModel, PolicerCapsEachFlowSeparately) {
  LinkParams p;
  p.flow_rate_bps = 8'000'000;  // One byte per microsecond.
  p.flow_burst_bytes = 64 * 1024;
  Link link(p, 1);
  FlowKey a{1, 2, 1000, 2000, 6};
  FlowKey b = a;
  b.sport = 1001;
  // Flow a offers 80 Mbit/s for one second: it keeps the burst plus 1 MB.
  uint64_t accepted = 0;
  for (int i = 0; i < 10'000; ++i) {
    if (Offer(link, i * 100 * kUs, 1000, &a)) accepted += 1000;
  }
  const double expected = 64 * 1024 + 1'000'000;
  EXPECT_NEAR(double(accepted), expected, expected * 0.02);
  EXPECT_GT(link.stats().packets[int(Verdict::kPoliced)], 8000u);
  // Flow b has its own bucket, full at first sight.
  for (int i = 0; i < 60; ++i) EXPECT_TRUE(Offer(link, 1000 * kMs, 1000, &b));
  // Unpoliced packets (no key) pass.
  EXPECT_TRUE(Offer(link, 1000 * kMs, 1000, nullptr));
}

TEST(LinkModel, RateChangeRetimesTheBacklog) {
  LinkParams p;
  p.rate_bps = 8'000'000;
  p.queue_limit_bytes = 1 << 20;
  Link link(p, 1);
  for (int i = 0; i < 10; ++i) ASSERT_TRUE(Offer(link, 0, 1000));  // Busy until 10 ms.
  LinkParams slow = p;
  slow.rate_bps = 4'000'000;
  link.SetParams(slow, 0);
  // The 10 KB still to serialise now take 20 ms; the next 1000 bytes take 2 ms more.
  ASSERT_TRUE(Offer(link, 0, 1000));
  int64_t last = 0;
  while (auto pkt = link.PopDue(INT64_MAX)) last = pkt->release_ns;
  EXPECT_EQ(last, 22 * kMs);
  // Unlimited: no serialisation at all.
  LinkParams fast = p;
  fast.rate_bps = 0;
  link.SetParams(fast, 30 * kMs);
  ASSERT_TRUE(Offer(link, 30 * kMs, 1000));
  EXPECT_EQ(link.NextReleaseNanos(), 30 * kMs);
}

TEST(LinkModel, DelayDropKeepsOrder) {
  LinkParams p;
  p.delay_ns = 100 * kMs;
  Link link(p, 1);
  ASSERT_TRUE(Offer(link, 0, 100));
  LinkParams shorter = p;
  shorter.delay_ns = 10 * kMs;
  link.SetParams(shorter, 1 * kMs);
  ASSERT_TRUE(Offer(link, 1 * kMs, 100));
  auto first = link.PopDue(INT64_MAX);
  auto second = link.PopDue(INT64_MAX);
  ASSERT_TRUE(first && second);
  EXPECT_EQ(first->seq, 0u);
  EXPECT_EQ(second->release_ns, 100 * kMs);  // Waits for the packet ahead of it.
}

TEST(LinkModel, ParsesFlowKeys) {
  uint8_t pkt[40] = {0x45, 0, 0, 40, 0, 0, 0x40, 0, 64, 6, 0, 0, 10, 201, 0, 1, 10, 201, 1, 1,
                     0x13, 0x88, 0x00, 0x50};
  auto k = ParseFlowKey(pkt, sizeof(pkt));
  ASSERT_TRUE(k.has_value());
  EXPECT_EQ(k->proto, 6);
  EXPECT_EQ(k->sport, 5000);
  EXPECT_EQ(k->dport, 80);
  EXPECT_FALSE(ParseFlowKey(pkt, 19).has_value());
  pkt[0] = 0x60;
  EXPECT_FALSE(ParseFlowKey(pkt, sizeof(pkt)).has_value());
  pkt[0] = 0x4f;  // IHL 60 > length.
  EXPECT_FALSE(ParseFlowKey(pkt, sizeof(pkt)).has_value());
}

// A 40-byte IPv4 + TCP header with the given protocol, TCP flags and fragment offset.
std::vector<uint8_t> Ipv4Packet(uint8_t proto, uint8_t tcp_flags, uint16_t fragment_offset = 0) {
  std::vector<uint8_t> p(40, 0);
  p[0] = 0x45;  // IPv4, 20-byte header
  p[3] = 40;
  p[6] = static_cast<uint8_t>(fragment_offset >> 8);
  p[7] = static_cast<uint8_t>(fragment_offset);
  p[9] = proto;
  p[33] = tcp_flags;  // TCP header at 20: flags at offset 13
  return p;
}

constexpr uint8_t kSyn = 0x02, kAck = 0x10, kFin = 0x01;

TEST(LinkModel, DropSynRefusesConnectionAttemptsOnly) {
  EXPECT_TRUE(IsTcpConnectionAttempt(Ipv4Packet(6, kSyn).data(), 40));
  EXPECT_FALSE(IsTcpConnectionAttempt(Ipv4Packet(6, kSyn | kAck).data(), 40));
  EXPECT_FALSE(IsTcpConnectionAttempt(Ipv4Packet(6, kAck).data(), 40));
  EXPECT_FALSE(IsTcpConnectionAttempt(Ipv4Packet(17, kSyn).data(), 40));  // UDP
  EXPECT_FALSE(IsTcpConnectionAttempt(Ipv4Packet(6, kSyn, 100).data(), 40));  // not the first
  EXPECT_FALSE(IsTcpConnectionAttempt(Ipv4Packet(6, kSyn).data(), 30));  // truncated

  LinkParams p;
  p.drop_syn = true;
  Link firewalled(p, 3);
  Link open(LinkParams(), 3);
  struct Offered {
    uint8_t proto, flags;
    bool filtered;
  };
  const Offered packets[] = {{6, kSyn, true},        {6, kSyn | kAck, false}, {6, kAck, false},
                             {6, kAck | kFin, false}, {17, kSyn, false},      {6, kSyn, true}};
  for (const Offered& o : packets) {
    auto a = Ipv4Packet(o.proto, o.flags);
    auto b = Ipv4Packet(o.proto, o.flags);
    EXPECT_EQ(firewalled.Enqueue(0, a, nullptr),
              o.filtered ? Verdict::kFiltered : Verdict::kQueued)
        << int(o.proto) << "/" << int(o.flags);
    EXPECT_EQ(open.Enqueue(0, b, nullptr), Verdict::kQueued);
  }
  EXPECT_EQ(firewalled.stats().packets[int(Verdict::kFiltered)], 2u);
  EXPECT_EQ(firewalled.queued_packets(), 4u);
  EXPECT_EQ(open.queued_packets(), 6u);
  EXPECT_NE(p.ToString().find("syn=drop"), std::string::npos) << p.ToString();
}

}  // namespace
}  // namespace strait::wanem

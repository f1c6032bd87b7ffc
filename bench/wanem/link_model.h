// The model of one directed WAN link that strait-wanem applies to every packet: random and bursty
// loss, a per-flow policer, a tail-drop queue drained at the link rate, then propagation delay
// with jitter. Pure computation on caller-supplied times, so unit tests drive it with a fake
// clock and the router drives it with the monotonic clock.
//
// Usage: Link link(params, seed);
//        Verdict v = link.Enqueue(now, std::move(bytes));      // on every packet read
//        while (auto p = link.PopDue(now)) Send(p->data);       // when the timer fires
//        arm the timer for link.NextReleaseNanos().
// Not thread-safe: one router thread owns each Link.
#ifndef STRAIT_BENCH_WANEM_LINK_MODEL_H_
#define STRAIT_BENCH_WANEM_LINK_MODEL_H_

#include <cstdint>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

namespace strait::wanem {

// Small deterministic generator (xoshiro256**), so a seed reproduces a loss pattern everywhere.
class Rng {
 public:
  explicit Rng(uint64_t seed) noexcept;
  uint64_t Next() noexcept;
  // Uniform in [0, 1).
  double Uniform() noexcept { return static_cast<double>(Next() >> 11) * 0x1.0p-53; }

 private:
  uint64_t s_[4];
};

// Gilbert-Elliott two-state loss (the same parameters as netem's "loss gemodel p r 1-h 1-k"):
// per packet, first the current state decides the loss, then the state moves on. Disabled when
// p == 0. Stationary loss = (r * loss_good + p * loss_bad) / (p + r); mean burst length 1 / r.
struct GilbertElliottParams {
  double p = 0.0;          // P(good -> bad) per packet.
  double r = 1.0;          // P(bad -> good) per packet.
  double loss_bad = 1.0;   // Loss probability in the bad state (1 - h).
  double loss_good = 0.0;  // Loss probability in the good state (1 - k).
  bool enabled() const noexcept { return p > 0.0; }
  double StationaryLoss() const noexcept;
};

// Everything that shapes one directed link. A zero rate means unlimited (no serialisation, no
// queue); a zero queue limit means "one bandwidth-delay product" (DefaultQueueLimit).
struct LinkParams {
  uint64_t rate_bps = 0;
  int64_t delay_ns = 0;          // One-way propagation delay.
  int64_t jitter_ns = 0;         // Uniform in [-jitter, +jitter], the result clamped at 0.
  bool reorder = false;          // false: jitter never lets a packet overtake an earlier one.
  double loss = 0.0;             // Bernoulli loss probability per packet.
  GilbertElliottParams ge;       // Bursty loss, applied in addition to `loss`.
  uint64_t queue_limit_bytes = 0;
  uint64_t flow_rate_bps = 0;    // Per-5-tuple policer rate; 0 disables it.
  uint64_t flow_burst_bytes = 0; // Policer bucket depth; 0 = DefaultFlowBurst.
  // A one-way firewall (a region behind NAT): TCP SYNs without ACK -- new connections from the
  // source region into the destination -- are dropped; every other packet, the SYN-ACK of a
  // connection the destination opened included, passes. Set on every link into a region, it
  // admits no inbound connection while its own connections out work.
  bool drop_syn = false;

  // "rate=50 Mbit/s delay=25 ms loss=1% ..." for logs and the self-check.
  std::string ToString() const;
};

// rate x 2 x delay / 8 (the delay of one direction stands in for half the RTT), never below
// 64 KiB so that a near-zero-delay link still holds a few full-size packets.
uint64_t DefaultQueueLimit(const LinkParams& params);
// rate x 5 ms / 8, never below 64 KiB: large enough for a TSO-free sender's bursts.
uint64_t DefaultFlowBurst(const LinkParams& params);

// What happened to an offered packet. Explicit values: they index the statistics array.
enum class Verdict : int {
  kQueued = 0,
  kLost = 1,         // Bernoulli or Gilbert-Elliott loss.
  kPoliced = 2,      // Over the per-flow rate.
  kQueueFull = 3,    // Tail drop.
  kFiltered = 4,     // A connection attempt refused by drop_syn.
};
inline constexpr int kVerdictCount = 5;

// The 5-tuple a policer keys on (ports are 0 for protocols without them).
struct FlowKey {
  uint32_t src = 0;
  uint32_t dst = 0;
  uint16_t sport = 0;
  uint16_t dport = 0;
  uint8_t proto = 0;
  friend bool operator==(const FlowKey&, const FlowKey&) = default;
};
struct FlowKeyHash {
  size_t operator()(const FlowKey& k) const noexcept;
};
// Extracts the key from an IPv4 packet; nullopt when it is not a well-formed IPv4 header.
std::optional<FlowKey> ParseFlowKey(const uint8_t* data, size_t len) noexcept;
// Whether an IPv4 packet opens a TCP connection: SYN set, ACK clear (what drop_syn drops).
bool IsTcpConnectionAttempt(const uint8_t* data, size_t len) noexcept;

struct LinkStats {
  uint64_t packets[kVerdictCount] = {};
  uint64_t bytes[kVerdictCount] = {};
  uint64_t delivered_packets = 0;
  uint64_t delivered_bytes = 0;
  // A gauge, not a counter: bytes waiting for serialisation when the snapshot was taken (the
  // router fills it in), to tell a standing queue from bursts that overflow an empty one.
  uint64_t backlog_bytes = 0;
};

struct Packet {
  int64_t release_ns = 0;
  uint64_t seq = 0;
  std::vector<uint8_t> data;
};

class Link {
 public:
  Link(const LinkParams& params, uint64_t seed);

  // Takes effect for packets offered from now on; packets already queued keep their release
  // times. The bytes still waiting for serialisation are re-timed at the new rate, so a rate
  // drop delays the next packet at once, as on a real link whose capacity shrinks.
  void SetParams(const LinkParams& params, int64_t now_ns);
  const LinkParams& params() const noexcept { return params_; }
  uint64_t queue_limit_bytes() const noexcept { return queue_limit_; }

  // Offers a packet at now_ns. `key` feeds the policer (nullptr: not policed). On kQueued the
  // link keeps the bytes; otherwise they are returned to the caller's pool through `data`.
  Verdict Enqueue(int64_t now_ns, std::vector<uint8_t>& data, const FlowKey* key);

  // The next packet whose release time is <= now_ns, or nullopt.
  std::optional<Packet> PopDue(int64_t now_ns);
  // Release time of the earliest queued packet; INT64_MAX when empty.
  int64_t NextReleaseNanos() const noexcept;
  size_t queued_packets() const noexcept { return heap_.size(); }
  // Bytes waiting for serialisation at now_ns (what the queue limit bounds).
  uint64_t BacklogBytes(int64_t now_ns) const noexcept;

  const LinkStats& stats() const noexcept { return stats_; }

 private:
  // Min-heap order on (release time, arrival order): equal times leave in arrival order.
  struct Later {
    bool operator()(const Packet& a, const Packet& b) const noexcept {
      return a.release_ns != b.release_ns ? a.release_ns > b.release_ns : a.seq > b.seq;
    }
  };
  struct Bucket {
    double tokens = 0;
    int64_t last_ns = 0;
  };

  bool DrawLoss() noexcept;
  bool Police(int64_t now_ns, const FlowKey& key, size_t bytes);
  int64_t SerialisationNanos(size_t bytes) const noexcept;

  LinkParams params_;
  uint64_t queue_limit_ = 0;
  uint64_t flow_burst_ = 0;
  Rng rng_;
  bool ge_bad_ = false;
  int64_t last_departure_ns_ = 0;  // When the serialiser finishes the last accepted packet.
  int64_t last_release_ns_ = 0;    // Keeps FIFO order under jitter.
  uint64_t next_seq_ = 0;
  std::vector<Packet> heap_;  // std::push_heap / pop_heap with Later.
  std::unordered_map<FlowKey, Bucket, FlowKeyHash> buckets_;
  LinkStats stats_;
};

}  // namespace strait::wanem

#endif  // STRAIT_BENCH_WANEM_LINK_MODEL_H_

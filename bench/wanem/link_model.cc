// The directed-link model: loss, policer, tail-drop queue, serialisation, delay and jitter.
#include "bench/wanem/link_model.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <sstream>

#include "common/units.h"

namespace strait::wanem {
namespace {

uint64_t SplitMix(uint64_t& x) noexcept {
  uint64_t z = (x += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

uint64_t Rotl(uint64_t x, int k) noexcept { return (x << k) | (x >> (64 - k)); }

constexpr uint64_t kMinQueueBytes = 64 * 1024;
constexpr uint64_t kMinBurstBytes = 64 * 1024;
// Idle policer buckets are swept once the table grows past this, so a port scan cannot grow it
// without bound.
constexpr size_t kMaxBuckets = 4096;

}  // namespace

Rng::Rng(uint64_t seed) noexcept {
  for (auto& s : s_) s = SplitMix(seed);
}

uint64_t Rng::Next() noexcept {
  const uint64_t result = Rotl(s_[1] * 5, 7) * 9;
  const uint64_t t = s_[1] << 17;
  s_[2] ^= s_[0];
  s_[3] ^= s_[1];
  s_[1] ^= s_[2];
  s_[0] ^= s_[3];
  s_[2] ^= t;
  s_[3] = Rotl(s_[3], 45);
  return result;
}

double GilbertElliottParams::StationaryLoss() const noexcept {
  if (!enabled()) return 0.0;
  return (r * loss_good + p * loss_bad) / (p + r);
}

std::string LinkParams::ToString() const {
  std::ostringstream os;
  os << "rate=" << (rate_bps == 0 ? std::string("unlimited") : FormatRate(double(rate_bps)))
     << " delay=" << FormatDuration(delay_ns);
  if (jitter_ns > 0) os << " jitter=" << FormatDuration(jitter_ns) << (reorder ? " reorder" : "");
  if (loss > 0) os << " loss=" << loss * 100 << "%";
  if (ge.enabled()) {
    os << " ge=" << ge.p << ":" << ge.r << ":" << ge.loss_bad << ":" << ge.loss_good;
  }
  if (queue_limit_bytes > 0) os << " queue=" << FormatBytes(queue_limit_bytes);
  if (flow_rate_bps > 0) os << " flowrate=" << FormatRate(double(flow_rate_bps));
  if (drop_syn) os << " syn=drop";
  return os.str();
}

uint64_t DefaultQueueLimit(const LinkParams& params) {
  if (params.rate_bps == 0) return 0;
  const long double bdp = static_cast<long double>(params.rate_bps) * 2.0L *
                          static_cast<long double>(params.delay_ns) / 8e9L;
  return std::max<uint64_t>(kMinQueueBytes, static_cast<uint64_t>(bdp));
}

uint64_t DefaultFlowBurst(const LinkParams& params) {
  const long double burst = static_cast<long double>(params.flow_rate_bps) * 5e-3L / 8.0L;
  return std::max<uint64_t>(kMinBurstBytes, static_cast<uint64_t>(burst));
}

size_t FlowKeyHash::operator()(const FlowKey& k) const noexcept {
  uint64_t x = (uint64_t{k.src} << 32) ^ k.dst;
  uint64_t y = (uint64_t{k.sport} << 24) ^ (uint64_t{k.dport} << 8) ^ k.proto;
  x ^= SplitMix(y);
  return static_cast<size_t>(SplitMix(x));
}

std::optional<FlowKey> ParseFlowKey(const uint8_t* data, size_t len) noexcept {
  if (len < 20 || (data[0] >> 4) != 4) return std::nullopt;
  const size_t ihl = size_t{data[0] & 0x0fu} * 4;
  if (ihl < 20 || ihl > len) return std::nullopt;
  FlowKey key;
  key.proto = data[9];
  std::memcpy(&key.src, data + 12, 4);
  std::memcpy(&key.dst, data + 16, 4);
  const bool first_fragment = ((data[6] & 0x1fu) | data[7]) == 0;
  if ((key.proto == 6 || key.proto == 17) && first_fragment && len >= ihl + 4) {
    key.sport = static_cast<uint16_t>((data[ihl] << 8) | data[ihl + 1]);
    key.dport = static_cast<uint16_t>((data[ihl + 2] << 8) | data[ihl + 3]);
  }
  return key;
}

bool IsTcpConnectionAttempt(const uint8_t* data, size_t len) noexcept {
  if (len < 20 || (data[0] >> 4) != 4 || data[9] != 6) return false;
  const size_t ihl = size_t{data[0] & 0x0fu} * 4;
  const bool first_fragment = ((data[6] & 0x1fu) | data[7]) == 0;
  if (ihl < 20 || !first_fragment || len < ihl + 14) return false;
  const uint8_t flags = data[ihl + 13];
  constexpr uint8_t kSyn = 0x02, kAck = 0x10;
  return (flags & kSyn) != 0 && (flags & kAck) == 0;
}

Link::Link(const LinkParams& params, uint64_t seed) : rng_(seed) { SetParams(params, 0); }

void Link::SetParams(const LinkParams& params, int64_t now_ns) {
  // Re-time the serialisation backlog: the bytes left are the same, the rate is not.
  if (params_.rate_bps != 0 && params.rate_bps != 0 && last_departure_ns_ > now_ns &&
      params.rate_bps != params_.rate_bps) {
    const long double left = static_cast<long double>(last_departure_ns_ - now_ns) *
                             static_cast<long double>(params_.rate_bps) /
                             static_cast<long double>(params.rate_bps);
    last_departure_ns_ = now_ns + static_cast<int64_t>(left);
  } else if (params.rate_bps == 0) {
    last_departure_ns_ = std::min(last_departure_ns_, now_ns);
  }
  if (params_.ge.enabled() && !params.ge.enabled()) ge_bad_ = false;
  params_ = params;
  queue_limit_ = params.queue_limit_bytes != 0 ? params.queue_limit_bytes
                                               : DefaultQueueLimit(params);
  flow_burst_ = params.flow_burst_bytes != 0 ? params.flow_burst_bytes : DefaultFlowBurst(params);
  if (params.flow_rate_bps == 0) buckets_.clear();
}

bool Link::DrawLoss() noexcept {
  bool lost = false;
  if (params_.loss > 0.0 && rng_.Uniform() < params_.loss) lost = true;
  if (params_.ge.enabled()) {
    const GilbertElliottParams& ge = params_.ge;
    const double p_loss = ge_bad_ ? ge.loss_bad : ge.loss_good;
    if (p_loss > 0.0 && rng_.Uniform() < p_loss) lost = true;
    const double p_move = ge_bad_ ? ge.r : ge.p;
    if (rng_.Uniform() < p_move) ge_bad_ = !ge_bad_;
  }
  return lost;
}

bool Link::Police(int64_t now_ns, const FlowKey& key, size_t bytes) {
  if (buckets_.size() >= kMaxBuckets) {
    // Drop buckets that have been idle long enough to be full again: forgetting them is exact.
    const double refill_ns = double(flow_burst_) * 8e9 / double(params_.flow_rate_bps);
    std::erase_if(buckets_, [&](const auto& kv) {
      return double(now_ns - kv.second.last_ns) >= refill_ns;
    });
  }
  auto [it, inserted] = buckets_.try_emplace(key);
  Bucket& b = it->second;
  if (inserted) {
    b.tokens = double(flow_burst_);
  } else if (now_ns > b.last_ns) {
    b.tokens = std::min(double(flow_burst_),
                        b.tokens + double(now_ns - b.last_ns) * double(params_.flow_rate_bps) /
                                       8e9);
  }
  b.last_ns = std::max(b.last_ns, now_ns);
  if (b.tokens < double(bytes)) return false;
  b.tokens -= double(bytes);
  return true;
}

int64_t Link::SerialisationNanos(size_t bytes) const noexcept {
  if (params_.rate_bps == 0) return 0;
  return static_cast<int64_t>(static_cast<long double>(bytes) * 8e9L /
                              static_cast<long double>(params_.rate_bps));
}

uint64_t Link::BacklogBytes(int64_t now_ns) const noexcept {
  if (params_.rate_bps == 0 || last_departure_ns_ <= now_ns) return 0;
  return static_cast<uint64_t>(static_cast<long double>(last_departure_ns_ - now_ns) *
                               static_cast<long double>(params_.rate_bps) / 8e9L);
}

Verdict Link::Enqueue(int64_t now_ns, std::vector<uint8_t>& data, const FlowKey* key) {
  const size_t size = data.size();
  Verdict verdict = Verdict::kQueued;
  // The firewall comes first and draws no random number, so turning it on leaves the loss
  // pattern of the other packets as it was.
  if (params_.drop_syn && IsTcpConnectionAttempt(data.data(), size)) {
    verdict = Verdict::kFiltered;
  } else if (DrawLoss()) {
    verdict = Verdict::kLost;
  } else if (params_.flow_rate_bps != 0 && key != nullptr && !Police(now_ns, *key, size)) {
    verdict = Verdict::kPoliced;
  } else if (params_.rate_bps != 0 && BacklogBytes(now_ns) + size > queue_limit_) {
    verdict = Verdict::kQueueFull;
  }
  stats_.packets[static_cast<int>(verdict)]++;
  stats_.bytes[static_cast<int>(verdict)] += size;
  if (verdict != Verdict::kQueued) return verdict;

  const int64_t departure = std::max(now_ns, last_departure_ns_) + SerialisationNanos(size);
  last_departure_ns_ = departure;
  int64_t delay = params_.delay_ns;
  if (params_.jitter_ns > 0) {
    const double u = rng_.Uniform() * 2.0 - 1.0;
    delay += static_cast<int64_t>(u * double(params_.jitter_ns));
    delay = std::max<int64_t>(delay, 0);
  }
  int64_t release = departure + delay;
  if (!params_.reorder) release = std::max(release, last_release_ns_);
  last_release_ns_ = std::max(last_release_ns_, release);

  heap_.push_back(Packet{release, next_seq_++, std::move(data)});
  std::push_heap(heap_.begin(), heap_.end(), Later());
  data = std::vector<uint8_t>();
  return verdict;
}

std::optional<Packet> Link::PopDue(int64_t now_ns) {
  if (heap_.empty() || heap_.front().release_ns > now_ns) return std::nullopt;
  std::pop_heap(heap_.begin(), heap_.end(), Later());
  Packet p = std::move(heap_.back());
  heap_.pop_back();
  stats_.delivered_packets++;
  stats_.delivered_bytes += p.data.size();
  return p;
}

int64_t Link::NextReleaseNanos() const noexcept {
  return heap_.empty() ? INT64_MAX : heap_.front().release_ns;
}

}  // namespace strait::wanem

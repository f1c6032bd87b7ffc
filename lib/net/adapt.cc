// Codec choice, chunk sizing and stream-count hill climbing (see adapt.h).
#include "net/adapt.h"

#include <algorithm>
#include <cmath>

namespace strait::net {

CodecChoice ChooseCodec(const LinkEstimates& link, std::span<const CodecProfile> profiles,
                        std::span<const CodecId> allowed, uint64_t message_bytes,
                        double fallback_bytes_per_s) {
  const double bandwidth =
      link.goodput_bytes_per_s > 0 ? link.goodput_bytes_per_s : fallback_bytes_per_s;
  const double bytes = static_cast<double>(message_bytes);
  CodecChoice best{CodecId::kNone, bandwidth > 0 ? bytes / bandwidth : 0};
  if (bandwidth <= 0) return best;
  for (const CodecProfile& profile : profiles) {
    if (profile.codec == CodecId::kNone) continue;
    if (std::find(allowed.begin(), allowed.end(), profile.codec) == allowed.end()) continue;
    if (!(profile.ratio >= kMinUsefulRatio) || !(profile.encode_bytes_per_s > 0) ||
        !(profile.decode_bytes_per_s > 0)) {
      continue;
    }
    const double t = std::max({bytes / profile.encode_bytes_per_s,
                               bytes / profile.ratio / bandwidth,
                               bytes / profile.decode_bytes_per_s});
    if (t < best.expected_seconds) best = CodecChoice{profile.codec, t};
  }
  return best;
}

uint32_t ChooseChunkBytes(const LinkEstimates& link, int streams, uint32_t current,
                          uint32_t min_bytes, uint32_t max_bytes) {
  if (link.goodput_bytes_per_s <= 0 || link.rtt_smoothed_ns <= 0 || streams <= 0) return current;
  const double bdp = link.goodput_bytes_per_s * static_cast<double>(link.rtt_smoothed_ns) * 1e-9;
  double chunk = bdp / streams / 4;
  constexpr double kGranule = 64 * 1024;
  chunk = std::max(kGranule, std::round(chunk / kGranule) * kGranule);
  chunk = std::clamp(chunk, static_cast<double>(min_bytes), static_cast<double>(max_bytes));
  return static_cast<uint32_t>(chunk);
}

StreamCountController::StreamCountController(int initial, int min_streams, int max_streams,
                                             double gain, int hold_rounds)
    : current_(std::clamp(initial, min_streams, max_streams)),
      min_(min_streams),
      max_(max_streams),
      gain_(gain),
      hold_rounds_(hold_rounds),
      best_k_(current_) {}

int StreamCountController::Update(double goodput_bytes_per_s, bool busy) {
  if (!busy || goodput_bytes_per_s <= 0) return current_;
  if (hold_ > 0) {
    // Holding at the best K: keep its goodput current so a later probe compares against now.
    --hold_;
    best_goodput_ = goodput_bytes_per_s;
    if (hold_ == 0) probing_up_ = true;
    if (hold_ == 0 && current_ < max_) ++current_;
    return current_;
  }
  if (current_ == best_k_) {
    best_goodput_ = std::max(best_goodput_, goodput_bytes_per_s);
    if (probing_up_ && current_ < max_) ++current_;
    return current_;
  }
  if (goodput_bytes_per_s > best_goodput_ * (1 + gain_)) {
    best_k_ = current_;
    best_goodput_ = goodput_bytes_per_s;
    if (current_ < max_) ++current_;
    return current_;
  }
  // The last stream added did not pay: go back to the best K and hold.
  current_ = std::max(min_, best_k_);
  probing_up_ = false;
  hold_ = hold_rounds_;
  return current_;
}

}  // namespace strait::net

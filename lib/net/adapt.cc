// Codec choice, chunk sizing and stream-count hill climbing (see adapt.h).
#include "net/adapt.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <limits>

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

double LossyRatio(CodecId codec, DataType dtype, uint32_t block_size) {
  double code_bytes = 0;
  switch (codec) {
    case CodecId::kInt8: code_bytes = 1; break;
    case CodecId::kFp8E4M3: code_bytes = 1; break;
    case CodecId::kInt4: code_bytes = 0.5; break;
    default: return 1;
  }
  const double scale_bytes = 4.0 / std::max<uint32_t>(block_size, 1);
  return static_cast<double>(DataTypeSize(dtype)) / (code_bytes + scale_bytes);
}

CodecProfile ProfileFor(const CodecProfile& profile, DataType dtype) {
  CodecProfile p = profile;
  if (IsLossyCodec(p.codec)) p.ratio = LossyRatio(p.codec, dtype);
  return p;
}

std::vector<CodecProfile> MeasureCodecProfiles(size_t sample_bytes) {
  const size_t count = std::max<size_t>(sample_bytes / sizeof(float), 1024);
  // Gradient-like noise: an approximately normal value (sum of uniforms, from a fixed-seed
  // xorshift so that every gateway measures the same bytes) times a small scale.
  std::vector<float> sample(count);
  uint64_t x = 0x9e3779b97f4a7c15ull;
  for (float& v : sample) {
    double sum = 0;
    for (int k = 0; k < 4; ++k) {
      x ^= x << 13;
      x ^= x >> 7;
      x ^= x << 17;
      sum += static_cast<double>(x >> 11) * (1.0 / 9007199254740992.0);
    }
    v = static_cast<float>((sum - 2.0) * 1e-3);
  }
  std::vector<CodecProfile> profiles;
  Encoder encoder;
  Decoder decoder;
  std::vector<uint8_t> frame;
  std::vector<float> decoded(count);
  const double bytes = static_cast<double>(count * sizeof(float));
  using Clock = std::chrono::steady_clock;
  for (int c = 0; c < kNumCodecs; ++c) {
    CodecProfile p;
    p.codec = static_cast<CodecId>(c);
    CodecOptions o;
    o.codec = p.codec;
    double best_encode = std::numeric_limits<double>::infinity();
    double best_decode = std::numeric_limits<double>::infinity();
    bool ok = true;
    for (int round = 0; round < 2 && ok; ++round) {
      const auto t0 = Clock::now();
      ok = encoder.Encode(sample.data(), count, DataType::kFloat32, o, &frame).ok();
      const auto t1 = Clock::now();
      ok = ok && decoder.Decode(frame, decoded.data(), count, DataType::kFloat32).ok();
      const auto t2 = Clock::now();
      best_encode = std::min(best_encode, std::chrono::duration<double>(t1 - t0).count());
      best_decode = std::min(best_decode, std::chrono::duration<double>(t2 - t1).count());
    }
    if (ok && !frame.empty()) {
      // A clock too coarse to see the work reads as very fast, never as infinitely fast.
      p.encode_bytes_per_s = bytes / std::max(best_encode, 1e-9);
      p.decode_bytes_per_s = bytes / std::max(best_decode, 1e-9);
      p.ratio = IsLossyCodec(p.codec) ? LossyRatio(p.codec, DataType::kFloat32)
                                      : bytes / static_cast<double>(frame.size());
    }
    profiles.push_back(p);
  }
  return profiles;
}

int64_t PathRttNs(const LinkEstimates& link) {
  if (link.tcp_min_rtt_ns > 0) return link.tcp_min_rtt_ns;
  if (link.rtt_min_ns > 0) return link.rtt_min_ns;
  if (link.tcp_rtt_ns > 0) return link.tcp_rtt_ns;
  return link.rtt_smoothed_ns;
}

uint32_t ChooseChunkBytes(const LinkEstimates& link, int streams, uint32_t current,
                          uint32_t min_bytes, uint32_t max_bytes) {
  const int64_t rtt_ns = PathRttNs(link);
  if (link.goodput_bytes_per_s <= 0 || rtt_ns <= 0 || streams <= 0) return current;
  const double bdp = link.goodput_bytes_per_s * static_cast<double>(rtt_ns) * 1e-9;
  double chunk = bdp / streams / 4;
  constexpr double kGranule = 64 * 1024;
  chunk = std::max(kGranule, std::round(chunk / kGranule) * kGranule);
  chunk = std::clamp(chunk, static_cast<double>(min_bytes), static_cast<double>(max_bytes));
  return static_cast<uint32_t>(chunk);
}

bool QueueBuilding(int64_t path_rtt_ns, int64_t stream_rtt_ns) {
  if (path_rtt_ns <= 0 || stream_rtt_ns <= 0) return false;
  return static_cast<double>(stream_rtt_ns) >
         kQueueRttFactor * static_cast<double>(path_rtt_ns) + static_cast<double>(kQueueSlackNs);
}

StreamCountController::StreamCountController(int initial, int min_streams, int max_streams,
                                             double gain, int hold_rounds)
    : current_(std::clamp(initial, min_streams, max_streams)),
      min_(min_streams),
      max_(max_streams),
      gain_(gain),
      hold_rounds_(hold_rounds),
      base_k_(current_) {}

double StreamCountController::Mean(const std::vector<Round>& rounds) {
  double sum = 0;
  for (const Round& r : rounds) sum += r.goodput;
  return rounds.empty() ? 0 : sum / static_cast<double>(rounds.size());
}

bool StreamCountController::Queued(const std::vector<Round>& rounds, size_t skip) {
  // The mean over the rounds, not any one: a cubic sawtooth fills the queue for part of a round
  // even when the streams are loss-bound on average.
  int64_t path = 0;
  double rtt_sum = 0;
  int n = 0;
  for (size_t i = std::min(skip, rounds.size()); i < rounds.size(); ++i) {
    const RoundSignals& s = rounds[i].signals;
    if (s.path_rtt_ns <= 0 || s.stream_rtt_ns <= 0) continue;
    path = path == 0 ? s.path_rtt_ns : std::min(path, s.path_rtt_ns);
    rtt_sum += static_cast<double>(s.stream_rtt_ns);
    ++n;
  }
  return n > 0 && QueueBuilding(path, static_cast<int64_t>(rtt_sum / n));
}

double StreamCountController::LossFraction(const std::vector<Round>& rounds, size_t skip) {
  double retrans = 0;
  double goodput = 0;
  for (size_t i = std::min(skip, rounds.size()); i < rounds.size(); ++i) {
    retrans += rounds[i].signals.retrans_per_s;
    goodput += rounds[i].goodput;
  }
  return goodput > 0 ? retrans * kSegmentBytes / goodput : 0;
}

double StreamCountController::Scaling(double value) const {
  return (value / base_goodput_) / (static_cast<double>(current_) / static_cast<double>(base_k_));
}

int StreamCountController::Double() {
  current_ = std::min(max_, 2 * current_);
  rounds_.clear();
  return current_;
}

int StreamCountController::Hold(int k) {
  current_ = std::clamp(k, min_, max_);
  phase_ = Phase::kHolding;
  hold_ = hold_rounds_;
  rounds_.clear();
  base_paid_ = false;
  loss_before_ = -1;
  return current_;
}

int StreamCountController::Accept() {
  // Goodput that grew nearly in proportion to K says each stream is bound by itself (loss, a
  // per-flow cap), not by the link: the next step quadruples.
  const double value = Mean(rounds_);
  const double scaling = Scaling(value);
  base_k_ = current_;
  base_goodput_ = value;
  base_loss_ = LossFraction(rounds_);
  loss_before_ = -1;
  if (current_ >= max_) return Hold(current_);
  base_paid_ = true;
  if (scaling >= kLinearScaling) current_ = std::min(max_, 2 * current_);
  return Double();
}

int StreamCountController::Update(double goodput_bytes_per_s, bool busy,
                                  const RoundSignals& signals) {
  if (!busy || !(goodput_bytes_per_s > 0)) return current_;
  const double goodput = goodput_bytes_per_s;
  switch (phase_) {
    case Phase::kHolding:
      // Keep the reference current (the mean of the last few rounds, not one noisy round), so
      // that the next probe compares against now.
      rounds_.push_back(Round{goodput, signals});
      if (rounds_.size() > static_cast<size_t>(kMaxRoundsPerStep)) rounds_.erase(rounds_.begin());
      base_k_ = current_;
      base_goodput_ = Mean(rounds_);
      base_loss_ = LossFraction(rounds_);
      if (--hold_ > 0) return current_;
      if (Queued(rounds_) ||
          (loss_before_ >= 0 && base_loss_ > loss_before_ + kMaxAddedLoss &&
           base_loss_ > 2 * loss_before_)) {
        // The path is still full (a queue, or still the loss that came with this K): a probe
        // would only take share from the flows beside ours.
        hold_ = hold_rounds_;
        return current_;
      }
      phase_ = Phase::kGrowing;
      if (current_ < max_) return Double();
      rounds_.clear();
      return current_;

    case Phase::kGrowing: {
      if (current_ == base_k_ || base_goodput_ <= 0) {
        // The starting point. Its first round follows the link's start-up, whose slow-start
        // overshoot reads high (and would make the first doubling look useless): the second
        // round is the reference.
        base_k_ = current_;
        base_goodput_ = goodput;
        rounds_.push_back(Round{goodput, signals});
        if (rounds_.size() < static_cast<size_t>(kRoundsPerStep) && current_ < max_) {
          return current_;
        }
        const double loss = LossFraction(rounds_, 1);
        const bool overflowed =
            loss_before_ >= 0 && loss > loss_before_ + kMaxAddedLoss && loss > 2 * loss_before_;
        base_loss_ = loss;
        if (Queued(rounds_, 1) || overflowed) {
          // Already full with these streams: hold (the loss before the step, if any, stays the
          // reference at the end of the hold). Not fewer streams either: halving a queued
          // start cost more in dips than it saved (see adapt.h).
          const double before = loss_before_;
          Hold(current_);
          loss_before_ = before;
          return current_;
        }
        if (current_ >= max_) return Hold(current_);
        return Double();
      }
      rounds_.push_back(Round{goodput, signals});
      // Never on one round: the first round after a change reads the new streams' start-up (a
      // cubic stream's slow start overshoots until its first losses), and a lucky one that
      // passed a step stood as the reference the next step could not beat by `gain`.
      if (rounds_.size() < static_cast<size_t>(kRoundsPerStep)) return current_;
      // The step is judged on the mean of its rounds.
      const double value = Mean(rounds_);
      const bool queued = Queued(rounds_);
      // The step overflowed the bottleneck when its retransmissions per byte rose well above
      // the base's (the path's own random loss is the same fraction at any K): with a buffer
      // too shallow to show a queue, that is the only sign that the path is full.
      const double loss = LossFraction(rounds_);
      // Unless goodput grew nearly in proportion to K: then every stream is bound by itself (a
      // per-flow policer, random loss), not by a shared bottleneck, whatever the
      // retransmissions say. Behind a policer at 20% of a 100 Mbit/s link, BBR went from
      // 16.8 Mbit/s with 1 stream and no retransmissions to 38.8 with 2 and 527/s -- a
      // "loss jump" that held K at 2 in half the runs. A queue still counts: a policer drops
      // and never queues, so a standing queue is a shared bottleneck that is full.
      const bool overflowed = loss > base_loss_ + kMaxAddedLoss && loss > 2 * base_loss_ &&
                              Scaling(value) < kLinearScaling;
      if (value >= base_goodput_ * (1 + gain_)) {
        if (!queued && !overflowed) return Accept();
        // It paid (the path had room: its base showed no queue, or K would not have doubled),
        // but is full now: no further doubling. Not back either: behind a per-flow policer at
        // 20% of the link 4 BBR streams carried 76 Mbit/s and 8 carried 96, with a queue of
        // 100 ms and 18% retransmissions.
        // Judged again as a start (two more rounds, the first left out) before it may double:
        // the queue of new streams' start-up passes (cubic at 0.1% loss: 8 streams read 93
        // Mbit/s and a queue for their first seconds, then 60-79 and none).
        loss_before_ = base_loss_;
        base_k_ = current_;
        base_goodput_ = value;
        base_loss_ = loss;
        base_paid_ = true;
        rounds_.clear();
        return current_;
      }
      // Below the bar with more loss: the new streams took share by overflowing the buffer
      // (from a sibling link, say), so neither keep rule applies. A queue alone does not go
      // back: the step that fills a path stands one and may still show less than `gain`
      // (cubic at 0.1% loss: 8 streams 89 Mbit/s, 16 streams 96 with 67 ms of queue, and 60
      // after going back). The keep rules below never grow K, and a queued K never doubles.
      if (overflowed) return Hold(base_k_);
      if (value >= base_goodput_ * (1 + gain_ / 2)) {
        // A gain, but short of the bar: one more round, and if it stays short, keep the step
        // (without growing further) rather than go back. Going back costs more than it
        // saves: the remaining streams take seconds to grow into the freed share (cubic at
        // 0.1% loss read 20-35 Mbit/s for over ten seconds after 32 -> 8).
        if (rounds_.size() < static_cast<size_t>(kMaxRoundsPerStep)) return current_;
        base_k_ = current_;
        base_goodput_ = value;
        base_loss_ = loss;
        return Hold(current_);
      }
      if (base_paid_ && value >= base_goodput_ * (1 - gain_ / 2)) {
        // No gain, but no loss either, right after a step that paid: keep this K (once; the
        // next step that does not pay goes back). Near the link's capacity a base's rounds
        // read its new streams' start-up, not what it will carry: cubic at 0.1% loss with 8
        // streams read 93 Mbit/s for the first 4 s and 60-79 after (a loss halves a stream's
        // window, which regrows slowly at 100 ms RTT), where 16 hold 93-98 -- a doubling
        // cannot show +10% against the first reading, and going back lost a third of the link.
        // Where K does not matter (BBR filling the link) this costs one doubling at most.
        base_k_ = current_;
        base_goodput_ = value;
        base_loss_ = loss;
        return Hold(current_);
      }
      // The doubling did not pay: back to the base, and hold.
      return Hold(base_k_);
    }
  }
  return current_;
}

}  // namespace strait::net

// LinkCore's periodic tick and what it measures and adapts (see link_core.h): deadlines of
// queued sends, stream liveness and pings, the kernel's TCP figures, the goodput estimate from
// delivery-rate samples, the adaptation rounds that choose K (StreamCountController, adapt.h)
// and the chunk size, and the pool resizing that follows.
//
// Apart from the link's life and its streams because it is the one part driven by time rather
// than by I/O, and the one tuned against measurements (see the constants' comments).
#include "net/link_core.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <optional>

#include <asio.hpp>

#include "common/log.h"
#include "common/units.h"
#include "net/endpoint_core.h"
#include "net/socket_options.h"
#include "net/stream_conn.h"

namespace strait::net {
namespace {

constexpr int64_t kTickNs = 50'000'000;
constexpr int64_t kGoodputWindowNs = 250'000'000;
constexpr double kGoodputTauNs = 700'000'000;
// LinkEstimates::peak_goodput_bytes_per_s: the best of the last 40 windows with data, 10 s of
// busy link (BBR's bottleneck-bandwidth filter is a windowed maximum for the same reason).
// Counted in busy windows, not in time, so that an idle spell keeps what was measured before it.
constexpr size_t kPeakGoodputWindows = 40;
// An adaptation round lasts max(kAdaptWindowNs, 10 RTT); after K changed, the new streams get
// max(kSettleNs, 4 RTT) to leave slow start before a round measures them. 1.5 s: at 100 ms RTT
// the start-up of four new BBR streams behind a per-flow policer disturbed the pool's goodput
// for over a second, and a round measured inside that judged the doubling useless.
constexpr int64_t kAdaptWindowNs = 1'000'000'000;
constexpr int64_t kSettleNs = 1'500'000'000;
// A round counts only when the link had a backlog at this fraction of its ticks.
constexpr double kBusyFraction = 0.75;

}  // namespace

// ---- Periodic work --------------------------------------------------------------------------

void LinkCore::ArmTick() {
  tick_.expires_after(std::chrono::nanoseconds(kTickNs));
  tick_.async_wait([self = shared_from_this()](const asio::error_code& ec) {
    if (ec || self->state_ != State::kActive) return;
    self->Tick();
    if (self->state_ == State::kActive) self->ArmTick();
  });
}

void LinkCore::Tick() {
  const int64_t now = MonotonicNanos();
  std::vector<Completion> completions;
  send_.ExpireDeadlines(now, peer_name_, &completions);
  Finish(std::move(completions));

  int64_t tcp_rtt_sum = 0;
  int tcp_rtt_n = 0;
  uint64_t pacing = 0;
  uint64_t retrans = retrans_closed_;
  for (auto& stream : std::vector<std::shared_ptr<StreamConn>>(slots_)) {
    if (!stream || !stream->up) continue;
    if (now - stream->last_rx_ns > options_.stream_timeout_ns) {
      StreamDown(stream,
                 UnavailableError("nothing received for " +
                                  FormatDuration(now - stream->last_rx_ns)),
                 false);
      continue;
    }
    if (stream->retiring && now - stream->retire_started_ns > options_.stream_timeout_ns) {
      STRAIT_LOG(kDebug, "net") << stream->peer() << " did not finish retiring; closing it";
      RetireDone(stream);
      continue;
    }
    if (now - stream->last_ping_ns >= options_.ping_interval_ns) {
      stream->last_ping_ns = now;
      AppendPingRecord(RecordType::kPing, static_cast<uint64_t>(now), &stream->control);
      Pump(stream);
    }
    if (auto info = ReadTcpInfo(stream->Lowest().native_handle()); info.ok()) {
      retrans += info->total_retrans;
      pacing += info->max_pacing_bytes_per_s;
      if (info->rtt_ns > 0) {
        tcp_rtt_sum += info->rtt_ns;
        ++tcp_rtt_n;
      }
      if (info->min_rtt_ns > 0) {
        est_.tcp_min_rtt_ns = est_.tcp_min_rtt_ns == 0
                                  ? info->min_rtt_ns
                                  : std::min(est_.tcp_min_rtt_ns, info->min_rtt_ns);
      }
    }
  }
  est_.tcp_retransmissions = retrans;
  est_.max_pacing_bytes_per_s = pacing;
  est_.tcp_rtt_ns = tcp_rtt_n > 0 ? tcp_rtt_sum / tcp_rtt_n : 0;

  // Goodput: the mean of the window's delivery-rate samples (see SampleDelivery), in windows
  // in which the link had something to send. A window without an ack changes nothing: acks
  // that wait behind the peer's chunks leave gaps, and the samples that follow them are not
  // inflated by the wait.
  window_busy_ = window_busy_ || !send_.idle();
  if (now - window_start_ns_ >= kGoodputWindowNs) {
    if (window_busy_ && window_samples_ > 0) {
      // An EWMA with a time constant rather than a weight per window: windows without
      // samples (acks come only every few windows when they wait behind large chunks) must
      // not slow the estimate down. 0.7 s weighs a window of 250 ms by 0.3 as before.
      const double rate = window_rate_sum_ / static_cast<double>(window_samples_);
      const double alpha =
          1 - std::exp(-static_cast<double>(now - goodput_updated_ns_) / kGoodputTauNs);
      est_.goodput_bytes_per_s = est_.goodput_bytes_per_s == 0
                                     ? rate
                                     : est_.goodput_bytes_per_s +
                                           alpha * (rate - est_.goodput_bytes_per_s);
      goodput_updated_ns_ = now;
      // A window that was busy only part of the time, or whose acks came late, reads below
      // what the link can carry; the windowed maximum does not, and reads little above the
      // link's rate since samples are never shorter than their ack interval (22.2 Mbit/s on a
      // 20 Mbit/s link with bulk both ways, tests/net/link_wan_test.cc).
      recent_windows_.push_back(rate);
      if (recent_windows_.size() > kPeakGoodputWindows) recent_windows_.pop_front();
      est_.peak_goodput_bytes_per_s =
          *std::max_element(recent_windows_.begin(), recent_windows_.end());
    }
    window_start_ns_ = now;
    window_rate_sum_ = 0;
    window_samples_ = 0;
    window_busy_ = !send_.idle();
  }
  AdaptTick(now);
  MaybeFinishClose();
  if (state_ != State::kActive) return;

  if (streams_up_ == 0 && now - no_streams_since_ > options_.unreachable_after_ns) {
    est_.unreachable = true;
    const std::string what =
        role_ == Role::kDialer ? "peer " + peer_name_ + " unreachable: no stream up for "
                               : "peer " + peer_name_ + " did not reconnect for ";
    End(State::kFailed,
        UnavailableError(what + FormatDuration(now - no_streams_since_) +
                         (last_error_.empty() ? "" : "; last error: " + last_error_)),
        true);
    return;
  }
  Publish();
}

// ---- Delivery-rate samples ------------------------------------------------------------------
//
// The goodput estimate is built from delivery-rate samples taken as BBR takes them (per
// packet there, per chunk here): when a chunk is cut it records how many bytes the link had
// delivered (acknowledged) so far, when the last ack before it arrived, and when the newest
// chunk acknowledged by then was cut. When an ack covers it, the bytes delivered since, divided
// by the longer of the two intervals (between the cuts, between the acks), is one sample.
// Counting acked bytes per interval of arrival instead read up to several times the real rate
// on a link busy both ways: acks queue behind the peer's chunks (a stream writes a whole
// chunk before the next ack can go out) and arrive late and bunched, and the bunch then
// counted as goodput of the interval it landed in; bigger chunks, chosen from the inflated
// estimate, made the acks later still. A bunch shortens the interval between acks but not the
// one between the cuts it covers, so it cannot inflate a sample; a sample over less than the
// path's RTT is too short to mean anything and is dropped.

void LinkCore::StampSent(const OutChunk& chunk) {
  const int64_t now = MonotonicNanos();
  if (stamps_.empty()) {
    // Nothing in flight: intervals start now, so that idle time never counts as slow delivery.
    delivered_ns_ = now;
    first_sent_ns_ = now;
  }
  // Nothing else waiting to be cut: the sample this chunk gives is application-limited (a
  // small control message after a transfer, e.g. the gateway's commit), so it says how much
  // the application sent, not what the path carries (see SampleDelivery).
  stamps_[chunk.seq] =
      SentStamp{now, delivered_, delivered_ns_, first_sent_ns_, !send_.has_work()};
}

void LinkCore::SampleDelivery(const Ack& ack, uint64_t acked) {
  const int64_t now = MonotonicNanos();
  delivered_ += acked;
  // The newest chunk this ack covers (SendBook already checked the ack's ranges).
  std::optional<SentStamp> newest;
  auto take = [&](std::map<uint64_t, SentStamp>::iterator it) {
    if (!newest || it->second.sent_ns >= newest->sent_ns) newest = it->second;
    return stamps_.erase(it);
  };
  for (auto it = stamps_.begin(); it != stamps_.end() && it->first < ack.cumulative;) {
    it = take(it);
  }
  for (const AckRange& range : ack.ranges) {
    auto it = stamps_.lower_bound(range.begin);
    while (it != stamps_.end() && it->first < range.end) it = take(it);
  }
  if (!newest) return;
  const int64_t interval =
      std::max(newest->sent_ns - newest->first_sent_ns, now - newest->delivered_ns);
  first_sent_ns_ = newest->sent_ns;
  delivered_ns_ = now;
  if (interval <= 0 || interval < BaseRttNs()) return;
  const double rate =
      static_cast<double>(delivered_ - newest->delivered) * 1e9 / static_cast<double>(interval);
  // As BBR does: an application-limited sample may raise the estimate, never lower it.
  if (newest->app_limited && rate < est_.goodput_bytes_per_s) return;
  window_rate_sum_ += rate;
  ++window_samples_;
}

// ---- Adaptation -------------------------------------------------------------------------------

void LinkCore::StartAdaptRound(int64_t at_ns) {
  adapt_start_ns_ = at_ns;
  adapt_start_retrans_ = est_.tcp_retransmissions;
  adapt_ticks_ = 0;
  adapt_backlog_ticks_ = 0;
  adapt_rtt_sum_ns_ = 0;
  adapt_rtt_ticks_ = 0;
  // Reopened at every tick until the round begins, so it starts within a tick of it.
  send_.OpenSeqWindow();
  adapt_window_open_ns_ = MonotonicNanos();
}

// Adaptation rounds (dialer only): after K changed, wait until the pool has its new size and the
// new streams had time to ramp up; then measure goodput over one window and decide. A round's
// goodput is the data cut during it that the peer acknowledged (SendBook's counting windows),
// read a grace period after the round so that its tail's acks are in: the next round runs
// meanwhile and is dropped if the decision changes K.
void LinkCore::AdaptTick(int64_t now) {
  const bool streams = role_ == Role::kDialer && options_.adapt_streams;
  if (!streams && !options_.adapt_chunk) return;
  if (pending_round_ && now >= pending_round_->judge_ns) {
    const PendingRound round = *pending_round_;
    pending_round_.reset();
    const double goodput = static_cast<double>(send_.PopSeqWindow()) * 1e9 /
                           static_cast<double>(round.end_ns - round.begin_ns);
    Adapt(now, goodput, round);
  }
  if (settling_) {
    if (streams_up_ != target_streams_ &&
        now - settle_began_ns_ < options_.handshake_timeout_ns + kSettleNs) {
      return;
    }
    settling_ = false;
    StartAdaptRound(now + std::max<int64_t>(kSettleNs, 4 * BaseRttNs()));
    return;
  }
  if (now < adapt_start_ns_) {
    StartAdaptRound(adapt_start_ns_);  // keep the baseline current until the round starts
    return;
  }
  ++adapt_ticks_;
  if (send_.has_work()) ++adapt_backlog_ticks_;
  // The streams' smoothed RTT averaged over the round's ticks: the controller's queue signal
  // (one tick's reading swings with a cubic sawtooth).
  if (est_.tcp_rtt_ns > 0) {
    adapt_rtt_sum_ns_ += est_.tcp_rtt_ns;
    ++adapt_rtt_ticks_;
  }
  const int64_t elapsed = now - adapt_window_open_ns_;
  if (elapsed < std::max<int64_t>(kAdaptWindowNs, 10 * BaseRttNs())) return;
  if (pending_round_) return;  // the previous round is not judged yet: run on until it is
  // Retransmissions of streams retired during the round are counted at their close, so the
  // total never goes back; the guard is for a kernel that resets it.
  const uint64_t retrans_now = est_.tcp_retransmissions;
  PendingRound round;
  round.begin_ns = adapt_window_open_ns_;
  round.end_ns = now;
  round.retrans_per_s = retrans_now > adapt_start_retrans_
                            ? static_cast<double>(retrans_now - adapt_start_retrans_) * 1e9 /
                                  static_cast<double>(elapsed)
                            : 0.0;
  round.busy = adapt_backlog_ticks_ >= kBusyFraction * adapt_ticks_;
  round.stream_rtt_ns = adapt_rtt_ticks_ > 0 ? adapt_rtt_sum_ns_ / adapt_rtt_ticks_ : 0;
  // Acks of the last data cut arrive after a queueing delay plus a round trip, or later when a
  // loss held them back: two smoothed RTTs (which include the queue) cover most of that
  // without stalling the controller; what comes later is missing equally from every round.
  const int64_t rtt = std::max(est_.rtt_smoothed_ns, BaseRttNs());
  round.judge_ns = now + std::clamp<int64_t>(2 * rtt, kTickNs, 1'000'000'000);
  send_.CloseSeqWindow();
  pending_round_ = round;
  StartAdaptRound(now);
}

void LinkCore::Adapt(int64_t now, double goodput, const PendingRound& round) {
  const bool busy = round.busy;
  if (options_.adapt_chunk && busy) {
    const int k = role_ == Role::kDialer ? target_streams_ : streams_up_;
    chunk_bytes_ = ChooseChunkBytes(est_, std::max(1, k), chunk_bytes_,
                                    options_.min_chunk_bytes, options_.max_chunk_bytes);
  }
  if (role_ == Role::kDialer && options_.adapt_streams) {
    RoundSignals signals;
    signals.path_rtt_ns = BaseRttNs();
    signals.stream_rtt_ns = round.stream_rtt_ns;
    signals.retrans_per_s = round.retrans_per_s;
    const int next = controller_.Update(goodput, busy, signals);
    const int old = target_streams_;
    // Every round, so that a decision that held K can be traced to the numbers behind it.
    STRAIT_LOG(kDebug, "net") << "link to " << peer_name_ << ": round with " << old
                              << " streams: goodput " << FormatRate(goodput * 8)
                              << (busy ? "" : " (idle)") << ", "
                              << static_cast<int64_t>(round.retrans_per_s)
                              << " retransmissions/s, stream RTT "
                              << FormatDuration(round.stream_rtt_ns) << " -> " << next;
    if (next != old) {
      STRAIT_LOG(kInfo, "net") << "link to " << peer_name_ << ": " << old << " -> " << next
                               << " streams (goodput " << FormatRate(goodput * 8) << ", "
                               << static_cast<int64_t>(round.retrans_per_s)
                               << " retransmissions/s, stream RTT "
                               << FormatDuration(round.stream_rtt_ns) << " over path "
                               << FormatDuration(signals.path_rtt_ns) << " with " << old
                               << ")";
      ResizePool(next, now);
    }
  }
  est_.streams_target = target_streams_;
  est_.chunk_bytes = chunk_bytes_;
}

void LinkCore::ResizePool(int next, int64_t now) {
  if (role_ != Role::kDialer || state_ != State::kActive || slots_.empty()) return;
  next = std::clamp(next, 1, static_cast<int>(slots_.size()));
  const int old = target_streams_;
  // The target first: Dial refuses slots above it, and ScheduleRedial does too, so retiring
  // slots are not redialled.
  target_streams_ = next;
  for (int i = old; i < next; ++i) {
    if (!slots_[i] && !dialing_.count(i)) Dial(i);
  }
  for (int i = next; i < old; ++i) {
    redial_timers_.erase(i);
    if (auto it = dialing_.find(i); it != dialing_.end()) {
      it->second->Close();
      dialing_.erase(it);
    }
    if (slots_[i]) Retire(slots_[i]);
  }
  settling_ = true;
  settle_began_ns_ = now;
  est_.streams_target = target_streams_;
  Publish();
}

}  // namespace strait::net

// LinkCore's life (see link_core.h for the class and how its code is split): creation, the
// operations a Link handle posts (send, close, test hooks, waiting for streams), and ending --
// a flushing close, a failure, the completions and the snapshot the handles read.
//
// Apart from the stream, handshake and adaptation code because this is what a reader of
// link.h's contract needs: what happens to a send and to its completion, and when a link ends.
#include "net/link_core.h"

#include <algorithm>
#include <chrono>
#include <utility>

#include <asio.hpp>

#include "common/log.h"
#include "common/units.h"
#include "net/endpoint_core.h"
#include "net/stream_conn.h"

namespace strait::net {

using asio::ip::tcp;

LinkCore::LinkCore(std::shared_ptr<EndpointCore> endpoint, Role role, std::string peer_region,
                   tcp::endpoint address, uint64_t session_id, MessageCallback on_message,
                   bool in_region)
    : endpoint_(std::move(endpoint)),
      options_(endpoint_->options().link),
      role_(role),
      peer_region_(std::move(peer_region)),
      address_(address),
      in_region_(in_region),
      session_id_(session_id),
      on_message_(std::move(on_message)),
      receive_(options_.max_message_bytes, options_.max_partial_bytes),
      tick_(endpoint_->io()),
      chunk_bytes_(std::min(options_.chunk_bytes, kMaxChunkPayload)),
      controller_(options_.streams, options_.min_streams, options_.max_streams) {
  send_.set_max_started_bytes(options_.max_partial_bytes);
  if (auto it = options_.peer_max_rate_bps.find(peer_region_);
      it != options_.peer_max_rate_bps.end()) {
    options_.max_rate_bps = it->second;
  } else if (peer_region_ == endpoint_->options().region) {
    options_.max_rate_bps = 0;  // the region's own gateways talk over the LAN, not the WAN path
  }
  target_streams_ = role_ == Role::kDialer ? options_.streams : 0;
  if (role_ == Role::kDialer && options_.adapt_streams) {
    target_streams_ = controller_.streams();
  }
  peer_name_ = "region " + peer_region_ + " (" + address_.address().to_string() + ":" +
               std::to_string(address_.port()) + ")";
  est_.streams_target = target_streams_;
  est_.chunk_bytes = chunk_bytes_;
  snapshot_ = est_;
}

void LinkCore::Start() {
  const int64_t now = MonotonicNanos();
  no_streams_since_ = now;
  window_start_ns_ = now;
  // The first round measures the initial pool once it is up.
  settling_ = role_ == Role::kDialer;
  settle_began_ns_ = now;
  if (role_ == Role::kDialer) {
    slots_.resize(static_cast<size_t>(options_.max_streams > target_streams_
                                          ? options_.max_streams
                                          : target_streams_));
    for (int i = 0; i < target_streams_; ++i) Dial(i);
  }
  ArmTick();
}

// ---- Public operations, posted by the handle ------------------------------------------------

void LinkCore::Send(uint32_t channel, std::vector<uint8_t> message, Deadline deadline,
                    SendDone done) {
  if (state_ != State::kActive) {
    Finish({Completion{std::move(done), failure_}});
    return;
  }
  if (closing_) {
    Finish({Completion{std::move(done), CancelledError("link to " + peer_name_ +
                                                       " is closing: Close() was called")}});
    return;
  }
  if (send_.queued_bytes() + message.size() > options_.max_queued_bytes) {
    Finish({Completion{std::move(done),
                       ResourceExhaustedError(
                           "link to " + peer_name_ + " already holds " +
                           FormatBytes(send_.queued_bytes()) + " unsent; the limit is " +
                           FormatBytes(options_.max_queued_bytes) + " (max_queued_bytes)")}});
    return;
  }
  send_.Enqueue(channel, std::move(message), deadline.at_nanos(), std::move(done));
  window_busy_ = true;
  PumpAll();
  Publish();
}

void LinkCore::Close(Status status) {
  if (state_ != State::kActive || closing_) return;
  closing_ = true;
  close_status_ = std::move(status);
  close_deadline_ns_ = MonotonicNanos() + options_.close_flush_ns;
  if (!send_.idle()) {
    STRAIT_LOG(kInfo, "net") << "closing link to " << peer_name_ << " after flushing "
                             << FormatBytes(send_.queued_bytes()) << " queued and "
                             << send_.unacked_chunks() << " unacknowledged chunks (at most "
                             << FormatDuration(options_.close_flush_ns) << ")";
  }
  MaybeFinishClose();
}

void LinkCore::CloseNow(CloseReason reason, Status status) {
  if (state_ != State::kActive) return;
  STRAIT_LOG(kInfo, "net") << "closing link to " << peer_name_;
  for (auto& stream : slots_) {
    if (!stream || !stream->up) continue;
    AppendCloseRecord(reason, &stream->control);
    stream->close_after_write = true;
    Pump(stream);
  }
  End(State::kClosed, std::move(status), /*close_streams=*/false);
}

void LinkCore::KillStream(int index) {
  if (index < 0 || static_cast<size_t>(index) >= slots_.size() || !slots_[index]) return;
  // shutdown() without close(): both directions fail as on a dropped connection.
  asio::error_code ec;
  slots_[index]->Lowest().shutdown(tcp::socket::shutdown_both, ec);
}

LinkEstimates LinkCore::Snapshot() const {
  std::lock_guard<std::mutex> lock(snapshot_mu_);
  return snapshot_;
}

Status LinkCore::WaitForStreams(int n, Deadline deadline) {
  std::unique_lock<std::mutex> lock(snapshot_mu_);
  const bool met = snapshot_cv_.wait_until(
      lock, MonoClock::time_point(std::chrono::nanoseconds(deadline.at_nanos())),
      [&] { return snapshot_.streams_up >= n || snapshot_.unreachable || ended_; });
  if (snapshot_.streams_up >= n) return Status::Ok();
  if (!met) {
    return DeadlineExceededError("link to " + peer_name_ + " has " +
                                 std::to_string(snapshot_.streams_up) + " of " +
                                 std::to_string(n) + " streams up at the deadline");
  }
  return UnavailableError("link to " + peer_name_ + " ended before " + std::to_string(n) +
                          " streams came up");
}

void LinkCore::Shutdown() {
  CloseNow(CloseReason::kShutdown,
           UnavailableError("link to " + peer_name_ + " closed: endpoint shut down"));
}

void LinkCore::DropAllStreams() {
  for (auto& stream : std::vector<std::shared_ptr<StreamConn>>(slots_)) {
    if (stream) Drop(stream);
  }
  Publish();
}

// ---- Ending ---------------------------------------------------------------------------------

void LinkCore::MaybeFinishClose() {
  if (!closing_ || state_ != State::kActive) return;
  if (!send_.idle() && MonotonicNanos() < close_deadline_ns_) return;
  CloseNow(CloseReason::kNormal, close_status_);
}

void LinkCore::End(State state, Status status, bool close_streams) {
  if (state_ != State::kActive) return;
  state_ = state;
  failure_ = status;
  if (state == State::kFailed) {
    STRAIT_LOG(kWarn, "net") << "link failed: " << status.message();
  }
  est_.ended = true;
  std::vector<Completion> completions;
  send_.FailAll(status, &completions);
  stamps_.clear();
  est_.send_failures += completions.size();
  tick_.cancel();
  redial_timers_.clear();
  for (auto& [slot, stream] : dialing_) stream->Close();
  dialing_.clear();
  for (auto& stream : std::vector<std::shared_ptr<StreamConn>>(slots_)) {
    if (stream && (close_streams || !stream->writing)) Drop(stream);
  }
  {
    std::lock_guard<std::mutex> lock(snapshot_mu_);
    ended_ = true;
  }
  Publish();  // before the callbacks, so that they see the final state
  for (auto& c : completions) {
    if (c.done) c.done(c.status);
  }
  on_message_ = nullptr;  // may hold a Link handle: break that cycle
  endpoint_->Unregister(this);
}

void LinkCore::Finish(std::vector<Completion> completions) {
  for (Completion& c : completions) {
    if (c.status.ok()) {
      ++est_.messages_sent;
    } else {
      ++est_.send_failures;
    }
    if (c.done) c.done(std::move(c.status));
  }
}

void LinkCore::Publish() {
  est_.streams_up = streams_up_;
  est_.chunks_resent = send_.chunks_resent();
  est_.queued_bytes = send_.queued_bytes();
  {
    std::lock_guard<std::mutex> lock(snapshot_mu_);
    snapshot_ = est_;
  }
  snapshot_cv_.notify_all();
}

}  // namespace strait::net

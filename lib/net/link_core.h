// LinkCore: one link's state on the I/O thread -- the send and receive books, the stream slots,
// the tick, the estimates and the adaptation of K and the chunk size -- and the helpers the
// link_*.cc files share. Internal to strait::net; other modules use net/link.h.
//
// The class is declared here once and defined in four files by what its code is about, so that
// each reads in one sitting:
//   link_core.cc       the link's life: creation, the public operations, closing and ending
//   link_handshake.cc  dialing a stream: connect, TLS, the hello exchange, redial with backoff
//                      (beside the acceptor's half of the same handshake)
//   link_streams.cc    streams joining and leaving the pool (attach, drop, retire) and each
//                      stream's reading and writing of records
//   link_adapt.cc      the periodic tick: liveness, measurements (RTT, delivery-rate goodput)
//                      and the adaptation of K and the chunk size
// Everything runs on the I/O thread, except Snapshot() and WaitForStreams(), which read the
// fields under snapshot_mu_.
//
// Ownership (see also endpoint.cc): a StreamConn is kept alive by its pending handlers and by
// its link's slot table; it holds its LinkCore until it goes down (that cycle is broken in
// Drop). A LinkCore is kept by its user handles, by the endpoint's registry (until it fails or
// closes and its last stream, which may still be writing a close record, is dropped), and by its
// streams. Endpoint shutdown drops every stream of every link still registered, so no cycle
// outlives the endpoint.
//
// Protocol code is written with completion callbacks rather than C++20 coroutines: clang 14 with
// libstdc++ 12 is not detected by Asio 1.22 as coroutine-capable and, forced, fails to compile
// under -fsanitize=undefined ("Cannot represent a difference across sections"), and CI builds
// exactly that.
#ifndef STRAIT_LIB_NET_LINK_CORE_H_
#define STRAIT_LIB_NET_LINK_CORE_H_

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include <asio.hpp>

#include "common/clock.h"
#include "net/adapt.h"
#include "net/delivery.h"
#include "net/estimates.h"
#include "net/link.h"
#include "net/wire.h"
#include "strait/status.h"

namespace strait::net {

class EndpointCore;
class LinkCore;
class Runtime;
class StreamConn;

// A uniformly random 64-bit number: session ids and redial jitter. Thread-safe.
inline uint64_t RandomU64() {
  static std::mutex mu;
  static std::mt19937_64 rng(std::random_device{}());
  std::lock_guard<std::mutex> lock(mu);
  return rng();
}

inline std::string Describe(const asio::error_code& ec) { return ec.message(); }

// What a Link handle holds: the link, and the runtime that runs it (kept alive by the handle).
struct Link::Impl {
  std::shared_ptr<Runtime> runtime;
  std::shared_ptr<LinkCore> core;
};

// One link's state: the books, the stream slots, timers, estimates. I/O-thread only, except
// Snapshot() and the fields under snapshot_mu_.
class LinkCore : public std::enable_shared_from_this<LinkCore> {
 public:
  enum class Role { kDialer, kAcceptor };
  enum class State { kActive, kClosed, kFailed };

  // `in_region`: the link runs on plain TCP among one region's gateways (Endpoint::
  // ConnectInRegion / ListenInRegion) whatever the endpoint's transport.
  LinkCore(std::shared_ptr<EndpointCore> endpoint, Role role, std::string peer_region,
           asio::ip::tcp::endpoint address, uint64_t session_id, MessageCallback on_message,
           bool in_region = false);

  const std::string& peer_region() const { return peer_region_; }
  const std::string& peer_name() const { return peer_name_; }
  bool in_region() const { return in_region_; }
  // The peer's address: the one dialled, or where an accepted link's first stream came from.
  const asio::ip::tcp::endpoint& address() const { return address_; }
  void set_on_message(MessageCallback cb) { on_message_ = std::move(cb); }

  // Starts the tick and, on a dialer, dials the initial pool.
  void Start();

  // ---- Public operations, posted by the handle (link_core.cc) ----------------------------------

  void Send(uint32_t channel, std::vector<uint8_t> message, Deadline deadline, SendDone done);
  // Link::Close(): stop taking sends, flush what is queued (up to close_flush_ns), then close.
  void Close(Status status);
  // Tells the peer on every stream that is up, then ends the link: unfinished sends fail with
  // `status`, and each stream is dropped once its close record is written.
  void CloseNow(CloseReason reason, Status status);
  void KillStream(int index);
  LinkEstimates Snapshot() const;
  // Blocks the caller (not the I/O thread) until `n` streams are up or the link ended.
  Status WaitForStreams(int n, Deadline deadline);
  // Endpoint shutdown: fail everything and tell the peer (so that it does not redial); the
  // streams go once their close records are written, or at DropAllStreams. A link that already
  // ended (Close) is left to finish its close records; DropAllStreams still drops its streams.
  void Shutdown();
  int streams_up() const { return streams_up_; }
  void DropAllStreams();
  bool active() const { return state_ == State::kActive; }

  // Called by the endpoint when an accepted stream passed every check (link_streams.cc).
  void AttachAccepted(const std::shared_ptr<StreamConn>& stream, int index);

  // Dialer: grows the pool to `next` streams (dialing the new slots) or shrinks it (retiring the
  // streams above it). The next adaptation round waits for the new pool (link_adapt.cc).
  void ResizePool(int next, int64_t now);

 private:
  // Adaptation round measured and waiting for its tail's acks (see AdaptTick).
  struct PendingRound {
    int64_t begin_ns = 0, end_ns = 0, judge_ns = 0;
    double retrans_per_s = 0;
    int64_t stream_rtt_ns = 0;  // the streams' kernel smoothed RTT, mean over the round's ticks
    bool busy = false;
  };
  // Delivery-rate sampling (see SampleDelivery): per chunk in flight, the state when it was cut.
  struct SentStamp {
    int64_t sent_ns = 0;
    uint64_t delivered = 0;    // bytes acknowledged on the link when the chunk was cut
    int64_t delivered_ns = 0;  // when the last ack before the cut arrived
    int64_t first_sent_ns = 0;  // when the newest chunk acknowledged by then was cut
    bool app_limited = false;   // cut with nothing else waiting (StampSent)
  };

  // ---- Dialing (link_handshake.cc) -------------------------------------------------------------

  void Dial(int slot);
  void SendHello(const std::shared_ptr<StreamConn>& stream);
  void DialFailed(const std::shared_ptr<StreamConn>& stream, const std::string& why);
  void ScheduleRedial(int slot);

  // ---- Streams up and down, retiring, reading and writing (link_streams.cc) --------------------

  void Attach(const std::shared_ptr<StreamConn>& stream, int slot);
  // Gives every stream up its share of LinkOptions::max_rate_bps (no-op without a rate).
  void Pace();
  // Takes a stream out of the pool for good (its slot may be redialled with a new one).
  // By value: callers pass slots_[i], which this resets.
  bool Drop(std::shared_ptr<StreamConn> stream);
  void StreamDown(std::shared_ptr<StreamConn> stream, const Status& why, bool protocol_error);
  // Dialer: takes `stream` out of the pool without losing or resending anything.
  void Retire(const std::shared_ptr<StreamConn>& stream);
  // Moves a retiring stream along once it wrote everything and its chunks were acknowledged:
  // the acceptor answers the retire record, the dialer then closes the stream.
  void MaybeFinishRetire(const std::shared_ptr<StreamConn>& stream);
  void RetireDone(const std::shared_ptr<StreamConn>& stream);
  void ReadRecord(const std::shared_ptr<StreamConn>& stream);
  Status OnRecord(const std::shared_ptr<StreamConn>& stream, const RecordHeader& header);
  void PumpAll();
  // Starts a write on `stream` if it is idle: control records first, then the link's acks, then
  // one data chunk if the stream's in-flight budget allows. A stream whose socket is slow stays
  // busy writing and so takes fewer chunks.
  void Pump(std::shared_ptr<StreamConn> stream);

  // ---- Periodic work, measurements, adaptation (link_adapt.cc) ---------------------------------

  void ArmTick();
  void Tick();
  void StampSent(const OutChunk& chunk);
  void SampleDelivery(const Ack& ack, uint64_t acked);
  // The propagation RTT (the kernel's minimum, else the least ping RTT): the bandwidth-delay
  // product and the adaptation windows are about the path, not about queues this link builds
  // itself (pings wait behind up to max_inflight_per_stream of data).
  int64_t BaseRttNs() const { return PathRttNs(est_); }
  void StartAdaptRound(int64_t at_ns);
  void AdaptTick(int64_t now);
  void Adapt(int64_t now, double goodput, const PendingRound& round);

  // ---- Ending (link_core.cc) -------------------------------------------------------------------

  // Ends a link Close() is flushing once nothing is left or the flush deadline passed.
  void MaybeFinishClose();
  void End(State state, Status status, bool close_streams);
  void Finish(std::vector<Completion> completions);
  void Publish();

  std::shared_ptr<EndpointCore> endpoint_;
  LinkOptions options_;
  Role role_;
  std::string peer_region_;
  asio::ip::tcp::endpoint address_;
  bool in_region_ = false;
  uint64_t session_id_;
  bool ever_attached_ = false;  // a stream was up once: later dials resume the session
  std::string peer_name_;
  MessageCallback on_message_;
  State state_ = State::kActive;
  Status failure_;
  std::string last_error_;

  SendBook send_;
  ReceiveBook receive_;
  bool ack_pending_ = false;
  std::vector<std::shared_ptr<StreamConn>> slots_;
  std::map<int, std::shared_ptr<StreamConn>> dialing_;
  std::map<int, std::shared_ptr<asio::steady_timer>> redial_timers_;
  std::map<int, int> redial_attempts_;
  int streams_up_ = 0;
  int target_streams_ = 0;
  int64_t no_streams_since_ = 0;
  asio::steady_timer tick_;

  uint32_t chunk_bytes_;
  StreamCountController controller_;
  int64_t window_start_ns_ = 0;
  int64_t goodput_updated_ns_ = 0;  // when the goodput EWMA last took a window
  double window_rate_sum_ = 0;  // delivery-rate samples of the current goodput window
  int window_samples_ = 0;
  bool window_busy_ = false;
  // The rates of the last kPeakGoodputWindows windows with data, oldest first: their maximum is
  // LinkEstimates::peak_goodput_bytes_per_s.
  std::deque<double> recent_windows_;
  std::map<uint64_t, SentStamp> stamps_;
  uint64_t delivered_ = 0;
  int64_t delivered_ns_ = 0;
  int64_t first_sent_ns_ = 0;
  bool settling_ = false;
  int64_t settle_began_ns_ = 0;
  int64_t adapt_start_ns_ = 0;
  int64_t adapt_window_open_ns_ = 0;
  std::optional<PendingRound> pending_round_;  // measured, waiting for its tail's acks
  uint64_t adapt_start_retrans_ = 0;
  int adapt_ticks_ = 0;
  int adapt_backlog_ticks_ = 0;
  int64_t adapt_rtt_sum_ns_ = 0;
  int adapt_rtt_ticks_ = 0;
  bool dial_warned_ = false;
  bool closing_ = false;
  Status close_status_;
  int64_t close_deadline_ns_ = 0;
  uint64_t retrans_closed_ = 0;

  LinkEstimates est_;
  mutable std::mutex snapshot_mu_;
  std::condition_variable snapshot_cv_;
  LinkEstimates snapshot_;
  bool ended_ = false;
};

}  // namespace strait::net

#endif  // STRAIT_LIB_NET_LINK_CORE_H_

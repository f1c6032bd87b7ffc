// Endpoints, links and streams on Asio (see link.h for the contract, wire.h for the format).
//
// Everything below runs on the endpoint's single I/O thread, except the public handle methods,
// which only post work to it (and read mutex-guarded snapshots). Protocol code is written with
// completion callbacks rather than C++20 coroutines: clang 14 with libstdc++ 12 is not detected
// by Asio 1.22 as coroutine-capable and, forced, fails to compile under -fsanitize=undefined
// ("Cannot represent a difference across sections"), and CI builds exactly that.
//
// Ownership: a StreamConn is kept alive by its pending handlers and by its link's slot table; it
// holds its LinkCore until it goes down (that cycle is broken in Drop). A LinkCore is kept by its
// user handles, by the endpoint's registry (until it fails or closes and its last stream, which
// may still be writing a close record, is dropped), and by its streams. Endpoint shutdown drops
// every stream of every link still registered, so no cycle outlives the endpoint.
// The Runtime (io_context + thread) is kept by the Endpoint and by every Link handle, never by
// anything that lives inside the io_context, so that nothing keeps itself alive.
#include "net/link.h"

#include <sys/socket.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cmath>
#include <condition_variable>
#include <future>
#include <map>
#include <mutex>
#include <optional>
#include <random>
#include <set>
#include <thread>
#include <utility>

#include <asio.hpp>
#include <asio/ssl.hpp>

#include "common/log.h"
#include "common/log_limiter.h"
#include "common/units.h"
#include "net/adapt.h"
#include "net/socket_options.h"
#include "net/tls.h"
#include "net/wire.h"

namespace strait::net {
namespace {

using asio::ip::tcp;
using TlsStream = asio::ssl::stream<tcp::socket>;

constexpr int64_t kTickNs = 50'000'000;
constexpr int64_t kGoodputWindowNs = 250'000'000;
constexpr double kGoodputTauNs = 700'000'000;
// An adaptation round lasts max(kAdaptWindowNs, 10 RTT); after K changed, the new streams get
// max(kSettleNs, 4 RTT) to leave slow start before a round measures them. 1.5 s: at 100 ms RTT
// the start-up of four new BBR streams behind a per-flow policer disturbed the pool's goodput
// for over a second, and a round measured inside that judged the doubling useless.
constexpr int64_t kAdaptWindowNs = 1'000'000'000;
constexpr int64_t kSettleNs = 1'500'000'000;
// A round counts only when the link had a backlog at this fraction of its ticks.
constexpr double kBusyFraction = 0.75;
// Endpoint shutdown waits this long for close records to go out before dropping the streams.
constexpr int64_t kShutdownDrainNs = 500'000'000;

uint64_t RandomU64() {
  static std::mutex mu;
  static std::mt19937_64 rng(std::random_device{}());
  std::lock_guard<std::mutex> lock(mu);
  return rng();
}

std::string Describe(const asio::error_code& ec) { return ec.message(); }

}  // namespace

// The io_context and its thread. Post() refuses work once shutdown began, so a caller can fail
// its own callback instead of posting into a loop that will never run it.
class Runtime {
 public:
  Runtime() : guard_(asio::make_work_guard(io_)) {
    thread_ = std::thread([this] {
      thread_id_.store(std::this_thread::get_id());
      io_.run();
    });
  }
  ~Runtime() { Shutdown(nullptr, nullptr, nullptr, 0); }

  template <typename F>
  bool Post(F&& fn) {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopped_) return false;
    asio::post(io_, std::forward<F>(fn));
    return true;
  }

  // Runs `begin` on the I/O thread after everything posted before, keeps the loop running until
  // `drained` returns true or `grace_ns` passed, runs `finish`, then stops and joins. Any of the
  // functions may be empty.
  void Shutdown(std::function<void()> begin, std::function<bool()> drained,
                std::function<void()> finish, int64_t grace_ns) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!stopped_) {
        stopped_ = true;
        drained_ = std::move(drained);
        finish_ = std::move(finish);
        asio::post(io_, [this, begin = std::move(begin), grace_ns] {
          if (begin) begin();
          drain_until_ns_ = MonotonicNanos() + grace_ns;
          DrainStep();
        });
      }
    }
    if (thread_.joinable() && std::this_thread::get_id() != thread_.get_id()) thread_.join();
  }

  bool OnIoThread() const { return std::this_thread::get_id() == thread_id_.load(); }
  asio::io_context& io() { return io_; }

 private:
  void DrainStep() {
    if (!drained_ || drained_() || MonotonicNanos() >= drain_until_ns_) {
      if (finish_) finish_();
      drained_ = nullptr;
      finish_ = nullptr;
      io_.stop();
      return;
    }
    drain_timer_.expires_after(std::chrono::milliseconds(5));
    drain_timer_.async_wait([this](const asio::error_code&) { DrainStep(); });
  }

  asio::io_context io_;
  asio::executor_work_guard<asio::io_context::executor_type> guard_;
  asio::steady_timer drain_timer_{io_};
  std::function<bool()> drained_;
  std::function<void()> finish_;
  int64_t drain_until_ns_ = 0;
  std::mutex mu_;
  bool stopped_ = false;
  std::atomic<std::thread::id> thread_id_{};
  std::thread thread_;
};

class LinkCore;
class EndpointCore;

struct Link::Impl {
  std::shared_ptr<Runtime> runtime;
  std::shared_ptr<LinkCore> core;
};

// One TCP (optionally TLS) stream. I/O-thread only.
class StreamConn : public std::enable_shared_from_this<StreamConn> {
 public:
  StreamConn(tcp::socket socket, asio::ssl::context* tls, std::string peer)
      : timer_(socket.get_executor()), peer_(std::move(peer)) {
    if (tls != nullptr) {
      tls_ = std::make_unique<TlsStream>(std::move(socket), *tls);
    } else {
      plain_.emplace(std::move(socket));
    }
  }

  tcp::socket& Lowest() { return tls_ ? tls_->next_layer() : *plain_; }
  TlsStream* tls() { return tls_.get(); }

  template <typename Buffers, typename Handler>
  void Write(const Buffers& buffers, Handler&& handler) {
    if (tls_) {
      asio::async_write(*tls_, buffers, std::forward<Handler>(handler));
    } else {
      asio::async_write(*plain_, buffers, std::forward<Handler>(handler));
    }
  }
  template <typename Buffers, typename Handler>
  void Read(const Buffers& buffers, Handler&& handler) {
    if (tls_) {
      asio::async_read(*tls_, buffers, std::forward<Handler>(handler));
    } else {
      asio::async_read(*plain_, buffers, std::forward<Handler>(handler));
    }
  }

  // Applies the per-socket options; errors are returned for logging (the stream stays usable
  // unless congestion control was refused, which Create() already checked).
  Status Configure(const LinkOptions& options) {
    const int fd = Lowest().native_handle();
    STRAIT_RETURN_IF_ERROR(SetNoDelay(fd));
    STRAIT_RETURN_IF_ERROR(SetCongestionControl(fd, options.congestion_control));
    return SetNotSentLowat(fd, options.notsent_lowat);
  }

  // Arms the setup deadline: when it fires, the socket closes and pending setup steps fail.
  void ArmDeadline(int64_t nanos) {
    timer_.expires_after(std::chrono::nanoseconds(nanos));
    timer_.async_wait([self = shared_from_this()](const asio::error_code& ec) {
      if (ec || self->closed_) return;
      self->timed_out_ = true;
      self->Close();
    });
  }
  void DisarmDeadline() { timer_.cancel(); }

  void Close() {
    if (closed_) return;
    closed_ = true;
    asio::error_code ec;
    timer_.cancel();
    if (Lowest().is_open()) {
      if (auto info = ReadTcpInfo(Lowest().native_handle()); info.ok()) {
        final_retrans_ = info->total_retrans;
      }
      Lowest().shutdown(tcp::socket::shutdown_both, ec);
      Lowest().close(ec);
    }
  }

  bool closed() const { return closed_; }
  bool timed_out() const { return timed_out_; }
  const std::string& peer() const { return peer_; }

  // Link-side state (set when the stream joins a link).
  std::shared_ptr<LinkCore> link;
  int slot = -1;
  bool up = false;
  bool writing = false;
  bool close_after_write = false;
  // Retiring (the pool shrinks): no new data chunks go onto this stream; see kRetire in wire.h.
  bool retiring = false;
  bool retire_sent = false;
  bool retire_received = false;
  int64_t retire_started_ns = 0;
  std::vector<uint8_t> control;  // acks, pings, pongs, close: written before any data
  std::vector<uint8_t> out;      // the write in progress
  uint64_t out_payload = 0;      // data payload bytes in `out`
  std::array<uint8_t, kRecordHeaderBytes> header{};
  std::vector<uint8_t> body;
  std::vector<uint8_t> hello;  // the hello being read or written during setup
  int64_t last_rx_ns = 0;
  int64_t last_ping_ns = 0;
  uint64_t final_retrans_ = 0;

 private:
  std::unique_ptr<TlsStream> tls_;
  std::optional<tcp::socket> plain_;
  asio::steady_timer timer_;
  std::string peer_;
  bool closed_ = false;
  bool timed_out_ = false;
};

// Shared parts of the endpoint that links need: options, TLS, counters, the registry.
class EndpointCore : public std::enable_shared_from_this<EndpointCore> {
 public:
  EndpointCore(asio::io_context& io, EndpointOptions options,
               std::unique_ptr<asio::ssl::context> tls, AcceptCallback on_accept,
               std::shared_ptr<Runtime> runtime)
      : io_(io),
        options_(std::move(options)),
        tls_(std::move(tls)),
        on_accept_(std::move(on_accept)),
        runtime_(std::move(runtime)),
        peers_(options_.peer_regions.begin(), options_.peer_regions.end()) {}

  asio::io_context& io() { return io_; }
  const EndpointOptions& options() const { return options_; }
  // The context for new handshakes. Each stream keeps the context it was created with; old
  // contexts stay alive in retired_tls_ (a few KiB per reload) so that pointer never dangles.
  asio::ssl::context* tls() {
    std::lock_guard<std::mutex> lock(tls_mu_);
    return tls_.get();
  }
  void ReplaceTls(std::unique_ptr<asio::ssl::context> tls) {
    std::lock_guard<std::mutex> lock(tls_mu_);
    retired_tls_.push_back(std::move(tls_));
    tls_ = std::move(tls);
  }
  bool AllowedPeer(const std::string& region) const { return peers_.count(region) > 0; }

  template <typename F>
  void Count(F&& update) {
    std::lock_guard<std::mutex> lock(counters_mu_);
    update(counters_);
  }
  EndpointCounters Counters() const {
    std::lock_guard<std::mutex> lock(counters_mu_);
    return counters_;
  }

  void StartAccepting(std::unique_ptr<tcp::acceptor> acceptor);
  void Register(const std::shared_ptr<LinkCore>& link);
  // A link ended. One whose streams are still writing their close records stays in ended_
  // until the last of them is dropped (Released), so that endpoint shutdown waits for them
  // and then drops them: otherwise nothing would, and the StreamConn <-> LinkCore cycle would
  // keep their sockets open.
  void Unregister(LinkCore* link);
  void Released(LinkCore* link);
  // Endpoint shutdown: close records on every stream (BeginShutdown), then, once they went out
  // or the grace period passed, every stream dropped (FinishShutdown).
  void BeginShutdown();
  bool ShutdownDrained() const;
  void FinishShutdown();

  // The Runtime is needed to hand out Link handles for accepted links; held weakly so that the
  // io_context never owns its own Runtime.
  std::weak_ptr<Runtime> runtime_weak() const { return runtime_; }

 private:
  void AcceptNext();
  void SetUpAccepted(std::shared_ptr<StreamConn> stream);
  void ReadHello(std::shared_ptr<StreamConn> stream, std::string cert_region);
  void Refuse(const std::shared_ptr<StreamConn>& stream, const std::string& why,
              uint64_t EndpointCounters::*counter);

  asio::io_context& io_;
  EndpointOptions options_;
  std::mutex tls_mu_;  // guards tls_ and retired_tls_ (ReloadIdentity runs on any thread)
  std::unique_ptr<asio::ssl::context> tls_;
  std::vector<std::unique_ptr<asio::ssl::context>> retired_tls_;
  AcceptCallback on_accept_;
  std::weak_ptr<Runtime> runtime_;
  std::set<std::string> peers_;
  std::unique_ptr<tcp::acceptor> acceptor_;
  // Accepted links by (region, session id); dialed links under session id only in links_.
  std::map<std::pair<std::string, uint64_t>, std::shared_ptr<LinkCore>> sessions_;
  std::vector<std::shared_ptr<LinkCore>> links_;
  std::set<std::shared_ptr<StreamConn>> handshaking_;
  std::vector<std::shared_ptr<LinkCore>> ended_;    // ended links with streams still up
  std::vector<std::shared_ptr<LinkCore>> closing_;  // links ended by shutdown, still draining
  mutable std::mutex counters_mu_;
  EndpointCounters counters_;
  LogRateLimiter refusal_log_{10'000'000'000};  // Refuse's WARN lines, per address and reason
  bool shut_down_ = false;
  // Accept failures in a row (out of descriptors or memory) and the pause after each: the
  // connection stays in the backlog and accept would fail again at once -- without the pause
  // the loop spun at 84% of a core and logged 800,000 lines in 8 s.
  uint64_t accept_failures_ = 0;
  asio::steady_timer accept_backoff_{io_};
};

// One link's state: the books, the stream slots, timers, estimates. I/O-thread only, except
// Snapshot() and the fields under snapshot_mu_.
class LinkCore : public std::enable_shared_from_this<LinkCore> {
 public:
  enum class Role { kDialer, kAcceptor };
  enum class State { kActive, kClosed, kFailed };

  LinkCore(std::shared_ptr<EndpointCore> endpoint, Role role, std::string peer_region,
           tcp::endpoint address, uint64_t session_id, MessageCallback on_message)
      : endpoint_(std::move(endpoint)),
        options_(endpoint_->options().link),
        role_(role),
        peer_region_(std::move(peer_region)),
        address_(address),
        session_id_(session_id),
        on_message_(std::move(on_message)),
        receive_(options_.max_message_bytes, options_.max_partial_bytes),
        tick_(endpoint_->io()),
        chunk_bytes_(std::min(options_.chunk_bytes, kMaxChunkPayload)),
        controller_(options_.streams, options_.min_streams, options_.max_streams) {
    send_.set_max_started_bytes(options_.max_partial_bytes);
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

  const std::string& peer_region() const { return peer_region_; }
  const std::string& peer_name() const { return peer_name_; }
  void set_on_message(MessageCallback cb) { on_message_ = std::move(cb); }

  void Start() {
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

  // Public operations, posted by the handle.
  void Send(uint32_t channel, std::vector<uint8_t> message, Deadline deadline, SendDone done) {
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

  // Link::Close(): stop taking sends, flush what is queued (up to close_flush_ns), then close.
  void Close(Status status) {
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

  // Tells the peer on every stream that is up, then ends the link: unfinished sends fail with
  // `status`, and each stream is dropped once its close record is written.
  void CloseNow(CloseReason reason, Status status) {
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

  void KillStream(int index) {
    if (index < 0 || static_cast<size_t>(index) >= slots_.size() || !slots_[index]) return;
    // shutdown() without close(): both directions fail as on a dropped connection.
    asio::error_code ec;
    slots_[index]->Lowest().shutdown(tcp::socket::shutdown_both, ec);
  }

  LinkEstimates Snapshot() const {
    std::lock_guard<std::mutex> lock(snapshot_mu_);
    return snapshot_;
  }
  // Blocks the caller (not the I/O thread) until `n` streams are up or the link ended.
  Status WaitForStreams(int n, Deadline deadline) {
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

  // Called by the endpoint when an accepted stream passed every check.
  void AttachAccepted(const std::shared_ptr<StreamConn>& stream, int index) {
    if (static_cast<size_t>(index) >= slots_.size()) slots_.resize(static_cast<size_t>(index) + 1);
    if (slots_[index]) {
      StreamDown(slots_[index], UnavailableError("replaced by a new stream from the peer"),
                 false);
    }
    Attach(stream, index);
  }

  // Endpoint shutdown: fail everything and tell the peer (so that it does not redial); the
  // streams go once their close records are written, or at DropAllStreams. A link that already
  // ended (Close) is left to finish its close records; DropAllStreams still drops its streams.
  void Shutdown() {
    CloseNow(CloseReason::kShutdown,
             UnavailableError("link to " + peer_name_ + " closed: endpoint shut down"));
  }
  int streams_up() const { return streams_up_; }
  void DropAllStreams() {
    for (auto& stream : std::vector<std::shared_ptr<StreamConn>>(slots_)) {
      if (stream) Drop(stream);
    }
    Publish();
  }

  bool active() const { return state_ == State::kActive; }

 private:
  // ---- Dialing -------------------------------------------------------------------------------

  void Dial(int slot) {
    if (state_ != State::kActive || slot >= target_streams_) return;
    auto stream = std::make_shared<StreamConn>(tcp::socket(endpoint_->io()), endpoint_->tls(),
                                               peer_name_ + " stream " + std::to_string(slot));
    stream->slot = slot;
    dialing_[slot] = stream;
    auto self = shared_from_this();
    stream->ArmDeadline(options_.handshake_timeout_ns);
    stream->Lowest().async_connect(address_, [self, stream](const asio::error_code& ec) {
      if (ec) return self->DialFailed(stream, "connect: " + Describe(ec));
      if (Status s = stream->Configure(self->options_); !s.ok()) {
        STRAIT_LOG(kWarn, "net") << stream->peer() << ": socket options: " << s;
      }
      if (stream->tls() == nullptr) return self->SendHello(stream);
      stream->tls()->async_handshake(
          asio::ssl::stream_base::client, [self, stream](const asio::error_code& hec) {
            if (hec) return self->DialFailed(stream, "TLS handshake: " + Describe(hec));
            StatusOr<std::string> region = PeerRegion(stream->tls()->native_handle());
            if (!region.ok()) {
              self->endpoint_->Count([](EndpointCounters& c) { ++c.identity_mismatch; });
              return self->DialFailed(stream, region.status().message());
            }
            if (*region != self->peer_region_) {
              self->endpoint_->Count([](EndpointCounters& c) { ++c.identity_mismatch; });
              return self->DialFailed(stream, "peer certificate names region '" + *region +
                                                  "', expected '" + self->peer_region_ + "'");
            }
            self->SendHello(stream);
          });
    });
  }

  void SendHello(const std::shared_ptr<StreamConn>& stream) {
    Hello hello;
    hello.flags = ever_attached_ ? kHelloResume : 0;
    hello.session_id = session_id_;
    hello.stream_index = static_cast<uint16_t>(stream->slot);
    hello.region = endpoint_->options().region;
    stream->hello = EncodeHello(hello);
    auto self = shared_from_this();
    stream->Write(asio::buffer(stream->hello), [self, stream](const asio::error_code& ec,
                                                              size_t) {
      if (ec) return self->DialFailed(stream, "sending hello: " + Describe(ec));
      stream->hello.assign(kHelloFixedBytes, 0);
      stream->Read(asio::buffer(stream->hello), [self, stream](const asio::error_code& rec,
                                                               size_t) {
        if (rec) {
          return self->DialFailed(stream, "reading the peer's hello: " + Describe(rec) +
                                              " (the peer refused this gateway; see its log)");
        }
        Hello reply;
        size_t region_length = 0;
        HelloError kind;
        Status s = ParseHelloFixed(stream->hello, &reply, &region_length, &kind);
        if (!s.ok()) {
          self->endpoint_->Count([kind](EndpointCounters& c) {
            if (kind == HelloError::kBadMagic) ++c.bad_magic;
            else if (kind == HelloError::kBadVersion) ++c.bad_version;
            else ++c.bad_hello;
          });
          return self->DialFailed(stream, s.message());
        }
        stream->hello.assign(region_length, 0);
        stream->Read(asio::buffer(stream->hello), [self, stream, reply](
                                                      const asio::error_code& gec, size_t) {
          if (gec) return self->DialFailed(stream, "reading the peer's hello: " + Describe(gec));
          std::string region(stream->hello.begin(), stream->hello.end());
          if (region == self->peer_region_ && (reply.flags & kHelloUnknownSession)) {
            stream->Close();
            self->End(State::kFailed,
                      UnavailableError("peer " + self->peer_name_ +
                                       " restarted: it no longer knows this link, so messages "
                                       "it had not acknowledged are lost; open a new link"),
                      true);
            return;
          }
          if (region != self->peer_region_ || reply.session_id != self->session_id_ ||
              reply.stream_index != stream->slot) {
            self->endpoint_->Count([](EndpointCounters& c) { ++c.identity_mismatch; });
            return self->DialFailed(stream, "peer answered as region '" + region +
                                                "' for another session or stream");
          }
          stream->DisarmDeadline();
          self->dialing_.erase(stream->slot);
          self->Attach(stream, stream->slot);
        });
      });
    });
  }

  void DialFailed(const std::shared_ptr<StreamConn>& stream, const std::string& why) {
    const bool timed_out = stream->timed_out();
    stream->Close();
    if (dialing_.count(stream->slot) && dialing_[stream->slot] == stream) {
      dialing_.erase(stream->slot);
    }
    if (state_ != State::kActive) return;
    ++est_.stream_failures;
    last_error_ = (timed_out ? "timed out (" + why + ")" : why);
    if (timed_out) endpoint_->Count([](EndpointCounters& c) { ++c.handshake_timeouts; });
    // The first failure since a stream was last up warns; redials failing the same way would
    // repeat it every backoff step for as long as the peer is away.
    if (!dial_warned_) {
      dial_warned_ = true;
      STRAIT_LOG(kWarn, "net") << "dialing " << stream->peer() << " failed: " << last_error_
                               << "; redialling with backoff (further failures are logged at "
                                  "debug level until a stream comes up)";
    } else {
      STRAIT_LOG(kDebug, "net") << "dialing " << stream->peer() << " failed: " << last_error_;
    }
    ScheduleRedial(stream->slot);
    Publish();
  }

  void ScheduleRedial(int slot) {
    if (state_ != State::kActive || role_ != Role::kDialer || slot >= target_streams_) return;
    int& attempt = redial_attempts_[slot];
    const double base = std::min(static_cast<double>(options_.redial_max_ns),
                                 static_cast<double>(options_.redial_initial_ns) *
                                     std::pow(2.0, std::min(attempt, 30)));
    ++attempt;
    const double jitter = 0.5 + 0.5 * static_cast<double>(RandomU64() >> 11) * 0x1.0p-53;
    auto timer = std::make_shared<asio::steady_timer>(endpoint_->io());
    timer->expires_after(std::chrono::nanoseconds(static_cast<int64_t>(base * jitter)));
    redial_timers_[slot] = timer;
    timer->async_wait([self = shared_from_this(), slot, timer](const asio::error_code& ec) {
      if (ec || self->redial_timers_[slot] != timer) return;
      self->redial_timers_.erase(slot);
      if (!self->slots_[slot] && !self->dialing_.count(slot)) self->Dial(slot);
    });
  }

  // ---- Streams up and down -------------------------------------------------------------------

  void Attach(const std::shared_ptr<StreamConn>& stream, int slot) {
    ever_attached_ = true;
    if (state_ != State::kActive) {
      stream->Close();
      return;
    }
    stream->link = shared_from_this();
    stream->slot = slot;
    stream->up = true;
    stream->last_rx_ns = MonotonicNanos();
    slots_[slot] = stream;
    redial_attempts_[slot] = 0;
    if (dial_warned_ && role_ == Role::kDialer) {
      STRAIT_LOG(kInfo, "net") << stream->peer() << " up again";
    }
    dial_warned_ = false;
    ++streams_up_;
    STRAIT_LOG(kDebug, "net") << stream->peer() << " up";
    ReadRecord(stream);
    Pump(stream);
    Publish();
  }

  // Takes a stream out of the pool for good (its slot may be redialled with a new one).
  // By value: callers pass slots_[i], which this resets.
  bool Drop(std::shared_ptr<StreamConn> stream) {
    if (!stream->up) return false;
    stream->up = false;
    stream->Close();
    retrans_closed_ += stream->final_retrans_;
    const int slot = stream->slot;
    if (slot >= 0 && static_cast<size_t>(slot) < slots_.size() && slots_[slot] == stream) {
      slots_[slot].reset();
    }
    stream->link.reset();  // breaks the link <-> stream cycle
    --streams_up_;
    if (streams_up_ == 0) {
      no_streams_since_ = MonotonicNanos();
      if (state_ != State::kActive) endpoint_->Released(this);
    }
    return true;
  }

  void StreamDown(std::shared_ptr<StreamConn> stream, const Status& why, bool protocol_error) {
    if (stream->retiring && !protocol_error) {
      // Expected: the peer closed a stream that both sides were retiring.
      STRAIT_LOG(kDebug, "net") << stream->peer() << " retired: " << why.message();
      return RetireDone(stream);
    }
    if (!Drop(stream)) return;
    const int slot = stream->slot;
    if (state_ != State::kActive) return;
    ++est_.stream_failures;
    if (protocol_error) ++est_.protocol_errors;
    last_error_ = why.message();
    const size_t requeued = send_.OnStreamLost(slot);
    STRAIT_LOG(kWarn, "net") << stream->peer() << " down: " << why.message() << "; " << requeued
                             << " unacknowledged chunks go out on the other streams";
    ScheduleRedial(slot);
    PumpAll();
    Publish();
  }

  // ---- Retiring streams (the pool shrinks) -----------------------------------------------------

  // Dialer: takes `stream` out of the pool without losing or resending anything.
  void Retire(const std::shared_ptr<StreamConn>& stream) {
    if (stream->retiring || !stream->up) return;
    stream->retiring = true;
    stream->retire_sent = true;
    stream->retire_started_ns = MonotonicNanos();
    AppendRetireRecord(&stream->control);
    Pump(stream);
  }

  // Moves a retiring stream along once it wrote everything and its chunks were acknowledged:
  // the acceptor answers the retire record, the dialer then closes the stream.
  void MaybeFinishRetire(const std::shared_ptr<StreamConn>& stream) {
    if (!stream->retiring || !stream->up || stream->writing || !stream->control.empty()) return;
    if (send_.inflight_bytes(stream->slot) > 0) return;
    if (!stream->retire_sent) {
      stream->retire_sent = true;
      AppendRetireRecord(&stream->control);
      Pump(stream);
      return;
    }
    if (role_ == Role::kDialer && stream->retire_received) {
      STRAIT_LOG(kDebug, "net") << stream->peer() << " retired";
      RetireDone(stream);
    }
  }

  void RetireDone(const std::shared_ptr<StreamConn>& stream) {
    if (!Drop(stream)) return;
    const int slot = stream->slot;
    // Normally nothing: chunks still unacknowledged here (a timeout, or a peer that closed the
    // stream early) go out on the other streams.
    send_.OnStreamLost(slot);
    if (state_ == State::kActive && role_ == Role::kDialer && slot < target_streams_ &&
        !dialing_.count(slot)) {
      Dial(slot);  // the pool grew again while this stream was retiring
    }
    PumpAll();
    Publish();
  }

  // ---- Reading --------------------------------------------------------------------------------

  void ReadRecord(const std::shared_ptr<StreamConn>& stream) {
    auto self = shared_from_this();
    stream->Read(asio::buffer(stream->header), [self, stream](const asio::error_code& ec,
                                                              size_t) {
      if (!stream->up) return;
      if (ec) return self->StreamDown(stream, UnavailableError(Describe(ec)), false);
      RecordHeader header;
      if (Status s = ParseRecordHeader(stream->header, &header); !s.ok()) {
        STRAIT_LOG(kWarn, "net") << stream->peer() << ": protocol error: " << s.message();
        return self->StreamDown(stream, s, true);
      }
      stream->body.resize(header.length);
      stream->Read(asio::buffer(stream->body), [self, stream, header](
                                                   const asio::error_code& bec, size_t) {
        if (!stream->up) return;
        if (bec) return self->StreamDown(stream, UnavailableError(Describe(bec)), false);
        stream->last_rx_ns = MonotonicNanos();
        if (Status s = self->OnRecord(stream, header); !s.ok()) {
          STRAIT_LOG(kWarn, "net") << stream->peer() << ": protocol error: " << s.message();
          return self->StreamDown(stream, s, true);
        }
        if (stream->up) self->ReadRecord(stream);
      });
    });
  }

  Status OnRecord(const std::shared_ptr<StreamConn>& stream, const RecordHeader& header) {
    std::span<const uint8_t> body(stream->body);
    switch (header.type) {
      case RecordType::kData: {
        DataHeader data;
        STRAIT_RETURN_IF_ERROR(ParseDataHeader(body, &data));
        const auto payload = body.subspan(kDataHeaderBytes);
        est_.bytes_received += payload.size();
        bool duplicate = false;
        std::vector<Delivery> deliveries;
        STRAIT_RETURN_IF_ERROR(receive_.OnChunk(data, payload, &duplicate, &deliveries));
        if (duplicate) ++est_.duplicate_chunks;
        ack_pending_ = true;
        PumpAll();
        for (Delivery& d : deliveries) {
          ++est_.messages_delivered;
          if (on_message_) on_message_(d.channel, std::move(d.data));
        }
        Publish();
        return Status::Ok();
      }
      case RecordType::kAck: {
        Ack ack;
        STRAIT_RETURN_IF_ERROR(ParseAck(body, &ack));
        uint64_t acked = 0;
        std::vector<Completion> completions;
        STRAIT_RETURN_IF_ERROR(send_.OnAck(ack, &acked, &completions));
        est_.bytes_acked += acked;
        SampleDelivery(ack, acked);
        PumpAll();
        Finish(std::move(completions));
        MaybeFinishClose();
        Publish();
        return Status::Ok();
      }
      case RecordType::kPing:
        AppendPingRecord(RecordType::kPong, GetU64(body.data()), &stream->control);
        Pump(stream);
        return Status::Ok();
      case RecordType::kPong: {
        const int64_t sample = MonotonicNanos() - static_cast<int64_t>(GetU64(body.data()));
        if (sample > 0) {
          est_.rtt_min_ns = est_.rtt_min_ns == 0 ? sample : std::min(est_.rtt_min_ns, sample);
          est_.rtt_smoothed_ns =
              est_.rtt_smoothed_ns == 0 ? sample : (7 * est_.rtt_smoothed_ns + sample) / 8;
        }
        return Status::Ok();
      }
      case RecordType::kClose:
        STRAIT_LOG(kInfo, "net") << peer_name_ << " closed the link (reason "
                                 << GetU32(body.data()) << ")";
        End(State::kClosed, UnavailableError("peer " + peer_name_ + " closed the link"),
            /*close_streams=*/true);
        return Status::Ok();
      case RecordType::kRetire:
        stream->retire_received = true;
        if (!stream->retiring) {
          stream->retiring = true;
          stream->retire_started_ns = MonotonicNanos();
        }
        MaybeFinishRetire(stream);
        return Status::Ok();
    }
    return DataLossError("unhandled record type");
  }

  // ---- Writing (work stealing) ----------------------------------------------------------------

  void PumpAll() {
    for (auto& stream : slots_) {
      if (stream && stream->up) Pump(stream);
    }
  }

  // Starts a write on `stream` if it is idle: control records first, then the link's acks, then
  // one data chunk if the stream's in-flight budget allows. A stream whose socket is slow stays
  // busy writing and so takes fewer chunks.
  void Pump(std::shared_ptr<StreamConn> stream) {
    if (!stream->up || stream->writing) return;
    stream->out.clear();
    stream->out_payload = 0;
    stream->out.swap(stream->control);
    if (ack_pending_ && state_ == State::kActive) {
      AppendAckRecord(receive_.MakeAck(), &stream->out);
      ack_pending_ = false;
    }
    if (state_ == State::kActive && !stream->close_after_write && !stream->retiring) {
      if (const OutChunk* chunk =
              send_.Next(stream->slot, chunk_bytes_, options_.max_inflight_per_stream)) {
        StampSent(*chunk);
        AppendDataRecordHeaders(chunk->header(), chunk->length, &stream->out);
        stream->out.insert(stream->out.end(), chunk->payload(),
                           chunk->payload() + chunk->length);
        stream->out_payload = chunk->length;
        ++est_.chunks_sent;
      }
    }
    if (stream->out.empty()) {
      MaybeFinishRetire(stream);
      return;
    }
    stream->writing = true;
    auto self = shared_from_this();
    stream->Write(asio::buffer(stream->out), [self, stream](const asio::error_code& ec, size_t) {
      stream->writing = false;
      if (!stream->up) return;
      if (ec) return self->StreamDown(stream, UnavailableError(Describe(ec)), false);
      self->est_.bytes_sent += stream->out_payload;
      if (stream->close_after_write && stream->control.empty()) {
        self->Drop(stream);
        self->Publish();
        return;
      }
      self->Pump(stream);
    });
  }

  // ---- Periodic work --------------------------------------------------------------------------

  void ArmTick() {
    tick_.expires_after(std::chrono::nanoseconds(kTickNs));
    tick_.async_wait([self = shared_from_this()](const asio::error_code& ec) {
      if (ec || self->state_ != State::kActive) return;
      self->Tick();
      if (self->state_ == State::kActive) self->ArmTick();
    });
  }

  void Tick() {
    const int64_t now = MonotonicNanos();
    std::vector<Completion> completions;
    send_.ExpireDeadlines(now, peer_name_, &completions);
    Finish(std::move(completions));

    int64_t tcp_rtt_sum = 0;
    int tcp_rtt_n = 0;
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

  void StampSent(const OutChunk& chunk) {
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

  void SampleDelivery(const Ack& ack, uint64_t acked) {
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

  // The propagation RTT (the kernel's minimum, else the least ping RTT): the bandwidth-delay
  // product and the adaptation windows are about the path, not about queues this link builds
  // itself (pings wait behind up to max_inflight_per_stream of data).
  int64_t BaseRttNs() const { return PathRttNs(est_); }

  void StartAdaptRound(int64_t at_ns) {
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
  void AdaptTick(int64_t now) {
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

  struct PendingRound;
  void Adapt(int64_t now, double goodput, const PendingRound& round) {
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

 public:
  // Dialer: grows the pool to `next` streams (dialing the new slots) or shrinks it (retiring the
  // streams above it). The next adaptation round waits for the new pool.
  void ResizePool(int next, int64_t now) {
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

 private:

  // Ends a link Close() is flushing once nothing is left or the flush deadline passed.
  void MaybeFinishClose() {
    if (!closing_ || state_ != State::kActive) return;
    if (!send_.idle() && MonotonicNanos() < close_deadline_ns_) return;
    CloseNow(CloseReason::kNormal, close_status_);
  }

  // ---- Ending ---------------------------------------------------------------------------------

  void End(State state, Status status, bool close_streams) {
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

  void Finish(std::vector<Completion> completions) {
    for (Completion& c : completions) {
      if (c.status.ok()) {
        ++est_.messages_sent;
      } else {
        ++est_.send_failures;
      }
      if (c.done) c.done(std::move(c.status));
    }
  }

  void Publish() {
    est_.streams_up = streams_up_;
    est_.chunks_resent = send_.chunks_resent();
    est_.queued_bytes = send_.queued_bytes();
    {
      std::lock_guard<std::mutex> lock(snapshot_mu_);
      snapshot_ = est_;
    }
    snapshot_cv_.notify_all();
  }

  std::shared_ptr<EndpointCore> endpoint_;
  LinkOptions options_;
  Role role_;
  std::string peer_region_;
  tcp::endpoint address_;
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
  // Delivery-rate sampling (see SampleDelivery): per chunk in flight, the state when it was cut.
  struct SentStamp {
    int64_t sent_ns = 0;
    uint64_t delivered = 0;    // bytes acknowledged on the link when the chunk was cut
    int64_t delivered_ns = 0;  // when the last ack before the cut arrived
    int64_t first_sent_ns = 0;  // when the newest chunk acknowledged by then was cut
    bool app_limited = false;   // cut with nothing else waiting (StampSent)
  };
  std::map<uint64_t, SentStamp> stamps_;
  uint64_t delivered_ = 0;
  int64_t delivered_ns_ = 0;
  int64_t first_sent_ns_ = 0;
  bool settling_ = false;
  int64_t settle_began_ns_ = 0;
  int64_t adapt_start_ns_ = 0;
  int64_t adapt_window_open_ns_ = 0;
  struct PendingRound {
    int64_t begin_ns = 0, end_ns = 0, judge_ns = 0;
    double retrans_per_s = 0;
    int64_t stream_rtt_ns = 0;  // the streams' kernel smoothed RTT, mean over the round's ticks
    bool busy = false;
  };
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

// ---- EndpointCore -----------------------------------------------------------------------------

void EndpointCore::StartAccepting(std::unique_ptr<tcp::acceptor> acceptor) {
  acceptor_ = std::move(acceptor);
  AcceptNext();
}

void EndpointCore::AcceptNext() {
  if (!acceptor_ || shut_down_) return;
  acceptor_->async_accept([self = shared_from_this()](const asio::error_code& ec,
                                                      tcp::socket socket) {
    if (self->shut_down_) return;
    if (ec == asio::error::operation_aborted) return;  // the acceptor was closed
    if (ec) {
      // One WARN when the failures start, then one per 10 s of them.
      if (self->accept_failures_++ % 100 == 0) {
        STRAIT_LOG(kWarn, "net") << "accepting a WAN connection failed: " << ec.message() << " ("
                                 << self->accept_failures_ << " in a row); pausing accepts for "
                                 << "100 ms each time (raise the descriptor limit, LimitNOFILE)";
      }
      self->accept_backoff_.expires_after(std::chrono::milliseconds(100));
      self->accept_backoff_.async_wait([self](const asio::error_code& wait_ec) {
        if (!wait_ec && !self->shut_down_) self->AcceptNext();
      });
      return;
    }
    {
      self->accept_failures_ = 0;
      asio::error_code pec;
      const tcp::endpoint remote = socket.remote_endpoint(pec);
      const std::string peer = pec ? std::string("unknown peer")
                                   : remote.address().to_string() + ":" +
                                         std::to_string(remote.port());
      auto stream = std::make_shared<StreamConn>(std::move(socket), self->tls(), peer);
      self->SetUpAccepted(std::move(stream));
    }
    self->AcceptNext();
  });
}

void EndpointCore::Refuse(const std::shared_ptr<StreamConn>& stream, const std::string& why,
                          uint64_t EndpointCounters::*counter) {
  if (stream->timed_out()) counter = &EndpointCounters::handshake_timeouts;
  Count([counter](EndpointCounters& c) { ++(c.*counter); });
  // A refused peer redials with backoff, from a new port each time: one WARN per source address
  // and reason, then one line per interval with the count (the counters have every refusal).
  const std::string reason =
      stream->timed_out() ? "timed out during setup (" + why + ")" : why;
  const std::string& peer = stream->peer();
  const std::string host = peer.substr(0, peer.rfind(':'));
  const LogRateLimiter::Decision d = refusal_log_.Admit(host + " " + reason, MonotonicNanos());
  if (d.log) {
    const int64_t interval_s = refusal_log_.interval_ns() / 1'000'000'000;
    STRAIT_LOG(kWarn, "net") << "refused stream from " << peer << ": " << reason
                             << (d.suppressed == 0
                                     ? " (repeats from " + host + " are summarised every " +
                                           std::to_string(interval_s) + " s)"
                                     : " (and " + std::to_string(d.suppressed) +
                                           " more times from " + host + " since the last line)");
  }
  stream->Close();
  handshaking_.erase(stream);
}

void EndpointCore::SetUpAccepted(std::shared_ptr<StreamConn> stream) {
  handshaking_.insert(stream);
  stream->ArmDeadline(options_.link.handshake_timeout_ns);
  if (Status s = stream->Configure(options_.link); !s.ok()) {
    STRAIT_LOG(kWarn, "net") << stream->peer() << ": socket options: " << s;
  }
  auto self = shared_from_this();
  if (stream->tls() == nullptr) return ReadHello(std::move(stream), "");
  stream->tls()->async_handshake(
      asio::ssl::stream_base::server, [self, stream](const asio::error_code& ec) {
        if (ec) {
          return self->Refuse(stream, "TLS handshake failed: " + ec.message(),
                              &EndpointCounters::tls_handshake_failures);
        }
        StatusOr<std::string> region = PeerRegion(stream->tls()->native_handle());
        if (!region.ok()) {
          return self->Refuse(stream, region.status().message(),
                              &EndpointCounters::unknown_region);
        }
        if (!self->AllowedPeer(*region)) {
          return self->Refuse(stream,
                              "certificate names region '" + *region +
                                  "', which is not among the configured peer regions",
                              &EndpointCounters::unknown_region);
        }
        self->ReadHello(stream, *region);
      });
}

void EndpointCore::ReadHello(std::shared_ptr<StreamConn> stream, std::string cert_region) {
  auto self = shared_from_this();
  stream->hello.assign(kHelloFixedBytes, 0);
  stream->Read(asio::buffer(stream->hello), [self, stream, cert_region](
                                                const asio::error_code& ec, size_t) {
    if (ec) {
      return self->Refuse(stream, "no hello: " + ec.message(), &EndpointCounters::bad_hello);
    }
    Hello hello;
    size_t region_length = 0;
    HelloError kind;
    if (Status s = ParseHelloFixed(stream->hello, &hello, &region_length, &kind); !s.ok()) {
      auto counter = kind == HelloError::kBadMagic     ? &EndpointCounters::bad_magic
                     : kind == HelloError::kBadVersion ? &EndpointCounters::bad_version
                                                       : &EndpointCounters::bad_hello;
      return self->Refuse(stream, s.message(), counter);
    }
    stream->hello.assign(region_length, 0);
    stream->Read(asio::buffer(stream->hello), [self, stream, cert_region, hello](
                                                  const asio::error_code& rec, size_t) mutable {
      if (rec) {
        return self->Refuse(stream, "hello truncated: " + rec.message(),
                            &EndpointCounters::bad_hello);
      }
      hello.region.assign(stream->hello.begin(), stream->hello.end());
      if (!IsValidRegionName(hello.region)) {
        return self->Refuse(stream, "hello names an invalid region", &EndpointCounters::bad_hello);
      }
      if (!cert_region.empty() && hello.region != cert_region) {
        return self->Refuse(stream,
                            "hello claims region '" + hello.region +
                                "' but the certificate names '" + cert_region + "'",
                            &EndpointCounters::identity_mismatch);
      }
      if (!self->AllowedPeer(hello.region)) {
        return self->Refuse(stream,
                            "region '" + hello.region + "' is not among the configured peers",
                            &EndpointCounters::unknown_region);
      }
      // Find or create the link this stream belongs to.
      const auto key = std::make_pair(hello.region, hello.session_id);
      std::shared_ptr<LinkCore> link;
      if (auto it = self->sessions_.find(key); it != self->sessions_.end()) {
        link = it->second;
      } else if (hello.flags & kHelloResume) {
        // A redial of a link this process never had: it restarted (or forgot a failed link).
        // Joining it to a fresh link would pair the dialer's sequence numbers and message ids
        // with a receiver starting from 0; say so, so that the dialer fails the link and opens
        // a new one.
        self->Count([](EndpointCounters& c) { ++c.unknown_sessions; });
        STRAIT_LOG(kInfo, "net") << "redial from " << hello.region
                                 << " for a link this process does not know (one side "
                                    "restarted): telling it to open a new link";
        Hello reply;
        reply.flags = kHelloUnknownSession;
        reply.session_id = hello.session_id;
        reply.stream_index = hello.stream_index;
        reply.region = self->options_.region;
        stream->hello = EncodeHello(reply);
        stream->Write(asio::buffer(stream->hello), [self, stream](const asio::error_code&,
                                                                  size_t) {
          stream->DisarmDeadline();
          self->handshaking_.erase(stream);
          stream->Close();
        });
        return;
      } else {
        auto runtime = self->runtime_.lock();
        if (!runtime) return self->Refuse(stream, "shutting down", &EndpointCounters::bad_hello);
        asio::error_code pec;
        link = std::make_shared<LinkCore>(self, LinkCore::Role::kAcceptor, hello.region,
                                          stream->Lowest().remote_endpoint(pec),
                                          hello.session_id, nullptr);
        self->sessions_[key] = link;
        self->links_.push_back(link);
        self->Count([](EndpointCounters& c) { ++c.links_accepted; });
        link->Start();
        STRAIT_LOG(kInfo, "net") << "accepted link from " << link->peer_name();
        if (self->on_accept_) {
          auto handle = std::make_shared<Link>(
              std::make_unique<Link::Impl>(Link::Impl{std::move(runtime), link}));
          link->set_on_message(self->on_accept_(std::move(handle)));
        }
      }
      // Answer with our hello, then join the stream to the link.
      Hello reply;
      reply.session_id = hello.session_id;
      reply.stream_index = hello.stream_index;
      reply.region = self->options_.region;
      stream->hello = EncodeHello(reply);
      const int index = hello.stream_index;
      stream->Write(asio::buffer(stream->hello), [self, stream, link, index](
                                                     const asio::error_code& wec, size_t) {
        if (wec) {
          return self->Refuse(stream, "sending hello: " + wec.message(),
                              &EndpointCounters::bad_hello);
        }
        stream->DisarmDeadline();
        self->handshaking_.erase(stream);
        self->Count([](EndpointCounters& c) { ++c.streams_accepted; });
        if (!link->active()) {
          stream->Close();
          return;
        }
        link->AttachAccepted(stream, index);
      });
    });
  });
}

void EndpointCore::Register(const std::shared_ptr<LinkCore>& link) {
  if (shut_down_) {
    link->Shutdown();
    return;
  }
  links_.push_back(link);
}

void EndpointCore::Unregister(LinkCore* link) {
  for (auto it = sessions_.begin(); it != sessions_.end(); ++it) {
    if (it->second.get() == link) {
      sessions_.erase(it);
      break;
    }
  }
  auto it = std::find_if(links_.begin(), links_.end(),
                         [link](const auto& l) { return l.get() == link; });
  if (it == links_.end()) return;
  if (link->streams_up() > 0) {
    ended_.push_back(std::move(*it));
  } else {
    // Deferred: the caller is a member function of `link`, which this may be the last owner of.
    asio::post(io_, [keep = std::move(*it)] {});
  }
  links_.erase(it);
}

void EndpointCore::Released(LinkCore* link) {
  auto it = std::find_if(ended_.begin(), ended_.end(),
                         [link](const auto& l) { return l.get() == link; });
  if (it == ended_.end()) return;
  asio::post(io_, [keep = std::move(*it)] {});  // deferred, as in Unregister
  ended_.erase(it);
}

void EndpointCore::BeginShutdown() {
  shut_down_ = true;
  accept_backoff_.cancel();
  if (acceptor_) {
    asio::error_code ec;
    acceptor_->close(ec);
  }
  for (auto& stream : handshaking_) stream->Close();
  handshaking_.clear();
  // Links that ended before (Link::Close) may still be writing close records: wait for those as
  // well, and drop their streams with the rest.
  closing_ = links_;
  closing_.insert(closing_.end(), ended_.begin(), ended_.end());
  for (auto& link : closing_) link->Shutdown();
  ended_.clear();  // Shutdown() added the links it ended; closing_ holds them all
  links_.clear();
  sessions_.clear();
  on_accept_ = nullptr;
}

bool EndpointCore::ShutdownDrained() const {
  return std::all_of(closing_.begin(), closing_.end(),
                     [](const auto& link) { return link->streams_up() == 0; });
}

void EndpointCore::FinishShutdown() {
  for (auto& link : closing_) link->DropAllStreams();
  closing_.clear();
}

// ---- Public handles ---------------------------------------------------------------------------

Link::Link(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Link::~Link() = default;

const std::string& Link::peer_region() const { return impl_->core->peer_region(); }

void Link::Send(uint32_t channel, std::vector<uint8_t> message, Deadline deadline,
                SendDone done) {
  auto shared_done = std::make_shared<SendDone>(std::move(done));
  const bool posted = impl_->runtime->Post(
      [core = impl_->core, channel, message = std::move(message), deadline,
       shared_done]() mutable { core->Send(channel, std::move(message), deadline,
                                           std::move(*shared_done)); });
  if (!posted && *shared_done) {
    (*shared_done)(UnavailableError("link to region " + peer_region() +
                                    " is gone: its endpoint was shut down"));
  }
}

Status Link::SendAndWait(uint32_t channel, std::vector<uint8_t> message, Deadline deadline) {
  if (impl_->runtime->OnIoThread()) {
    return FailedPreconditionError("SendAndWait called from the link's I/O thread");
  }
  auto promise = std::make_shared<std::promise<Status>>();
  std::future<Status> future = promise->get_future();
  Send(channel, std::move(message), deadline,
       [promise](Status status) { promise->set_value(std::move(status)); });
  // The link itself fails the send at the deadline (checked every tick); the margin covers that.
  const auto until = MonoClock::time_point(std::chrono::nanoseconds(
      deadline.IsInfinite() ? INT64_MAX / 2 : deadline.at_nanos() + 1'000'000'000));
  if (future.wait_until(until) != std::future_status::ready) {
    return DeadlineExceededError("send to region " + peer_region() + " did not complete");
  }
  return future.get();
}

Status Link::WaitForStreams(int streams, Deadline deadline) {
  if (impl_->runtime->OnIoThread()) {
    return FailedPreconditionError("WaitForStreams called from the link's I/O thread");
  }
  return impl_->core->WaitForStreams(streams, deadline);
}

LinkEstimates Link::Estimates() const { return impl_->core->Snapshot(); }

void Link::Close() {
  impl_->runtime->Post([core = impl_->core] {
    core->Close(CancelledError("link to " + core->peer_name() + " closed by its owner"));
  });
}

void Link::KillStreamForTest(int index) {
  impl_->runtime->Post([core = impl_->core, index] { core->KillStream(index); });
}

void Link::SetStreamsForTest(int streams) {
  impl_->runtime->Post(
      [core = impl_->core, streams] { core->ResizePool(streams, MonotonicNanos()); });
}

struct Endpoint::Impl {
  std::shared_ptr<Runtime> runtime;
  std::shared_ptr<EndpointCore> core;
  EndpointOptions options;
  std::mutex mu;
  bool listening = false;
};

Endpoint::Endpoint(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Endpoint::~Endpoint() {
  // Close records go out first (so that peers do not redial for unreachable_after_ns), for at
  // most kShutdownDrainNs.
  impl_->runtime->Shutdown([core = impl_->core] { core->BeginShutdown(); },
                           [core = impl_->core] { return core->ShutdownDrained(); },
                           [core = impl_->core] { core->FinishShutdown(); }, kShutdownDrainNs);
}

namespace {

Status CheckOptions(const EndpointOptions& o) {
  if (!IsValidRegionName(o.region)) {
    return InvalidArgumentError("region '" + o.region +
                                "' is not a valid region name (1-63 of a-z 0-9 . _ -)");
  }
  for (const std::string& peer : o.peer_regions) {
    if (!IsValidRegionName(peer)) {
      return InvalidArgumentError("peer region '" + peer + "' is not a valid region name");
    }
  }
  const LinkOptions& l = o.link;
  if (l.streams < 1 || l.streams > kMaxStreams || l.min_streams < 1 ||
      l.max_streams > kMaxStreams || l.min_streams > l.max_streams) {
    return InvalidArgumentError("streams must satisfy 1 <= min_streams <= streams <= "
                                "max_streams <= " + std::to_string(kMaxStreams));
  }
  if (l.adapt_streams && (l.streams < l.min_streams || l.streams > l.max_streams)) {
    return InvalidArgumentError("with adapt_streams, streams (" + std::to_string(l.streams) +
                                ") must lie within [min_streams, max_streams] = [" +
                                std::to_string(l.min_streams) + ", " +
                                std::to_string(l.max_streams) +
                                "]; raise max_streams or set adapt_streams = false for a fixed K");
  }
  if (l.max_partial_bytes < l.max_message_bytes) {
    return InvalidArgumentError("max_partial_bytes must be at least max_message_bytes");
  }
  if (l.close_flush_ns < 0) return InvalidArgumentError("close_flush_ns must not be negative");
  if (l.chunk_bytes == 0 || l.chunk_bytes > kMaxChunkPayload || l.min_chunk_bytes == 0 ||
      l.max_chunk_bytes > kMaxChunkPayload || l.min_chunk_bytes > l.max_chunk_bytes) {
    return InvalidArgumentError("chunk sizes must be within 1 byte .. 16 MiB, min <= max");
  }
  if (l.max_inflight_per_stream == 0 || l.handshake_timeout_ns <= 0 ||
      l.redial_initial_ns <= 0 || l.redial_max_ns < l.redial_initial_ns ||
      l.unreachable_after_ns <= 0 || l.ping_interval_ns <= 0 ||
      l.stream_timeout_ns <= l.ping_interval_ns) {
    return InvalidArgumentError("link timeouts and limits must be positive, with "
                                "redial_max >= redial_initial and stream_timeout > ping_interval");
  }
  return Status::Ok();
}

}  // namespace

Status CheckEndpoint(const EndpointOptions& options, EndpointSetting* setting) {
  EndpointSetting ignored = EndpointSetting::kNone;
  if (setting == nullptr) setting = &ignored;
  *setting = EndpointSetting::kOptions;
  STRAIT_RETURN_IF_ERROR(CheckOptions(options));
  *setting = EndpointSetting::kCongestionControl;
  STRAIT_RETURN_IF_ERROR(CheckCongestionControl(options.link.congestion_control));
  *setting = EndpointSetting::kNone;
  if (options.transport == Transport::kTls) {
    STRAIT_RETURN_IF_ERROR(LoadTlsIdentity(options.region, options.ca_file, options.cert_file,
                                           options.key_file, setting)
                               .status());
  }
  return Status::Ok();
}

StatusOr<std::unique_ptr<Endpoint>> Endpoint::Create(EndpointOptions options,
                                                     AcceptCallback on_accept) {
  STRAIT_RETURN_IF_ERROR(CheckOptions(options));
  STRAIT_RETURN_IF_ERROR(CheckCongestionControl(options.link.congestion_control));
  std::unique_ptr<asio::ssl::context> tls;
  if (options.transport == Transport::kTls) {
    STRAIT_ASSIGN_OR_RETURN(tls, LoadTlsIdentity(options.region, options.ca_file,
                                                 options.cert_file, options.key_file));
  } else {
    STRAIT_LOG(kWarn, "net") << "endpoint " << options.region
                             << " uses plain TCP: no encryption, no peer authentication";
  }
  auto impl = std::make_unique<Impl>();
  impl->options = options;
  impl->runtime = std::make_shared<Runtime>();
  impl->core = std::make_shared<EndpointCore>(impl->runtime->io(), std::move(options),
                                              std::move(tls), std::move(on_accept),
                                              impl->runtime);
  return std::unique_ptr<Endpoint>(new Endpoint(std::move(impl)));
}

StatusOr<uint16_t> Endpoint::Listen(const std::string& address, uint16_t port) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  if (impl_->listening) return FailedPreconditionError("this endpoint already listens");
  asio::error_code ec;
  const asio::ip::address ip = asio::ip::make_address(address, ec);
  if (ec) return InvalidArgumentError("listen address '" + address + "' is not a numeric IP");
  // The acceptor is set up here, before the I/O thread ever sees it.
  auto acceptor = std::make_unique<tcp::acceptor>(impl_->runtime->io());
  const tcp::endpoint at(ip, port);
  const std::string where = address + ":" + std::to_string(port);
  acceptor->open(at.protocol(), ec);
  if (!ec) acceptor->set_option(tcp::acceptor::reuse_address(true), ec);
  if (!ec) acceptor->bind(at, ec);
  if (!ec) acceptor->listen(asio::socket_base::max_listen_connections, ec);
  if (ec) return UnavailableError("cannot listen on " + where + ": " + ec.message());
  const uint16_t bound = acceptor->local_endpoint(ec).port();
  if (ec) return InternalError("cannot read the bound port: " + ec.message());
  auto shared = std::shared_ptr<tcp::acceptor>(std::move(acceptor));
  if (!impl_->runtime->Post([core = impl_->core, shared]() mutable {
        core->StartAccepting(std::make_unique<tcp::acceptor>(std::move(*shared)));
      })) {
    return UnavailableError("endpoint is shutting down");
  }
  impl_->listening = true;
  STRAIT_LOG(kInfo, "net") << "region " << impl_->options.region << " listening on " << address
                           << ":" << bound;
  return bound;
}

StatusOr<std::shared_ptr<Link>> Endpoint::Connect(const std::string& peer_region,
                                                  const std::string& address, uint16_t port,
                                                  MessageCallback on_message) {
  if (!IsValidRegionName(peer_region)) {
    return InvalidArgumentError("peer region '" + peer_region + "' is not a valid region name");
  }
  asio::error_code ec;
  const asio::ip::address ip = asio::ip::make_address(address, ec);
  if (ec) return InvalidArgumentError("peer address '" + address + "' is not a numeric IP");
  if (port == 0) return InvalidArgumentError("peer port must not be 0");
  auto core = std::make_shared<LinkCore>(impl_->core, LinkCore::Role::kDialer, peer_region,
                                         tcp::endpoint(ip, port), RandomU64(),
                                         std::move(on_message));
  if (!impl_->runtime->Post([endpoint = impl_->core, core] {
        endpoint->Register(core);
        if (core->active()) core->Start();
      })) {
    return UnavailableError("endpoint is shutting down");
  }
  return std::make_shared<Link>(
      std::make_unique<Link::Impl>(Link::Impl{impl_->runtime, std::move(core)}));
}

EndpointCounters Endpoint::Counters() const { return impl_->core->Counters(); }

Status Endpoint::ReloadIdentity() {
  const EndpointOptions& o = impl_->options;
  if (o.transport != Transport::kTls) {
    return FailedPreconditionError(
        "this endpoint uses plain TCP: there is no TLS identity to reload");
  }
  StatusOr<std::unique_ptr<asio::ssl::context>> tls =
      LoadTlsIdentity(o.region, o.ca_file, o.cert_file, o.key_file);
  if (!tls.ok()) {
    return tls.status().WithContext("reloading the TLS identity (the old one stays in use)");
  }
  impl_->core->ReplaceTls(std::move(*tls));
  STRAIT_LOG(kInfo, "net") << "region " << o.region << " reloaded its TLS identity from '"
                           << o.cert_file << "'; new handshakes use it";
  return Status::Ok();
}

const EndpointOptions& Endpoint::options() const { return impl_->options; }

}  // namespace strait::net

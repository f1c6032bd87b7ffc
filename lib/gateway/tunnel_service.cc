// TunnelService (see tunnel.h): listens and tunnels as state machines on the local server's
// event loop. Each local connection handed over is wrapped in an Asio socket on that loop; a
// tunnel's two directions are a read of the rank's next frame (while the peer's window allows)
// and a write of the peer's next message (while any is queued), each started again by Pump()
// when it ends or when the WAN side (OnWanMessage, on the endpoint's I/O thread) queues a message,
// a credit or a close and posts a kick. The supervisor is a timer on the same loop.
#include "common/strings.h"
#include "gateway/tunnel.h"

#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <deque>
#include <sstream>
#include <utility>

#include <asio.hpp>

#include "common/clock.h"
#include "common/endian.h"
#include "common/log.h"
#include "common/units.h"
#include "net/link.h"

namespace strait::gateway {
namespace {

constexpr const char* kLog = "tunnel";
// How often the supervisor looks at tunnels (accept deadlines, link health, shutdown), and how
// often a connect waiting for its link looks again.
constexpr auto kSuperviseEvery = std::chrono::milliseconds(100);
constexpr auto kLinkRetry = std::chrono::milliseconds(20);
// Deadlines of the writes to a rank: a reply, a listen's event, a close; and of a frame's body
// once its length arrived.
constexpr int64_t kReplyTimeoutNs = 10'000'000'000;
constexpr int64_t kRefusalTimeoutNs = 5'000'000'000;
constexpr int64_t kCloseTimeoutNs = 1'000'000'000;
constexpr int64_t kFrameTimeoutNs = 30'000'000'000;

using Socket = asio::local::stream_protocol::socket;

Message ReplyTo(MessageType to, const Status& status) {
  return localproto::ReplyMessage(to, status);
}

uint64_t Cost(uint64_t raw_bytes) { return raw_bytes + kTunnelMessageCost; }

}  // namespace

// A rank's Unix connection on the loop, with one deadline timer for the transfer under way.
// Loop only.
class TunnelService::RankConn {
 public:
  RankConn(asio::io_context& loop, int fd) : socket_(loop), timer_(loop) {
    asio::error_code ec;
    socket_.assign(asio::local::stream_protocol(), fd, ec);
    if (ec) ::close(fd);
  }
  Socket& socket() { return socket_; }
  bool open() const { return socket_.is_open(); }
  // Cancels the socket's transfers when `ns` pass before Disarm(); `keep` lives until then.
  void Arm(int64_t ns, std::shared_ptr<void> keep) {
    timed_out_ = false;
    const uint64_t arming = ++arming_;
    timer_.expires_after(std::chrono::nanoseconds(ns));
    timer_.async_wait([this, arming, keep = std::move(keep)](const asio::error_code& ec) {
      if (ec || arming != arming_) return;
      timed_out_ = true;
      asio::error_code ignored;
      socket_.cancel(ignored);
    });
  }
  void Disarm() {
    ++arming_;
    timer_.cancel();
  }
  bool timed_out() const { return timed_out_; }
  void Cancel() {
    asio::error_code ignored;
    socket_.cancel(ignored);
  }
  void ShutdownWrite() {
    asio::error_code ignored;
    socket_.shutdown(asio::socket_base::shutdown_send, ignored);
  }
  void Close() {
    Disarm();
    asio::error_code ignored;
    socket_.close(ignored);
  }

 private:
  Socket socket_;
  asio::steady_timer timer_;
  uint64_t arming_ = 0;
  bool timed_out_ = false;
};

class TunnelService::Timer : public asio::steady_timer {
 public:
  using asio::steady_timer::steady_timer;
};

struct TunnelService::State {
  enum class Phase { kOpening, kAwaitingAccept, kOpen };
  uint64_t id = 0;
  uint64_t listen_id = 0;   // the listen it came in on (accepting side)
  uint32_t listen_uid = 0;  // the uid that listened: only it may accept (accepting side)
  int peer = -1;
  std::string peer_name;  // "region X"
  uint32_t channel = 0;
  std::shared_ptr<net::Link> link;

  // Shared with the I/O thread (OnWanMessage, send callbacks), under `mu`.
  std::mutex mu;
  // Atomic because it is read under the service's mu_ (Supervise, ServeListen, ServeAccept look
  // for kAwaitingAccept) but kOpening -> kOpen is written under `mu` alone (OnWanMessage);
  // every other field here stays under `mu`.
  std::atomic<Phase> phase{Phase::kOpening};
  int64_t accept_deadline_ns = 0;
  bool open_done = false;  // kOpening: the peer answered (open_status) or the link failed
  Status open_status;
  uint64_t remote_window = 0;
  uint64_t unacked = 0;  // cost of messages sent to the peer and not yet credited
  std::deque<TunnelWire> inbound;
  uint64_t inbound_cost = 0;
  bool peer_closed = false;  // no more will come from the peer: deliver inbound, then close
  StatusCode close_code = StatusCode::kOk;
  std::string close_text;
  bool rank_closed = false;  // the local rank is gone or ended the tunnel
  bool notify_rank = false;  // ... and is still there to be told why (rank_code / rank_text)
  StatusCode rank_code = StatusCode::kOk;
  std::string rank_text;

  // Loop only: the rank's connection (null on the accepting side until accepted) and the
  // progress of each direction.
  std::unique_ptr<RankConn> rank;
  bool connecting = false;  // a connect waiting for the peer's answer (Resolve)
  Deadline open_deadline = Deadline::After(0);
  std::unique_ptr<asio::steady_timer> open_timer;  // Pump at open_deadline
  uint64_t requested_listen = 0;
  int64_t open_timeout_ns = 0;
  bool piping = false;   // the rank has its reply: data flows (Pump)
  bool reading = false;  // a read of the rank's next frame is under way
  bool writing = false;  // a write to the rank is under way
  bool writer_done = false;
  bool finished = false;
  std::array<uint8_t, localproto::kFrameLengthBytes> length{};
  std::vector<uint8_t> body;
  std::vector<uint8_t> out;
  std::unique_ptr<TunnelCodec> codec;  // set when the pipe starts
  bool closing_write = false;  // the write under way is the last one (kTunnelClose)
  Decoder decoder;
  uint64_t credit = 0;
};

struct TunnelService::Listen {
  uint64_t id = 0;
  uint32_t uid = 0;  // of the listening rank
  std::mutex mu;
  std::deque<TunnelEvent> events;  // under mu (OnWanMessage adds)
  // Loop only.
  std::unique_ptr<RankConn> rank;
  bool writing = false;
  bool ended = false;
  std::vector<uint8_t> out;
};

TunnelService::TunnelService(TunnelServiceOptions options, LinkLookup links,
                             const std::atomic<bool>* stopping)
    : options_(std::move(options)),
      links_(std::move(links)),
      stopping_(stopping),
      rng_(std::random_device{}()) {}

TunnelService::~TunnelService() = default;

void TunnelService::Start(asio::io_context& loop) {
  loop_ = &loop;
  supervisor_ = std::make_unique<Timer>(loop);
  ArmSupervisor();
}

std::string TunnelService::RegionName(int peer) const {
  if (peer >= 0 && static_cast<size_t>(peer) < options_.world.size()) {
    return "region " + options_.world[static_cast<size_t>(peer)];
  }
  return "region #" + std::to_string(peer);
}

uint64_t TunnelService::NewIdLocked() {
  for (;;) {
    const uint64_t id = rng_();
    if (id != 0 && tunnels_.count(id) == 0 && listens_.count(id) == 0) return id;
  }
}

void TunnelService::Forget(uint64_t tunnel_id) {
  std::lock_guard<std::mutex> lock(mu_);
  tunnels_.erase(tunnel_id);
}

void TunnelService::SendWire(const std::shared_ptr<net::Link>& link, const TunnelWire& wire,
                             int64_t timeout_ns, std::function<void(Status)> done) {
  if (link == nullptr) {
    if (done) done(UnavailableError("no link"));
    return;
  }
  std::vector<uint8_t> bytes = EncodeTunnelWire(wire);
  wire_bytes_sent_ += bytes.size();
  link->Send(TunnelChannel(wire.tunnel_id), std::move(bytes), Deadline::After(timeout_ns),
             [done = std::move(done)](Status s) {
               if (done) done(std::move(s));
             });
}

void TunnelService::Kick(const std::shared_ptr<State>& t) {
  if (loop_ != nullptr) asio::post(*loop_, [this, t] { Pump(t); });
}

void TunnelService::PeerClosed(const std::shared_ptr<State>& t, Status why) {
  {
    std::lock_guard<std::mutex> lock(t->mu);
    if (t->phase == State::Phase::kOpening) {
      if (!t->open_done) {
        t->open_done = true;
        t->open_status = why.ok() ? UnavailableError("closed before it opened") : why;
      }
    }
    if (!t->peer_closed) {
      t->peer_closed = true;
      t->close_code = why.code();
      t->close_text = why.ok() ? "the rank in " + t->peer_name + " closed the tunnel"
                               : std::string(why.message());
    }
  }
  Kick(t);
}

// Writes `frame` (held in `*out`) to the rank under `timeout_ns`, then calls done(status) on the
// loop. `owner` keeps the object that holds `rank` and `out` alive.
void TunnelService::WriteToRank(RankConn& rank, std::vector<uint8_t>* out, int64_t timeout_ns,
                                std::shared_ptr<void> owner,
                                std::function<void(const Status&)> done) {
  if (timeout_ns > 0) rank.Arm(timeout_ns, owner);
  asio::async_write(rank.socket(), asio::buffer(*out),
                    [&rank, timeout_ns, owner, done = std::move(done)](const asio::error_code& ec,
                                                                       size_t) {
                      if (timeout_ns > 0) rank.Disarm();
                      if (!ec) return done(Status::Ok());
                      if (rank.timed_out()) {
                        return done(DeadlineExceededError("local socket: timed out writing"));
                      }
                      if (ec == asio::error::operation_aborted) {
                        return done(CancelledError("tunnel ended while writing to the rank"));
                      }
                      done(UnavailableError("write to the rank failed: " + ec.message()));
                    });
}

// Writes `reply` to the rank, then closes its connection.
void TunnelService::RefuseAndClose(std::unique_ptr<RankConn> rank, const Message& reply) {
  auto holder = std::make_shared<std::pair<std::unique_ptr<RankConn>, std::vector<uint8_t>>>();
  holder->first = std::move(rank);
  auto frame = EncodeMessage(reply);
  if (!frame.ok() || !holder->first->open()) return holder->first->Close();
  holder->second = std::move(frame).value();
  WriteToRank(*holder->first, &holder->second, kRefusalTimeoutNs, holder,
              [holder](const Status&) { holder->first->Close(); });
}

void TunnelService::Serve(int fd, const Message& request) {
  // Only the uid that listened may accept what comes in on its listen, so that another local
  // user who learns a tunnel id cannot take the tunnel (the gateway admits several uids).
  ucred cred{};
  socklen_t len = sizeof(cred);
  const uint32_t uid =
      ::getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) == 0 ? cred.uid : UINT32_MAX;
  auto rank = std::make_unique<RankConn>(*loop_, fd);
  if (Stopping()) {
    // The supervisor may have ended its rounds: nothing would end this one.
    return RefuseAndClose(std::move(rank),
                          ReplyTo(request.type, UnavailableError("the gateway of " +
                                                                 options_.region +
                                                                 " is shutting down")));
  }
  switch (request.type) {
    case MessageType::kTunnelListen: return ServeListen(std::move(rank), uid);
    case MessageType::kTunnelConnect: return ServeConnect(std::move(rank), request);
    case MessageType::kTunnelAccept: return ServeAccept(std::move(rank), request, uid);
    default:
      return RefuseAndClose(std::move(rank), ReplyTo(request.type,
                                                     InvalidArgumentError("not a tunnel request")));
  }
}

// ---- Listens ---------------------------------------------------------------------------------

void TunnelService::ServeListen(std::unique_ptr<RankConn> rank, uint32_t uid) {
  auto listen = std::make_shared<Listen>();
  listen->uid = uid;
  listen->rank = std::move(rank);
  {
    std::lock_guard<std::mutex> lock(mu_);
    listen->id = NewIdLocked();
    listens_[listen->id] = listen;
  }
  ++listens_total_;
  ++live_;
  Message reply = ReplyTo(MessageType::kTunnelListen, Status::Ok());
  const TunnelEvent listening{TunnelEventKind::kListening, listen->id,
                              static_cast<uint32_t>(options_.shard), options_.region};
  reply.data = EncodeTunnelEvent(listening);
  auto frame = EncodeMessage(reply);
  if (!frame.ok()) return EndListen(listen);
  listen->out = std::move(frame).value();
  listen->writing = true;
  WriteToRank(*listen->rank, &listen->out, kReplyTimeoutNs, listen,
              [this, listen](const Status& s) {
                listen->writing = false;
                if (!s.ok()) return EndListen(listen);
                // The rank sends nothing on a listen: readable means it closed (or broke the
                // protocol).
                listen->rank->socket().async_wait(
                    Socket::wait_read, [this, listen](const asio::error_code&) { EndListen(listen); });
                PumpListen(listen);
              });
}

void TunnelService::PumpListen(const std::shared_ptr<Listen>& listen) {
  if (listen->ended || listen->writing) return;
  if (Stopping()) {
    auto frame = EncodeMessage(ReplyTo(
        MessageType::kTunnelListen,
        UnavailableError("the gateway of " + options_.region + " is shutting down; the listen ended")));
    if (!frame.ok()) return EndListen(listen);
    listen->out = std::move(frame).value();
    listen->writing = true;
    WriteToRank(*listen->rank, &listen->out, kCloseTimeoutNs, listen,
                [this, listen](const Status&) {
                  listen->writing = false;
                  EndListen(listen);
                });
    return;
  }
  std::deque<TunnelEvent> events;
  {
    std::lock_guard<std::mutex> lock(listen->mu);
    events.swap(listen->events);
  }
  if (events.empty()) return;
  listen->out.clear();
  for (const TunnelEvent& e : events) {
    Message m = ReplyTo(MessageType::kTunnelListen, Status::Ok());
    m.data = EncodeTunnelEvent(e);
    auto frame = EncodeMessage(m);
    if (!frame.ok()) return EndListen(listen);
    listen->out.insert(listen->out.end(), frame->begin(), frame->end());
  }
  listen->writing = true;
  WriteToRank(*listen->rank, &listen->out, kReplyTimeoutNs, listen,
              [this, listen](const Status& s) {
                listen->writing = false;
                if (!s.ok()) return EndListen(listen);
                PumpListen(listen);
              });
}

void TunnelService::EndListen(const std::shared_ptr<Listen>& listen) {
  if (listen->ended) return;
  listen->ended = true;
  --live_;
  listen->rank->Close();
  // Connects announced on this listen and not accepted have nobody left to accept them.
  std::vector<std::shared_ptr<State>> orphans;
  {
    std::lock_guard<std::mutex> lock(mu_);
    listens_.erase(listen->id);
    for (auto it = tunnels_.begin(); it != tunnels_.end();) {
      if (it->second->phase == State::Phase::kAwaitingAccept &&
          it->second->listen_id == listen->id) {
        orphans.push_back(it->second);
        it = tunnels_.erase(it);
      } else {
        ++it;
      }
    }
  }
  for (const auto& t : orphans) {
    ++refused_;
    TunnelWire r;
    r.kind = TunnelWireKind::kOpenRefused;
    r.tunnel_id = t->id;
    r.code = StatusCode::kUnavailable;
    r.text =
        "the listening rank in region " + options_.region + " closed its listen before accepting";
    SendWire(t->link, r, options_.send_timeout_ns);
  }
}

// ---- Opening: connect and accept -------------------------------------------------------------

void TunnelService::ServeConnect(std::unique_ptr<RankConn> rank, const Message& req) {
  const int64_t timeout_ns =
      req.timeout_ms > 0 ? int64_t{req.timeout_ms} * 1'000'000 : options_.default_open_timeout_ns;
  auto refuse = [&](const Status& s) {
    ++refused_;
    STRAIT_LOG(kInfo, kLog) << "tunnel connect refused: " << s;
    RefuseAndClose(std::move(rank), ReplyTo(MessageType::kTunnelConnect, s));
  };
  const std::string& region = req.tunnel_region;
  if (region == options_.region) {
    return refuse(
        InvalidArgumentError("region " + region +
                             " is this gateway's own region; tunnels cross regions (connect "
                             "to ranks of the same region directly)"));
  }
  auto it = std::find(options_.world.begin(), options_.world.end(), region);
  if (it == options_.world.end()) {
    std::string known;
    for (const auto& r : options_.world) AppendToList(known, r);
    return refuse(NotFoundError("region " + region + " is not among this gateway's regions (" +
                                known +
                                "); check the listener's handle and peers.* in the "
                                "gateway config"));
  }
  if (req.tunnel_shard != static_cast<uint32_t>(options_.shard)) {
    return refuse(FailedPreconditionError(
        "the listener is behind shard " + std::to_string(req.tunnel_shard) + " of region " +
        region + ", but this gateway holds shard " + std::to_string(options_.shard) +
        " and links only to shard " + std::to_string(options_.shard) +
        " of other regions; connect through a gateway of shard " +
        std::to_string(req.tunnel_shard)));
  }
  auto t = std::make_shared<State>();
  t->peer = static_cast<int>(it - options_.world.begin());
  t->peer_name = RegionName(t->peer);
  t->phase = State::Phase::kOpening;
  t->rank = std::move(rank);
  t->connecting = true;
  t->open_deadline = Deadline::After(timeout_ns);
  t->open_timeout_ns = timeout_ns;
  t->requested_listen = req.listen_id;
  ++live_;
  WaitForLinkAndOpen(t);
}

void TunnelService::WaitForLinkAndOpen(const std::shared_ptr<State>& t) {
  std::shared_ptr<net::Link> link = links_(t->peer);
  if (link == nullptr) {
    if (!t->open_deadline.Expired() && !Stopping()) {
      // The link may be coming up (the peer gateway starts): look again shortly.
      auto timer = std::make_shared<asio::steady_timer>(*loop_, kLinkRetry);
      timer->async_wait([this, t, timer](const asio::error_code&) { WaitForLinkAndOpen(t); });
      return;
    }
    const std::string& region = options_.world[static_cast<size_t>(t->peer)];
    return EndConnect(t, false,
                      UnavailableError("no link to the gateway of region " + region + " shard " +
                                       std::to_string(options_.shard) +
                                       " yet; check that it runs and that peers." + region +
                                       " in the config is right"));
  }
  t->link = link;
  {
    std::lock_guard<std::mutex> lock(mu_);
    t->id = NewIdLocked();
    tunnels_[t->id] = t;
  }
  t->channel = TunnelChannel(t->id);
  TunnelWire open;
  open.kind = TunnelWireKind::kOpen;
  open.tunnel_id = t->id;
  open.shard = static_cast<uint32_t>(options_.shard);
  open.listen_id = t->requested_listen;
  open.window = options_.window_bytes;
  SendWire(link, open, t->open_timeout_ns, [this, t](Status s) {
    if (!s.ok()) PeerClosed(t, s.WithContext("sending the open"));
  });
  // The answer kicks Pump (OnWanMessage); so do the deadline and the supervisor. Resolve cancels
  // the timer (a pending timer would keep the loop from ending at shutdown).
  t->open_timer = std::make_unique<asio::steady_timer>(
      *loop_, std::chrono::nanoseconds(std::max<int64_t>(t->open_deadline.RemainingNanos(), 0)));
  t->open_timer->async_wait([this, t](const asio::error_code& ec) {
    if (!ec) Pump(t);
  });
}

// Answers a connect that ended before its pipe ran: `result` to the rank; a peer that was asked
// and did not answer learns at once that nobody waits.
void TunnelService::EndConnect(const std::shared_ptr<State>& t, bool answered, Status result) {
  t->connecting = false;
  if (t->open_timer) t->open_timer->cancel();
  t->finished = true;
  --live_;
  if (t->id != 0) {
    Forget(t->id);
    if (!answered) {
      TunnelWire close;
      close.kind = TunnelWireKind::kClose;
      close.tunnel_id = t->id;
      close.code = StatusCode::kCancelled;
      close.text = "the connecting rank in region " + options_.region +
                   " gave up: " + std::string(result.message());
      SendWire(t->link, close, options_.send_timeout_ns);
    }
  }
  ++refused_;
  STRAIT_LOG(kInfo, kLog) << "tunnel connect refused: " << result;
  RefuseAndClose(std::move(t->rank), ReplyTo(MessageType::kTunnelConnect, result));
}

// A connect waiting for its answer (on each kick): resolves it when answered, expired or
// stopping.
void TunnelService::Resolve(const std::shared_ptr<State>& t) {
  Status result;
  bool answered = false;
  {
    std::lock_guard<std::mutex> lock(t->mu);
    answered = t->open_done;
    if (t->open_done) {
      result = t->open_status;
    } else if (Stopping()) {
      result = UnavailableError("the gateway is shutting down");
    } else if (t->open_deadline.Expired()) {
      const std::string& region = options_.world[static_cast<size_t>(t->peer)];
      result = DeadlineExceededError(
          "no answer from the gateway of region " + region + " shard " +
          std::to_string(options_.shard) + " within " + FormatDuration(t->open_timeout_ns) +
          " to the open of listen id " + std::to_string(t->requested_listen) +
          ": that gateway is down or unreachable, or the listening rank did not accept");
    } else {
      return;  // still waiting
    }
  }
  if (!result.ok()) return EndConnect(t, answered, result);
  t->connecting = false;
  if (t->open_timer) t->open_timer->cancel();
  Message reply = ReplyTo(MessageType::kTunnelConnect, Status::Ok());
  AppendLe(&reply.data, t->id, 8);
  reply.text = options_.world[static_cast<size_t>(t->peer)];
  ++opened_;
  ReplyThenPipe(t, reply);
}

void TunnelService::ServeAccept(std::unique_ptr<RankConn> rank, const Message& req, uint32_t uid) {
  std::shared_ptr<State> t;
  Status refusal;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = tunnels_.find(req.tunnel_id);
    if (it == tunnels_.end() || it->second->phase != State::Phase::kAwaitingAccept) {
      refusal = NotFoundError("no incoming tunnel " + std::to_string(req.tunnel_id) +
                              " to accept at this gateway (unknown, already accepted, or not "
                              "accepted within " +
                              FormatDuration(options_.accept_timeout_ns) + ")");
    } else if (it->second->listen_uid != uid) {
      refusal = PermissionDeniedError(
          "incoming tunnel " + std::to_string(req.tunnel_id) + " belongs to the listen of uid " +
          std::to_string(it->second->listen_uid) + ", not to this client's uid " +
          std::to_string(uid) + "; accept it from the process that listened");
    } else {
      t = it->second;
      std::lock_guard<std::mutex> tl(t->mu);
      if (t->peer_closed) {
        refusal = UnavailableError("incoming tunnel " + std::to_string(req.tunnel_id) +
                                   " is gone: " + t->close_text);
        tunnels_.erase(it);
      } else {
        t->phase = State::Phase::kOpen;
      }
    }
  }
  if (!refusal.ok()) {
    ++refused_;
    return RefuseAndClose(std::move(rank), ReplyTo(MessageType::kTunnelAccept, refusal));
  }
  t->rank = std::move(rank);
  ++live_;
  TunnelWire ok;
  ok.kind = TunnelWireKind::kOpenOk;
  ok.tunnel_id = t->id;
  ok.window = options_.window_bytes;
  SendWire(t->link, ok, options_.send_timeout_ns, [this, t](Status s) {
    if (!s.ok()) PeerClosed(t, s.WithContext("answering the open"));
  });
  Message reply = ReplyTo(MessageType::kTunnelAccept, Status::Ok());
  reply.text = options_.world[static_cast<size_t>(t->peer)];
  ++opened_;
  ReplyThenPipe(t, reply);
}

// Writes the rank's connect/accept reply; once it is out, the tunnel's data flows.
void TunnelService::ReplyThenPipe(const std::shared_ptr<State>& t, const Message& reply) {
  auto frame = EncodeMessage(reply);
  if (!frame.ok()) return PipeFailed(t);
  t->out = std::move(frame).value();
  t->writing = true;
  WriteToRank(*t->rank, &t->out, kReplyTimeoutNs, t, [this, t](const Status& s) {
    t->writing = false;
    if (!s.ok()) return PipeFailed(t);
    STRAIT_LOG(kInfo, kLog) << "tunnel " << t->id << " with " << t->peer_name << " open";
    t->codec = std::make_unique<TunnelCodec>(options_.zstd_allowed);
    t->piping = true;
    Pump(t);
  });
}

// The rank did not get its reply: it cannot use the tunnel. Tell the peer and stop here.
void TunnelService::PipeFailed(const std::shared_ptr<State>& t) {
  {
    std::lock_guard<std::mutex> lock(t->mu);
    t->rank_closed = true;
    t->rank_code = StatusCode::kUnavailable;
  }
  TunnelWire close;
  close.kind = TunnelWireKind::kClose;
  close.tunnel_id = t->id;
  close.code = StatusCode::kUnavailable;
  close.text = "the rank in region " + options_.region + " went away while the tunnel opened";
  SendWire(t->link, close, options_.send_timeout_ns);
  Forget(t->id);
  t->finished = true;
  --live_;
  t->rank->Close();
}

// ---- The pipe: rank -> WAN and WAN -> rank ---------------------------------------------------

void TunnelService::Pump(const std::shared_ptr<State>& t) {
  if (t->finished) return;
  if (t->connecting) return Resolve(t);
  if (!t->piping) return;
  // The gateway stops: a write stuck on a rank that stopped reading ends (what was queued for
  // it is dropped; PumpToRank tells it why).
  if (Stopping() && t->writing && !t->closing_write) t->rank->Cancel();
  PumpFromRank(t);
  PumpToRank(t);
  bool rank_side_over = false;
  {
    std::lock_guard<std::mutex> lock(t->mu);
    rank_side_over = t->rank_closed || t->peer_closed;
  }
  if (t->writer_done && !t->writing && rank_side_over) FinishPipe(t);
}

// Ends the rank's side of the tunnel: the peer learns why (unless it closed first), and so does
// the rank when `tell_rank`.
void TunnelService::EndRankSide(const std::shared_ptr<State>& t, StatusCode code,
                                const std::string& text, bool tell_rank) {
  bool tell_peer = false;
  {
    std::lock_guard<std::mutex> lock(t->mu);
    if (t->rank_closed) return;
    t->rank_closed = true;
    t->rank_code = code;
    t->rank_text = text;
    t->notify_rank = tell_rank;
    tell_peer = !t->peer_closed;
  }
  // A write stuck on a rank that stopped reading ends now; Pump decides what to say.
  if (t->writing && !t->closing_write) t->rank->Cancel();
  if (tell_peer) {
    TunnelWire close;
    close.kind = TunnelWireKind::kClose;
    close.tunnel_id = t->id;
    close.code = code;
    close.text = text;
    SendWire(t->link, close, options_.send_timeout_ns);
  }
}

void TunnelService::PumpFromRank(const std::shared_ptr<State>& t) {
  {
    std::lock_guard<std::mutex> lock(t->mu);
    if (t->peer_closed || t->rank_closed) return;  // nothing more to read
  }
  if (t->writer_done) {
    // The connection to the rank failed while writing to it.
    return EndRankSide(t, StatusCode::kUnavailable,
                       "the connection to the rank in region " + options_.region + " failed",
                       false);
  }
  if (Stopping()) {
    return EndRankSide(t, StatusCode::kUnavailable,
                       "the gateway of region " + options_.region + " is shutting down", true);
  }
  if (t->reading) return;
  {
    std::lock_guard<std::mutex> lock(t->mu);
    if (t->unacked >= t->remote_window) return;  // a credit kicks again
  }
  t->reading = true;
  asio::async_read(t->rank->socket(), asio::buffer(t->length),
                   [this, t](const asio::error_code& ec, size_t n) { OnRankLength(t, ec, n); });
}

void TunnelService::OnRankLength(const std::shared_ptr<State>& t, const asio::error_code& ec,
                                 size_t n) {
  if (t->finished) return;
  t->reading = false;
  if (ec) {
    if (ec == asio::error::operation_aborted) return Pump(t);  // ended elsewhere
    if (ec == asio::error::eof && n == 0) {
      EndRankSide(t, StatusCode::kOk, "the rank in region " + options_.region +
                                          " closed the tunnel", false);
    } else {
      RankBroke(t, ec == asio::error::eof
                       ? DataLossError("local socket: connection closed inside a frame's length")
                       : UnavailableError("local socket: read failed: " + ec.message()));
    }
    return Pump(t);
  }
  const uint32_t len = GetU32(t->length.data());
  if (len == 0) {
    RankBroke(t, InvalidArgumentError("local frame with an empty body"));
    return Pump(t);
  }
  if (len > options_.max_message_bytes) {
    RankBroke(t, ResourceExhaustedError("local frame of " + std::to_string(len) +
                                        " bytes exceeds the limit of " +
                                        std::to_string(options_.max_message_bytes) + " bytes"));
    return Pump(t);
  }
  t->body.resize(len);
  t->reading = true;
  t->rank->Arm(kFrameTimeoutNs, t);
  asio::async_read(t->rank->socket(), asio::buffer(t->body),
                   [this, t](const asio::error_code& ec2, size_t got) {
                     if (t->finished) return;
                     t->rank->Disarm();
                     t->reading = false;
                     if (ec2) {
                       if (t->rank->timed_out()) {
                         RankBroke(t, DeadlineExceededError("local socket: timed out reading"));
                       } else if (ec2 == asio::error::eof) {
                         RankBroke(t, DataLossError("local socket: connection closed after " +
                                                    std::to_string(got) + " of " +
                                                    std::to_string(t->body.size()) +
                                                    " bytes of a frame"));
                       }
                       // Otherwise aborted: ended elsewhere.
                       return Pump(t);
                     }
                     OnRankFrame(t);
                     Pump(t);
                   });
}

// The rank broke its framing: both sides learn why.
void TunnelService::RankBroke(const std::shared_ptr<State>& t, const Status& why) {
  {
    std::lock_guard<std::mutex> lock(t->mu);
    if (t->rank_closed) return;
  }
  if (why.code() == StatusCode::kUnavailable) {
    return EndRankSide(t, StatusCode::kOk,
                       "the rank in region " + options_.region + " closed the tunnel", false);
  }
  EndRankSide(t, why.code(),
              "the rank in region " + options_.region +
                  " broke its tunnel connection: " + std::string(why.message()),
              true);
}

void TunnelService::OnRankFrame(const std::shared_ptr<State>& t) {
  auto m = DecodeMessage(t->body, options_.max_message_bytes);
  if (!m.ok() || (m->type != MessageType::kTunnelData && m->type != MessageType::kTunnelClose)) {
    return EndRankSide(t, StatusCode::kInvalidArgument,
                       "bad frame on the tunnel from region " + options_.region + ": " +
                           (m.ok() ? std::string("a ") + MessageTypeName(m->type) +
                                         " message (only tunnel-data and tunnel-close are allowed)"
                                   : std::string(m.status().message())),
                       true);
  }
  if (m->type == MessageType::kTunnelClose) {
    return EndRankSide(t, m->code,
                       m->text.empty()
                           ? "the rank in region " + options_.region + " closed the tunnel"
                           : m->text,
                       false);
  }
  TunnelWire w;
  w.tunnel_id = t->id;
  w.tag = m->tag;
  t->codec->Encode(m->data, t->link->Estimates(), &w);
  const uint64_t raw = m->data.size();
  {
    std::lock_guard<std::mutex> lock(t->mu);
    t->unacked += Cost(raw);
  }
  ++messages_sent_;
  raw_bytes_sent_ += raw;
  if (w.codec == CodecId::kZstd) ++zstd_messages_;
  SendWire(t->link, w, options_.send_timeout_ns, [this, t, name = t->peer_name](Status s) {
    if (!s.ok()) {
      PeerClosed(t, UnavailableError("the link to " + name + " failed: " +
                                     std::string(s.message())));
    }
  });
}

void TunnelService::PumpToRank(const std::shared_ptr<State>& t) {
  if (t->writing || t->writer_done) return;
  TunnelWire w;
  bool have = false;
  bool more = false;
  bool closing = false;
  StatusCode code = StatusCode::kOk;
  std::string text;
  {
    std::lock_guard<std::mutex> lock(t->mu);
    if (t->rank_closed) {
      closing = t->notify_rank;
      code = t->rank_code;
      text = t->rank_text;
    } else if (Stopping()) {
      closing = true;
      code = t->peer_closed ? t->close_code : StatusCode::kUnavailable;
      text = t->peer_closed ? t->close_text
                            : "the gateway of region " + options_.region + " is shutting down";
    } else if (!t->inbound.empty()) {
      w = std::move(t->inbound.front());
      t->inbound.pop_front();
      t->inbound_cost -= std::min(t->inbound_cost, Cost(w.raw_size));
      have = true;
      more = !t->inbound.empty();
    } else if (t->peer_closed) {
      closing = true;
      code = t->close_code;
      text = t->close_text;
    } else {
      return;  // OnWanMessage kicks when something comes
    }
  }
  if (!have) return CloseToRank(t, closing, code, text);
  std::vector<uint8_t> raw;
  Status s = TunnelCodec::Decode(t->decoder, w, &raw);
  if (!s.ok()) {
    // The peer's bytes are corrupt: end the tunnel on both sides rather than deliver them.
    const Status why = s.WithContext("undecodable tunnel data from " + t->peer_name);
    STRAIT_LOG(kWarn, kLog) << why;
    TunnelWire close;
    close.kind = TunnelWireKind::kClose;
    close.tunnel_id = t->id;
    close.code = why.code();
    close.text = std::string(why.message());
    SendWire(t->link, close, options_.send_timeout_ns);
    PeerClosed(t, why);  // kicks Pump again
    std::lock_guard<std::mutex> lock(t->mu);
    t->inbound.clear();
    t->inbound_cost = 0;
    return;
  }
  Message m;
  m.type = MessageType::kTunnelData;
  m.tag = w.tag;
  const uint64_t size = raw.size();
  m.data = std::move(raw);
  auto frame = EncodeMessage(m, options_.max_message_bytes);
  if (!frame.ok()) {
    t->writer_done = true;
    return;
  }
  t->out = std::move(frame).value();
  t->writing = true;
  // No deadline: a rank that stops reading makes its peer's sender wait (flow control), until
  // the tunnel ends (EndRankSide cancels the write).
  WriteToRank(*t->rank, &t->out, 0, t, [this, t, size, more](const Status& st) {
    t->writing = false;
    if (t->finished) return;
    if (!st.ok()) {
      bool ended = false;
      {
        std::lock_guard<std::mutex> lock(t->mu);
        ended = t->rank_closed;
      }
      // Given up for the tunnel's end: the head decides what to say; else the rank's
      // connection failed, which its reader sees too.
      if (!ended && !Stopping()) t->writer_done = true;
      return Pump(t);
    }
    ++messages_received_;
    raw_bytes_received_ += size;
    t->credit += Cost(size);
    const uint64_t credit_batch = std::max<uint64_t>(options_.window_bytes / 4, 1);
    if (t->credit >= credit_batch || !more) {
      TunnelWire c;
      c.kind = TunnelWireKind::kCredit;
      c.tunnel_id = t->id;
      c.credit = t->credit;
      SendWire(t->link, c, options_.send_timeout_ns);
      t->credit = 0;
    }
    Pump(t);
  });
}

// The last the rank hears: kTunnelClose with the reason when `closing`, then end of file.
void TunnelService::CloseToRank(const std::shared_ptr<State>& t, bool closing, StatusCode code,
                                const std::string& text) {
  if (!closing) {
    t->writer_done = true;
    return Pump(t);
  }
  Message m;
  m.type = MessageType::kTunnelClose;
  m.code = code;
  m.text = text.substr(0, kMaxReplyTextBytes);
  auto frame = EncodeMessage(m);
  if (!frame.ok()) {
    t->writer_done = true;
    return Pump(t);
  }
  t->out = std::move(frame).value();
  t->writing = true;
  t->closing_write = true;
  WriteToRank(*t->rank, &t->out, kCloseTimeoutNs, t, [this, t](const Status&) {
    t->writing = false;
    // The rank reads the close, then end of file.
    t->rank->ShutdownWrite();
    t->writer_done = true;
    Pump(t);
  });
}

void TunnelService::FinishPipe(const std::shared_ptr<State>& t) {
  t->finished = true;
  --live_;
  t->rank->Close();  // ends a read still waiting for the rank
  Forget(t->id);
  bool error = false;
  {
    std::lock_guard<std::mutex> lock(t->mu);
    error = (t->peer_closed && t->close_code != StatusCode::kOk) ||
            (t->rank_closed && t->rank_code != StatusCode::kOk);
  }
  if (error) ++closed_with_error_;
  STRAIT_LOG(kInfo, kLog) << "tunnel " << t->id << " with " << t->peer_name << " closed";
}

// ---- The WAN side (I/O thread) ---------------------------------------------------------------

void TunnelService::OnWanMessage(int peer, uint32_t channel, std::vector<uint8_t> message) {
  if (peer < 0 || static_cast<size_t>(peer) >= options_.world.size()) {
    // Tunnels run only between regions; a link to another gateway of this region carries none.
    STRAIT_LOG(kWarn, kLog) << "dropped a tunnel message from link #" << peer
                            << ", which is not a peer region's";
    return;
  }
  auto decoded = DecodeTunnelWire(message, options_.max_message_bytes);
  if (!decoded.ok()) {
    STRAIT_LOG(kWarn, kLog) << "dropped a bad tunnel message from " << RegionName(peer) << ": "
                            << decoded.status();
    // The tunnel it belongs to may have lost data: end it if the id is readable.
    if (message.size() >= kTunnelWireHeaderSize) {
      const uint64_t id = GetU64(message.data() + 8);
      std::shared_ptr<State> t;
      {
        std::lock_guard<std::mutex> lock(mu_);
        auto it = tunnels_.find(id);
        if (it != tunnels_.end() && it->second->peer == peer) t = it->second;
      }
      if (t)
        PeerClosed(t, decoded.status().WithContext("bad tunnel message from " + RegionName(peer)));
    }
    return;
  }
  TunnelWire& w = *decoded;
  if (TunnelChannel(w.tunnel_id) != channel) {
    STRAIT_LOG(kWarn, kLog) << "dropped a tunnel message from " << RegionName(peer)
                            << " on channel " << channel << ", which is not its tunnel's";
    return;
  }
  if (w.kind == TunnelWireKind::kOpen) {
    std::shared_ptr<net::Link> link = links_(peer);
    auto refuse = [&](const Status& s) {
      ++refused_;
      STRAIT_LOG(kInfo, kLog) << "refused a tunnel from " << RegionName(peer) << ": " << s;
      TunnelWire r;
      r.kind = TunnelWireKind::kOpenRefused;
      r.tunnel_id = w.tunnel_id;
      r.code = s.code();
      r.text = std::string(s.message());
      SendWire(link, r, options_.send_timeout_ns);
    };
    if (w.shard != static_cast<uint32_t>(options_.shard)) {
      return refuse(FailedPreconditionError("the gateway of region " + options_.region +
                                            " reached is shard " + std::to_string(options_.shard) +
                                            ", not shard " + std::to_string(w.shard)));
    }
    std::shared_ptr<Listen> listen;
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto lit = listens_.find(w.listen_id);
      if (lit == listens_.end()) {
        return refuse(NotFoundError("region " + options_.region + " shard " +
                                    std::to_string(options_.shard) + " has no listen id " +
                                    std::to_string(w.listen_id) +
                                    " (the listening rank closed it, or it never existed)"));
      }
      if (tunnels_.count(w.tunnel_id) != 0 || listens_.count(w.tunnel_id) != 0) {
        return refuse(AlreadyExistsError("tunnel id " + std::to_string(w.tunnel_id) +
                                         " is already in use here; connect again"));
      }
      listen = lit->second;
      auto t = std::make_shared<State>();
      t->id = w.tunnel_id;
      t->listen_id = w.listen_id;
      t->listen_uid = listen->uid;
      t->peer = peer;
      t->peer_name = RegionName(peer);
      t->channel = channel;
      t->link = link;
      t->phase = State::Phase::kAwaitingAccept;
      t->accept_deadline_ns = MonotonicNanos() + options_.accept_timeout_ns;
      t->remote_window = w.window;
      tunnels_[t->id] = t;
      std::lock_guard<std::mutex> ll(listen->mu);
      listen->events.push_back(TunnelEvent{TunnelEventKind::kIncoming, t->id, 0,
                                           options_.world[static_cast<size_t>(peer)]});
    }
    if (loop_ != nullptr) asio::post(*loop_, [this, listen] { PumpListen(listen); });
    return;
  }
  std::shared_ptr<State> t;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = tunnels_.find(w.tunnel_id);
    if (it != tunnels_.end() && it->second->peer == peer) t = it->second;
  }
  if (t == nullptr) return;  // a tunnel that ended here already: nothing waits for it
  switch (w.kind) {
    case TunnelWireKind::kOpenOk:
    case TunnelWireKind::kOpenRefused: {
      {
        std::lock_guard<std::mutex> lock(t->mu);
        if (t->phase != State::Phase::kOpening || t->open_done) return;
        t->open_done = true;
        if (w.kind == TunnelWireKind::kOpenOk) {
          t->phase = State::Phase::kOpen;
          t->remote_window = w.window;
          t->open_status = Status::Ok();
        } else {
          t->open_status = Status(w.code == StatusCode::kOk ? StatusCode::kUnknown : w.code,
                                  t->peer_name + " refused the tunnel: " + w.text);
        }
      }
      return Kick(t);
    }
    case TunnelWireKind::kData: {
      {
        std::unique_lock<std::mutex> lock(t->mu);
        if (t->phase != State::Phase::kOpen || t->peer_closed || t->rank_closed) return;
        const uint64_t cost = Cost(w.raw_size);
        // An honest peer stops at our window plus the one message it read last.
        if (t->inbound_cost + cost >
            options_.window_bytes + Cost(options_.max_message_bytes) + cost) {
          lock.unlock();
          PeerClosed(t, DataLossError(t->peer_name + " overran the tunnel's window of " +
                                      std::to_string(options_.window_bytes) + " bytes"));
          return;
        }
        t->inbound_cost += cost;
        t->inbound.push_back(std::move(w));
      }
      return Kick(t);
    }
    case TunnelWireKind::kCredit: {
      {
        std::lock_guard<std::mutex> lock(t->mu);
        t->unacked -= std::min(t->unacked, w.credit);
      }
      return Kick(t);
    }
    case TunnelWireKind::kClose:
      PeerClosed(t, w.code == StatusCode::kOk
                        ? Status::Ok()
                        : Status(w.code, t->peer_name + " ended the tunnel: " + w.text));
      return;
    case TunnelWireKind::kOpen: return;  // handled above
  }
}

// ---- The supervisor (a timer on the loop) ----------------------------------------------------

void TunnelService::ArmSupervisor() {
  supervisor_->expires_after(kSuperviseEvery);
  supervisor_->async_wait([this](const asio::error_code& ec) {
    if (ec) return;
    Supervise();
    // Once the gateway stops and every connection ended, the loop may end: no more rounds.
    if (!Stopping() || live_ > 0) ArmSupervisor();
  });
}

void TunnelService::Supervise() {
  const int64_t now = MonotonicNanos();
  std::vector<std::shared_ptr<State>> expired, live;
  std::vector<std::shared_ptr<Listen>> listens;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto it = tunnels_.begin(); it != tunnels_.end();) {
      const auto& t = it->second;
      if (t->phase == State::Phase::kAwaitingAccept && now > t->accept_deadline_ns) {
        expired.push_back(t);
        it = tunnels_.erase(it);
      } else {
        live.push_back(t);
        ++it;
      }
    }
    if (Stopping()) {
      for (const auto& [id, l] : listens_) listens.push_back(l);
    }
  }
  for (const auto& t : expired) {
    ++refused_;
    TunnelWire r;
    r.kind = TunnelWireKind::kOpenRefused;
    r.tunnel_id = t->id;
    r.code = StatusCode::kDeadlineExceeded;
    r.text = "the listening rank in region " + options_.region + " did not accept within " +
             FormatDuration(options_.accept_timeout_ns);
    SendWire(t->link, r, options_.send_timeout_ns);
  }
  // A link that ended (peer gone, closed) or was replaced (the peer restarted and linked
  // anew) will carry nothing more for these tunnels: end them with the reason.
  std::map<net::Link*, Status> health;
  for (const auto& t : live) {
    if (t->link == nullptr) continue;
    Status why;
    if (links_(t->peer) != t->link) {
      why = UnavailableError("the link to " + t->peer_name +
                             " was replaced (its gateway restarted); the tunnel is lost");
    } else {
      auto h = health.find(t->link.get());
      if (h == health.end()) {
        Status s = t->link->WaitForStreams(1, Deadline::After(0));
        if (s.code() != StatusCode::kUnavailable) s = Status::Ok();
        h = health.emplace(t->link.get(), s).first;
      }
      if (!h->second.ok()) {
        why = UnavailableError("the gateway of " + t->peer_name +
                               " is gone: " + std::string(h->second.message()));
      }
    }
    if (!why.ok()) PeerClosed(t, why);
    // The gateway stops: every tunnel ends with a reason (Pump sees Stopping()).
    if (Stopping()) Pump(t);
  }
  for (const auto& l : listens) PumpListen(l);
}

std::string TunnelService::StatsText() const {
  size_t open = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    open = tunnels_.size();
  }
  std::ostringstream os;
  os << "tunnels_open " << open << "\ntunnel_listens " << listens_total_ << "\ntunnels_opened "
     << opened_ << "\ntunnels_refused " << refused_ << "\ntunnels_closed_with_error "
     << closed_with_error_ << "\ntunnel_messages_sent " << messages_sent_
     << "\ntunnel_messages_received " << messages_received_ << "\ntunnel_raw_bytes_sent "
     << raw_bytes_sent_ << "\ntunnel_wire_bytes_sent " << wire_bytes_sent_
     << "\ntunnel_raw_bytes_received " << raw_bytes_received_ << "\ntunnel_zstd_messages "
     << zstd_messages_ << "\n";
  return os.str();
}

}  // namespace strait::gateway

// TunnelService (see tunnel.h): listens and tunnels as state machines on the local server's
// event loop. Each local connection handed over is wrapped in an Asio socket on that loop; a
// tunnel's two directions are a read of the rank's next frame (while the peer's window allows)
// and a write of the peer's next message (while any is queued), each started again by Pump()
// when it ends or when the WAN side (OnWanMessage, on the endpoint's I/O thread) queues a message,
// a credit or a close and posts a kick. The supervisor is a timer on the same loop.
//
// This file: the service's life, handing connections over (Serve), forgetting tunnels, the
// supervisor and the stats; tunnel_open.cc and tunnel_pipe.cc hold the rest.
#include "gateway/tunnel_service_internal.h"

namespace strait::gateway {

using namespace tunnel_internal;  // NOLINT(build/namespaces): this service's own constants

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
                                std::function<void(const Status&)> done,
                                const std::vector<uint8_t>* data) {
  if (timeout_ns > 0) rank.Arm(timeout_ns, owner);
  const std::array<asio::const_buffer, 2> buffers = {
      asio::buffer(*out), data != nullptr ? asio::buffer(*data) : asio::const_buffer()};
  asio::async_write(
      rank.socket(), buffers,
      [&rank, timeout_ns, owner, done = std::move(done)](const asio::error_code& ec, size_t) {
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

TunnelService::Counters TunnelService::GetCounters() const {
  Counters c;
  {
    std::lock_guard<std::mutex> lock(mu_);
    c.open = tunnels_.size();
  }
  c.listens = listens_total_;
  c.opened = opened_;
  c.refused = refused_;
  c.closed_with_error = closed_with_error_;
  c.messages_sent = messages_sent_;
  c.messages_received = messages_received_;
  c.raw_bytes_sent = raw_bytes_sent_;
  c.wire_bytes_sent = wire_bytes_sent_;
  c.raw_bytes_received = raw_bytes_received_;
  c.zstd_messages = zstd_messages_;
  return c;
}

std::string TunnelService::StatsText() const {
  const Counters c = GetCounters();
  std::ostringstream os;
  os << "tunnels_open " << c.open << "\ntunnel_listens " << c.listens << "\ntunnels_opened "
     << c.opened << "\ntunnels_refused " << c.refused << "\ntunnels_closed_with_error "
     << c.closed_with_error << "\ntunnel_messages_sent " << c.messages_sent
     << "\ntunnel_messages_received " << c.messages_received << "\ntunnel_raw_bytes_sent "
     << c.raw_bytes_sent << "\ntunnel_wire_bytes_sent " << c.wire_bytes_sent
     << "\ntunnel_raw_bytes_received " << c.raw_bytes_received << "\ntunnel_zstd_messages "
     << c.zstd_messages << "\n";
  return os.str();
}


}  // namespace strait::gateway

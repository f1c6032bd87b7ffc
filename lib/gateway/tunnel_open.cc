// TunnelService (tunnel.h), opening tunnels on the loop: a rank's listen and the events it
// is sent; a connect that waits for its link and the peer's answer; an accept that pairs with
// a connect the peer announced; the reply that turns the connection into a pipe.
#include "gateway/tunnel_service_internal.h"

namespace strait::gateway {

using namespace tunnel_internal;  // NOLINT(build/namespaces): this service's own constants

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


}  // namespace strait::gateway

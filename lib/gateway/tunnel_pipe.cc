// TunnelService (tunnel.h), an open tunnel's two directions on the loop (rank -> WAN with the
// peer's credit, WAN -> rank from the queue) and the WAN side: messages from the peer, on the
// endpoint's I/O thread, queued under the tunnel's lock and kicked onto the loop.
#include "gateway/tunnel_service_internal.h"

namespace strait::gateway {

using namespace tunnel_internal;  // NOLINT(build/namespaces): this service's own constants

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
  t->body.resize(State::kBodyOffset + len);
  t->reading = true;
  t->rank->Arm(kFrameTimeoutNs, t);
  asio::async_read(t->rank->socket(), asio::buffer(t->body.data() + State::kBodyOffset, len),
                   [this, t, len](const asio::error_code& ec2, size_t got) {
                     if (t->finished) return;
                     t->rank->Disarm();
                     t->reading = false;
                     if (ec2) {
                       if (t->rank->timed_out()) {
                         RankBroke(t, DeadlineExceededError("local socket: timed out reading"));
                       } else if (ec2 == asio::error::eof) {
                         RankBroke(t, DataLossError("local socket: connection closed after " +
                                                    std::to_string(got) + " of " +
                                                    std::to_string(len) +
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
  const std::span<const uint8_t> body =
      std::span<const uint8_t>(t->body).subspan(State::kBodyOffset);
  if (body.size() >= 5 && body[0] == static_cast<uint8_t>(MessageType::kTunnelData)) {
    return SendRankData(t, GetU32(body.data() + 1));
  }
  auto m = DecodeMessage(body, options_.max_message_bytes);
  if (!m.ok() || m->type != MessageType::kTunnelClose) {
    return EndRankSide(t, StatusCode::kInvalidArgument,
                       "bad frame on the tunnel from region " + options_.region + ": " +
                           (m.ok() ? std::string("a ") + MessageTypeName(m->type) +
                                         " message (only tunnel-data and tunnel-close are allowed)"
                                   : std::string(m.status().message())),
                       true);
  }
  return EndRankSide(
      t, m->code,
      m->text.empty() ? "the rank in region " + options_.region + " closed the tunnel" : m->text,
      false);
}

void TunnelService::SendRankData(const std::shared_ptr<State>& t, uint32_t tag) {
  // The data lies in t->body from kTunnelDataPrefixSize on, where a wire kData message carries
  // it: a raw message is the body itself, its prefix written over the frame's type and tag.
  const std::span<const uint8_t> data =
      std::span<const uint8_t>(t->body).subspan(kTunnelDataPrefixSize);
  TunnelWire w;
  w.tunnel_id = t->id;
  w.tag = tag;
  const bool compressed = t->codec->Compress(data, t->link->Estimates(), &w);
  const uint64_t raw = data.size();
  {
    std::lock_guard<std::mutex> lock(t->mu);
    t->unacked += Cost(raw);
  }
  ++messages_sent_;
  raw_bytes_sent_ += raw;
  auto done = [this, t, name = t->peer_name](Status s) {
    if (!s.ok()) {
      PeerClosed(t,
                 UnavailableError("the link to " + name + " failed: " + std::string(s.message())));
    }
  };
  if (compressed) {
    ++zstd_messages_;
    return SendWire(t->link, w, options_.send_timeout_ns, std::move(done));
  }
  EncodeTunnelDataPrefix(w, t->body.data());
  std::vector<uint8_t> message = std::move(t->body);
  t->body.clear();
  wire_bytes_sent_ += message.size();
  t->link->Send(TunnelChannel(t->id), std::move(message), Deadline::After(options_.send_timeout_ns),
                std::move(done));
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
  const uint64_t size = raw.size();
  if (localproto::kTunnelDataOverhead + size > options_.max_message_bytes) {
    t->writer_done = true;
    return;
  }
  // The frame's head, then the data from where it was decoded: no frame is assembled.
  t->out.resize(localproto::kTunnelDataHeadBytes);
  localproto::EncodeTunnelDataHead(w.tag, size, t->out.data());
  t->out_data = std::move(raw);
  t->writing = true;
  // No deadline: a rank that stops reading makes its peer's sender wait (flow control), until
  // the tunnel ends (EndRankSide cancels the write).
  WriteToRank(
      *t->rank, &t->out, 0, t,
      [this, t, size, more](const Status& st) {
        t->writing = false;
        t->out_data.clear();
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
      },
      &t->out_data);
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


}  // namespace strait::gateway

// The sending side of a point-to-point connection: SendComm dials the receiver's nsocks TCP
// sockets (or opens one tunnel through the local gateway), says hello, and cuts each isend into
// chunks that go to whichever socket has room. Internal to the transport; everything but
// Acquire/Release/state/peer/TimedOut/failed/error runs on the loop thread.
#ifndef STRAIT_PLUGINS_NCCL_SEND_COMM_H_
#define STRAIT_PLUGINS_NCCL_SEND_COMM_H_

#include <uv.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <list>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "plugins/nccl/handle.h"
#include "plugins/nccl/transport_comm.h"

namespace strait::nccl {

struct SendMessage {
  Request* req = nullptr;
  const char* data = nullptr;
  size_t size = 0;
  int tag = 0;
  uint64_t seq = 0;
  size_t next_offset = 0;
  bool header_sent = false;  // zero-byte messages: their one empty chunk went out
  int chunks_in_flight = 0;
  bool Unassigned() const { return size == 0 ? !header_sent : next_offset < size; }
};

struct WriteReq {
  uv_write_t req{};
  unsigned char hdr[kTunnelDataHead] = {};  // chunk header, or tunnel frame head
  Socket* socket = nullptr;
  SendMessage* msg = nullptr;
};

class SendComm final : public Comm {
 public:
  enum State : int { kConnecting = 0, kReady = 1, kFailed = 2 };
  // `gateway` non-empty: a cross-region connection through a tunnel of the gateway at that path
  // (one Unix connection; the gateway stripes over its WAN streams) with `timeout_ms` for the
  // gateway to open it.
  SendComm(const ListenHandle& h, int nsocks, std::string gateway = "", uint32_t timeout_ms = 0)
      : Comm(Kind::kSend, kMaxRequests * kMaxRecvs),
        handle_(h),
        nsocks_(gateway.empty() ? nsocks : 1),
        gateway_(std::move(gateway)),
        timeout_ms_(timeout_ms) {}

  int state() const { return state_.load(std::memory_order_acquire); }
  std::string peer() const {
    if (gateway_.empty()) return Describe(handle_.addr);
    return "region " + handle_.region + " (listen " + std::to_string(handle_.listen_id) +
           " through the gateway)";
  }
  bool TimedOut(int64_t timeout_ns) const {
    return std::chrono::steady_clock::now() - started_ > std::chrono::nanoseconds(timeout_ns);
  }

  void OnGatewayFrame(Socket* s, const std::vector<unsigned char>& body) override {
    if (state() == kConnecting) {
      StatusOr<LocalReply> reply = DecodeLocalReply(body.data(), body.size());
      Status st = reply.ok() ? Status::Ok() : reply.status();
      if (st.ok() && reply->reply_to != LocalType::kTunnelConnect) {
        st = DataLossError("the gateway answered a tunnel connect with a reply to another request");
      } else if (st.ok() && reply->code != StatusCode::kOk) {
        st = Status(reply->code, "the gateway at " + gateway_ + " could not open a tunnel to " +
                                     peer() + ": " + reply->text);
      }
      if (!st.ok()) {
        Fail(st);
        return;
      }
      s->tunnel_open = true;
      state_.store(kReady, std::memory_order_release);
      Pump();
      return;
    }
    // An open tunnel: the gateway only ever sends its end.
    if (!body.empty() && body[0] == static_cast<unsigned char>(LocalType::kTunnelClose)) {
      StatusOr<LocalReply> close = DecodeTunnelClose(body.data(), body.size());
      s->tunnel_open = false;
      if (!close.ok()) {
        Fail(close.status().WithContext("tunnel to " + peer()));
      } else if (close->code == StatusCode::kOk) {
        Fail(UnavailableError("tunnel to " + peer() +
                              " closed by the receiving rank (it closed its comm or exited)"));
      } else {
        Fail(Status(close->code, "tunnel to " + peer() + " ended: " + close->text));
      }
      return;
    }
    Fail(DataLossError("tunnel to " + peer() + ": unexpected message type " +
                       std::to_string(body.empty() ? 0 : body[0]) + " from the gateway"));
  }

  void StartConnect() {
    if (!gateway_.empty()) {
      DialGateway(gateway_, EncodeTunnelConnect(handle_.region, handle_.gateway_shard,
                                                handle_.listen_id, timeout_ms_));
      return;
    }
    connection_id_ = RandomId();
    for (int i = 0; i < nsocks_; ++i) {
      auto s = std::make_unique<Socket>();
      uv_tcp_init(Loop().loop(), &s->tcp);
      Socket* raw = s.release();
      AdoptSocket(raw);
      raw->index = i;
      raw->connect_req.data = raw;
      uv_tcp_nodelay(&raw->tcp, 1);
      const int rc =
          uv_tcp_connect(&raw->connect_req, &raw->tcp,
                         reinterpret_cast<const sockaddr*>(&handle_.addr), &SendComm::OnConnectCb);
      if (rc != 0) {
        Fail(UnavailableError("cannot connect to " + peer() + ": " + UvError(rc)));
        return;
      }
    }
  }

  void Enqueue(Request* req, const void* data, size_t size, int tag) {
    if (closing_) return;
    if (failed()) {
      req->Fail(error());
      return;
    }
    SendMessage m;
    m.req = req;
    m.data = static_cast<const char*>(data);
    m.size = size;
    m.tag = tag;
    m.seq = tag_seq_[tag]++;
    messages_.push_back(m);
    Pump();
  }

  void OnAlloc(Socket* s, uv_buf_t* buf) override {
    if (s->in == Socket::In::kReply) {
      *buf = uv_buf_init(reinterpret_cast<char*>(s->buf) + s->filled,
                         static_cast<unsigned>(kReplySize - s->filled));
    } else {
      // After the reply the receiver sends nothing; reading only notices it going away.
      *buf = uv_buf_init(reinterpret_cast<char*>(s->buf), sizeof(s->buf));
    }
  }

  void OnRead(Socket* s, ssize_t n) override {
    if (n < 0) {
      Fail(UnavailableError("connection to " + peer() + " lost (" + UvError(static_cast<int>(n)) +
                            "): the receiving rank exited or the network failed"));
      return;
    }
    if (s->in != Socket::In::kReply) {
      Fail(DataLossError("unexpected bytes from receiver " + peer() + " (protocol error)"));
      return;
    }
    s->filled += static_cast<size_t>(n);
    if (s->filled < kReplySize) return;
    s->in = Socket::In::kNone;
    StatusOr<ReplyStatus> reply = DecodeReply(s->buf);
    if (!reply.ok()) {
      Fail(reply.status().WithContext("connecting to " + peer()));
      return;
    }
    if (*reply != ReplyStatus::kAccepted) {
      const char* why = *reply == ReplyStatus::kUnknownListener
                            ? "the listener there is not the one that made this handle (stale "
                              "handle: it was closed and the port reused)"
                        : *reply == ReplyStatus::kUnsupportedVersion
                            ? "the listener runs an incompatible plugin version"
                            : "the listener rejected our hello";
      Fail(UnavailableError("connection to " + peer() + " refused: " + why));
      return;
    }
    if (++replies_ == nsocks_) state_.store(kReady, std::memory_order_release);
  }

  bool HasPending() const override { return !messages_.empty() || state() == kConnecting; }
  void FailPending(const Status& st) override {
    state_.store(kFailed, std::memory_order_release);
    for (SendMessage& m : messages_) m.req->Fail(st);
    messages_.clear();
  }

 private:
  static void OnConnectCb(uv_connect_t* req, int status) {
    auto* s = static_cast<Socket*>(req->data);
    auto* self = static_cast<SendComm*>(s->owner);
    if (status == UV_ECANCELED || s->closing || self->closing_ || self->failed()) return;
    if (status < 0) {
      self->Fail(UnavailableError("cannot connect to " + self->peer() + ": " + UvError(status) +
                                  "; is the receiving rank alive and the address reachable from "
                                  "here (STRAIT_SOCKET_IFNAME)?"));
      return;
    }
    Hello h;
    h.socket_index = static_cast<uint16_t>(s->index);
    h.socket_count = static_cast<uint16_t>(self->nsocks_);
    h.nonce = self->handle_.nonce;
    h.connection_id = self->connection_id_;
    EncodeHello(h, s->ctl);
    uv_buf_t b = uv_buf_init(reinterpret_cast<char*>(s->ctl), kHelloSize);
    int rc = uv_write(&s->ctl_write, reinterpret_cast<uv_stream_t*>(&s->tcp), &b, 1, OnCtlWriteCb);
    s->in = Socket::In::kReply;
    s->filled = 0;
    if (rc == 0) {
      rc = uv_read_start(reinterpret_cast<uv_stream_t*>(&s->tcp), OnAllocCb, OnReadCb);
    }
    if (rc != 0) self->Fail(UnavailableError("connecting to " + self->peer() + ": " + UvError(rc)));
  }

  static void OnWriteCb(uv_write_t* req, int status) {
    std::unique_ptr<WriteReq> w(static_cast<WriteReq*>(req->data));
    Socket* s = w->socket;
    auto* self = static_cast<SendComm*>(s->owner);
    --s->writes_in_flight;
    // After a failure or close, messages are gone: touch nothing but the socket.
    if (self->closing_ || self->failed()) return;
    if (status < 0) {
      self->Fail(UnavailableError("sending to " + self->peer() + " failed: " + UvError(status)));
      return;
    }
    SendMessage* m = w->msg;
    if (--m->chunks_in_flight == 0 && !m->Unassigned()) {
      Request* r = m->req;
      r->sizes[0] = m->size;
      for (auto it = self->messages_.begin(); it != self->messages_.end(); ++it) {
        if (&*it == m) {
          self->messages_.erase(it);
          break;
        }
      }
      r->Complete();
    }
    self->Pump();
  }

  // Gives chunks to every socket that has room, starting after the last one used.
  void Pump() {
    if (state() != kReady) return;
    const int n = static_cast<int>(sockets_.size());
    for (int tries = 0; tries < n;) {
      Socket* s = sockets_[static_cast<size_t>(next_socket_)];
      if (s->writes_in_flight >= kWritesPerSocket) {
        next_socket_ = (next_socket_ + 1) % n;
        ++tries;
        continue;
      }
      SendMessage* m = nullptr;
      for (SendMessage& candidate : messages_) {
        if (candidate.Unassigned()) {
          m = &candidate;
          break;
        }
      }
      if (m == nullptr) return;
      const size_t len =
          std::min(gateway_.empty() ? kChunkBytes : kTunnelChunkBytes, m->size - m->next_offset);
      auto w = std::make_unique<WriteReq>();
      ChunkHeader h;
      h.seq = m->seq;
      h.message_size = m->size;
      h.offset = m->next_offset;
      h.length = static_cast<uint32_t>(len);
      h.tag = m->tag;
      size_t head = kChunkHeaderSize;
      if (gateway_.empty()) {
        EncodeChunkHeader(h, w->hdr);
      } else {
        EncodeTunnelDataHead(h, w->hdr);
        head = kTunnelDataHead;
      }
      w->socket = s;
      w->msg = m;
      w->req.data = w.get();
      uv_buf_t bufs[2] = {
          uv_buf_init(reinterpret_cast<char*>(w->hdr), static_cast<unsigned>(head)),
          uv_buf_init(const_cast<char*>(m->data + m->next_offset), static_cast<unsigned>(len))};
      const int rc = uv_write(&w->req, reinterpret_cast<uv_stream_t*>(&s->tcp), bufs,
                              len == 0 ? 1 : 2, &SendComm::OnWriteCb);
      if (rc != 0) {
        Fail(UnavailableError("sending to " + peer() + " failed: " + UvError(rc)));
        return;
      }
      w.release();
      ++s->writes_in_flight;
      ++m->chunks_in_flight;
      m->next_offset += len;
      m->header_sent = true;
      next_socket_ = (next_socket_ + 1) % n;
      tries = 0;
    }
  }

  ListenHandle handle_;
  int nsocks_;
  std::string gateway_;
  uint32_t timeout_ms_ = 0;
  std::chrono::steady_clock::time_point started_ = std::chrono::steady_clock::now();
  uint64_t connection_id_ = 0;
  int replies_ = 0;
  std::atomic<int> state_{kConnecting};
  std::unordered_map<int, uint64_t> tag_seq_;  // next per-tag message index
  std::list<SendMessage> messages_;
  int next_socket_ = 0;
};

}  // namespace strait::nccl

#endif  // STRAIT_PLUGINS_NCCL_SEND_COMM_H_

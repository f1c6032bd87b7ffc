// The receiving side of a point-to-point connection: RecvComm reads the chunks of one connection
// (nsocks TCP sockets, or one tunnel through the local gateway) and matches them to the buffers
// irecv posts. Internal to the transport (transport.cc posts receives, listen_comm.h creates the
// comms); everything but Acquire/Release/failed/error runs on the loop thread.
#ifndef STRAIT_PLUGINS_NCCL_RECV_COMM_H_
#define STRAIT_PLUGINS_NCCL_RECV_COMM_H_

#include <uv.h>

#include <algorithm>
#include <cstring>
#include <functional>
#include <list>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "common/endian.h"
#include "plugins/nccl/handle.h"
#include "plugins/nccl/transport_comm.h"

namespace strait::nccl {

// Matching: the sender numbers its messages per tag (the k-th message with tag T carries k), and
// the k-th buffer posted with tag T receives it, whichever socket its chunks come on and in
// whatever order NCCL posts grouped receives and sends of different tags. A chunk whose buffer
// is posted is read straight into it; a chunk that arrives first is kept in an "unexpected"
// buffer and copied when irecv posts its buffer, so one tag's early message never blocks another
// tag's traffic behind it on the same socket. Unexpected bytes are capped per comm; past the cap
// the socket stops reading (TCP back-pressure) until receives are posted.

constexpr uint64_t kMaxUnexpectedBytes = uint64_t{256} << 20;

struct RecvGroup {
  Request* req = nullptr;
  int n = 0;
  char* data[kMaxRecvs] = {};
  size_t cap[kMaxRecvs] = {};
  int tags[kMaxRecvs] = {};
  uint64_t msg_size[kMaxRecvs] = {};
  int done = 0;
};

class RecvComm final : public Comm {
 public:
  // `tunnel`: the comm reads one Unix connection to the gateway carrying kTunnelData frames.
  explicit RecvComm(std::string peer, bool tunnel = false)
      : Comm(Kind::kRecv, kMaxRequests), peer_(std::move(peer)), tunnel_(tunnel) {}

  // Loop side, tunnels: accepts tunnel `tunnel_id` through the gateway at `path`; `on_open` is
  // called once with the outcome (OK: the comm is reading and may go to NCCL).
  using OpenFn = std::function<void(RecvComm*, const Status&)>;
  void StartAccept(const std::string& path, uint64_t tunnel_id, OpenFn on_open) {
    on_open_ = std::move(on_open);
    DialGateway(path, EncodeTunnelAccept(tunnel_id));
  }
  void DropOpenCallback() { on_open_ = nullptr; }

  void OnGatewayFrame(Socket* s, const std::vector<unsigned char>& body) override {
    StatusOr<LocalReply> reply = DecodeLocalReply(body.data(), body.size());
    Status st = reply.ok() ? Status::Ok() : reply.status();
    if (st.ok() && reply->reply_to != LocalType::kTunnelAccept) {
      st = DataLossError("the gateway answered a tunnel accept with a reply to another request");
    } else if (st.ok() && reply->code != StatusCode::kOk) {
      st = Status(reply->code, "the gateway at " + s->gateway + " refused to accept the tunnel from " +
                                   peer_ + ": " + reply->text);
    }
    if (!st.ok()) {
      OnGatewayLost(s, st);
      return;
    }
    s->tunnel_open = true;
    StartReading();
    if (on_open_) {
      OpenFn fn = std::move(on_open_);
      on_open_ = nullptr;
      fn(this, Status::Ok());
    }
  }
  void OnGatewayLost(Socket* /*s*/, const Status& why) override {
    if (on_open_) {
      // Still opening: the listen comm owns this comm and decides.
      OpenFn fn = std::move(on_open_);
      on_open_ = nullptr;
      fn(this, why);
      return;
    }
    Fail(why);
  }

  void StartReading() {
    for (Socket* s : sockets_) {
      s->in = HeaderIn();
      s->filled = 0;
      if (s->is_pipe) continue;  // already reading since the gateway's hello
      const int rc = uv_read_start(reinterpret_cast<uv_stream_t*>(&s->tcp), OnAllocCb, OnReadCb);
      if (rc != 0) {
        Fail(UnavailableError("cannot read from " + peer_ + ": " + UvError(rc)));
        return;
      }
    }
  }

  // Loop side: a receive posted by irecv. Its buffers take the next message index of their tags.
  void Post(const RecvGroup& posted) {
    if (closing_) return;
    if (failed()) {
      posted.req->Fail(error());
      return;
    }
    groups_.push_back(std::make_unique<RecvGroup>(posted));
    RecvGroup* g = groups_.back().get();
    // Bind every buffer first: delivering an already-complete message may finish (and free) the
    // group, so `g` is not touched after the delivery loop starts.
    std::vector<std::pair<int, uint64_t>> ready;
    for (int b = 0; b < posted.n; ++b) {
      TagQueue& q = tags_[posted.tags[b]];
      const uint64_t k = q.next_post++;
      q.posted[k] = Slot{g, b};
      auto u = q.unexpected.find(k);
      if (u != q.unexpected.end() && u->second.received == u->second.size) {
        ready.emplace_back(posted.tags[b], k);
      }
    }
    for (const auto& [tag, k] : ready) {
      if (failed()) return;
      DeliverUnexpected(tag, k);
    }
    if (peer_ended_ && !groups_.empty()) {
      FailPeerEnded();
      return;
    }
    ResumeStalled();
  }

  void OnAlloc(Socket* s, uv_buf_t* buf) override {
    switch (s->in) {
      case Socket::In::kFrame:
        *buf = uv_buf_init(reinterpret_cast<char*>(s->buf) + s->filled,
                           static_cast<unsigned>(kTunnelFramePrefix - s->filled));
        break;
      case Socket::In::kCloseBody:
        *buf = uv_buf_init(reinterpret_cast<char*>(s->ctl_in.data()) + s->filled,
                           static_cast<unsigned>(s->ctl_in.size() - s->filled));
        break;
      case Socket::In::kHeader:
        *buf = uv_buf_init(reinterpret_cast<char*>(s->buf) + s->filled,
                           static_cast<unsigned>(HeaderBytes() - s->filled));
        break;
      case Socket::In::kPayload: {
        const size_t n = std::min<size_t>(s->remaining, size_t{1} << 30);
        *buf = uv_buf_init(s->dest, static_cast<unsigned>(n));
        break;
      }
      default: break;  // stalled or ended: zero-length buffer, libuv reports UV_ENOBUFS (ignored)
    }
  }

  void OnRead(Socket* s, ssize_t n) override {
    if (tunnel_) {
      OnTunnelRead(s, n);
      return;
    }
    if (n == UV_EOF && s->in == Socket::In::kHeader && s->filled == 0) {
      // A clean end between chunks: the sender closed this socket. Everything it sent on it has
      // been read; the comm is over only when every socket has ended (the others may still
      // carry the last chunks).
      uv_read_stop(reinterpret_cast<uv_stream_t*>(&s->tcp));
      s->in = Socket::In::kNone;
      if (++ended_sockets_ < sockets_.size()) return;
      // Everything the sender will ever send has been read. Receives still pending can never
      // complete; receives posted later can, from messages already held as unexpected.
      peer_ended_ = true;
      if (!groups_.empty()) FailPeerEnded();
      return;
    }
    if (n < 0) {
      Fail(UnavailableError("connection from " + peer_ + " lost (" + UvError(static_cast<int>(n)) +
                            "): the sending rank exited or the network failed"));
      return;
    }
    const auto got = static_cast<size_t>(n);
    if (s->in == Socket::In::kHeader) {
      s->filled += got;
      if (s->filled < kChunkHeaderSize) return;
      s->filled = 0;
      s->hdr = DecodeChunkHeader(s->buf);
      OnHeader(s);
    } else if (s->in == Socket::In::kPayload) {
      s->dest += got;
      s->remaining -= got;
      if (s->remaining == 0) ChunkDone(s);
    }
  }

  bool HasPending() const override { return !groups_.empty(); }
  void FailPending(const Status& st) override {
    for (auto& g : groups_) g->req->Fail(st);
    groups_.clear();
    tags_.clear();
    stalled_.clear();
  }

 private:
  Socket::In HeaderIn() const { return tunnel_ ? Socket::In::kFrame : Socket::In::kHeader; }
  // Bytes of s->buf a chunk's head fills: the chunk header, after the frame prefix and tag on a
  // tunnel.
  size_t HeaderBytes() const { return tunnel_ ? kTunnelDataHead : kChunkHeaderSize; }

  // A complete chunk header in s->hdr: check it and point the socket at its destination.
  void OnHeader(Socket* s) {
    const ChunkHeader& h = s->hdr;
    if (h.length > kMaxChunkOnWire || h.message_size > kMaxMessageBytes ||
        h.offset > h.message_size || h.length > h.message_size - h.offset ||
        (h.length == 0 && h.message_size != 0)) {
      Fail(DataLossError("corrupt chunk header from " + peer_ + " (offset " +
                         std::to_string(h.offset) + ", length " + std::to_string(h.length) +
                         ", message " + std::to_string(h.message_size) + " bytes)"));
      return;
    }
    if (!Resolve(s) && !failed()) {
      // Over the unexpected-bytes cap: stop reading this socket until receives are posted (on a
      // tunnel the gateways' window then makes the sender wait).
      s->in = Socket::In::kStalled;
      uv_read_stop(s->stream());
      stalled_.push_back(s);
    }
  }

  // Tunnel framing: kTunnelData frames whose body is (tag, chunk header, payload), and at the end
  // a kTunnelClose from the gateway (OK: the sender closed after everything it sent arrived).
  void OnTunnelRead(Socket* s, ssize_t n) {
    if (n < 0) {
      Fail(UnavailableError(
          "tunnel from " + peer_ + ": the connection to the local gateway at " + s->gateway +
          (n == UV_EOF ? " ended without a close (straitd exited?)"
                       : " failed: " + UvError(static_cast<int>(n)))));
      return;
    }
    const auto got = static_cast<size_t>(n);
    switch (s->in) {
      case Socket::In::kFrame: {
        s->filled += got;
        if (s->filled < kTunnelFramePrefix) return;
        const uint32_t len = GetU32(s->buf);
        const uint8_t type = s->buf[4];
        if (type == static_cast<uint8_t>(LocalType::kTunnelData)) {
          if (len < kTunnelDataHead - 4) {
            Fail(DataLossError("tunnel from " + peer_ + ": a " + std::to_string(len) +
                               "-byte data frame is too short for a chunk header (protocol "
                               "error: is the sender a Strait plugin of this version?)"));
            return;
          }
          s->in = Socket::In::kHeader;  // the rest of the head, into buf after the prefix
          return;
        }
        if (type == static_cast<uint8_t>(LocalType::kTunnelClose) && len >= 1 &&
            len <= kMaxControlBody) {
          s->ctl_in.assign(len, 0);
          s->ctl_in[0] = type;
          s->filled = 1;
          s->in = Socket::In::kCloseBody;
          if (s->filled == s->ctl_in.size()) OnTunnelClose(s);
          return;
        }
        Fail(DataLossError("tunnel from " + peer_ + ": unexpected local-protocol message type " +
                           std::to_string(type) + " (" + std::to_string(len) +
                           " bytes) from the gateway"));
        return;
      }
      case Socket::In::kHeader: {
        s->filled += got;
        if (s->filled < kTunnelDataHead) return;
        s->filled = 0;
        const uint32_t len = GetU32(s->buf);
        const auto tag = static_cast<int32_t>(GetU32(s->buf + 5));
        s->hdr = DecodeChunkHeader(s->buf + 9);
        if (s->hdr.tag != tag || len != kTunnelDataHead - 4 + uint64_t{s->hdr.length}) {
          Fail(DataLossError("tunnel from " + peer_ + ": a data frame of " + std::to_string(len) +
                             " bytes disagrees with its chunk header (tag " + std::to_string(tag) +
                             " vs " + std::to_string(s->hdr.tag) + ", length " +
                             std::to_string(s->hdr.length) + ")"));
          return;
        }
        OnHeader(s);
        return;
      }
      case Socket::In::kPayload:
        s->dest += got;
        s->remaining -= got;
        if (s->remaining == 0) ChunkDone(s);
        return;
      case Socket::In::kCloseBody:
        s->filled += got;
        if (s->filled == s->ctl_in.size()) OnTunnelClose(s);
        return;
      default: return;
    }
  }

  void OnTunnelClose(Socket* s) {
    StatusOr<LocalReply> close = DecodeTunnelClose(s->ctl_in.data(), s->ctl_in.size());
    if (!close.ok()) {
      Fail(close.status().WithContext("tunnel from " + peer_));
      return;
    }
    s->tunnel_open = false;
    if (close->code != StatusCode::kOk) {
      Fail(Status(close->code, "tunnel from " + peer_ + " ended: " + close->text));
      return;
    }
    // The sender closed after everything it sent was delivered (the gateway guarantees the
    // order): as a clean end of every socket on the TCP path.
    uv_read_stop(s->stream());
    s->in = Socket::In::kNone;
    peer_ended_ = true;
    if (!groups_.empty()) FailPeerEnded();
  }

  struct Slot {
    RecvGroup* group = nullptr;
    int buffer = 0;
  };
  struct Unexpected {
    uint64_t size = 0;
    uint64_t received = 0;
    std::unique_ptr<char[]> data;
  };
  struct TagQueue {
    uint64_t next_post = 0;                     // index the next posted buffer of this tag takes
    std::map<uint64_t, Slot> posted;            // posted buffers whose message is not done
    std::map<uint64_t, Unexpected> unexpected;  // messages that arrived before (or while) posted
  };

  // Points `s` at where its chunk goes. False: no room for an unexpected message (stall).
  bool Resolve(Socket* s) {
    const ChunkHeader& h = s->hdr;
    TagQueue& q = tags_[h.tag];
    char* base = nullptr;
    auto u = q.unexpected.find(h.seq);
    auto p = q.posted.find(h.seq);
    if (u != q.unexpected.end()) {
      if (u->second.size != h.message_size) return SizeMismatch(h);
      base = u->second.data.get();
    } else if (p != q.posted.end()) {
      RecvGroup* g = p->second.group;
      const int b = p->second.buffer;
      if (h.message_size > g->cap[b]) return TooLarge(h, g->cap[b]);
      g->msg_size[b] = h.message_size;
      base = g->data[b];
    } else if (h.seq < q.next_post) {
      Fail(DataLossError("chunk for message " + std::to_string(h.seq) + " of tag " +
                         std::to_string(h.tag) + " from " + peer_ +
                         " after that message completed (protocol error)"));
      return false;
    } else {
      if (unexpected_bytes_ + h.message_size > kMaxUnexpectedBytes) return false;
      Unexpected& e = q.unexpected[h.seq];
      e.size = h.message_size;
      if (e.size > 0) e.data = std::make_unique_for_overwrite<char[]>(e.size);
      unexpected_bytes_ += e.size;
      base = e.data.get();
    }
    if (h.length == 0) {
      ChunkDone(s);
      return true;
    }
    s->dest = base + h.offset;
    s->remaining = h.length;
    s->in = Socket::In::kPayload;
    return true;
  }

  void ChunkDone(Socket* s) {
    const ChunkHeader h = s->hdr;
    s->in = HeaderIn();
    s->filled = 0;
    TagQueue& q = tags_[h.tag];
    auto u = q.unexpected.find(h.seq);
    if (u != q.unexpected.end()) {
      u->second.received += h.length;
      if (u->second.received == u->second.size && q.posted.count(h.seq) != 0) {
        DeliverUnexpected(h.tag, h.seq);
      }
      return;
    }
    auto p = q.posted.find(h.seq);
    if (p == q.posted.end()) return;
    RecvGroup* g = p->second.group;
    const int b = p->second.buffer;
    received_[{h.tag, h.seq}] += h.length;
    if (received_[{h.tag, h.seq}] < g->msg_size[b]) return;
    received_.erase({h.tag, h.seq});
    q.posted.erase(p);
    BufferDone(g);
  }

  // A complete unexpected message whose buffer is now posted: copy it there.
  void DeliverUnexpected(int tag, uint64_t k) {
    TagQueue& q = tags_[tag];
    auto u = q.unexpected.find(k);
    auto p = q.posted.find(k);
    RecvGroup* g = p->second.group;
    const int b = p->second.buffer;
    if (u->second.size > g->cap[b]) {
      ChunkHeader h;
      h.seq = k;
      h.tag = tag;
      h.message_size = u->second.size;
      TooLarge(h, g->cap[b]);
      return;
    }
    if (u->second.size > 0) std::memcpy(g->data[b], u->second.data.get(), u->second.size);
    g->msg_size[b] = u->second.size;
    unexpected_bytes_ -= u->second.size;
    q.unexpected.erase(u);
    q.posted.erase(p);
    BufferDone(g);
  }

  void BufferDone(RecvGroup* g) {
    if (++g->done < g->n) return;
    Request* req = g->req;
    req->count = g->n;
    std::copy(g->msg_size, g->msg_size + g->n, req->sizes);
    for (auto it = groups_.begin(); it != groups_.end(); ++it) {
      if (it->get() == g) {
        groups_.erase(it);
        break;
      }
    }
    req->Complete();
  }

  void FailPeerEnded() {
    Fail(UnavailableError("connection from " + peer_ +
                          " closed by the sender with receives still pending: the sending rank "
                          "exited or closed its comm before sending what this rank waits for"));
  }

  bool TooLarge(const ChunkHeader& h, size_t cap) {
    Fail(InvalidArgumentError("peer " + peer_ + " sent a " + std::to_string(h.message_size) +
                              "-byte message (tag " + std::to_string(h.tag) + ") into a " +
                              std::to_string(cap) +
                              "-byte receive buffer: the sender's and receiver's sizes disagree"));
    return false;
  }
  bool SizeMismatch(const ChunkHeader& h) {
    Fail(DataLossError("chunks of message " + std::to_string(h.seq) + " (tag " +
                       std::to_string(h.tag) + ") from " + peer_ + " disagree on its size"));
    return false;
  }

  void ResumeStalled() {
    std::vector<Socket*> stalled;
    stalled.swap(stalled_);
    for (size_t i = 0; i < stalled.size(); ++i) {
      Socket* s = stalled[i];
      if (failed() || closing_) return;
      if (!Resolve(s)) {
        if (failed()) return;
        stalled_.insert(stalled_.end(), stalled.begin() + static_cast<long>(i), stalled.end());
        return;
      }
      const int rc = uv_read_start(reinterpret_cast<uv_stream_t*>(&s->tcp), OnAllocCb, OnReadCb);
      if (rc != 0) {
        Fail(UnavailableError("cannot read from " + peer_ + ": " + UvError(rc)));
        return;
      }
    }
  }

  std::string peer_;
  bool tunnel_ = false;
  OpenFn on_open_;
  size_t ended_sockets_ = 0;
  bool peer_ended_ = false;
  std::list<std::unique_ptr<RecvGroup>> groups_;
  std::map<int, TagQueue> tags_;
  std::map<std::pair<int, uint64_t>, uint64_t> received_;  // bytes so far of direct messages
  uint64_t unexpected_bytes_ = 0;
  std::vector<Socket*> stalled_;
};

}  // namespace strait::nccl

#endif  // STRAIT_PLUGINS_NCCL_RECV_COMM_H_

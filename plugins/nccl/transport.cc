// Intra-region point-to-point over TCP on the plugin's libuv thread (see transport.h).
//
// Memory rules, libuv's: a handle (Socket, the listener) is freed only in its close callback; a
// comm is freed on the loop thread once NCCL has closed it AND every handle it owns has finished
// closing, so no callback ever sees a freed owner. Objects handed to NCCL are released
// unique_ptrs; the loop takes them back when it frees them.
#include "plugins/nccl/transport.h"

#include <uv.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <type_traits>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "common/endian.h"
#include "common/units.h"
#include "plugins/nccl/event_loop.h"
#include "plugins/nccl/handle.h"
#include "plugins/nccl/nccl_net.h"

namespace strait::nccl {

class Comm;

constexpr uint32_t kRequestMagic = 0x51455253;  // "SREQ"
constexpr uint32_t kMrMagic = 0x524d5253;       // "SRMR"
constexpr int kWritesPerSocket = 2;  // chunks queued per socket: one in the kernel, one waiting
constexpr uint32_t kMaxChunkOnWire = 64u << 20;  // a larger chunk header is corrupt

struct Request {
  enum State : int { kFree = 0, kPending = 1, kDone = 2, kFailed = 3 };
  uint32_t magic = kRequestMagic;
  Comm* comm = nullptr;
  std::atomic<int> state{kFree};
  int count = 1;
  size_t sizes[kMaxRecvs] = {};
  Status error;  // written by the loop before state becomes kFailed

  void Complete() { state.store(kDone, std::memory_order_release); }
  void Fail(Status s) {
    error = std::move(s);
    state.store(kFailed, std::memory_order_release);
  }
};

struct Socket;
struct WriteReq;

// A memory registration: host memory needs none, but NCCL wants a handle back.
struct MemoryRegion {
  uint32_t magic = 0;
  void* data = nullptr;
  size_t size = 0;
};

namespace {

EventLoop& Loop() {
  static EventLoop* loop = new EventLoop();  // never destroyed: see Transport::Get
  return *loop;
}

std::string Describe(const sockaddr_storage& a) {
  const int port = a.ss_family == AF_INET
                       ? ntohs(reinterpret_cast<const sockaddr_in*>(&a)->sin_port)
                       : ntohs(reinterpret_cast<const sockaddr_in6*>(&a)->sin6_port);
  const std::string host = AddressToString(a);
  return (a.ss_family == AF_INET6 ? "[" + host + "]" : host) + ":" + std::to_string(port);
}

uint64_t RandomId() {
  static std::mutex mu;
  static std::mt19937_64* gen = new std::mt19937_64(std::random_device{}());
  std::lock_guard<std::mutex> lock(mu);
  uint64_t v = 0;
  while (v == 0) v = (*gen)();
  return v;
}

std::string UvError(int rc) {
  return std::string(uv_err_name(rc)) + " (" + uv_strerror(rc) + ")";
}

}  // namespace

// One stream: a TCP socket of a direct connection, or a Unix connection to the local gateway
// (`pipe`, for tunnels). Allocated when opened, freed in its close callback.
struct Socket {
  enum class In {
    kNone,
    kHello,
    kReply,
    kHeader,
    kPayload,
    kStalled,
    kFrame,      // tunnel: a frame's length and type
    kCloseBody,  // tunnel: the rest of a kTunnelClose frame
    kCtlLen,     // gateway control frame: its length
    kCtlBody,    // gateway control frame: its body
  };
  Socket() { std::memset(static_cast<void*>(&pipe), 0, sizeof(pipe)); }
  bool Control() const { return in == In::kCtlLen || in == In::kCtlBody; }
  uv_stream_t* stream() { return reinterpret_cast<uv_stream_t*>(&tcp); }

  union {  // both start with uv_stream_t; libuv initialises the one in use
    uv_tcp_t tcp;
    uv_pipe_t pipe;
  };
  uv_connect_t connect_req{};
  uv_write_t ctl_write{};
  unsigned char ctl[kHelloSize] = {};  // outgoing hello or reply
  Comm* owner = nullptr;
  int index = 0;
  In in = In::kNone;
  unsigned char buf[64] = {};  // incoming hello, reply, chunk header or tunnel frame head
  size_t filled = 0;
  // Gateway connections only.
  bool is_pipe = false;
  bool hello_done = false;     // the gateway answered our hello
  bool tunnel_open = false;    // the tunnel carries data (a kTunnelClose may end it)
  std::string gateway;         // its socket path, for messages
  std::vector<unsigned char> request;  // sent once the hello is answered
  unsigned char len4[4] = {};
  std::vector<unsigned char> ctl_in;   // a control frame's body
  ChunkHeader hdr;
  char* dest = nullptr;
  size_t remaining = 0;
  int writes_in_flight = 0;
  bool closing = false;
};

// Base of the three comm kinds: owns sockets and a request pool; loop-side state is touched only
// on the loop thread.
class Comm {
 public:
  enum class Kind { kListen, kSend, kRecv };
  Comm(Kind kind, int pool_size) : kind_(kind) {
    pool_.reserve(static_cast<size_t>(pool_size));
    for (int i = 0; i < pool_size; ++i) {
      pool_.push_back(std::make_unique<Request>());
      pool_.back()->comm = this;
      free_.push_back(pool_.back().get());
    }
  }
  virtual ~Comm() = default;
  Comm(const Comm&) = delete;
  Comm& operator=(const Comm&) = delete;

  Kind kind() const { return kind_; }

  // NCCL side: a free request, or nullptr when all are in flight.
  Request* Acquire() {
    std::lock_guard<std::mutex> lock(pool_mu_);
    if (free_.empty()) return nullptr;
    Request* r = free_.back();
    free_.pop_back();
    r->error = Status::Ok();
    r->count = 1;
    r->state.store(Request::kPending, std::memory_order_relaxed);
    return r;
  }
  void Release(Request* r) {
    std::lock_guard<std::mutex> lock(pool_mu_);
    r->state.store(Request::kFree, std::memory_order_relaxed);
    free_.push_back(r);
  }

  bool failed() const { return failed_.load(std::memory_order_acquire); }
  Status error() const {
    std::lock_guard<std::mutex> lock(error_mu_);
    return error_;
  }

  // Loop side.
  virtual void OnAlloc(Socket* s, uv_buf_t* buf) = 0;
  virtual void OnRead(Socket* s, ssize_t n) = 0;
  virtual void FailPending(const Status&) {}
  virtual bool HasPending() const { return false; }

  // Loop side: stop all I/O, close every handle; the comm is freed when the last one closed.
  void BeginClose() {
    closing_ = true;
    CloseHandles();
    MaybeDelete();
  }
  void HandleClosed() {
    --open_handles_;
    MaybeDelete();
  }
  void SocketClosed(Socket* s) {
    sockets_.erase(std::remove(sockets_.begin(), sockets_.end(), s), sockets_.end());
    HandleClosed();
  }

  // Loop side: the comm is broken; every pending request fails with `s`, every socket closes.
  void Fail(Status s) {
    if (closing_ || failed()) return;
    {
      std::lock_guard<std::mutex> lock(error_mu_);
      error_ = s;
    }
    failed_.store(true, std::memory_order_release);
    // A peer that closes after all its traffic is done is how every job ends: only a failure
    // that breaks pending work is worth a WARN. Either way later calls report it.
    Transport::Get().Log(HasPending() ? LogKind::kWarn : LogKind::kInfo, s.message());
    FailPending(s);
    CloseHandles();
  }

  void AdoptSocket(Socket* s) {
    s->owner = this;
    s->tcp.data = s;
    sockets_.push_back(s);
    ++open_handles_;
  }

  static void CloseSocket(Socket* s);

  // Loop side, gateway connections: opens a Unix connection to the gateway at `path`, says
  // hello, and once the gateway answered sends `request`. Every later control frame goes to
  // OnGatewayFrame; a failure (connect, hello, bad frame, lost connection) to OnGatewayLost.
  Socket* DialGateway(const std::string& path, std::vector<unsigned char> request);
  void GatewayAlloc(Socket* s, uv_buf_t* buf);
  void GatewayRead(Socket* s, ssize_t n);
  virtual void OnGatewayFrame(Socket* /*s*/, const std::vector<unsigned char>& /*body*/) {}
  virtual void OnGatewayLost(Socket* /*s*/, const Status& why) { Fail(why); }

 protected:
  virtual void CloseHandles() {
    const std::vector<Socket*> sockets = sockets_;
    for (Socket* s : sockets) {
      if (s->is_pipe) EndTunnel(s);
      CloseSocket(s);
    }
  }
  // An open tunnel ends with kTunnelClose (the reason: OK, or why this comm failed) when no data
  // frame is half written; otherwise closing the connection ends it (the peer's gateway then
  // reports the truncated frame).
  void EndTunnel(Socket* s) {
    if (!s->tunnel_open || s->closing || s->writes_in_flight != 0) return;
    s->tunnel_open = false;
    Status why = error();
    std::vector<unsigned char> frame = EncodeTunnelClose(
        why.code(), why.ok() ? "closed by the rank" : std::string(why.message()));
    uv_buf_t b = uv_buf_init(reinterpret_cast<char*>(frame.data()),
                             static_cast<unsigned>(frame.size()));
    (void)uv_try_write(s->stream(), &b, 1);  // best effort: the close that follows ends it anyway
  }
  void MaybeDelete() {
    if (closing_ && open_handles_ == 0) std::unique_ptr<Comm>{this}.reset();
  }

  Kind kind_;
  bool closing_ = false;
  int open_handles_ = 0;
  std::vector<Socket*> sockets_;

 private:
  std::mutex pool_mu_;
  std::vector<std::unique_ptr<Request>> pool_;
  std::vector<Request*> free_;
  mutable std::mutex error_mu_;
  Status error_;
  std::atomic<bool> failed_{false};
};

namespace {

void OnAllocCb(uv_handle_t* h, size_t /*suggested*/, uv_buf_t* buf) {
  auto* s = static_cast<Socket*>(h->data);
  *buf = uv_buf_init(nullptr, 0);
  if (s->Control()) {
    s->owner->GatewayAlloc(s, buf);
  } else {
    s->owner->OnAlloc(s, buf);
  }
}

void OnReadCb(uv_stream_t* stream, ssize_t n, const uv_buf_t* /*buf*/) {
  auto* s = static_cast<Socket*>(stream->data);
  if (n == 0 || n == UV_ENOBUFS || s->closing) return;
  if (s->Control()) {
    s->owner->GatewayRead(s, n);
  } else {
    s->owner->OnRead(s, n);
  }
}

// A control frame on its way to the gateway (owns its bytes until written).
struct ControlWrite {
  uv_write_t req{};
  std::vector<unsigned char> bytes;
};

// Writes a control frame; a failure surfaces as a read error on the same connection.
void WriteControl(Socket* s, std::vector<unsigned char> frame) {
  auto w = std::make_unique<ControlWrite>();
  w->bytes = std::move(frame);
  w->req.data = w.get();
  uv_buf_t b = uv_buf_init(reinterpret_cast<char*>(w->bytes.data()),
                           static_cast<unsigned>(w->bytes.size()));
  if (uv_write(&w->req, s->stream(), &b, 1, [](uv_write_t* req, int) {
        std::unique_ptr<ControlWrite>{static_cast<ControlWrite*>(req->data)}.reset();
      }) == 0) {
    w.release();
  }
}

void OnCloseCb(uv_handle_t* h) {
  std::unique_ptr<Socket> s(static_cast<Socket*>(h->data));
  s->owner->SocketClosed(s.get());
}

void OnCtlWriteCb(uv_write_t* /*req*/, int /*status*/) {
  // A failed hello or reply surfaces as a read error on the same socket.
}

}  // namespace

void Comm::CloseSocket(Socket* s) {
  if (s->closing) return;
  s->closing = true;
  uv_close(reinterpret_cast<uv_handle_t*>(&s->tcp), OnCloseCb);
}

Socket* Comm::DialGateway(const std::string& path, std::vector<unsigned char> request) {
  auto sock = std::make_unique<Socket>();
  uv_pipe_init(Loop().loop(), &sock->pipe, 0);
  Socket* s = sock.release();
  AdoptSocket(s);
  s->is_pipe = true;
  s->gateway = path;
  s->request = std::move(request);
  s->connect_req.data = s;
  uv_pipe_connect(&s->connect_req, &s->pipe, path.c_str(), [](uv_connect_t* req, int status) {
    auto* conn = static_cast<Socket*>(req->data);
    Comm* self = conn->owner;
    if (status == UV_ECANCELED || conn->closing) return;
    if (status < 0) {
      self->OnGatewayLost(conn, UnavailableError("cannot connect to the local gateway at " +
                                              conn->gateway + ": " + UvError(status) +
                                              "; is straitd running there (STRAIT_GATEWAY)?"));
      return;
    }
    WriteControl(conn, EncodeLocalHello("nccl-net-strait"));
    conn->in = Socket::In::kCtlLen;
    conn->filled = 0;
    const int rc = uv_read_start(conn->stream(), OnAllocCb, OnReadCb);
    if (rc != 0) {
      self->OnGatewayLost(conn, UnavailableError("cannot read from the local gateway at " +
                                              conn->gateway + ": " + UvError(rc)));
    }
  });
  return s;
}

void Comm::GatewayAlloc(Socket* s, uv_buf_t* buf) {
  if (s->in == Socket::In::kCtlLen) {
    *buf = uv_buf_init(reinterpret_cast<char*>(s->len4) + s->filled,
                       static_cast<unsigned>(4 - s->filled));
  } else {
    *buf = uv_buf_init(reinterpret_cast<char*>(s->ctl_in.data()) + s->filled,
                       static_cast<unsigned>(s->ctl_in.size() - s->filled));
  }
}

void Comm::GatewayRead(Socket* s, ssize_t n) {
  if (n < 0) {
    OnGatewayLost(s, UnavailableError(
                         n == UV_EOF ? "the local gateway at " + s->gateway +
                                           " closed the connection (straitd stopped or restarted?)"
                                     : "the connection to the local gateway at " + s->gateway +
                                           " failed: " + UvError(static_cast<int>(n))));
    return;
  }
  s->filled += static_cast<size_t>(n);
  if (s->in == Socket::In::kCtlLen) {
    if (s->filled < 4) return;
    const uint32_t len = GetU32(s->len4);
    if (len == 0 || len > kMaxControlBody) {
      OnGatewayLost(s, DataLossError("the gateway at " + s->gateway + " sent a " +
                                     std::to_string(len) +
                                     "-byte frame where a control message was due (protocol "
                                     "error)"));
      return;
    }
    s->ctl_in.assign(len, 0);
    s->in = Socket::In::kCtlBody;
    s->filled = 0;
    return;
  }
  if (s->filled < s->ctl_in.size()) return;
  s->in = Socket::In::kCtlLen;
  s->filled = 0;
  if (!s->hello_done) {
    StatusOr<LocalReply> reply = DecodeLocalReply(s->ctl_in.data(), s->ctl_in.size());
    if (!reply.ok()) {
      OnGatewayLost(s, reply.status().WithContext("hello to the gateway at " + s->gateway));
      return;
    }
    if (reply->reply_to != LocalType::kHello || reply->code != StatusCode::kOk) {
      OnGatewayLost(s, Status(reply->code == StatusCode::kOk ? StatusCode::kDataLoss : reply->code,
                              "the gateway at " + s->gateway + " refused this rank's hello: " +
                                  reply->text));
      return;
    }
    s->hello_done = true;
    WriteControl(s, std::move(s->request));
    return;
  }
  // The handler may switch the connection to data or close it: `s` is not touched after.
  OnGatewayFrame(s, s->ctl_in);
}

// ---------------------------------------------------------------------------------------------
// Receiving side.
//
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

// ---------------------------------------------------------------------------------------------
// Listening side.

// Wakes Transport::Listen when a pre-opened listener changes state (defined with the pool below).
void NotifyListenPool();

class ListenComm final : public Comm {
 public:
  explicit ListenComm(uint64_t nonce) : Comm(Kind::kListen, 0), nonce_(nonce) {}

  Status Open(const sockaddr_storage& addr, sockaddr_storage* bound) {
    uv_tcp_init(Loop().loop(), &server_);
    server_.data = this;
    ++open_handles_;
    int rc = uv_tcp_bind(&server_, reinterpret_cast<const sockaddr*>(&addr), 0);
    if (rc == 0) {
      rc = uv_listen(reinterpret_cast<uv_stream_t*>(&server_), 128, &ListenComm::OnConnection);
    }
    if (rc != 0) {
      return UnavailableError("cannot listen on " + Describe(addr) + ": " + UvError(rc));
    }
    int len = sizeof(*bound);
    rc = uv_tcp_getsockname(&server_, reinterpret_cast<sockaddr*>(bound), &len);
    if (rc != 0) return UnavailableError("getsockname: " + UvError(rc));
    bound_ = *bound;
    return Status::Ok();
  }

  uint64_t nonce() const { return nonce_; }
  // The TCP listener's address (set by Open before the listener is handed out).
  const sockaddr_storage& bound() const { return bound_; }

  RecvComm* PopReady() {
    std::lock_guard<std::mutex> lock(ready_mu_);
    if (ready_.empty()) return nullptr;
    RecvComm* c = ready_.front();
    ready_.pop_front();
    return c;
  }

  // What listen() publishes for the gateway tunnel.
  struct TunnelInfo {
    uint64_t listen_id = 0;
    uint32_t shard = 0;
    std::string region;
  };
  // Loop side: opens the tunnel listen on the gateway at `path` next to the TCP listener.
  void StartTunnel(const std::string& path) {
    gateway_ = path;
    gw_ = DialGateway(path, EncodeTunnelListen());
  }
  // Pre-opened listeners (see the pool below). Any thread.
  enum class PoolState { kOpening, kReady, kFailed };
  PoolState pool_state() {
    std::lock_guard<std::mutex> lock(tunnel_mu_);
    return tunnel_state_ == kTunnelOpening     ? PoolState::kOpening
           : tunnel_state_ == kTunnelListening ? PoolState::kReady
                                               : PoolState::kFailed;
  }
  // Takes a pooled listener whose tunnel listen is up: true (and its tunnel) once, false if it
  // is not ready. From then on a lost gateway connection is WARNed (NCCL holds the listener).
  bool Claim(TunnelInfo* info) {
    std::lock_guard<std::mutex> lock(tunnel_mu_);
    if (tunnel_state_ != kTunnelListening || !pooled_) return false;
    pooled_ = false;
    *info = tunnel_;
    return true;
  }
  Status tunnel_error() {
    std::lock_guard<std::mutex> lock(tunnel_mu_);
    return tunnel_error_;
  }
  // Loop side, before StartTunnel: the listener waits in the pool until Claim.
  void MarkPooled() {
    std::lock_guard<std::mutex> lock(tunnel_mu_);
    pooled_ = true;
  }
  // Loop side: the listener could not be opened at all.
  void FailTunnel(const Status& why) {
    {
      std::lock_guard<std::mutex> lock(tunnel_mu_);
      tunnel_error_ = why;
      tunnel_state_ = kTunnelFailed;
    }
    NotifyListenPool();
  }

  void OnGatewayFrame(Socket* s, const std::vector<unsigned char>& body) override {
    StatusOr<LocalReply> reply = DecodeLocalReply(body.data(), body.size());
    Status st = reply.ok() ? Status::Ok() : reply.status();
    if (st.ok() && reply->reply_to != LocalType::kTunnelListen) {
      st = DataLossError("the gateway answered a tunnel listen with a reply to another request");
    } else if (st.ok() && reply->code != StatusCode::kOk) {
      st = Status(reply->code, "the gateway at " + gateway_ + " ended the tunnel listen: " +
                                   reply->text);
    }
    if (!st.ok()) {
      OnGatewayLost(s, st);
      return;
    }
    StatusOr<TunnelEvent> event = DecodeTunnelEvent(reply->data);
    if (!event.ok()) {
      OnGatewayLost(s, event.status());
      return;
    }
    if (event->kind == TunnelEventKind::kListening) {
      {
        std::lock_guard<std::mutex> lock(tunnel_mu_);
        tunnel_.listen_id = event->id;
        tunnel_.shard = event->shard;
        tunnel_.region = event->region;
        tunnel_state_ = kTunnelListening;
      }
      NotifyListenPool();
      return;
    }
    // An incoming tunnel: accept it on a connection of its own (NCCL's accept() picks it up).
    auto recv = std::make_unique<RecvComm>(
        "region " + event->region + " (tunnel " + std::to_string(event->id) + ")", true);
    RecvComm* raw = recv.release();
    accepting_.insert(raw);
    raw->StartAccept(gateway_, event->id, [this](RecvComm* c, const Status& result) {
      accepting_.erase(c);
      if (!result.ok()) {
        Transport::Get().Log(LogKind::kWarn, result.message());
        c->BeginClose();
        return;
      }
      std::lock_guard<std::mutex> lock(ready_mu_);
      ready_.push_back(c);
    });
  }

  void OnGatewayLost(Socket* s, const Status& why) override {
    bool opening = false;
    bool pooled = false;
    {
      std::lock_guard<std::mutex> lock(tunnel_mu_);
      opening = tunnel_state_ == kTunnelOpening;
      pooled = pooled_;
      // Still in the pool (nobody published its handle): it just becomes unusable.
      if (opening || pooled) {
        tunnel_error_ = why;
        tunnel_state_ = kTunnelFailed;
      }
    }
    NotifyListenPool();
    // Listening already: direct connections still work, cross-region connects to this rank
    // are refused by the gateways from now on.
    if (!opening && !pooled && !closing_) {
      Transport::Get().Log(LogKind::kWarn,
                           why.message() + "; the tunnel listen ended: ranks in other regions "
                                           "can no longer connect to this listener");
    }
    gw_ = nullptr;
    CloseSocket(s);
  }

  void OnAlloc(Socket* s, uv_buf_t* buf) override {
    if (s->in == Socket::In::kHello && !s->is_pipe) {
      *buf = uv_buf_init(reinterpret_cast<char*>(s->buf) + s->filled,
                         static_cast<unsigned>(kHelloSize - s->filled));
    }
  }

  void OnRead(Socket* s, ssize_t n) override {
    if (n < 0) {
      DropPending(s);
      return;
    }
    s->filled += static_cast<size_t>(n);
    if (s->filled < kHelloSize) return;
    uv_read_stop(reinterpret_cast<uv_stream_t*>(&s->tcp));
    ReplyStatus why = ReplyStatus::kAccepted;
    StatusOr<Hello> hello = DecodeHello(s->buf, &why);
    if (hello.ok() && hello->nonce != nonce_) why = ReplyStatus::kUnknownListener;
    if (!hello.ok() || why != ReplyStatus::kAccepted) {
      // Someone else's connection (a stale handle, a port scanner): answer and drop it.
      EncodeReply(why, s->ctl);
      uv_buf_t b = uv_buf_init(reinterpret_cast<char*>(s->ctl), kReplySize);
      s->ctl_write.data = s;
      const int rc =
          uv_write(&s->ctl_write, reinterpret_cast<uv_stream_t*>(&s->tcp), &b, 1,
                   [](uv_write_t* w, int) { CloseSocket(static_cast<Socket*>(w->data)); });
      if (rc != 0) CloseSocket(s);
      return;
    }
    s->index = hello->socket_index;
    auto& slots = partial_[hello->connection_id];
    if (slots.empty()) slots.assign(hello->socket_count, nullptr);
    if (slots.size() != hello->socket_count || slots[hello->socket_index] != nullptr) {
      DropPending(s);
      return;
    }
    slots[hello->socket_index] = s;
    Unlink(s);
    if (std::count(slots.begin(), slots.end(), nullptr) != 0) return;
    // Every socket of this connection has arrived: hand them to a new recv comm.
    sockaddr_storage peer{};
    int len = sizeof(peer);
    uv_tcp_getpeername(&slots[0]->tcp, reinterpret_cast<sockaddr*>(&peer), &len);
    auto recv = std::make_unique<RecvComm>(Describe(peer));
    for (Socket* sock : slots) {
      --open_handles_;
      recv->AdoptSocket(sock);
      EncodeReply(ReplyStatus::kAccepted, sock->ctl);
      uv_buf_t b = uv_buf_init(reinterpret_cast<char*>(sock->ctl), kReplySize);
      uv_write(&sock->ctl_write, reinterpret_cast<uv_stream_t*>(&sock->tcp), &b, 1, OnCtlWriteCb);
    }
    partial_.erase(hello->connection_id);
    recv->StartReading();
    std::lock_guard<std::mutex> lock(ready_mu_);
    ready_.push_back(recv.release());
  }

 protected:
  void CloseHandles() override {
    if (!uv_is_closing(reinterpret_cast<uv_handle_t*>(&server_))) {
      uv_close(reinterpret_cast<uv_handle_t*>(&server_),
               [](uv_handle_t* h) { static_cast<ListenComm*>(h->data)->HandleClosed(); });
    }
    const std::vector<Socket*> pending = sockets_;
    for (Socket* s : pending) CloseSocket(s);
    for (auto& [id, slots] : partial_) {
      for (Socket* s : slots) {
        if (s != nullptr) CloseSocket(s);
      }
    }
    partial_.clear();
    // Tunnels being accepted at the gateway.
    for (RecvComm* c : accepting_) {
      c->DropOpenCallback();
      c->BeginClose();
    }
    accepting_.clear();
    // Connections that arrived but were never accepted.
    std::lock_guard<std::mutex> lock(ready_mu_);
    for (RecvComm* c : ready_) c->BeginClose();
    ready_.clear();
  }

 private:
  static void OnConnection(uv_stream_t* server, int status) {
    auto* self = static_cast<ListenComm*>(server->data);
    if (status < 0 || self->closing_) return;
    auto s = std::make_unique<Socket>();
    uv_tcp_init(Loop().loop(), &s->tcp);
    Socket* raw = s.release();
    self->AdoptSocket(raw);
    if (uv_accept(server, reinterpret_cast<uv_stream_t*>(&raw->tcp)) != 0) {
      self->DropPending(raw);
      return;
    }
    uv_tcp_nodelay(&raw->tcp, 1);
    raw->in = Socket::In::kHello;
    if (uv_read_start(reinterpret_cast<uv_stream_t*>(&raw->tcp), OnAllocCb, OnReadCb) != 0) {
      self->DropPending(raw);
    }
  }

  void Unlink(Socket* s) {
    sockets_.erase(std::remove(sockets_.begin(), sockets_.end(), s), sockets_.end());
  }
  void DropPending(Socket* s) { CloseSocket(s); }

  enum { kTunnelOpening, kTunnelListening, kTunnelFailed };

  uint64_t nonce_;
  std::string gateway_;
  Socket* gw_ = nullptr;  // the tunnel listen connection (loop side)
  std::unordered_set<RecvComm*> accepting_;
  std::mutex tunnel_mu_;
  int tunnel_state_ = kTunnelOpening;
  bool pooled_ = false;  // waiting in the pool: not yet handed to NCCL
  Status tunnel_error_;
  TunnelInfo tunnel_;
  sockaddr_storage bound_{};
  uv_tcp_t server_{};
  std::map<uint64_t, std::vector<Socket*>> partial_;  // connection id -> sockets by index
  std::mutex ready_mu_;
  std::deque<RecvComm*> ready_;
};

// ---------------------------------------------------------------------------------------------
// Pre-opened listeners: why listen() does not wait for straitd.
//
// NCCL calls listen() on its own thread and needs the handle filled before the call returns, and
// a cross-region handle must carry the listen id that only the gateway hands out (in its answer
// to a tunnel listen). Instead of asking the gateway inside listen(), the loop keeps
// kListenPoolSize listeners opened ahead: each has its TCP listener bound and its tunnel listen
// answered. listen() takes a ready one (no round trip: its handle is filled from what the plugin
// already holds) and the loop opens a replacement in the background. listen() waits only when no
// pre-opened listener is ready (the first listen right after init, a burst of listens faster
// than the local gateway answers, or an unhealthy gateway), and then for kGatewayListenWaitNs at
// most; a gateway that is not there at all fails it at once.

namespace {

constexpr size_t kListenPoolSize = 4;

struct ListenPool {
  std::mutex mu;
  std::condition_variable cv;  // a pooled listener changed state, or the pool was refilled
  bool active = false;         // the loop runs with a gateway; false once finalize closes the pool
  std::string gateway;
  sockaddr_storage addr{};
  std::deque<ListenComm*> entries;  // not registered: NCCL has not seen them
};

ListenPool& Pool() {
  static ListenPool* pool = new ListenPool();  // never destroyed, like the transport
  return *pool;
}

}  // namespace

void NotifyListenPool() {
  std::lock_guard<std::mutex> lock(Pool().mu);
  Pool().cv.notify_all();
}

namespace {

// Loop side: opens listeners until kListenPoolSize are opening or ready.
void FillListenPool() {
  ListenPool& pool = Pool();
  std::string gateway;
  sockaddr_storage addr{};
  size_t live = 0;
  {
    std::lock_guard<std::mutex> lock(pool.mu);
    if (!pool.active) return;
    gateway = pool.gateway;
    addr = pool.addr;
    for (ListenComm* e : pool.entries) {
      if (e->pool_state() != ListenComm::PoolState::kFailed) ++live;
    }
  }
  std::vector<ListenComm*> fresh;
  for (size_t i = live; i < kListenPoolSize; ++i) {
    auto comm = std::make_unique<ListenComm>(RandomId());
    comm->MarkPooled();
    sockaddr_storage bound{};
    const Status st = comm->Open(addr, &bound);
    if (st.ok()) {
      comm->StartTunnel(gateway);
    } else {
      comm->FailTunnel(st);
    }
    fresh.push_back(comm.release());
  }
  std::lock_guard<std::mutex> lock(pool.mu);
  pool.entries.insert(pool.entries.end(), fresh.begin(), fresh.end());
  pool.cv.notify_all();
}

// NCCL side: a ready listener out of the pool, waiting up to `wait_ns` when none is ready yet.
StatusOr<std::pair<ListenComm*, ListenComm::TunnelInfo>> TakeFromListenPool(int64_t wait_ns) {
  ListenPool& pool = Pool();
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::nanoseconds(wait_ns);
  bool refilled = false;
  Status last_error;
  std::unique_lock<std::mutex> lock(pool.mu);
  for (;;) {
    bool opening = false;
    for (auto it = pool.entries.begin(); it != pool.entries.end();) {
      ListenComm* e = *it;
      ListenComm::TunnelInfo info;
      if (e->Claim(&info)) {
        pool.entries.erase(it);
        lock.unlock();
        Loop().Post(FillListenPool);
        return std::make_pair(e, info);
      }
      if (e->pool_state() == ListenComm::PoolState::kFailed) {
        last_error = e->tunnel_error();
        it = pool.entries.erase(it);
        Loop().Post([e] { e->BeginClose(); });
        continue;
      }
      opening = true;
      ++it;
    }
    if (!opening) {
      if (refilled || !pool.active) {
        if (!last_error.ok()) return last_error;
        return FailedPreconditionError("no listener could be opened: the plugin is finalizing");
      }
      // Every pre-opened listener failed (straitd was down, or restarted since): try afresh
      // once, so a gateway that is back now is used; one that is still down fails at once.
      lock.unlock();
      Loop().RunSync(FillListenPool);
      lock.lock();
      refilled = true;
      continue;
    }
    if (pool.cv.wait_until(lock, deadline) == std::cv_status::timeout) {
      return DeadlineExceededError(
          "the local gateway at " + pool.gateway + " did not answer a tunnel listen within " +
          FormatDuration(wait_ns) +
          ": is straitd there healthy? (listen runs on NCCL's thread and waits no longer)");
    }
  }
}

// Loop side (the last finalize): closes every pre-opened listener.
void CloseListenPool() {
  std::deque<ListenComm*> entries;
  {
    std::lock_guard<std::mutex> lock(Pool().mu);
    Pool().active = false;
    entries.swap(Pool().entries);
    Pool().cv.notify_all();
  }
  for (ListenComm* e : entries) e->BeginClose();
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Sending side.

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

// ---------------------------------------------------------------------------------------------
// Transport: the NCCL-facing operations.

namespace {

struct Registry {
  std::mutex mu;
  std::unordered_set<const void*> comms;               // Comm* (base) pointers, as NCCL holds them
  std::unordered_map<uint64_t, SendComm*> connecting;  // handle scratch id -> comm
  std::unordered_set<const void*> regions;
};
Registry& Reg() {
  static Registry* r = new Registry();
  return *r;
}

std::mutex& InitMutex() {
  static std::mutex* mu = new std::mutex();
  return *mu;
}
std::mutex& LogMutex() {
  static std::mutex* mu = new std::mutex();
  return *mu;
}

template <typename T>
constexpr Comm::Kind KindOf() {
  if constexpr (std::is_same_v<T, ListenComm>) return Comm::Kind::kListen;
  if constexpr (std::is_same_v<T, SendComm>) return Comm::Kind::kSend;
  return Comm::Kind::kRecv;
}

// The comm behind an opaque pointer from NCCL, checked against the registry before it is ever
// dereferenced.
template <typename T>
StatusOr<T*> As(void* p, const char* call) {
  std::lock_guard<std::mutex> lock(Reg().mu);
  if (p == nullptr || Reg().comms.count(p) == 0) {
    return InvalidArgumentError(std::string(call) + "() on an unknown or closed comm");
  }
  Comm* c = static_cast<Comm*>(p);
  if (c->kind() != KindOf<T>()) {
    return InvalidArgumentError(std::string(call) + "() on the wrong kind of comm");
  }
  return static_cast<T*>(c);
}

void* Register(Comm* c) {
  std::lock_guard<std::mutex> lock(Reg().mu);
  Reg().comms.insert(c);
  return c;
}

bool IsComm(void* p) {
  std::lock_guard<std::mutex> lock(Reg().mu);
  return p != nullptr && Reg().comms.count(p) != 0;
}

// Unregisters first, so a second close of the same pointer is an error, not a double free.
template <typename T>
Status Close(void* p, const char* call) {
  T* comm = nullptr;
  {
    STRAIT_ASSIGN_OR_RETURN(comm, As<T>(p, call));
    std::lock_guard<std::mutex> lock(Reg().mu);
    if (Reg().comms.erase(p) == 0) {
      return InvalidArgumentError(std::string(call) + "() on a comm that is already closed");
    }
  }
  Loop().RunSync([comm] { comm->BeginClose(); });
  return Status::Ok();
}

Status NotInitialized() {
  return FailedPreconditionError("the Strait net plugin was used before init() succeeded");
}

}  // namespace

Transport& Transport::Get() {
  static Transport* t = new Transport();  // never destroyed: NCCL may call in during exit
  return *t;
}

void Transport::Log(LogKind kind, const std::string& message) const {
  std::lock_guard<std::mutex> lock(LogMutex());
  if (log_) log_(kind, message);
}

Status Transport::Init(const EnvGetter& env, LogFn log) {
  std::lock_guard<std::mutex> lock(InitMutex());
  {
    std::lock_guard<std::mutex> log_lock(LogMutex());
    if (log) log_ = std::move(log);
  }
  STRAIT_ASSIGN_OR_RETURN(PluginConfig config, ParseConfig(env));
  // Validated on every init (even when the loop already runs with an earlier configuration) so
  // that every communicator whose environment is wrong hears about it.
  STRAIT_ASSIGN_OR_RETURN(Interface iface, SelectInterface(config.socket_ifname));
  std::string region = config.region;
  if (region.empty() && !config.region_map.empty()) {
    std::optional<std::string> mapped = LookupRegion(config.region_map, iface.addr);
    if (!mapped) {
      return InvalidArgumentError(
          "STRAIT_REGION is unset and STRAIT_REGION_MAP has no entry "
          "for this rank's address " +
          AddressToString(iface.addr) + " (interface " + iface.name +
          "); allowed: set STRAIT_REGION, or add a subnet that covers "
          "this address to STRAIT_REGION_MAP");
    }
    region = *mapped;
  }
  if (!Loop().running()) {
    STRAIT_RETURN_IF_ERROR(Loop().Start());
    config_ = std::move(config);
    iface_ = std::move(iface);
    own_region_ = std::move(region);
    if (!config_.gateway.empty()) {
      {
        std::lock_guard<std::mutex> pool_lock(Pool().mu);
        Pool().active = true;
        Pool().gateway = config_.gateway;
        Pool().addr = iface_.addr;
      }
      // Listeners opened ahead, so listen() finds one ready (see the pool above). A gateway that
      // is not up yet is no error here: listen() retries it.
      Loop().Post(FillListenPool);
    }
    Log(LogKind::kInfo, "using interface " + iface_.name + " (" + AddressToString(iface_.addr) +
                            "), region " + (own_region_.empty() ? "<unset>" : own_region_) + ", " +
                            std::to_string(config_.nsocks) +
                            " sockets per connection; cross-region connections " +
                            (config_.gateway.empty() ? std::string("disabled (STRAIT_GATEWAY unset)")
                                                     : "through the gateway at " + config_.gateway));
  } else if (config.nsocks != config_.nsocks || region != own_region_ ||
             iface.name != iface_.name) {
    Log(LogKind::kInfo,
        "a later init() sees a different STRAIT_* environment; the plugin keeps "
        "the first one until every communicator has finalized");
  }
  ++init_count_;
  return Status::Ok();
}

void Transport::Finalize() {
  std::lock_guard<std::mutex> lock(InitMutex());
  if (init_count_ > 0) --init_count_;
  if (init_count_ > 0) return;
  {
    std::lock_guard<std::mutex> reg_lock(Reg().mu);
    if (!Reg().comms.empty() || !Reg().connecting.empty()) return;
  }
  Loop().RunSync(CloseListenPool);
  Loop().Stop();
}

int Transport::Devices() const {
  return 1;
}

StatusOr<DeviceProperties> Transport::GetProperties(int dev) const {
  if (!Loop().running()) return NotInitialized();
  if (dev != 0) {
    return InvalidArgumentError("device " + std::to_string(dev) +
                                " does not exist; allowed: 0 (this build has one device)");
  }
  DeviceProperties p;
  p.name = "strait-" + iface_.name;
  p.guid = std::hash<std::string>{}(iface_.name);
  // Loopback and virtual NICs report no speed; NCCL reads <= 0 as 10 Gbit/s anyway, say so.
  p.speed_mbps = iface_.speed_mbps > 0 ? iface_.speed_mbps : 10000;
  // One device serves every peer (NCCL cannot pick a device per peer), so it describes the
  // slowest path the job uses: with a gateway, the WAN (whose latency dominates every
  // cross-region ring or tree step); without, NCCL's own inter-node model (0).
  p.latency_us = 0;
  if (config_.wan_latency_us) {
    p.latency_us = static_cast<float>(*config_.wan_latency_us);
  } else if (!config_.gateway.empty()) {
    p.latency_us = static_cast<float>(kDefaultWanLatencyUs);
  }
  if (config_.wan_speed_mbps) p.speed_mbps = *config_.wan_speed_mbps;
  p.max_comms = 65536;
  p.max_recvs = kMaxRecvs;
  p.max_p2p_bytes = kMaxMessageBytes;
  p.max_coll_bytes = kMaxMessageBytes;
  return p;
}

StatusOr<void*> Transport::Listen(int dev, void* handle) {
  if (!Loop().running()) return NotInitialized();
  if (dev != 0)
    return InvalidArgumentError("listen on device " + std::to_string(dev) + "; allowed: 0");
  ListenHandle h;
  h.region = own_region_;
  if (config_.gateway.empty()) {
    h.nonce = RandomId();
    auto comm = std::make_unique<ListenComm>(h.nonce);
    Status st;
    ListenComm* raw = comm.get();
    Loop().RunSync([&] { st = raw->Open(iface_.addr, &h.addr); });
    if (st.ok()) st = EncodeHandle(h, handle);
    if (!st.ok()) {
      Loop().RunSync([&] { comm.release()->BeginClose(); });
      return st;
    }
    return Register(comm.release());
  }
  // Cross-region capable: a pre-opened listener (the pool above), so no gateway round trip here.
  const std::string& path = config_.gateway;
  StatusOr<std::pair<ListenComm*, ListenComm::TunnelInfo>> taken =
      TakeFromListenPool(std::min(config_.connect_timeout_ns, kGatewayListenWaitNs));
  if (!taken.ok()) return taken.status().WithContext("listen (STRAIT_GATEWAY=" + path + ")");
  ListenComm* raw = taken->first;
  const ListenComm::TunnelInfo& tunnel = taken->second;
  Status st;
  if (!own_region_.empty() && tunnel.region != own_region_) {
    st = InvalidArgumentError("this rank's region is " + own_region_ + " but the gateway at " +
                              path + " (STRAIT_GATEWAY) serves region " + tunnel.region +
                              ": set STRAIT_REGION to the region of the rank's own straitd");
  } else if (tunnel.region.empty() || tunnel.region.size() > 63) {
    st = InvalidArgumentError("the gateway at " + path + " reports region \"" + tunnel.region +
                              "\", which does not fit a listen handle (1-63 bytes)");
  } else {
    h.nonce = raw->nonce();
    h.addr = raw->bound();
    h.region = tunnel.region;
    h.tunnel = true;
    h.gateway_shard = tunnel.shard;
    h.listen_id = tunnel.listen_id;
    st = EncodeHandle(h, handle);
  }
  if (!st.ok()) {
    Loop().Post([raw] { raw->BeginClose(); });
    return st;
  }
  return Register(raw);
}

StatusOr<void*> Transport::Connect(int dev, void* handle) {
  if (!Loop().running()) return NotInitialized();
  if (dev != 0)
    return InvalidArgumentError("connect on device " + std::to_string(dev) + "; allowed: 0");
  const uint64_t scratch = ReadScratch(handle);
  if (scratch != 0) {
    SendComm* comm = nullptr;
    int state = SendComm::kConnecting;
    {
      std::lock_guard<std::mutex> lock(Reg().mu);
      auto it = Reg().connecting.find(scratch);
      if (it == Reg().connecting.end()) {
        return InvalidArgumentError(
            "connect() got a handle that names an unknown connection attempt: pass the handle "
            "exactly as the peer's listen() filled it");
      }
      comm = it->second;
      state = comm->state();
      if (state == SendComm::kConnecting) {
        if (!comm->TimedOut(config_.connect_timeout_ns)) return static_cast<void*>(nullptr);
        // Never a hang without a deadline: a listener that accepted the sockets but never
        // answered (a stuck or foreign process) ends the attempt with an error.
        Reg().connecting.erase(it);
        WriteScratch(handle, 0);
        Loop().Post([comm] { comm->BeginClose(); });
        return DeadlineExceededError(
            "no answer from " + comm->peer() + " within " +
            FormatDuration(config_.connect_timeout_ns) +
            " (STRAIT_CONNECT_TIMEOUT): is the receiving rank alive, and is that address "
            "reachable from here (STRAIT_SOCKET_IFNAME)?");
      }
      Reg().connecting.erase(it);
      if (state == SendComm::kReady) Reg().comms.insert(static_cast<Comm*>(comm));
    }
    // This attempt is over: the same buffer may start a new one.
    WriteScratch(handle, 0);
    if (state == SendComm::kReady) return static_cast<void*>(static_cast<Comm*>(comm));
    Status err = comm->error();
    Loop().Post([comm] { comm->BeginClose(); });
    return err;
  }
  STRAIT_ASSIGN_OR_RETURN(ListenHandle h, DecodeHandle(handle));
  std::string gateway;
  if (!own_region_.empty() && !h.region.empty() && h.region != own_region_) {
    if (config_.gateway.empty()) {
      return UnimplementedError("peer " + Describe(h.addr) + " is in region " + h.region +
                                " and this rank in " + own_region_ +
                                ": cross-region connections need straitd's tunnel: set "
                                "STRAIT_GATEWAY to the local straitd's socket on every rank");
    }
    if (!h.tunnel) {
      return FailedPreconditionError(
          "peer " + Describe(h.addr) + " is in region " + h.region + " and this rank in " +
          own_region_ +
          ", but its listen handle has no gateway tunnel: set STRAIT_GATEWAY on the ranks of " +
          h.region + " too");
    }
    gateway = config_.gateway;
  }
  const int64_t timeout_ms = config_.connect_timeout_ns / 1000000;
  SendComm* raw = std::make_unique<SendComm>(
                      h, config_.nsocks, gateway,
                      static_cast<uint32_t>(std::min<int64_t>(timeout_ms, UINT32_MAX)))
                      .release();
  const uint64_t id = RandomId();
  {
    std::lock_guard<std::mutex> lock(Reg().mu);
    Reg().connecting[id] = raw;
  }
  WriteScratch(handle, id);
  Loop().Post([raw] { raw->StartConnect(); });
  return static_cast<void*>(nullptr);
}

StatusOr<void*> Transport::Accept(void* listen_comm) {
  STRAIT_ASSIGN_OR_RETURN(ListenComm * listen, As<ListenComm>(listen_comm, "accept"));
  RecvComm* c = listen->PopReady();
  if (c == nullptr) return static_cast<void*>(nullptr);
  return Register(c);
}

StatusOr<void*> Transport::RegMr(void* comm, void* data, size_t size, int type) {
  if (!IsComm(comm)) return InvalidArgumentError("regMr on an unknown or closed comm");
  if (type != kNcclPtrHost) {
    return InvalidArgumentError("regMr with pointer type " + std::to_string(type) +
                                "; allowed: NCCL_PTR_HOST (this build supports host memory only)");
  }
  auto mr = std::make_unique<MemoryRegion>();
  mr->magic = kMrMagic;
  mr->data = data;
  mr->size = size;
  std::lock_guard<std::mutex> lock(Reg().mu);
  Reg().regions.insert(mr.get());
  return static_cast<void*>(mr.release());
}

Status Transport::DeregMr(void* comm, void* mhandle) {
  if (!IsComm(comm)) return InvalidArgumentError("deregMr on an unknown or closed comm");
  {
    std::lock_guard<std::mutex> lock(Reg().mu);
    if (Reg().regions.erase(mhandle) == 0) {
      return InvalidArgumentError("deregMr got a handle that regMr did not return");
    }
  }
  std::unique_ptr<MemoryRegion>{static_cast<MemoryRegion*>(mhandle)}.reset();
  return Status::Ok();
}

StatusOr<void*> Transport::Isend(void* send_comm, const void* data, size_t size, int tag) {
  STRAIT_ASSIGN_OR_RETURN(SendComm * comm, As<SendComm>(send_comm, "isend"));
  if (comm->failed()) return comm->error();
  if (size > kMaxMessageBytes) {
    return InvalidArgumentError("isend of " + std::to_string(size) + " bytes; allowed: at most " +
                                std::to_string(kMaxMessageBytes) + " (maxP2pBytes)");
  }
  if (size > 0 && data == nullptr) {
    return InvalidArgumentError("isend of " + std::to_string(size) + " bytes from NULL");
  }
  Request* r = comm->Acquire();
  if (r == nullptr) return static_cast<void*>(nullptr);
  r->sizes[0] = size;
  Loop().Post([comm, r, data, size, tag] { comm->Enqueue(r, data, size, tag); });
  return static_cast<void*>(r);
}

StatusOr<void*> Transport::Irecv(void* recv_comm, int n, void* const* data, const size_t* sizes,
                                 const int* tags) {
  STRAIT_ASSIGN_OR_RETURN(RecvComm * comm, As<RecvComm>(recv_comm, "irecv"));
  if (comm->failed()) return comm->error();
  if (n < 1 || n > kMaxRecvs) {
    return InvalidArgumentError("irecv of " + std::to_string(n) + " buffers; allowed: 1-" +
                                std::to_string(kMaxRecvs) + " (maxRecvs)");
  }
  RecvGroup g;
  g.n = n;
  for (int i = 0; i < n; ++i) {
    g.data[i] = static_cast<char*>(data[i]);
    g.cap[i] = sizes[i];
    g.tags[i] = tags[i];
    if (sizes[i] > 0 && data[i] == nullptr) {
      return InvalidArgumentError("irecv buffer " + std::to_string(i) + " is NULL with size " +
                                  std::to_string(sizes[i]));
    }
  }
  Request* r = comm->Acquire();
  if (r == nullptr) return static_cast<void*>(nullptr);
  g.req = r;
  r->count = n;
  Loop().Post([comm, g] { comm->Post(g); });
  return static_cast<void*>(r);
}

StatusOr<void*> Transport::Iflush(void* recv_comm) {
  STRAIT_ASSIGN_OR_RETURN(RecvComm * comm, As<RecvComm>(recv_comm, "iflush"));
  Request* r = comm->Acquire();
  if (r == nullptr) return static_cast<void*>(nullptr);
  r->count = 0;
  r->Complete();
  return static_cast<void*>(r);
}

Status Transport::Test(void* request, bool* done, size_t* sizes, int* count) {
  if (request == nullptr || static_cast<const Request*>(request)->magic != kRequestMagic) {
    return InvalidArgumentError("test() on something that is not a Strait request");
  }
  auto* req = static_cast<Request*>(request);
  const int state = req->state.load(std::memory_order_acquire);
  if (state == Request::kPending) {
    *done = false;
    return Status::Ok();
  }
  if (state == Request::kFree) {
    return InvalidArgumentError(
        "test() on a request that already completed (or was never "
        "returned by isend/irecv)");
  }
  *done = true;
  *count = req->count;
  if (sizes != nullptr) std::copy(req->sizes, req->sizes + req->count, sizes);
  Status err = state == Request::kFailed ? req->error : Status::Ok();
  req->comm->Release(req);
  return err;
}

Status Transport::CloseSend(void* send_comm) {
  return Close<SendComm>(send_comm, "closeSend");
}
Status Transport::CloseRecv(void* recv_comm) {
  return Close<RecvComm>(recv_comm, "closeRecv");
}
Status Transport::CloseListen(void* listen_comm) {
  return Close<ListenComm>(listen_comm, "closeListen");
}

}  // namespace strait::nccl

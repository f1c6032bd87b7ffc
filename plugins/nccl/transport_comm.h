// The pieces every comm of the point-to-point transport shares (internal to transport*.cc):
// requests, memory registrations, the Socket a comm reads and writes, the Comm base class with its
// request pool and close protocol, and the libuv callbacks that route a socket's reads to its
// owner. The three comm kinds live in recv_comm.h, listen_comm.h and send_comm.h; the NCCL-facing
// operations in transport.cc.
//
// Memory rules, libuv's: a handle (Socket, the listener) is freed only in its close callback; a
// comm is freed on the loop thread once NCCL has closed it AND every handle it owns has finished
// closing, so no callback ever sees a freed owner. Objects handed to NCCL are released
// unique_ptrs; the loop takes them back when it frees them.
//
// Threading: everything marked "loop side" runs on the plugin's libuv thread (event_loop.h) only;
// Acquire/Release/failed/error may be called from any thread.
#ifndef STRAIT_PLUGINS_NCCL_TRANSPORT_COMM_H_
#define STRAIT_PLUGINS_NCCL_TRANSPORT_COMM_H_

#include <sys/socket.h>
#include <uv.h>

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "plugins/nccl/event_loop.h"
#include "plugins/nccl/handle.h"
#include "plugins/nccl/transport.h"
#include "strait/status.h"

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

// The plugin's one libuv loop (never destroyed: see Transport::Get).
EventLoop& Loop();
// "host:port" ("[v6]:port") of an address, for messages.
std::string Describe(const sockaddr_storage& a);
// A random non-zero id (listener nonces, connection ids, connect scratch ids). Thread-safe.
uint64_t RandomId();
// A libuv error code as "NAME (text)".
std::string UvError(int rc);

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

// libuv callbacks shared by every comm kind: buffers and reads go to the socket's owner (or to
// the gateway control reader while a gateway connection is between control frames).
void OnAllocCb(uv_handle_t* h, size_t suggested, uv_buf_t* buf);
void OnReadCb(uv_stream_t* stream, ssize_t n, const uv_buf_t* buf);
// Completion of a hello or reply write: nothing to do (a failure surfaces as a read error).
void OnCtlWriteCb(uv_write_t* req, int status);

}  // namespace strait::nccl

#endif  // STRAIT_PLUGINS_NCCL_TRANSPORT_COMM_H_

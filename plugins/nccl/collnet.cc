// CollNet over straitd's region all-reduce (see collnet.h). The plugin speaks the local protocol's
// frames itself (lib/gateway/local_protocol.h documents the layout) so that it does not link the
// gateway module: a few fixed message types, written and parsed here.
#include "plugins/nccl/collnet.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <deque>
#include <exception>
#include <map>
#include <memory>
#include <mutex>
#include <new>
#include <random>
#include <set>
#include <thread>
#include <utility>

#include "common/clock.h"
#include "common/endian.h"
#include "plugins/nccl/api.h"
#include "plugins/nccl/config.h"
#include "plugins/nccl/transport.h"
#include "strait/types.h"

namespace strait::nccl {
namespace {

uint32_t Fnv1a32(const uint8_t* p, size_t n) {
  uint32_t h = 2166136261u;
  for (size_t i = 0; i < n; ++i) {
    h ^= p[i];
    h *= 16777619u;
  }
  return h;
}

// splitmix64's finaliser: the comm id must be the same on every node head, whatever its build.
uint64_t Mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

std::string Hex64(uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof(buf), "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

constexpr const char* kCompressionNames[] = {"auto", "none", "zstd", "int8", "int4", "fp8"};

// Handle layout (collnet.h).
constexpr size_t kHandleRegionOffset = 32;
constexpr size_t kHandleRegionMax = 63;
constexpr size_t kHandleChecksumOffset = 96;

// ---- local protocol frames (lib/gateway/local_protocol.h) --------------------------------------

constexpr uint32_t kLocalProtocolMagic = 0x504C5453;  // "STLP"
constexpr uint16_t kLocalProtocolVersion = 2;
enum : uint8_t {
  kHello = 1,
  kRegisterJob = 2,
  kTunnelListen = 5,
  kRegionAllReduce = 10,
  kJoinJob = 12,
  kReply = 128,
};
constexpr uint32_t kMaxReplyBody = 256u << 20;  // the protocol's default frame cap
constexpr size_t kMaxReplyText = 16384;
constexpr int64_t kNanosPerMs = 1'000'000;
// A region all-reduce is bounded by the gateway's allreduce.deadline (timeout_ms 0 asks for it);
// the plugin gives up on its own only if a gateway neither answers nor closes the connection.
constexpr double kOperationWatchdogSeconds = 3600;
// Local round trips of listen (hello, register-job, tunnel-listen): milliseconds normally.
constexpr double kLocalCallSeconds = 10;

class Body {
 public:
  explicit Body(uint8_t type) { out_.push_back(type); }
  void U8(uint8_t v) { out_.push_back(v); }
  void Le(uint64_t v, int n) { AppendLe(&out_, v, static_cast<size_t>(n)); }
  void Str(const std::string& s) {
    Le(s.size(), 2);
    out_.insert(out_.end(), s.begin(), s.end());
  }
  // The frame: the 4-byte length of the body plus `extra` bytes that the caller sends after it.
  std::vector<uint8_t> Frame(size_t extra = 0) const {
    std::vector<uint8_t> f(4);
    PutLe(f.data(), out_.size() + extra, 4);
    f.insert(f.end(), out_.begin(), out_.end());
    return f;
  }

 private:
  std::vector<uint8_t> out_;
};

// A blocking connection to the local straitd over a non-blocking Unix socket: every wait is a
// poll() bounded by a deadline, and Shutdown() from another thread ends any wait at once.
class GatewayConnection {
 public:
  static StatusOr<std::unique_ptr<GatewayConnection>> Open(const std::string& path,
                                                           Deadline deadline) {
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    if (path.size() >= sizeof(addr.sun_path)) {
      return InvalidArgumentError("STRAIT_GATEWAY=\"" + path + "\" is too long for a Unix socket");
    }
    std::memcpy(addr.sun_path, path.data(), path.size());
    const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return InternalError(std::string("socket(AF_UNIX): ") + std::strerror(errno));
    if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
      const int err = errno;
      ::close(fd);
      return UnavailableError("cannot reach straitd at STRAIT_GATEWAY=\"" + path +
                              "\": " + std::strerror(err) +
                              "; start the node's straitd or fix STRAIT_GATEWAY");
    }
    ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK);
    std::unique_ptr<GatewayConnection> c(new GatewayConnection(fd, path));
    Body hello(kHello);
    hello.Le(kLocalProtocolMagic, 4);
    hello.Le(kLocalProtocolVersion, 2);
    hello.Str("nccl-collnet");
    STRAIT_RETURN_IF_ERROR(c->Send(hello.Frame(), nullptr, 0, deadline));
    STRAIT_ASSIGN_OR_RETURN(Reply r, c->ReadReply(kHello, nullptr, 0, deadline));
    STRAIT_RETURN_IF_ERROR(r.status);
    return c;
  }

  ~GatewayConnection() { ::close(fd_); }
  GatewayConnection(const GatewayConnection&) = delete;
  GatewayConnection& operator=(const GatewayConnection&) = delete;

  // Wakes every wait of this connection (they fail); the fd stays open until destruction.
  void Shutdown() { ::shutdown(fd_, SHUT_RDWR); }

  // Returns the policy the gateway resolved.
  StatusOr<std::string> RegisterJob(const std::string& job, const std::string& policy,
                                    Deadline deadline) {
    Body b(kRegisterJob);
    b.Str(job);
    b.Str(policy);
    STRAIT_RETURN_IF_ERROR(Send(b.Frame(), nullptr, 0, deadline));
    STRAIT_ASSIGN_OR_RETURN(Reply r, ReadReply(kRegisterJob, nullptr, 0, deadline));
    STRAIT_RETURN_IF_ERROR(r.status);
    return r.text;
  }

  // Which region and shard index the gateway serves, from a tunnel listen's kListening event
  // (the documented way to learn them). The connection belongs to the listen afterwards: close it.
  Status ProbeRegionAndShard(Deadline deadline, std::string* region, uint32_t* shard) {
    Body b(kTunnelListen);
    STRAIT_RETURN_IF_ERROR(Send(b.Frame(), nullptr, 0, deadline));
    STRAIT_ASSIGN_OR_RETURN(Reply r, ReadReply(kTunnelListen, nullptr, 0, deadline));
    STRAIT_RETURN_IF_ERROR(r.status);
    // TunnelEvent: u8 kind (1 = listening), u64 id, u32 shard, string region.
    const std::vector<uint8_t>& d = r.data;
    if (d.size() < 15 || d[0] != 1) {
      return DataLossError("straitd at " + path_ + " answered the tunnel listen with an event of " +
                           std::to_string(d.size()) + " bytes that is not a listening event");
    }
    *shard = static_cast<uint32_t>(GetLe(&d[9], 4));
    const size_t len = static_cast<size_t>(GetLe(&d[13], 2));
    if (d.size() != 15 + len) return DataLossError("straitd's listening event has a bad region");
    region->assign(reinterpret_cast<const char*>(&d[15]), len);
    return Status::Ok();
  }

  // Joins the next generation of (job, scope) with the other regions' gateways (kJoinJob):
  // the comm's operations are numbered within it.
  StatusOr<uint64_t> JoinJob(const std::string& job, uint64_t scope, uint32_t timeout_ms,
                             Deadline deadline) {
    Body b(kJoinJob);
    b.Str(job);
    b.Le(scope, 8);
    b.Le(timeout_ms, 4);
    b.Le(0, 8);  // resume: unknown (NCCL does not tell the plugin which steps it completed)
    STRAIT_RETURN_IF_ERROR(Send(b.Frame(), nullptr, 0, deadline));
    STRAIT_ASSIGN_OR_RETURN(Reply r, ReadReply(kJoinJob, nullptr, 0, deadline));
    STRAIT_RETURN_IF_ERROR(r.status);
    if (r.data.size() != 8 || GetLe(r.data.data(), 8) == 0) {
      return DataLossError("straitd at " + path_ + " answered join-job without a generation");
    }
    return GetLe(r.data.data(), 8);
  }

  // The identity of one region all-reduce (local_protocol.h, "Operation identity").
  struct Identity {
    uint64_t generation = 0;
    uint64_t sequence = 0;
    uint64_t scope = 0;
  };

  // One region all-reduce: `count` elements from `send` into `recv` (may be the same buffer).
  Status RegionAllReduce(const std::string& job, const std::string& key, DataType dtype,
                         ReduceOp op, const void* send, void* recv, size_t count,
                         uint32_t timeout_ms, const Identity& id, Deadline deadline) {
    const size_t bytes = count * DataTypeSize(dtype);
    Body b(kRegionAllReduce);
    b.Str(job);
    b.Str(key);
    b.U8(static_cast<uint8_t>(dtype));
    b.U8(static_cast<uint8_t>(op));
    b.Le(count, 8);
    b.Le(timeout_ms, 4);
    b.Le(id.generation, 8);
    b.Le(id.sequence, 8);
    b.Le(id.scope, 8);
    STRAIT_RETURN_IF_ERROR(Send(b.Frame(bytes), send, bytes, deadline));
    STRAIT_ASSIGN_OR_RETURN(Reply r, ReadReply(kRegionAllReduce, recv, bytes, deadline));
    return r.status;
  }

 private:
  struct Reply {
    Status status;  // the gateway's answer (its code and message)
    std::string text;
    std::vector<uint8_t> data;  // unless it went straight to the caller's buffer
  };

  GatewayConnection(int fd, std::string path) : fd_(fd), path_(std::move(path)) {}

  Status Lost(const std::string& what) const {
    return UnavailableError("connection to straitd at " + path_ + " lost: " + what);
  }

  // Waits until the socket is ready for `events`; kDeadlineExceeded after `deadline`.
  Status Wait(short events, Deadline deadline) {
    while (true) {
      const int64_t left = deadline.RemainingNanos();
      if (left <= 0) {
        return DeadlineExceededError("straitd at " + path_ + " did not answer in time");
      }
      pollfd p{fd_, events, 0};
      const int ms = static_cast<int>(std::min<int64_t>(left / kNanosPerMs + 1, 1000));
      const int rc = ::poll(&p, 1, ms);
      if (rc < 0 && errno != EINTR) return Lost(std::string("poll: ") + std::strerror(errno));
      if (rc > 0) return Status::Ok();
    }
  }

  // Writes `head` then `size` bytes at `data`.
  Status Send(const std::vector<uint8_t>& head, const void* data, size_t size, Deadline deadline) {
    size_t done = 0;
    const size_t total = head.size() + size;
    while (done < total) {
      iovec iov[2];
      int n = 0;
      if (done < head.size()) {
        iov[n++] = {const_cast<uint8_t*>(head.data()) + done, head.size() - done};
        if (size > 0) iov[n++] = {const_cast<void*>(data), size};
      } else {
        iov[n++] = {static_cast<uint8_t*>(const_cast<void*>(data)) + (done - head.size()),
                    total - done};
      }
      msghdr msg{};
      msg.msg_iov = iov;
      msg.msg_iovlen = static_cast<size_t>(n);
      // MSG_NOSIGNAL: a gateway that went away must be an error, not a SIGPIPE in a training job.
      const ssize_t w = ::sendmsg(fd_, &msg, MSG_NOSIGNAL);
      if (w > 0) {
        done += static_cast<size_t>(w);
      } else if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) {
        STRAIT_RETURN_IF_ERROR(Wait(POLLOUT, deadline));
      } else {
        return Lost(w < 0 ? std::strerror(errno) : "write returned 0");
      }
    }
    return Status::Ok();
  }

  Status Receive(void* out, size_t size, Deadline deadline) {
    size_t done = 0;
    while (done < size) {
      const ssize_t r = ::recv(fd_, static_cast<uint8_t*>(out) + done, size - done, 0);
      if (r > 0) {
        done += static_cast<size_t>(r);
      } else if (r == 0) {
        return Lost("straitd closed the connection");
      } else if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) {
        STRAIT_RETURN_IF_ERROR(Wait(POLLIN, deadline));
      } else {
        return Lost(std::strerror(errno));
      }
    }
    return Status::Ok();
  }

  // Reads one reply frame to a request of type `expect`. A successful reply's data goes straight
  // to `sink` when it is exactly `sink_size` bytes (the all-reduce result); otherwise into
  // Reply::data (and an all-reduce result of the wrong size is an error).
  StatusOr<Reply> ReadReply(uint8_t expect, void* sink, size_t sink_size, Deadline deadline) {
    uint8_t head[12];  // length, type, reply_to, code, text length
    STRAIT_RETURN_IF_ERROR(Receive(head, sizeof(head), deadline));
    const uint64_t length = GetLe(head, 4);
    if (length < 8 || length > kMaxReplyBody || head[4] != kReply) {
      return DataLossError("straitd at " + path_ + " sent a frame that is not a reply (type " +
                           std::to_string(head[4]) + ", " + std::to_string(length) + " bytes)");
    }
    const uint8_t reply_to = head[5];
    const uint32_t code = static_cast<uint32_t>(GetLe(head + 6, 4));
    const size_t text_len = static_cast<size_t>(GetLe(head + 10, 2));
    if (text_len > kMaxReplyText || 8 + text_len > length) {
      return DataLossError("straitd at " + path_ + " sent a reply with a bad text length");
    }
    Reply r;
    r.text.resize(text_len);
    STRAIT_RETURN_IF_ERROR(Receive(r.text.data(), text_len, deadline));
    const size_t data_len = static_cast<size_t>(length - 8 - text_len);
    if (code > static_cast<uint32_t>(StatusCode::kDataLoss)) {
      return DataLossError("straitd at " + path_ + " answered with unknown status code " +
                           std::to_string(code));
    }
    const bool ok = code == 0;
    if (ok && sink != nullptr && data_len == sink_size) {
      STRAIT_RETURN_IF_ERROR(Receive(sink, data_len, deadline));
    } else {
      r.data.resize(data_len);
      STRAIT_RETURN_IF_ERROR(Receive(r.data.data(), data_len, deadline));
      if (ok && sink != nullptr) {
        return DataLossError("straitd at " + path_ + " returned " + std::to_string(data_len) +
                             " bytes for a " + std::to_string(sink_size) + "-byte all-reduce");
      }
    }
    if (reply_to != expect && ok) {
      return DataLossError("straitd at " + path_ + " answered request type " +
                           std::to_string(expect) + " with a reply to type " +
                           std::to_string(reply_to));
    }
    if (!ok) {
      r.status = Status(static_cast<StatusCode>(code), "straitd at " + path_ + ": " + r.text);
    }
    return r;
  }

  const int fd_;
  const std::string path_;
};

// ---- comms and requests -------------------------------------------------------------------------

constexpr uint32_t kListenMagic = 0x4C4E4353;   // "SCNL"
constexpr uint32_t kCommMagic = 0x434E4353;     // "SCNC"
constexpr uint32_t kRequestMagic = 0x524E4353;  // "SCNR"
constexpr uint32_t kMrMagic = 0x4D4E4353;       // "SCNM"

struct ListenComm {
  uint32_t magic = kListenMagic;
  CollNetHandle handle;
  PluginConfig config;
  std::string gateway_region;
};

struct CollComm;

struct Request {
  uint32_t magic = kRequestMagic;
  // 0 pending, 1 done, 2 failed; set last by the worker (release), read by test() (acquire).
  std::atomic<int> state{0};
  Status status;
  size_t bytes = 0;
  CollComm* comm = nullptr;  // null for iflush requests (never queued)
  uint64_t index = 0;
  const void* send = nullptr;
  void* recv = nullptr;
  size_t count = 0;
  DataType dtype = DataType::kFloat32;
  ReduceOp op = ReduceOp::kSum;
};

struct MemoryHandle {
  uint32_t magic = kMrMagic;
};

struct Slot {
  std::unique_ptr<GatewayConnection> conn;
  std::deque<Request*> queue;
  std::thread thread;
  uint64_t pieces = 0;  // region all-reduces this slot ran (its part of the comm's sequence)
};

struct CollComm {
  uint32_t magic = kCommMagic;
  std::string job;
  std::string id;  // hex comm id: part of every tensor key
  int rank = 0;
  int nranks = 0;
  std::mutex mu;
  std::condition_variable cv;
  bool closing = false;
  Status failure;  // the first failed operation's status: later ones fail with it
  uint64_t next_op = 0;
  // The generation the comm joined and its scope (its comm id): every region all-reduce of the
  // comm carries them, with sequence 0 for the connect barrier and 1 + k * kCollNetSlots + slot
  // for a slot's k-th piece, the same on every node head since each slot runs the same requests.
  uint64_t generation = 0;
  uint64_t scope = 0;
  std::set<Request*> live;  // handed to NCCL and not yet released by test()
  Slot slots[kCollNetSlots];
};

// Live comms: a pointer from NCCL is dereferenced only once found here.
std::mutex g_mu;
std::set<void*>* g_listens = new std::set<void*>();
std::set<void*>* g_comms = new std::set<void*>();

bool IsListen(void* p) {
  std::lock_guard<std::mutex> lock(g_mu);
  return g_listens->count(p) > 0;
}
bool IsComm(void* p) {
  std::lock_guard<std::mutex> lock(g_mu);
  return g_comms->count(p) > 0;
}

uint64_t RandomNonce() {
  static std::mutex mu;
  static std::mt19937_64* gen = new std::mt19937_64(std::random_device{}());
  std::lock_guard<std::mutex> lock(mu);
  uint64_t v = 0;
  while (v == 0) v = (*gen)();
  return v;
}

// Runs one request on the slot's connection: pieces of at most kCollNetPieceBytes, in order.
Status RunOperation(CollComm& comm, Slot& slot, int slot_index, Request& req) {
  const std::string key = "collnet/" + comm.id + "/" + std::to_string(slot_index);
  const size_t elem = DataTypeSize(req.dtype);
  const size_t per_piece = std::max<size_t>(1, kCollNetPieceBytes / elem);
  size_t at = 0;
  while (at < req.count) {
    const size_t n = std::min(per_piece, req.count - at);
    const GatewayConnection::Identity id{
        comm.generation, 1 + slot.pieces++ * kCollNetSlots + static_cast<uint64_t>(slot_index),
        comm.scope};
    Status s = slot.conn->RegionAllReduce(
        comm.job, key, req.dtype, req.op, static_cast<const uint8_t*>(req.send) + at * elem,
        static_cast<uint8_t*>(req.recv) + at * elem, n, /*timeout_ms=*/0, id,
        Deadline::AfterSeconds(kOperationWatchdogSeconds));
    if (!s.ok()) {
      return s.WithContext("CollNet all-reduce #" + std::to_string(req.index) + " (" +
                           std::to_string(req.count) + " x " + DataTypeName(req.dtype) + " " +
                           ReduceOpName(req.op) + ", key " + key + ")");
    }
    at += n;
  }
  return Status::Ok();
}

void WorkerLoop(CollComm* comm, int slot_index) {
  Slot& slot = comm->slots[slot_index];
  while (true) {
    Request* req = nullptr;
    Status failed;
    {
      std::unique_lock<std::mutex> lock(comm->mu);
      comm->cv.wait(lock, [&] { return comm->closing || !slot.queue.empty(); });
      if (comm->closing) return;
      req = slot.queue.front();
      slot.queue.pop_front();
      failed = comm->failure;
    }
    Status s = failed.ok()
                   ? RunOperation(*comm, slot, slot_index, *req)
                   : failed.WithContext("an earlier CollNet all-reduce of this comm failed");
    std::lock_guard<std::mutex> lock(comm->mu);
    if (!s.ok() && comm->failure.ok()) comm->failure = s;
    req->status = s;
    req->state.store(s.ok() ? 1 : 2, std::memory_order_release);
  }
}

Status LoadConfig(PluginConfig* config) {
  STRAIT_ASSIGN_OR_RETURN(*config, ParseConfig(ProcessEnv()));
  if (config->gateway.empty()) {
    return FailedPreconditionError(
        "CollNet needs STRAIT_GATEWAY (the node's straitd socket) and STRAIT_JOB_ID; set both, "
        "or unset NCCL_COLLNET_ENABLE (NCCL then runs all-reduce over the net plugin)");
  }
  if (config->job_id.empty()) {
    return FailedPreconditionError(
        "CollNet needs STRAIT_JOB_ID (the job's name at straitd, the same on every rank); set "
        "it, or unset NCCL_COLLNET_ENABLE");
  }
  return Status::Ok();
}

Status DoListen(int dev, void* handle, void** listen_comm) {
  if (handle == nullptr) return InvalidArgumentError("handle is NULL");
  if (listen_comm == nullptr) return InvalidArgumentError("listenComm is NULL");
  *listen_comm = nullptr;
  const int ndev = Transport::Get().Devices();
  if (ndev <= 0) return FailedPreconditionError("listen() before a successful init()");
  if (dev < 0 || dev >= ndev) {
    return InvalidArgumentError("device " + std::to_string(dev) + " does not exist; devices: 0-" +
                                std::to_string(ndev - 1));
  }
  auto lc = std::make_unique<ListenComm>();
  STRAIT_RETURN_IF_ERROR(LoadConfig(&lc->config));
  const PluginConfig& cfg = lc->config;
  STRAIT_ASSIGN_OR_RETURN(lc->handle.compression, CollNetCompressionCode(cfg.compression));
  const Deadline deadline = Deadline::AfterSeconds(kLocalCallSeconds);
  STRAIT_ASSIGN_OR_RETURN(auto conn, GatewayConnection::Open(cfg.gateway, deadline));
  // Error feedback is off for lossy policies: it keeps a residual per tensor key and adds it to
  // the key's next operation, but a CollNet key carries whatever chunk NCCL posts next (slot
  // k mod kCollNetSlots), so the residual would land on unrelated data.
  const bool lossy =
      cfg.compression == "int8" || cfg.compression == "int4" || cfg.compression == "fp8";
  const std::string request = cfg.compression + (lossy ? ",noef" : "");
  STRAIT_ASSIGN_OR_RETURN(std::string policy, conn->RegisterJob(cfg.job_id, request, deadline));
  std::string region;
  uint32_t shard = 0;
  STRAIT_RETURN_IF_ERROR(conn->ProbeRegionAndShard(deadline, &region, &shard));
  conn.reset();  // ends the probe's tunnel listen
  if (!cfg.region.empty() && cfg.region != region) {
    return InvalidArgumentError("STRAIT_REGION=\"" + cfg.region + "\" but the straitd at " +
                                cfg.gateway + " serves region \"" + region +
                                "\"; point STRAIT_GATEWAY at this node's straitd");
  }
  if (region.empty() || region.size() > kHandleRegionMax) {
    return DataLossError("straitd at " + cfg.gateway + " reported a region name of " +
                         std::to_string(region.size()) + " bytes");
  }
  lc->handle.nonce = RandomNonce();
  lc->handle.shard = shard;
  lc->handle.job_hash = CollNetJobHash(cfg.job_id);
  lc->handle.region = region;
  lc->gateway_region = region;
  EncodeCollNetHandle(lc->handle, handle);
  api::Info("CollNet listen: straitd " + cfg.gateway + " (region " + region + ", shard " +
            std::to_string(shard) + "), job " + cfg.job_id + ", policy " + policy);
  std::lock_guard<std::mutex> lock(g_mu);
  g_listens->insert(lc.get());
  *listen_comm = lc.release();
  return Status::Ok();
}

// Stops the workers and frees the comm (and requests NCCL never tested).
void DestroyComm(CollComm* comm) {
  {
    std::lock_guard<std::mutex> lock(comm->mu);
    comm->closing = true;
  }
  comm->cv.notify_all();
  for (Slot& slot : comm->slots) {
    if (slot.conn) slot.conn->Shutdown();  // ends a region all-reduce the worker waits in
  }
  for (Slot& slot : comm->slots) {
    if (slot.thread.joinable()) slot.thread.join();
  }
  std::unique_ptr<CollComm> owned(comm);  // handed to NCCL by connect(); taken back here
  for (Request* r : owned->live) {
    std::unique_ptr<Request> request(r);
    request->magic = 0;
  }
  owned->magic = 0;
}

Status DoConnect(void* handles[], int nranks, int rank, void* listen_comm, void** coll_comm) {
  if (coll_comm == nullptr) return InvalidArgumentError("collComm is NULL");
  *coll_comm = nullptr;
  if (handles == nullptr) return InvalidArgumentError("handles is NULL");
  if (nranks < 1 || rank < 0 || rank >= nranks) {
    return InvalidArgumentError("rank " + std::to_string(rank) + " of " + std::to_string(nranks) +
                                " node heads is out of range");
  }
  if (!IsListen(listen_comm)) {
    return InvalidArgumentError("listenComm is not a CollNet listen comm of this plugin");
  }
  const ListenComm& lc = *static_cast<ListenComm*>(listen_comm);
  std::vector<CollNetHandle> decoded;
  for (int i = 0; i < nranks; ++i) {
    if (handles[i] == nullptr) {
      return InvalidArgumentError("handles[" + std::to_string(i) + "] is NULL");
    }
    auto h = DecodeCollNetHandle(handles[i]);
    if (!h.ok()) return h.status().WithContext("node head " + std::to_string(i) + "'s handle");
    decoded.push_back(*h);
  }
  if (decoded[size_t(rank)].nonce != lc.handle.nonce) {
    return InvalidArgumentError("handles[" + std::to_string(rank) +
                                "] is not the handle listen() gave this node head");
  }
  STRAIT_ASSIGN_OR_RETURN(CollNetGroup group, PlanCollNetGroup(decoded));

  auto comm = std::make_unique<CollComm>();
  comm->job = lc.config.job_id;
  comm->id = Hex64(group.comm_id);
  comm->rank = rank;
  comm->nranks = nranks;
  const Deadline local = Deadline::AfterSeconds(kLocalCallSeconds);
  for (Slot& slot : comm->slots) {
    STRAIT_ASSIGN_OR_RETURN(slot.conn, GatewayConnection::Open(lc.config.gateway, local));
  }
  // The barrier: every head adds (1, its rank); each must see (nranks, 0 + 1 + ... + nranks-1).
  // It fails on every head, by the connect timeout at the latest, unless the whole path works.
  const int64_t timeout_ns = lc.config.connect_timeout_ns;
  const uint32_t timeout_ms = static_cast<uint32_t>(std::max<int64_t>(1, timeout_ns / kNanosPerMs));
  int64_t probe[2] = {1, rank};
  const Deadline barrier_deadline =
      Deadline::After(timeout_ns + std::max<int64_t>(timeout_ns / 10, 500 * kNanosPerMs));
  comm->scope = group.comm_id != 0 ? group.comm_id : 1;
  auto generation =
      comm->slots[0].conn->JoinJob(comm->job, comm->scope, timeout_ms, barrier_deadline);
  if (!generation.ok()) {
    return generation.status().WithContext("CollNet connect (joining the job through straitd)");
  }
  comm->generation = *generation;
  Status s = comm->slots[0].conn->RegionAllReduce(
      comm->job, "collnet/" + comm->id + "/connect", DataType::kInt64, ReduceOp::kSum, probe,
      probe, 2, timeout_ms, {comm->generation, 0, comm->scope}, barrier_deadline);
  if (!s.ok()) {
    return s.WithContext("CollNet connect (the node heads' barrier through straitd)");
  }
  const int64_t want_sum = int64_t{nranks} * (nranks - 1) / 2;
  if (probe[0] != nranks || probe[1] != want_sum) {
    return InternalError("CollNet connect barrier returned (" + std::to_string(probe[0]) + ", " +
                         std::to_string(probe[1]) + "), expected (" + std::to_string(nranks) +
                         ", " + std::to_string(want_sum) +
                         "): other processes use this comm's tensor keys");
  }
  CollComm* raw = comm.release();
  for (int i = 0; i < kCollNetSlots; ++i) {
    raw->slots[i].thread = std::thread(WorkerLoop, raw, i);
  }
  {
    std::lock_guard<std::mutex> lock(g_mu);
    g_comms->insert(raw);
  }
  *coll_comm = raw;
  api::Info("CollNet comm " + raw->id + ": node head " + std::to_string(rank) + " of " +
            std::to_string(nranks) + " (" + std::to_string(group.regions) + " regions x " +
            std::to_string(group.heads_per_region) + " heads), job " + raw->job + ", region " +
            lc.gateway_region + " shard " + std::to_string(lc.handle.shard));
  return Status::Ok();
}

Status DoIallreduce(void* coll_comm, void* send, void* recv, size_t count, int dtype, int op,
                    void** request) {
  if (request == nullptr) return InvalidArgumentError("request is NULL");
  *request = nullptr;
  if (!IsComm(coll_comm)) return InvalidArgumentError("collComm is not a CollNet comm");
  if (!CollNetReduceSupported(dtype, op)) {
    return InvalidArgumentError("iallreduce of data type " + std::to_string(dtype) + " with op " +
                                std::to_string(op) +
                                " is not supported (reduceSupport answered 0 for it)");
  }
  const size_t elem = DataTypeSize(static_cast<DataType>(dtype));
  if (count > SIZE_MAX / elem) return InvalidArgumentError("iallreduce count overflows");
  if (count > 0 && (send == nullptr || recv == nullptr)) {
    return InvalidArgumentError("iallreduce buffer is NULL");
  }
  CollComm& comm = *static_cast<CollComm*>(coll_comm);
  auto req = std::make_unique<Request>();
  req->send = send;
  req->recv = recv;
  req->count = count;
  req->dtype = static_cast<DataType>(dtype);
  req->op = static_cast<ReduceOp>(op);
  req->bytes = count * elem;
  std::lock_guard<std::mutex> lock(comm.mu);
  if (!comm.failure.ok()) {
    return comm.failure.WithContext("an earlier CollNet all-reduce of this comm failed");
  }
  if (comm.live.size() >= kCollNetMaxRequests) return Status::Ok();  // NULL: NCCL retries
  req->comm = &comm;
  req->index = comm.next_op++;
  // Slot and key from the posting index: the same on every node head (collnet.h).
  Slot& slot = comm.slots[req->index % kCollNetSlots];
  if (count == 0) {
    req->state.store(1, std::memory_order_release);  // nothing to reduce, nothing to send
  } else {
    slot.queue.push_back(req.get());
  }
  comm.live.insert(req.get());
  *request = req.release();
  comm.cv.notify_all();
  return Status::Ok();
}

Status DoTest(void* request, int* done, int* size) {
  if (done == nullptr) return InvalidArgumentError("done is NULL");
  *done = 0;
  if (request == nullptr) return InvalidArgumentError("request is NULL");
  Request* req = static_cast<Request*>(request);
  if (req->magic != kRequestMagic) {
    return InvalidArgumentError("request is not a live CollNet request of this plugin");
  }
  const int state = req->state.load(std::memory_order_acquire);
  if (state == 0) return Status::Ok();
  std::unique_ptr<Request> owned(req);
  owned->magic = 0;
  if (owned->comm != nullptr) {
    std::lock_guard<std::mutex> lock(owned->comm->mu);
    owned->comm->live.erase(req);
  }
  *done = 1;
  if (state == 2) return owned->status;
  if (size != nullptr) {
    *size = static_cast<int>(std::min<size_t>(owned->bytes, static_cast<size_t>(INT32_MAX)));
  }
  return Status::Ok();
}

// Runs `fn`, never letting an exception out; WARNs and maps errors (as api.cc does).
template <typename F>
ncclResult_t Guard(const char* call, F&& fn) {
  try {
    Status s = fn();
    if (s.ok()) return ncclSuccess;
    api::Warn(call, s.message());
    return api::ToNcclResult(s);
  } catch (const std::bad_alloc&) {
    api::Warn(call, "out of memory");
    return ncclSystemError;
  } catch (const std::exception& e) {
    api::Warn(call, std::string("internal error: ") + e.what());
    return ncclInternalError;
  } catch (...) {
    api::Warn(call, "internal error: unknown exception");
    return ncclInternalError;
  }
}

}  // namespace

// ---- handle, group plan, support ----------------------------------------------------------------

void EncodeCollNetHandle(const CollNetHandle& h, void* out) {
  uint8_t* p = static_cast<uint8_t*>(out);
  std::memset(p, 0, kNcclNetHandleMaxSize);
  const size_t region_len = std::min(h.region.size(), kHandleRegionMax);
  PutLe(p + 0, kCollNetHandleMagic, 4);
  PutLe(p + 4, kCollNetHandleVersion, 2);
  p[6] = static_cast<uint8_t>(region_len);
  p[7] = h.compression;
  PutLe(p + 8, h.nonce, 8);
  PutLe(p + 16, h.shard, 4);
  PutLe(p + 24, h.job_hash, 8);
  std::memcpy(p + kHandleRegionOffset, h.region.data(), region_len);
  PutLe(p + kHandleChecksumOffset, Fnv1a32(p, kHandleChecksumOffset), 4);
}

StatusOr<CollNetHandle> DecodeCollNetHandle(const void* in) {
  const uint8_t* p = static_cast<const uint8_t*>(in);
  if (GetLe(p, 4) != kCollNetHandleMagic) {
    return InvalidArgumentError("not a Strait CollNet handle (bad magic)");
  }
  const uint64_t version = GetLe(p + 4, 2);
  if (version != kCollNetHandleVersion) {
    return InvalidArgumentError("CollNet handle version " + std::to_string(version) +
                                " is not supported (this plugin speaks " +
                                std::to_string(kCollNetHandleVersion) +
                                "); run the same plugin version on every node");
  }
  if (GetLe(p + kHandleChecksumOffset, 4) != Fnv1a32(p, kHandleChecksumOffset)) {
    return InvalidArgumentError("CollNet handle checksum mismatch (corrupted handle)");
  }
  const size_t region_len = p[6];
  if (region_len == 0 || region_len > kHandleRegionMax ||
      p[kHandleRegionOffset + region_len] != 0 || p[7] >= std::size(kCompressionNames) ||
      GetLe(p + 20, 4) != 0) {
    return InvalidArgumentError("CollNet handle has a bad region, compression or reserved field");
  }
  CollNetHandle h;
  h.compression = p[7];
  h.nonce = GetLe(p + 8, 8);
  h.shard = static_cast<uint32_t>(GetLe(p + 16, 4));
  h.job_hash = GetLe(p + 24, 8);
  h.region.assign(reinterpret_cast<const char*>(p + kHandleRegionOffset), region_len);
  return h;
}

uint64_t CollNetJobHash(std::string_view job) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (char c : job) {
    h ^= static_cast<uint8_t>(c);
    h *= 0x100000001b3ull;
  }
  return h;
}

StatusOr<uint8_t> CollNetCompressionCode(std::string_view compression) {
  for (size_t i = 0; i < std::size(kCompressionNames); ++i) {
    if (compression == kCompressionNames[i]) return static_cast<uint8_t>(i);
  }
  return InvalidArgumentError("STRAIT_COMPRESSION=\"" + std::string(compression) +
                              "\" is invalid; allowed: auto, none, zstd, int8, int4, fp8");
}

StatusOr<CollNetGroup> PlanCollNetGroup(const std::vector<CollNetHandle>& handles) {
  if (handles.empty()) return InvalidArgumentError("a CollNet group needs at least one node head");
  const CollNetHandle& first = handles[0];
  std::map<std::string, std::vector<std::pair<uint32_t, size_t>>> by_region;  // shard, head
  std::set<uint64_t> nonces;
  for (size_t i = 0; i < handles.size(); ++i) {
    const CollNetHandle& h = handles[i];
    if (h.job_hash != first.job_hash) {
      return InvalidArgumentError("node heads 0 and " + std::to_string(i) +
                                  " have different STRAIT_JOB_ID values; every rank of a job "
                                  "must set the same STRAIT_JOB_ID");
    }
    if (h.compression != first.compression) {
      return InvalidArgumentError("node head 0 has STRAIT_COMPRESSION=" +
                                  std::string(kCompressionNames[first.compression]) +
                                  " but node head " + std::to_string(i) + " has " +
                                  kCompressionNames[h.compression] +
                                  "; every rank of a job must set the same STRAIT_COMPRESSION");
    }
    if (!nonces.insert(h.nonce).second) {
      return InvalidArgumentError("node heads share a listen handle (head " + std::to_string(i) +
                                  " repeats an earlier one)");
    }
    by_region[h.region].emplace_back(h.shard, i);
  }
  const size_t m = by_region.begin()->second.size();
  for (auto& [region, heads] : by_region) {
    if (heads.size() != m) {
      return InvalidArgumentError(
          "region \"" + by_region.begin()->first + "\" has " + std::to_string(m) +
          " node heads but region \"" + region + "\" has " + std::to_string(heads.size()) +
          "; CollNet needs the same number of node heads in every region, one per straitd "
          "of that region ([peers.<region>] shard_0..shard_<m-1>)");
    }
    std::sort(heads.begin(), heads.end());
    for (size_t j = 0; j < heads.size(); ++j) {
      if (heads[j].first != j) {
        std::string list;
        for (const auto& [shard, head] : heads) {
          list += (list.empty() ? "" : ", ") + std::string("head ") + std::to_string(head) +
                  " -> shard " + std::to_string(shard);
        }
        return InvalidArgumentError(
            "the node heads of region \"" + region + "\" are on straitd shards {" + list +
            "}; each node head must use its own straitd (STRAIT_GATEWAY), together shard "
            "indices 0.." +
            std::to_string(m - 1));
      }
    }
  }
  CollNetGroup g;
  uint64_t id = 0x5354434e;  // "STCN"
  for (const CollNetHandle& h : handles) id = Mix(id ^ h.nonce);
  g.comm_id = id;
  g.regions = static_cast<int>(by_region.size());
  g.heads_per_region = static_cast<int>(m);
  return g;
}

bool CollNetReduceSupported(int dtype, int op) {
  return dtype >= 0 && dtype < kNumDataTypes && op >= 0 && op <= 3;  // sum, prod, max, min
}

// ---- the C boundary -----------------------------------------------------------------------------

namespace collnet {

ncclResult_t Listen(int dev, void* handle, void** listen_comm) {
  return Guard("CollNet listen", [&] { return DoListen(dev, handle, listen_comm); });
}

ncclResult_t Connect(void* handles[], int nranks, int rank, void* listen_comm, void** coll_comm) {
  return Guard("CollNet connect",
               [&] { return DoConnect(handles, nranks, rank, listen_comm, coll_comm); });
}

ncclResult_t ReduceSupport(int dtype, int op, int* supported) {
  return Guard("CollNet reduceSupport", [&]() -> Status {
    if (supported == nullptr) return InvalidArgumentError("supported is NULL");
    *supported = CollNetReduceSupported(dtype, op) ? 1 : 0;
    return Status::Ok();
  });
}

ncclResult_t RegMr(void* coll_comm, void* data, size_t size, int type, void** mhandle) {
  return Guard("CollNet regMr", [&]() -> Status {
    if (mhandle == nullptr) return InvalidArgumentError("mhandle is NULL");
    *mhandle = nullptr;
    if (!IsComm(coll_comm)) return InvalidArgumentError("collComm is not a CollNet comm");
    if (type != kNcclPtrHost) {
      return InvalidArgumentError("regMr of memory type " + std::to_string(type) +
                                  "; this plugin reports ptrSupport = NCCL_PTR_HOST only");
    }
    if (data == nullptr && size > 0) return InvalidArgumentError("regMr of a NULL buffer");
    *mhandle = std::make_unique<MemoryHandle>().release();
    return Status::Ok();
  });
}

ncclResult_t DeregMr(void* coll_comm, void* mhandle) {
  return Guard("CollNet deregMr", [&]() -> Status {
    if (!IsComm(coll_comm)) return InvalidArgumentError("collComm is not a CollNet comm");
    auto* mh = static_cast<MemoryHandle*>(mhandle);
    if (mh == nullptr || mh->magic != kMrMagic) {
      return InvalidArgumentError("mhandle is not a CollNet memory handle");
    }
    std::unique_ptr<MemoryHandle> owned(mh);
    owned->magic = 0;
    return Status::Ok();
  });
}

ncclResult_t Iallreduce(void* coll_comm, void* send_data, void* recv_data, size_t count, int dtype,
                        int op, void** request) {
  return Guard("CollNet iallreduce", [&] {
    return DoIallreduce(coll_comm, send_data, recv_data, count, dtype, op, request);
  });
}

ncclResult_t Iflush(void* coll_comm, void** request) {
  return Guard("CollNet iflush", [&]() -> Status {
    if (request == nullptr) return InvalidArgumentError("request is NULL");
    *request = nullptr;
    if (!IsComm(coll_comm)) return InvalidArgumentError("collComm is not a CollNet comm");
    auto req = std::make_unique<Request>();
    req->state.store(1, std::memory_order_release);
    *request = req.release();
    return Status::Ok();
  });
}

ncclResult_t Test(void* request, int* done, int* size) {
  return Guard("CollNet test", [&] { return DoTest(request, done, size); });
}

ncclResult_t CloseColl(void* coll_comm) {
  return Guard("CollNet closeColl", [&]() -> Status {
    {
      std::lock_guard<std::mutex> lock(g_mu);
      if (g_comms->erase(coll_comm) == 0) {
        return InvalidArgumentError("collComm is not a CollNet comm");
      }
    }
    DestroyComm(static_cast<CollComm*>(coll_comm));
    return Status::Ok();
  });
}

ncclResult_t CloseListen(void* listen_comm) {
  return Guard("CollNet closeListen", [&]() -> Status {
    {
      std::lock_guard<std::mutex> lock(g_mu);
      if (g_listens->erase(listen_comm) == 0) {
        return InvalidArgumentError("listenComm is not a CollNet listen comm");
      }
    }
    std::unique_ptr<ListenComm> owned(static_cast<ListenComm*>(listen_comm));
    owned->magic = 0;
    return Status::Ok();
  });
}

}  // namespace collnet
}  // namespace strait::nccl

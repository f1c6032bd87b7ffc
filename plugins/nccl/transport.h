// The plugin's one internal API: what every exported NCCL table version calls after its adapter
// has converted arguments. Status in, Status out; the C boundary (api.h) validates pointers,
// catches exceptions and maps Status to ncclResult_t.
//
// Cross-region (STRAIT_GATEWAY set, the peer's handle names another region): a connection is one
// tunnel of the local straitd (lib/localproto/protocol.h, "Tunnels"), opened on a Unix
// connection of its own that the loop drives; the same chunks travel as kTunnelData frames and
// are matched by the same rules. listen() also publishes the region, shard and listen id of a
// tunnel listen on the gateway in the handle (one opened ahead: see Listen below).
//
// Point-to-point inside a region: a connection is `nsocks` TCP sockets from the sender to the
// receiver, all owned by the plugin's libuv thread (event_loop.h). A send is cut into chunks that
// go to whichever socket has room (never an even split: one slow socket must not hold back the
// rest); every chunk carries (message sequence, message size, offset, tag) so the receiver can
// place it directly into the posted buffer whichever socket it came on. Messages match receives
// per tag in FIFO order (the sender's k-th message with tag T fills the k-th buffer posted with
// tag T, alone or inside a grouped receive), as NCCL's IB transport does. A message that arrives
// before its buffer is posted is held in a bounded per-comm "unexpected" area and copied once
// posted; past the bound the socket stops reading (TCP back-pressure).
//
// Threading: every method may be called from any NCCL thread. None blocks except Close*() (waits
// for the loop to stop touching the comm's buffers) and Finalize (joins the loop thread when the
// last context goes). Ownership: comms and requests returned to NCCL stay owned by the plugin;
// NCCL gives a comm back through its Close*() and a request back through the Test() that reports
// it done.
#ifndef STRAIT_PLUGINS_NCCL_TRANSPORT_H_
#define STRAIT_PLUGINS_NCCL_TRANSPORT_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>

#include "plugins/nccl/config.h"
#include "strait/status.h"

namespace strait::nccl {

constexpr int kMaxRecvs = 8;                          // grouped receives: up to 8 buffers per irecv
constexpr int kMaxRequests = 32;                      // receive requests in flight per comm
constexpr size_t kMaxMessageBytes = size_t{1} << 30;  // maxP2pBytes / maxCollBytes we report
constexpr size_t kChunkBytes = 512 * 1024;
// Through a gateway tunnel a message goes as frames of at most this much payload, so straitd
// pipelines (reads, encodes and sends one while the next arrives) and every message fits its
// frame limit whatever the message size.
constexpr size_t kTunnelChunkBytes = 2 * 1024 * 1024;
// How long listen() waits for a pre-opened tunnel listener when none is ready (at most; less when
// STRAIT_CONNECT_TIMEOUT is shorter). Normally none is waited for: see Listen below.
constexpr int64_t kGatewayListenWaitNs = int64_t{2} * 1000 * 1000 * 1000;

// What getProperties reports, version-independent.
struct DeviceProperties {
  std::string name;
  uint64_t guid = 0;
  int speed_mbps = 0;
  float latency_us = 0;
  int max_comms = 0;
  int max_recvs = 0;
  size_t max_p2p_bytes = 0;
  size_t max_coll_bytes = 0;
};

enum class LogKind { kWarn, kInfo };
using LogFn = std::function<void(LogKind kind, const std::string& message)>;

class Transport {
 public:
  // The process-wide instance (never destroyed: NCCL may call in during exit).
  static Transport& Get();

  // Parses the environment, picks the interface and starts the loop (first call). Every call
  // re-reads the environment so a bad value is reported to whichever communicator sees it.
  Status Init(const EnvGetter& env, LogFn log);
  // Drops one Init; the last one stops the loop if no comm is open.
  void Finalize();

  int Devices() const;
  StatusOr<DeviceProperties> GetProperties(int dev) const;

  // Comms and requests cross the C boundary as opaque pointers; every method that takes one
  // checks that it is a live object of the expected kind (never dereferencing an unknown comm)
  // and returns InvalidArgument otherwise.

  // Fills the 128-byte `handle` and returns a listen comm. Without STRAIT_GATEWAY it binds a TCP
  // listener on the loop (no network wait). With STRAIT_GATEWAY the handle must carry a listen
  // id that only the gateway hands out, so the loop keeps a few listeners opened ahead, each
  // with its tunnel listen already answered (init starts them, every listen() starts a
  // replacement): listen() takes a ready one without any gateway round trip. Only when none is
  // ready does it wait, kGatewayListenWaitNs at most (a DeadlineExceeded naming the gateway);
  // a gateway that is not there fails it at once (Unavailable), after one fresh attempt so a
  // straitd started after init is found. It also fails when the gateway serves another region.
  StatusOr<void*> Listen(int dev, void* handle);
  // Non-blocking: returns nullptr while the connection is being set up (call again with the
  // same handle buffer). A peer in another region is reached through the local gateway's tunnel;
  // the attempt ends with an error after STRAIT_CONNECT_TIMEOUT.
  StatusOr<void*> Connect(int dev, void* handle);
  // Non-blocking: nullptr while no connection has arrived.
  StatusOr<void*> Accept(void* listen_comm);

  StatusOr<void*> RegMr(void* comm, void* data, size_t size, int type);
  Status DeregMr(void* comm, void* mhandle);

  // Non-blocking: nullptr when the comm has no free request slot (call again later).
  StatusOr<void*> Isend(void* send_comm, const void* data, size_t size, int tag);
  StatusOr<void*> Irecv(void* recv_comm, int n, void* const* data, const size_t* sizes,
                        const int* tags);
  // Host memory needs no flush: returns a request that is already done.
  StatusOr<void*> Iflush(void* recv_comm);
  // Polls `request`. Done or failed: the request is released and must not be used again.
  // `sizes` (may be null, else room for kMaxRecvs) receives one size per buffer; `count` how
  // many. Requests are checked by a magic number only (test() is the hot path).
  Status Test(void* request, bool* done, size_t* sizes, int* count);

  Status CloseSend(void* send_comm);
  Status CloseRecv(void* recv_comm);
  Status CloseListen(void* listen_comm);

  const PluginConfig& config() const { return config_; }
  void Log(LogKind kind, const std::string& message) const;

 private:
  Transport() = default;

  PluginConfig config_;
  Interface iface_;
  std::string own_region_;
  LogFn log_;
  int init_count_ = 0;
};

}  // namespace strait::nccl

#endif  // STRAIT_PLUGINS_NCCL_TRANSPORT_H_

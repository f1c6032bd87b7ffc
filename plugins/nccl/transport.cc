// Intra-region point-to-point over TCP on the plugin's libuv thread, and cross-region through
// straitd's tunnels (see transport.h): the NCCL-facing operations. They check every opaque
// pointer against a registry, then hand the work to the loop; the comms themselves live in
// transport_comm.h (shared base, sockets, requests), listen_comm.h, recv_comm.h, send_comm.h
// and listen_pool.h.
#include "plugins/nccl/transport.h"

#include <algorithm>
#include <memory>
#include <mutex>
#include <optional>
#include <type_traits>
#include <unordered_map>
#include <unordered_set>
#include <utility>

#include "common/units.h"
#include "plugins/nccl/collnet.h"
#include "plugins/nccl/handle.h"
#include "plugins/nccl/listen_comm.h"
#include "plugins/nccl/listen_pool.h"
#include "plugins/nccl/nccl_net.h"
#include "plugins/nccl/recv_comm.h"
#include "plugins/nccl/send_comm.h"
#include "plugins/nccl/transport_comm.h"

namespace strait::nccl {

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
      ActivateListenPool(config_.gateway, iface_.addr);
      // Listeners opened ahead, so listen() finds one ready (listen_pool.h). A gateway that
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
  if (CollNetInUse()) return;  // CollNet's connections to straitd live on the loop too
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
  // Cross-region capable: a pre-opened listener (listen_pool.h), so no gateway round trip here.
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
        // The message first: once posted, the loop may close and free the comm at once (a
        // use-after-free ThreadSanitizer found here).
        Status timed_out = DeadlineExceededError(
            "no answer from " + comm->peer() + " within " +
            FormatDuration(config_.connect_timeout_ns) +
            " (STRAIT_CONNECT_TIMEOUT): is the receiving rank alive, and is that address "
            "reachable from here (STRAIT_SOCKET_IFNAME)?");
        Loop().Post([comm] { comm->BeginClose(); });
        return timed_out;
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

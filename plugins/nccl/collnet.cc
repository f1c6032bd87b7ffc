// CollNet over straitd's region all-reduce (see collnet.h). The local protocol is
// strait::localproto's (lib/localproto/protocol.h), which the plugin links instead of the gateway
// module.
//
// This file holds the comms, requests and worker threads and the C boundary of the CollNet
// tables; collnet_gateway.h the connection to straitd; collnet_handle.cc the handle and group
// rules.
#include "plugins/nccl/collnet.h"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <deque>
#include <exception>
#include <memory>
#include <mutex>
#include <new>
#include <random>
#include <set>
#include <thread>
#include <utility>

#include "common/clock.h"
#include "plugins/nccl/api.h"
#include "plugins/nccl/collnet_gateway.h"
#include "plugins/nccl/config.h"
#include "plugins/nccl/transport.h"
#include "strait/types.h"

namespace strait::nccl {
namespace {

std::string Hex64(uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof(buf), "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

// ---- how long CollNet waits for straitd ---------------------------------------------------------

constexpr int64_t kNanosPerMs = 1'000'000;
// A region all-reduce is bounded by the gateway's allreduce.deadline (timeout_ms 0 asks for it);
// the plugin gives up on its own only if a gateway neither answers nor closes the connection.
constexpr double kOperationWatchdogSeconds = 3600;
// Local round trips of listen (hello, register-job, tunnel-listen): milliseconds normally.
constexpr double kLocalCallSeconds = 10;

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
  STRAIT_ASSIGN_OR_RETURN(lc->handle.policy, CollNetPolicy(cfg.compression));
  const Deadline deadline = Deadline::AfterSeconds(kLocalCallSeconds);
  STRAIT_ASSIGN_OR_RETURN(auto conn, GatewayConnection::Open(cfg.gateway, deadline));
  STRAIT_ASSIGN_OR_RETURN(std::string policy,
                          conn->RegisterJob(cfg.job_id, lc->handle.policy, deadline));
  std::string region;
  uint32_t shard = 0;
  STRAIT_RETURN_IF_ERROR(conn->ProbeRegionAndShard(deadline, &region, &shard));
  conn.reset();  // ends the probe's tunnel listen
  if (!cfg.region.empty() && cfg.region != region) {
    return InvalidArgumentError("STRAIT_REGION=\"" + cfg.region + "\" but the straitd at " +
                                cfg.gateway + " serves region \"" + region +
                                "\"; point STRAIT_GATEWAY at this node's straitd");
  }
  if (region.empty() || region.size() > kCollNetRegionMax) {
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

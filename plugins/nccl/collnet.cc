// CollNet over straitd's region all-reduce (see collnet.h). The local protocol is
// strait::localproto's (lib/localproto/protocol.h), which the plugin links instead of the gateway
// module.
//
// This file holds listen, connect (the barrier, the slots' regions), the posting side of
// iallreduce and test, and the C boundary of the CollNet tables; collnet_internal.h the comms,
// requests and slots, collnet_slots.cc the loop side that runs a slot's requests;
// collnet_pipe.h the loop-driven connection to straitd; collnet_handle.cc the handle and group
// rules.
//
// Threads: none of its own. Every socket belongs to the plugin's one libuv loop (event_loop.h);
// NCCL's threads hand requests to it with EventLoop::Post and poll an atomic in test(). Only
// listen and connect wait for the loop (listen's one round trip, connect's blocking collective,
// which NCCL documents as blocking), bounded by their deadlines.
#include "plugins/nccl/collnet.h"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <new>
#include <set>
#include <span>
#include <utility>

#include "common/clock.h"
#include "common/endian.h"
#include "common/random.h"
#include "localproto/protocol.h"
#include "localproto/shm.h"
#include "plugins/nccl/api.h"
#include "plugins/nccl/collnet_internal.h"
#include "plugins/nccl/collnet_pipe.h"
#include "plugins/nccl/config.h"
#include "plugins/nccl/event_loop.h"
#include "plugins/nccl/transport.h"
#include "strait/types.h"

namespace strait::nccl {

// The plugin's one libuv loop (transport_comm.h declares it too; that header's point-to-point
// request types would clash with CollNet's here).
EventLoop& Loop();

namespace {

using localproto::Message;
using localproto::MessageType;

std::string Hex64(uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof(buf), "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

// ---- how long CollNet waits for straitd ---------------------------------------------------------

constexpr int64_t kNanosPerMs = 1'000'000;
// Local round trips of listen (hello, register-job, tunnel-listen): milliseconds normally.
constexpr double kLocalCallSeconds = 10;
// How much longer than a call's own deadline listen/connect wait for the loop to answer at all:
// only a loop stopped under them (a finalize racing a listen) ever needs it.
constexpr double kLoopSlackSeconds = 30;
constexpr const char* kClientName = "nccl-collnet";

using collnet_internal::Advance;
using collnet_internal::CollComm;
using collnet_internal::kCommMagic;
using collnet_internal::kListenMagic;
using collnet_internal::kMrMagic;
using collnet_internal::kRequestMagic;
using collnet_internal::ListenComm;
using collnet_internal::MemoryHandle;
using collnet_internal::Request;
using collnet_internal::Slot;
using collnet_internal::StopSlots;

// Live comms: a pointer from NCCL is dereferenced only once found here.
std::mutex g_mu;
std::set<void*>* g_listens = new std::set<void*>();
std::set<void*>* g_comms = new std::set<void*>();
int g_busy = 0;  // listen/connect calls under way (guarded by g_mu)

bool IsListen(void* p) {
  std::lock_guard<std::mutex> lock(g_mu);
  return g_listens->count(p) > 0;
}
bool IsComm(void* p) {
  std::lock_guard<std::mutex> lock(g_mu);
  return g_comms->count(p) > 0;
}

// Counts a listen or connect as using the loop while it runs (CollNetInUse).
class BusyScope {
 public:
  BusyScope() {
    std::lock_guard<std::mutex> lock(g_mu);
    ++g_busy;
  }
  ~BusyScope() {
    std::lock_guard<std::mutex> lock(g_mu);
    --g_busy;
  }
  BusyScope(const BusyScope&) = delete;
  BusyScope& operator=(const BusyScope&) = delete;
};

// ---- waiting for the loop (listen and connect only) ---------------------------------------------

// What a waiting caller and the loop share; shared so that a caller that gave up leaves nothing
// the loop could write into.
struct Waiter {
  std::mutex mu;
  std::condition_variable cv;
  int pending = 1;
  Status status;
  Message reply;

  void Set(Status s, Message r = Message()) {
    std::lock_guard<std::mutex> lock(mu);
    if (status.ok()) status = std::move(s);
    reply = std::move(r);
    if (--pending == 0) cv.notify_all();
  }
  // True once every Set came, false at `deadline` + the slack.
  bool Wait(Deadline deadline) {
    const int64_t ns = deadline.IsInfinite()
                           ? int64_t{INT64_MAX / 2}
                           : deadline.RemainingNanos() +
                                 static_cast<int64_t>(kLoopSlackSeconds * 1e9);
    std::unique_lock<std::mutex> lock(mu);
    return cv.wait_for(lock, std::chrono::nanoseconds(ns), [&] { return pending == 0; });
  }
};

Status LoopGone() {
  return InternalError(
      "the plugin's I/O loop stopped answering (finalize() while CollNet was in use?)");
}

Status NeedLoop() {
  if (Loop().running()) return Status::Ok();
  return FailedPreconditionError("CollNet used before a successful init() (or after finalize())");
}

// Runs `fn` on the loop and waits until it ran; false when the loop did not run it in time.
bool RunOnLoop(std::function<void()> fn) {
  auto w = std::make_shared<Waiter>();
  Loop().Post([w, fn = std::move(fn)] {
    fn();
    w->Set(Status::Ok());
  });
  return w->Wait(Deadline::AfterSeconds(kLocalCallSeconds));
}

// One call on `pipe` (run by the loop), waited for. The buffers must outlive the call: they do
// unless the loop stopped (LoopGone), in which case the caller must leak them.
// `pass_fd` as GatewayPipe::Call's (kAttachShm).
StatusOr<Message> CallAndWait(GatewayPipe* pipe, const Message& request,
                              std::span<const uint8_t> send, std::span<uint8_t> recv,
                              Deadline deadline, int pass_fd = -1) {
  auto w = std::make_shared<Waiter>();
  Loop().Post([w, pipe, request, send, recv, deadline, pass_fd] {
    Status s = pipe->Call(
        request, send, recv, deadline,
        [w](Status st, Message reply) { w->Set(std::move(st), std::move(reply)); }, pass_fd);
    if (!s.ok()) w->Set(std::move(s));
  });
  if (!w->Wait(deadline)) return LoopGone();
  std::lock_guard<std::mutex> lock(w->mu);
  if (!w->status.ok()) return w->status;
  return std::move(w->reply);
}

// Opens `n` pipes to `path` on the loop and waits for their hellos. `*out` receives the pipes
// (to be closed on the loop by the caller, whatever the status) unless the loop did not answer.
Status OpenPipes(const std::string& path, Deadline deadline, std::vector<GatewayPipe*>* out,
                 int n) {
  auto w = std::make_shared<Waiter>();
  auto pipes = std::make_shared<std::vector<GatewayPipe*>>();
  w->pending = n;
  Loop().Post([w, pipes, path, deadline, n] {
    for (int i = 0; i < n; ++i) {
      pipes->push_back(GatewayPipe::Open(Loop().loop(), path, kClientName, deadline,
                                         [w](Status s) { w->Set(std::move(s)); }));
    }
  });
  if (!w->Wait(deadline)) return LoopGone();
  std::lock_guard<std::mutex> lock(w->mu);
  *out = *pipes;
  return w->status;
}

// Stops the comm's I/O on the loop and frees it (and requests NCCL never tested). When the loop
// does not answer, the comm and its requests are leaked rather than freed under it.
void DestroyComm(std::unique_ptr<CollComm> comm) {
  CollComm* raw = comm.get();
  // A loop that is not running any more touches nothing (its handles were closed by Stop).
  if (Loop().running() && !RunOnLoop([raw] { StopSlots(raw); })) {
    api::Warn("CollNet closeColl", "the I/O loop did not stop comm " + raw->id + "; leaking it");
    (void)comm.release();
    return;
  }
  for (Request* r : comm->live) {
    std::unique_ptr<Request> request(r);
    request->magic = 0;
  }
  comm->magic = 0;
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
  BusyScope busy;
  STRAIT_RETURN_IF_ERROR(NeedLoop());
  const Deadline deadline = Deadline::AfterSeconds(kLocalCallSeconds);
  std::vector<GatewayPipe*> pipes;
  // Closing the connection (whatever happened) ends the probe's tunnel listen.
  struct Closer {
    std::vector<GatewayPipe*>* pipes;
    ~Closer() {
      for (GatewayPipe* p : *pipes) Loop().Post([p] { p->Close(); });
    }
  } closer{&pipes};
  STRAIT_RETURN_IF_ERROR(OpenPipes(cfg.gateway, deadline, &pipes, 1));
  GatewayPipe* pipe = pipes[0];
  Message reg;
  reg.type = MessageType::kRegisterJob;
  reg.job = cfg.job_id;
  reg.policy = lc->handle.policy;
  STRAIT_ASSIGN_OR_RETURN(Message registered, CallAndWait(pipe, reg, {}, {}, deadline));
  const std::string policy = registered.text;
  // Which region and shard index the gateway serves, from a tunnel listen's kListening event
  // (the documented way to learn them).
  Message listen;
  listen.type = MessageType::kTunnelListen;
  STRAIT_ASSIGN_OR_RETURN(Message listening, CallAndWait(pipe, listen, {}, {}, deadline));
  StatusOr<localproto::TunnelEvent> event = localproto::DecodeTunnelEvent(listening.data);
  if (!event.ok() || event->kind != localproto::TunnelEventKind::kListening) {
    const std::string why = event.ok() ? std::string() : ": " + event.status().ToString();
    return DataLossError("straitd at " + cfg.gateway +
                         " answered the tunnel listen with an event that is not a listening "
                         "event" + why);
  }
  const std::string region = event->region;
  const uint32_t shard = event->shard;
  if (!cfg.region.empty() && cfg.region != region) {
    return InvalidArgumentError("STRAIT_REGION=\"" + cfg.region + "\" but the straitd at " +
                                cfg.gateway + " serves region \"" + region +
                                "\"; point STRAIT_GATEWAY at this node's straitd");
  }
  if (region.empty() || region.size() > kCollNetRegionMax) {
    return DataLossError("straitd at " + cfg.gateway + " reported a region name of " +
                         std::to_string(region.size()) + " bytes");
  }
  lc->handle.nonce = RandomNonzero64();
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

// Joins the job's next generation on slot 0 and runs the barrier: every head adds (1, its rank);
// each must see (nranks, 0 + 1 + ... + nranks-1). It fails on every head, by the connect timeout
// at the latest, unless the whole path works.
Status ConnectBarrier(CollComm& comm, int64_t timeout_ns) {
  const uint32_t timeout_ms = static_cast<uint32_t>(std::max<int64_t>(1, timeout_ns / kNanosPerMs));
  const Deadline deadline =
      Deadline::After(timeout_ns + std::max<int64_t>(timeout_ns / 10, 500 * kNanosPerMs));
  GatewayPipe* pipe = comm.slots[0].pipe;
  Message join;
  join.type = MessageType::kJoinJob;
  join.job = comm.job;
  join.scope = comm.scope;
  join.timeout_ms = timeout_ms;
  join.resume = 0;  // unknown (NCCL does not tell the plugin which steps it completed)
  StatusOr<Message> joined = CallAndWait(pipe, join, {}, {}, deadline);
  if (joined.ok() && (joined->data.size() != 8 || GetLe(joined->data.data(), 8) == 0)) {
    joined = DataLossError("straitd at " + comm.gateway +
                           " answered join-job without a generation");
  }
  if (!joined.ok()) {
    return joined.status().WithContext("CollNet connect (joining the job through straitd)");
  }
  comm.generation = GetLe(joined->data.data(), 8);
  comm.probe[0] = 1;
  comm.probe[1] = comm.rank;
  Message barrier;
  barrier.type = MessageType::kRegionAllReduce;
  barrier.job = comm.job;
  barrier.tensor_key = "collnet/" + comm.id + "/connect";
  barrier.dtype = DataType::kInt64;
  barrier.op = ReduceOp::kSum;
  barrier.count = 2;
  barrier.timeout_ms = timeout_ms;
  barrier.generation = comm.generation;
  barrier.sequence = 0;
  barrier.scope = comm.scope;
  const std::span<uint8_t> probe(reinterpret_cast<uint8_t*>(comm.probe), sizeof(comm.probe));
  StatusOr<Message> done = CallAndWait(pipe, barrier, probe, probe, deadline);
  if (!done.ok()) {
    return done.status().WithContext("CollNet connect (the node heads' barrier through straitd)");
  }
  const int64_t want_sum = int64_t{comm.nranks} * (comm.nranks - 1) / 2;
  if (comm.probe[0] != comm.nranks || comm.probe[1] != want_sum) {
    return InternalError("CollNet connect barrier returned (" + std::to_string(comm.probe[0]) +
                         ", " + std::to_string(comm.probe[1]) + "), expected (" +
                         std::to_string(comm.nranks) + ", " + std::to_string(want_sum) +
                         "): other processes use this comm's tensor keys");
  }
  return Status::Ok();
}

// Gives every slot a region of one piece shared with straitd (kAttachShm), so that pieces move
// as descriptors. A refusal (straitd cannot map it, or the kernel has no memfd) leaves that slot
// on the socket and is logged once; only a broken connection fails the connect.
Status AttachRegions(CollComm& comm) {
  for (Slot& slot : comm.slots) {
    auto region = localproto::ShmRegion::Create(kCollNetPieceBytes);
    if (!region.ok()) {
      api::Info("CollNet comm " + comm.id + ": no shared memory (" + region.status().ToString() +
                "); tensors go through the socket");
      return Status::Ok();
    }
    Message attach;
    attach.type = MessageType::kAttachShm;
    attach.shm_bytes = kCollNetPieceBytes;
    // The region (and so its fd) must outlive the call: on a loop that does not answer it is
    // leaked with the comm.
    StatusOr<Message> reply =
        CallAndWait(slot.pipe, attach, {}, {}, Deadline::AfterSeconds(kLocalCallSeconds),
                    (*region)->fd());
    if (!reply.ok() && reply.status().message() == LoopGone().message()) {
      (void)region->release();  // the loop may still use the fd
      return reply.status();
    }
    if (!reply.ok()) {
      const Status& st = reply.status();
      if (st.code() == StatusCode::kUnavailable || st.code() == StatusCode::kDeadlineExceeded) {
        return st.WithContext("CollNet connect (attaching shared memory to straitd)");
      }
      api::Info("CollNet comm " + comm.id + ": straitd refused shared memory (" + st.ToString() +
                "); tensors go through the socket");
      return Status::Ok();
    }
    slot.shm = std::move(region).value();
  }
  return Status::Ok();
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

  BusyScope busy;
  STRAIT_RETURN_IF_ERROR(NeedLoop());
  auto comm = std::make_unique<CollComm>();
  comm->job = lc.config.job_id;
  comm->id = Hex64(group.comm_id);
  comm->gateway = lc.config.gateway;
  comm->rank = rank;
  comm->nranks = nranks;
  comm->scope = group.comm_id != 0 ? group.comm_id : 1;
  std::vector<GatewayPipe*> pipes;
  Status opened = OpenPipes(lc.config.gateway, Deadline::AfterSeconds(kLocalCallSeconds), &pipes,
                            kCollNetSlots);
  for (size_t i = 0; i < pipes.size(); ++i) comm->slots[i].pipe = pipes[i];
  // From here every failure closes the pipes on the loop (DestroyComm) before returning.
  Status s = opened.ok() ? ConnectBarrier(*comm, lc.config.connect_timeout_ns) : opened;
  if (s.ok() && lc.config.local_shm) s = AttachRegions(*comm);
  if (!s.ok()) {
    DestroyComm(std::move(comm));
    return s;
  }
  CollComm* raw = comm.release();
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
  const int slot = static_cast<int>(req->index % kCollNetSlots);
  if (count == 0) {
    req->state.store(1, std::memory_order_release);  // nothing to reduce, nothing to send
  } else {
    // Posted under comm.mu, so the loop queues a slot's requests in index order.
    Loop().Post([c = &comm, r = req.get(), slot] {
      c->slots[slot].queue.push_back(r);
      Advance(c, slot);
    });
  }
  comm.live.insert(req.get());
  *request = req.release();
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

bool CollNetInUse() {
  std::lock_guard<std::mutex> lock(g_mu);
  return g_busy > 0 || !g_listens->empty() || !g_comms->empty();
}

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
    DestroyComm(std::unique_ptr<CollComm>(static_cast<CollComm*>(coll_comm)));
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

// Internal to the plugin's CollNet (collnet.cc, collnet_slots.cc): the comms, requests and slots
// NCCL's handles point to, and the loop side that runs a slot's requests on its connection to
// straitd. See collnet.h for what CollNet does and collnet.cc for the threads.
#ifndef STRAIT_PLUGINS_NCCL_COLLNET_INTERNAL_H_
#define STRAIT_PLUGINS_NCCL_COLLNET_INTERNAL_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <set>
#include <string>

#include "localproto/shm.h"
#include "plugins/nccl/collnet.h"
#include "plugins/nccl/collnet_pipe.h"
#include "plugins/nccl/config.h"
#include "strait/status.h"
#include "strait/types.h"

namespace strait::nccl::collnet_internal {

// A region all-reduce is bounded by the gateway's allreduce.deadline (timeout_ms 0 asks for it);
// the plugin gives up on its own only if a gateway neither answers nor closes the connection.
constexpr double kOperationWatchdogSeconds = 3600;

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
  // 0 pending, 1 done, 2 failed; set last by the loop (release), read by test() (acquire).
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

// One slot: a connection to straitd and the requests that run on it, in posting order. Loop side
// only.
struct Slot {
  GatewayPipe* pipe = nullptr;
  // The region this slot shares with straitd (kAttachShm), or null: pieces then go through the
  // socket. Outlives the pipe's calls (freed with the comm, after StopSlots).
  std::unique_ptr<localproto::ShmRegion> shm;
  std::deque<Request*> queue;  // posted, not started
  Request* current = nullptr;  // running: its pieces go one at a time
  size_t at = 0;               // elements of `current` already reduced
  bool waiting = false;        // a piece of `current` is with straitd
  uint64_t pieces = 0;         // region all-reduces this slot ran (its part of the comm's sequence)
};

struct CollComm {
  uint32_t magic = kCommMagic;
  std::string job;
  std::string id;  // hex comm id: part of every tensor key
  std::string gateway;
  int rank = 0;
  int nranks = 0;
  std::mutex mu;   // failure, next_op, live (NCCL's threads and the loop)
  Status failure;  // the first failed operation's status: later ones fail with it
  uint64_t next_op = 0;
  // The generation the comm joined and its scope (its comm id): every region all-reduce of the
  // comm carries them, with sequence 0 for the connect barrier and 1 + k * kCollNetSlots + slot
  // for a slot's k-th piece, the same on every node head since each slot runs the same requests.
  uint64_t generation = 0;
  uint64_t scope = 0;
  std::set<Request*> live;  // handed to NCCL and not yet released by test()
  int64_t probe[2] = {};    // the connect barrier's tensor (the loop writes into it)
  Slot slots[kCollNetSlots];
};

// ---- the slots, loop side (collnet_slots.cc) ----------------------------------------------------

// Drives slot `slot_index` as far as it goes without waiting for straitd: finishes what is done,
// starts the next piece or request. Requests of a slot run one after another, in posting order.
void Advance(CollComm* comm, int slot_index);
// Stops every slot's I/O; no callback touches the comm or its requests afterwards.
void StopSlots(CollComm* comm);

}  // namespace strait::nccl::collnet_internal

#endif  // STRAIT_PLUGINS_NCCL_COLLNET_INTERNAL_H_

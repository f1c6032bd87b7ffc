// The slots of a CollNet comm, loop side (collnet_internal.h): each slot runs its requests one
// after another on its connection to straitd, a piece (at most kCollNetPieceBytes) per region
// all-reduce, through the slot's shared region when it has one. Runs on the plugin's loop only.
#include <algorithm>
#include <cstring>
#include <span>
#include <string>

#include "localproto/protocol.h"
#include "plugins/nccl/collnet_internal.h"

namespace strait::nccl::collnet_internal {
namespace {

using localproto::Message;
using localproto::MessageType;

// Ends the slot's current request with `s` (and the comm, when it failed).
void FinishCurrent(CollComm* comm, Slot& slot, const Status& s) {
  Request* req = slot.current;
  slot.current = nullptr;
  if (!s.ok()) {
    std::lock_guard<std::mutex> lock(comm->mu);
    if (comm->failure.ok()) comm->failure = s;
  }
  req->status = s;
  req->state.store(s.ok() ? 1 : 2, std::memory_order_release);  // test() may free it from now
}

// Sends the current request's next piece: at most kCollNetPieceBytes, one region all-reduce.
Status StartPiece(CollComm* comm, int slot_index) {
  Slot& slot = comm->slots[slot_index];
  Request& req = *slot.current;
  const std::string key = "collnet/" + comm->id + "/" + std::to_string(slot_index);
  const size_t elem = DataTypeSize(req.dtype);
  const size_t per_piece = std::max<size_t>(1, kCollNetPieceBytes / elem);
  const size_t n = std::min(per_piece, req.count - slot.at);
  Message m;
  m.type = slot.shm != nullptr ? MessageType::kRegionAllReduceShm : MessageType::kRegionAllReduce;
  m.job = comm->job;
  m.tensor_key = key;
  m.dtype = req.dtype;
  m.op = req.op;
  m.count = n;
  m.timeout_ms = 0;  // the gateway's allreduce.deadline
  m.generation = comm->generation;
  m.sequence = 1 + slot.pieces++ * kCollNetSlots + static_cast<uint64_t>(slot_index);
  m.scope = comm->scope;
  std::span<const uint8_t> send(static_cast<const uint8_t*>(req.send) + slot.at * elem, n * elem);
  std::span<uint8_t> recv(static_cast<uint8_t*>(req.recv) + slot.at * elem, n * elem);
  uint8_t* shared = nullptr;
  if (slot.shm != nullptr) {
    // Only the descriptor crosses the socket; straitd reduces the piece in the shared pages.
    shared = slot.shm->data();
    if (!send.empty()) std::memcpy(shared, send.data(), send.size());
    send = {};
    recv = {};
  }
  Status s = slot.pipe->Call(
      m, send, recv, Deadline::AfterSeconds(kOperationWatchdogSeconds),
      [comm, slot_index, n, elem, key, shared](Status st, Message) {
        Slot& sl = comm->slots[slot_index];
        sl.waiting = false;
        if (st.ok()) {
          if (shared != nullptr && n > 0) {
            std::memcpy(static_cast<uint8_t*>(sl.current->recv) + sl.at * elem, shared, n * elem);
          }
          sl.at += n;
        } else {
          const Request& r = *sl.current;
          FinishCurrent(comm, sl,
                        st.WithContext("CollNet all-reduce #" + std::to_string(r.index) + " (" +
                                       std::to_string(r.count) + " x " + DataTypeName(r.dtype) +
                                       " " + ReduceOpName(r.op) + ", key " + key + ")"));
        }
        Advance(comm, slot_index);
      });
  if (!s.ok()) {
    return s.WithContext("CollNet all-reduce #" + std::to_string(req.index) + " (" +
                         std::to_string(req.count) + " x " + DataTypeName(req.dtype) + " " +
                         ReduceOpName(req.op) + ", key " + key + ")");
  }
  return Status::Ok();
}

}  // namespace

void Advance(CollComm* comm, int slot_index) {
  Slot& slot = comm->slots[slot_index];
  while (!slot.waiting) {
    if (slot.current == nullptr) {
      if (slot.queue.empty()) return;
      slot.current = slot.queue.front();
      slot.queue.pop_front();
      slot.at = 0;
      Status failed;
      {
        std::lock_guard<std::mutex> lock(comm->mu);
        failed = comm->failure;
      }
      if (!failed.ok()) {
        FinishCurrent(comm, slot,
                      failed.WithContext("an earlier CollNet all-reduce of this comm failed"));
        continue;
      }
    }
    if (slot.at >= slot.current->count) {
      FinishCurrent(comm, slot, Status::Ok());
      continue;
    }
    slot.waiting = true;
    Status s = StartPiece(comm, slot_index);
    if (s.ok()) return;  // the piece's reply continues the slot
    slot.waiting = false;
    FinishCurrent(comm, slot, s);
  }
}

void StopSlots(CollComm* comm) {
  for (Slot& slot : comm->slots) {
    if (slot.pipe != nullptr) slot.pipe->Close();
    slot.pipe = nullptr;
    slot.queue.clear();
    slot.current = nullptr;
  }
}

}  // namespace strait::nccl::collnet_internal

// The seam between the collective algorithms and whatever carries their bytes.
//
// A Transport connects `size()` ranks, numbered 0..size()-1; this object is rank `rank()`. It
// moves whole byte messages labelled with a 64-bit tag: Send is asynchronous and reports its
// completion through a callback; Recv blocks until the message with that (peer, tag) is there or
// the deadline passes. Messages that arrive before their Recv is posted are buffered, so the
// algorithms can post receives in any order. Two messages with the same (peer, tag) are received
// in the order they were sent. A rank may send to itself.
//
// Implementations: LocalWorld (local_transport.h; N ranks as threads in one process, for tests)
// and NetTransport (net_transport.h; over strait::net links between region gateways).
//
// Tags: the algorithms build them with MakeTag() from the operation's id (which the caller makes
// unique per concurrent operation and equal on every rank), a phase and a chunk number.
//
// Aborts: when an operation fails on one rank, Abort() tells every rank of the transport, so that
// their receives of that operation end at once with the reason (kAborted, naming the rank that
// aborted) instead of each waiting for its own deadline, and so that the operation's buffered and
// late messages are dropped.
#ifndef STRAIT_LIB_COLLECTIVE_TRANSPORT_H_
#define STRAIT_LIB_COLLECTIVE_TRANSPORT_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "common/clock.h"
#include "strait/codec.h"
#include "strait/status.h"

namespace strait::collective {

// Runs exactly once per Send, with OK once the message was delivered (NetTransport: acknowledged
// by the peer) or an error naming the peer. May run on any thread, including inside Send itself;
// it must not block.
using SendDone = std::function<void(Status)>;

// Spare capacity behind the message: a message whose vector has at least this much capacity
// beyond its size lets a transport that frames messages (NetTransport) append its trailer within
// the same buffer instead of copying the message into a new one. Large messages built
// per operation reserve it: a fresh multi-MiB buffer costs its page faults, which on a busy VM
// took 5-10 ms per MiB.
inline constexpr size_t kSendHeadroom = 32;
static_assert(kFrameSpareCapacity >= kSendHeadroom, "encoded frames leave the headroom");

class Transport {
 public:
  virtual ~Transport() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;

  // A name for `peer` in error messages, e.g. "rank 2" or "rank 2 (eu-west)".
  virtual std::string PeerName(int peer) const;

  // Queues `bytes` for `peer` (which may be this rank) under `tag`; takes ownership of the bytes.
  // `done` runs exactly once (see SendDone). Thread-safe; never blocks.
  virtual void Send(int peer, uint64_t tag, std::vector<uint8_t> bytes, Deadline deadline,
                    SendDone done) = 0;

  // Blocks until the message from `peer` with `tag` is there and moves it into `*out`. Errors:
  // kDeadlineExceeded naming the peer and the tag when the deadline passes first; the peer's
  // failure (e.g. kUnavailable when its link died, kDataLoss for a malformed message) when the
  // transport knows the peer is gone; kInvalidArgument for a peer out of range. Thread-safe:
  // several threads may wait at once (on different tags).
  virtual Status Recv(int peer, uint64_t tag, Deadline deadline, std::vector<uint8_t>* out) = 0;
  // Recv that also says when the message arrived (MonotonicNanos() at delivery), so that the
  // collective can tell a late peer from one it merely asked for late (straggler detection).
  // The default stamps the moment Recv returned; mailbox-backed transports stamp delivery.
  virtual Status RecvStamped(int peer, uint64_t tag, Deadline deadline, std::vector<uint8_t>* out,
                             int64_t* arrived_ns);

  // Operation `op_id` failed on this rank with `why`: tells every other rank (best effort: a
  // peer whose link is down misses it and ends by its own deadline) and drops the operation's
  // messages here, now and when they arrive later. On every rank, receives of the operation then
  // fail with kAborted naming this rank and `why`. `note` is carried verbatim to the other ranks'
  // abort listeners (NetTransport: the gateway puts the job's numbering there; at most 4 KiB).
  // Thread-safe; never blocks. The default does nothing (transports without aborts).
  virtual void Abort(uint64_t op_id, const Status& why, const std::string& note = "");
};

// Tag layout: [63..26] operation id (low 38 bits), [25..24] phase, [23..0] chunk number.
inline constexpr int kTagChunkBits = 24;
inline constexpr int kOpIdBits = 38;
inline constexpr uint64_t kOpIdMask = (uint64_t{1} << kOpIdBits) - 1;
inline constexpr uint32_t kMaxTagChunks = uint32_t{1} << kTagChunkBits;
// The last chunk number is no chunk's: the gateway's commit message of an operation uses it
// (plans stay below it).
inline constexpr uint32_t kCommitChunk = kMaxTagChunks - 1;

enum class TagPhase : uint8_t {
  kMeshScatter = 0,  // a rank's encoded part of a shard, to the shard's owner
  kMeshGather = 1,   // the owner's encoded result, to every rank
  kRingScatter = 2,  // a ring partial sum, to the next rank
  kRingGather = 3,   // a finished ring segment, forwarded to the next rank
};

constexpr uint64_t MakeTag(uint64_t op_id, TagPhase phase, uint32_t chunk) noexcept {
  return (op_id << (kTagChunkBits + 2)) | (static_cast<uint64_t>(phase) << kTagChunkBits) |
         (chunk & (kMaxTagChunks - 1));
}

// The operation id a tag belongs to (the op id given to MakeTag, low 38 bits).
constexpr uint64_t OpOfTag(uint64_t tag) noexcept { return tag >> (kTagChunkBits + 2); }

}  // namespace strait::collective

#endif  // STRAIT_LIB_COLLECTIVE_TRANSPORT_H_

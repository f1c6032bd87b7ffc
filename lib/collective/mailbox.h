// The receiving half every Transport shares: messages buffered by (peer, tag) until a receive
// takes them, receives that wait with a deadline, peers marked failed so that waiting on them
// ends at once with the reason instead of at the deadline, and operations discarded or aborted
// so that their messages are freed and their waits end.
//
// Operations: a tag's operation id is OpOfTag(tag) (transport.h). Discard(op) and Abort(op, why)
// drop every buffered message of the operation and remember the op id, so that messages of it
// arriving later (a peer that had not heard of the failure yet) are dropped on arrival instead
// of being buffered forever. Memory stays bounded: the last kMaxForgottenOps op ids are
// remembered (oldest forgotten first); an op id older than that is buffered again if a message
// of it still arrives, which needs a peer more than that many failed operations behind.
#ifndef STRAIT_LIB_COLLECTIVE_MAILBOX_H_
#define STRAIT_LIB_COLLECTIVE_MAILBOX_H_

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <list>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "common/clock.h"
#include "strait/status.h"

namespace strait::collective {

// Thread-safe. Never blocks except in Receive.
class Mailbox {
 public:
  // `peers` is the world size; `peer_name` names a peer in errors (defaults to "rank N").
  explicit Mailbox(int peers, std::function<std::string(int)> peer_name = nullptr);

  // How many discarded or aborted op ids are remembered (see the file comment).
  static constexpr size_t kMaxForgottenOps = 4096;

  // Buffers a message from `peer`; wakes a receive waiting for it. Messages from a failed peer
  // are still kept (a failure may be declared while late messages are in flight). A message of
  // a discarded or aborted operation is dropped (and counted in DroppedMessages()).
  void Deliver(int peer, uint64_t tag, std::vector<uint8_t> bytes);

  // Takes the oldest message from `peer` with `tag`, waiting until the deadline. Errors:
  // the abort status when the tag's operation was aborted (kAborted, see Abort); kCancelled
  // when it was discarded; kDeadlineExceeded naming the peer and tag; the peer's failure status
  // when one was declared and no such message is buffered; kInvalidArgument for a peer out of
  // range.
  // `arrived_ns`, when not null, receives the MonotonicNanos() of the message's delivery.
  Status Receive(int peer, uint64_t tag, Deadline deadline, std::vector<uint8_t>* out,
                 int64_t* arrived_ns = nullptr);

  // Forgets operation `op_id`: drops its buffered messages and those that arrive later, and
  // ends receives waiting on its tags with kCancelled. Returns how many messages were dropped.
  size_t Discard(uint64_t op_id);
  // Like Discard, but receives of the operation (waiting now or later) fail with `why` (which
  // should be kAborted and say who aborted and why). The first abort of an op wins.
  size_t Abort(uint64_t op_id, Status why);
  // Drops every buffered message from `peer` (what its previous incarnation sent, once it
  // restarted); returns how many.
  size_t DiscardPeer(int peer);

  // From now on, receives from `peer` that find no message fail with `why` (first failure wins).
  void FailPeer(int peer, Status why);
  // Clears a peer's failure (e.g. after its link came back).
  void ClearPeerFailure(int peer);

  // Drops buffered messages whose tag lies in [lo, hi] (an abandoned operation's leftovers);
  // returns how many were dropped.
  size_t Discard(uint64_t lo, uint64_t hi);

  size_t BufferedMessages() const;
  size_t BufferedBytes() const;
  // Messages dropped on arrival because their operation was discarded or aborted.
  uint64_t DroppedMessages() const;
  // Op ids remembered as discarded or aborted (at most kMaxForgottenOps).
  size_t ForgottenOps() const;

 private:
  std::string Name(int peer) const;
  // Drops buffered messages matching `pred` on (peer, tag); mu_ held.
  template <typename Pred>
  size_t DropLocked(Pred pred);
  size_t ForgetLocked(uint64_t op_id, Status why);

  const int peers_;
  std::function<std::string(int)> peer_name_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  struct Message {
    std::vector<uint8_t> bytes;
    int64_t arrived_ns = 0;
  };
  std::map<std::pair<int, uint64_t>, std::deque<Message>> messages_;
  std::vector<Status> failures_;
  size_t buffered_messages_ = 0;
  size_t buffered_bytes_ = 0;
  uint64_t dropped_messages_ = 0;
  // Discarded/aborted op ids -> the status their receives get; `forgotten_order_` is the FIFO
  // that bounds it.
  std::unordered_map<uint64_t, Status> forgotten_;
  std::list<uint64_t> forgotten_order_;
};

}  // namespace strait::collective

#endif  // STRAIT_LIB_COLLECTIVE_MAILBOX_H_

// The receiving half every Transport shares: messages buffered by (peer, tag) until a receive
// takes them, receives that wait with a deadline, and peers marked failed so that waiting on
// them ends at once with the reason instead of at the deadline.
#ifndef STRAIT_LIB_COLLECTIVE_MAILBOX_H_
#define STRAIT_LIB_COLLECTIVE_MAILBOX_H_

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <string>
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

  // Buffers a message from `peer`; wakes a receive waiting for it. Messages from a failed peer
  // are still kept (a failure may be declared while late messages are in flight).
  void Deliver(int peer, uint64_t tag, std::vector<uint8_t> bytes);

  // Takes the oldest message from `peer` with `tag`, waiting until the deadline. Errors:
  // kDeadlineExceeded naming the peer and tag; the peer's failure status when one was declared
  // and no such message is buffered; kInvalidArgument for a peer out of range.
  Status Receive(int peer, uint64_t tag, Deadline deadline, std::vector<uint8_t>* out);

  // From now on, receives from `peer` that find no message fail with `why` (first failure wins).
  void FailPeer(int peer, Status why);
  // Clears a peer's failure (e.g. after its link came back).
  void ClearPeerFailure(int peer);

  // Drops buffered messages whose tag lies in [lo, hi] (an abandoned operation's leftovers);
  // returns how many were dropped.
  size_t Discard(uint64_t lo, uint64_t hi);

  size_t BufferedMessages() const;
  size_t BufferedBytes() const;

 private:
  std::string Name(int peer) const;

  const int peers_;
  std::function<std::string(int)> peer_name_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::pair<int, uint64_t>, std::deque<std::vector<uint8_t>>> messages_;
  std::vector<Status> failures_;
  size_t buffered_messages_ = 0;
  size_t buffered_bytes_ = 0;
};

}  // namespace strait::collective

#endif  // STRAIT_LIB_COLLECTIVE_MAILBOX_H_

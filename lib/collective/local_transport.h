// An in-process Transport: N ranks as threads sharing memory mailboxes. For unit tests of the
// collective algorithms (the Gloo way: run every rank in one process) and for tools that want a
// collective without a network.
//
// Usage:
//   LocalWorld world(4);
//   std::vector<std::thread> ranks;
//   for (int r = 0; r < 4; ++r) ranks.emplace_back([&, r] { AllReduce(world.transport(r), ...); });
//
// A send is delivered into the peer's mailbox at once and completes with OK before Send
// returns. FailRank() simulates a rank whose gateway vanished: receives from it fail with the
// given status and sends to it complete with that status. Abort() reaches every rank at once
// (every rank's mailbox forgets the operation; see Transport::Abort), except ranks marked failed.
#ifndef STRAIT_LIB_COLLECTIVE_LOCAL_TRANSPORT_H_
#define STRAIT_LIB_COLLECTIVE_LOCAL_TRANSPORT_H_

#include <atomic>
#include <memory>
#include <vector>

#include "collective/mailbox.h"
#include "collective/transport.h"

namespace strait::collective {

class LocalWorld {
 public:
  explicit LocalWorld(int size);
  ~LocalWorld();
  LocalWorld(const LocalWorld&) = delete;
  LocalWorld& operator=(const LocalWorld&) = delete;

  int size() const { return static_cast<int>(ranks_.size()); }
  // The transport of rank `rank`; lives as long as the world. Thread-safe.
  Transport& transport(int rank);
  // Messages delivered to `rank` and not yet received.
  size_t BufferedMessages(int rank) const;
  // Rank `rank`'s mailbox (to inspect dropped messages and forgotten ops in tests).
  const Mailbox& mailbox(int rank) const { return *mailboxes_.at(static_cast<size_t>(rank)); }

  // Marks `rank` as gone: everyone's receives from it and sends to it fail with `why`.
  void FailRank(int rank, Status why);

 private:
  class Rank;
  std::vector<std::unique_ptr<Rank>> ranks_;
  std::vector<std::unique_ptr<Mailbox>> mailboxes_;
  std::unique_ptr<std::atomic<bool>[]> failed_;
  std::vector<Status> failure_;
};

}  // namespace strait::collective

#endif  // STRAIT_LIB_COLLECTIVE_LOCAL_TRANSPORT_H_

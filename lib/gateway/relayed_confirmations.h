// Internal to lib/gateway: commit confirmations that reached this gateway through a third region
// (gateway_impl.h, ConfirmCommit). A gateway that received region p's confirmation of a step
// passes it on to every other region; a region whose own link to p is cut while the step commits
// then learns from the relay that p holds the result, and commits too, instead of failing the
// step at its deadline while the others succeed (which left the regions a step apart: see
// "Resume positions" in generation.h).
//
// Relays can come before this gateway waits for them (its own all-reduce still runs) and after
// it stopped (the direct confirmation came first), so each is kept until Forget or until
// `max_ops` newer operations pushed it out (oldest first): memory stays bounded whatever peers
// send. Thread-safe; never blocks except in WaitFor.
#ifndef STRAIT_LIB_GATEWAY_RELAYED_CONFIRMATIONS_H_
#define STRAIT_LIB_GATEWAY_RELAYED_CONFIRMATIONS_H_

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <list>
#include <mutex>
#include <set>
#include <unordered_map>

#include "common/clock.h"

namespace strait::gateway {

class RelayedConfirmations {
 public:
  explicit RelayedConfirmations(size_t max_ops = 1024) : max_ops_(max_ops) {}

  // A peer relayed that region `who` confirmed operation `op_id`; wakes WaitFor.
  void Record(uint64_t op_id, int who);
  // Whether a relay said `who` confirmed `op_id`.
  bool Has(uint64_t op_id, int who) const;
  // Waits until Has(op_id, who) or `until` passes; returns Has(op_id, who).
  bool WaitFor(uint64_t op_id, int who, Deadline until);
  // Drops what is known of `op_id` (its commit ended here).
  void Forget(uint64_t op_id);
  size_t size() const;

 private:
  struct Entry {
    std::set<int> confirmed;
    std::list<uint64_t>::iterator age;
  };
  const size_t max_ops_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::unordered_map<uint64_t, Entry> ops_;
  std::list<uint64_t> order_;  // op ids, oldest first
};

}  // namespace strait::gateway

#endif  // STRAIT_LIB_GATEWAY_RELAYED_CONFIRMATIONS_H_

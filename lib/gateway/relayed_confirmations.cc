// Relayed commit confirmations: a bounded table of (operation, region) with a wait.
#include "gateway/relayed_confirmations.h"

#include <algorithm>
#include <chrono>
#include <iterator>

namespace strait::gateway {

void RelayedConfirmations::Record(uint64_t op_id, int who) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = ops_.find(op_id);
    if (it == ops_.end()) {
      if (max_ops_ == 0) return;
      while (ops_.size() >= max_ops_) {
        ops_.erase(order_.front());
        order_.pop_front();
      }
      order_.push_back(op_id);
      it = ops_.emplace(op_id, Entry{{}, std::prev(order_.end())}).first;
    }
    it->second.confirmed.insert(who);
  }
  cv_.notify_all();
}

bool RelayedConfirmations::Has(uint64_t op_id, int who) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = ops_.find(op_id);
  return it != ops_.end() && it->second.confirmed.count(who) != 0;
}

bool RelayedConfirmations::WaitFor(uint64_t op_id, int who, Deadline until) {
  std::unique_lock<std::mutex> lock(mu_);
  const auto has = [&] {
    auto it = ops_.find(op_id);
    return it != ops_.end() && it->second.confirmed.count(who) != 0;
  };
  while (!has()) {
    const int64_t left = until.RemainingNanos();
    if (left <= 0) return false;
    // Capped so that an infinite deadline's huge count cannot overflow the clock's arithmetic.
    cv_.wait_for(lock, std::chrono::nanoseconds(std::min<int64_t>(left, 1'000'000'000)));
  }
  return true;
}

void RelayedConfirmations::Forget(uint64_t op_id) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = ops_.find(op_id);
  if (it == ops_.end()) return;
  order_.erase(it->second.age);
  ops_.erase(it);
}

size_t RelayedConfirmations::size() const {
  std::lock_guard<std::mutex> lock(mu_);
  return ops_.size();
}

}  // namespace strait::gateway

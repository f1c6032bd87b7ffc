// LogRateLimiter (see log_limiter.h).
#include "common/log_limiter.h"

#include <iterator>

namespace strait {
namespace {

// Shared by the keys that find the table full; no real key is empty (callers name a source).
const std::string kOverflowKey;

}  // namespace

LogRateLimiter::Decision LogRateLimiter::Admit(const std::string& key, int64_t now_ns) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = entries_.find(key);
  if (it == entries_.end()) {
    if (entries_.size() >= max_keys_) {
      // Forget keys idle for a whole interval; their pending counts are dropped with them.
      for (auto e = entries_.begin(); e != entries_.end();) {
        e = now_ns - e->second.last_logged_ns >= interval_ns_ ? entries_.erase(e) : std::next(e);
      }
    }
    const std::string& use = entries_.size() >= max_keys_ ? kOverflowKey : key;
    it = entries_.find(use);
    if (it == entries_.end()) {
      entries_.emplace(use, Entry{now_ns, 0});
      return {true, 0};
    }
  }
  Entry& e = it->second;
  if (now_ns - e.last_logged_ns < interval_ns_) {
    ++e.suppressed;
    return {false, e.suppressed};
  }
  const Decision d{true, e.suppressed};
  e = Entry{now_ns, 0};
  return d;
}

size_t LogRateLimiter::keys() const {
  std::lock_guard<std::mutex> lock(mu_);
  return entries_.size();
}

}  // namespace strait

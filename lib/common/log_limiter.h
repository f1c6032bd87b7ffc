// LogRateLimiter: keeps a message that repeats (a peer refused on every redial, a flood of bad
// connections) from filling the log, without hiding that it happens.
//
// Usage, for each occurrence:
//   LogRateLimiter::Decision d = limiter.Admit(key, MonotonicNanos());
//   if (d.log) STRAIT_LOG(kWarn, "net") << what << (d.suppressed ? " (+N like it)" : "");
// The first occurrence of a key is logged at once; further ones within `interval_ns` of the last
// logged line are only counted, and the first one after the interval is logged with that count
// (`suppressed`). So a key costs at most one line per interval. A count still pending when the
// occurrences stop is not reported on its own (there is no timer): the next line carries it.
//
// The key table is bounded (`max_keys`): when it is full, keys idle for a whole interval are
// forgotten, and if none is, new keys share one overflow key, so a flood of distinct keys (many
// source addresses) costs at most one more line per interval.
// Thread-safe (one mutex); Admit does not block otherwise.
#ifndef STRAIT_LIB_COMMON_LOG_LIMITER_H_
#define STRAIT_LIB_COMMON_LOG_LIMITER_H_

#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>

namespace strait {

class LogRateLimiter {
 public:
  struct Decision {
    bool log = false;         // write the line now
    uint64_t suppressed = 0;  // occurrences left out since the previous line of this key
  };

  explicit LogRateLimiter(int64_t interval_ns, size_t max_keys = 1024)
      : interval_ns_(interval_ns), max_keys_(max_keys) {}

  // One occurrence of `key` at monotonic time `now_ns`.
  Decision Admit(const std::string& key, int64_t now_ns);

  int64_t interval_ns() const { return interval_ns_; }
  // Keys tracked now, the overflow key included (for tests).
  size_t keys() const;

 private:
  struct Entry {
    int64_t last_logged_ns = 0;
    uint64_t suppressed = 0;
  };

  const int64_t interval_ns_;
  const size_t max_keys_;
  mutable std::mutex mu_;
  std::map<std::string, Entry> entries_;
};

}  // namespace strait

#endif  // STRAIT_LIB_COMMON_LOG_LIMITER_H_

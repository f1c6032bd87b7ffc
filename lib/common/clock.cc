// Monotonic clock and deadlines.
#include "common/clock.h"

#include <time.h>

namespace strait {

int64_t MonotonicNanos() noexcept {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec;
}

Deadline Deadline::After(int64_t nanos) noexcept {
  const int64_t now = MonotonicNanos();
  if (nanos >= INT64_MAX - now) return Infinite();
  return Deadline(now + (nanos < 0 ? 0 : nanos));
}

Deadline Deadline::AfterSeconds(double seconds) noexcept {
  if (!(seconds < 9.2e9)) return Infinite();  // also catches NaN
  return After(static_cast<int64_t>(seconds * 1e9));
}

int64_t Deadline::RemainingNanos() const noexcept {
  if (IsInfinite()) return INT64_MAX;
  const int64_t left = at_ - MonotonicNanos();
  return left > 0 ? left : 0;
}

}  // namespace strait

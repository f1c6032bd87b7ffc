// Monotonic time for timeouts, deadlines and rate measurements (never the wall clock, which
// jumps). Nanosecond integers keep arithmetic exact and cheap on hot paths.
#ifndef STRAIT_LIB_COMMON_CLOCK_H_
#define STRAIT_LIB_COMMON_CLOCK_H_

#include <chrono>
#include <cstdint>

namespace strait {

using MonoClock = std::chrono::steady_clock;

// Nanoseconds since an arbitrary fixed point; never decreases.
int64_t MonotonicNanos() noexcept;

// Measures elapsed time from construction or the last Restart().
class Stopwatch {
 public:
  Stopwatch() noexcept : start_(MonotonicNanos()) {}
  void Restart() noexcept { start_ = MonotonicNanos(); }
  int64_t ElapsedNanos() const noexcept { return MonotonicNanos() - start_; }
  double ElapsedSeconds() const noexcept { return static_cast<double>(ElapsedNanos()) * 1e-9; }

 private:
  int64_t start_;
};

// A point in monotonic time after which an operation gives up. Infinite() never expires; code
// that waits on the network should never use it (every wait has a deadline).
class Deadline {
 public:
  static Deadline After(int64_t nanos) noexcept;
  static Deadline AfterSeconds(double seconds) noexcept;
  static Deadline Infinite() noexcept { return Deadline(INT64_MAX); }

  bool Expired() const noexcept { return MonotonicNanos() >= at_; }
  bool IsInfinite() const noexcept { return at_ == INT64_MAX; }
  // Nanoseconds left, 0 once expired.
  int64_t RemainingNanos() const noexcept;
  int64_t at_nanos() const noexcept { return at_; }

 private:
  explicit Deadline(int64_t at) noexcept : at_(at) {}
  int64_t at_;
};

}  // namespace strait

#endif  // STRAIT_LIB_COMMON_CLOCK_H_

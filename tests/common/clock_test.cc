// Tests for the monotonic clock and deadlines (no sleeps: only ordering and arithmetic).
#include "common/clock.h"

#include <gtest/gtest.h>

namespace strait {
namespace {

TEST(Clock, MonotonicNeverDecreases) {
  int64_t prev = MonotonicNanos();
  for (int i = 0; i < 10000; ++i) {
    const int64_t now = MonotonicNanos();
    ASSERT_GE(now, prev);
    prev = now;
  }
}

TEST(Deadline, PastDeadlineIsExpiredWithZeroRemaining) {
  Deadline d = Deadline::After(-5);
  EXPECT_TRUE(d.Expired());
  EXPECT_EQ(d.RemainingNanos(), 0);
}

TEST(Deadline, FarDeadlineIsNotExpired) {
  Deadline d = Deadline::AfterSeconds(3600);
  EXPECT_FALSE(d.Expired());
  EXPECT_GT(d.RemainingNanos(), 3500ll * 1'000'000'000);
  EXPECT_FALSE(d.IsInfinite());
}

TEST(Deadline, InfiniteAndOverflowSaturate) {
  EXPECT_TRUE(Deadline::Infinite().IsInfinite());
  EXPECT_TRUE(Deadline::After(INT64_MAX).IsInfinite());
  EXPECT_TRUE(Deadline::AfterSeconds(1e300).IsInfinite());
  EXPECT_FALSE(Deadline::Infinite().Expired());
}

TEST(Stopwatch, ElapsedIsNonNegative) {
  Stopwatch w;
  EXPECT_GE(w.ElapsedNanos(), 0);
  w.Restart();
  EXPECT_GE(w.ElapsedSeconds(), 0.0);
}

}  // namespace
}  // namespace strait

// Tests of LogRateLimiter: the first occurrence of a key is logged, repeats within the interval
// are counted and reported once the interval has passed, keys are independent, and the key table
// stays bounded under a flood of distinct keys.
#include "common/log_limiter.h"

#include <gtest/gtest.h>

#include <string>

namespace strait {
namespace {

constexpr int64_t kSecond = 1'000'000'000;

TEST(LogRateLimiter, FirstOccurrenceLogsThenOneSummaryPerInterval) {
  LogRateLimiter limiter(10 * kSecond);
  LogRateLimiter::Decision d = limiter.Admit("10.0.0.5 tls", 0);
  EXPECT_TRUE(d.log);
  EXPECT_EQ(d.suppressed, 0u);
  // 99 retries within the interval: none logged.
  for (int i = 1; i < 100; ++i) {
    d = limiter.Admit("10.0.0.5 tls", i * (kSecond / 10));
    EXPECT_FALSE(d.log) << i;
  }
  // The first one after the interval carries the count of those left out.
  d = limiter.Admit("10.0.0.5 tls", 10 * kSecond);
  EXPECT_TRUE(d.log);
  EXPECT_EQ(d.suppressed, 99u);
  // And the next interval starts from there.
  EXPECT_FALSE(limiter.Admit("10.0.0.5 tls", 15 * kSecond).log);
  d = limiter.Admit("10.0.0.5 tls", 21 * kSecond);
  EXPECT_TRUE(d.log);
  EXPECT_EQ(d.suppressed, 1u);
}

TEST(LogRateLimiter, KeysAreIndependent) {
  LogRateLimiter limiter(10 * kSecond);
  EXPECT_TRUE(limiter.Admit("a", 0).log);
  EXPECT_TRUE(limiter.Admit("b", 1).log);
  EXPECT_FALSE(limiter.Admit("a", 2).log);
  EXPECT_FALSE(limiter.Admit("b", 3).log);
}

TEST(LogRateLimiter, AFloodOfDistinctKeysStaysBoundedAndQuiet) {
  LogRateLimiter limiter(10 * kSecond, /*max_keys=*/8);
  int logged = 0;
  for (int i = 0; i < 1000; ++i) logged += limiter.Admit(std::to_string(i), i).log ? 1 : 0;
  // 8 keys of their own, then one shared line for all the others within the interval.
  EXPECT_EQ(logged, 9);
  EXPECT_LE(limiter.keys(), 9u);
  // Once the interval has passed, stale keys make room again.
  EXPECT_TRUE(limiter.Admit("new", 11 * kSecond).log);
  EXPECT_LE(limiter.keys(), 9u);
}

}  // namespace
}  // namespace strait

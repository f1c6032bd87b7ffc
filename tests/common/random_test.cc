// RandomNonzero64: never zero, and distinct across many calls and threads (ids built from it
// must not collide between the comms of one process).
#include "common/random.h"

#include <gtest/gtest.h>

#include <mutex>
#include <set>
#include <thread>
#include <vector>

namespace strait {
namespace {

TEST(RandomNonzero64, NonZeroAndDistinctAcrossThreads) {
  std::mutex mu;
  std::set<uint64_t> seen;
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      std::vector<uint64_t> mine;
      for (int i = 0; i < 5000; ++i) mine.push_back(RandomNonzero64());
      std::lock_guard<std::mutex> lock(mu);
      seen.insert(mine.begin(), mine.end());
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(seen.size(), 20000u);
  EXPECT_EQ(seen.count(0), 0u);
}

}  // namespace
}  // namespace strait

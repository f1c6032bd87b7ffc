// ReadProcessStats against what this test process does: memory it touches shows in RSS,
// descriptors it opens in open_fds, a thread it starts in threads, CPU it burns in cpu_seconds.
#include "common/process_stats.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <ctime>
#include <memory>
#include <thread>
#include <vector>

namespace strait {
namespace {

TEST(ProcessStats, FollowsWhatTheProcessDoes) {
  auto before = ReadProcessStats();
  ASSERT_TRUE(before.ok()) << before.status();
  EXPECT_GT(before->resident_bytes, 0u);
  EXPECT_GE(before->virtual_bytes, before->resident_bytes);
  EXPECT_GE(before->threads, 1u);
  const double now = static_cast<double>(std::time(nullptr));
  EXPECT_LE(before->start_time_seconds, now + 1);
  EXPECT_GT(before->start_time_seconds, now - 3600) << "this test started within the hour";

  // 64 MiB touched page by page.
  constexpr size_t kBytes = size_t{64} << 20;
  auto block = std::make_unique<char[]>(kBytes);
  for (size_t i = 0; i < kBytes; i += 4096) block[i] = static_cast<char>(i);
  std::vector<int> fds;
  for (int i = 0; i < 10; ++i) fds.push_back(::open("/dev/null", O_RDONLY));
  volatile double sink = 0;
  // 0.15 s of this process's CPU time, however busy the machine (std::clock counts CPU time).
  const std::clock_t start = std::clock();
  while (std::clock() - start < CLOCKS_PER_SEC * 15 / 100) sink = sink + 1;
  bool stop = false;
  std::thread idle([&] {
    while (!__atomic_load_n(&stop, __ATOMIC_ACQUIRE)) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  });
  auto after = ReadProcessStats();
  __atomic_store_n(&stop, true, __ATOMIC_RELEASE);
  idle.join();
  for (int fd : fds) ::close(fd);
  ASSERT_TRUE(after.ok()) << after.status();
  EXPECT_GE(after->resident_bytes, before->resident_bytes + kBytes / 2);
  EXPECT_EQ(after->open_fds, before->open_fds + 10);
  EXPECT_EQ(after->threads, before->threads + 1);
  EXPECT_GE(after->cpu_seconds, before->cpu_seconds + 0.1);
  EXPECT_EQ(after->start_time_seconds, before->start_time_seconds);
  EXPECT_EQ(block[8192 + 4096], static_cast<char>(8192 + 4096));  // the block lives until here
}

}  // namespace
}  // namespace strait

// Tests of AcceptPause: the retry after the pause, cancelling it, the rate of log lines, and a
// real accept loop at the descriptor limit that neither spins nor stays stuck once descriptors
// are free again.
#include "net/accept_pause.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <unistd.h>

#include <asio.hpp>
#include <chrono>
#include <functional>

#include "common/clock.h"

namespace strait::net {
namespace {

using std::chrono::milliseconds;

AcceptPause::Options Fast(int64_t log_interval_ns = 10'000'000'000) {
  AcceptPause::Options o;
  o.pause_ns = 20'000'000;
  o.log_interval_ns = log_interval_ns;
  return o;
}

const asio::error_code kNoDescriptors = asio::error::no_descriptors;

TEST(AcceptPause, RetriesOnceAfterThePause) {
  asio::io_context io;
  AcceptPause pause(io.get_executor(), "a test connection", "test", Fast());
  int retries = 0;
  const int64_t start = MonotonicNanos();
  int64_t retried_at = 0;
  pause.OnFailure(kNoDescriptors, [&] {
    ++retries;
    retried_at = MonotonicNanos();
  });
  EXPECT_EQ(retries, 0) << "the retry must never run inside OnFailure";
  io.run_for(milliseconds(200));
  EXPECT_EQ(retries, 1);
  EXPECT_GE(retried_at - start, 20'000'000);
  EXPECT_EQ(pause.failures_in_a_row(), 1u);
  EXPECT_EQ(pause.lines_logged(), 1u);
}

TEST(AcceptPause, CancelDropsThePendingRetry) {
  asio::io_context io;
  AcceptPause pause(io.get_executor(), "a test connection", "test", Fast());
  int retries = 0;
  pause.OnFailure(kNoDescriptors, [&] { ++retries; });
  pause.Cancel();
  io.run_for(milliseconds(100));
  EXPECT_EQ(retries, 0);
}

TEST(AcceptPause, ASecondFailureReplacesThePendingRetry) {
  asio::io_context io;
  AcceptPause pause(io.get_executor(), "a test connection", "test", Fast());
  int first = 0, second = 0;
  pause.OnFailure(kNoDescriptors, [&] { ++first; });
  pause.OnFailure(kNoDescriptors, [&] { ++second; });
  io.run_for(milliseconds(100));
  EXPECT_EQ(first, 0);
  EXPECT_EQ(second, 1);
  EXPECT_EQ(pause.failures_in_a_row(), 2u);
}

TEST(AcceptPause, OneLinePerRunOfFailuresAndAgainAfterASuccess) {
  asio::io_context io;
  AcceptPause pause(io.get_executor(), "a test connection", "test", Fast());
  int retries = 0;
  std::function<void()> retry = [&] {
    if (++retries < 5) pause.OnFailure(kNoDescriptors, retry);
  };
  pause.OnFailure(kNoDescriptors, retry);
  io.run_for(milliseconds(500));
  EXPECT_EQ(retries, 5);
  EXPECT_EQ(pause.failures_in_a_row(), 5u);
  EXPECT_EQ(pause.lines_logged(), 1u) << "a run of failures within the interval logs once";
  pause.OnSuccess();
  EXPECT_EQ(pause.failures_in_a_row(), 0u);
  pause.OnFailure(kNoDescriptors, nullptr);
  EXPECT_EQ(pause.lines_logged(), 2u) << "a new run logs at once";
  pause.Cancel();
}

TEST(AcceptPause, ALongRunLogsOncePerInterval) {
  asio::io_context io;
  AcceptPause pause(io.get_executor(), "a test connection", "test", Fast(50'000'000));
  int retries = 0;
  std::function<void()> retry = [&] {
    if (++retries < 12) pause.OnFailure(kNoDescriptors, retry);
  };
  const int64_t start = MonotonicNanos();
  pause.OnFailure(kNoDescriptors, retry);
  io.run_for(milliseconds(2000));
  const int64_t elapsed = MonotonicNanos() - start;
  ASSERT_EQ(retries, 12);  // 12 failures, at least 220 ms from the first to the last
  // Bounds that hold however slowly the timers fire: a line at the start and then at most one
  // per 50 ms (logging every failure would give 12 in about 240 ms).
  EXPECT_GE(pause.lines_logged(), 2u);
  EXPECT_LE(pause.lines_logged(), static_cast<uint64_t>(1 + elapsed / 50'000'000));
}

// The lowest descriptor number not in use: with the soft limit set to it, every new descriptor
// fails with EMFILE.
int LowestFreeDescriptor() {
  const int fd = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  if (fd >= 0) ::close(fd);
  return fd;
}

TEST(AcceptPause, AnAcceptLoopAtTheDescriptorLimitPausesAndRecovers) {
  asio::io_context io;
  asio::ip::tcp::acceptor acceptor(io,
                                   asio::ip::tcp::endpoint(asio::ip::make_address("127.0.0.1"), 0));
  AcceptPause pause(io.get_executor(), "a test connection", "test", Fast());
  int accepted = 0;
  int failures = 0;
  std::function<void()> accept = [&] {
    acceptor.async_accept([&](const asio::error_code& ec, asio::ip::tcp::socket) {
      if (ec == asio::error::operation_aborted) return;
      if (ec) {
        ++failures;
        return pause.OnFailure(ec, accept);
      }
      pause.OnSuccess();
      ++accepted;
    });
  };
  // Both handlers run once before the descriptors run out: UBSan's vptr check (the ci preset)
  // needs a pipe the first time it meets a type, which at the limit it cannot open and then
  // reports a bogus "invalid vptr"; afterwards its cache answers.
  asio::ip::tcp::socket first(io);
  first.connect(acceptor.local_endpoint());
  accept();
  bool retried = false;
  pause.OnFailure(asio::error::no_descriptors, [&] { retried = true; });
  io.run_for(milliseconds(200));
  ASSERT_EQ(accepted, 1);
  ASSERT_TRUE(retried);
  pause.OnSuccess();
  ASSERT_EQ(pause.lines_logged(), 1u);
  io.restart();
  asio::ip::tcp::socket client(io);
  client.connect(acceptor.local_endpoint());  // waits in the backlog

  rlimit saved{};
  ASSERT_EQ(::getrlimit(RLIMIT_NOFILE, &saved), 0);
  rlimit tight = saved;
  tight.rlim_cur = static_cast<rlim_t>(LowestFreeDescriptor());
  ASSERT_EQ(::setrlimit(RLIMIT_NOFILE, &tight), 0);
  accept();
  io.run_for(milliseconds(200));
  ASSERT_EQ(::setrlimit(RLIMIT_NOFILE, &saved), 0);
  EXPECT_EQ(accepted, 1);
  // 200 ms at a 20 ms pause: about 10 failures; a loop that spins makes thousands.
  EXPECT_GE(failures, 2);
  EXPECT_LE(failures, 15);
  EXPECT_EQ(pause.lines_logged(), 2u);  // the warm-up's run, then one for this run

  io.restart();
  io.run_for(milliseconds(200));
  EXPECT_EQ(accepted, 2) << "the backlog was not taken once descriptors were free again";
  EXPECT_EQ(pause.failures_in_a_row(), 0u);
}

}  // namespace
}  // namespace strait::net

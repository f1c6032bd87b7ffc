// Tests of the mailbox and the in-process transport: buffering before the receive, order per
// tag, deadlines that name the peer, failed peers ending waits at once.
#include "collective/mailbox.h"

#include <gtest/gtest.h>

#include <thread>

#include "collective/local_transport.h"

namespace strait::collective {
namespace {

std::vector<uint8_t> Bytes(std::initializer_list<uint8_t> b) {
  return b;
}

TEST(Mailbox, BuffersEarlyMessagesAndKeepsOrderPerTag) {
  Mailbox box(3);
  box.Deliver(1, 7, Bytes({1}));
  box.Deliver(1, 7, Bytes({2}));
  box.Deliver(2, 7, Bytes({3}));
  EXPECT_EQ(box.BufferedMessages(), 3u);
  std::vector<uint8_t> out;
  ASSERT_TRUE(box.Receive(2, 7, Deadline::AfterSeconds(1), &out).ok());
  EXPECT_EQ(out, Bytes({3}));
  ASSERT_TRUE(box.Receive(1, 7, Deadline::AfterSeconds(1), &out).ok());
  EXPECT_EQ(out, Bytes({1}));
  ASSERT_TRUE(box.Receive(1, 7, Deadline::AfterSeconds(1), &out).ok());
  EXPECT_EQ(out, Bytes({2}));
  EXPECT_EQ(box.BufferedMessages(), 0u);
  EXPECT_EQ(box.BufferedBytes(), 0u);
}

TEST(Mailbox, DeadlineErrorNamesThePeerAndTag) {
  Mailbox box(2, [](int peer) { return "rank " + std::to_string(peer) + " (eu)"; });
  std::vector<uint8_t> out;
  Stopwatch watch;
  Status s = box.Receive(1, 0x2a, Deadline::After(50'000'000), &out);
  EXPECT_EQ(s.code(), StatusCode::kDeadlineExceeded);
  EXPECT_NE(s.message().find("rank 1 (eu)"), std::string::npos) << s;
  EXPECT_NE(s.message().find("0x2a"), std::string::npos) << s;
  EXPECT_GE(watch.ElapsedNanos(), 45'000'000);
  EXPECT_EQ(box.Receive(5, 0, Deadline::AfterSeconds(1), &out).code(),
            StatusCode::kInvalidArgument);
}

TEST(Mailbox, WaitingReceiveWakesOnDeliveryAndOnPeerFailure) {
  Mailbox box(2);
  std::vector<uint8_t> out;
  std::thread deliver([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    box.Deliver(0, 1, Bytes({9}));
  });
  EXPECT_TRUE(box.Receive(0, 1, Deadline::AfterSeconds(10), &out).ok());
  deliver.join();
  EXPECT_EQ(out, Bytes({9}));

  Stopwatch watch;
  std::thread fail([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    box.FailPeer(1, UnavailableError("link to rank 1 failed"));
  });
  Status s = box.Receive(1, 1, Deadline::AfterSeconds(10), &out);
  fail.join();
  EXPECT_EQ(s.code(), StatusCode::kUnavailable) << s;
  EXPECT_LT(watch.ElapsedSeconds(), 5.0);
  // A message that did arrive from a failed peer is still handed out.
  box.Deliver(1, 2, Bytes({4}));
  EXPECT_TRUE(box.Receive(1, 2, Deadline::AfterSeconds(1), &out).ok());
  box.ClearPeerFailure(1);
  EXPECT_EQ(box.Receive(1, 3, Deadline::After(1'000'000), &out).code(),
            StatusCode::kDeadlineExceeded);
}

TEST(Mailbox, DiscardDropsATagRange) {
  Mailbox box(2);
  for (uint64_t t = 0; t < 10; ++t) box.Deliver(1, t, Bytes({1, 2}));
  EXPECT_EQ(box.Discard(3, 5), 3u);
  EXPECT_EQ(box.BufferedMessages(), 7u);
  EXPECT_EQ(box.BufferedBytes(), 14u);
}

TEST(LocalWorld, RanksExchangeMessagesAndFailedRanksFailFast) {
  LocalWorld world(3);
  Status done_status = InternalError("not called");
  world.transport(0).Send(2, 5, Bytes({1, 2, 3}), Deadline::AfterSeconds(1),
                          [&](Status s) { done_status = s; });
  EXPECT_TRUE(done_status.ok());
  world.transport(1).Send(1, 5, Bytes({7}), Deadline::AfterSeconds(1), nullptr);  // to itself
  std::vector<uint8_t> out;
  ASSERT_TRUE(world.transport(2).Recv(0, 5, Deadline::AfterSeconds(1), &out).ok());
  EXPECT_EQ(out, Bytes({1, 2, 3}));
  ASSERT_TRUE(world.transport(1).Recv(1, 5, Deadline::AfterSeconds(1), &out).ok());
  EXPECT_EQ(out, Bytes({7}));

  world.FailRank(1, UnavailableError("rank 1 is gone"));
  world.transport(0).Send(1, 5, Bytes({1}), Deadline::AfterSeconds(1),
                          [&](Status s) { done_status = s; });
  EXPECT_EQ(done_status.code(), StatusCode::kUnavailable);
  EXPECT_EQ(world.transport(2).Recv(1, 6, Deadline::AfterSeconds(10), &out).code(),
            StatusCode::kUnavailable);
}

}  // namespace
}  // namespace strait::collective

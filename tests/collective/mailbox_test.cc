// Tests of the mailbox and the in-process transport: buffering before the receive, order per
// tag, deadlines that name the peer, failed peers ending waits at once, discarded and aborted
// operations (their messages freed, late ones dropped, waits ended with the reason, bounded
// memory of forgotten ops), a restarted peer's old messages dropped.
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

TEST(Mailbox, DiscardForgetsAnOperationAndDropsItsLateMessages) {
  Mailbox box(2);
  const uint64_t a = MakeTag(5, TagPhase::kMeshScatter, 0);
  const uint64_t a2 = MakeTag(5, TagPhase::kMeshGather, 3);
  const uint64_t b = MakeTag(6, TagPhase::kMeshScatter, 0);
  box.Deliver(1, a, Bytes({1, 2, 3}));
  box.Deliver(0, a2, Bytes({4}));
  box.Deliver(1, b, Bytes({5, 6}));
  EXPECT_EQ(box.Discard(5), 2u);
  EXPECT_EQ(box.BufferedMessages(), 1u);
  EXPECT_EQ(box.BufferedBytes(), 2u);
  // A late message of op 5 is not buffered.
  box.Deliver(1, a, Bytes({7, 8, 9, 10}));
  EXPECT_EQ(box.BufferedMessages(), 1u);
  EXPECT_EQ(box.DroppedMessages(), 1u);
  std::vector<uint8_t> out;
  Stopwatch watch;
  EXPECT_EQ(box.Receive(1, a, Deadline::AfterSeconds(10), &out).code(), StatusCode::kCancelled);
  EXPECT_LT(watch.ElapsedSeconds(), 5.0);
  // Op 6 is untouched.
  ASSERT_TRUE(box.Receive(1, b, Deadline::AfterSeconds(1), &out).ok());
  EXPECT_EQ(out, Bytes({5, 6}));
  EXPECT_EQ(box.BufferedMessages(), 0u);
}

TEST(Mailbox, AbortEndsWaitingReceivesOfThatOperationWithTheReason) {
  Mailbox box(3);
  const uint64_t tag = MakeTag(42, TagPhase::kMeshGather, 1);
  box.Deliver(2, MakeTag(42, TagPhase::kMeshScatter, 0), Bytes({1, 2}));
  std::vector<uint8_t> out;
  Status waited;
  Stopwatch watch;
  std::thread waiter([&] { waited = box.Receive(1, tag, Deadline::AfterSeconds(30), &out); });
  std::this_thread::sleep_for(std::chrono::milliseconds(20));  // let the receive start waiting
  EXPECT_EQ(box.Abort(42, AbortedError("rank 2 (ap) aborted the operation: deadline")), 1u);
  waiter.join();
  EXPECT_EQ(waited.code(), StatusCode::kAborted) << waited;
  EXPECT_NE(waited.message().find("rank 2 (ap) aborted"), std::string::npos) << waited;
  EXPECT_LT(watch.ElapsedSeconds(), 10.0);
  EXPECT_EQ(box.BufferedBytes(), 0u);
  // Later receives fail the same way; the first abort's reason stays.
  box.Abort(42, AbortedError("second"));
  Status later = box.Receive(0, MakeTag(42, TagPhase::kMeshScatter, 9), Deadline::After(0), &out);
  EXPECT_NE(later.message().find("rank 2 (ap)"), std::string::npos) << later;
  // Another operation still waits for its own deadline.
  EXPECT_EQ(box.Receive(1, MakeTag(43, TagPhase::kMeshGather, 1), Deadline::After(1'000'000),
                        &out)
                .code(),
            StatusCode::kDeadlineExceeded);
}

TEST(Mailbox, RemembersABoundedNumberOfForgottenOperations) {
  Mailbox box(2);
  const uint64_t n = Mailbox::kMaxForgottenOps + 10;
  for (uint64_t op = 1; op <= n; ++op) box.Discard(op);
  EXPECT_EQ(box.ForgottenOps(), Mailbox::kMaxForgottenOps);
  // The oldest ids were forgotten: their messages are buffered again. The newest still drop.
  box.Deliver(1, MakeTag(1, TagPhase::kMeshScatter, 0), Bytes({1}));
  box.Deliver(1, MakeTag(n, TagPhase::kMeshScatter, 0), Bytes({1}));
  EXPECT_EQ(box.BufferedMessages(), 1u);
  EXPECT_EQ(box.DroppedMessages(), 1u);
}

TEST(Mailbox, DiscardPeerDropsOnlyThatPeersMessages) {
  Mailbox box(3);
  box.Deliver(1, 1, Bytes({1}));
  box.Deliver(1, 2, Bytes({2}));
  box.Deliver(2, 1, Bytes({3}));
  EXPECT_EQ(box.DiscardPeer(1), 2u);
  EXPECT_EQ(box.BufferedMessages(), 1u);
  std::vector<uint8_t> out;
  EXPECT_TRUE(box.Receive(2, 1, Deadline::After(0), &out).ok());
}

TEST(LocalWorld, AbortReachesEveryRankAndNamesTheAbortingRank) {
  LocalWorld world(3);
  const uint64_t tag = MakeTag(9, TagPhase::kMeshScatter, 0);
  world.transport(0).Send(1, tag, Bytes({1}), Deadline::AfterSeconds(1), nullptr);
  world.transport(2).Abort(9, DeadlineExceededError("no frame from rank 0"));
  EXPECT_EQ(world.BufferedMessages(1), 0u);
  std::vector<uint8_t> out;
  for (int r = 0; r < 3; ++r) {
    Status s = world.transport(r).Recv(0, tag, Deadline::AfterSeconds(10), &out);
    EXPECT_EQ(s.code(), StatusCode::kAborted) << s;
    EXPECT_NE(s.message().find(r == 2 ? "this rank aborted" : "rank 2 aborted"),
              std::string::npos)
        << s;
    EXPECT_NE(s.message().find("no frame from rank 0"), std::string::npos) << s;
  }
  // Late sends of the op are dropped on arrival.
  world.transport(0).Send(1, tag, Bytes({1}), Deadline::AfterSeconds(1), nullptr);
  EXPECT_EQ(world.BufferedMessages(1), 0u);
  EXPECT_EQ(world.mailbox(1).DroppedMessages(), 1u);
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

// RelayedConfirmations (gateway/relayed_confirmations.h): what the commit of a step learns from
// third regions -- kept per (operation, region), waited for with a deadline, and bounded.
#include "gateway/relayed_confirmations.h"

#include <gtest/gtest.h>

#include <chrono>
#include <thread>

#include "common/clock.h"

namespace strait::gateway {
namespace {

TEST(RelayedConfirmations, KeepsEachRegionOfEachOperationApart) {
  RelayedConfirmations r;
  r.Record(7, 1);
  EXPECT_TRUE(r.Has(7, 1));
  EXPECT_FALSE(r.Has(7, 2));
  EXPECT_FALSE(r.Has(8, 1));
  r.Record(7, 2);
  EXPECT_TRUE(r.Has(7, 2));
  r.Forget(7);
  EXPECT_FALSE(r.Has(7, 1));
  EXPECT_EQ(r.size(), 0u);
  r.Forget(7);  // forgetting twice, or what was never there, is harmless
  r.Forget(99);
}

TEST(RelayedConfirmations, WaitEndsWhenTheRelayComesOrAtTheDeadline) {
  RelayedConfirmations r;
  Stopwatch watch;
  EXPECT_FALSE(r.WaitFor(1, 2, Deadline::After(30'000'000)));
  EXPECT_GE(watch.ElapsedSeconds(), 0.029);
  // A relay for another operation or region does not end the wait; the right one does.
  std::thread relay([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    r.Record(1, 3);
    r.Record(5, 2);
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    r.Record(1, 2);
  });
  EXPECT_TRUE(r.WaitFor(1, 2, Deadline::AfterSeconds(30)));
  relay.join();
  EXPECT_TRUE(r.WaitFor(1, 2, Deadline::After(0)));  // already there: no wait
  EXPECT_TRUE(r.WaitFor(1, 2, Deadline::Infinite()));
}

TEST(RelayedConfirmations, OldestOperationsGoFirstBeyondTheBound) {
  RelayedConfirmations r(3);
  for (uint64_t op = 1; op <= 5; ++op) r.Record(op, 1);
  EXPECT_EQ(r.size(), 3u);
  EXPECT_FALSE(r.Has(1, 1));
  EXPECT_FALSE(r.Has(2, 1));
  EXPECT_TRUE(r.Has(3, 1));
  EXPECT_TRUE(r.Has(5, 1));
  // A forgotten one leaves room without pushing out another.
  r.Forget(4);
  r.Record(6, 2);
  EXPECT_TRUE(r.Has(3, 1));
  EXPECT_TRUE(r.Has(6, 2));
  EXPECT_EQ(r.size(), 3u);
  // A second region of a known operation takes no new room.
  r.Record(3, 2);
  EXPECT_TRUE(r.Has(5, 1));
  RelayedConfirmations none(0);
  none.Record(1, 1);
  EXPECT_FALSE(none.Has(1, 1));
}

}  // namespace
}  // namespace strait::gateway

// Tests of the gateway's op numbering: sequences per (job, key), a new world (a gateway
// restarted) starts everyone at epoch 0, a failure moves a job to the next epoch once however
// many gateways report it, a peer's failure of a step not numbered here yet waits for that
// step, failures reported for a world not reached yet still count, and the note that aborts
// carry round-trips.
#include "gateway/numbering.h"

#include <gtest/gtest.h>

namespace strait::gateway {
namespace {

TEST(OpNumbering, SequencesArePerJobAndKey) {
  OpNumbering n;
  EXPECT_EQ(n.Next("j", "a", 7).sequence, 0u);
  EXPECT_EQ(n.Next("j", "a", 7).sequence, 1u);
  EXPECT_EQ(n.Next("j", "b", 7).sequence, 0u);
  EXPECT_EQ(n.Next("k", "a", 7).sequence, 0u);
  const OpNumbering::Number x = n.Next("j", "a", 7);
  EXPECT_EQ(x.world, 7u);
  EXPECT_EQ(x.epoch, 0u);
  EXPECT_EQ(x.sequence, 2u);
}

TEST(OpNumbering, ANewWorldStartsAfreshAndMatchesARestartedGateway) {
  OpNumbering survivor;
  for (int i = 0; i < 5; ++i) survivor.Next("j", "a", 1);
  EXPECT_TRUE(survivor.Failed("j", "a", {1, 0, 4}));
  // A peer restarted: world 2. The restarted gateway has no state at all.
  OpNumbering restarted;
  const auto s = survivor.Next("j", "a", 2);
  const auto r = restarted.Next("j", "a", 2);
  EXPECT_EQ(OpNumbering::Word(s), OpNumbering::Word(r));
  EXPECT_EQ(s.epoch, 0u);
  EXPECT_EQ(s.sequence, 0u);
}

TEST(OpNumbering, AFailureMovesTheJobToTheNextEpochOnce) {
  OpNumbering n;
  n.Next("j", "a", 1);
  const auto failed = n.Next("j", "a", 1);
  n.Next("other", "a", 1);
  EXPECT_TRUE(n.Failed("j", "a", failed));
  // The same failure reported again (by another gateway's abort) changes nothing.
  EXPECT_FALSE(n.Failed("j", "a", failed));
  const auto next = n.Next("j", "a", 1);
  EXPECT_EQ(next.epoch, 1u);
  EXPECT_EQ(next.sequence, 0u);
  EXPECT_NE(OpNumbering::Word(next), OpNumbering::Word(failed));
  // Another job keeps its numbering.
  EXPECT_EQ(n.Next("other", "a", 1).sequence, 1u);
  EXPECT_EQ(n.restarts(), 1u);
}

TEST(OpNumbering, GatewaysThatSawTheFailureAtDifferentTimesAgree) {
  // A failed, then started op 0 of epoch 1 before B heard; B was at epoch 0 with 3 ops done.
  OpNumbering a, b;
  for (int i = 0; i < 3; ++i) {
    a.Next("j", "k", 9);
    b.Next("j", "k", 9);
  }
  EXPECT_TRUE(a.Failed("j", "k", {9, 0, 2}));
  EXPECT_TRUE(b.Failed("j", "k", {9, 0, 2}));  // A's abort reaches B
  EXPECT_EQ(OpNumbering::Word(a.Next("j", "k", 9)), OpNumbering::Word(b.Next("j", "k", 9)));
  // A lagging gateway that never heard of epoch 1 catches up with the next failure's abort.
  OpNumbering c;
  c.Next("j", "k", 9);
  EXPECT_TRUE(a.Failed("j", "k", {9, 1, 0}));
  EXPECT_TRUE(c.Failed("j", "k", {9, 1, 0}));
  EXPECT_EQ(OpNumbering::Word(a.Next("j", "k", 9)), OpNumbering::Word(c.Next("j", "k", 9)));
}

TEST(OpNumbering, APeersFailureOfAStepNotSentHereYetWaitsForThatStep) {
  // A failed step 2 of key k and moved on; B's client has sent only steps 0 and 1 when A's
  // abort arrives. B's step 2 must get A's failed number (and fail on the remembered abort), not
  // the number A gives its step 3.
  OpNumbering a, b;
  for (int i = 0; i < 3; ++i) a.Next("j", "k", 5);
  for (int i = 0; i < 2; ++i) b.Next("j", "k", 5);
  const OpNumbering::Number failed{5, 0, 2};
  EXPECT_TRUE(a.Failed("j", "k", failed));
  EXPECT_FALSE(b.Failed("j", "k", failed));   // held: B has not numbered step 2
  EXPECT_EQ(b.Next("j", "other", 5).epoch, 0u);  // keys issued before it stay in the epoch
  const auto b2 = b.Next("j", "k", 5);
  EXPECT_EQ(OpNumbering::Word(b2), OpNumbering::Word(failed));
  EXPECT_TRUE(b.Failed("j", "k", b2));  // B's step 2 fails on the abort: now B moves
  EXPECT_EQ(OpNumbering::Word(a.Next("j", "k", 5)), OpNumbering::Word(b.Next("j", "k", 5)));
}

TEST(OpNumbering, AHeldFailureWhoseStepPassedMovesAtTheNextStep) {
  // The held step was given out but never reported failed here (e.g. the transport had
  // forgotten the abort): the next step moves to the peer's epoch anyway.
  OpNumbering a, b;
  a.Next("j", "k", 5);
  EXPECT_TRUE(a.Failed("j", "k", {5, 0, 0}));
  EXPECT_FALSE(b.Failed("j", "k", {5, 0, 0}));
  b.Next("j", "k", 5);  // step 0, the failed one
  EXPECT_EQ(OpNumbering::Word(a.Next("j", "k", 5)), OpNumbering::Word(b.Next("j", "k", 5)));
}

TEST(OpNumbering, FailuresOfAWorldNotReachedYetStillCount) {
  OpNumbering n;
  n.Next("j", "a", 1);
  // Peers already number in world 2 and failed its step 0 of key a, which this gateway has not
  // numbered: held until it does.
  EXPECT_FALSE(n.Failed("j", "a", {2, 0, 0}));
  const auto x = n.Next("j", "a", 2);
  EXPECT_EQ(x.epoch, 0u);
  EXPECT_TRUE(n.Failed("j", "a", x));
  const auto y = n.Next("j", "a", 2);
  EXPECT_EQ(y.epoch, 1u);
  EXPECT_EQ(y.sequence, 0u);
  // A failure in an epoch beyond this gateway's moves it at once.
  OpNumbering m;
  EXPECT_TRUE(m.Failed("j", "a", {2, 3, 7}));
  EXPECT_EQ(m.Next("j", "a", 2).epoch, 4u);
}

TEST(OpNumbering, NoteRoundTripsAndRejectsOtherText) {
  OpNumbering::Number n{0xfedcba9876543210ull, 17, 5};
  const std::string note = OpNumbering::Note("job with spaces", "key 1", n);
  std::string job, key;
  OpNumbering::Number parsed;
  ASSERT_TRUE(OpNumbering::ParseNote(note, &job, &key, &parsed));
  EXPECT_EQ(job, "job with spaces");
  EXPECT_EQ(key, "key 1");
  EXPECT_EQ(parsed.world, n.world);
  EXPECT_EQ(parsed.epoch, 17u);
  EXPECT_EQ(parsed.sequence, 5u);
  EXPECT_FALSE(OpNumbering::ParseNote("", &job, &key, &parsed));
  EXPECT_FALSE(OpNumbering::ParseNote("numbering/2 12", &job, &key, &parsed));
  EXPECT_FALSE(OpNumbering::ParseNote("numbering/2 x 1 1 1 kj", &job, &key, &parsed));
  EXPECT_FALSE(OpNumbering::ParseNote("numbering/2 1 1 1 99 kj", &job, &key, &parsed));
  EXPECT_FALSE(OpNumbering::ParseNote("numbering/1 1 1 j", &job, &key, &parsed));
}

TEST(OpNumbering, WorldIncarnationDependsOnEveryIncarnationAndItsRank) {
  const uint64_t w = OpNumbering::WorldIncarnation({1, 2, 3});
  EXPECT_EQ(w, OpNumbering::WorldIncarnation({1, 2, 3}));
  EXPECT_NE(w, OpNumbering::WorldIncarnation({1, 2, 4}));
  EXPECT_NE(w, OpNumbering::WorldIncarnation({2, 1, 3}));
}

}  // namespace
}  // namespace strait::gateway

// Tests of gateway::Generations (generation.h): three gateways' agreements driven by hand, message
// by message, so that every ordering the links can produce (late, lost, repeated, a restarted
// peer) is exercised deterministically.
#include "gateway/generation.h"

#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace strait::gateway {
namespace {

class GenerationsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    for (int r = 0; r < 3; ++r) g_.push_back(std::make_unique<Generations>(r, names_));
  }
  // Delivers `m` from `from` to every other gateway, and their replies back to `from`; returns
  // the aborts the deliveries asked for.
  std::vector<std::pair<uint64_t, Status>> Broadcast(int from, const std::vector<uint8_t>& m) {
    std::vector<std::pair<uint64_t, Status>> aborts;
    for (int to = 0; to < 3; ++to) {
      if (to == from) continue;
      auto e = g_[to]->OnMessage(from, m);
      EXPECT_TRUE(e.ok()) << e.status();
      if (!e.ok()) continue;
      for (auto& a : e->aborts) aborts.push_back(a);
      if (e->reply) {
        auto back = g_[from]->OnMessage(to, *e->reply);
        EXPECT_TRUE(back.ok()) << back.status();
      }
    }
    return aborts;
  }
  // AwaitJoin, again after each raise of the proposal (the gateway then resends; here every
  // delivery is explicit, so the caller does).
  StatusOr<uint64_t> Await(int r, const std::string& job) {
    for (;;) {
      auto got = g_[r]->AwaitJoin(job, Deadline::After(1'000'000), {});
      if (got.ok() || got.status().message().rfind("proposal raised", 0) != 0) return got;
    }
  }
  // Every gateway joins `job`, then everyone hears everyone: returns the generation each agreed.
  std::vector<uint64_t> JoinAll(const std::string& job) {
    std::vector<std::pair<uint64_t, Status>> aborts;
    std::vector<std::vector<uint8_t>> msgs;
    for (int r = 0; r < 3; ++r) msgs.push_back(g_[r]->BeginJoin(job, 0, &aborts));
    for (int r = 0; r < 3; ++r) Broadcast(r, msgs[static_cast<size_t>(r)]);
    std::vector<uint64_t> out;
    for (int round = 0; round < 3 && out.size() < 3; ++round) {
      out.clear();
      for (int r = 0; r < 3; ++r) {
        auto got = Await(r, job);
        if (got.ok()) out.push_back(*got);
      }
      if (out.size() < 3) {
        for (int r = 0; r < 3; ++r) {
          Broadcast(r, g_[r]->StateMessage(job, GenerationMessageKind::kJoin));
        }
      }
    }
    return out;
  }

  std::vector<std::string> names_{"r0", "r1", "r2"};
  std::vector<std::unique_ptr<Generations>> g_;
};

TEST_F(GenerationsTest, AllJoinTheSameFirstGeneration) {
  EXPECT_EQ(JoinAll("job"), (std::vector<uint64_t>{1, 1, 1}));
  EXPECT_EQ(JoinAll("job"), (std::vector<uint64_t>{2, 2, 2}));
}

TEST_F(GenerationsTest, AJoinWaitsForEveryRegionAndNamesTheMissingOnes) {
  std::vector<std::pair<uint64_t, Status>> aborts;
  Broadcast(0, g_[0]->BeginJoin("job", 0, &aborts));
  Broadcast(1, g_[1]->BeginJoin("job", 0, &aborts));
  for (int round = 0; round < 2; ++round) {  // the gateways resend while they wait
    for (int r : {0, 1}) {
      EXPECT_FALSE(Await(r, "job").ok());
      Broadcast(r, g_[r]->StateMessage("job", GenerationMessageKind::kJoin));
    }
  }
  auto got = Await(0, "job");
  ASSERT_FALSE(got.ok());
  EXPECT_EQ(got.status().code(), StatusCode::kDeadlineExceeded);
  EXPECT_NE(got.status().message().find("r2"), std::string::npos) << got.status();
  EXPECT_EQ(got.status().message().find("r1"), std::string::npos) << got.status();
  EXPECT_EQ(g_[0]->Missing("job"), std::vector<int>{2});
}

TEST_F(GenerationsTest, ARestartedGatewayMeetsTheSurvivorsAtTheirNextGeneration) {
  ASSERT_EQ(JoinAll("job"), (std::vector<uint64_t>{1, 1, 1}));
  ASSERT_EQ(JoinAll("job"), (std::vector<uint64_t>{2, 2, 2}));
  g_[1] = std::make_unique<Generations>(1, names_);  // r1 restarts: it remembers nothing
  EXPECT_EQ(JoinAll("job"), (std::vector<uint64_t>{3, 3, 3}));
}

// What the restart soak caught: the survivors agreed generation 1 with r0's previous life and
// still run a step of it; the restarted r0 must not take their "1" for agreement with it.
TEST_F(GenerationsTest, ARestartedGatewayNeverAgreesOnTheSurvivorsOldGeneration) {
  ASSERT_EQ(JoinAll("job"), (std::vector<uint64_t>{1, 1, 1}));
  std::vector<uint8_t> announce;
  ASSERT_TRUE(g_[1]->BeginOp("job", 1, 3, "all-reduce key=k", 7, &announce).ok());
  g_[0] = std::make_unique<Generations>(0, names_);
  std::vector<std::pair<uint64_t, Status>> aborts;
  auto question = g_[0]->BeginJoin("job", 0, &aborts);
  Broadcast(0, question);  // the survivors answer with (1, 1): r0 now knows their state
  auto first = Await(0, "job");
  ASSERT_FALSE(first.ok()) << "agreed " << *first << " with nobody";
  // r0 proposes 2; telling the survivors ends their step of generation 1 at once.
  auto offer = g_[0]->StateMessage("job", GenerationMessageKind::kJoin);
  const auto ended = Broadcast(0, offer);
  ASSERT_EQ(ended.size(), 1u);
  EXPECT_EQ(ended[0].first, 7u);
  EXPECT_FALSE(Await(0, "job").ok());  // the survivors' ranks have not joined again yet
  EXPECT_TRUE(g_[1]->EndOp(7).ok());
  EXPECT_EQ(JoinAll("job"), (std::vector<uint64_t>{2, 2, 2}));
}

// A step that completed in some regions only (a gateway killed between its commit and its rank's
// read): the ranks would go on one step apart, so every region's join says so instead.
TEST_F(GenerationsTest, RanksResumingAtDifferentStepsAreRefusedEverywhere) {
  std::vector<std::pair<uint64_t, Status>> aborts;
  const uint64_t resume[3] = {11, 11, 10};  // 1 + steps completed: r2 lost step 10's result
  for (int r = 0; r < 3; ++r) Broadcast(r, g_[r]->BeginJoin("job", resume[r], &aborts));
  bool refused[3] = {false, false, false};
  for (int round = 0; round < 4; ++round) {
    for (int r = 0; r < 3; ++r) {
      auto got = g_[r]->AwaitJoin("job", Deadline::After(1'000'000), {});
      if (!got.ok() && got.status().code() == StatusCode::kFailedPrecondition) {
        refused[r] = true;
        const std::string_view text = got.status().message();
        EXPECT_NE(text.find("r0 10, r1 10, r2 9"), std::string::npos) << got.status();
        // Both ways a step ends in some regions only, and what to do about it.
        EXPECT_NE(text.find("a gateway was lost, or a link between regions was down"),
                  std::string::npos)
            << got.status();
        EXPECT_NE(text.find("restart every rank of the job from its last checkpoint"),
                  std::string::npos)
            << got.status();
      }
      EXPECT_FALSE(got.ok()) << "r" << r << " joined although r2 is a step behind";
      Broadcast(r, g_[r]->StateMessage("job", GenerationMessageKind::kJoin));
    }
  }
  for (int r = 0; r < 3; ++r) EXPECT_TRUE(refused[r]) << "r" << r << " was not told";
}

TEST_F(GenerationsTest, ANewerGenerationAbortsOlderStepsAndRefusesLaterOnes) {
  ASSERT_EQ(JoinAll("job"), (std::vector<uint64_t>{1, 1, 1}));
  std::vector<uint8_t> announce;
  ASSERT_TRUE(g_[1]->BeginOp("job", 1, 0, "all-reduce key=k", 42, &announce).ok());
  // r0's ranks failed and created a new comm: r1's step of generation 1 ends at once.
  std::vector<std::pair<uint64_t, Status>> aborts;
  auto join = g_[0]->BeginJoin("job", 0, &aborts);
  auto e = g_[1]->OnMessage(0, join);
  ASSERT_TRUE(e.ok());
  ASSERT_EQ(e->aborts.size(), 1u);
  EXPECT_EQ(e->aborts[0].first, 42u);
  EXPECT_EQ(e->aborts[0].second.code(), StatusCode::kAborted);
  EXPECT_NE(e->aborts[0].second.message().find("r0 joined generation 2"), std::string::npos)
      << e->aborts[0].second;
  EXPECT_TRUE(g_[1]->EndOp(42).ok());
  // A late request of generation 1 is refused, never run.
  Status late = g_[1]->BeginOp("job", 1, 1, "all-reduce key=k", 43, &announce);
  EXPECT_EQ(late.code(), StatusCode::kAborted) << late;
  // A generation this gateway never agreed (a comm from before its restart) is refused.
  Status unknown = g_[2]->BeginOp("job", 7, 0, "all-reduce key=k", 44, &announce);
  EXPECT_EQ(unknown.code(), StatusCode::kFailedPrecondition) << unknown;
}

TEST_F(GenerationsTest, RegionsThatDisagreeOnAStepGetBothIdentitiesNamed) {
  ASSERT_EQ(JoinAll("job"), (std::vector<uint64_t>{1, 1, 1}));
  std::vector<uint8_t> a0, a1;
  ASSERT_TRUE(g_[0]->BeginOp("job", 1, 5, "all-reduce key=w count=10", 1, &a0).ok());
  // r1's step 5 is another tensor: r0 hears of it while its own runs...
  ASSERT_TRUE(g_[1]->BeginOp("job", 1, 4, "all-reduce key=w count=10", 2, &a1).ok());
  std::vector<uint8_t> a1b;
  auto e = g_[1]->OnMessage(0, a0);  // r1 stores r0's step 5 (its own is not there yet)
  ASSERT_TRUE(e.ok());
  EXPECT_TRUE(e->aborts.empty());
  Status s = g_[1]->BeginOp("job", 1, 5, "all-reduce key=b count=99", 3, &a1b);
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition) << s;
  EXPECT_NE(s.message().find("key=b count=99"), std::string::npos) << s;
  EXPECT_NE(s.message().find("key=w count=10"), std::string::npos) << s;
  // ...and r0, running step 5, learns it from r1's announcement.
  std::vector<uint8_t> other;
  Generations spare(1, names_);
  auto e0 = g_[0]->OnMessage(
      1, std::vector<uint8_t>(a0.begin(), a0.end()));  // its own text back: a match, nothing
  ASSERT_TRUE(e0.ok());
  EXPECT_TRUE(e0->aborts.empty());
  ASSERT_TRUE(g_[2]->BeginOp("job", 1, 5, "all-reduce key=b count=99", 9, &other).ok());
  auto e1 = g_[0]->OnMessage(2, other);
  ASSERT_TRUE(e1.ok());
  ASSERT_EQ(e1->aborts.size(), 1u);
  EXPECT_EQ(e1->aborts[0].first, 1u);
  Status mismatch = g_[0]->EndOp(1);
  EXPECT_EQ(mismatch.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(mismatch.message().find("region r2 has all-reduce key=b"), std::string::npos)
      << mismatch;
}

// Identities that differ only in what the gateways add (" chunk=...", numbering.h) come from
// gateways configured or built differently, not from ranks out of step: the error says which.
TEST_F(GenerationsTest, AChunkSizeMismatchIsNamedAsTheGatewaysNotTheRanks) {
  ASSERT_EQ(JoinAll("job"), (std::vector<uint64_t>{1, 1, 1}));
  const std::string step = "all-reduce key=w count=10";
  std::vector<uint8_t> a0, a1, a2;
  ASSERT_TRUE(g_[0]->BeginOp("job", 1, 7, step + " chunk=131072", 1, &a0).ok());
  ASSERT_TRUE(g_[1]->OnMessage(0, a0).ok());
  // Announced first by r0, found by r1 when it begins the step.
  Status s = g_[1]->BeginOp("job", 1, 7, step + " chunk=65536", 2, &a1);
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition) << s;
  EXPECT_NE(s.message().find("has " + step + " chunk=65536, region r0 has " + step +
                             " chunk=131072"),
            std::string::npos)
      << s;
  EXPECT_NE(s.message().find("gateways cut it differently"), std::string::npos) << s;
  EXPECT_NE(s.message().find("allreduce.chunk_elements"), std::string::npos) << s;
  // An older straitd adds no marker at all: the same hint, found by the running side this time.
  auto e = g_[0]->OnMessage(
      2, EncodeGenerationMessage(GenerationMessageKind::kAnnounce, "job", 1, 7, 0,
                                 std::span<const uint8_t>(
                                     reinterpret_cast<const uint8_t*>(step.data()), step.size())));
  ASSERT_TRUE(e.ok()) << e.status();
  ASSERT_EQ(e->aborts.size(), 1u);
  EXPECT_NE(e->aborts[0].second.message().find("gateways cut it differently"), std::string::npos)
      << e->aborts[0].second;
  // r1 refused the step but still announced its identity: r0, running the step under another
  // op id that r1's abort never reaches, ends it on hearing that (not at its deadline).
  ASSERT_FALSE(a1.empty());
  auto e1 = g_[0]->OnMessage(1, a1);
  ASSERT_TRUE(e1.ok()) << e1.status();
  ASSERT_EQ(e1->aborts.size(), 1u);
  EXPECT_EQ(e1->aborts[0].first, 1u);
  EXPECT_NE(e1->aborts[0].second.message().find("region r1 has " + step + " chunk=65536"),
            std::string::npos)
      << e1->aborts[0].second;
  // Different steps keep the ranks' hint.
  std::vector<uint8_t> a3;
  Status other = g_[2]->BeginOp("job", 1, 8, "all-reduce key=b count=3 chunk=131072", 3, &a3);
  ASSERT_TRUE(other.ok()) << other;
  ASSERT_TRUE(g_[0]->BeginOp("job", 1, 8, step + " chunk=131072", 4, &a2).ok());
  auto e2 = g_[0]->OnMessage(2, a3);
  ASSERT_TRUE(e2.ok());
  ASSERT_EQ(e2->aborts.size(), 1u);
  EXPECT_NE(e2->aborts[0].second.message().find("must issue the same all-reduces"),
            std::string::npos)
      << e2->aborts[0].second;
}

// The stats' numbered_ops_in_flight: an operation counts from BeginOp to EndOp under its op id;
// a refused one never counts, and ending an unknown op id changes nothing.
TEST_F(GenerationsTest, OpsInFlightCountsFromBeginToEnd) {
  ASSERT_EQ(JoinAll("job"), (std::vector<uint64_t>{1, 1, 1}));
  std::vector<uint8_t> announce;
  EXPECT_EQ(g_[0]->OpsInFlight(), 0u);
  ASSERT_TRUE(g_[0]->BeginOp("job", 1, 0, "all-reduce key=w", 11, &announce).ok());
  ASSERT_TRUE(g_[0]->BeginOp("job", 1, 1, "all-reduce key=b", 12, &announce).ok());
  EXPECT_FALSE(g_[0]->BeginOp("job", 9, 0, "all-reduce key=w", 13, &announce).ok());
  EXPECT_EQ(g_[0]->OpsInFlight(), 2u);
  EXPECT_TRUE(g_[0]->EndOp(99).ok());
  EXPECT_EQ(g_[0]->OpsInFlight(), 2u);
  EXPECT_TRUE(g_[0]->EndOp(11).ok());
  EXPECT_TRUE(g_[0]->EndOp(12).ok());
  EXPECT_EQ(g_[0]->OpsInFlight(), 0u);
}

TEST_F(GenerationsTest, BadMessagesAreRefusedWithTheField) {
  EXPECT_EQ(g_[0]->OnMessage(1, std::vector<uint8_t>(5, 0)).status().code(),
            StatusCode::kDataLoss);
  std::vector<std::pair<uint64_t, Status>> aborts;
  auto m = g_[1]->BeginJoin("job", 0, &aborts);
  auto wrong_version = m;
  wrong_version[0] = 9;
  EXPECT_NE(g_[0]->OnMessage(1, wrong_version).status().message().find("version 9"),
            std::string::npos);
  auto wrong_kind = m;
  wrong_kind[1] = 77;
  EXPECT_EQ(g_[0]->OnMessage(1, wrong_kind).status().code(), StatusCode::kDataLoss);
  auto long_job = m;
  long_job[2] = 0xff;
  EXPECT_EQ(g_[0]->OnMessage(1, long_job).status().code(), StatusCode::kDataLoss);
  EXPECT_FALSE(g_[0]->OnMessage(0, m).ok());  // from itself
  EXPECT_TRUE(g_[0]->OnMessage(1, m).ok());
}

}  // namespace
}  // namespace strait::gateway

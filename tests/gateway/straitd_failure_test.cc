// A region killed mid-step and restarted, with real straitd processes over strait-wanem (root
// only; skipped otherwise): three regions, one gateway each, clients through the C++ client.
//   step 1: every region all-reduces; the results are the reference sum, bit-identical.
//   step 2: two regions start the all-reduce, the third one's client never sends and its straitd
//           is SIGKILLed while the other two wait: both get an error naming the dead region
//           within the configured deadline (plus a generous margin: a correctness bound, not a
//           speed claim).
//   restart: the dead region's straitd starts again with the same config (it has lost its
//           per-key sequences); the survivors see its new incarnation.
//   step 3: every region all-reduces again and gets the correct, bit-identical result, which
//           needs every gateway to have joined the new generation (see gateway.h).
// A second test has one region's client come to step 2 only after the other two failed it (its
// gateway heard their aborts first): its step 2 fails at once too, and step 3 matches on all
// three. Two more cut one region pair just as the regions confirm a step (one briefly, one past
// link.unreachable_after, so that each end sees the other gone): the third region relays the
// confirmations, and all three commit it. (A client that skips a step altogether
// breaks the contract every rank keeps -- the same all-reduces in the same order, as with NCCL --
// and is not recovered from.)
#include <gtest/gtest.h>

#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "bench/wanem/emulator.h"
#include "bench/wanem/netns.h"
#include "common/clock.h"
#include "localproto/client.h"
#include "tests/gateway/wan_cluster.h"

namespace strait::gateway {

// The local protocol and its client (strait::localproto), which these tests drive.
using namespace strait::localproto;  // NOLINT(build/namespaces)
namespace {

using testing::WanCluster;
using testing::OneGatewayPerRegion;
using testing::WanClusterOptions;

constexpr int kRegions = 3;
constexpr size_t kCount = 30000;  // 120 KB per region: several link chunks, still small
constexpr int64_t kDeadlineSeconds = 8;
constexpr char kJob[] = "failjob";
constexpr char kKey[] = "grad";

// Region `r`'s input for `step`: distinct per region and step, exact in fp32.
std::vector<float> Input(int r, int step) {
  std::vector<float> v(kCount);
  for (size_t i = 0; i < kCount; ++i) {
    v[i] = static_cast<float>(static_cast<int>((i * 7 + static_cast<size_t>(r) * 13 +
                                                static_cast<size_t>(step) * 29) %
                                               1001) -
                              500) *
           0.125f * static_cast<float>(r + 1);
  }
  return v;
}

// The gateways' result for codec none: the fp32 sum in rank order (regions r0, r1, r2).
std::vector<float> Reference(int step) {
  std::vector<float> sum = Input(0, step);
  for (int r = 1; r < kRegions; ++r) {
    const std::vector<float> in = Input(r, step);
    for (size_t i = 0; i < kCount; ++i) sum[i] += in[i];
  }
  return sum;
}

StatusOr<std::unique_ptr<Client>> Connect(const WanCluster& cluster, int r) {
  auto client = Client::Connect(cluster.Socket(r, 0), Deadline::AfterSeconds(10),
                                "failure-test-" + WanCluster::RegionName(r));
  if (!client.ok()) return client.status();
  // Lossless, so that the result can be checked exactly.
  auto policy = (*client)->RegisterJob(kJob, "none", Deadline::AfterSeconds(10));
  if (!policy.ok()) return policy.status();
  return client;
}

// Runs step `step` on the regions in `regions` at once; returns each one's status and result.
struct StepResult {
  std::vector<Status> status = std::vector<Status>(kRegions, InternalError("did not run"));
  std::vector<std::vector<float>> data = std::vector<std::vector<float>>(kRegions);
  std::vector<double> seconds = std::vector<double>(kRegions, 0.0);
};
StepResult RunStep(std::vector<std::unique_ptr<Client>>& clients, const std::vector<int>& regions,
                   int step, const std::function<void()>& while_running = nullptr) {
  StepResult result;
  Stopwatch watch;
  std::vector<std::thread> threads;
  for (int r : regions) {
    threads.emplace_back([&, r] {
      const size_t i = static_cast<size_t>(r);
      result.data[i] = Input(r, step);
      // The client waits a little longer than the gateway's deadline for the gateway's reason.
      result.status[i] =
          clients[i]->AllReduce(kJob, kKey, DataType::kFloat32, ReduceOp::kSum,
                                result.data[i].data(), kCount,
                                Deadline::AfterSeconds(kDeadlineSeconds + 20));
      result.seconds[i] = watch.ElapsedSeconds();
    });
  }
  if (while_running) while_running();
  for (auto& t : threads) t.join();
  return result;
}

void ExpectCorrectAndIdentical(const StepResult& result, int step) {
  const std::vector<float> want = Reference(step);
  for (int r = 0; r < kRegions; ++r) {
    const size_t i = static_cast<size_t>(r);
    ASSERT_TRUE(result.status[i].ok()) << WanCluster::RegionName(r) << ": " << result.status[i];
    // The inputs are multiples of 1/8 far below 2^24: every partial sum is exact in fp32.
    EXPECT_EQ(std::memcmp(result.data[i].data(), want.data(), kCount * sizeof(float)), 0)
        << WanCluster::RegionName(r) << " step " << step << ": wrong sum";
    EXPECT_EQ(std::memcmp(result.data[i].data(), result.data[0].data(), kCount * sizeof(float)),
              0)
        << WanCluster::RegionName(r) << " step " << step << ": not bit-identical to r0";
  }
}

// The killed region: r0 dials both others (its restart brings new links by itself); r2 is
// dialed by both (their old links must learn that it restarted and dial new ones).
class StraitdFailure : public ::testing::TestWithParam<int> {};

TEST_P(StraitdFailure, RegionKilledMidStepFailsFastAndTheNextStepAfterItsRestartWorks) {
  if (Status priv = wanem::CheckPrivileges(); !priv.ok()) {
    GTEST_SKIP() << "needs strait-wanem (root): " << priv.message();
  }
  const int kKilled = GetParam();
  std::vector<int> survivors;
  for (int r = 0; r < kRegions; ++r) {
    if (r != kKilled) survivors.push_back(r);
  }

  WanClusterOptions o = OneGatewayPerRegion(STRAITD_PATH, "kill" + std::to_string(kKilled),
                                            kRegions, kDeadlineSeconds);
  auto cluster = WanCluster::Start(o);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  WanCluster& c = **cluster;

  std::vector<std::unique_ptr<Client>> clients(kRegions);
  for (int r = 0; r < kRegions; ++r) {
    auto client = Connect(c, r);
    ASSERT_TRUE(client.ok()) << WanCluster::RegionName(r) << ": " << client.status();
    clients[static_cast<size_t>(r)] = std::move(client).value();
  }

  // Step 1: everyone.
  {
    SCOPED_TRACE("step 1");
    ExpectCorrectAndIdentical(RunStep(clients, {0, 1, 2}, 1), 1);
  }

  // Step 2: the survivors start; once both are waiting inside their all-reduce, the killed
  // region's straitd dies (its client never sends step 2).
  const std::string dead = WanCluster::RegionName(kKilled);
  StepResult step2 = RunStep(clients, survivors, 2, [&] {
    const Deadline until = Deadline::AfterSeconds(kDeadlineSeconds);
    for (int r : survivors) EXPECT_EQ(c.WaitForStat(r, 0, "in_flight", 1, until), 1) << r;
    c.Kill(kKilled, 0);
  });
  // A survivor waits on whichever peer it needs next: the dead region, or the other survivor
  // that waits on the dead region (and then aborts, quoting its reason). At least one error names
  // the dead region; each is one of the failure codes, and none waits past the deadline.
  bool named = false;
  for (int r : survivors) {
    const size_t i = static_cast<size_t>(r);
    const Status& s = step2.status[i];
    SCOPED_TRACE("step 2 on " + WanCluster::RegionName(r));
    named = named || s.message().find("rank " + std::to_string(kKilled) + " (" + dead + ")") !=
                         std::string::npos;
    EXPECT_FALSE(s.ok()) << "an all-reduce without " << dead << " succeeded";
    EXPECT_TRUE(s.code() == StatusCode::kDeadlineExceeded || s.code() == StatusCode::kAborted ||
                s.code() == StatusCode::kUnavailable)
        << s;
    EXPECT_NE(s.message().find("all-reduce of " + std::string(kJob) + "/" + kKey),
              std::string::npos)
        << s;
    EXPECT_LT(step2.seconds[i], static_cast<double>(kDeadlineSeconds) + 5.0) << s;
  }
  EXPECT_TRUE(named) << "no error names the dead region " << dead << ": "
                     << step2.status[static_cast<size_t>(survivors[0])] << " / "
                     << step2.status[static_cast<size_t>(survivors[1])];

  // Restart with the same config: its sequences are gone. Once the survivors heard its new
  // incarnation (the hello on the new links), every gateway numbers from a fresh start.
  ASSERT_TRUE(c.Restart(kKilled, 0).ok()) << c.Logs(kKilled, 0);
  for (int r : survivors) {
    EXPECT_EQ(c.WaitForStat(r, 0, "peer_restarts", 1, Deadline::AfterSeconds(20)), 1)
        << WanCluster::RegionName(r) << " did not see " << dead << " restart\n"
        << c.Logs(r, 0);
  }
  auto reconnected = Connect(c, kKilled);
  ASSERT_TRUE(reconnected.ok()) << reconnected.status();
  clients[static_cast<size_t>(kKilled)] = std::move(reconnected).value();

  // Step 3: everyone again, correct and bit-identical.
  {
    SCOPED_TRACE("step 3");
    const StepResult step3 = RunStep(clients, {0, 1, 2}, 3);
    const bool failed_before = HasFailure();
    ExpectCorrectAndIdentical(step3, 3);
    if (HasFailure() && !failed_before) {
      for (int r = 0; r < kRegions; ++r) ADD_FAILURE() << c.Logs(r, 0);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Killed, StraitdFailure, ::testing::Values(0, 2),
                         [](const ::testing::TestParamInfo<int>& p) {
                           return "r" + std::to_string(p.param);
                         });

// The other way regions could drift apart: one region's client comes to a step only after the
// others failed it, so their aborts reach its gateway before its client sends the step. The step's
// identity is the same everywhere, so the transport's remembered abort fails it at once; then
// every client joins a new generation and step 3 pairs with step 3 (gateway.h, "Operations").
TEST(StraitdLateStep, ARegionLateToAFailedStepFailsItTooAndStaysInStep) {
  if (Status priv = wanem::CheckPrivileges(); !priv.ok()) {
    GTEST_SKIP() << "needs strait-wanem (root): " << priv.message();
  }
  WanClusterOptions o = OneGatewayPerRegion(STRAITD_PATH, "late", kRegions, kDeadlineSeconds);
  auto cluster = WanCluster::Start(o);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  WanCluster& c = **cluster;
  std::vector<std::unique_ptr<Client>> clients(kRegions);
  for (int r = 0; r < kRegions; ++r) {
    auto client = Connect(c, r);
    ASSERT_TRUE(client.ok()) << WanCluster::RegionName(r) << ": " << client.status();
    clients[static_cast<size_t>(r)] = std::move(client).value();
  }
  {
    SCOPED_TRACE("step 1");
    ExpectCorrectAndIdentical(RunStep(clients, {0, 1, 2}, 1), 1);
  }
  // Step 2: r1 (a middle rank: it neither dials nor is dialed by everyone) comes only after
  // r0 and r2 gave up on it, so their aborts reach r1's gateway before r1's client sends the
  // step. r1's step 2 must fail too (at once, on the remembered abort) -- never pair with the
  // others' step 3, which would sum two different steps.
  const StepResult step2 = RunStep(clients, {0, 2}, 2);
  for (int r : {0, 2}) {
    const Status& s = step2.status[static_cast<size_t>(r)];
    EXPECT_FALSE(s.ok()) << WanCluster::RegionName(r) << ": an all-reduce without r1 succeeded";
    EXPECT_LT(step2.seconds[static_cast<size_t>(r)],
              static_cast<double>(kDeadlineSeconds) + 5.0)
        << s;
  }
  const StepResult late = RunStep(clients, {1}, 2);
  EXPECT_EQ(late.status[1].code(), StatusCode::kAborted) << late.status[1];
  EXPECT_LT(late.seconds[1], kDeadlineSeconds / 2.0) << "r1 waited instead of failing on the abort";
  {
    SCOPED_TRACE("step 3");
    ExpectCorrectAndIdentical(RunStep(clients, {0, 1, 2}, 3), 3);
  }
}

// The cut-pair tests: three regions, one client each, step 1 done.
struct CutPairCluster {
  std::unique_ptr<WanCluster> cluster;
  std::vector<std::unique_ptr<Client>> clients = std::vector<std::unique_ptr<Client>>(kRegions);
};
// `link_ends_after` is link.stream_timeout and link.unreachable_after alike.
void StartCutPairCluster(const std::string& name, const std::string& link_ends_after,
                         CutPairCluster* out) {
  WanClusterOptions o = OneGatewayPerRegion(STRAITD_PATH, name, kRegions, kDeadlineSeconds);
  o.stream_timeout = o.unreachable_after = link_ends_after;
  auto cluster = WanCluster::Start(o);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  out->cluster = std::move(cluster).value();
  for (int r = 0; r < kRegions; ++r) {
    auto client = Connect(*out->cluster, r);
    ASSERT_TRUE(client.ok()) << WanCluster::RegionName(r) << ": " << client.status();
    out->clients[static_cast<size_t>(r)] = std::move(client).value();
  }
  SCOPED_TRACE("step 1");
  ExpectCorrectAndIdentical(RunStep(out->clients, {0, 1, 2}, 1), 1);
}

// Cuts (loss 1.0 both ways) or restores the r1-r2 pair.
void SetPairCut(WanCluster& c, const wanem::LinkParams& up, bool cut) {
  wanem::LinkParams params = up;
  if (cut) params.loss = 1.0;
  ASSERT_TRUE(c.emulator().SetLink(1, 2, params).ok());
  ASSERT_TRUE(c.emulator().SetLink(2, 1, params).ok());
}

// A one-element all-reduce (r0 owns it alone: collective/plan.h) on every region at once: r1 and
// r2 exchange nothing but control messages, so a cut between them hits only the commit
// confirmation. Every region must commit 1 + 2 + 3, long before the deadline.
void ExpectOneElementStepCommits(std::vector<std::unique_ptr<Client>>& clients) {
  std::vector<Status> status(kRegions);
  std::vector<float> value(kRegions);
  std::vector<double> seconds(kRegions);
  {
    Stopwatch watch;
    std::vector<std::thread> threads;
    for (int r = 0; r < kRegions; ++r) {
      threads.emplace_back([&, r] {
        const size_t i = static_cast<size_t>(r);
        value[i] = static_cast<float>(r + 1);
        status[i] = clients[i]->AllReduce(kJob, "one", DataType::kFloat32, ReduceOp::kSum,
                                          &value[i], 1,
                                          Deadline::AfterSeconds(kDeadlineSeconds + 20));
        seconds[i] = watch.ElapsedSeconds();
      });
    }
    for (auto& t : threads) t.join();
  }
  for (int r = 0; r < kRegions; ++r) {
    const size_t i = static_cast<size_t>(r);
    EXPECT_TRUE(status[i].ok()) << WanCluster::RegionName(r) << " (r1-r2 cut): " << status[i];
    EXPECT_EQ(value[i], 6.0f) << WanCluster::RegionName(r);
    // A relayed confirmation arrives a few milliseconds after the direct one would have.
    EXPECT_LT(seconds[i], kDeadlineSeconds / 2.0) << WanCluster::RegionName(r);
  }
}

// A region pair cut while the regions confirm a step (bench/chaos.sh's flap of one pair found
// this): r1's and r2's confirmations to each other are lost, while r0 holds both. r0 relays each
// confirmation it received to the third region (commit.cc), so every region commits the step --
// without the relay r0 committed and r1 and r2 failed at their deadline, leaving the regions a
// step apart. Step 3, with the pair back, proves they stayed in step.
TEST(StraitdCutPair, APairCutDuringTheCommitStillCommitsTheStepEverywhere) {
  if (Status priv = wanem::CheckPrivileges(); !priv.ok()) {
    GTEST_SKIP() << "needs strait-wanem (root): " << priv.message();
  }
  CutPairCluster cp;
  ASSERT_NO_FATAL_FAILURE(StartCutPairCluster("cut", "10s", &cp));
  WanCluster& c = *cp.cluster;
  const wanem::LinkParams up = c.emulator().Stats().params[1][2];
  ASSERT_NO_FATAL_FAILURE(SetPairCut(c, up, true));
  ExpectOneElementStepCommits(cp.clients);
  ASSERT_NO_FATAL_FAILURE(SetPairCut(c, up, false));
  SCOPED_TRACE("step 3, the pair back up");
  ExpectCorrectAndIdentical(RunStep(cp.clients, {0, 1, 2}, 3), 3);
}

// The same pair cut before the step, for longer than link.stream_timeout (its streams declared
// dead) and link.unreachable_after (no new one) together: r1's and r2's links to each other have
// ended, the transport reports each the other gone (a receive from it ends at
// once instead of waiting), and the confirmation can only come relayed through r0 -- which
// commit.cc waits for a moment after the other regions confirmed rather than failing at once.
// Once the pair is back the dialing side's new link joins them again, and step 3 matches.
TEST(StraitdCutPair, APairUnreachableThroughTheCommitIsConfirmedThroughTheThirdRegion) {
  if (Status priv = wanem::CheckPrivileges(); !priv.ok()) {
    GTEST_SKIP() << "needs strait-wanem (root): " << priv.message();
  }
  CutPairCluster cp;
  ASSERT_NO_FATAL_FAILURE(StartCutPairCluster("gone", "1s", &cp));
  WanCluster& c = *cp.cluster;
  const wanem::LinkParams up = c.emulator().Stats().params[1][2];
  ASSERT_NO_FATAL_FAILURE(SetPairCut(c, up, true));
  const auto only_r0 = [](int64_t v) { return v == 1; };
  for (int r : {1, 2}) {
    ASSERT_EQ(c.WaitForStat(r, 0, "peer_links_open", only_r0, Deadline::AfterSeconds(20)), 1)
        << WanCluster::RegionName(r) << "'s link to the other end of the cut did not end\n"
        << c.Logs(r, 0);
  }
  ExpectOneElementStepCommits(cp.clients);
  ASSERT_NO_FATAL_FAILURE(SetPairCut(c, up, false));
  const auto both = [](int64_t v) { return v == 2; };
  for (int r : {1, 2}) {
    ASSERT_EQ(c.WaitForStat(r, 0, "peer_links_open", both, Deadline::AfterSeconds(30)), 2)
        << WanCluster::RegionName(r) << " did not get its link to the other end back\n"
        << c.Logs(r, 0);
  }
  SCOPED_TRACE("step 3, the pair back up");
  ExpectCorrectAndIdentical(RunStep(cp.clients, {0, 1, 2}, 3), 3);
}

}  // namespace
}  // namespace strait::gateway

// Dial-only regions (config.h, "Dial-only regions") with real straitd processes over
// strait-wanem and mutual TLS (root only; skipped otherwise): three regions, one gateway each;
// r2 sits behind a one-way firewall (`*>2=syn=drop`: no TCP connection into it completes).
//   configured dial-only: r2 dials both links (to r0 and r1, which rank below it and would
//     dial it by the rank rule); the all-reduce is correct and bit-identical everywhere. Then
//     r0 (an accepting side) restarts: r2 notices and dials it again; once every rank recreated
//     its comm (as after any gateway restart) the next step works. Then r2 itself restarts: it
//     dials both again; the next step works.
//   not configured: the same firewall fails the all-reduce within its deadline, with an error
//     that names r2 and says how to configure a region behind NAT, and the SYNs r0 and r1 sent
//     into r2 were dropped (the rule bites).
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

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
constexpr int kNat = 2;           // the region behind the firewall
constexpr size_t kCount = 30000;  // 120 KB per region: several link chunks, still small
constexpr int64_t kDeadlineSeconds = 8;
constexpr char kJob[] = "dialjob";
constexpr char kKey[] = "grad";

// Region `r`'s input for `step`: distinct per region and step, exact in fp32.
std::vector<float> Input(int r, int step) {
  std::vector<float> v(kCount);
  for (size_t i = 0; i < kCount; ++i) {
    const int k = static_cast<int>((i * 11 + static_cast<size_t>(r) * 17 +
                                    static_cast<size_t>(step) * 31) % 997);
    v[i] = static_cast<float>(k - 498) * 0.25f * static_cast<float>(r + 1);
  }
  return v;
}

WanClusterOptions Options(const std::string& tag, bool dial_only_config) {
  WanClusterOptions o = OneGatewayPerRegion(STRAITD_PATH, tag, kRegions, kDeadlineSeconds);
  o.pair_overrides = {"*>" + std::to_string(kNat) + "=syn=drop"};
  if (dial_only_config) o.dial_only_regions = {kNat};
  return o;  // TLS, as in production (the WanCluster default)
}

StatusOr<std::unique_ptr<Client>> Connect(const WanCluster& cluster, int r) {
  auto client = Client::Connect(cluster.Socket(r, 0), Deadline::AfterSeconds(10),
                                "dial-test-" + WanCluster::RegionName(r));
  if (!client.ok()) return client.status();
  // Lossless, so that the result can be checked exactly.
  auto policy = (*client)->RegisterJob(kJob, "none", Deadline::AfterSeconds(10));
  if (!policy.ok()) return policy.status();
  return client;
}

// A new client (a new comm) per region, registered for the job. After a gateway restart every
// rank recreates its comm, so that all regions join one new generation (gateway.h,
// "Operations"); that is the same with or without dial-only regions.
::testing::AssertionResult ConnectAll(const WanCluster& c,
                                      std::vector<std::unique_ptr<Client>>& clients) {
  for (int r = 0; r < kRegions; ++r) {
    auto client = Connect(c, r);
    if (!client.ok()) {
      return ::testing::AssertionFailure() << WanCluster::RegionName(r) << ": " << client.status();
    }
    clients[static_cast<size_t>(r)] = std::move(client).value();
  }
  return ::testing::AssertionSuccess();
}

struct StepResult {
  std::vector<Status> status = std::vector<Status>(kRegions, InternalError("did not run"));
  std::vector<std::vector<float>> data = std::vector<std::vector<float>>(kRegions);
  std::vector<double> seconds = std::vector<double>(kRegions, 0.0);
};

// Every region all-reduces step `step` at once.
StepResult RunStep(std::vector<std::unique_ptr<Client>>& clients, int step) {
  StepResult result;
  Stopwatch watch;
  std::vector<std::thread> threads;
  for (int r = 0; r < kRegions; ++r) {
    threads.emplace_back([&, r] {
      const size_t i = static_cast<size_t>(r);
      result.data[i] = Input(r, step);
      // The client waits a little longer than the gateway's deadline for the gateway's reason.
      result.status[i] = clients[i]->AllReduce(kJob, kKey, DataType::kFloat32, ReduceOp::kSum,
                                               result.data[i].data(), kCount,
                                               Deadline::AfterSeconds(kDeadlineSeconds + 20));
      result.seconds[i] = watch.ElapsedSeconds();
    });
  }
  for (auto& t : threads) t.join();
  return result;
}

// The result is the fp32 sum in rank order on every region (the inputs are multiples of 1/4
// far below 2^24, so every partial sum is exact), bit-identical everywhere.
void ExpectCorrectAndIdentical(const WanCluster& c, const StepResult& result, int step) {
  std::vector<float> want = Input(0, step);
  for (int r = 1; r < kRegions; ++r) {
    const std::vector<float> in = Input(r, step);
    for (size_t i = 0; i < kCount; ++i) want[i] += in[i];
  }
  for (int r = 0; r < kRegions; ++r) {
    const size_t i = static_cast<size_t>(r);
    ASSERT_TRUE(result.status[i].ok())
        << WanCluster::RegionName(r) << ": " << result.status[i] << "\n"
        << c.Logs(r, 0);
    EXPECT_EQ(std::memcmp(result.data[i].data(), want.data(), kCount * sizeof(float)), 0)
        << WanCluster::RegionName(r) << " step " << step << ": wrong sum";
  }
}

TEST(StraitdDialOnly, NatdRegionDialsEveryLinkAndRedialsAfterRestartsOnEitherSide) {
  if (Status priv = wanem::CheckPrivileges(); !priv.ok()) {
    GTEST_SKIP() << "needs strait-wanem (root): " << priv.message();
  }
  auto cluster = WanCluster::Start(Options("dial", true));
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  WanCluster& c = **cluster;
  std::vector<std::unique_ptr<Client>> clients(kRegions);
  ASSERT_TRUE(ConnectAll(c, clients));
  {
    SCOPED_TRACE("step 1");
    ExpectCorrectAndIdentical(c, RunStep(clients, 1), 1);
  }
  EXPECT_NE(c.Logs(kNat, 0).find("dials every peer region"), std::string::npos) << c.Logs(kNat, 0);

  // r0 restarts: the link r2 dialled ends (r0 no longer knows its session) and r2 -- not r0,
  // which ranks lower and would dial by the rank rule -- dials a new one.
  ASSERT_TRUE(c.Restart(0, 0).ok()) << c.Logs(0, 0);
  EXPECT_EQ(c.WaitForStat(kNat, 0, "peer_restarts", 1, Deadline::AfterSeconds(20)), 1)
      << "r2 did not see r0 restart\n"
      << c.Logs(kNat, 0);
  {
    SCOPED_TRACE("step 2, after r0 restarted");
    ASSERT_TRUE(ConnectAll(c, clients));
    ExpectCorrectAndIdentical(c, RunStep(clients, 2), 2);
  }

  // r2 restarts: it dials both links again at start; r0 and r1 adopt them.
  ASSERT_TRUE(c.Restart(kNat, 0).ok()) << c.Logs(kNat, 0);
  // r0 (restarted itself) sees its first restart of r2; r1 saw r0's and now r2's.
  EXPECT_EQ(c.WaitForStat(0, 0, "peer_restarts", 1, Deadline::AfterSeconds(20)), 1) << c.Logs(0, 0);
  EXPECT_EQ(c.WaitForStat(1, 0, "peer_restarts", 2, Deadline::AfterSeconds(20)), 2) << c.Logs(1, 0);
  {
    SCOPED_TRACE("step 3, after r2 restarted");
    ASSERT_TRUE(ConnectAll(c, clients));
    ExpectCorrectAndIdentical(c, RunStep(clients, 3), 3);
  }
  // Nobody tried to dial into r2: every link was dialled from behind the firewall.
  const wanem::RouterStats st = c.emulator().Stats();
  for (int r = 0; r < kRegions; ++r) {
    if (r == kNat) continue;
    EXPECT_EQ(st.links[r][kNat].packets[int(wanem::Verdict::kFiltered)], 0u) << r;
    EXPECT_GT(st.links[r][kNat].delivered_packets, 0u) << r;
  }
}

TEST(StraitdDialOnly, WithoutTheDialOnlyConfigTheFirewallFailsTheAllReduceClearly) {
  if (Status priv = wanem::CheckPrivileges(); !priv.ok()) {
    GTEST_SKIP() << "needs strait-wanem (root): " << priv.message();
  }
  auto cluster = WanCluster::Start(Options("nodial", false));
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  WanCluster& c = **cluster;
  std::vector<std::unique_ptr<Client>> clients(kRegions);
  ASSERT_TRUE(ConnectAll(c, clients));
  const StepResult step = RunStep(clients, 1);
  for (int r = 0; r < kRegions; ++r) {
    const size_t i = static_cast<size_t>(r);
    const Status& s = step.status[i];
    SCOPED_TRACE(WanCluster::RegionName(r));
    EXPECT_FALSE(s.ok()) << "an all-reduce through the firewall succeeded";
    EXPECT_LT(step.seconds[i], static_cast<double>(kDeadlineSeconds) + 5.0) << s;
  }
  // r0 dials r2 by the rank rule and is never answered: its error names r2 and the fix.
  const std::string& m0 = step.status[0].message();
  EXPECT_NE(m0.find("no link yet to the gateway(s) of r2"), std::string::npos) << m0;
  EXPECT_NE(m0.find("this gateway dials r2: a region that admits no inbound connection"),
            std::string::npos)
      << m0;
  // r2 waits for r0 and r1, which cannot reach it.
  const std::string& m2 = step.status[kNat].message();
  EXPECT_NE(m2.find("no link yet to the gateway(s) of r0, r1"), std::string::npos) << m2;
  EXPECT_NE(m2.find("r0, r1 dial(s) this gateway"), std::string::npos) << m2;
  // The rule bit: r0's and r1's connection attempts into r2 were dropped.
  const wanem::RouterStats st = c.emulator().Stats();
  EXPECT_GT(st.links[0][kNat].packets[int(wanem::Verdict::kFiltered)], 0u);
  EXPECT_GT(st.links[1][kNat].packets[int(wanem::Verdict::kFiltered)], 0u);
}

}  // namespace
}  // namespace strait::gateway

// `strait-bench allreduce --gateway SOCKET`: the operator's smoke test against gateways that are
// already running (three real straitd over strait-wanem, as a deployment would have them), one
// strait-bench process per region started at once, as a job's ranks would be. Checks that every
// region reports OK with the same result hash; that a region started with another region's index
// (so the sum differs from the reference) reports WRONG and exits 1; and that --gateway without
// --region-index is a usage error (exit 2) naming the flag. Without root: a mistyped socket
// fails within --timeout, and a bad --codec or a stray --shard-index are usage errors.
//
// Root only (namespaces, TUN devices): skips with the reason otherwise.
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "bench/wanem/netns.h"
#include "tests/common/straitd_process.h"
#include "tests/gateway/wan_cluster.h"

namespace strait {
namespace {

// Runs strait-bench with `args`, stdout captured (stderr goes to the test's log).
strait::test::CapturedRun RunBench(const std::vector<std::string>& args) {
  std::vector<std::string> argv = {STRAIT_BENCH_BINARY};
  argv.insert(argv.end(), args.begin(), args.end());
  return strait::test::RunCaptured(argv, /*capture_stderr=*/false);
}

class GatewaySmoke : public ::testing::Test {
 protected:
  void SetUp() override {
    if (Status p = wanem::CheckPrivileges(); !p.ok()) {
      GTEST_SKIP() << "needs strait-wanem (root): " << p.message();
    }
    gateway::testing::WanClusterOptions o;
    o.straitd = STRAITD_PATH;
    o.name = "gwsmoke";
    o.regions = 3;
    o.ranks_per_region = 1;
    o.tls = false;
    auto cluster = gateway::testing::WanCluster::Start(o);
    ASSERT_TRUE(cluster.ok()) << cluster.status();
    cluster_ = std::move(cluster).value();
  }

  // One strait-bench per region at once; `index[r]` is the --region-index region r's claims.
  std::vector<strait::test::CapturedRun> RunEverywhere(const std::string& job, const std::vector<int>& index) {
    std::vector<strait::test::CapturedRun> results(index.size());
    std::vector<std::thread> threads;
    for (size_t r = 0; r < index.size(); ++r) {
      threads.emplace_back([&, r] {
        results[r] = RunBench({"allreduce", "--gateway", cluster_->Socket(static_cast<int>(r), 0),
                               "--regions", "3", "--ranks-per-region", "1", "--region-index",
                               std::to_string(index[r]), "--size", "256KiB", "--iters", "3",
                               "--codec", "int8", "--job", job, "--timeout", "30"});
      });
    }
    for (auto& t : threads) t.join();
    return results;
  }

  std::unique_ptr<gateway::testing::WanCluster> cluster_;
};

std::string HashOf(const std::string& out) {
  const size_t at = out.find("result hash ");
  return at == std::string::npos ? "" : out.substr(at + 12, 16);
}

TEST_F(GatewaySmoke, EveryRegionReportsOkWithTheSameResult) {
  const std::vector<strait::test::CapturedRun> r = RunEverywhere("smoke", {0, 1, 2});
  for (size_t i = 0; i < r.size(); ++i) {
    EXPECT_EQ(r[i].code, 0) << "region " << i << ": " << r[i].out;
    EXPECT_NE(r[i].out.find("region " + std::to_string(i) + " shard 0, job smoke"),
              std::string::npos)
        << r[i].out;
    EXPECT_NE(r[i].out.find("3 all-reduces of 256 KiB"), std::string::npos) << r[i].out;
    EXPECT_NE(r[i].out.find("; OK (max error"), std::string::npos) << r[i].out;
    EXPECT_EQ(HashOf(r[i].out), HashOf(r[0].out)) << r[i].out;
  }
  EXPECT_EQ(HashOf(r[0].out).size(), 16u) << r[0].out;
}

TEST_F(GatewaySmoke, ARegionWithAnotherRegionsIndexMakesEveryRegionReportWrong) {
  // Region 1 contributes region 0's tensor: the sum is not the reference's anywhere.
  const std::vector<strait::test::CapturedRun> r = RunEverywhere("misnumbered", {0, 0, 2});
  for (size_t i = 0; i < r.size(); ++i) {
    EXPECT_EQ(r[i].code, 1) << "region " << i << ": " << r[i].out;
    EXPECT_NE(r[i].out.find("WRONG: "), std::string::npos) << r[i].out;
    EXPECT_NE(r[i].out.find("its own --region-index"), std::string::npos) << r[i].out;
  }
}

TEST_F(GatewaySmoke, GatewayWithoutRegionIndexIsAUsageError) {
  const auto r = RunBench({"allreduce", "--gateway", cluster_->Socket(0, 0)});
  EXPECT_EQ(r.code, 2) << r.out;
}

// Without gateways (no root needed): a mistyped socket fails within --timeout and says that it
// waits; flags that cannot work are refused before anything starts.
TEST(GatewaySmokeArguments, AMistypedSocketFailsWithinTheTimeoutAndSaysItWaits) {
  const auto start = std::chrono::steady_clock::now();
  const auto r = strait::test::RunCaptured(
      {STRAIT_BENCH_BINARY, "allreduce", "--gateway", "/nonexistent/straitd.sock", "--regions",
       "2", "--region-index", "0", "--size", "64KiB", "--iters", "1", "--timeout", "3"});
  const double took =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_EQ(r.code, 1) << r.err;
  EXPECT_LT(took, 30.0) << "the 60 s connect retry ignored --timeout 3";
  EXPECT_NE(r.err.find("waiting up to 3 s for the gateway"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("--gateway /nonexistent/straitd.sock: UNAVAILABLE"), std::string::npos)
      << r.err;
}

TEST(GatewaySmokeArguments, BadCodecAndStrayShardIndexAreUsageErrors) {
  auto r = strait::test::RunCaptured(
      {STRAIT_BENCH_BINARY, "allreduce", "--loopback", "--codec", "int8/int9", "--iters", "1"});
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_NE(r.err.find("--codec: compression policy \"int9\""), std::string::npos) << r.err;
  r = strait::test::RunCaptured(
      {STRAIT_BENCH_BINARY, "allreduce", "--loopback", "--shard-index", "1", "--iters", "1"});
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_NE(r.err.find("--shard-index: goes with --gateway"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace strait

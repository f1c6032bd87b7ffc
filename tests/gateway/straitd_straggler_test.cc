// Straggler and slow-link detection with real straitd processes over strait-wanem: 3 regions,
// one straitd each, all links 50 Mbit/s and 2 ms; after a dozen healthy all-reduces nobody is
// named; then the pair r0-r1 is degraded to 2 Mbit/s and 40 ms while the job runs, and the
// gateways of r0 and r1 must each name the other (a WARN "slow peer: ... region r1") within 10
// all-reduces, without naming r2, whose links are still fast. Every result is checked against
// the fp32 sum in region order. The naming rule itself is tested in straggler_test.cc.
//
// Root only (namespaces, TUN devices): skips with the reason otherwise.
#include <gtest/gtest.h>

#include <random>
#include <string>
#include <thread>
#include <vector>

#include "bench/wanem/config.h"
#include "bench/wanem/netns.h"
#include "localproto/client.h"
#include "tests/gateway/wan_cluster.h"

namespace strait::gateway {
namespace {

using localproto::Client;
constexpr int kRegions = 3;
constexpr size_t kCount = 25'000;  // 100 KB: ~10 ms per op on the fast links, ~200 ms slow

class StraitdStraggler : public ::testing::Test {
 protected:
  void SetUp() override {
    if (Status p = wanem::CheckPrivileges(); !p.ok()) {
      GTEST_SKIP() << "needs strait-wanem (root): " << p.message();
    }
    testing::WanClusterOptions o;
    o.straitd = STRAITD_PATH;
    o.name = "gwslow";
    o.regions = kRegions;
    o.ranks_per_region = 1;
    o.tls = false;  // detection is under test; spare the shared CPUs the TLS work
    o.link = "50mbit,2ms";
    auto cluster = testing::WanCluster::Start(o);
    ASSERT_TRUE(cluster.ok()) << cluster.status();
    cluster_ = std::move(cluster).value();
    for (int r = 0; r < kRegions; ++r) {
      auto c = Client::Connect(cluster_->Socket(r, 0), Deadline::AfterSeconds(10),
                               "rank" + std::to_string(r));
      ASSERT_TRUE(c.ok()) << c.status();
      clients_.push_back(std::move(c).value());
      ASSERT_TRUE(clients_.back()->RegisterJob("job", "none", Deadline::AfterSeconds(10)).ok());
    }
    std::vector<std::thread> joins;
    std::vector<Status> joined(kRegions);
    for (int r = 0; r < kRegions; ++r) {
      joins.emplace_back([&, r] {
        joined[r] = clients_[r]->JoinJob("job", Deadline::AfterSeconds(20)).status();
      });
    }
    for (auto& t : joins) t.join();
    for (const Status& s : joined) ASSERT_TRUE(s.ok()) << s;
  }

  void TearDown() override {
    if (cluster_ != nullptr && HasFailure()) {
      for (int r = 0; r < kRegions; ++r) {
        std::cerr << "straitd r" << r << " log:\n" << cluster_->Logs(r, 0) << '\n';
      }
    }
  }

  // One all-reduce in every region at once, its result checked.
  void Step(int step) {
    std::vector<std::vector<float>> data(kRegions, std::vector<float>(kCount));
    for (int r = 0; r < kRegions; ++r) {
      std::mt19937 rng(static_cast<uint32_t>(step * 10 + r));
      std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
      for (float& x : data[r]) x = dist(rng);
    }
    std::vector<float> expected(kCount, 0.0f);
    for (size_t e = 0; e < kCount; ++e) {
      for (int r = 0; r < kRegions; ++r) expected[e] += data[r][e];
    }
    std::vector<Status> status(kRegions);
    std::vector<std::thread> threads;
    for (int r = 0; r < kRegions; ++r) {
      threads.emplace_back([&, r] {
        status[r] = clients_[r]->AllReduce("job", "g", DataType::kFloat32, ReduceOp::kSum,
                                           data[r].data(), kCount, Deadline::AfterSeconds(30));
      });
    }
    for (auto& t : threads) t.join();
    for (int r = 0; r < kRegions; ++r) {
      ASSERT_TRUE(status[r].ok()) << "step " << step << " region " << r << ": " << status[r];
      ASSERT_TRUE(data[r] == expected) << "step " << step << " region " << r << ": wrong sum";
    }
  }

  bool Names(int region, const std::string& peer) {
    const std::string log = cluster_->Logs(region, 0);
    size_t at = 0;
    while ((at = log.find("slow peer: ", at)) != std::string::npos) {
      const size_t end = log.find('\n', at);
      if (log.substr(at, end - at).find("for region " + peer + " ") != std::string::npos) {
        return true;
      }
      at = end;
    }
    return false;
  }

  std::unique_ptr<testing::WanCluster> cluster_;
  std::vector<std::unique_ptr<Client>> clients_;
};

TEST_F(StraitdStraggler, ADegradedLinkIsNamedWithinTenOpsAndOnlyIt) {
  int step = 0;
  for (; step < 12; ++step) {
    Step(step);
    if (HasFatalFailure()) return;
  }
  for (int r = 0; r < kRegions; ++r) {
    EXPECT_EQ(cluster_->Logs(r, 0).find("slow peer: "), std::string::npos)
        << "region " << r << " named a peer while every link was healthy";
  }

  const wanem::LinkParams now = cluster_->emulator().Stats().params[0][1];
  auto slow = wanem::ParseLinkSpec("2mbit,40ms", now, now);
  ASSERT_TRUE(slow.ok()) << slow.status();
  ASSERT_TRUE(cluster_->emulator().SetLink(0, 1, *slow).ok());
  ASSERT_TRUE(cluster_->emulator().SetLink(1, 0, *slow).ok());
  int named_at = 0;
  for (int op = 1; op <= 10 && named_at == 0; ++op, ++step) {
    Step(step);
    if (HasFatalFailure()) return;
    if (Names(0, "r1") && Names(1, "r0")) named_at = op;
  }
  EXPECT_GT(named_at, 0) << "r0 and r1 did not name each other within 10 ops (r0 names r1: "
                         << Names(0, "r1") << ", r1 names r0: " << Names(1, "r0") << ")";
  EXPECT_FALSE(Names(0, "r2")) << "r0 named r2, whose link to it is fast";
  EXPECT_FALSE(Names(1, "r2")) << "r1 named r2, whose link to it is fast";
}

}  // namespace
}  // namespace strait::gateway

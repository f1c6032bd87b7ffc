// libnccl-net-strait.so across regions over an emulated WAN (strait-wanem): two regions joined by
// a 75 Mbit/s link with 30 ms RTT and 0.1% loss, in each region two straitd processes (shards 0
// and 1, mutual TLS, inside the region's network namespace; tests/gateway/wan_cluster.h), and
// plugin processes inside the namespaces that load the library as NCCL would:
//   - point to point: two rings of two ranks at once, one per shard, every connection through
//     the gateways' tunnels over the WAN: messages of 0 B, 1 B, 4097 B, 1 MiB + 13 and
//     3 MiB + 5 arrive intact both ways, then 32 in flight, then a grouped receive matched by tag
//     (tests/plugins/plugin_node.cc, mode ring-wan);
//   - CollNet: four node heads (2 regions x 2) connect as one group and run every claimed type x
//     op with odd counts, 48 in flight, each checked against a reference; all four heads must end
//     with bit-identical results (tests/plugins/collnet_node.cc, mode all);
//   - three regions, one straitd each, the 0-2 pair at 20 Mbit/s and 80 ms RTT: a ring of three
//     ranks (every hop over another link) moves the same messages intact.
// The loopback tests (tunnel_test.cc, collnet_test.cc) cover the protocol; these add what only a
// real WAN path shows: latency between every request and its answer, TCP loss recovery under the
// tunnels, TLS between the gateways, and gateways in other network namespaces than their ranks'
// peers. Root only (namespaces, TUN devices); skipped with the reason otherwise.
#include <gtest/gtest.h>
#include <unistd.h>

#include <fstream>
#include <iterator>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "bench/wanem/netns.h"
#include "tests/gateway/wan_cluster.h"
#include "tests/plugins/node_process.h"

namespace strait::nccl {
namespace {

using gateway::testing::WanCluster;
using gateway::testing::WanClusterOptions;
using test::LineAfter;
using test::NodeProcess;
using test::ReadUntil;
using test::Reap;
using test::WriteLine;

// Starts `args` inside network namespace `ns` (through `ip netns exec`), its stderr into its
// stdout, with our environment minus every STRAIT_* variable, plus `env`.
NodeProcess SpawnIn(const std::string& ns, const std::vector<std::string>& args,
                    const std::map<std::string, std::string>& env) {
  std::vector<std::string> all = {"/usr/bin/env", "ip", "netns", "exec", ns};
  all.insert(all.end(), args.begin(), args.end());
  return test::SpawnNode(all, env, /*stderr_to_stdout=*/true);
}

std::string ReadFile(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
}

// One emulated WAN and its daemons per fixture, shared by the fixture's tests: `kR` regions of
// `kS` straitd processes each. The 2 x 2 cluster is a full mesh (CollNet's region all-reduce
// needs every gateway of a region to know the others).
template <int kR, int kS>
class WanFixture : public ::testing::Test {
 protected:
  static constexpr int kRegions = kR;
  static constexpr int kShards = kS;

  static void SetUpTestSuite() {
    Status priv = wanem::CheckPrivileges();
    if (!priv.ok()) {
      skip_ = new std::string("needs strait-wanem (root): " + priv.message());
      return;
    }
    WanClusterOptions o;
    o.straitd = STRAITD_PATH;
    // Unique per process and fixture: another build's run of this test may be up at once.
    instance_ = new std::string("pw" + std::to_string(kR) + "x" + std::to_string(kS) + "_" +
                                std::to_string(::getpid() % 1000000));
    o.name = *instance_;
    o.regions = kR;
    o.ranks_per_region = kS;
    // 30 ms RTT: every tunnel open and every CollNet step waits a few round trips, and 0.1%
    // loss makes TCP recover under the tunnels; 75 Mbit/s keeps the data phase short.
    o.link = "75mbit,15ms,loss=0.1%";
    if (kR == 3) {
      // Three regions: one pair much slower and farther, as a transoceanic hop would be.
      o.pair_overrides = {"0:2=rate=20mbit,delay=40ms"};
    }
    o.full_mesh = kS > 1;
    auto cluster = WanCluster::Start(o);
    if (!cluster.ok()) {
      error_ = new std::string(cluster.status().ToString());
      return;
    }
    cluster_ = std::move(cluster).value().release();
  }
  static void TearDownTestSuite() {
    delete cluster_;  // kills the daemons, removes the namespaces
    cluster_ = nullptr;
    delete skip_;
    skip_ = nullptr;
    delete error_;
    error_ = nullptr;
    delete instance_;
    instance_ = nullptr;
  }
  void SetUp() override {
    if (skip_ != nullptr) GTEST_SKIP() << *skip_;
    ASSERT_NE(cluster_, nullptr) << (error_ != nullptr ? *error_ : "no cluster");
  }
  void TearDown() override {
    if (!HasFailure() || cluster_ == nullptr) return;
    for (int r = 0; r < kR; ++r) {
      for (int s = 0; s < kS; ++s) {
        ADD_FAILURE() << "straitd " << WanCluster::RegionName(r) << "." << s << ":\n"
                      << cluster_->Logs(r, s);
      }
    }
  }

  static std::string Namespace(int r) { return wanem::NamespaceName(*instance_, r); }

  // What every rank of region `r` behind shard `s` runs with.
  static std::map<std::string, std::string> RankEnv(int r, int s) {
    return {{"STRAIT_REGION", WanCluster::RegionName(r)},
            {"STRAIT_GATEWAY", cluster_->Socket(r, s)},
            {"STRAIT_SOCKET_IFNAME", "lo"},
            {"STRAIT_CONNECT_TIMEOUT", "20s"}};
  }

  // Runs one ring of plugin_node processes (mode ring-wan) per shard at once: ring s has one
  // rank per region (rank r in region r, behind shard s), so every connection crosses a WAN
  // link through the gateways' tunnels. Checks that every node passed.
  static void RunRings() {
    // procs[s * kR + r]: rank r of the ring on shard s.
    std::vector<NodeProcess> procs;
    for (int s = 0; s < kS; ++s) {
      for (int r = 0; r < kR; ++r) {
        procs.push_back(SpawnIn(Namespace(r),
                                {STRAIT_PLUGIN_NODE, STRAIT_NCCL_PLUGIN_PATH, std::to_string(r),
                                 std::to_string(kR), "ring-wan"},
                                RankEnv(r, s)));
        ASSERT_GT(procs.back().pid, 0) << "cannot start " << STRAIT_PLUGIN_NODE;
      }
    }
    EXPECT_TRUE(ReadUntil(procs, {"HANDLE "}, 30)) << "nodes did not print their handles";
    for (int s = 0; s < kS; ++s) {
      for (int r = 0; r < kR; ++r) {
        // Rank r sends to rank r + 1 of its ring: the next region, same shard.
        const NodeProcess& peer = procs[size_t(s * kR + (r + 1) % kR)];
        EXPECT_TRUE(WriteLine(procs[size_t(s * kR + r)],
                              "PEER " + LineAfter(peer.output, "HANDLE") + "\n"));
      }
    }
    Reap(procs, 60);
    for (size_t i = 0; i < procs.size(); ++i) {
      const NodeProcess& p = procs[i];
      EXPECT_EQ(p.exit_code, 0) << "node " << i << " output:\n" << p.output;
      EXPECT_NE(p.output.find("\nOK"), std::string::npos) << "node " << i << ":\n" << p.output;
      // The tunnel opens only after a round trip over the WAN: connect said "call again" first.
      const std::string nulls = LineAfter(p.output, "CONNECTED");
      ASSERT_FALSE(nulls.empty()) << "node " << i << ":\n" << p.output;
      EXPECT_GT(std::stoi(nulls), 0) << "node " << i << ":\n" << p.output;
    }
  }

  static inline std::string* skip_ = nullptr;
  static inline std::string* error_ = nullptr;
  static inline std::string* instance_ = nullptr;
  static inline WanCluster* cluster_ = nullptr;
};

using PluginWan = WanFixture<2, 2>;
using PluginWanThreeRegions = WanFixture<3, 1>;

TEST_F(PluginWan, PointToPointCrossesTheWanIntactOnTwoShardsAtOnce) {
  RunRings();
}

TEST_F(PluginWanThreeRegions, ARingOverThreeRegionsAndUnequalLinksArrivesIntact) {
  RunRings();
}

TEST_F(PluginWan, CollNetAllReduceOfTwoRegionsMatchesTheReferenceBitIdentically) {
  constexpr int kHeads = kRegions * kShards;
  std::vector<NodeProcess> heads;
  std::vector<std::string> results;
  for (int h = 0; h < kHeads; ++h) {
    const int r = h / kShards;
    const int s = h % kShards;
    results.push_back(cluster_->dir() + "/collnet-" + std::to_string(h) + ".bin");
    std::map<std::string, std::string> env = RankEnv(r, s);
    env["STRAIT_JOB_ID"] = "wanjob";
    env["STRAIT_COMPRESSION"] = "zstd";  // lossless: the reference is exact
    heads.push_back(
        SpawnIn(Namespace(r),
                {STRAIT_COLLNET_NODE, STRAIT_NCCL_PLUGIN_PATH, "11", "all", results.back()}, env));
    ASSERT_GT(heads.back().pid, 0) << "cannot start " << STRAIT_COLLNET_NODE;
  }
  EXPECT_TRUE(ReadUntil(heads, {"HANDLE ", "LISTEN-FAILED"}, 30)) << "heads did not listen";
  std::string group;
  for (int h = 0; h < kHeads; ++h) {
    const std::string handle = LineAfter(heads[size_t(h)].output, "HANDLE");
    if (handle.empty()) {
      Reap(heads, 10);  // the others wait for a GROUP line: closing their stdin ends them
      FAIL() << "head " << h << " published no handle:\n" << heads[size_t(h)].output;
    }
    group += " " + handle;
  }
  for (int h = 0; h < kHeads; ++h) {
    EXPECT_TRUE(WriteLine(heads[size_t(h)], "GROUP " + std::to_string(h) + " " +
                                                std::to_string(kHeads) + group + "\n"));
  }
  Reap(heads, 90);
  for (int h = 0; h < kHeads; ++h) {
    const NodeProcess& p = heads[size_t(h)];
    EXPECT_EQ(p.exit_code, 0) << "head " << h << " output:\n" << p.output;
    EXPECT_NE(p.output.find("\nOK"), std::string::npos) << "head " << h << ":\n" << p.output;
  }
  // Each head checked its results against the reference; all four must hold the same bytes.
  const std::string first = ReadFile(results[0]);
  EXPECT_FALSE(first.empty());
  for (int h = 1; h < kHeads; ++h) {
    EXPECT_TRUE(ReadFile(results[size_t(h)]) == first)
        << "head " << h << "'s results differ from head 0's";
  }
}

}  // namespace
}  // namespace strait::nccl

// The tuner (plugins/nccl/tuner.h): the plan it makes from the environment, the NET-row rewrite
// of NCCL's constants and the cost-table policy, unit-tested against the core library; then the
// exported ncclTunerPlugin_v5 of the built libnccl-net-strait.so driven through dlopen as NCCL
// 2.28 drives it (init with NCCL's default constants, getCollInfo with a cost table in which the
// pairs NCCL does not offer are -1, finalize).
#include "plugins/nccl/tuner.h"

#include <dlfcn.h>
#include <gtest/gtest.h>
#include <stdlib.h>

#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "tests/plugins/plugin_harness.h"

namespace strait::nccl::tuner {
namespace {

EnvGetter Env(std::map<std::string, std::string> vars) {
  return [vars](const char* name) -> std::optional<std::string> {
    auto it = vars.find(name);
    if (it == vars.end()) return std::nullopt;
    return it->second;
  };
}

// NCCL 2.28.9's default NET row (graph/tuning.cc), the part the tuner rewrites.
constexpr double kDefaultNetRow[kNcclNumAlgorithmsV5][kNcclNumProtocolsV5] = {
    {5.0, 8.5, 14}, {2.7, 4.0, 14.0}, {0, 0, 31}, {0, 0, 30}, {0, 0, 18}, {0, 0, 20.9}, {0, 0, 14}};

ncclTunerConstants_v5_t DefaultConstants() {
  ncclTunerConstants_v5_t c;
  std::memset(&c, 0, sizeof(c));
  for (int hw = 0; hw < kNcclNumHwLinksV5; ++hw) {
    for (int a = 0; a < kNcclNumAlgorithmsV5; ++a) {
      for (int p = 0; p < kNcclNumProtocolsV5; ++p) {
        c.hwLatencies[hw][a][p] = hw == kNcclHwNet ? kDefaultNetRow[a][p] : 1.0 + a + p;
      }
    }
  }
  c.baseLatencies[kNcclAlgoRing][kNcclProtoSimple] = 8.4;
  c.llMaxBws[2][1] = 45.0;
  return c;
}

// A cost table as NCCL builds one: every pair priced, those it does not offer at -1.
struct CostTable {
  float cost[kNcclNumAlgorithmsV5][kNcclNumProtocolsV5];
  CostTable() {
    for (int a = 0; a < kNcclNumAlgorithmsV5; ++a) {
      for (int p = 0; p < kNcclNumProtocolsV5; ++p) cost[a][p] = 100.0f + 10.0f * a + p;
    }
    // Not offered: NVLS, NVLSTree, PAT everywhere; CollNet's LL and LL128.
    for (int a : {kNcclAlgoNvls, kNcclAlgoNvlsTree, kNcclAlgoPat}) {
      for (float& c : cost[a]) c = kNcclAlgoProtoIgnore;
    }
    for (int a : {kNcclAlgoCollNetDirect, kNcclAlgoCollNetChain}) {
      cost[a][kNcclProtoLL] = cost[a][kNcclProtoLL128] = kNcclAlgoProtoIgnore;
    }
  }
  void WithoutCollNet() {
    for (int a : {kNcclAlgoCollNetDirect, kNcclAlgoCollNetChain}) {
      for (float& c : cost[a]) c = kNcclAlgoProtoIgnore;
    }
  }
  float* data() { return &cost[0][0]; }
  float** as_nccl() { return reinterpret_cast<float**>(cost); }
  // The pairs set to 0 (the tuner's selections).
  std::vector<std::pair<int, int>> Zeros() const {
    std::vector<std::pair<int, int>> z;
    for (int a = 0; a < kNcclNumAlgorithmsV5; ++a) {
      for (int p = 0; p < kNcclNumProtocolsV5; ++p) {
        if (cost[a][p] == 0.0f) z.emplace_back(a, p);
      }
    }
    return z;
  }
};

// Every -1 of `before` is still -1 in `after`, and no entry became -1.
void ExpectIgnoresKept(const CostTable& before, const CostTable& after) {
  for (int a = 0; a < kNcclNumAlgorithmsV5; ++a) {
    for (int p = 0; p < kNcclNumProtocolsV5; ++p) {
      EXPECT_EQ(before.cost[a][p] < 0, after.cost[a][p] < 0) << "algo " << a << " proto " << p;
    }
  }
}

DeviceProperties StraitDevice(float latency_us, int speed_mbps) {
  DeviceProperties d;
  d.latency_us = latency_us;
  d.speed_mbps = speed_mbps;
  return d;
}

TEST(TunerPlan, ASingleRegionDeploymentOrASingleNodeIsLeftAlone) {
  StatusOr<TunerPlan> plan = MakePlan(Env({{"STRAIT_REGION", "a"}}), 4, std::nullopt);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_FALSE(plan->spans_regions);
  plan = MakePlan(Env({{"STRAIT_GATEWAY", "/run/straitd.sock"}}), 1, std::nullopt);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_FALSE(plan->spans_regions);

  ncclTunerConstants_v5_t c = DefaultConstants();
  const ncclTunerConstants_v5_t before = c;
  RewriteConstants(*plan, &c);
  EXPECT_EQ(std::memcmp(&c, &before, sizeof(c)), 0);
  CostTable t;
  const CostTable orig = t;
  AdjustCostTable(*plan, ncclFuncAllReduce, size_t{1} << 30, t.data(), 7, 3);
  EXPECT_EQ(std::memcmp(t.cost, orig.cost, sizeof(t.cost)), 0);
}

TEST(TunerPlan, AGatewayOrARegionMapWithTwoRegionsMakesMultiNodeCommsSpanRegions) {
  StatusOr<TunerPlan> plan =
      MakePlan(Env({{"STRAIT_GATEWAY", "/run/straitd.sock"}}), 2, std::nullopt);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_TRUE(plan->spans_regions);
  EXPECT_EQ(plan->wan_latency_us, kDefaultWanLatencyUs);
  plan = MakePlan(Env({{"STRAIT_REGION_MAP", "10.1.0.0/16=us,10.2.0.0/16=eu"},
                       {"STRAIT_WAN_LATENCY_US", "40000"}}),
                  3, std::nullopt);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_TRUE(plan->spans_regions);
  EXPECT_EQ(plan->wan_latency_us, 40000);
  // One region named twice is still one region.
  plan = MakePlan(Env({{"STRAIT_REGION", "us"}, {"STRAIT_REGION_MAP", "10.1.0.0/16=us"}}), 3,
                  std::nullopt);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_FALSE(plan->spans_regions);
}

TEST(TunerPlan, TheNetRowGetsOnlyTheLatencyTheNetDeviceDoesNotReport) {
  const auto env = Env({{"STRAIT_GATEWAY", "/run/straitd.sock"},
                        {"STRAIT_WAN_LATENCY_US", "25000"},
                        {"STRAIT_WAN_SPEED_MBPS", "100"}});
  // NCCL's own transport (no Strait device here): the whole WAN latency goes into the row.
  StatusOr<TunerPlan> plan = MakePlan(env, 4, std::nullopt);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->added_latency_us, 25000);
  ncclTunerConstants_v5_t c = DefaultConstants();
  const ncclTunerConstants_v5_t before = c;
  RewriteConstants(*plan, &c);
  for (int a = 0; a < kNcclNumAlgorithmsV5; ++a) {
    for (int p = 0; p < kNcclNumProtocolsV5; ++p) {
      const double d = kDefaultNetRow[a][p];
      EXPECT_EQ(c.hwLatencies[kNcclHwNet][a][p], d > 0 ? d + 25000 : 0) << a << "/" << p;
    }
  }
  // Nothing but the NET row changes.
  EXPECT_EQ(std::memcmp(c.hwLatencies[kNcclHwNvlink], before.hwLatencies[kNcclHwNvlink],
                        sizeof(c.hwLatencies[0]) * 2),
            0);
  EXPECT_EQ(std::memcmp(c.baseLatencies, before.baseLatencies, sizeof(c.baseLatencies)), 0);
  EXPECT_EQ(std::memcmp(c.llMaxBws, before.llMaxBws,
                        sizeof(c) - offsetof(ncclTunerConstants_v5_t, llMaxBws)),
            0);

  // The Strait device already reports the WAN latency (NCCL adds it per step): nothing added.
  plan = MakePlan(env, 4, StraitDevice(25000, 100));
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->added_latency_us, 0);
  c = before;
  RewriteConstants(*plan, &c);
  EXPECT_EQ(std::memcmp(&c, &before, sizeof(c)), 0);
  // A device that reports less (another figure at its init): only the difference.
  plan = MakePlan(env, 4, StraitDevice(10000, 100));
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->added_latency_us, 15000);
}

TEST(TunerPlan, BandwidthBoundFromTheBandwidthDelayProduct) {
  StatusOr<TunerPlan> plan = MakePlan(Env({{"STRAIT_GATEWAY", "/g"},
                                           {"STRAIT_WAN_LATENCY_US", "50000"},
                                           {"STRAIT_WAN_SPEED_MBPS", "100"}}),
                                      2, std::nullopt);
  ASSERT_TRUE(plan.ok()) << plan.status();
  // 50 ms x 100 Mbit/s = 625000 bytes in flight.
  EXPECT_EQ(plan->bandwidth_bound_bytes, 625000u);
  // No speed known (no variable, no Strait device): never bandwidth-bound, NCCL decides.
  plan = MakePlan(Env({{"STRAIT_GATEWAY", "/g"}}), 2, std::nullopt);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->bandwidth_bound_bytes, SIZE_MAX);
  // The device's speed stands in for the variable.
  plan = MakePlan(Env({{"STRAIT_GATEWAY", "/g"}}), 2, StraitDevice(10000, 1000));
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->bandwidth_bound_bytes, 1250000u);
}

TEST(TunerPlan, ABadVariableIsAnErrorThatNamesIt) {
  StatusOr<TunerPlan> plan = MakePlan(Env({{"STRAIT_WAN_LATENCY_US", "soon"}}), 2, std::nullopt);
  ASSERT_FALSE(plan.ok());
  EXPECT_NE(plan.status().message().find("STRAIT_WAN_LATENCY_US"), std::string::npos)
      << plan.status();
  plan = MakePlan(Env({{"STRAIT_WAN_SPEED_MBPS", "0"}}), 2, std::nullopt);
  ASSERT_FALSE(plan.ok());
  EXPECT_NE(plan.status().message().find("STRAIT_WAN_SPEED_MBPS"), std::string::npos)
      << plan.status();
}

TEST(TunerCostTable, CollNetIsSelectedForAllReduceWhenOffered) {
  TunerPlan plan;
  plan.spans_regions = true;
  plan.bandwidth_bound_bytes = 1 << 20;
  for (size_t bytes : {size_t{8}, size_t{1} << 30}) {
    CostTable t;
    const CostTable before = t;
    AdjustCostTable(plan, ncclFuncAllReduce, bytes, t.data(), 7, 3);
    EXPECT_EQ(t.Zeros(),
              (std::vector<std::pair<int, int>>{{kNcclAlgoCollNetDirect, kNcclProtoSimple}}));
    ExpectIgnoresKept(before, t);
  }
  // Chain when Direct is not offered (no NVSwitch).
  CostTable t;
  for (float& c : t.cost[kNcclAlgoCollNetDirect]) c = kNcclAlgoProtoIgnore;
  const CostTable before = t;
  AdjustCostTable(plan, ncclFuncAllReduce, 8, t.data(), 7, 3);
  EXPECT_EQ(t.Zeros(),
            (std::vector<std::pair<int, int>>{{kNcclAlgoCollNetChain, kNcclProtoSimple}}));
  ExpectIgnoresKept(before, t);
}

TEST(TunerCostTable, RingSimpleForBandwidthBoundMessagesNothingForSmallOnes) {
  TunerPlan plan;
  plan.spans_regions = true;
  plan.bandwidth_bound_bytes = 1 << 20;
  for (int coll : {ncclFuncAllReduce, ncclFuncAllGather, ncclFuncReduceScatter}) {
    CostTable t;
    t.WithoutCollNet();
    const CostTable small = t;
    AdjustCostTable(plan, coll, (1 << 20) - 1, t.data(), 7, 3);
    EXPECT_EQ(std::memcmp(t.cost, small.cost, sizeof(t.cost)), 0) << "coll " << coll;
    AdjustCostTable(plan, coll, 1 << 20, t.data(), 7, 3);
    EXPECT_EQ(t.Zeros(), (std::vector<std::pair<int, int>>{{kNcclAlgoRing, kNcclProtoSimple}}))
        << "coll " << coll;
    ExpectIgnoresKept(small, t);
  }
  // CollNet is only for all-reduce: an all-gather with CollNet offered still gets Ring.
  CostTable t;
  AdjustCostTable(plan, ncclFuncAllGather, 1 << 21, t.data(), 7, 3);
  EXPECT_EQ(t.Zeros(), (std::vector<std::pair<int, int>>{{kNcclAlgoRing, kNcclProtoSimple}}));
}

TEST(TunerCostTable, WhatNcclDidNotOfferIsNeverForced) {
  TunerPlan plan;
  plan.spans_regions = true;
  plan.bandwidth_bound_bytes = 0;
  CostTable t;
  t.WithoutCollNet();
  for (float& c : t.cost[kNcclAlgoRing]) c = kNcclAlgoProtoIgnore;
  const CostTable before = t;
  AdjustCostTable(plan, ncclFuncAllReduce, size_t{1} << 30, t.data(), 7, 3);
  EXPECT_EQ(std::memcmp(t.cost, before.cost, sizeof(t.cost)), 0);
  // A smaller table than v5's (an older NCCL): entries past its end are never touched.
  float tiny[2][3] = {{1, 2, 3}, {4, 5, 6}};
  AdjustCostTable(plan, ncclFuncAllReduce, size_t{1} << 30, &tiny[0][0], 2, 3);
  EXPECT_EQ(tiny[kNcclAlgoRing][kNcclProtoSimple], 0.0f);
  EXPECT_EQ(tiny[0][2], 3.0f);
}

// ---- the exported table, through dlopen ----

const ncclTuner_v5_t* Tuner() {
  const testing::LoadedPlugin& p = testing::LoadPlugin(STRAIT_NCCL_PLUGIN_PATH);
  if (p.dl == nullptr) return nullptr;
  return static_cast<const ncclTuner_v5_t*>(dlsym(p.dl, "ncclTunerPlugin_v5"));
}

// Sets STRAIT_* variables for one test and unsets them after (the plugin reads the process
// environment as NCCL's would be).
class ScopedEnv {
 public:
  explicit ScopedEnv(std::map<std::string, std::string> vars) : vars_(std::move(vars)) {
    for (const auto& [k, v] : vars_) setenv(k.c_str(), v.c_str(), 1);
  }
  ~ScopedEnv() {
    for (const auto& [k, v] : vars_) unsetenv(k.c_str());
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  std::map<std::string, std::string> vars_;
};

TEST(TunerPluginV5, ResolvesAndRewritesTheNetRowOfACrossRegionComm) {
  const ncclTuner_v5_t* tuner = Tuner();
  ASSERT_NE(tuner, nullptr) << testing::LoadPlugin(STRAIT_NCCL_PLUGIN_PATH).error;
  EXPECT_STREQ(tuner->name, "Strait");
  ScopedEnv env({{"STRAIT_GATEWAY", "/run/strait/straitd.sock"},
                 {"STRAIT_REGION", "us-east"},
                 {"STRAIT_WAN_LATENCY_US", "30000"},
                 {"STRAIT_WAN_SPEED_MBPS", "1000"}});
  testing::ClearLog();
  ncclTunerConstants_v5_t c = DefaultConstants();
  ncclNvlDomainInfo_v5_t nvl{4, 1, 1};
  void* ctx = nullptr;
  // The net side is not initialised in this process (as under NCCL_NET=Socket): the tuner adds
  // the whole WAN latency.
  ASSERT_EQ(tuner->init(&ctx, 0x1234, 4, 4, testing::CaptureLogger, &nvl, &c), ncclSuccess);
  ASSERT_NE(ctx, nullptr);
  EXPECT_EQ(c.hwLatencies[kNcclHwNet][kNcclAlgoRing][kNcclProtoSimple], 14.0 + 30000);
  EXPECT_EQ(c.hwLatencies[kNcclHwNet][kNcclAlgoTree][kNcclProtoLL], 5.0 + 30000);
  EXPECT_EQ(c.hwLatencies[kNcclHwNet][kNcclAlgoNvls][kNcclProtoLL], 0.0);
  EXPECT_EQ(c.hwLatencies[kNcclHwPci][kNcclAlgoRing][kNcclProtoSimple], 1.0 + 1 + 2);

  // 30 ms x 1 Gbit/s = 3.75 MB: 4 MiB is bandwidth-bound, 64 KiB is not.
  CostTable t;
  t.WithoutCollNet();
  const CostTable before = t;
  ASSERT_EQ(tuner->getCollInfo(ctx, ncclFuncAllReduce, 64 << 10, 1, t.as_nccl(), 7, 3, 0, nullptr),
            ncclSuccess);
  EXPECT_EQ(std::memcmp(t.cost, before.cost, sizeof(t.cost)), 0);
  int n_channels = 0;
  ASSERT_EQ(
      tuner->getCollInfo(ctx, ncclFuncAllReduce, 4 << 20, 1, t.as_nccl(), 7, 3, 0, &n_channels),
      ncclSuccess);
  EXPECT_EQ(t.Zeros(), (std::vector<std::pair<int, int>>{{kNcclAlgoRing, kNcclProtoSimple}}));
  ExpectIgnoresKept(before, t);
  EXPECT_EQ(n_channels, 0);  // never set

  // With CollNet offered, an all-reduce of any size goes to CollNet.
  CostTable with_collnet;
  const CostTable with_before = with_collnet;
  ASSERT_EQ(
      tuner->getCollInfo(ctx, ncclFuncAllReduce, 1024, 1, with_collnet.as_nccl(), 7, 3, 0, nullptr),
      ncclSuccess);
  EXPECT_EQ(with_collnet.Zeros(),
            (std::vector<std::pair<int, int>>{{kNcclAlgoCollNetDirect, kNcclProtoSimple}}));
  ExpectIgnoresKept(with_before, with_collnet);
  EXPECT_EQ(tuner->finalize(ctx), ncclSuccess);
  // A context that is gone (or never was) is an error, not a crash.
  int garbage = 7;
  EXPECT_EQ(tuner->finalize(&garbage), ncclInvalidArgument);
}

TEST(TunerPluginV5, ASingleNodeCommIsLeftAlone) {
  const ncclTuner_v5_t* tuner = Tuner();
  ASSERT_NE(tuner, nullptr);
  ScopedEnv env({{"STRAIT_GATEWAY", "/run/strait/straitd.sock"}, {"STRAIT_REGION", "us-east"}});
  ncclTunerConstants_v5_t c = DefaultConstants();
  const ncclTunerConstants_v5_t before = c;
  void* ctx = nullptr;
  ASSERT_EQ(tuner->init(&ctx, 1, 8, 1, testing::CaptureLogger, nullptr, &c), ncclSuccess);
  EXPECT_EQ(std::memcmp(&c, &before, sizeof(c)), 0);
  CostTable t;
  const CostTable orig = t;
  ASSERT_EQ(
      tuner->getCollInfo(ctx, ncclFuncAllReduce, size_t{1} << 30, 1, t.as_nccl(), 7, 3, 0, nullptr),
      ncclSuccess);
  EXPECT_EQ(std::memcmp(t.cost, orig.cost, sizeof(t.cost)), 0);
  EXPECT_EQ(tuner->finalize(ctx), ncclSuccess);
}

TEST(TunerPluginV5, ABadVariableIsWarnedByNameAndNcclKeepsItsOwnTuning) {
  const ncclTuner_v5_t* tuner = Tuner();
  ASSERT_NE(tuner, nullptr);
  ScopedEnv env(
      {{"STRAIT_GATEWAY", "/run/strait/straitd.sock"}, {"STRAIT_WAN_SPEED_MBPS", "fast"}});
  testing::ClearLog();
  ncclTunerConstants_v5_t c = DefaultConstants();
  const ncclTunerConstants_v5_t before = c;
  void* ctx = nullptr;
  // NCCL 2.28 fails the communicator when a tuner's init fails, so the tuner WARNs and passes
  // through instead: the constants and every cost stay NCCL's.
  ASSERT_EQ(tuner->init(&ctx, 1, 4, 4, testing::CaptureLogger, nullptr, &c), ncclSuccess);
  EXPECT_TRUE(testing::WarnedWith({"TUNER/Strait", "STRAIT_WAN_SPEED_MBPS", "fast"}));
  EXPECT_EQ(std::memcmp(&c, &before, sizeof(c)), 0);
  CostTable t;
  const CostTable orig = t;
  ASSERT_EQ(
      tuner->getCollInfo(ctx, ncclFuncAllReduce, size_t{1} << 30, 1, t.as_nccl(), 7, 3, 0, nullptr),
      ncclSuccess);
  EXPECT_EQ(std::memcmp(t.cost, orig.cost, sizeof(t.cost)), 0);
  EXPECT_EQ(tuner->finalize(ctx), ncclSuccess);
}

TEST(TunerPluginV5, WithTheStraitNetInitialisedTheWanLatencyIsNotCountedTwice) {
  const testing::LoadedPlugin& p = testing::LoadPlugin(STRAIT_NCCL_PLUGIN_PATH);
  ASSERT_NE(p.dl, nullptr) << p.error;
  const ncclTuner_v5_t* tuner = Tuner();
  ASSERT_NE(tuner, nullptr);
  ScopedEnv env({{"STRAIT_SOCKET_IFNAME", "lo"},
                 {"STRAIT_GATEWAY", "/run/strait/straitd.sock"},
                 {"STRAIT_REGION", "us-east"},
                 {"STRAIT_WAN_LATENCY_US", "30000"}});
  void* net_ctx = nullptr;
  ASSERT_EQ(p.v11->init(&net_ctx, 1, nullptr, testing::CaptureLogger, nullptr), ncclSuccess);
  ncclNetProperties_v11_t props{};
  ASSERT_EQ(p.v11->getProperties(0, &props), ncclSuccess);
  EXPECT_EQ(props.latency, 30000.0f);  // NCCL adds this to every inter-node step already
  ncclTunerConstants_v5_t c = DefaultConstants();
  const ncclTunerConstants_v5_t before = c;
  void* ctx = nullptr;
  ASSERT_EQ(tuner->init(&ctx, 1, 4, 4, testing::CaptureLogger, nullptr, &c), ncclSuccess);
  EXPECT_EQ(std::memcmp(&c, &before, sizeof(c)), 0);
  EXPECT_EQ(tuner->finalize(ctx), ncclSuccess);
  EXPECT_EQ(p.v11->finalize(net_ctx), ncclSuccess);
}

}  // namespace
}  // namespace strait::nccl::tuner

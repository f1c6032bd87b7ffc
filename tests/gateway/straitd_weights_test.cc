// Shard weights from measured link rates, with real straitd processes over strait-wanem: 3
// regions, one straitd each, no allreduce.shard_weights in any config, and unequal pair rates:
// 0-1 and 0-2 at 16 Mbit/s, 1 -> 2 at 2 Mbit/s (slow enough that every link stays busy for
// several of the estimator's 250 ms windows with small tensors, and a skew that measurement noise
// on a loaded machine cannot hide). Only one direction is slow: a pair counts at its slower
// direction, and the acknowledgements of 1 -> 2 then return on a fast link. (Until 2026-11-30,
// with both directions slow, bunched acknowledgements made net::Link's goodput estimate read the
// slow pair several times too high; its delivery-rate samples now follow delivery, held by
// NetLinkWan.GoodputEstimateFollowsDeliveryWithBulkBothWays.) The gateways measure their
// links while they carry a first job's all-reduce, exchange the rates, and every one of them
// cuts the next job's tensor the same way: the reply's "shards=" names an unequal split that
// follows the rates (the balanced split for 16/16/2 is 15/17, 1/17, 1/17: regions 1 and 2 share
// the slow pair, so region 0 owns most), every rank's result is the exact fp32 sum in region
// order, and all ranks are bit-identical.
// Before any data crossed the links the rates are unknown and the shards equal.
//
// Root only (namespaces, TUN devices): skips with the reason otherwise.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "bench/wanem/netns.h"
#include "localproto/client.h"
#include "localproto/frame_io.h"
#include "localproto/protocol.h"
#include "tests/gateway/wan_cluster.h"

namespace strait::gateway {

// The local protocol and its client (strait::localproto), which these tests drive.
using namespace strait::localproto;  // NOLINT(build/namespaces)
namespace {

constexpr int kRegions = 3;

struct RankResult {
  StatusCode code = StatusCode::kUnknown;
  std::string text;
  std::vector<float> data;
};

std::vector<float> Tensor(size_t count, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> v(count);
  for (float& x : v) x = dist(rng);
  return v;
}

// The shard sizes the reply names ("none shards=a,b,c"); empty if it names none.
std::vector<size_t> Shards(const std::string& text) {
  std::vector<size_t> shards;
  const size_t at = text.find("shards=");
  if (at == std::string::npos) return shards;
  std::stringstream ss(text.substr(at + 7));
  std::string item;
  while (std::getline(ss, item, ',')) shards.push_back(std::stoul(item));
  return shards;
}

class StraitdWeights : public ::testing::Test {
 protected:
  void SetUp() override {
    if (Status p = wanem::CheckPrivileges(); !p.ok()) {
      GTEST_SKIP() << "needs strait-wanem (root): " << p.message();
    }
    testing::WanClusterOptions o;
    o.straitd = STRAITD_PATH;
    o.name = "gwweights";
    o.regions = kRegions;
    o.ranks_per_region = 1;
    o.tls = false;  // the split is what is under test; spare the shared CPUs the TLS work
    o.link = "16mbit,2ms";
    o.pair_overrides = {"1>2=rate=2mbit"};
    o.allreduce_deadline = "30s";
    auto cluster = testing::WanCluster::Start(o);
    ASSERT_TRUE(cluster.ok()) << cluster.status();
    cluster_ = std::move(cluster).value();
    for (int r = 0; r < kRegions; ++r) {
      auto c = Client::Connect(cluster_->Socket(r, 0), Deadline::AfterSeconds(10),
                               "rank" + std::to_string(r));
      ASSERT_TRUE(c.ok()) << c.status();
      clients_.push_back(std::move(c).value());
    }
  }

  void TearDown() override {
    if (cluster_ == nullptr) return;
    if (HasFailure()) {
      for (int r = 0; r < kRegions; ++r) {
        std::cerr << "straitd r" << r << " log:\n" << cluster_->Logs(r, 0) << '\n';
      }
    }
  }

  // Registers `job` in every region and joins it there (each region's comm, at once), so that
  // AllReduceAll can number its steps (localproto/protocol.h, "Operation identity").
  void RegisterEverywhere(const std::string& job) {
    for (auto& c : clients_) {
      auto p = c->RegisterJob(job, "none", Deadline::AfterSeconds(10));
      ASSERT_TRUE(p.ok()) << job << ": " << p.status();
    }
    std::vector<StatusOr<uint64_t>> joined(clients_.size(), 0);
    std::vector<std::thread> joins;
    for (size_t i = 0; i < clients_.size(); ++i) {
      joins.emplace_back([&, i] { joined[i] = clients_[i]->JoinJob(job, Deadline::AfterSeconds(20)); });
    }
    for (auto& t : joins) t.join();
    for (const auto& g : joined) {
      ASSERT_TRUE(g.ok()) << job << ": " << g.status();
      ASSERT_EQ(*g, *joined[0]) << job << ": regions joined different generations";
    }
    steps_[job] = {*joined[0], 0};
  }

  // One all-reduce on every region at once (region r contributes inputs[r]); checks that all
  // succeeded, are bit-identical and equal the fp32 sum in region order (the lossless path's
  // numerics), and returns the shard split the replies name (the same on every rank).
  std::vector<size_t> AllReduceAll(const std::string& job, const std::string& key,
                                   const std::vector<std::vector<float>>& inputs) {
    const size_t count = inputs[0].size();
    // Plain copies: the threads below capture them (clang 14 cannot capture structured bindings).
    const uint64_t generation = steps_[job].first;
    const uint64_t step = steps_[job].second++;
    std::vector<RankResult> results(kRegions);
    std::vector<std::thread> threads;
    for (int r = 0; r < kRegions; ++r) {
      threads.emplace_back([&, r] {
        Message m;
        m.type = MessageType::kAllReduce;
        m.job = job;
        m.tensor_key = key;
        m.dtype = DataType::kFloat32;
        m.op = ReduceOp::kSum;
        m.count = count;
        m.generation = generation;
        m.sequence = step;
        m.timeout_ms = 30'000;
        m.data.resize(count * sizeof(float));
        std::memcpy(m.data.data(), inputs[static_cast<size_t>(r)].data(), m.data.size());
        RankResult& out = results[static_cast<size_t>(r)];
        auto frame = EncodeMessage(m);
        if (!frame.ok()) {
          out.text = frame.status().ToString();
          return;
        }
        auto reply = clients_[static_cast<size_t>(r)]->SendRawForTest(*frame,
                                                                      Deadline::AfterSeconds(40));
        if (!reply.ok()) {
          out.code = reply.status().code();
          out.text = reply.status().ToString();
          return;
        }
        out.code = reply->code;
        out.text = reply->text;
        out.data.resize(reply->data.size() / sizeof(float));
        std::memcpy(out.data.data(), reply->data.data(), out.data.size() * sizeof(float));
      });
    }
    for (auto& t : threads) t.join();
    for (int r = 0; r < kRegions; ++r) {
      const RankResult& res = results[static_cast<size_t>(r)];
      EXPECT_EQ(res.code, StatusCode::kOk) << job << " region " << r << ": " << res.text;
      if (res.code != StatusCode::kOk) return {};
      EXPECT_EQ(res.text, results[0].text) << "the replies name different splits";
      EXPECT_TRUE(res.data == results[0].data) << job << ": region " << r
                                               << " differs from region 0 (not bit-identical)";
    }
    size_t wrong = 0;
    for (size_t e = 0; e < count; ++e) {
      float sum = 0.0f;
      for (int r = 0; r < kRegions; ++r) sum += inputs[static_cast<size_t>(r)][e];
      if (results[0].data.size() != count || results[0].data[e] != sum) ++wrong;
    }
    EXPECT_EQ(wrong, 0u) << job << ": elements that are not the fp32 sum in region order";
    const std::vector<size_t> shards = Shards(results[0].text);
    EXPECT_EQ(shards.size(), static_cast<size_t>(kRegions)) << results[0].text;
    return shards;
  }

  std::unique_ptr<testing::WanCluster> cluster_;
  std::vector<std::unique_ptr<Client>> clients_;
  std::map<std::string, std::pair<uint64_t, uint64_t>> steps_;  // job -> (generation, next step)
};

TEST_F(StraitdWeights, ShardsFollowMeasuredRatesWithoutConfiguredWeights) {
  // 3 MB per rank: each link carries about 2 MB per step with even shards, a second even on the
  // fastest pair (2 MB/s), so every link's goodput estimate sees its rate (8 s on the slow one:
  // one such step).
  constexpr size_t kCount = 750'001;
  std::vector<std::vector<float>> inputs;
  for (int r = 0; r < kRegions; ++r) inputs.push_back(Tensor(kCount, 100 + r));

  // Fresh links: nothing measured, equal shards.
  RegisterEverywhere("warm");
  if (HasFatalFailure()) return;
  const std::vector<size_t> first = AllReduceAll("warm", "g", inputs);
  if (HasFailure()) return;
  for (size_t s : first) EXPECT_NEAR(static_cast<double>(s), kCount / 3.0, 256.0) << first[0];

  // A new job's first round takes the rates measured meanwhile: pairs 0-1 and 0-2 16, 1-2
  // 2 Mbit/s give x0 + x1 <= 16, x0 + x2 <= 16, x1 + x2 <= 2, so x = (15, 1, 1). Measured
  // goodputs are noisy (a fast link that drains its share within part of a window reads low;
  // the slow pair has read 2-3x its emulated rate), so the test holds a clear skew toward
  // region 0 (at least 1.25x either other shard; equal shards are 1.0x), not the exact split;
  // the second step, in the same weights round, must cut the tensor the same way.
  RegisterEverywhere("train");
  if (HasFatalFailure()) return;
  std::vector<size_t> previous;
  for (int step = 0; step < 2; ++step) {
    for (int r = 0; r < kRegions; ++r) {
      inputs[static_cast<size_t>(r)] = Tensor(kCount, 200 + 10 * step + r);
    }
    const std::vector<size_t> shards = AllReduceAll("train", "g", inputs);
    if (HasFailure()) return;
    std::ostringstream split;
    split << shards[0] << "," << shards[1] << "," << shards[2];
    EXPECT_GT(shards[0], kCount * 2 / 5) << split.str();
    EXPECT_GT(shards[0] * 4, shards[1] * 5) << split.str();
    EXPECT_GT(shards[0] * 4, shards[2] * 5) << split.str();
    EXPECT_GT(shards[1], 0u) << split.str();
    EXPECT_GT(shards[2], 0u) << split.str();
    if (step > 0) {
      EXPECT_EQ(shards, previous) << "a split changed within a weights round";
    }
    previous = shards;
  }
}

}  // namespace
}  // namespace strait::gateway

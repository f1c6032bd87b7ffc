// Library mode's cross-region step with real straitd processes over strait-wanem: 3 regions x 2
// ranks (each rank index its own cross-region mesh of straitds), every rank quantizes its tensor
// on the CPU with its own error-feedback residual (Encoder::EncodeWithFeedback), sends the frame
// with Client::AllReduceFrame and decodes the reply. Over several steps, for int8 on float32 and
// int4 on bfloat16 input frames: the three regions' result frames are byte-identical per mesh,
// and the decoded result is close to the fp64 sum of the inputs.
//
// Root only (namespaces, TUN devices): skips with the reason otherwise.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "bench/wanem/netns.h"
#include "localproto/client.h"
#include "strait/codec.h"
#include "tests/gateway/wan_cluster.h"

namespace strait::gateway {

// The local protocol and its client (strait::localproto), which these tests drive.
using namespace strait::localproto;  // NOLINT(build/namespaces)
namespace {

constexpr int kRegions = 3;
constexpr int kRanks = 2;

std::vector<float> Tensor(size_t count, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> v(count);
  for (float& x : v) x = dist(rng);
  return v;
}

class StraitdFrame : public ::testing::Test {
 protected:
  void SetUp() override {
    if (Status p = wanem::CheckPrivileges(); !p.ok()) {
      GTEST_SKIP() << "needs strait-wanem (root): " << p.message();
    }
    testing::WanClusterOptions o;
    o.straitd = STRAITD_PATH;
    o.name = "gwframe";
    o.regions = kRegions;
    o.ranks_per_region = kRanks;
    o.link = "200mbit,5ms";
    auto cluster = testing::WanCluster::Start(o);
    ASSERT_TRUE(cluster.ok()) << cluster.status();
    cluster_ = std::move(cluster).value();
    for (int r = 0; r < kRegions; ++r) {
      for (int i = 0; i < kRanks; ++i) {
        auto c = Client::Connect(cluster_->Socket(r, i), Deadline::AfterSeconds(10), "frame-test");
        ASSERT_TRUE(c.ok()) << c.status();
        clients_.push_back(std::move(c).value());
      }
    }
  }
  Client& client(int r, int i) { return *clients_[static_cast<size_t>(r * kRanks + i)]; }

  std::unique_ptr<testing::WanCluster> cluster_;
  std::vector<std::unique_ptr<Client>> clients_;
};

struct Case {
  const char* job;
  const char* policy;
  CodecId codec;
  DataType dtype;  // of the ranks' frames and of what they decode the result into
  uint32_t block;
  ReduceOp op;
  size_t count;
  double bound;       // on |decoded - fp64 reference|, inputs in [-1, 1]
  double mean_bound;  // on its mean (a region left out would cost ~0.5 / 3 per element)
};

TEST_F(StraitdFrame, RanksQuantizeAndEveryRegionGetsTheSameFrame) {
  // With error feedback a rank's error is the difference of two residuals, each at most half a
  // step (absmax/254 for int8, absmax/14 for int4), and so is the owner's on the result.
  // int8 sum (|sum| <= 3): 3 x 2/254 + 2 x 3/254 < 0.05. int4 avg (bf16 in and out): the mean
  // of three ranks' 2/14 and the result's 2/14, plus bf16 rounding: < 0.3.
  const Case cases[] = {
      {"lib8", "int8,ef", CodecId::kInt8, DataType::kFloat32, 256, ReduceOp::kSum, 30011, 0.05,
       0.02},
      {"lib4", "int4,ef", CodecId::kInt4, DataType::kBfloat16, 64, ReduceOp::kAvg, 5003, 0.3, 0.1},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.job);
    for (int r = 0; r < kRegions; ++r) {
      for (int i = 0; i < kRanks; ++i) {
        auto p = client(r, i).RegisterJob(c.job, c.policy, Deadline::AfterSeconds(10));
        ASSERT_TRUE(p.ok()) << p.status();
      }
    }
    const size_t n = static_cast<size_t>(kRegions * kRanks);
    std::vector<std::vector<float>> residuals(n, std::vector<float>(c.count, 0.0f));
    for (int step = 0; step < 3; ++step) {
      SCOPED_TRACE("step " + std::to_string(step));
      std::vector<std::vector<uint8_t>> frames(n), results(n);
      std::vector<std::vector<double>> reference(kRanks, std::vector<double>(c.count, 0.0));
      for (int r = 0; r < kRegions; ++r) {
        for (int i = 0; i < kRanks; ++i) {
          const size_t k = static_cast<size_t>(r * kRanks + i);
          const std::vector<float> f =
              Tensor(c.count, static_cast<uint32_t>(100 * step + 10 * r + i));
          std::vector<uint8_t> in(c.count * DataTypeSize(c.dtype));
          ASSERT_TRUE(ConvertFromFloat(f.data(), in.data(), c.dtype, c.count).ok());
          std::vector<float> held(c.count);  // what the element type holds
          ASSERT_TRUE(ConvertToFloat(in.data(), c.dtype, held.data(), c.count).ok());
          for (size_t e = 0; e < c.count; ++e) reference[static_cast<size_t>(i)][e] += held[e];
          CodecOptions o;
          o.codec = c.codec;
          o.block_size = c.block;
          Encoder enc;
          ASSERT_TRUE(enc.EncodeWithFeedback(in.data(), c.count, c.dtype, o, residuals[k].data(),
                                             &frames[k])
                          .ok());
        }
      }
      std::vector<Status> status(n);
      std::vector<std::thread> threads;
      for (int r = 0; r < kRegions; ++r) {
        for (int i = 0; i < kRanks; ++i) {
          const size_t k = static_cast<size_t>(r * kRanks + i);
          threads.emplace_back([&, r, i, k] {
            status[k] = client(r, i).AllReduceFrame(c.job, "grad", c.op, frames[k], &results[k],
                                                    Deadline::AfterSeconds(20));
          });
        }
      }
      for (auto& t : threads) t.join();
      for (size_t k = 0; k < n; ++k) {
        ASSERT_TRUE(status[k].ok())
            << "rank " << k << ": " << status[k] << "\n"
            << cluster_->Logs(static_cast<int>(k) / kRanks, static_cast<int>(k) % kRanks);
      }
      for (int i = 0; i < kRanks; ++i) {
        auto& ref = reference[static_cast<size_t>(i)];
        if (c.op == ReduceOp::kAvg) {
          for (double& x : ref) x /= kRegions;
        }
        for (int r = 0; r < kRegions; ++r) {
          const auto& frame = results[static_cast<size_t>(r * kRanks + i)];
          EXPECT_TRUE(frame == results[static_cast<size_t>(i)])
              << "region " << r << " rank " << i << " got another result frame than region 0";
          auto info = InspectFrame(frame);
          ASSERT_TRUE(info.ok()) << info.status();
          EXPECT_EQ(info->codec, c.codec);
          EXPECT_EQ(info->block_size, c.block);
          EXPECT_EQ(info->element_count, c.count);
          std::vector<uint8_t> out(c.count * DataTypeSize(c.dtype));
          Decoder dec;
          ASSERT_TRUE(dec.Decode(frame, out.data(), c.count, c.dtype).ok());
          std::vector<float> got(c.count);
          ASSERT_TRUE(ConvertToFloat(out.data(), c.dtype, got.data(), c.count).ok());
          double worst = 0, sum = 0;
          for (size_t e = 0; e < c.count; ++e) {
            const double err = std::abs(got[e] - ref[e]);
            worst = std::max(worst, err);
            sum += err;
          }
          EXPECT_LE(worst, c.bound) << "region " << r << " rank " << i;
          EXPECT_LE(sum / static_cast<double>(c.count), c.mean_bound)
              << "region " << r << " rank " << i;
        }
      }
    }
  }
}

}  // namespace
}  // namespace strait::gateway

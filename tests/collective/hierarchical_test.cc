// Tests of HierarchicalAllReduce with n regions x m gateways as threads: one in-process world per
// region (the LAN) and one per shard index (the WAN). Lossless results equal the reference
// computed in the documented order (regional fp32 sums in gateway order, then the regions in
// rank order); exact ops equal the exact reduction; lossy codecs stay within their step; every
// gateway of every region ends with the same bytes; m = 1 is exactly AllReduce; mismatched
// requests and failures end with a clear error instead of a hang. The public region phases
// (RegionReduceScatter, RegionAllGather) on their own: region_phases_test.cc.
#include "collective/hierarchical.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <thread>

#include "collective/local_transport.h"
#include "common/endian.h"
#include "strait/codec.h"
#include "strait/reduce.h"
#include "tests/collective/hierarchical_inputs.h"

namespace strait::collective {
namespace {

constexpr size_t kChunk = 700;  // several chunks per shard for the larger counts

// n regions x m gateways: region_worlds[r] has m ranks, cross_worlds[g] has n ranks.
struct Cluster {
  Cluster(int regions, int gateways) : n(regions), m(gateways) {
    for (int r = 0; r < n; ++r) region_worlds.push_back(std::make_unique<LocalWorld>(m));
    for (int g = 0; g < m; ++g) cross_worlds.push_back(std::make_unique<LocalWorld>(n));
  }
  Transport& region_transport(int r, int g) { return region_worlds[size_t(r)]->transport(g); }
  // The region side with the same op id as `req` (each world is its own transport).
  RegionSide region(int r, int g, const AllReduceRequest& req) {
    RegionSide side;
    side.transport = &region_transport(r, g);
    side.op_id = req.op_id;
    return side;
  }
  Transport& cross(int r, int g) { return cross_worlds[size_t(g)]->transport(r); }

  // Runs `body(r, g)` on every gateway at once; returns the statuses, [r * m + g].
  std::vector<Status> Run(const std::function<Status(int, int)>& body) {
    std::vector<Status> statuses(size_t(n * m));
    std::vector<std::thread> threads;
    for (int r = 0; r < n; ++r) {
      for (int g = 0; g < m; ++g) {
        threads.emplace_back([&, r, g] { statuses[size_t(r * m + g)] = body(r, g); });
      }
    }
    for (auto& t : threads) t.join();
    return statuses;
  }

  const int n, m;
  std::vector<std::unique_ptr<LocalWorld>> region_worlds;
  std::vector<std::unique_ptr<LocalWorld>> cross_worlds;
};


AllReduceRequest Request(DataType dtype, ReduceOp op, size_t count, CodecId codec) {
  AllReduceRequest req;
  req.job = "job";
  req.tensor_key = "grad";
  req.op_id = 7;
  req.dtype = dtype;
  req.op = op;
  req.count = count;
  req.codec.codec = codec;
  req.chunk_elements = kChunk;
  req.deadline = Deadline::AfterSeconds(30);
  return req;
}

// Runs one hierarchical all-reduce on copies of `inputs`; every gateway must succeed.
Buffers RunHierarchical(Cluster& cluster, const AllReduceRequest& base, const Buffers& inputs,
                        std::vector<ErrorFeedbackStore>* stores = nullptr) {
  Buffers data = inputs;
  const std::vector<Status> statuses = cluster.Run([&](int r, int g) {
    const size_t node = size_t(r * cluster.m + g);
    AllReduceRequest req = base;
    req.data = data[node].data();
    if (stores != nullptr) req.feedback = &(*stores)[node];
    return HierarchicalAllReduce(cluster.region(r, g, req), cluster.cross(r, g), req);
  });
  for (size_t i = 0; i < statuses.size(); ++i) {
    EXPECT_TRUE(statuses[i].ok()) << "node " << i << ": " << statuses[i];
  }
  return data;
}

void ExpectBitIdentical(const Buffers& out, const std::string& what) {
  for (size_t i = 1; i < out.size(); ++i) {
    EXPECT_TRUE(out[i] == out[0]) << what << ": node " << i << " differs from node 0";
  }
}

// The documented float-path result: per region the fp32 sum in gateway order (avg: / m),
// rounded to dtype; then the fp32 sum of those in region order (avg: / n), rounded to dtype.
std::vector<uint8_t> FloatReference(const Buffers& in, int n, int m, size_t count, DataType dtype,
                                    ReduceOp op) {
  std::vector<float> total(count, 0.0f);
  for (int r = 0; r < n; ++r) {
    std::vector<float> acc(count, 0.0f);
    for (int g = 0; g < m; ++g) {
      const std::vector<float> f = ToFloats(in[size_t(r * m + g)], dtype);
      for (size_t i = 0; i < count; ++i) acc[i] = g == 0 ? f[i] : acc[i] + f[i];
    }
    if (op == ReduceOp::kAvg) {
      for (auto& a : acc) a /= static_cast<float>(m);
    }
    const std::vector<float> regional = ToFloats(ToBytes(acc, dtype), dtype);
    for (size_t i = 0; i < count; ++i) total[i] = r == 0 ? regional[i] : total[i] + regional[i];
  }
  if (op == ReduceOp::kAvg) {
    for (auto& t : total) t /= static_cast<float>(n);
  }
  return ToBytes(total, dtype);
}

struct Shape {
  int regions;
  int gateways;
  size_t count;
};

class HierarchicalShapes : public ::testing::TestWithParam<Shape> {};

TEST_P(HierarchicalShapes, LosslessFloatSumAndAvgEqualTheReferenceOnEveryNode) {
  const Shape s = GetParam();
  for (CodecId codec : {CodecId::kNone, CodecId::kZstd}) {
    for (DataType dtype : {DataType::kFloat32, DataType::kBfloat16, DataType::kFloat16}) {
      for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg}) {
        const std::string what =
            std::string(CodecName(codec)) + " " + DataTypeName(dtype) + " " + ReduceOpName(op);
        Cluster cluster(s.regions, s.gateways);
        const Buffers in = Inputs(s.regions, s.gateways, s.count, dtype);
        const Buffers out = RunHierarchical(cluster, Request(dtype, op, s.count, codec), in);
        ExpectBitIdentical(out, what);
        EXPECT_TRUE(out[0] == FloatReference(in, s.regions, s.gateways, s.count, dtype, op))
            << what;
        // And near the fp64 sum: each level rounds at most once to dtype.
        const double rel = dtype == DataType::kFloat32    ? 1e-6
                           : dtype == DataType::kBfloat16 ? 2.0 / 256
                                                          : 2.0 / 2048;
        const std::vector<float> got = ToFloats(out[0], dtype);
        for (size_t i = 0; i < s.count; ++i) {
          double exact = 0, mag = 0;
          for (const auto& b : in) {
            float x = 0;
            ASSERT_TRUE(ConvertToFloat(b.data() + i * DataTypeSize(dtype), dtype, &x, 1).ok());
            exact += x;
            mag += std::fabs(x);
          }
          if (op == ReduceOp::kAvg) {
            exact /= s.regions * s.gateways;
            mag /= s.regions * s.gateways;
          }
          ASSERT_NEAR(got[i], exact, rel * mag + 1e-6 * mag) << what << " element " << i;
        }
      }
    }
  }
}

TEST_P(HierarchicalShapes, ExactOpsEqualTheExactReduction) {
  const Shape s = GetParam();
  const int nodes = s.regions * s.gateways;
  struct Case {
    DataType dtype;
    ReduceOp op;
  };
  for (const Case& c :
       {Case{DataType::kFloat32, ReduceOp::kMax}, Case{DataType::kBfloat16, ReduceOp::kMin},
        Case{DataType::kInt32, ReduceOp::kSum}, Case{DataType::kInt32, ReduceOp::kMax},
        Case{DataType::kInt32, ReduceOp::kAvg}}) {
    const std::string what = std::string(DataTypeName(c.dtype)) + " " + ReduceOpName(c.op);
    Cluster cluster(s.regions, s.gateways);
    const Buffers in = Inputs(s.regions, s.gateways, s.count, c.dtype);
    const Buffers out =
        RunHierarchical(cluster, Request(c.dtype, c.op, s.count, CodecId::kZstd), in);
    ExpectBitIdentical(out, what);
    std::vector<uint8_t> want = in[0];
    const ReduceOp exact = c.op == ReduceOp::kAvg ? ReduceOp::kSum : c.op;
    for (int node = 1; node < nodes; ++node) {
      ASSERT_TRUE(
          ReduceInPlace(c.dtype, exact, in[size_t(node)].data(), want.data(), s.count).ok());
    }
    if (c.op == ReduceOp::kAvg) {
      ASSERT_TRUE(DivideInPlace(c.dtype, want.data(), s.count, uint64_t(nodes)).ok());
    }
    EXPECT_TRUE(out[0] == want) << what;
  }
}

// Half a step of the codec relative to a block's absmax, with round-to-nearest.
double HalfStep(CodecId codec) {
  switch (codec) {
    case CodecId::kInt8: return 0.5 / 127;
    case CodecId::kFp8E4M3: return 1.0 / 16;
    default: return 0;
  }
}

TEST_P(HierarchicalShapes, LossyCrossRegionCodecsAgreeBitwiseAndStayWithinTheirStep) {
  const Shape s = GetParam();
  for (CodecId codec : {CodecId::kInt8, CodecId::kFp8E4M3}) {
    for (DataType dtype : {DataType::kFloat32, DataType::kBfloat16}) {
      const std::string what = std::string(CodecName(codec)) + " " + DataTypeName(dtype);
      Cluster cluster(s.regions, s.gateways);
      const Buffers in = Inputs(s.regions, s.gateways, s.count, dtype);
      const Buffers out =
          RunHierarchical(cluster, Request(dtype, ReduceOp::kSum, s.count, codec), in);
      ExpectBitIdentical(out, what);
      // Each region's sum is quantized once and the owner's total once more; tensor-wide
      // absmaxes bound the blocks' ones. Then rounding to dtype, at each level.
      std::vector<double> exact(s.count, 0.0);
      double regional_absmax_sum = 0;
      for (int r = 0; r < s.regions; ++r) {
        double absmax = 0;
        for (size_t i = 0; i < s.count; ++i) {
          double regional = 0;
          for (int g = 0; g < s.gateways; ++g) {
            float x = 0;
            ASSERT_TRUE(
                ConvertToFloat(in[size_t(r * s.gateways + g)].data() + i * DataTypeSize(dtype),
                               dtype, &x, 1)
                    .ok());
            regional += x;
          }
          exact[i] += regional;
          absmax = std::max(absmax, std::fabs(regional));
        }
        regional_absmax_sum += absmax;
      }
      const double e = HalfStep(codec);
      const double quant = e * regional_absmax_sum + e * (1 + e) * (1 + e) * regional_absmax_sum;
      const double rel = dtype == DataType::kFloat32 ? 1e-6 : 2.0 / 256;
      const std::vector<float> got = ToFloats(out[0], dtype);
      size_t differs = 0;
      for (size_t i = 0; i < s.count; ++i) {
        const double bound = quant + rel * (std::fabs(exact[i]) + quant + regional_absmax_sum);
        ASSERT_NEAR(got[i], exact[i], bound) << what << " element " << i;
        differs += got[i] != static_cast<float>(exact[i]);
      }
      if (s.count >= 100) {
        EXPECT_GT(differs, 0u) << what << ": was the codec used?";
      }
    }
  }
}

TEST_P(HierarchicalShapes, ErrorFeedbackStepsStayBitIdentical) {
  const Shape s = GetParam();
  Cluster cluster(s.regions, s.gateways);
  std::vector<ErrorFeedbackStore> stores(size_t(s.regions * s.gateways));
  AllReduceRequest req = Request(DataType::kFloat32, ReduceOp::kSum, s.count, CodecId::kInt4);
  req.error_feedback = true;
  for (int step = 0; step < 3; ++step) {
    req.op_id = 100 + uint64_t(step);
    const Buffers out =
        RunHierarchical(cluster, req, Inputs(s.regions, s.gateways, s.count, req.dtype), &stores);
    ExpectBitIdentical(out, "int4+ef step " + std::to_string(step));
  }
}

// Counts below m (empty shards), odd counts, several chunks per shard.
INSTANTIATE_TEST_SUITE_P(Shapes, HierarchicalShapes,
                         ::testing::Values(Shape{2, 2, 0}, Shape{2, 3, 2}, Shape{2, 2, 1},
                                           Shape{2, 3, 7}, Shape{2, 2, 4099}, Shape{2, 3, 5003},
                                           Shape{3, 2, 1001}),
                         [](const ::testing::TestParamInfo<Shape>& p) {
                           return std::to_string(p.param.regions) + "x" +
                                  std::to_string(p.param.gateways) + "_" +
                                  std::to_string(p.param.count);
                         });

TEST(RegionShards, SplitAsEvenlyAsPossibleLowerShardsFirst) {
  const auto a = RegionShards(10, 3);
  ASSERT_EQ(a.size(), 3u);
  EXPECT_EQ(a[0].begin, 0u);
  EXPECT_EQ(a[0].count, 4u);
  EXPECT_EQ(a[1].begin, 4u);
  EXPECT_EQ(a[1].count, 3u);
  EXPECT_EQ(a[2].begin, 7u);
  EXPECT_EQ(a[2].count, 3u);
  const auto b = RegionShards(2, 3);
  ASSERT_EQ(b.size(), 3u);
  EXPECT_EQ(b[0].count, 1u);
  EXPECT_EQ(b[1].count, 1u);
  EXPECT_EQ(b[2].count, 0u);
  EXPECT_EQ(RegionShardKey("grad", 1, 3), "grad:region-shard1/3");
  EXPECT_EQ(RegionShardKey("grad", 0, 1), "grad");
}

TEST(Hierarchical, OneGatewayPerRegionIsExactlyAllReduce) {
  const size_t count = 3001;
  AllReduceRequest req = Request(DataType::kBfloat16, ReduceOp::kSum, count, CodecId::kInt8);
  req.codec.rounding = Rounding::kStochastic;
  req.codec.seed = 99;
  const Buffers in = Inputs(3, 1, count, req.dtype);
  Cluster cluster(3, 1);
  const Buffers hier = RunHierarchical(cluster, req, in);
  LocalWorld flat(3);
  Buffers plain = in;
  std::vector<std::thread> threads;
  std::vector<Status> st(3);
  for (int r = 0; r < 3; ++r) {
    threads.emplace_back([&, r] {
      AllReduceRequest q = req;
      q.data = plain[size_t(r)].data();
      st[size_t(r)] = AllReduce(flat.transport(r), q);
    });
  }
  for (auto& t : threads) t.join();
  for (const Status& s : st) ASSERT_TRUE(s.ok()) << s;
  for (int r = 0; r < 3; ++r) EXPECT_TRUE(hier[size_t(r)] == plain[size_t(r)]) << "region " << r;
}

TEST(Hierarchical, NodesThatIssueDifferentAllReducesGetAClearError) {
  Cluster cluster(2, 2);
  const size_t count = 1000;
  Buffers data = Inputs(2, 2, count + 10, DataType::kFloat32);
  const std::vector<Status> st = cluster.Run([&](int r, int g) {
    // Region 1's gateway 1 was asked for 10 more elements than everyone else.
    AllReduceRequest req = Request(DataType::kFloat32, ReduceOp::kSum,
                                   r == 1 && g == 1 ? count + 10 : count, CodecId::kNone);
    req.deadline = Deadline::AfterSeconds(20);
    req.data = data[size_t(r * 2 + g)].data();
    return HierarchicalAllReduce(cluster.region(r, g, req), cluster.cross(r, g), req);
  });
  // Whichever of region 1's gateways sees the mismatch first aborts the other.
  for (int g = 0; g < 2; ++g) {
    const Status& s = st[size_t(2 + g)];
    EXPECT_TRUE(s.code() == StatusCode::kInvalidArgument || s.code() == StatusCode::kAborted) << s;
    EXPECT_NE(s.message().find("every node head of the region must issue the same"),
              std::string::npos)
        << s;
  }
  // Region 0 is unaffected in phase 1; its gateways end with region 1's abort, not a wrong sum.
  for (int g = 0; g < 2; ++g) {
    EXPECT_EQ(st[size_t(g)].code(), StatusCode::kAborted) << st[size_t(g)];
    EXPECT_NE(st[size_t(g)].message().find("every node head"), std::string::npos) << st[size_t(g)];
  }
}

TEST(Hierarchical, AFailureSpreadsThroughEveryRegionAsAnAbort) {
  Cluster cluster(2, 2);
  // The WAN of shard 1 is down: region b's gateway 1 is cut off from region a's.
  cluster.cross_worlds[1]->FailRank(1, UnavailableError("region b's shard-1 gateway is gone"));
  const size_t count = 2000;
  Buffers data = Inputs(2, 2, count, DataType::kFloat32);
  const std::vector<Status> st = cluster.Run([&](int r, int g) {
    AllReduceRequest req = Request(DataType::kFloat32, ReduceOp::kSum, count, CodecId::kNone);
    req.deadline = Deadline::AfterSeconds(4);
    req.data = data[size_t(r * 2 + g)].data();
    return HierarchicalAllReduce(cluster.region(r, g, req), cluster.cross(r, g), req);
  });
  // a/1 sees the failure itself.
  EXPECT_EQ(st[1].code(), StatusCode::kUnavailable) << st[1];
  EXPECT_NE(st[1].message().find("shard-1 gateway is gone"), std::string::npos) << st[1];
  // a/0 finished its own shard and hears of it from a/1's abort, with a/1's reason; without the
  // abort it would end with kDeadlineExceeded, waiting for a/1's shard.
  EXPECT_EQ(st[0].code(), StatusCode::kAborted) << st[0];
  EXPECT_NE(st[0].message().find("shard-1 gateway is gone"), std::string::npos) << st[0];
  // Region b: gateway 1, cut off and not told (a failed rank misses aborts), gives up at its
  // phase-2 deadline and aborts region b; neither ends with a result.
  EXPECT_FALSE(st[2].ok());
  EXPECT_FALSE(st[3].ok());
}

TEST(Hierarchical, BadRequestsAreRefusedBeforeAnyMessage) {
  Cluster cluster(2, 2);
  std::vector<float> x(10, 1.0f);
  AllReduceRequest req = Request(DataType::kInt32, ReduceOp::kSum, 10, CodecId::kInt8);
  req.data = x.data();
  Status s = HierarchicalAllReduce(cluster.region(0, 0, req), cluster.cross(0, 0), req);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("lossy"), std::string::npos) << s;
  req = Request(DataType::kFloat32, ReduceOp::kSum, 10, CodecId::kNone);
  s = HierarchicalAllReduce(cluster.region(0, 0, req), cluster.cross(0, 0), req);  // data null
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s;
  EXPECT_EQ(cluster.region_worlds[0]->BufferedMessages(1), 0u);
}


TEST(Hierarchical, LossyResultsCrossTheRegionAsTheFramesPhaseTwoDecoded) {
  // 2 regions x 2 gateways, int8: each gateway's shard (2050 elements, more than 2 owners x 256
  // per block) goes to its region peer as one frame, not raw, and every node still ends with
  // the same bits. int4 halves the codes again; fp16 nodes decode the same way.
  const size_t count = 4100;
  for (CodecId codec : {CodecId::kInt8, CodecId::kInt4}) {
    for (DataType dtype : {DataType::kFloat32, DataType::kFloat16}) {
      const std::string what = std::string(CodecName(codec)) + " " + DataTypeName(dtype);
      Cluster cluster(2, 2);
      const Buffers in = Inputs(2, 2, count, dtype);
      Buffers data = in;
      std::vector<HierarchicalStats> stats(4);
      const AllReduceRequest base = Request(dtype, ReduceOp::kSum, count, codec);
      const std::vector<Status> st = cluster.Run([&](int r, int g) {
        AllReduceRequest req = base;
        req.data = data[size_t(r * 2 + g)].data();
        return HierarchicalAllReduce(cluster.region(r, g, req), cluster.cross(r, g), req,
                                     &stats[size_t(r * 2 + g)]);
      });
      for (const Status& s : st) ASSERT_TRUE(s.ok()) << what << ": " << s;
      ExpectBitIdentical(data, what);
      auto plan = RegionPlan(count, 2, kChunk);
      ASSERT_TRUE(plan.ok());
      const size_t elem = DataTypeSize(dtype);
      for (int g = 0; g < 2; ++g) {
        const Shard shard = plan->shards[size_t(g)];
        const size_t other = plan->shards[size_t(1 - g)].count;
        const size_t codes = codec == CodecId::kInt4 ? (shard.count + 1) / 2 : shard.count;
        const size_t frame = kFrameHeaderSize + (shard.count + 255) / 256 * 4 + codes;
        const uint64_t scatter = other * elem + 16 * plan->ChunkCount(1 - g);
        EXPECT_EQ(stats[size_t(g)].region_bytes_sent, scatter + 16 + frame) << what << " " << g;
        // Both region phases ran and were timed (the gateway's region_*_ns counters).
        EXPECT_GT(stats[size_t(g)].region_scatter_ns, 0) << what << " " << g;
        EXPECT_GT(stats[size_t(g)].region_gather_ns, 0) << what << " " << g;
        EXPECT_LT(16 + frame, shard.count * elem) << what;  // half of fp16's, a quarter of fp32's
      }
    }
  }
}

}  // namespace
}  // namespace strait::collective
// Tests of HierarchicalAllReduce with n regions x m gateways as threads: one in-process world per
// region (the LAN) and one per shard index (the WAN). Lossless results equal the reference
// computed in the documented order (regional fp32 sums in gateway order, then the regions in
// rank order); exact ops equal the exact reduction; lossy codecs stay within their step; every
// gateway of every region ends with the same bytes; m = 1 is exactly AllReduce; mismatched
// requests and failures end with a clear error instead of a hang. The public region phases
// (RegionReduceScatter, RegionAllGather: what library mode's host backend runs) are tested on
// their own too: their results, their documented message format byte by byte, their errors.
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

namespace strait::collective {
namespace {

constexpr size_t kChunk = 700;  // several chunks per shard for the larger counts

using Buffers = std::vector<std::vector<uint8_t>>;  // [region * m + gateway]

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

std::vector<uint8_t> ToBytes(const std::vector<float>& f, DataType dtype) {
  std::vector<uint8_t> b(f.size() * DataTypeSize(dtype));
  EXPECT_TRUE(ConvertFromFloat(f.data(), b.data(), dtype, f.size()).ok());
  return b;
}
std::vector<float> ToFloats(const std::vector<uint8_t>& b, DataType dtype) {
  std::vector<float> f(b.size() / DataTypeSize(dtype));
  EXPECT_TRUE(ConvertToFloat(b.data(), dtype, f.data(), f.size()).ok());
  return f;
}

// Node (r, g)'s input: floats of differing magnitudes, or small integers for integer types.
Buffers Inputs(int n, int m, size_t count, DataType dtype) {
  Buffers in;
  for (int node = 0; node < n * m; ++node) {
    std::mt19937 gen(977u + static_cast<uint32_t>(node) * 7919u);
    if (IsLossyCodableType(dtype)) {
      std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
      std::vector<float> v(count);
      for (auto& x : v) x = dist(gen) * (1.0f + static_cast<float>(node));
      in.push_back(ToBytes(v, dtype));
    } else {
      EXPECT_EQ(dtype, DataType::kInt32);
      std::uniform_int_distribution<int32_t> dist(-1000, 1000);
      std::vector<int32_t> v(count);
      for (auto& x : v) x = dist(gen);
      std::vector<uint8_t> b(count * 4);
      if (count > 0) std::memcpy(b.data(), v.data(), b.size());
      in.push_back(std::move(b));
    }
  }
  return in;
}

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

// ---- The region phases on their own (m members over one in-process world) ----

// The documented phase-1 reduction of `in` (one buffer per member) over members 0..m-1 in order:
// fp32 for sum/avg of float types (avg / m), rounded once; exactly otherwise (avg sums).
std::vector<uint8_t> RegionReference(const Buffers& in, size_t count, DataType dtype, ReduceOp op) {
  const int m = static_cast<int>(in.size());
  if (IsFloatReduction(dtype, op)) {
    std::vector<float> acc(count, 0.0f);
    for (int g = 0; g < m; ++g) {
      const std::vector<float> f = ToFloats(in[size_t(g)], dtype);
      for (size_t i = 0; i < count; ++i) acc[i] = g == 0 ? f[i] : acc[i] + f[i];
    }
    if (op == ReduceOp::kAvg) {
      for (float& x : acc) x /= static_cast<float>(m);
    }
    return ToBytes(acc, dtype);
  }
  EXPECT_EQ(dtype, DataType::kInt32);
  std::vector<int32_t> acc(count);
  std::memcpy(acc.data(), in[0].data(), count * 4);
  for (int g = 1; g < m; ++g) {
    std::vector<int32_t> v(count);
    std::memcpy(v.data(), in[size_t(g)].data(), count * 4);
    for (size_t i = 0; i < count; ++i) {
      acc[i] = op == ReduceOp::kMax ? std::max(acc[i], v[i]) : acc[i] + v[i];
    }
  }
  std::vector<uint8_t> out(count * 4);
  std::memcpy(out.data(), acc.data(), out.size());
  return out;
}

// Member g's RegionOperation over `world` for `data` (one op id for all).
RegionOperation RegionOp(LocalWorld& world, int g, const Plan& plan, std::vector<uint8_t>& data,
                         DataType dtype, ReduceOp op) {
  RegionOperation o;
  o.transport = &world.transport(g);
  o.op_id = 11;
  o.plan = &plan;
  o.data = data.data();
  o.dtype = dtype;
  o.op = op;
  o.deadline = Deadline::AfterSeconds(20);
  return o;
}

// The 16-byte header the file comment of hierarchical.h documents, written field by field here
// (not with the library's code) so that a change of the wire format fails this test.
std::vector<uint8_t> DocumentedMessage(uint8_t version, uint8_t kind, DataType dtype, ReduceOp op,
                                       uint64_t count, const std::vector<uint8_t>& payload) {
  std::vector<uint8_t> msg(16, 0);
  msg[0] = version;
  msg[1] = kind;
  msg[2] = static_cast<uint8_t>(dtype);
  msg[3] = static_cast<uint8_t>(op);
  PutU64(&msg[8], count);
  msg.insert(msg.end(), payload.begin(), payload.end());
  return msg;
}

TEST(RegionPhases, ReduceScatterReducesEachShardInMemberOrderAndAllGatherSharesIt) {
  struct Case {
    DataType dtype;
    ReduceOp op;
  };
  const Case cases[] = {{DataType::kFloat32, ReduceOp::kSum},
                        {DataType::kBfloat16, ReduceOp::kAvg},
                        {DataType::kInt32, ReduceOp::kMax},
                        {DataType::kInt32, ReduceOp::kAvg}};
  // 1001 elements: shards of 334, 334, 333, chunks of at most 100. 60001 in chunks of 20000:
  // a chunk spans several of the reduction's 8192-element blocks, the last one partial.
  const std::pair<size_t, size_t> sizes[] = {{1001, 100}, {60001, 20000}};
  for (const auto& [count, chunk_elements] : sizes) {
    for (const int m : {1, 3}) {
      for (const Case& c : cases) {
        const std::string what = std::string(DataTypeName(c.dtype)) + " " + ReduceOpName(c.op) +
                                 ", m = " + std::to_string(m) + ", " + std::to_string(count) +
                                 " elements";
        const size_t elem = DataTypeSize(c.dtype);
        auto plan = RegionPlan(count, m, chunk_elements);
        ASSERT_TRUE(plan.ok()) << plan.status();
        const Buffers inputs = Inputs(1, m, count, c.dtype);
        const std::vector<uint8_t> want = RegionReference(inputs, count, c.dtype, c.op);
        LocalWorld world(m);
        Buffers data = inputs;
        Buffers after_scatter(static_cast<size_t>(m));
        std::vector<RegionOperation> ops;
        std::vector<size_t> tracked(size_t(m), 0);
        auto failed_sends = std::make_shared<std::atomic<int>>(0);
        for (int g = 0; g < m; ++g) {
          ops.push_back(RegionOp(world, g, *plan, data[size_t(g)], c.dtype, c.op));
          ops.back().track_send = [&tracked, g, failed_sends] {
            ++tracked[size_t(g)];
            return SendDone([failed_sends](const Status& s) {
              if (!s.ok()) ++*failed_sends;
            });
          };
        }
        std::vector<Status> st(static_cast<size_t>(m));
        std::vector<std::thread> threads;
        for (int g = 0; g < m; ++g) {
          threads.emplace_back([&, g] {
            st[size_t(g)] = RegionReduceScatter(ops[size_t(g)]);
            after_scatter[size_t(g)] = data[size_t(g)];
            if (st[size_t(g)].ok()) st[size_t(g)] = RegionAllGather(ops[size_t(g)]);
          });
        }
        for (auto& t : threads) t.join();
        EXPECT_EQ(*failed_sends, 0) << what;
        for (int g = 0; g < m; ++g) {
          ASSERT_TRUE(st[size_t(g)].ok()) << what << ", member " << g << ": " << st[size_t(g)];
          // After phase 1: the member's own shard is reduced; the rest is still its input.
          const Shard shard = plan->shards[size_t(g)];
          for (size_t i = 0; i < count * elem; ++i) {
            const bool own = i >= shard.begin * elem && i < (shard.begin + shard.count) * elem;
            ASSERT_EQ(after_scatter[size_t(g)][i], own ? want[i] : inputs[size_t(g)][i])
                << what << ", member " << g << ", byte " << i;
          }
          // After phase 3: everything is the reduction, on every member.
          EXPECT_TRUE(data[size_t(g)] == want) << what << ", member " << g;
          // Phase 1 sends one message per chunk of every other shard, phase 3 one per own chunk
          // and other member; every message is the 16-byte header plus the chunk.
          const size_t own_chunks = plan->ChunkCount(g);
          const size_t other_chunks = plan->chunks.size() - own_chunks;
          EXPECT_EQ(tracked[size_t(g)], other_chunks + own_chunks * size_t(m - 1)) << what;
          const uint64_t sent = (count - shard.count) * elem + 16 * other_chunks +
                                uint64_t(m - 1) * (shard.count * elem + 16 * own_chunks);
          const uint64_t received = uint64_t(m - 1) * (shard.count * elem + 16 * own_chunks) +
                                    (count - shard.count) * elem + 16 * other_chunks;
          EXPECT_EQ(ops[size_t(g)].bytes_sent, sent) << what << ", member " << g;
          EXPECT_EQ(ops[size_t(g)].bytes_received, received) << what << ", member " << g;
          EXPECT_FALSE(ops[size_t(g)].peer_aborted) << what;
        }
        for (int g = 0; g < m; ++g) EXPECT_EQ(world.BufferedMessages(g), 0u) << what;
      }
    }
  }
}

TEST(RegionPhases, AcceptTheDocumentedMessageFormat) {
  // Member 1 is played by the test: its part of shard 0 (the first 2 of 4 int32) goes out in the
  // documented layout; member 0 must add it, and its own all-gather message must be that layout.
  LocalWorld world(2);
  auto plan = RegionPlan(4, 2, 16);
  ASSERT_TRUE(plan.ok()) << plan.status();
  std::vector<int32_t> mine = {1, 2, 3, 4};
  std::vector<uint8_t> data(16);
  std::memcpy(data.data(), mine.data(), 16);
  RegionOperation o = RegionOp(world, 0, *plan, data, DataType::kInt32, ReduceOp::kSum);
  const std::vector<int32_t> theirs = {10, 20};
  std::vector<uint8_t> payload(8);
  std::memcpy(payload.data(), theirs.data(), 8);
  const Chunk& chunk0 = plan->ChunkOf(0, 0);
  world.transport(1).Send(
      0, MakeTag(o.op_id, TagPhase::kMeshScatter, chunk0.id),
      DocumentedMessage(kHierarchicalVersion, 0, DataType::kInt32, ReduceOp::kSum, 4, payload),
      o.deadline, [](const Status&) {});
  ASSERT_TRUE(RegionReduceScatter(o).ok());
  std::vector<int32_t> got(4);
  std::memcpy(got.data(), data.data(), 16);
  EXPECT_EQ(got, (std::vector<int32_t>{11, 22, 3, 4}));
  // Member 0's part of shard 1 and, after the all-gather, its result are documented messages.
  std::vector<uint8_t> msg;
  const Chunk& chunk1 = plan->ChunkOf(1, 0);
  ASSERT_TRUE(world.transport(1)
                  .Recv(0, MakeTag(o.op_id, TagPhase::kMeshScatter, chunk1.id), o.deadline, &msg)
                  .ok());
  std::vector<uint8_t> part(data.begin() + 8, data.end());
  EXPECT_EQ(msg, DocumentedMessage(2, 0, DataType::kInt32, ReduceOp::kSum, 4, part));
  std::memcpy(payload.data(), theirs.data(), 8);  // shard 1's result, as member 1 would send it
  world.transport(1).Send(0, MakeTag(o.op_id, TagPhase::kMeshGather, chunk1.id),
                          DocumentedMessage(2, 1, DataType::kInt32, ReduceOp::kSum, 4, payload),
                          o.deadline, [](const Status&) {});
  ASSERT_TRUE(RegionAllGather(o).ok());
  ASSERT_TRUE(world.transport(1)
                  .Recv(0, MakeTag(o.op_id, TagPhase::kMeshGather, chunk0.id), o.deadline, &msg)
                  .ok());
  const std::vector<uint8_t> result(data.begin(), data.begin() + 8);
  EXPECT_EQ(msg, DocumentedMessage(2, 1, DataType::kInt32, ReduceOp::kSum, 4, result));
  std::memcpy(got.data(), data.data(), 16);
  EXPECT_EQ(got, (std::vector<int32_t>{11, 22, 10, 20}));
}

TEST(RegionPhases, MalformedMessagesAreDataLossNamingThePeer) {
  struct Case {
    std::vector<uint8_t> message;
    const char* says;
  };
  const std::vector<uint8_t> two(8, 0);
  const Case cases[] = {
      {{1, 0, 7}, "shorter than the 16-byte header"},
      {DocumentedMessage(1, 0, DataType::kInt32, ReduceOp::kSum, 4, two), "version 1"},
      {DocumentedMessage(3, 0, DataType::kInt32, ReduceOp::kSum, 4, two), "version 3"},
      {DocumentedMessage(2, 1, DataType::kInt32, ReduceOp::kSum, 4, two), "kind 1"},
      // A result frame belongs to phase 3 only.
      {DocumentedMessage(2, 2, DataType::kInt32, ReduceOp::kSum, 4, two), "kind 2"},
      {DocumentedMessage(2, 0, DataType::kInt32, ReduceOp::kSum, 4, {1, 2, 3, 4}), "sent 4 bytes"},
  };
  for (const Case& c : cases) {
    LocalWorld world(2);
    auto plan = RegionPlan(4, 2, 16);
    ASSERT_TRUE(plan.ok()) << plan.status();
    std::vector<uint8_t> data(16, 0);
    RegionOperation o = RegionOp(world, 0, *plan, data, DataType::kInt32, ReduceOp::kSum);
    world.transport(1).Send(0, MakeTag(o.op_id, TagPhase::kMeshScatter, plan->ChunkOf(0, 0).id),
                            c.message, o.deadline, [](const Status&) {});
    const Status s = RegionReduceScatter(o);
    EXPECT_EQ(s.code(), StatusCode::kDataLoss) << c.says << ": " << s;
    EXPECT_NE(s.message().find(c.says), std::string::npos) << s;
    EXPECT_NE(s.message().find("region gateway"), std::string::npos) << s;
    EXPECT_FALSE(o.peer_aborted);
  }
}

TEST(RegionPhases, AllGatherTakesAMembersShardAsOneFrameAndRefusesABadOne) {
  // Member 1 (the test) sends its shard, elements 300..599 of 600 bfloat16, as the documented
  // kind-2 message: one int8 frame under the tag of the shard's first chunk. Member 0 must
  // decode it into place exactly as Decoder does, for every chunk of that shard at once.
  const size_t count = 600;
  auto plan = RegionPlan(count, 2, 128);  // three chunks per shard
  ASSERT_TRUE(plan.ok()) << plan.status();
  const Shard theirs = plan->shards[1];
  std::vector<float> values(theirs.count);
  for (size_t i = 0; i < values.size(); ++i) values[i] = std::sin(float(i)) * 3.0f;
  CodecOptions int8;
  int8.codec = CodecId::kInt8;
  std::vector<uint8_t> frame;
  ASSERT_TRUE(Encoder().Encode(values.data(), values.size(), DataType::kFloat32, int8, &frame).ok());
  std::vector<uint8_t> want(theirs.count * 2);
  ASSERT_TRUE(Decoder().Decode(frame, want.data(), theirs.count, DataType::kBfloat16).ok());

  std::vector<uint8_t> corrupt = frame;
  corrupt.back() ^= 0x5a;  // a code byte: the payload's checksum no longer holds
  std::vector<uint8_t> lossless;
  ASSERT_TRUE(Encoder().Encode(values.data(), values.size(), DataType::kFloat32, CodecOptions{},
                               &lossless).ok());
  std::vector<uint8_t> short_one;  // a frame of one element fewer than the shard
  ASSERT_TRUE(Encoder().Encode(values.data(), values.size() - 1, DataType::kFloat32, int8,
                               &short_one).ok());
  struct Case {
    const std::vector<uint8_t>* frame;
    const char* says;  // empty: decodes
  };
  const Case cases[] = {{&frame, ""},
                        {&corrupt, "corrupted frame payload"},
                        {&lossless, "only a lossy one belongs"},
                        {&short_one, "does not decode to it"}};
  for (const Case& c : cases) {
    LocalWorld world(2);
    std::vector<uint8_t> data(count * 2, 0);
    RegionOperation o = RegionOp(world, 0, *plan, data, DataType::kBfloat16, ReduceOp::kSum);
    world.transport(1).Send(
        0, MakeTag(o.op_id, TagPhase::kMeshGather, plan->ChunkOf(1, 0).id),
        DocumentedMessage(2, 2, DataType::kBfloat16, ReduceOp::kSum, count, *c.frame), o.deadline,
        [](const Status&) {});
    const Status s = RegionAllGather(o);
    if (*c.says == 0) {
      ASSERT_TRUE(s.ok()) << s;
      EXPECT_TRUE(std::equal(want.begin(), want.end(), data.begin() + theirs.begin * 2));
      EXPECT_EQ(world.BufferedMessages(0), 0u);
      continue;
    }
    EXPECT_EQ(s.code(), StatusCode::kDataLoss) << c.says << ": " << s;
    EXPECT_NE(s.message().find(c.says), std::string::npos) << s;
    EXPECT_NE(s.message().find("region gateway"), std::string::npos) << s;
  }
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

TEST(RegionPhases, MembersThatDisagreeGetTheMismatchErrorInTheCallersWords) {
  LocalWorld world(2);
  Buffers data = Inputs(1, 2, 1001, DataType::kFloat32);
  // Member 1 was asked for one element more; one chunk per shard, so that the chunk ids agree.
  auto plan0 = RegionPlan(1000, 2, 1 << 20);
  auto plan1 = RegionPlan(1001, 2, 1 << 20);
  ASSERT_TRUE(plan0.ok() && plan1.ok());
  std::vector<Status> st(2);
  std::vector<std::thread> threads;
  for (int g = 0; g < 2; ++g) {
    threads.emplace_back([&, g] {
      RegionOperation o = RegionOp(world, g, g == 0 ? *plan0 : *plan1, data[size_t(g)],
                                   DataType::kFloat32, ReduceOp::kSum);
      o.names.peer = [](int peer) { return "rank #" + std::to_string(peer); };
      o.names.self = "this rank";
      o.names.members = "rank";
      o.names.mismatch_code = StatusCode::kFailedPrecondition;
      st[size_t(g)] = RegionReduceScatter(o);
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(st[0].code(), StatusCode::kFailedPrecondition) << st[0];
  EXPECT_NE(st[0].message().find("every rank must issue the same all-reduces in the same order, "
                                 "but rank #1 runs one of 1001 float32 (sum) and this rank one "
                                 "of 1000 float32 (sum)"),
            std::string::npos)
      << st[0];
  EXPECT_EQ(st[1].code(), StatusCode::kFailedPrecondition) << st[1];
  EXPECT_NE(st[1].message().find("rank #0 runs one of 1000"), std::string::npos) << st[1];
}

TEST(RegionPhases, APeersAbortEndsTheWaitAndIsReported) {
  LocalWorld world(2);
  auto plan = RegionPlan(100, 2, 10);
  ASSERT_TRUE(plan.ok()) << plan.status();
  std::vector<uint8_t> data(400, 0);
  RegionOperation o = RegionOp(world, 0, *plan, data, DataType::kInt32, ReduceOp::kSum);
  world.transport(1).Abort(o.op_id, UnavailableError("member 1 lost its gateway"));
  const Status s = RegionReduceScatter(o);
  EXPECT_EQ(s.code(), StatusCode::kAborted) << s;
  EXPECT_NE(s.message().find("member 1 lost its gateway"), std::string::npos) << s;
  EXPECT_TRUE(o.peer_aborted);
}

TEST(RegionPhases, BadOperationsAreRefusedBeforeAnyMessage) {
  LocalWorld world(2);
  auto plan3 = RegionPlan(10, 3, 4);
  auto plan2 = RegionPlan(10, 2, 4);
  ASSERT_TRUE(plan3.ok() && plan2.ok());
  std::vector<uint8_t> data(40, 0);
  RegionOperation o = RegionOp(world, 0, *plan3, data, DataType::kInt32, ReduceOp::kSum);
  EXPECT_EQ(RegionReduceScatter(o).code(), StatusCode::kInvalidArgument);  // 3 shards, 2 members
  EXPECT_EQ(RegionAllGather(o).code(), StatusCode::kInvalidArgument);
  o.plan = nullptr;
  EXPECT_EQ(RegionReduceScatter(o).code(), StatusCode::kInvalidArgument);
  o.plan = &*plan2;
  o.data = nullptr;
  EXPECT_EQ(RegionReduceScatter(o).code(), StatusCode::kInvalidArgument);
  o.data = data.data();
  o.transport = nullptr;
  EXPECT_EQ(RegionAllGather(o).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(world.BufferedMessages(1), 0u);
}

TEST(RegionPhases, PlanAndPhaseTwoDeadline) {
  auto plan = RegionPlan(10, 3, 2);
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_EQ(plan->shards.size(), 3u);
  const std::vector<Shard> shards = RegionShards(10, 3);
  for (size_t g = 0; g < 3; ++g) {
    EXPECT_EQ(plan->shards[g].begin, shards[g].begin);
    EXPECT_EQ(plan->shards[g].count, shards[g].count);
  }
  EXPECT_EQ(plan->ChunkCount(0), 2u);  // 4 elements in chunks of 2
  EXPECT_FALSE(RegionPlan(10, 0, 2).ok());
  EXPECT_FALSE(RegionPlan(10, 2, 0).ok());

  EXPECT_TRUE(CrossPhaseDeadline(Deadline::Infinite(), 4).IsInfinite());
  const Deadline d = Deadline::AfterSeconds(100);
  EXPECT_EQ(CrossPhaseDeadline(d, 1).at_nanos(), d.at_nanos());  // nobody to tell
  // A tenth of the time left, at most 2 s, earlier.
  // (The bounds allow for the time between the two clock readings.)
  const int64_t big = d.at_nanos() - CrossPhaseDeadline(d, 2).at_nanos();
  EXPECT_GT(big, 1'900'000'000);
  EXPECT_LE(big, 2'000'000'000);
  const Deadline soon = Deadline::AfterSeconds(1);
  const int64_t margin = soon.at_nanos() - CrossPhaseDeadline(soon, 2).at_nanos();
  EXPECT_GT(margin, 50'000'000);
  EXPECT_LE(margin, 100'000'000);

  EXPECT_TRUE(IsFloatReduction(DataType::kBfloat16, ReduceOp::kAvg));
  EXPECT_FALSE(IsFloatReduction(DataType::kFloat32, ReduceOp::kMax));
  EXPECT_FALSE(IsFloatReduction(DataType::kInt32, ReduceOp::kSum));
}

}  // namespace
}  // namespace strait::collective

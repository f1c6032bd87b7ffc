// Tests of AllReduce's frame modes (library mode): a pre-encoded input (the rank quantized its
// contribution itself, with its own error-feedback residual) and the result as one frame. The
// result must be byte-for-byte what the normal lossy path gives when the caller's quantization
// equals the path's own sender encoding, identical on every rank, over several error-feedback
// steps, on the mesh and the ring; bad requests fail before touching the transport.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <random>
#include <thread>

#include "collective/allreduce.h"
#include "collective/local_transport.h"

namespace strait::collective {
namespace {

using Buffers = std::vector<std::vector<uint8_t>>;

std::vector<Status> RunRanks(int world, const std::function<Status(Transport&, int)>& body) {
  LocalWorld w(world);
  std::vector<Status> statuses(static_cast<size_t>(world));
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] { statuses[static_cast<size_t>(r)] = body(w.transport(r), r); });
  }
  for (auto& t : threads) t.join();
  return statuses;
}

std::vector<uint8_t> Input(int rank, size_t count, DataType dtype, uint32_t step) {
  std::mt19937 gen(77u + static_cast<uint32_t>(rank) * 7919u + step * 104729u);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> f(count);
  for (auto& x : f) x = dist(gen) * (1.0f + static_cast<float>(rank));
  std::vector<uint8_t> b(count * DataTypeSize(dtype));
  EXPECT_TRUE(ConvertFromFloat(f.data(), b.data(), dtype, count).ok());
  return b;
}

AllReduceRequest Base(DataType dtype, ReduceOp op, size_t count, CodecId codec, uint64_t op_id) {
  AllReduceRequest req;
  req.job = "job";
  req.tensor_key = "grad";
  req.op_id = op_id;
  req.dtype = dtype;
  req.op = op;
  req.count = count;
  req.codec.codec = codec;
  req.codec.block_size = 64;
  req.chunk_elements = 1000;  // several chunks per shard, the last one partial
  req.error_feedback = true;
  req.deadline = Deadline::AfterSeconds(30);
  return req;
}

struct Case {
  CodecId codec;
  DataType dtype;
  ReduceOp op;
  Algorithm algorithm;
  size_t count;
};

class FrameModes : public ::testing::TestWithParam<Case> {};

TEST_P(FrameModes, PreEncodedInputGivesTheNormalPathsBytesOnEveryRank) {
  const Case c = GetParam();
  constexpr int kWorld = 3;
  // Normal path: straitd keeps both residuals. Frame path: the "rank" keeps the sender residual
  // and quantizes the whole tensor itself; straitd keeps only the owner residual.
  std::vector<ErrorFeedbackStore> normal_stores(kWorld), frame_stores(kWorld);
  std::vector<std::vector<float>> rank_residual(kWorld, std::vector<float>(c.count, 0.0f));
  for (uint32_t step = 0; step < 3; ++step) {
    SCOPED_TRACE("step " + std::to_string(step));
    Buffers inputs;
    for (int r = 0; r < kWorld; ++r) inputs.push_back(Input(r, c.count, c.dtype, step));
    Buffers normal_out = inputs;
    Buffers normal_frames(kWorld), frame_frames(kWorld);
    auto statuses = RunRanks(kWorld, [&](Transport& t, int r) {
      AllReduceRequest req = Base(c.dtype, c.op, c.count, c.codec, 10 + step);
      req.algorithm = c.algorithm;
      req.data = normal_out[static_cast<size_t>(r)].data();
      req.feedback = &normal_stores[static_cast<size_t>(r)];
      req.result_frame = &normal_frames[static_cast<size_t>(r)];
      return AllReduce(t, req);
    });
    for (const auto& s : statuses) ASSERT_TRUE(s.ok()) << s;

    Buffers rank_frames(kWorld);
    for (int r = 0; r < kWorld; ++r) {
      Encoder enc;
      CodecOptions o;
      o.codec = c.codec;
      o.block_size = 64;
      ASSERT_TRUE(enc.EncodeWithFeedback(inputs[static_cast<size_t>(r)].data(), c.count, c.dtype, o,
                                         rank_residual[static_cast<size_t>(r)].data(),
                                         &rank_frames[static_cast<size_t>(r)])
                      .ok());
    }
    statuses = RunRanks(kWorld, [&](Transport& t, int r) {
      AllReduceRequest req = Base(c.dtype, c.op, c.count, c.codec, 10 + step);
      req.algorithm = c.algorithm;
      req.input_stage =
          std::span<const uint8_t>(rank_frames[static_cast<size_t>(r)]).subspan(kFrameHeaderSize);
      req.data = nullptr;
      req.feedback = &frame_stores[static_cast<size_t>(r)];
      req.result_frame = &frame_frames[static_cast<size_t>(r)];
      return AllReduce(t, req);
    });
    for (const auto& s : statuses) ASSERT_TRUE(s.ok()) << s;

    // The fp64 reference of this step (the inputs as the element type holds them).
    std::vector<double> ref(c.count, 0.0);
    for (int r = 0; r < kWorld; ++r) {
      std::vector<float> f(c.count);
      ASSERT_TRUE(
          ConvertToFloat(inputs[static_cast<size_t>(r)].data(), c.dtype, f.data(), c.count).ok());
      for (size_t i = 0; i < c.count; ++i) ref[i] += f[i];
    }
    if (c.op == ReduceOp::kAvg) {
      for (auto& x : ref) x /= kWorld;
    }
    auto mean_error = [&](const std::vector<uint8_t>& out) {
      std::vector<float> f(c.count);
      EXPECT_TRUE(ConvertToFloat(out.data(), c.dtype, f.data(), c.count).ok());
      double e = 0;
      for (size_t i = 0; i < c.count; ++i) e += std::abs(f[i] - ref[i]);
      return e / static_cast<double>(c.count);
    };
    for (int r = 0; r < kWorld; ++r) {
      const auto& f = frame_frames[static_cast<size_t>(r)];
      EXPECT_TRUE(f == frame_frames[0]) << "rank " << r << "'s result frame differs from rank 0's";
      EXPECT_TRUE(normal_frames[static_cast<size_t>(r)] == normal_frames[0]);
      if (c.algorithm == Algorithm::kMesh) {
        EXPECT_TRUE(f == normal_frames[static_cast<size_t>(r)])
            << "rank " << r << ": the frame path differs from the normal path";
      }
      auto info = InspectFrame(f);
      ASSERT_TRUE(info.ok()) << info.status();
      EXPECT_EQ(info->codec, c.codec);
      EXPECT_EQ(info->dtype, DataType::kFloat32);
      EXPECT_EQ(info->element_count, c.count);
      EXPECT_EQ(info->block_size, 64u);
      std::vector<uint8_t> decoded(c.count * DataTypeSize(c.dtype));
      Decoder dec;
      ASSERT_TRUE(dec.Decode(f, decoded.data(), c.count, c.dtype).ok());
      if (c.algorithm == Algorithm::kMesh) {
        EXPECT_TRUE(decoded == normal_out[static_cast<size_t>(r)])
            << "rank " << r << ": decoding the frame differs from the normal path's data";
      } else {
        // The ring adds each rank's own input from its frame rather than exactly: one more
        // quantization error, not a different result.
        const double normal_error = mean_error(normal_out[static_cast<size_t>(r)]);
        EXPECT_LE(mean_error(decoded), 2.0 * normal_error + 1e-6)
            << "rank " << r << ": the ring's frame path is far off the reference";
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Codecs, FrameModes,
    ::testing::Values(
        Case{CodecId::kInt8, DataType::kFloat32, ReduceOp::kSum, Algorithm::kMesh, 5003},
        Case{CodecId::kInt4, DataType::kBfloat16, ReduceOp::kAvg, Algorithm::kMesh, 4097},
        Case{CodecId::kFp8E4M3, DataType::kFloat16, ReduceOp::kSum, Algorithm::kMesh, 3 * 64 + 1},
        Case{CodecId::kInt8, DataType::kFloat32, ReduceOp::kAvg, Algorithm::kRing, 3001},
        Case{CodecId::kInt4, DataType::kFloat32, ReduceOp::kSum, Algorithm::kRing, 2049}));

TEST(FrameModes, BadRequestsFailBeforeTouchingTheTransport) {
  LocalWorld w(3);
  std::vector<uint8_t> stage(4 * 10 + 640);  // 640 elements of int8, block 64
  std::vector<uint8_t> out;
  auto run = [&](const std::function<void(AllReduceRequest&)>& edit) {
    AllReduceRequest req = Base(DataType::kFloat32, ReduceOp::kSum, 640, CodecId::kInt8, 1);
    req.error_feedback = false;
    req.input_stage = stage;
    req.result_frame = &out;
    req.deadline = Deadline::AfterSeconds(5);
    edit(req);
    return AllReduce(w.transport(0), req);
  };
  Status s = run([](AllReduceRequest& r) { r.codec.codec = CodecId::kZstd; });
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("lossy codec"), std::string::npos) << s;
  s = run([](AllReduceRequest& r) { r.count = 639; });
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("input_stage has 680 bytes"), std::string::npos) << s;
  s = run([](AllReduceRequest& r) { r.codec.chain_zstd = true; });
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("chain_zstd"), std::string::npos) << s;
  s = run([](AllReduceRequest& r) { r.op = ReduceOp::kMax; });
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s;
  s = run([](AllReduceRequest& r) {
    r.send_codecs = {CodecId::kInt8, CodecId::kFp8E4M3, CodecId::kInt8};
  });
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("send_codecs"), std::string::npos) << s;
  // 128 elements, 2 blocks, 3 owners: a block would straddle two owners.
  stage.assign(4 * 2 + 128, 0);
  s = run([](AllReduceRequest& r) { r.count = 128; });
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("fewer than 3 ranks"), std::string::npos) << s;
  // Nothing was sent: a later good operation on the same world still works.
  stage.assign(4 * 10 + 640, 0);
  auto statuses = RunRanks(1, [&](Transport& t, int) {
    AllReduceRequest req = Base(DataType::kFloat32, ReduceOp::kSum, 640, CodecId::kInt8, 2);
    req.error_feedback = false;
    req.input_stage = stage;
    req.result_frame = &out;
    return AllReduce(t, req);
  });
  ASSERT_TRUE(statuses[0].ok()) << statuses[0];
  EXPECT_TRUE(InspectFrame(out).ok());
}

}  // namespace
}  // namespace strait::collective

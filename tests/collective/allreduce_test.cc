// Tests of AllReduce with N ranks as threads over the in-process transport, parameterised over
// world size x element count: lossless sums equal to the fp32 rank-order sum, lossy codecs within
// a bound derived from their step, exact ops, bit-identity across ranks, the ring against the
// mesh, error feedback over many steps, unequal shards, failures that end by the deadline, and
// aborts: one rank's failure ends the others' waits at once with its reason and frees the op.
#include "collective/allreduce.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <functional>
#include <random>
#include <thread>

#include "collective/local_transport.h"
#include "strait/reduce.h"

namespace strait::collective {
namespace {

constexpr size_t kChunk = 3000;  // not a multiple of anything the counts are

using Buffers = std::vector<std::vector<uint8_t>>;

// Runs `body` on every rank of a fresh world, one thread each, and returns their statuses.
std::vector<Status> RunRanks(int world, const std::function<Status(Transport&, int)>& body,
                             LocalWorld* existing = nullptr) {
  std::unique_ptr<LocalWorld> own;
  LocalWorld* w = existing;
  if (w == nullptr) {
    own = std::make_unique<LocalWorld>(world);
    w = own.get();
  }
  std::vector<Status> statuses(static_cast<size_t>(world));
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] { statuses[static_cast<size_t>(r)] = body(w->transport(r), r); });
  }
  for (auto& t : threads) t.join();
  return statuses;
}

// Rank r's input as floats: uniform in [-1, 1] scaled per rank so that magnitudes differ.
std::vector<float> FloatInput(int rank, size_t count, uint32_t salt) {
  std::mt19937 gen(1234u + static_cast<uint32_t>(rank) * 7919u + salt);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> v(count);
  const float scale = 1.0f + static_cast<float>(rank);
  for (auto& x : v) x = dist(gen) * scale;
  return v;
}

// The floats as `dtype` bytes, and back as the floats those bytes hold exactly.
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

Buffers FloatInputs(int world, size_t count, DataType dtype, uint32_t salt = 0) {
  Buffers in;
  for (int r = 0; r < world; ++r) in.push_back(ToBytes(FloatInput(r, count, salt), dtype));
  return in;
}

// Runs one all-reduce on copies of `inputs`; returns the per-rank outputs.
Buffers RunAllReduce(const AllReduceRequest& base, const Buffers& inputs,
                     std::vector<Status>* statuses_out = nullptr,
                     std::vector<ErrorFeedbackStore>* stores = nullptr) {
  const int world = static_cast<int>(inputs.size());
  Buffers data = inputs;
  std::vector<Status> statuses = RunRanks(world, [&](Transport& t, int r) {
    AllReduceRequest req = base;
    req.data = data[static_cast<size_t>(r)].data();
    if (stores != nullptr) req.feedback = &(*stores)[static_cast<size_t>(r)];
    return AllReduce(t, req);
  });
  if (statuses_out != nullptr) {
    *statuses_out = statuses;
  } else {
    for (int r = 0; r < world; ++r) {
      EXPECT_TRUE(statuses[static_cast<size_t>(r)].ok())
          << "rank " << r << ": " << statuses[static_cast<size_t>(r)];
    }
  }
  return data;
}

void ExpectBitIdentical(const Buffers& out, const std::string& what) {
  for (size_t r = 1; r < out.size(); ++r) {
    EXPECT_TRUE(out[r] == out[0]) << what << ": rank " << r << " differs from rank 0";
  }
}

AllReduceRequest Request(DataType dtype, ReduceOp op, size_t count, CodecId codec) {
  AllReduceRequest req;
  req.job = "job";
  req.tensor_key = "grad";
  req.op_id = 1;
  req.dtype = dtype;
  req.op = op;
  req.count = count;
  req.codec.codec = codec;
  req.chunk_elements = kChunk;
  req.deadline = Deadline::AfterSeconds(30);
  return req;
}

class AllReduceSizes : public ::testing::TestWithParam<std::tuple<int, size_t>> {
 protected:
  int world() const { return std::get<0>(GetParam()); }
  size_t count() const { return std::get<1>(GetParam()); }
};

TEST_P(AllReduceSizes, LosslessSumIsTheRankOrderFp32SumOnEveryRank) {
  for (CodecId codec : {CodecId::kNone, CodecId::kZstd}) {
    for (DataType dtype : {DataType::kFloat32, DataType::kBfloat16, DataType::kFloat16}) {
      for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg}) {
        const std::string what =
            std::string(CodecName(codec)) + " " + DataTypeName(dtype) + " " + ReduceOpName(op);
        const Buffers in = FloatInputs(world(), count(), dtype);
        const Buffers out = RunAllReduce(Request(dtype, op, count(), codec), in);
        ExpectBitIdentical(out, what);
        // The expected bytes: fp32 accumulation in rank order, one rounding to dtype.
        std::vector<float> acc(count(), 0.0f);
        std::vector<double> exact(count(), 0.0);
        for (const auto& b : in) {
          const std::vector<float> f = ToFloats(b, dtype);
          for (size_t i = 0; i < count(); ++i) {
            acc[i] += f[i];
            exact[i] += f[i];
          }
        }
        if (op == ReduceOp::kAvg) {
          for (auto& a : acc) a = a / static_cast<float>(world());
          for (auto& e : exact) e /= world();
        }
        EXPECT_TRUE(out[0] == ToBytes(acc, dtype)) << what;
        // And against fp64: within fp32 accumulation plus the final rounding.
        const std::vector<float> got = ToFloats(out[0], dtype);
        const double rel = dtype == DataType::kFloat32    ? 1e-6
                           : dtype == DataType::kBfloat16 ? 1.0 / 256
                                                          : 1.0 / 2048;
        for (size_t i = 0; i < count(); ++i) {
          ASSERT_NEAR(got[i], exact[i], rel * std::fabs(exact[i]) + 1e-5 * world())
              << what << " element " << i;
        }
      }
    }
  }
}

// Half a step of the codec, relative to a block's absmax, with round-to-nearest.
double HalfStep(CodecId codec) {
  switch (codec) {
    case CodecId::kInt8: return 0.5 / 127;
    case CodecId::kInt4: return 0.5 / 7;
    case CodecId::kFp8E4M3: return 1.0 / 16;  // e4m3 keeps 3 mantissa bits: 2^-4 relative
    default: return 0;
  }
}

TEST_P(AllReduceSizes, LossyCodecsStayWithinTheirStepAndAgreeBitwise) {
  for (CodecId codec : {CodecId::kInt8, CodecId::kInt4, CodecId::kFp8E4M3}) {
    for (DataType dtype : {DataType::kFloat32, DataType::kBfloat16, DataType::kFloat16}) {
      const std::string what = std::string(CodecName(codec)) + " " + DataTypeName(dtype);
      AllReduceRequest req = Request(dtype, ReduceOp::kSum, count(), codec);
      req.codec.chain_zstd = codec == CodecId::kInt4;
      const Buffers in = FloatInputs(world(), count(), dtype);
      const Buffers out = RunAllReduce(req, in);
      ExpectBitIdentical(out, what);
      // Every input is quantized once (error <= e * its absmax) and the owner's sum once more
      // (error <= e * the sum's absmax <= e * (1 + e) * the sum of absmaxes); then the result is
      // rounded to dtype. Tensor-wide absmaxes bound the blocks' ones.
      double absmax_sum = 0;
      std::vector<double> exact(count(), 0.0);
      for (const auto& b : in) {
        const std::vector<float> f = ToFloats(b, dtype);
        double absmax = 0;
        for (size_t i = 0; i < count(); ++i) {
          exact[i] += f[i];
          absmax = std::max(absmax, std::fabs(static_cast<double>(f[i])));
        }
        absmax_sum += absmax;
      }
      const double e = HalfStep(codec);
      const double quant = e * absmax_sum + e * (1 + e) * (1 + e) * absmax_sum;
      const double rel = dtype == DataType::kFloat32    ? 0
                         : dtype == DataType::kBfloat16 ? 1.0 / 256
                                                        : 1.0 / 2048;
      const std::vector<float> got = ToFloats(out[0], dtype);
      for (size_t i = 0; i < count(); ++i) {
        const double bound = quant + rel * (std::fabs(exact[i]) + quant) + 1e-5 * absmax_sum;
        ASSERT_NEAR(got[i], exact[i], bound) << what << " element " << i;
      }
    }
  }
}

TEST_P(AllReduceSizes, ExactOpsMatchTheReferenceExactly) {
  struct Case {
    DataType dtype;
    ReduceOp op;
  };
  const std::vector<Case> cases = {
      {DataType::kInt32, ReduceOp::kSum},    {DataType::kInt32, ReduceOp::kMax},
      {DataType::kInt64, ReduceOp::kMin},    {DataType::kUint8, ReduceOp::kMax},
      {DataType::kFloat32, ReduceOp::kMax},  {DataType::kFloat32, ReduceOp::kMin},
      {DataType::kBfloat16, ReduceOp::kMax}, {DataType::kFloat16, ReduceOp::kMin},
      {DataType::kFloat64, ReduceOp::kSum},  {DataType::kInt32, ReduceOp::kAvg},
      {DataType::kFloat32, ReduceOp::kProd},
  };
  for (CodecId codec : {CodecId::kNone, CodecId::kZstd}) {
    for (const Case& c : cases) {
      const std::string what =
          std::string(CodecName(codec)) + " " + DataTypeName(c.dtype) + " " + ReduceOpName(c.op);
      const size_t elem = DataTypeSize(c.dtype);
      Buffers in;
      for (int r = 0; r < world(); ++r) {
        if (IsLossyCodableType(c.dtype)) {
          in.push_back(ToBytes(FloatInput(r, count(), 5), c.dtype));
        } else {
          std::mt19937 gen(99u + static_cast<uint32_t>(r));
          std::vector<uint8_t> b(count() * elem);
          for (size_t i = 0; i < count(); ++i) {
            const int64_t v = static_cast<int64_t>(gen() % 2001) - 1000;
            switch (c.dtype) {
              case DataType::kInt32: {
                const int32_t x = static_cast<int32_t>(v);
                std::memcpy(&b[i * elem], &x, elem);
                break;
              }
              case DataType::kInt64: std::memcpy(&b[i * elem], &v, elem); break;
              case DataType::kUint8: b[i] = static_cast<uint8_t>(v); break;
              case DataType::kFloat64: {
                const double x = static_cast<double>(v) / 8;
                std::memcpy(&b[i * elem], &x, elem);
                break;
              }
              default: FAIL() << "unhandled type";
            }
          }
          in.push_back(std::move(b));
        }
      }
      const Buffers out = RunAllReduce(Request(c.dtype, c.op, count(), codec), in);
      ExpectBitIdentical(out, what);
      // The reference: ReduceInPlace in rank order (the reduction primitive is tested alone).
      std::vector<uint8_t> ref = in[0];
      const ReduceOp op = c.op == ReduceOp::kAvg ? ReduceOp::kSum : c.op;
      for (int r = 1; r < world(); ++r) {
        ASSERT_TRUE(
            ReduceInPlace(c.dtype, op, in[static_cast<size_t>(r)].data(), ref.data(), count())
                .ok());
      }
      if (c.op == ReduceOp::kAvg) {
        ASSERT_TRUE(
            DivideInPlace(c.dtype, ref.data(), count(), static_cast<uint64_t>(world())).ok());
      }
      EXPECT_TRUE(out[0] == ref) << what;
    }
  }
}

TEST_P(AllReduceSizes, RingAndMeshAgreeForLosslessAndRingIsBitIdenticalWhenLossy) {
  // Integer-valued floats sum exactly in fp32 in any order, so the ring's different summation
  // order must not show.
  Buffers ints;
  for (int r = 0; r < world(); ++r) {
    std::vector<float> f = FloatInput(r, count(), 11);
    for (auto& x : f) x = std::round(x * 100);
    ints.push_back(ToBytes(f, DataType::kFloat32));
  }
  for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMax, ReduceOp::kMin}) {
    for (CodecId codec : {CodecId::kNone, CodecId::kZstd}) {
      AllReduceRequest req = Request(DataType::kFloat32, op, count(), codec);
      req.algorithm = Algorithm::kMesh;
      const Buffers mesh = RunAllReduce(req, ints);
      req.algorithm = Algorithm::kRing;
      const Buffers ring = RunAllReduce(req, ints);
      ExpectBitIdentical(ring, "ring");
      EXPECT_TRUE(ring[0] == mesh[0]) << ReduceOpName(op) << " " << CodecName(codec);
    }
  }
  // A ring chosen by the plan for a mesh missing one link, with a lossy codec: bit-identical,
  // and within the ring's bound (each of n-1 hops re-quantizes a partial sum).
  AllReduceRequest req = Request(DataType::kFloat32, ReduceOp::kSum, count(), CodecId::kInt8);
  req.links.assign(static_cast<size_t>(world() * world()), 1);
  if (world() > 2) req.links[2] = 0;  // 0 -> 2
  const Buffers in = FloatInputs(world(), count(), DataType::kFloat32, 3);
  const Buffers out = RunAllReduce(req, in);
  ExpectBitIdentical(out, "lossy ring");
  double absmax_sum = 0;
  std::vector<double> exact(count(), 0.0);
  for (const auto& b : in) {
    const std::vector<float> f = ToFloats(b, DataType::kFloat32);
    double absmax = 0;
    for (size_t i = 0; i < count(); ++i) {
      exact[i] += f[i];
      absmax = std::max(absmax, std::fabs(static_cast<double>(f[i])));
    }
    absmax_sum += absmax;
  }
  const double bound = 1.1 * HalfStep(CodecId::kInt8) * absmax_sum * (world() + 1);
  const std::vector<float> got = ToFloats(out[0], DataType::kFloat32);
  for (size_t i = 0; i < count(); ++i) ASSERT_NEAR(got[i], exact[i], bound) << i;
}

TEST_P(AllReduceSizes, UnequalShardWeightsGiveTheSameResult) {
  AllReduceRequest req = Request(DataType::kFloat32, ReduceOp::kSum, count(), CodecId::kNone);
  const Buffers in = FloatInputs(world(), count(), DataType::kFloat32, 17);
  const Buffers equal = RunAllReduce(req, in);
  for (int r = 0; r < world(); ++r) req.shard_weights.push_back(static_cast<uint64_t>(1 + 5 * r));
  const Buffers weighted = RunAllReduce(req, in);
  ExpectBitIdentical(weighted, "weighted");
  // Lossless sums are taken in rank order whoever owns the element.
  EXPECT_TRUE(weighted[0] == equal[0]);
}

INSTANTIATE_TEST_SUITE_P(WorldByCount, AllReduceSizes,
                         ::testing::Combine(::testing::Values(2, 3, 4),
                                            ::testing::Values(size_t{1}, size_t{7}, size_t{255},
                                                              size_t{1000}, size_t{100003})),
                         [](const auto& param_info) {
                           return "world" + std::to_string(std::get<0>(param_info.param)) +
                                  "_count" + std::to_string(std::get<1>(param_info.param));
                         });

TEST(AllReduce, ErrorFeedbackKeepsTheRunningSumWithinOneStepsError) {
  constexpr int kWorld = 3;
  constexpr size_t kCount = 1000;
  constexpr int kSteps = 50;
  for (CodecId codec : {CodecId::kInt8, CodecId::kInt4}) {
    // Constant inputs: without feedback the same rounding error repeats every step.
    const Buffers in = FloatInputs(kWorld, kCount, DataType::kFloat32, 23);
    double absmax_sum = 0;
    std::vector<double> exact(kCount, 0.0);
    for (const auto& b : in) {
      const std::vector<float> f = ToFloats(b, DataType::kFloat32);
      double absmax = 0;
      for (size_t i = 0; i < kCount; ++i) {
        exact[i] += f[i];
        absmax = std::max(absmax, std::fabs(static_cast<double>(f[i])));
      }
      absmax_sum += absmax;
    }
    const double e = HalfStep(codec);
    // One step's error: each sender's quantization plus the owner's (whose input includes the
    // carried residuals, hence the margin).
    const double one_step = 1.25 * (e * absmax_sum + e * (1 + 2 * e) * absmax_sum);
    for (bool feedback : {true, false}) {
      std::vector<ErrorFeedbackStore> stores(kWorld);
      std::vector<double> running(kCount, 0.0);
      double worst = 0;
      for (int step = 0; step < kSteps; ++step) {
        AllReduceRequest req = Request(DataType::kFloat32, ReduceOp::kSum, kCount, codec);
        req.op_id = static_cast<uint64_t>(step);
        req.error_feedback = feedback;
        const Buffers out = RunAllReduce(req, in, nullptr, &stores);
        ExpectBitIdentical(out, "feedback step");
        const std::vector<float> got = ToFloats(out[0], DataType::kFloat32);
        for (size_t i = 0; i < kCount; ++i) {
          running[i] += got[i];
          worst = std::max(worst, std::fabs(running[i] - exact[i] * (step + 1)));
        }
      }
      if (feedback) {
        EXPECT_LE(worst, one_step) << CodecName(codec);
        EXPECT_EQ(stores[0].KeyCount(), 2u);  // ":send" and ":own"
      } else {
        // The check above can fail: without feedback the error piles up far beyond one step.
        EXPECT_GT(worst, 3 * one_step) << CodecName(codec);
        EXPECT_EQ(stores[0].KeyCount(), 0u);
      }
    }
  }
}

TEST(AllReduce, SilentRankMakesEveryoneFailByTheDeadline) {
  constexpr int kWorld = 4;
  constexpr size_t kCount = 5000;
  const Buffers in = FloatInputs(kWorld, kCount, DataType::kFloat32);
  Buffers data = in;
  const Deadline deadline = Deadline::After(300'000'000);
  Stopwatch watch;
  std::vector<Status> statuses = RunRanks(kWorld, [&](Transport& t, int r) {
    if (r == 3) return Status::Ok();  // never takes part
    AllReduceRequest req = Request(DataType::kFloat32, ReduceOp::kSum, kCount, CodecId::kInt8);
    req.data = data[static_cast<size_t>(r)].data();
    req.deadline = deadline;
    return AllReduce(t, req);
  });
  EXPECT_LT(watch.ElapsedSeconds(), 3.0);
  bool named = false;
  for (int r = 0; r < 3; ++r) {
    // The first rank to reach its deadline aborts; the others may get that abort first.
    const Status& s = statuses[static_cast<size_t>(r)];
    EXPECT_TRUE(s.code() == StatusCode::kDeadlineExceeded || s.code() == StatusCode::kAborted)
        << "rank " << r << ": " << s;
    EXPECT_NE(s.message().find("all-reduce job/grad"), std::string::npos) << s;
    named = named || s.message().find("waiting for rank 3") != std::string::npos;
  }
  EXPECT_TRUE(named) << "no error names the silent rank";
}

TEST(AllReduce, FailedRankEndsTheWaitsAtOnce) {
  constexpr int kWorld = 3;
  LocalWorld world(kWorld);
  world.FailRank(2, UnavailableError("link to rank 2 failed: peer unreachable"));
  const Buffers in = FloatInputs(kWorld, 1000, DataType::kFloat32);
  Buffers data = in;
  Stopwatch watch;
  std::vector<Status> statuses = RunRanks(
      2,
      [&](Transport& t, int r) {
        AllReduceRequest req = Request(DataType::kFloat32, ReduceOp::kSum, 1000, CodecId::kNone);
        req.data = data[static_cast<size_t>(r)].data();
        return AllReduce(t, req);  // 30 s deadline: must not be waited out
      },
      &world);
  EXPECT_LT(watch.ElapsedSeconds(), 10.0);
  for (const Status& s : statuses) {
    // Either rank 2's failure itself, or the abort of the rank that saw it first (which quotes it).
    EXPECT_TRUE(s.code() == StatusCode::kUnavailable || s.code() == StatusCode::kAborted) << s;
    EXPECT_NE(s.message().find("link to rank 2 failed"), std::string::npos) << s;
  }
}

// Corrupts one byte of every frame rank 1 sends to rank 0 in the reduce-scatter.
class CorruptingTransport final : public Transport {
 public:
  explicit CorruptingTransport(Transport& inner) : inner_(inner) {}
  int rank() const override { return inner_.rank(); }
  int size() const override { return inner_.size(); }
  void Send(int peer, uint64_t tag, std::vector<uint8_t> bytes, Deadline deadline,
            SendDone done) override {
    if (peer == 0 && ((tag >> kTagChunkBits) & 3) == 0 && bytes.size() > 60) bytes[60] ^= 0x40;
    inner_.Send(peer, tag, std::move(bytes), deadline, std::move(done));
  }
  Status Recv(int peer, uint64_t tag, Deadline deadline, std::vector<uint8_t>* out) override {
    return inner_.Recv(peer, tag, deadline, out);
  }
  void Abort(uint64_t op_id, const Status& why, const std::string& note) override {
    inner_.Abort(op_id, why, note);
  }

 private:
  Transport& inner_;
};

TEST(AllReduce, CorruptFrameIsDataLossAtTheOwnerAndNobodyHangs) {
  constexpr int kWorld = 3;
  const Buffers in = FloatInputs(kWorld, 2000, DataType::kFloat32);
  Buffers data = in;
  std::vector<Status> statuses = RunRanks(kWorld, [&](Transport& t, int r) {
    CorruptingTransport corrupting(t);
    AllReduceRequest req = Request(DataType::kFloat32, ReduceOp::kSum, 2000, CodecId::kZstd);
    req.data = data[static_cast<size_t>(r)].data();
    req.deadline = Deadline::After(300'000'000);
    return r == 1 ? AllReduce(corrupting, req) : AllReduce(t, req);
  });
  EXPECT_EQ(statuses[0].code(), StatusCode::kDataLoss) << statuses[0];
  EXPECT_NE(statuses[0].message().find("corrupted frame"), std::string::npos) << statuses[0];
  // Rank 0's abort reaches the others with its reason.
  for (int r = 1; r < kWorld; ++r) {
    const Status& s = statuses[static_cast<size_t>(r)];
    EXPECT_EQ(s.code(), StatusCode::kAborted) << s;
    EXPECT_NE(s.message().find("rank 0 aborted"), std::string::npos) << s;
    EXPECT_NE(s.message().find("corrupted frame"), std::string::npos) << s;
  }
}

// Wraps a rank's transport: counts its aborts, and optionally swallows every send to one peer
// (reported as delivered), so that the operation cannot finish.
class FaultyTransport final : public Transport {
 public:
  FaultyTransport(Transport& inner, int swallow_to) : inner_(inner), swallow_to_(swallow_to) {}
  int rank() const override { return inner_.rank(); }
  int size() const override { return inner_.size(); }
  void Send(int peer, uint64_t tag, std::vector<uint8_t> bytes, Deadline deadline,
            SendDone done) override {
    if (peer == swallow_to_) {
      done(Status::Ok());
      return;
    }
    inner_.Send(peer, tag, std::move(bytes), deadline, std::move(done));
  }
  Status Recv(int peer, uint64_t tag, Deadline deadline, std::vector<uint8_t>* out) override {
    return inner_.Recv(peer, tag, deadline, out);
  }
  void Abort(uint64_t op_id, const Status& why, const std::string& note) override {
    ++aborts;
    inner_.Abort(op_id, why, note);
  }
  std::atomic<int> aborts{0};

 private:
  Transport& inner_;
  const int swallow_to_;
};

TEST(AllReduce, OneRankAbortsAndTheOthersFailFastWithItsReasonAndFreeTheOp) {
  constexpr int kWorld = 3;
  constexpr size_t kCount = 4000;
  LocalWorld world(kWorld);
  const Buffers in = FloatInputs(kWorld, kCount, DataType::kFloat32);
  Buffers data = in;
  std::vector<std::unique_ptr<FaultyTransport>> faulty;
  for (int r = 0; r < kWorld; ++r) {
    // Rank 2's frames never reach rank 0, so rank 2 waits in vain for shard 0's result.
    faulty.push_back(std::make_unique<FaultyTransport>(world.transport(r), r == 2 ? 0 : -1));
  }
  Stopwatch watch;
  std::vector<Status> statuses(kWorld);
  std::vector<double> ended(kWorld);
  std::vector<std::thread> threads;
  for (int r = 0; r < kWorld; ++r) {
    threads.emplace_back([&, r] {
      AllReduceRequest req = Request(DataType::kFloat32, ReduceOp::kSum, kCount, CodecId::kZstd);
      req.op_id = 77;
      req.data = data[static_cast<size_t>(r)].data();
      // Rank 2 gives up early; the others would wait half a minute without its abort.
      req.deadline = r == 2 ? Deadline::After(300'000'000) : Deadline::AfterSeconds(30);
      statuses[static_cast<size_t>(r)] = AllReduce(*faulty[static_cast<size_t>(r)], req);
      ended[static_cast<size_t>(r)] = watch.ElapsedSeconds();
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(statuses[2].code(), StatusCode::kDeadlineExceeded) << statuses[2];
  EXPECT_EQ(faulty[2]->aborts.load(), 1);
  for (int r = 0; r < 2; ++r) {
    const Status& s = statuses[static_cast<size_t>(r)];
    EXPECT_EQ(s.code(), StatusCode::kAborted) << "rank " << r << ": " << s;
    EXPECT_NE(s.message().find("rank 2 aborted the operation"), std::string::npos) << s;
    EXPECT_NE(s.message().find("before the deadline"), std::string::npos) << s;  // the reason
    EXPECT_LT(ended[static_cast<size_t>(r)], 10.0) << "rank " << r << " waited for its deadline";
    // A rank that failed because of an abort does not abort again.
    EXPECT_EQ(faulty[static_cast<size_t>(r)]->aborts.load(), 0) << "rank " << r;
  }
  // Nothing of the operation stays buffered anywhere, and its id is remembered.
  for (int r = 0; r < kWorld; ++r) {
    EXPECT_EQ(world.BufferedMessages(r), 0u) << "rank " << r;
    EXPECT_EQ(world.mailbox(r).ForgottenOps(), 1u) << "rank " << r;
  }
  // The next operation (another op id) runs normally on the same transports.
  data = in;
  std::vector<Status> next = RunRanks(
      kWorld,
      [&](Transport& t, int r) {
        AllReduceRequest req = Request(DataType::kFloat32, ReduceOp::kSum, kCount, CodecId::kNone);
        req.op_id = 78;
        req.data = data[static_cast<size_t>(r)].data();
        return AllReduce(t, req);
      },
      &world);
  for (const Status& s : next) EXPECT_TRUE(s.ok()) << s;
  EXPECT_EQ(std::memcmp(data[0].data(), data[2].data(), data[0].size()), 0);
}

TEST(AllReduce, RejectsBadRequestsWithoutTouchingTheTransport) {
  LocalWorld world(1);
  std::vector<int32_t> ints(10, 1);
  AllReduceRequest req = Request(DataType::kInt32, ReduceOp::kSum, 10, CodecId::kInt8);
  req.data = ints.data();
  Status s = AllReduce(world.transport(0), req);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("lossy"), std::string::npos) << s;
  std::vector<float> floats(10, 1.0f);
  req = Request(DataType::kFloat32, ReduceOp::kMax, 10, CodecId::kFp8E4M3);
  req.data = floats.data();
  EXPECT_EQ(AllReduce(world.transport(0), req).code(), StatusCode::kInvalidArgument);
  req = Request(DataType::kFloat32, ReduceOp::kSum, 10, CodecId::kInt8);
  req.data = floats.data();
  req.error_feedback = true;
  s = AllReduce(world.transport(0), req);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("ErrorFeedbackStore"), std::string::npos) << s;
  req = Request(DataType::kFloat32, ReduceOp::kSum, 10, CodecId::kNone);
  req.data = nullptr;
  EXPECT_EQ(AllReduce(world.transport(0), req).code(), StatusCode::kInvalidArgument);
  req.data = floats.data();
  req.shard_weights = {1, 2};
  EXPECT_EQ(AllReduce(world.transport(0), req).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(world.BufferedMessages(0), 0u);
}

TEST(AllReduce, OneRankStillRoundTripsThroughTheCodecAndStatsCountBytes) {
  LocalWorld world(1);
  std::vector<float> data = FloatInput(0, 999, 1);
  const std::vector<float> before = data;
  AllReduceRequest req = Request(DataType::kFloat32, ReduceOp::kSum, 999, CodecId::kNone);
  req.data = data.data();
  AllReduceStats stats;
  ASSERT_TRUE(AllReduce(world.transport(0), req, &stats).ok());
  EXPECT_EQ(data, before);
  EXPECT_EQ(stats.bytes_sent, 0u);  // only to itself

  // Two ranks, int8: each sends its half of the other's shard and gets the result back.
  const Buffers in = FloatInputs(2, 4096, DataType::kFloat32);
  Buffers out = in;
  std::vector<AllReduceStats> s2(2);
  auto statuses = RunRanks(2, [&](Transport& t, int r) {
    AllReduceRequest q = Request(DataType::kFloat32, ReduceOp::kSum, 4096, CodecId::kInt8);
    q.data = out[static_cast<size_t>(r)].data();
    return AllReduce(t, q, &s2[static_cast<size_t>(r)]);
  });
  ASSERT_TRUE(statuses[0].ok() && statuses[1].ok());
  EXPECT_EQ(s2[0].algorithm, Algorithm::kMesh);
  // 2048 int8 codes + 8 scales + a header per frame, at least one frame each way and phase.
  EXPECT_GE(s2[0].bytes_sent, 2 * (2048u + 48u));
  EXPECT_LT(s2[0].bytes_sent, 2 * 4096u);  // a quarter of fp32's bytes, plus headers
  EXPECT_EQ(s2[0].bytes_sent, s2[1].bytes_received);
  // The time split: both ranks encoded inputs and a result, reduced and decoded, and waited
  // for at least the other rank's frames.
  for (const AllReduceStats& s : s2) {
    EXPECT_GT(s.encode_ns, 0);
    EXPECT_GT(s.reduce_ns, 0);
    EXPECT_GT(s.decode_ns, 0);
    EXPECT_GT(s.wait_ns, 0);
    EXPECT_GE(s.ack_wait_ns, 0);
  }
}

// Delays every frame one rank sends (a slow link out of that rank), for the per-peer timings.
class DelayingTransport final : public Transport {
 public:
  DelayingTransport(Transport& inner, int64_t delay_ns) : inner_(inner), delay_ns_(delay_ns) {}
  int rank() const override { return inner_.rank(); }
  int size() const override { return inner_.size(); }
  void Send(int peer, uint64_t tag, std::vector<uint8_t> bytes, Deadline deadline,
            SendDone done) override {
    if (peer != rank()) std::this_thread::sleep_for(std::chrono::nanoseconds(delay_ns_));
    inner_.Send(peer, tag, std::move(bytes), deadline, std::move(done));
  }
  Status Recv(int peer, uint64_t tag, Deadline deadline, std::vector<uint8_t>* out) override {
    return inner_.Recv(peer, tag, deadline, out);
  }
  Status RecvStamped(int peer, uint64_t tag, Deadline deadline, std::vector<uint8_t>* out,
                     int64_t* arrived_ns) override {
    return inner_.RecvStamped(peer, tag, deadline, out, arrived_ns);
  }

 private:
  Transport& inner_;
  const int64_t delay_ns_;
};

// Straggler detection's input (gateway/straggler.h): whichever rank is slow, rank 0's
// peer_late_ns names it, whatever the order rank 0 takes frames in (it takes rank 1's before
// rank 2's); the on-time peer's lateness stays well below. The result stays exact.
TEST(AllReduce, PeerLatenessNamesTheSlowRankWhateverTheReceiveOrder) {
  constexpr int kWorld = 3;
  constexpr size_t kCount = 3000;
  constexpr int64_t kDelay = 30'000'000;
  for (int slow : {1, 2}) {
    SCOPED_TRACE("slow rank " + std::to_string(slow));
    const Buffers in = FloatInputs(kWorld, kCount, DataType::kFloat32);
    Buffers data = in;
    std::vector<AllReduceStats> stats(kWorld);
    std::vector<Status> statuses = RunRanks(kWorld, [&](Transport& t, int r) {
      DelayingTransport delaying(t, r == slow ? kDelay : 0);
      AllReduceRequest req = Request(DataType::kFloat32, ReduceOp::kSum, kCount, CodecId::kNone);
      req.data = data[static_cast<size_t>(r)].data();
      return AllReduce(delaying, req, &stats[static_cast<size_t>(r)]);
    });
    for (const Status& s : statuses) ASSERT_TRUE(s.ok()) << s;
    ExpectBitIdentical(data, "lateness");
    std::vector<float> expected(kCount, 0.0f);
    for (int r = 0; r < kWorld; ++r) {
      const std::vector<float> f = ToFloats(in[static_cast<size_t>(r)], DataType::kFloat32);
      for (size_t e = 0; e < kCount; ++e) expected[e] += f[e];
    }
    EXPECT_TRUE(ToFloats(data[0], DataType::kFloat32) == expected) << "not the exact sum";
    const AllReduceStats& s0 = stats[0];
    ASSERT_EQ(s0.peer_late_ns.size(), 3u);
    ASSERT_EQ(s0.peer_wait_ns.size(), 3u);
    const int other = 3 - slow;
    EXPECT_GE(s0.peer_late_ns[static_cast<size_t>(slow)], kDelay / 2);
    EXPECT_LT(s0.peer_late_ns[static_cast<size_t>(other)] * 3,
              s0.peer_late_ns[static_cast<size_t>(slow)]);
    EXPECT_EQ(s0.peer_late_ns[0], 0);
  }
}

}  // namespace
}  // namespace strait::collective

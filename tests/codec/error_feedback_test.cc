// Error feedback: over many steps the decoded sum tracks the input sum to within one step's
// quantization error (and drifts without feedback), and ErrorFeedbackStore keeps residuals per
// (job, tensor) apart.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "codec/kernels.h"
#include "codec_test_util.h"
#include "strait/codec.h"

namespace strait {
namespace {

// The largest error quantizing value c may make in a block of `scale` (see codec_test.cc).
double StepBound(CodecId codec, float scale, double c) {
  const double s = std::fabs(static_cast<double>(scale));
  const double slack = 1e-5 * std::fabs(c) + 1e-12;
  if (codec == CodecId::kFp8E4M3) {
    const double v = std::fabs(c) / (s > 0 ? s : 1);
    return s * std::max(v * 0x1p-4, 0x1p-10) + slack;
  }
  return 0.5 * s + slack;
}

struct DriftResult {
  double worst_ratio = 0;  // max over elements of |sum in - sum decoded| / last step's bound
  double max_drift = 0;    // max over elements of |sum in - sum decoded|
};

// Runs `steps` steps of a fixed-ish gradient through `codec`, with or without error feedback,
// and checks the residual bound at every step when feedback is on.
DriftResult RunSteps(CodecId codec, DataType dtype, bool feedback, int steps) {
  constexpr size_t kCount = 1000;  // four blocks, the last one short
  const std::vector<float> base = testing_util::GradientLike(kCount, 77);
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> jitter(-0.1f, 0.1f);
  CodecOptions o;
  o.codec = codec;
  Encoder encoder;
  Decoder decoder;
  ErrorFeedbackStore store;
  std::span<float> residual = store.Residual("job", "grad", kCount);
  std::vector<double> sum_in(kCount, 0.0);
  std::vector<double> sum_out(kCount, 0.0);
  std::vector<float> compensated(kCount);
  std::vector<float> decoded(kCount);
  std::vector<uint8_t> frame;
  std::vector<float> step_bound(kCount);
  for (int t = 0; t < steps; ++t) {
    std::vector<float> g(kCount);
    for (size_t i = 0; i < kCount; ++i) g[i] = base[i] * (1.0f + jitter(rng));
    // The input as the codec sees it (rounded to dtype), and its fp32 value.
    std::vector<uint8_t> bytes(kCount * DataTypeSize(dtype));
    for (size_t i = 0; i < kCount; ++i) {
      if (dtype == DataType::kFloat32) {
        std::memcpy(&bytes[4 * i], &g[i], 4);
      } else {
        const uint16_t h = numeric::FloatToBf16(g[i]);
        std::memcpy(&bytes[2 * i], &h, 2);
      }
      const float x = testing_util::ElementAsFloat(bytes.data(), dtype, i);
      compensated[i] = x + (feedback ? residual[i] : 0.0f);
      sum_in[i] += x;
    }
    Status s = feedback ? encoder.EncodeWithFeedback(bytes.data(), kCount, dtype, o,
                                                     residual.data(), &frame)
                        : encoder.Encode(bytes.data(), kCount, dtype, o, &frame);
    EXPECT_TRUE(s.ok()) << s;
    EXPECT_TRUE(decoder.Decode(frame, decoded.data(), kCount, DataType::kFloat32).ok());
    const std::vector<float> scales = testing_util::FrameScales(frame, kCount, o.block_size);
    for (size_t i = 0; i < kCount; ++i) {
      sum_out[i] += decoded[i];
      step_bound[i] =
          static_cast<float>(StepBound(codec, scales[i / o.block_size], compensated[i]));
      if (feedback) {
        // residual = compensated - decoded, exactly as the receiver decodes it.
        EXPECT_EQ(residual[i], compensated[i] - decoded[i]) << "step " << t << " i " << i;
        EXPECT_LE(std::fabs(residual[i]), step_bound[i]) << "step " << t << " i " << i;
      }
    }
  }
  DriftResult r;
  for (size_t i = 0; i < kCount; ++i) {
    const double drift = std::fabs(sum_in[i] - sum_out[i]);
    r.max_drift = std::max(r.max_drift, drift);
    r.worst_ratio = std::max(r.worst_ratio, drift / (step_bound[i] + 1e-9));
  }
  return r;
}

TEST(ErrorFeedback, SumOfDecodedTracksSumOfInputsWithinOneStep) {
  for (CodecId codec : {CodecId::kInt8, CodecId::kInt4, CodecId::kFp8E4M3}) {
    for (DataType dtype : {DataType::kFloat32, DataType::kBfloat16}) {
      SCOPED_TRACE(std::string(CodecName(codec)) + " " + DataTypeName(dtype));
      const DriftResult with = RunSteps(codec, dtype, true, 100);
      // What 100 steps of fp32 additions may add on top of one step's error.
      EXPECT_LE(with.worst_ratio, 1.01) << "max drift " << with.max_drift;
      // The control: without feedback the same inputs drift by many steps, so the bound above
      // is not vacuous.
      const DriftResult without = RunSteps(codec, dtype, false, 100);
      EXPECT_GT(without.worst_ratio, 3.0);
      EXPECT_GT(without.max_drift, 3 * with.max_drift);
    }
  }
}

TEST(ErrorFeedback, LosslessCodecsLeaveTheResidualAlone) {
  const std::vector<float> x = testing_util::GradientLike(100, 1);
  std::vector<float> residual(100, 0.0f);
  for (CodecId codec : {CodecId::kNone, CodecId::kZstd}) {
    CodecOptions o;
    o.codec = codec;
    Encoder encoder;
    std::vector<uint8_t> a;
    std::vector<uint8_t> b;
    ASSERT_TRUE(
        encoder.EncodeWithFeedback(x.data(), 100, DataType::kFloat32, o, residual.data(), &a).ok());
    ASSERT_TRUE(encoder.Encode(x.data(), 100, DataType::kFloat32, o, &b).ok());
    EXPECT_EQ(a, b);
    EXPECT_TRUE(std::all_of(residual.begin(), residual.end(), [](float r) { return r == 0; }));
  }
}

TEST(ErrorFeedbackStore, ResidualStartsZeroAndPersists) {
  ErrorFeedbackStore store;
  std::span<float> r = store.Residual("job1", "layer.0", 10);
  ASSERT_EQ(r.size(), 10u);
  EXPECT_TRUE(std::all_of(r.begin(), r.end(), [](float v) { return v == 0; }));
  r[3] = 1.5f;
  std::span<float> again = store.Residual("job1", "layer.0", 10);
  EXPECT_EQ(again.data(), r.data());
  EXPECT_EQ(again[3], 1.5f);
  EXPECT_EQ(store.KeyCount(), 1u);
  EXPECT_EQ(store.BytesHeld(), 40u);
}

TEST(ErrorFeedbackStore, KeysAreIsolated) {
  ErrorFeedbackStore store;
  store.Residual("a", "t", 4)[0] = 1.0f;
  store.Residual("b", "t", 4)[0] = 2.0f;
  store.Residual("a", "u", 4)[0] = 3.0f;
  // Keys that would collide if job and tensor were simply concatenated.
  store.Residual("ab", "", 4)[0] = 4.0f;
  store.Residual("", "ab", 4)[0] = 5.0f;
  EXPECT_EQ(store.Residual("a", "t", 4)[0], 1.0f);
  EXPECT_EQ(store.Residual("b", "t", 4)[0], 2.0f);
  EXPECT_EQ(store.Residual("a", "u", 4)[0], 3.0f);
  EXPECT_EQ(store.Residual("ab", "", 4)[0], 4.0f);
  EXPECT_EQ(store.Residual("", "ab", 4)[0], 5.0f);
  EXPECT_EQ(store.KeyCount(), 5u);
  EXPECT_EQ(store.BytesHeld(), 5 * 16u);
}

TEST(ErrorFeedbackStore, ResizeResetsToZero) {
  ErrorFeedbackStore store;
  std::span<float> r = store.Residual("j", "t", 8);
  std::fill(r.begin(), r.end(), 7.0f);
  std::span<float> bigger = store.Residual("j", "t", 12);
  ASSERT_EQ(bigger.size(), 12u);
  EXPECT_TRUE(std::all_of(bigger.begin(), bigger.end(), [](float v) { return v == 0; }));
  EXPECT_EQ(store.BytesHeld(), 48u);
  std::fill(bigger.begin(), bigger.end(), 7.0f);
  std::span<float> smaller = store.Residual("j", "t", 3);
  EXPECT_TRUE(std::all_of(smaller.begin(), smaller.end(), [](float v) { return v == 0; }));
  EXPECT_EQ(store.BytesHeld(), 12u);
  EXPECT_EQ(store.KeyCount(), 1u);
  EXPECT_EQ(store.Residual("j", "t", 0).size(), 0u);
  EXPECT_EQ(store.BytesHeld(), 0u);
}

TEST(ErrorFeedbackStore, DropJobForgetsOnlyThatJob) {
  ErrorFeedbackStore store;
  store.Residual("j1", "a", 10);
  store.Residual("j1", "b", 20);
  store.Residual("j2", "a", 30)[0] = 9.0f;
  EXPECT_EQ(store.DropJob("j1"), 2u);
  EXPECT_EQ(store.DropJob("j1"), 0u);
  EXPECT_EQ(store.DropJob("nope"), 0u);
  EXPECT_EQ(store.KeyCount(), 1u);
  EXPECT_EQ(store.BytesHeld(), 120u);
  EXPECT_EQ(store.Residual("j2", "a", 30)[0], 9.0f);
  EXPECT_EQ(store.Residual("j1", "a", 10)[0], 0.0f);  // a new, zeroed residual
  store.Clear();
  EXPECT_EQ(store.KeyCount(), 0u);
  EXPECT_EQ(store.BytesHeld(), 0u);
}

TEST(ErrorFeedbackStore, ThreadsWithTheirOwnKeysDoNotInterfere) {
  ErrorFeedbackStore store;
  constexpr int kThreads = 4;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&store, t] {
      const std::string job = "job" + std::to_string(t % 2);
      for (int i = 0; i < 200; ++i) {
        const std::string tensor = "t" + std::to_string(t) + "." + std::to_string(i % 10);
        std::span<float> r = store.Residual(job, tensor, 16);
        r[0] += 1.0f;
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(store.KeyCount(), static_cast<size_t>(kThreads * 10));
  for (int t = 0; t < kThreads; ++t) {
    const std::string job = "job" + std::to_string(t % 2);
    for (int i = 0; i < 10; ++i) {
      EXPECT_EQ(store.Residual(job, "t" + std::to_string(t) + "." + std::to_string(i), 16)[0],
                20.0f);
    }
  }
}

}  // namespace
}  // namespace strait

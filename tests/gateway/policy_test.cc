// Job policies: parsing of policy strings, clamping to the operator's limits, per-tensor choice.
#include "gateway/policy.h"

#include <gtest/gtest.h>

namespace strait::gateway {
namespace {

TEST(PolicyRequest, ParsesEveryForm) {
  auto a = ParsePolicyRequest("auto");
  ASSERT_TRUE(a.ok());
  EXPECT_TRUE(a->automatic);
  auto b = ParsePolicyRequest("int8,ef");
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(b->codec, CodecId::kInt8);
  EXPECT_EQ(b->error_feedback, std::optional<bool>(true));
  auto c = ParsePolicyRequest("zstd:3");
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->codec, CodecId::kZstd);
  EXPECT_EQ(c->zstd_level, std::optional<int>(3));
  auto d = ParsePolicyRequest("fp8,noef");
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->codec, CodecId::kFp8E4M3);
  EXPECT_EQ(d->error_feedback, std::optional<bool>(false));
  auto e = ParsePolicyRequest("zstd:-5");
  ASSERT_TRUE(e.ok());
  EXPECT_EQ(e->zstd_level, std::optional<int>(-5));
  EXPECT_TRUE(ParsePolicyRequest("none").ok());
  EXPECT_TRUE(ParsePolicyRequest("int4").ok());
}

TEST(PolicyRequest, RejectsWithClearErrors) {
  struct Case {
    const char* text;
    const char* expect;
  };
  const Case cases[] = {
      {"int3", "unknown codec \"int3\""},
      {"", "unknown codec \"\""},
      {"int8,fast", "unknown option \"fast\""},
      {"int8,", "unknown option \"\""},
      {"zstd:20", "bad zstd level \"20\""},
      {"zstd:x", "bad zstd level \"x\""},
      {"zstd:", "bad zstd level \"\""},
      {"int8:3", "only zstd takes a level"},
  };
  for (const Case& c : cases) {
    auto r = ParsePolicyRequest(c.text);
    ASSERT_FALSE(r.ok()) << c.text;
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(r.status().message().find(c.expect), std::string::npos) << r.status();
    EXPECT_NE(r.status().message().find("accepted: auto, none, zstd"), std::string::npos);
  }
}

TEST(JobPolicy, TakesAnAllowedRequestAsAsked) {
  PolicyLimits limits;
  limits.default_error_feedback = false;
  auto p = ResolvePolicy("int8,ef", limits);
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->codec, CodecId::kInt8);
  EXPECT_TRUE(p->error_feedback);
  EXPECT_TRUE(p->note.empty());
  auto q = ResolvePolicy("int8", limits);
  ASSERT_TRUE(q.ok());
  EXPECT_FALSE(q->error_feedback);  // the operator's default
}

TEST(JobPolicy, DisallowedCodecFallsBackToBestLossless) {
  PolicyLimits limits;
  limits.allowed_codecs = {CodecId::kNone, CodecId::kZstd, CodecId::kInt8};
  auto p = ResolvePolicy("int4,ef", limits);
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->codec, CodecId::kZstd);
  EXPECT_FALSE(p->error_feedback);
  EXPECT_NE(p->note.find("int4 not allowed"), std::string::npos) << p->note;
  EXPECT_NE(p->ToString().find("int4 not allowed"), std::string::npos);

  limits.allowed_codecs = {CodecId::kNone, CodecId::kInt8};
  auto q = ResolvePolicy("zstd:3", limits);
  ASSERT_TRUE(q.ok());
  EXPECT_EQ(q->codec, CodecId::kNone);
  EXPECT_NE(q->note.find("zstd not allowed"), std::string::npos);
}

TEST(JobPolicy, ErrorBoundAboveTheLimitFallsBack) {
  PolicyLimits limits;
  limits.max_relative_error = 0.01;
  auto p = ResolvePolicy("fp8", limits);
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->codec, CodecId::kZstd);
  EXPECT_NE(p->note.find("max_relative_error"), std::string::npos) << p->note;
  auto q = ResolvePolicy("int8", limits);  // 1/254 < 0.01
  ASSERT_TRUE(q.ok());
  EXPECT_EQ(q->codec, CodecId::kInt8);
}

TEST(JobPolicy, AutoAndEmptyUseLosslessAndTheDefault) {
  PolicyLimits limits;
  auto a = ResolvePolicy("auto", limits);
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->codec, CodecId::kZstd);
  limits.default_codec = "int8";
  auto d = ResolvePolicy("", limits);
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->codec, CodecId::kInt8);
}

TEST(TensorCodec, LossyOnlyForLargeFloatSums) {
  PolicyLimits limits;
  limits.min_lossy_bytes = 4096;
  auto p = ResolvePolicy("int8,ef", limits);
  ASSERT_TRUE(p.ok());
  auto big = ChooseTensorCodec(*p, DataType::kFloat32, ReduceOp::kSum, 1024);
  EXPECT_EQ(big.codec.codec, CodecId::kInt8);
  EXPECT_TRUE(big.error_feedback);
  EXPECT_EQ(ChooseTensorCodec(*p, DataType::kBfloat16, ReduceOp::kAvg, 2048).codec.codec,
            CodecId::kInt8);
  // Too small, wrong op, wrong type: lossless, and no error feedback.
  auto small = ChooseTensorCodec(*p, DataType::kFloat32, ReduceOp::kSum, 1023);
  EXPECT_EQ(small.codec.codec, CodecId::kZstd);
  EXPECT_FALSE(small.error_feedback);
  EXPECT_EQ(ChooseTensorCodec(*p, DataType::kFloat32, ReduceOp::kMax, 4096).codec.codec,
            CodecId::kZstd);
  EXPECT_EQ(ChooseTensorCodec(*p, DataType::kInt32, ReduceOp::kSum, 4096).codec.codec,
            CodecId::kZstd);
  EXPECT_EQ(ChooseTensorCodec(*p, DataType::kFloat64, ReduceOp::kSum, 4096).codec.codec,
            CodecId::kZstd);
}

}  // namespace
}  // namespace strait::gateway

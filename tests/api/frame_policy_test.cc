// The frame path's policy (lib/api/frame_policy.h): read from the text the gateway returns for
// register-job, produced here by the gateway's own ResolvePolicy + JobPolicy::ToString for every
// codec, error feedback on and off, clamped policies with notes, and auto; plus fixed texts that
// pin today's format, and texts that are not a resolved policy.
#include "api/frame_policy.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>

#include "gateway/config.h"
#include "gateway/policy.h"

namespace strait::api {
namespace {

using ::testing::HasSubstr;

// The operator's limits as config.h defaults them. Out of line: GCC 12 at -O3 warns falsely
// (-Wmaybe-uninitialized) about allowed_codecs' default initialiser inlined into a test body.
[[gnu::noinline]] gateway::PolicyLimits DefaultLimits() {
  return gateway::PolicyLimits{};
}

// What the gateway replies to register-job with `request` under `limits`.
std::string Resolved(const std::string& request,
                     const gateway::PolicyLimits& limits = DefaultLimits()) {
  auto policy = gateway::ResolvePolicy(request, limits);
  EXPECT_TRUE(policy.ok()) << request << ": " << policy.status();
  return policy.ok() ? policy->ToString() : std::string();
}

TEST(FramePolicy, EveryLossyCodecWithAndWithoutErrorFeedback) {
  struct Case {
    const char* name;
    CodecId codec;
  };
  for (const Case c : {Case{"int8", CodecId::kInt8}, Case{"int4", CodecId::kInt4},
                       Case{"fp8", CodecId::kFp8E4M3}}) {
    for (const bool ef : {true, false}) {
      const std::string text = Resolved(std::string(c.name) + (ef ? ",ef" : ",noef"));
      auto parsed = ParseFramePolicy(text);
      ASSERT_TRUE(parsed.ok()) << text << ": " << parsed.status();
      ASSERT_TRUE(parsed->has_value()) << text;
      EXPECT_EQ(**parsed, (FramePolicy{c.codec, ef})) << text;
      EXPECT_EQ(FramePolicyOf(text), (FramePolicy{c.codec, ef})) << text;
    }
  }
}

TEST(FramePolicy, ErrorFeedbackFollowsTheResolvedTextNotTheRequestDefault) {
  // A request without ",ef" takes the operator's default; the resolved text says which it was.
  gateway::PolicyLimits on = DefaultLimits();
  on.default_error_feedback = true;
  gateway::PolicyLimits off = DefaultLimits();
  off.default_error_feedback = false;
  EXPECT_EQ(FramePolicyOf(Resolved("int8", on)), (FramePolicy{CodecId::kInt8, true}));
  EXPECT_EQ(FramePolicyOf(Resolved("int8", off)), (FramePolicy{CodecId::kInt8, false}));
  // The operator's default codec (empty request).
  gateway::PolicyLimits fp8_default = DefaultLimits();
  fp8_default.default_codec = "fp8,noef";
  EXPECT_EQ(FramePolicyOf(Resolved("", fp8_default)), (FramePolicy{CodecId::kFp8E4M3, false}));
}

TEST(FramePolicy, LosslessAndAutoPoliciesHaveNoFramePath) {
  for (const char* request : {"none", "zstd", "zstd:3", "zstd:-5", "zstd:19", "zstd,ef", "auto",
                              "auto,ef", "auto:int8", "auto:int4,ef", "auto:fp8,noef"}) {
    const std::string text = Resolved(request);
    auto parsed = ParseFramePolicy(text);
    ASSERT_TRUE(parsed.ok()) << request << " -> " << text << ": " << parsed.status();
    EXPECT_FALSE(parsed->has_value()) << request << " -> " << text;
  }
}

TEST(FramePolicy, ClampedPoliciesFollowWhatTheGatewayChose) {
  // int4 not allowed: the gateway falls back to zstd and says why in a note.
  gateway::PolicyLimits no_int4 = DefaultLimits();
  no_int4.allowed_codecs = {CodecId::kNone, CodecId::kZstd, CodecId::kInt8};
  const std::string refused = Resolved("int4,ef", no_int4);
  EXPECT_THAT(refused, HasSubstr("["));  // the note is there, so its words are skipped
  auto parsed = ParseFramePolicy(refused);
  ASSERT_TRUE(parsed.ok()) << refused << ": " << parsed.status();
  EXPECT_FALSE(parsed->has_value()) << refused;
  // An error bound above the operator's limit: lossless, with digits and spaces in the note.
  gateway::PolicyLimits tight = DefaultLimits();
  tight.max_relative_error = 0.01;
  const std::string bounded = Resolved("fp8,ef", tight);
  parsed = ParseFramePolicy(bounded);
  ASSERT_TRUE(parsed.ok()) << bounded << ": " << parsed.status();
  EXPECT_FALSE(parsed->has_value()) << bounded;
  // ... while int8 fits that bound and stays lossy.
  EXPECT_EQ(FramePolicyOf(Resolved("int8,ef", tight)), (FramePolicy{CodecId::kInt8, true}));
  // Only lossless codecs allowed at all.
  gateway::PolicyLimits lossless = DefaultLimits();
  lossless.allowed_codecs = {CodecId::kNone};
  EXPECT_EQ(FramePolicyOf(Resolved("int8,ef", lossless)), std::nullopt);
}

TEST(FramePolicy, FixedTextsOfTodaysFormat) {
  EXPECT_EQ(FramePolicyOf("int8+ef (lossy from 64 KiB, else zstd)"),
            (FramePolicy{CodecId::kInt8, true}));
  EXPECT_EQ(FramePolicyOf("int4 (lossy from 0 B, else none)"),
            (FramePolicy{CodecId::kInt4, false}));
  EXPECT_EQ(FramePolicyOf("fp8+ef (lossy from 1 MiB, else zstd) [a note]"),
            (FramePolicy{CodecId::kFp8E4M3, true}));
  EXPECT_EQ(FramePolicyOf("int8"), (FramePolicy{CodecId::kInt8, false}));
  EXPECT_EQ(FramePolicyOf("zstd:1 [int4 not allowed by the gateway's policy.allowed_codecs]"),
            std::nullopt);
  EXPECT_EQ(FramePolicyOf("auto:int8+ef (lossy from 64 KiB, else lossless per link: none, "
                          "zstd:1)"),
            std::nullopt);
  EXPECT_EQ(FramePolicyOf("none"), std::nullopt);
}

TEST(FramePolicy, TextThatIsNotAResolvedPolicyIsAClearError) {
  struct Case {
    const char* text;
    const char* says;  // part of the error message
  };
  for (const Case c : {
           Case{"", "names no policy"},
           Case{" (lossy from 64 KiB, else zstd)", "names no policy"},
           Case{"int8,ef", "request syntax"},
           Case{"int8,noef (lossy from 64 KiB, else zstd)", "request syntax"},
           Case{"int2+ef (lossy from 64 KiB, else zstd)", "unknown codec \"int2\""},
           Case{"+ef", "unknown codec \"+ef\""},
           Case{"int8+ef+ef", "unknown codec \"int8+ef\""},
           Case{"int8+efx", "unknown codec \"int8+efx\""},
           Case{"zstd:99", "bad zstd level"},
           Case{"int8:3", "only zstd takes a level"},
           Case{"auto:zstd", "auto takes a lossy codec"},
           Case{"int8 lossy from 64 KiB", "not \"(details)\" or \"[note]\""},
           Case{"int8 ", "not \"(details)\" or \"[note]\""},
       }) {
    auto parsed = ParseFramePolicy(c.text);
    ASSERT_FALSE(parsed.ok()) << "\"" << c.text << "\" parsed";
    EXPECT_EQ(parsed.status().code(), StatusCode::kInvalidArgument) << c.text;
    const std::string message(parsed.status().message());
    std::string quoted = "\"";  // built by appending: GCC 12 -O3 warns falsely on "\"" + ...
    quoted.append(c.text).append("\"");
    EXPECT_THAT(message, HasSubstr(quoted)) << message;
    EXPECT_THAT(message, HasSubstr(c.says)) << message;
    EXPECT_THAT(message, HasSubstr("same Strait version")) << message;
    // A backend falls back to the raw path (the gateway applies the policy itself).
    EXPECT_EQ(FramePolicyOf(c.text), std::nullopt) << c.text;
  }
}

}  // namespace
}  // namespace strait::api

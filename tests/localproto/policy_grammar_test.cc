// Tests of the compression-policy grammar (localproto/policy_grammar.h): every form parses, bad
// text is refused naming the bad part, and the canonical text round-trips.
#include "localproto/policy_grammar.h"

#include <gtest/gtest.h>

#include <optional>
#include <string>

namespace strait::localproto {
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
      {"int3", "unknown codec \"int3\""},       {"", "unknown codec \"\""},
      {"int8,fast", "unknown option \"fast\""}, {"int8,", "unknown option \"\""},
      {"zstd:20", "bad zstd level \"20\""},     {"zstd:x", "bad zstd level \"x\""},
      {"zstd:", "bad zstd level \"\""},         {"int8:3", "only zstd takes a level"},
  };
  for (const Case& c : cases) {
    auto r = ParsePolicyRequest(c.text);
    ASSERT_FALSE(r.ok()) << c.text;
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(r.status().message().find(c.expect), std::string::npos) << r.status();
    EXPECT_NE(r.status().message().find("accepted: auto, none, zstd"), std::string::npos);
  }
}

TEST(PolicyRequest, AutoMayNameOneLossyCodec) {
  auto a = ParsePolicyRequest("auto:int8,noef");
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_TRUE(a->automatic);
  EXPECT_EQ(a->auto_lossy, std::optional<CodecId>(CodecId::kInt8));
  EXPECT_EQ(a->error_feedback, std::optional<bool>(false));
  EXPECT_FALSE(ParsePolicyRequest("auto")->auto_lossy.has_value());
  for (const char* bad : {"auto:zstd", "auto:3", "auto:", "auto:none"}) {
    auto r = ParsePolicyRequest(bad);
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_NE(r.status().message().find("auto takes a lossy codec"), std::string::npos)
        << r.status();
  }
}

TEST(PolicyRequest, CanonicalTextRoundTripsEveryForm) {
  for (const char* text :
       {"auto", "auto,ef", "auto:int8", "auto:int4,noef", "auto:fp8,ef", "none", "none,noef",
        "zstd", "zstd:3", "zstd:-5,noef", "zstd:19,ef", "int8", "int8,ef", "int4,noef", "fp8"}) {
    auto r = ParsePolicyRequest(text);
    ASSERT_TRUE(r.ok()) << text << ": " << r.status();
    const std::string canonical = FormatPolicyRequest(*r);
    EXPECT_EQ(canonical, text);  // these are written canonically already
    EXPECT_LE(canonical.size(), kMaxCanonicalPolicyBytes);
    auto again = ParsePolicyRequest(canonical);
    ASSERT_TRUE(again.ok()) << canonical;
    EXPECT_EQ(*again, *r) << text;
  }
}

TEST(PolicyRequest, AliasesAndCaseBecomeOneCanonicalText) {
  EXPECT_EQ(FormatPolicyRequest(*ParsePolicyRequest("INT8")), "int8");
  EXPECT_EQ(FormatPolicyRequest(*ParsePolicyRequest("e4m3,ef")), "fp8,ef");
  EXPECT_EQ(FormatPolicyRequest(*ParsePolicyRequest("auto:FP8_E4M3")), "auto:fp8");
  // The last error-feedback option wins.
  EXPECT_EQ(FormatPolicyRequest(*ParsePolicyRequest("int8,ef,noef")), "int8,noef");
}

TEST(PolicyRequest, MayGoLossyOnlyForLossyCodecsOrAutoWithOne) {
  EXPECT_TRUE(MayGoLossy(*ParsePolicyRequest("int8")));
  EXPECT_TRUE(MayGoLossy(*ParsePolicyRequest("fp8,noef")));
  EXPECT_TRUE(MayGoLossy(*ParsePolicyRequest("auto:int4")));
  EXPECT_FALSE(MayGoLossy(*ParsePolicyRequest("auto")));
  EXPECT_FALSE(MayGoLossy(*ParsePolicyRequest("zstd:3")));
  EXPECT_FALSE(MayGoLossy(*ParsePolicyRequest("none")));
}

}  // namespace
}  // namespace strait::localproto

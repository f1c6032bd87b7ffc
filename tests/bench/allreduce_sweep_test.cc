// Tests of `strait-bench allreduce`'s size sweep (nccl-tests' -b/-e/-f) and --dtype parsing
// (bench/allreduce_sweep.h). The command-line side (flags refused with exit code 2, a real
// sweep) is in allreduce_bench_smoke_test.cc.
#include "bench/allreduce_sweep.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

namespace strait::bench {
namespace {

using Sizes = std::vector<uint64_t>;

TEST(SweepSizes, MultipliesFromMinUpToMaxInclusive) {
  StatusOr<Sizes> s = SweepSizes(4096, 65536, 4, 4);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(*s, (Sizes{4096, 16384, 65536}));
  // nccl-tests' example: -b 4KiB -e 256MiB -f 4 gives 4 KiB, 16 KiB, ..., 256 MiB (2^12 to
  // 2^28 in steps of 2^2: 9 sizes).
  s = SweepSizes(4096, uint64_t{256} << 20, 4, 4);
  ASSERT_TRUE(s.ok()) << s.status();
  ASSERT_EQ(s->size(), 9u);
  EXPECT_EQ(s->front(), 4096u);
  EXPECT_EQ(s->back(), uint64_t{256} << 20);
}

TEST(SweepSizes, StopsBeforePassingMax) {
  // 1024, 3072, 9216; 27648 is past 20000.
  StatusOr<Sizes> s = SweepSizes(1024, 20000, 3, 4);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(*s, (Sizes{1024, 3072, 9216}));
}

TEST(SweepSizes, EqualBoundsGiveOneSize) {
  StatusOr<Sizes> s = SweepSizes(8192, 8192, 2, 4);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(*s, (Sizes{8192}));
}

TEST(SweepSizes, DoesNotOverflowNearTheTopOfUint64) {
  const uint64_t top = UINT64_MAX - 1;
  StatusOr<Sizes> s = SweepSizes(uint64_t{1} << 62, top, 2, 2);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(*s, (Sizes{uint64_t{1} << 62, uint64_t{1} << 63}));
}

TEST(SweepSizes, RefusesBadValuesNamingTheFlag) {
  StatusOr<Sizes> s = SweepSizes(65536, 4096, 2, 4);  // b > e
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.status().message().find("--minbytes"), std::string::npos) << s.status();
  EXPECT_NE(s.status().message().find("--maxbytes"), std::string::npos) << s.status();
  for (uint64_t f : {0u, 1u}) {
    s = SweepSizes(4096, 65536, f, 4);
    ASSERT_FALSE(s.ok()) << f;
    EXPECT_NE(s.status().message().find("--stepfactor"), std::string::npos) << s.status();
  }
  s = SweepSizes(0, 4096, 2, 4);
  EXPECT_FALSE(s.ok());
  // 1026 is not a whole number of fp32 elements (it is of 2-byte ones).
  s = SweepSizes(1026, 4096, 2, 4);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find("multiple"), std::string::npos) << s.status();
  EXPECT_TRUE(SweepSizes(1026, 4096, 2, 2).ok());
}

TEST(SweepDtype, ParsesTheThreeFloatTypesAndTheirAliases) {
  EXPECT_EQ(*ParseSweepDtype("float32"), DataType::kFloat32);
  EXPECT_EQ(*ParseSweepDtype("fp32"), DataType::kFloat32);
  EXPECT_EQ(*ParseSweepDtype("bfloat16"), DataType::kBfloat16);
  EXPECT_EQ(*ParseSweepDtype("bf16"), DataType::kBfloat16);
  EXPECT_EQ(*ParseSweepDtype("float16"), DataType::kFloat16);
  EXPECT_EQ(*ParseSweepDtype("half"), DataType::kFloat16);
  EXPECT_EQ(*ParseSweepDtype("BFloat16"), DataType::kBfloat16);
}

TEST(SweepDtype, RefusesOtherTypes) {
  for (const char* bad : {"", "int8", "float64", "fp8", "bfloat", "float17"}) {
    StatusOr<DataType> t = ParseSweepDtype(bad);
    ASSERT_FALSE(t.ok()) << bad;
    EXPECT_NE(t.status().message().find("float32, bfloat16 or float16"), std::string::npos)
        << t.status();
  }
}

TEST(SweepDtype, NamesTheTypeColumnAsNcclTestsDoes) {
  EXPECT_STREQ(NcclTestsTypeName(DataType::kFloat32), "float");
  EXPECT_STREQ(NcclTestsTypeName(DataType::kBfloat16), "bfloat16");
  EXPECT_STREQ(NcclTestsTypeName(DataType::kFloat16), "half");
}

}  // namespace
}  // namespace strait::bench

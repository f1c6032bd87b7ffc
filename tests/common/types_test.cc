// Tests for DataType / ReduceOp names, sizes and parsing.
#include "strait/types.h"

#include <gtest/gtest.h>

namespace strait {
namespace {

TEST(DataType, ValuesMatchNccl) {
  // ncclDataType_t in NCCL 2.28: ncclInt8=0 ... ncclBfloat16=9, ncclFloat8e4m3=10, e5m2=11.
  EXPECT_EQ(static_cast<int>(DataType::kFloat16), 6);
  EXPECT_EQ(static_cast<int>(DataType::kFloat32), 7);
  EXPECT_EQ(static_cast<int>(DataType::kBfloat16), 9);
  EXPECT_EQ(static_cast<int>(DataType::kFloat8E5M2), 11);
  EXPECT_EQ(static_cast<int>(ReduceOp::kAvg), 4);
}

TEST(DataType, NamesRoundTripAndSizes) {
  for (int i = 0; i < kNumDataTypes; ++i) {
    const auto t = static_cast<DataType>(i);
    EXPECT_EQ(ParseDataType(DataTypeName(t)), t);
    EXPECT_GT(DataTypeSize(t), 0u);
  }
  EXPECT_EQ(DataTypeSize(DataType::kBfloat16), 2u);
  EXPECT_EQ(DataTypeSize(static_cast<DataType>(200)), 0u);
  EXPECT_STREQ(DataTypeName(static_cast<DataType>(200)), "invalid");
  EXPECT_EQ(ParseDataType("bf16"), DataType::kBfloat16);
  EXPECT_EQ(ParseDataType("FP32"), DataType::kFloat32);
  EXPECT_FALSE(ParseDataType("float128").has_value());
  EXPECT_FALSE(IsValidDataType(12));
  EXPECT_TRUE(IsLossyCodableType(DataType::kFloat16));
  EXPECT_FALSE(IsLossyCodableType(DataType::kFloat64));
}

TEST(ReduceOp, NamesRoundTrip) {
  for (int i = 0; i <= 4; ++i) {
    const auto op = static_cast<ReduceOp>(i);
    EXPECT_EQ(ParseReduceOp(ReduceOpName(op)), op);
  }
  EXPECT_FALSE(ParseReduceOp("xor").has_value());
  EXPECT_FALSE(IsValidReduceOp(5));
}

}  // namespace
}  // namespace strait

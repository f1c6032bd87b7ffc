// Tests for Status, StatusOr and the propagation macros.
#include "strait/status.h"

#include <gtest/gtest.h>

#include <memory>
#include <set>
#include <string>

namespace strait {
namespace {

TEST(Status, DefaultIsOk) {
  Status s;
  EXPECT_TRUE(s.ok());
  EXPECT_EQ(s.code(), StatusCode::kOk);
  EXPECT_EQ(s.ToString(), "OK");
}

TEST(Status, ErrorCarriesCodeAndMessage) {
  Status s = DeadlineExceededError("peer us-east did not answer within 5 s");
  EXPECT_FALSE(s.ok());
  EXPECT_EQ(s.code(), StatusCode::kDeadlineExceeded);
  EXPECT_EQ(s.ToString(), "DEADLINE_EXCEEDED: peer us-east did not answer within 5 s");
}

TEST(Status, OkCodeDropsMessage) {
  Status s(StatusCode::kOk, "ignored");
  EXPECT_TRUE(s.ok());
  EXPECT_TRUE(s.message().empty());
}

TEST(Status, WithContextPrefixesMessageAndKeepsCode) {
  Status s = DataLossError("crc mismatch").WithContext("frame 7");
  EXPECT_EQ(s.code(), StatusCode::kDataLoss);
  EXPECT_EQ(s.message(), "frame 7: crc mismatch");
  EXPECT_TRUE(Status::Ok().WithContext("x").ok());
}

TEST(Status, EveryCodeHasADistinctName) {
  std::set<std::string> names;
  for (int c = 0; c <= 15; ++c) names.insert(StatusCodeName(static_cast<StatusCode>(c)));
  EXPECT_EQ(names.size(), 16u);
  EXPECT_STREQ(StatusCodeName(static_cast<StatusCode>(99)), "UNKNOWN_CODE");
}

StatusOr<int> Half(int x) {
  if (x % 2 != 0) return InvalidArgumentError("odd");
  return x / 2;
}

Status Quarter(int x, int* out) {
  STRAIT_ASSIGN_OR_RETURN(int h, Half(x));
  STRAIT_ASSIGN_OR_RETURN(*out, Half(h));
  return Status::Ok();
}

TEST(StatusOr, ValueAndError) {
  StatusOr<int> good = Half(8);
  ASSERT_TRUE(good.ok());
  EXPECT_EQ(*good, 4);
  StatusOr<int> bad = Half(3);
  EXPECT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(bad.value_or(-1), -1);
  EXPECT_THROW((void)bad.value(), std::bad_optional_access);
}

TEST(StatusOr, FromOkStatusIsInternalError) {
  StatusOr<int> s(Status::Ok());
  EXPECT_EQ(s.status().code(), StatusCode::kInternal);
}

TEST(StatusOr, HoldsMoveOnlyValues) {
  StatusOr<std::unique_ptr<int>> p(std::make_unique<int>(5));
  ASSERT_TRUE(p.ok());
  std::unique_ptr<int> taken = std::move(p).value();
  EXPECT_EQ(*taken, 5);
}

TEST(StatusMacros, AssignOrReturnPropagates) {
  int out = 0;
  EXPECT_TRUE(Quarter(8, &out).ok());
  EXPECT_EQ(out, 2);
  Status s = Quarter(6, &out);  // 6 -> 3 -> odd
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
}

Status FailIfNegative(int x) {
  STRAIT_RETURN_IF_ERROR(x < 0 ? OutOfRangeError("negative") : Status::Ok());
  return Status::Ok();
}

TEST(StatusMacros, ReturnIfError) {
  EXPECT_TRUE(FailIfNegative(1).ok());
  EXPECT_EQ(FailIfNegative(-1).code(), StatusCode::kOutOfRange);
}

}  // namespace
}  // namespace strait

// Tests of the TCP socket options: congestion control names are checked against the kernel.
#include "net/socket_options.h"

#include <gtest/gtest.h>

namespace strait::net {
namespace {

TEST(CongestionControl, UnknownNameIsAClearError) {
  const Status s = CheckCongestionControl("no-such-cc");
  ASSERT_EQ(s.code(), StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("no-such-cc"), std::string::npos) << s;
  EXPECT_NE(s.message().find("offers"), std::string::npos) << s;
}

TEST(CongestionControl, DefaultAndAvailableAreAccepted) {
  EXPECT_TRUE(CheckCongestionControl("").ok());
  const std::string available = AvailableCongestionControls();
  if (available.find("cubic") == std::string::npos) GTEST_SKIP() << "kernel lacks cubic";
  EXPECT_TRUE(CheckCongestionControl("cubic").ok());
}

}  // namespace
}  // namespace strait::net

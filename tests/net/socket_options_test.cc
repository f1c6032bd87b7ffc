// Tests of the TCP socket options: congestion control names are checked against the kernel;
// the retransmission timeout cap reads back as set.
#include "net/socket_options.h"

#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

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

TEST(TcpRtoMax, ReadsBackAsSetAndRefusesWhatTheKernelWouldNot) {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  ASSERT_GE(fd, 0);
  auto before = GetTcpRtoMax(fd);
  if (!before.ok() && before.status().code() == StatusCode::kUnimplemented) {
    ::close(fd);
    GTEST_SKIP() << before.status() << " (Linux 6.15+): the cap cannot apply here";
  }
  ASSERT_TRUE(before.ok()) << before.status();
  EXPECT_EQ(*before, 120'000'000'000);  // the kernel's default
  ASSERT_TRUE(SetTcpRtoMax(fd, 1'000'000'000).ok());
  EXPECT_EQ(*GetTcpRtoMax(fd), 1'000'000'000);
  ASSERT_TRUE(SetTcpRtoMax(fd, 0).ok());  // 0 leaves it as it is
  EXPECT_EQ(*GetTcpRtoMax(fd), 1'000'000'000);
  EXPECT_EQ(SetTcpRtoMax(fd, 999'000'000).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(SetTcpRtoMax(fd, 121'000'000'000).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(*GetTcpRtoMax(fd), 1'000'000'000);
  ::close(fd);
}

}  // namespace
}  // namespace strait::net

// Tests of the TCP socket options: congestion control names are checked against the kernel;
// the retransmission timeout cap reads back as set; pacing caps leave room for the headers.
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

// A path's rate counts packets, the kernel's pacing cap payload: 100 Mbit/s of 1500-byte IPv4
// packets with timestamps carry 1448/1500 of it.
TEST(Pacing, PayloadRateLeavesRoomForTheHeaders) {
  EXPECT_EQ(PayloadRateForWireRate(12'500'000, PacketShape{}), 12'066'666u);
  EXPECT_EQ(PayloadRateForWireRate(12'500'000, PacketShape{1428, 72}), 11'900'000u);  // IPv6
  EXPECT_EQ(PayloadRateForWireRate(1, PacketShape{}), 1u);  // never 0, the kernel's "no cap"
  EXPECT_EQ(PayloadRateForWireRate(1000, PacketShape{0, 52}), 1000u);
}

// A connected loopback socket: IPv4 headers (20 + 20, + 12 with timestamps, Linux's default)
// around the MSS the kernel reports.
TEST(Pacing, ReadsTheShapeOfAConnectedSocket) {
  const int listener = socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(listener, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(bind(listener, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  socklen_t len = sizeof(addr);
  ASSERT_EQ(getsockname(listener, reinterpret_cast<sockaddr*>(&addr), &len), 0);
  ASSERT_EQ(listen(listener, 1), 0);
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  StatusOr<PacketShape> shape = ReadPacketShape(fd);
  ASSERT_TRUE(shape.ok()) << shape.status();
  EXPECT_TRUE(shape->header_bytes == 40 || shape->header_bytes == 52) << shape->header_bytes;
  EXPECT_GT(shape->payload_bytes, 1000u);
  EXPECT_LE(shape->payload_bytes + shape->header_bytes, 65536u);
  EXPECT_FALSE(ReadPacketShape(-1).ok());
  close(fd);
  close(listener);
}

}  // namespace
}  // namespace strait::net

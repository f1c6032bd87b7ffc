// The listen handle and connection wire messages: round trips, and every corruption rejected.
#include "plugins/nccl/handle.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>

#include <cstring>

namespace strait::nccl {
namespace {

ListenHandle Sample() {
  ListenHandle h;
  h.nonce = 0x0123456789abcdefULL;
  auto* a = reinterpret_cast<sockaddr_in*>(&h.addr);
  a->sin_family = AF_INET;
  inet_pton(AF_INET, "10.1.2.3", &a->sin_addr);
  a->sin_port = htons(40000);
  h.region = "us-east";
  return h;
}

TEST(ListenHandle, RoundTripsIpv4AndIpv6) {
  unsigned char buf[kHandleSize];
  ASSERT_TRUE(EncodeHandle(Sample(), buf).ok());
  StatusOr<ListenHandle> back = DecodeHandle(buf);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->nonce, 0x0123456789abcdefULL);
  EXPECT_EQ(back->region, "us-east");
  EXPECT_EQ(ntohs(reinterpret_cast<sockaddr_in*>(&back->addr)->sin_port), 40000);
  EXPECT_EQ(ReadScratch(buf), 0u);

  ListenHandle h6;
  h6.nonce = 5;
  auto* a6 = reinterpret_cast<sockaddr_in6*>(&h6.addr);
  a6->sin6_family = AF_INET6;
  inet_pton(AF_INET6, "fd00::7", &a6->sin6_addr);
  a6->sin6_port = htons(1234);
  h6.region = std::string(63, 'r');
  ASSERT_TRUE(EncodeHandle(h6, buf).ok());
  back = DecodeHandle(buf);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->addr.ss_family, AF_INET6);
  EXPECT_EQ(back->region, h6.region);
  h6.region += "x";
  EXPECT_FALSE(EncodeHandle(h6, buf).ok());
}

TEST(ListenHandle, ScratchIsOutsideTheChecksum) {
  unsigned char buf[kHandleSize];
  ASSERT_TRUE(EncodeHandle(Sample(), buf).ok());
  WriteScratch(buf, 0xfeedULL);
  EXPECT_EQ(ReadScratch(buf), 0xfeedULL);
  EXPECT_TRUE(DecodeHandle(buf).ok());
}

TEST(ListenHandle, EveryCorruptionIsRejected) {
  unsigned char good[kHandleSize];
  ASSERT_TRUE(EncodeHandle(Sample(), good).ok());
  // Flipping any bit of the checked part (0-103) must fail decoding.
  for (size_t byte = 0; byte < 104; ++byte) {
    unsigned char buf[kHandleSize];
    std::memcpy(buf, good, sizeof(buf));
    buf[byte] ^= 0x01;
    EXPECT_FALSE(DecodeHandle(buf).ok()) << "byte " << byte;
  }
  unsigned char zeros[kHandleSize] = {};
  EXPECT_EQ(DecodeHandle(zeros).status().code(), StatusCode::kInvalidArgument);
}

TEST(WireMessages, HelloReplyAndChunkHeaderRoundTrip) {
  Hello h;
  h.socket_index = 2;
  h.socket_count = 4;
  h.nonce = 99;
  h.connection_id = 1234567;
  unsigned char buf[kHelloSize];
  EncodeHello(h, buf);
  ReplyStatus why = ReplyStatus::kAccepted;
  StatusOr<Hello> back = DecodeHello(buf, &why);
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(back->socket_index, 2);
  EXPECT_EQ(back->socket_count, 4);
  EXPECT_EQ(back->nonce, 99u);
  EXPECT_EQ(back->connection_id, 1234567u);
  buf[4] = 7;  // version
  EXPECT_FALSE(DecodeHello(buf, &why).ok());
  EXPECT_EQ(why, ReplyStatus::kUnsupportedVersion);
  h.socket_index = 4;  // out of range
  EncodeHello(h, buf);
  EXPECT_FALSE(DecodeHello(buf, &why).ok());
  EXPECT_EQ(why, ReplyStatus::kBadHello);

  unsigned char reply[kReplySize];
  EncodeReply(ReplyStatus::kUnknownListener, reply);
  StatusOr<ReplyStatus> r = DecodeReply(reply);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(*r, ReplyStatus::kUnknownListener);
  reply[0] ^= 1;
  EXPECT_FALSE(DecodeReply(reply).ok());

  ChunkHeader c;
  c.seq = 1ULL << 40;
  c.message_size = 3ULL << 30;
  c.offset = 1ULL << 31;
  c.length = 524288;
  c.tag = -3;
  unsigned char hb[kChunkHeaderSize];
  EncodeChunkHeader(c, hb);
  const ChunkHeader d = DecodeChunkHeader(hb);
  EXPECT_EQ(d.seq, c.seq);
  EXPECT_EQ(d.message_size, c.message_size);
  EXPECT_EQ(d.offset, c.offset);
  EXPECT_EQ(d.length, c.length);
  EXPECT_EQ(d.tag, -3);
}

}  // namespace
}  // namespace strait::nccl

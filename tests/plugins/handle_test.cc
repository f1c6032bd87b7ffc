// The listen handle and connection wire messages: round trips, and every corruption rejected;
// the local-protocol frames the plugin writes itself, checked against straitd's own decoder.
#include "plugins/nccl/handle.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>

#include <cstring>
#include <span>

#include "localproto/frame_io.h"
#include "localproto/protocol.h"

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
  // Flipping any bit of the checked part (0-115: fields and checksum) must fail decoding.
  for (size_t byte = 0; byte < kListenChecksumOffset + 4; ++byte) {
    unsigned char buf[kHandleSize];
    std::memcpy(buf, good, sizeof(buf));
    buf[byte] ^= 0x01;
    EXPECT_FALSE(DecodeHandle(buf).ok()) << "byte " << byte;
  }
  unsigned char zeros[kHandleSize] = {};
  EXPECT_EQ(DecodeHandle(zeros).status().code(), StatusCode::kInvalidArgument);
}

TEST(ListenHandle, TunnelFieldsRoundTripAndOldVersionsAreRefused) {
  static_assert(kHandleSize <= 128 && kHandleScratchOffset == 120);
  ListenHandle h = Sample();
  h.tunnel = true;
  h.gateway_shard = 7;
  h.listen_id = 0xabcdef0123456789ULL;
  unsigned char buf[kHandleSize];
  ASSERT_TRUE(EncodeHandle(h, buf).ok());
  StatusOr<ListenHandle> back = DecodeHandle(buf);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_TRUE(back->tunnel);
  EXPECT_EQ(back->gateway_shard, 7u);
  EXPECT_EQ(back->listen_id, 0xabcdef0123456789ULL);
  EXPECT_EQ(back->region, "us-east");
  // Without the flag the tunnel fields stay zero and are not read.
  ASSERT_TRUE(EncodeHandle(Sample(), buf).ok());
  back = DecodeHandle(buf);
  ASSERT_TRUE(back.ok());
  EXPECT_FALSE(back->tunnel);
  EXPECT_EQ(buf[34], 0);
  // A tunnel needs the gateway's region.
  h.region.clear();
  EXPECT_FALSE(EncodeHandle(h, buf).ok());
  // A version-1 handle (the first slice) is refused by name.
  ASSERT_TRUE(EncodeHandle(Sample(), buf).ok());
  buf[4] = 1;
  StatusOr<ListenHandle> old = DecodeHandle(buf);
  ASSERT_FALSE(old.ok());
  EXPECT_NE(old.status().message().find("version 1"), std::string::npos) << old.status();
}

// The frames the plugin encodes decode with straitd's decoder to the intended fields, and what
// straitd encodes decodes with the plugin's.
localproto::Message GatewayDecode(const std::vector<unsigned char>& frame) {
  EXPECT_GE(frame.size(), 5u);
  const uint32_t len = frame[0] | (frame[1] << 8) | (frame[2] << 16) | (uint32_t{frame[3]} << 24);
  EXPECT_EQ(len, frame.size() - 4);
  auto m = localproto::DecodeMessage(std::span<const uint8_t>(frame.data() + 4, frame.size() - 4));
  EXPECT_TRUE(m.ok()) << m.status();
  return m.ok() ? *m : localproto::Message{};
}

TEST(GatewayFrames, PluginFramesDecodeWithStraitdsDecoder) {
  localproto::Message m = GatewayDecode(EncodeLocalHello("nccl-net-strait"));
  EXPECT_EQ(m.type, localproto::MessageType::kHello);
  EXPECT_EQ(m.magic, localproto::kLocalMagic);
  EXPECT_EQ(m.version, localproto::kLocalVersion);
  EXPECT_EQ(m.client_name, "nccl-net-strait");
  EXPECT_EQ(GatewayDecode(EncodeTunnelListen()).type, localproto::MessageType::kTunnelListen);
  m = GatewayDecode(EncodeTunnelConnect("eu-west", 3, 0x1122334455667788ULL, 60000));
  EXPECT_EQ(m.type, localproto::MessageType::kTunnelConnect);
  EXPECT_EQ(m.tunnel_region, "eu-west");
  EXPECT_EQ(m.tunnel_shard, 3u);
  EXPECT_EQ(m.listen_id, 0x1122334455667788ULL);
  EXPECT_EQ(m.timeout_ms, 60000u);
  m = GatewayDecode(EncodeTunnelAccept(42));
  EXPECT_EQ(m.type, localproto::MessageType::kTunnelAccept);
  EXPECT_EQ(m.tunnel_id, 42u);
  m = GatewayDecode(EncodeTunnelClose(StatusCode::kUnavailable, "bye"));
  EXPECT_EQ(m.type, localproto::MessageType::kTunnelClose);
  EXPECT_EQ(m.code, StatusCode::kUnavailable);
  EXPECT_EQ(m.text, "bye");
  // A data frame: head + payload; the gateway sees tag and data = chunk header + payload.
  ChunkHeader c;
  c.seq = 5;
  c.message_size = 10;
  c.offset = 4;
  c.length = 6;
  c.tag = 17;
  std::vector<unsigned char> frame(kTunnelDataHead);
  EncodeTunnelDataHead(c, frame.data());
  for (int i = 0; i < 6; ++i) frame.push_back(static_cast<unsigned char>(0xa0 + i));
  m = GatewayDecode(frame);
  EXPECT_EQ(m.type, localproto::MessageType::kTunnelData);
  EXPECT_EQ(m.tag, 17u);
  ASSERT_EQ(m.data.size(), kChunkHeaderSize + 6);
  const ChunkHeader d = DecodeChunkHeader(m.data.data());
  EXPECT_EQ(d.seq, 5u);
  EXPECT_EQ(d.offset, 4u);
  EXPECT_EQ(d.length, 6u);
  EXPECT_EQ(m.data.back(), 0xa5);
}

TEST(GatewayFrames, StraitdFramesDecodeWithThePluginsDecoder) {
  localproto::Message reply;
  reply.type = localproto::MessageType::kReply;
  reply.reply_to = localproto::MessageType::kTunnelListen;
  reply.code = StatusCode::kOk;
  reply.text = "ok";
  localproto::TunnelEvent ev;
  ev.kind = localproto::TunnelEventKind::kListening;
  ev.id = 99;
  ev.shard = 2;
  ev.region = "us-east";
  reply.data = localproto::EncodeTunnelEvent(ev);
  auto frame = localproto::EncodeMessage(reply);
  ASSERT_TRUE(frame.ok());
  StatusOr<LocalReply> r = DecodeLocalReply(frame->data() + 4, frame->size() - 4);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->reply_to, LocalType::kTunnelListen);
  EXPECT_EQ(r->text, "ok");
  StatusOr<TunnelEvent> e = DecodeTunnelEvent(r->data);
  ASSERT_TRUE(e.ok()) << e.status();
  EXPECT_EQ(e->kind, TunnelEventKind::kListening);
  EXPECT_EQ(e->id, 99u);
  EXPECT_EQ(e->shard, 2u);
  EXPECT_EQ(e->region, "us-east");

  localproto::Message close;
  close.type = localproto::MessageType::kTunnelClose;
  close.code = StatusCode::kUnavailable;
  close.text = "peer gateway gone";
  frame = localproto::EncodeMessage(close);
  ASSERT_TRUE(frame.ok());
  StatusOr<LocalReply> c = DecodeTunnelClose(frame->data() + 4, frame->size() - 4);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->code, StatusCode::kUnavailable);
  EXPECT_EQ(c->text, "peer gateway gone");

  // Every truncation of a reply is an error, never a read past the end.
  for (size_t n = 0; n + 4 < frame->size(); ++n) {
    EXPECT_FALSE(DecodeTunnelClose(frame->data() + 4, n).ok()) << n;
  }
  auto rf = localproto::EncodeMessage(reply);
  for (size_t n = 0; n < 8; ++n) EXPECT_FALSE(DecodeLocalReply(rf->data() + 4, n).ok()) << n;
  EXPECT_FALSE(DecodeTunnelEvent(std::vector<uint8_t>(5, 1)).ok());
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

// The local protocol: round trips of every message type, and bad frames that must each give a
// clear error without reading past the body.
#include "localproto/frame_io.h"
#include "localproto/protocol.h"

#include <gtest/gtest.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>
#include <thread>

namespace strait::localproto {
namespace {

std::vector<uint8_t> Body(const std::vector<uint8_t>& frame) {
  return std::vector<uint8_t>(frame.begin() + 4, frame.end());
}

Message AllReduceMessage() {
  Message m;
  m.type = MessageType::kAllReduce;
  m.job = "job-1";
  m.tensor_key = "layer.0.grad";
  m.dtype = DataType::kFloat32;
  m.op = ReduceOp::kSum;
  m.count = 3;
  m.timeout_ms = 5000;
  const float v[3] = {1.5f, -2.0f, 3.25f};
  m.data.resize(sizeof(v));
  std::memcpy(m.data.data(), v, sizeof(v));
  return m;
}

TEST(LocalProtocol, RoundTripsEveryType) {
  Message hello;
  hello.type = MessageType::kHello;
  hello.client_name = "rank-3";
  auto f = EncodeMessage(hello);
  ASSERT_TRUE(f.ok());
  // Length prefix, then type 1, then the magic "STLP".
  EXPECT_EQ((*f)[0], f->size() - 4);
  EXPECT_EQ((*f)[4], 1);
  EXPECT_EQ(std::memcmp(f->data() + 5, "STLP", 4), 0);
  auto h = DecodeMessage(Body(*f));
  ASSERT_TRUE(h.ok()) << h.status();
  EXPECT_EQ(h->client_name, "rank-3");

  Message reg;
  reg.type = MessageType::kRegisterJob;
  reg.job = "job-1";
  reg.policy = "int8,ef";
  f = EncodeMessage(reg);
  ASSERT_TRUE(f.ok());
  auto r = DecodeMessage(Body(*f));
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->type, MessageType::kRegisterJob);
  EXPECT_EQ(r->job, "job-1");
  EXPECT_EQ(r->policy, "int8,ef");

  f = EncodeMessage(AllReduceMessage());
  ASSERT_TRUE(f.ok());
  auto a = DecodeMessage(Body(*f));
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->tensor_key, "layer.0.grad");
  EXPECT_EQ(a->count, 3u);
  EXPECT_EQ(a->timeout_ms, 5000u);
  EXPECT_EQ(a->data, AllReduceMessage().data);

  Message reply;
  reply.type = MessageType::kReply;
  reply.reply_to = MessageType::kAllReduce;
  reply.code = StatusCode::kDeadlineExceeded;
  reply.text = "too slow";
  reply.data = {1, 2, 3};
  f = EncodeMessage(reply);
  ASSERT_TRUE(f.ok());
  auto p = DecodeMessage(Body(*f));
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->reply_to, MessageType::kAllReduce);
  EXPECT_EQ(p->code, StatusCode::kDeadlineExceeded);
  EXPECT_EQ(p->text, "too slow");
  EXPECT_EQ(p->data, reply.data);

  Message stats;
  stats.type = MessageType::kStats;
  f = EncodeMessage(stats);
  ASSERT_TRUE(f.ok());
  EXPECT_EQ(f->size(), 5u);
  EXPECT_TRUE(DecodeMessage(Body(*f)).ok());
}

TEST(LocalProtocol, EncodeRefusesWhatTheGatewayWouldRefuse) {
  Message m = AllReduceMessage();
  m.count = 4;  // data holds 3 floats
  EXPECT_EQ(EncodeMessage(m).status().code(), StatusCode::kInvalidArgument);
  m = AllReduceMessage();
  m.job = "";
  EXPECT_EQ(EncodeMessage(m).status().code(), StatusCode::kInvalidArgument);
  m = AllReduceMessage();
  m.tensor_key = std::string(kMaxNameBytes + 1, 'k');
  EXPECT_EQ(EncodeMessage(m).status().code(), StatusCode::kInvalidArgument);
  m = AllReduceMessage();
  EXPECT_EQ(EncodeMessage(m, 16).status().code(), StatusCode::kResourceExhausted);
}

TEST(LocalProtocol, EveryTruncationIsDataLossOrInvalid) {
  auto f = EncodeMessage(AllReduceMessage());
  ASSERT_TRUE(f.ok());
  const std::vector<uint8_t> body = Body(*f);
  for (size_t n = 0; n < body.size(); ++n) {
    std::vector<uint8_t> cut(body.begin(), body.begin() + static_cast<std::ptrdiff_t>(n));
    auto m = DecodeMessage(cut);
    ASSERT_FALSE(m.ok()) << n;
    EXPECT_TRUE(m.status().code() == StatusCode::kDataLoss ||
                m.status().code() == StatusCode::kInvalidArgument)
        << n << ": " << m.status();
  }
}

TEST(LocalProtocol, BadFieldsGiveDistinctErrors) {
  auto f = EncodeMessage(AllReduceMessage());
  ASSERT_TRUE(f.ok());
  std::vector<uint8_t> body = Body(*f);
  // Offsets: type 0, job len 1..2, job 3..7, key len 8..9, key 10..21, dtype 22, op 23,
  // count 24..31, timeout 32..35, data 36..
  struct Case {
    size_t offset;
    uint8_t value;
    StatusCode code;
    const char* expect;
  };
  const Case cases[] = {
      {0, 99, StatusCode::kInvalidArgument, "unknown local message type 99"},
      {22, 200, StatusCode::kInvalidArgument, "dtype 200 is not a known data type"},
      {23, 9, StatusCode::kInvalidArgument, "op 9 is not a known reduction"},
      {24, 4, StatusCode::kInvalidArgument, "carries 12 data bytes"},
      {31, 0xff, StatusCode::kInvalidArgument, "carries 12 data bytes"},  // huge count
      {2, 0x01, StatusCode::kInvalidArgument, "field `job` is 261 bytes; at most 256"},
      {9, 0x01, StatusCode::kInvalidArgument, "field `tensor key` is 268 bytes; at most 256"},
  };
  for (const Case& c : cases) {
    std::vector<uint8_t> bad = body;
    bad[c.offset] = c.value;
    auto m = DecodeMessage(bad);
    ASSERT_FALSE(m.ok()) << c.expect;
    EXPECT_EQ(m.status().code(), c.code) << m.status();
    EXPECT_NE(m.status().message().find(c.expect), std::string::npos) << m.status();
  }
  // A key length that runs past the end.
  std::vector<uint8_t> bad = body;
  bad[8] = 100;
  auto m = DecodeMessage(bad);
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.status().message().find("truncated"), std::string::npos) << m.status();
  // Trailing bytes after a fixed-size message.
  Message stats;
  stats.type = MessageType::kStats;
  auto sf = EncodeMessage(stats);
  ASSERT_TRUE(sf.ok());
  std::vector<uint8_t> trailing = Body(*sf);
  trailing.push_back(0);
  m = DecodeMessage(trailing);
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.status().message().find("1 trailing bytes"), std::string::npos) << m.status();
  // Over the limit.
  EXPECT_EQ(DecodeMessage(body, 10).status().code(), StatusCode::kResourceExhausted);
}

TEST(LocalProtocol, HelloChecksMagicAndVersion) {
  Message hello;
  hello.type = MessageType::kHello;
  hello.version = 1;  // a client from before operation identities: refused, saying both
  auto f = EncodeMessage(hello);
  ASSERT_TRUE(f.ok());
  auto m = DecodeMessage(Body(*f));
  EXPECT_EQ(m.status().code(), StatusCode::kUnimplemented);
  EXPECT_NE(m.status().message().find("version 1 is not supported"), std::string::npos);
  EXPECT_NE(m.status().message().find("speaks version 2"), std::string::npos);
  hello.version = kLocalVersion;
  hello.magic = 0x12345678;
  f = EncodeMessage(hello);
  ASSERT_TRUE(f.ok());
  m = DecodeMessage(Body(*f));
  EXPECT_EQ(m.status().code(), StatusCode::kDataLoss);
  EXPECT_NE(m.status().message().find("bad magic"), std::string::npos);
}

TEST(LocalProtocol, ReplyWithUnknownCodeIsRefused) {
  Message reply;
  reply.type = MessageType::kReply;
  reply.reply_to = MessageType::kStats;
  auto f = EncodeMessage(reply);
  ASSERT_TRUE(f.ok());
  std::vector<uint8_t> body = Body(*f);
  body[2] = 77;  // status code
  EXPECT_NE(DecodeMessage(body).status().message().find("unknown status code 77"),
            std::string::npos);
  body = Body(*f);
  body[1] = 128;  // a reply to a reply
  EXPECT_FALSE(DecodeMessage(body).ok());
}

TEST(LocalProtocol, FramesOverASocketPair) {
  int sv[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
  auto f = EncodeMessage(AllReduceMessage());
  ASSERT_TRUE(f.ok());
  ASSERT_TRUE(WriteAll(sv[0], *f, Deadline::AfterSeconds(5)).ok());
  auto body = ReadFrame(sv[1], kDefaultMaxMessageBytes, Deadline::AfterSeconds(5));
  ASSERT_TRUE(body.ok()) << body.status();
  EXPECT_EQ(*body, Body(*f));

  // Nothing to read: the deadline.
  auto none = ReadFrame(sv[1], kDefaultMaxMessageBytes, Deadline::After(20'000'000));
  EXPECT_EQ(none.status().code(), StatusCode::kDeadlineExceeded);

  // A length above the limit is refused before anything is allocated.
  const uint8_t huge[4] = {0xff, 0xff, 0xff, 0x7f};
  ASSERT_TRUE(WriteAll(sv[0], huge, Deadline::AfterSeconds(5)).ok());
  auto over = ReadFrame(sv[1], 1024, Deadline::AfterSeconds(5));
  EXPECT_EQ(over.status().code(), StatusCode::kResourceExhausted);

  // EOF in the middle of a frame is data loss; EOF between frames is a clean close.
  const uint8_t partial[6] = {10, 0, 0, 0, 4, 0};
  ASSERT_TRUE(WriteAll(sv[0], partial, Deadline::AfterSeconds(5)).ok());
  ::close(sv[0]);
  auto cut = ReadFrame(sv[1], 1024, Deadline::AfterSeconds(5));
  EXPECT_EQ(cut.status().code(), StatusCode::kDataLoss) << cut.status();
  auto eof = ReadFrame(sv[1], 1024, Deadline::AfterSeconds(5));
  EXPECT_EQ(eof.status().code(), StatusCode::kUnavailable) << eof.status();
  ::close(sv[1]);
}

TEST(LocalProtocol, TunnelMessagesRoundTrip) {
  Message connect;
  connect.type = MessageType::kTunnelConnect;
  connect.tunnel_region = "eu-west";
  connect.tunnel_shard = 2;
  connect.listen_id = 0x0102030405060708ull;
  connect.timeout_ms = 1500;
  auto f = EncodeMessage(connect);
  ASSERT_TRUE(f.ok()) << f.status();
  // type 6, region (2 + 7), shard 4, listen id 8, timeout 4.
  ASSERT_EQ(f->size(), 4u + 1 + 9 + 4 + 8 + 4);
  EXPECT_EQ((*f)[4], 6);
  EXPECT_EQ((*f)[4 + 1 + 9 + 4], 0x08);  // listen id, little-endian
  auto c = DecodeMessage(Body(*f));
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->tunnel_region, "eu-west");
  EXPECT_EQ(c->tunnel_shard, 2u);
  EXPECT_EQ(c->listen_id, connect.listen_id);
  EXPECT_EQ(c->timeout_ms, 1500u);

  Message listen;
  listen.type = MessageType::kTunnelListen;
  f = EncodeMessage(listen);
  ASSERT_TRUE(f.ok());
  EXPECT_EQ(f->size(), 5u);
  EXPECT_EQ(DecodeMessage(Body(*f))->type, MessageType::kTunnelListen);

  Message accept;
  accept.type = MessageType::kTunnelAccept;
  accept.tunnel_id = 0xfedcba9876543210ull;
  f = EncodeMessage(accept);
  ASSERT_TRUE(f.ok());
  EXPECT_EQ(f->size(), 4u + 1 + 8);
  EXPECT_EQ(DecodeMessage(Body(*f))->tunnel_id, accept.tunnel_id);

  for (size_t n : {size_t{0}, size_t{1}, size_t{4096}}) {
    Message data;
    data.type = MessageType::kTunnelData;
    data.tag = 0x11223344;
    data.data.assign(n, 0xab);
    f = EncodeMessage(data);
    ASSERT_TRUE(f.ok());
    // The layout a plugin writes by hand: length, type 8, u32 tag, the bytes.
    ASSERT_EQ(f->size(), 4 + kTunnelDataOverhead + n);
    EXPECT_EQ((*f)[0] | ((*f)[1] << 8), static_cast<int>((kTunnelDataOverhead + n) & 0xffff));
    EXPECT_EQ((*f)[4], 8);
    EXPECT_EQ((*f)[5], 0x44);
    auto d = DecodeMessage(Body(*f));
    ASSERT_TRUE(d.ok()) << d.status();
    EXPECT_EQ(d->tag, 0x11223344u);
    EXPECT_EQ(d->data, data.data);
  }

  Message close;
  close.type = MessageType::kTunnelClose;
  close.code = StatusCode::kUnavailable;
  close.text = "the gateway of region eu-west is gone";
  f = EncodeMessage(close);
  ASSERT_TRUE(f.ok());
  auto cl = DecodeMessage(Body(*f));
  ASSERT_TRUE(cl.ok()) << cl.status();
  EXPECT_EQ(cl->code, StatusCode::kUnavailable);
  EXPECT_EQ(cl->text, close.text);
  EXPECT_STREQ(MessageTypeName(MessageType::kTunnelClose), "tunnel-close");
}

TEST(LocalProtocol, BadTunnelMessagesAreRefused) {
  Message connect;
  connect.type = MessageType::kTunnelConnect;
  connect.tunnel_region = "";  // required
  EXPECT_EQ(EncodeMessage(connect).status().code(), StatusCode::kInvalidArgument);
  connect.tunnel_region = "us";
  auto f = EncodeMessage(connect);
  ASSERT_TRUE(f.ok());
  const std::vector<uint8_t> body = Body(*f);
  for (size_t n = 0; n < body.size(); ++n) {
    std::vector<uint8_t> cut(body.begin(), body.begin() + static_cast<std::ptrdiff_t>(n));
    auto m = DecodeMessage(cut);
    ASSERT_FALSE(m.ok()) << n;
    EXPECT_TRUE(m.status().code() == StatusCode::kDataLoss ||
                m.status().code() == StatusCode::kInvalidArgument)
        << n << ": " << m.status();
  }
  std::vector<uint8_t> longer = body;
  longer.push_back(1);
  EXPECT_NE(DecodeMessage(longer).status().message().find("1 trailing bytes"), std::string::npos);
  // A tunnel-data body shorter than its tag; an accept with a short id.
  EXPECT_EQ(DecodeMessage(std::vector<uint8_t>{8, 1, 2}).status().code(), StatusCode::kDataLoss);
  EXPECT_EQ(DecodeMessage(std::vector<uint8_t>{7, 1, 2, 3}).status().code(),
            StatusCode::kDataLoss);
  // A close with an unknown status code.
  EXPECT_NE(DecodeMessage(std::vector<uint8_t>{9, 77, 0, 0, 0, 0, 0}).status().message().find(
                "unknown status code 77"),
            std::string::npos);
  // A data frame over the limit.
  Message big;
  big.type = MessageType::kTunnelData;
  big.data.assign(100, 1);
  EXPECT_EQ(EncodeMessage(big, 100).status().code(), StatusCode::kResourceExhausted);
}

TEST(LocalProtocol, TunnelEventsRoundTripAndRefuseGarbage) {
  const TunnelEvent listening{TunnelEventKind::kListening, 0x1234, 5, "ap-south"};
  const std::vector<uint8_t> bytes = EncodeTunnelEvent(listening);
  // kind, id, shard, region.
  ASSERT_EQ(bytes.size(), 1u + 8 + 4 + 2 + 8);
  EXPECT_EQ(bytes[0], 1);
  auto e = DecodeTunnelEvent(bytes);
  ASSERT_TRUE(e.ok()) << e.status();
  EXPECT_EQ(e->kind, TunnelEventKind::kListening);
  EXPECT_EQ(e->id, 0x1234u);
  EXPECT_EQ(e->shard, 5u);
  EXPECT_EQ(e->region, "ap-south");
  for (size_t n = 0; n < bytes.size(); ++n) {
    std::vector<uint8_t> cut(bytes.begin(), bytes.begin() + static_cast<std::ptrdiff_t>(n));
    EXPECT_FALSE(DecodeTunnelEvent(cut).ok()) << n;
  }
  std::vector<uint8_t> bad = bytes;
  bad[0] = 3;
  EXPECT_NE(DecodeTunnelEvent(bad).status().message().find("unknown tunnel event kind 3"),
            std::string::npos);
  bad = bytes;
  bad.push_back(0);
  EXPECT_FALSE(DecodeTunnelEvent(bad).ok());
}

// EncodeMessageHead + the data written after it is byte for byte EncodeMessage's frame, for every
// type that carries data; it checks the external data size like EncodeMessage checks m.data.
TEST(LocalProtocol, HeadPlusDataIsTheWholeFrame) {
  Message reply;
  reply.type = MessageType::kReply;
  reply.reply_to = MessageType::kAllReduce;
  reply.text = "int8 shards=1,2";
  reply.data = {9, 8, 7, 6, 5};
  Message tunnel;
  tunnel.type = MessageType::kTunnelData;
  tunnel.tag = 77;
  tunnel.data = {1, 2, 3};
  for (const Message& m : {AllReduceMessage(), reply, tunnel}) {
    auto whole = EncodeMessage(m);
    ASSERT_TRUE(whole.ok()) << whole.status();
    auto head = EncodeMessageHead(m, m.data.size());
    ASSERT_TRUE(head.ok()) << head.status();
    std::vector<uint8_t> joined = *head;
    joined.insert(joined.end(), m.data.begin(), m.data.end());
    EXPECT_EQ(joined, *whole) << MessageTypeName(m.type);
    // The data in the message is ignored: only the size given counts.
    Message empty = m;
    empty.data.clear();
    auto head2 = EncodeMessageHead(empty, m.data.size());
    ASSERT_TRUE(head2.ok());
    EXPECT_EQ(*head2, *head);
  }
  Message m = AllReduceMessage();
  EXPECT_EQ(EncodeMessageHead(m, 16).status().code(), StatusCode::kInvalidArgument);  // 3 floats
  EXPECT_EQ(EncodeMessageHead(m, 12, 16).status().code(), StatusCode::kResourceExhausted);
  Message stats;
  stats.type = MessageType::kStats;
  EXPECT_EQ(EncodeMessageHead(stats, 1).status().code(), StatusCode::kInvalidArgument);
  auto bare = EncodeMessageHead(stats, 0);
  ASSERT_TRUE(bare.ok());
  EXPECT_EQ(bare->size(), 5u);
}

// Decoding many messages into one Message keeps its data buffer (no allocation per request)
// and resets every other field, so nothing of one request leaks into the next.
TEST(LocalProtocol, DecodeIntoReusesTheDataBufferAndResetsFields) {
  Message big = AllReduceMessage();
  big.count = 100000;
  big.data.assign(big.count * 4, 0x5a);
  auto f = EncodeMessage(big);
  ASSERT_TRUE(f.ok());
  Message m;
  ASSERT_TRUE(DecodeMessageInto(Body(*f), &m).ok());
  EXPECT_EQ(m.data, big.data);
  const uint8_t* buffer = m.data.data();

  f = EncodeMessage(AllReduceMessage());  // smaller: same buffer
  ASSERT_TRUE(f.ok());
  ASSERT_TRUE(DecodeMessageInto(Body(*f), &m).ok());
  EXPECT_EQ(m.data, AllReduceMessage().data);
  EXPECT_EQ(m.data.data(), buffer);
  EXPECT_EQ(m.count, 3u);

  Message reg;
  reg.type = MessageType::kRegisterJob;
  reg.job = "other";
  f = EncodeMessage(reg);
  ASSERT_TRUE(f.ok());
  m.client_uid = 42;
  ASSERT_TRUE(DecodeMessageInto(Body(*f), &m).ok());
  EXPECT_EQ(m.type, MessageType::kRegisterJob);
  EXPECT_EQ(m.job, "other");
  EXPECT_EQ(m.tensor_key, "");
  EXPECT_EQ(m.count, 0u);
  EXPECT_EQ(m.client_uid, 0u);
  EXPECT_TRUE(m.data.empty());
  EXPECT_GE(m.data.capacity(), big.data.size());  // kept for the next tensor

  // A bad body after a good one: the same errors as DecodeMessage.
  std::vector<uint8_t> bad = Body(*EncodeMessage(AllReduceMessage()));
  bad.pop_back();
  Status s = DecodeMessageInto(bad, &m);
  EXPECT_EQ(s.code(), DecodeMessage(bad).status().code());
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s;
}

// One connection, frames of very different sizes back to back into one reusable buffer (large
// ones from a writer thread, since they exceed the socket's buffer), then the part-wise reads.
TEST(LocalProtocol, ReadFrameIntoManySizesOnOneConnection) {
  int sv[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
  const std::vector<size_t> sizes = {1, 300000, 17, 1 << 20, 4096, 1 << 20, 2};
  std::thread writer([&] {
    for (size_t i = 0; i < sizes.size(); ++i) {
      std::vector<uint8_t> frame(4 + sizes[i]);
      for (int b = 0; b < 4; ++b) frame[static_cast<size_t>(b)] = uint8_t(sizes[i] >> (8 * b));
      for (size_t k = 0; k < sizes[i]; ++k) frame[4 + k] = uint8_t(i * 31 + k * 7);
      if (!WriteAll(sv[0], frame, Deadline::AfterSeconds(10)).ok()) return;
    }
  });
  std::vector<uint8_t> body;
  const uint8_t* largest = nullptr;
  for (size_t i = 0; i < sizes.size(); ++i) {
    Status s = ReadFrameInto(sv[1], kDefaultMaxMessageBytes, Deadline::AfterSeconds(10), &body);
    ASSERT_TRUE(s.ok()) << i << ": " << s;
    ASSERT_EQ(body.size(), sizes[i]);
    size_t wrong = 0;
    for (size_t k = 0; k < sizes[i]; ++k) wrong += body[k] != uint8_t(i * 31 + k * 7);
    EXPECT_EQ(wrong, 0u) << "frame " << i;
    if (sizes[i] == (1u << 20)) {
      // The second 1 MiB frame lands in the buffer the first one grew.
      if (largest == nullptr) largest = body.data();
      EXPECT_EQ(body.data(), largest);
    }
  }
  writer.join();

  // Over the limit: refused from the length alone; nothing of the body is read.
  const uint8_t over[4] = {0x01, 0x04, 0, 0};  // 1025
  ASSERT_TRUE(WriteAll(sv[0], over, Deadline::AfterSeconds(5)).ok());
  EXPECT_EQ(ReadFrameInto(sv[1], 1024, Deadline::AfterSeconds(5), &body).code(),
            StatusCode::kResourceExhausted);

  // Part-wise: the length, some bytes, then the writer goes away mid-body: data loss.
  const uint8_t part[4 + 6] = {100, 0, 0, 0, 1, 2, 3, 4, 5, 6};
  ASSERT_TRUE(WriteAll(sv[0], part, Deadline::AfterSeconds(5)).ok());
  auto len = ReadFrameLength(sv[1], 1024, Deadline::AfterSeconds(5));
  ASSERT_TRUE(len.ok()) << len.status();
  EXPECT_EQ(*len, 100u);
  uint8_t first[4];
  ASSERT_TRUE(ReadFrameBytes(sv[1], first, Deadline::AfterSeconds(5)).ok());
  EXPECT_EQ(first[3], 4);
  // The rest does not come: the deadline (a caller then drops the connection).
  uint8_t rest[96];
  EXPECT_EQ(ReadFrameBytes(sv[1], rest, Deadline::After(20'000'000)).code(),
            StatusCode::kDeadlineExceeded);
  ::close(sv[0]);
  Status cut = ReadFrameBytes(sv[1], rest, Deadline::AfterSeconds(5));
  EXPECT_EQ(cut.code(), StatusCode::kDataLoss) << cut;
  EXPECT_EQ(ReadFrameLength(sv[1], 1024, Deadline::AfterSeconds(5)).status().code(),
            StatusCode::kUnavailable);
  ::close(sv[1]);
}

}  // namespace
}  // namespace strait::localproto

namespace strait::localproto {
namespace {

// kAllReduceFrame (11): job, key, op, timeout and the rank's codec frame as data; the frame is
// the gateway's to check (any bytes pass the protocol), the op must be sum or avg both ways.
TEST(LocalProtocol, AllReduceFrameRoundTripsAndRefusesOtherOps) {
  Message m;
  m.type = MessageType::kAllReduceFrame;
  m.job = "job-1";
  m.tensor_key = "layer.0.grad";
  m.op = ReduceOp::kAvg;
  m.timeout_ms = 7000;
  m.data = {0x53, 0x54, 0x52, 0x46, 1, 2, 3};
  auto f = EncodeMessage(m);
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ((*f)[4], 11);  // the wire value, never renumbered
  auto d = DecodeMessage(Body(*f));
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->type, MessageType::kAllReduceFrame);
  EXPECT_EQ(d->job, "job-1");
  EXPECT_EQ(d->tensor_key, "layer.0.grad");
  EXPECT_EQ(d->op, ReduceOp::kAvg);
  EXPECT_EQ(d->timeout_ms, 7000u);
  EXPECT_EQ(d->data, m.data);
  EXPECT_STREQ(MessageTypeName(MessageType::kAllReduceFrame), "all-reduce-frame");
  // The head plus the data is the whole frame (how the client sends it).
  auto head = EncodeMessageHead(m, m.data.size());
  ASSERT_TRUE(head.ok());
  std::vector<uint8_t> joined = *head;
  joined.insert(joined.end(), m.data.begin(), m.data.end());
  EXPECT_EQ(joined, *f);

  m.op = ReduceOp::kMax;
  auto refused = EncodeMessage(m);
  EXPECT_EQ(refused.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(refused.status().message().find("op max is not supported"), std::string::npos)
      << refused.status();
  // The same on the wire: the op byte follows type, job (2 + 5) and key (2 + 12).
  std::vector<uint8_t> body = Body(*f);
  body[1 + 7 + 14] = static_cast<uint8_t>(ReduceOp::kMin);
  auto bad = DecodeMessage(body);
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("op min is not supported"), std::string::npos)
      << bad.status();
  body[1 + 7 + 14] = 99;
  bad = DecodeMessage(body);
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("op 99"), std::string::npos) << bad.status();
  // Every truncation before the data is an error, never a read past the body.
  const std::vector<uint8_t> whole = Body(*f);
  for (size_t n = 0; n < 1 + 7 + 14 + 1 + 4; ++n) {
    EXPECT_FALSE(DecodeMessage(std::span<const uint8_t>(whole).first(n)).ok()) << n;
  }
}

TEST(LocalProtocol, JoinAndOperationIdentityRoundTrip) {
  Message join;
  join.type = MessageType::kJoinJob;
  join.job = "job-7";
  join.scope = 99;
  join.timeout_ms = 1234;
  auto f = EncodeMessage(join);
  ASSERT_TRUE(f.ok()) << f.status();
  auto m = DecodeMessage(Body(*f));
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->type, MessageType::kJoinJob);
  EXPECT_EQ(m->job, "job-7");
  EXPECT_EQ(m->scope, 99u);
  EXPECT_EQ(m->timeout_ms, 1234u);

  Message ar;
  ar.type = MessageType::kAllReduce;
  ar.job = "job-7";
  ar.tensor_key = "w";
  ar.count = 2;
  ar.data.assign(8, 1);
  ar.generation = 3;
  ar.sequence = 17;
  ar.scope = 5;
  f = EncodeMessage(ar);
  ASSERT_TRUE(f.ok()) << f.status();
  m = DecodeMessage(Body(*f));
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->generation, 3u);
  EXPECT_EQ(m->sequence, 17u);
  EXPECT_EQ(m->scope, 5u);
  EXPECT_EQ(m->data.size(), 8u);
  // A join cut short names the field it lacks.
  std::vector<uint8_t> body = Body(EncodeMessage(join).value());
  body.resize(body.size() - 6);
  auto cut = DecodeMessage(body);
  EXPECT_EQ(cut.status().code(), StatusCode::kDataLoss);
  EXPECT_NE(cut.status().message().find("resume"), std::string::npos) << cut.status();
}

}  // namespace
}  // namespace strait::localproto

namespace strait::localproto {
namespace {

TEST(LocalProtocol, TunnelDataHeadIsTheEncodersHead) {
  Message m;
  m.type = MessageType::kTunnelData;
  m.tag = 0xA1B2C3D4;
  auto head = EncodeMessageHead(m, 1000);
  ASSERT_TRUE(head.ok()) << head.status();
  uint8_t fast[kTunnelDataHeadBytes];
  EncodeTunnelDataHead(m.tag, 1000, fast);
  EXPECT_EQ(std::vector<uint8_t>(fast, fast + kTunnelDataHeadBytes), *head);
}

TEST(LocalProtocol, ReplyMessageCarriesTheStatusWithinTheTextLimit) {
  Message m = ReplyMessage(MessageType::kJoinJob, DeadlineExceededError(std::string(20000, 'x')));
  EXPECT_EQ(m.type, MessageType::kReply);
  EXPECT_EQ(m.reply_to, MessageType::kJoinJob);
  EXPECT_EQ(m.code, StatusCode::kDeadlineExceeded);
  EXPECT_EQ(m.text.size(), kMaxReplyTextBytes);
  EXPECT_TRUE(m.data.empty());
  EXPECT_TRUE(EncodeMessage(m).ok());  // never refused for its length
}

TEST(LocalProtocol, StatusCodesUpToTheHighestOnly) {
  EXPECT_EQ(StatusCodeFromWire(0), StatusCode::kOk);
  EXPECT_EQ(StatusCodeFromWire(static_cast<uint64_t>(kHighestStatusCode)), kHighestStatusCode);
  EXPECT_FALSE(StatusCodeFromWire(static_cast<uint64_t>(kHighestStatusCode) + 1).has_value());
  EXPECT_FALSE(StatusCodeFromWire(uint64_t{1} << 40).has_value());
}

TEST(LocalProtocol, RequestTypesAreExactlyTheEnumsBelowTheReply) {
  int requests = 0;
  for (int t = 0; t < 256; ++t) {
    const auto raw = static_cast<uint8_t>(t);
    if (IsRequestType(raw)) {
      ++requests;
      EXPECT_STRNE(MessageTypeName(static_cast<MessageType>(raw)), "invalid") << t;
    }
    EXPECT_EQ(IsMessageType(raw), IsRequestType(raw) || t == 128) << t;
  }
  EXPECT_EQ(requests, 16);
}

}  // namespace
}  // namespace strait::localproto

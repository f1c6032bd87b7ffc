// Tests of the stream wire format: hello and record encoding, and that every malformed input is
// refused with the right kind of error instead of being trusted.
#include "net/wire.h"

#include <gtest/gtest.h>

namespace strait::net {
namespace {

TEST(WireHello, RoundTrips) {
  Hello hello;
  hello.session_id = 0x1122334455667788ull;
  hello.stream_index = 7;
  hello.region = "eu-west.1";
  const std::vector<uint8_t> bytes = EncodeHello(hello);
  ASSERT_EQ(bytes.size(), kHelloFixedBytes + hello.region.size());
  Hello parsed;
  size_t region_length = 0;
  HelloError kind;
  ASSERT_TRUE(ParseHelloFixed(bytes, &parsed, &region_length, &kind).ok());
  EXPECT_EQ(kind, HelloError::kNone);
  EXPECT_EQ(parsed.session_id, hello.session_id);
  EXPECT_EQ(parsed.stream_index, 7);
  EXPECT_EQ(parsed.flags, 0);
  EXPECT_EQ(region_length, hello.region.size());
}

TEST(WireHello, FlagsRoundTripAtTheirOffset) {
  Hello hello;
  hello.flags = kHelloResume | kHelloUnknownSession;
  hello.region = "us";
  const std::vector<uint8_t> bytes = EncodeHello(hello);
  EXPECT_EQ(bytes[6], 0x03);  // u16 little-endian at offset 6
  EXPECT_EQ(bytes[7], 0x00);
  Hello parsed;
  size_t region_length = 0;
  HelloError kind;
  ASSERT_TRUE(ParseHelloFixed(bytes, &parsed, &region_length, &kind).ok());
  EXPECT_EQ(parsed.flags, kHelloResume | kHelloUnknownSession);
}

TEST(WireHello, GarbageIsBadMagic) {
  std::vector<uint8_t> garbage(kHelloFixedBytes, 0xAB);
  Hello parsed;
  size_t region_length = 0;
  HelloError kind;
  EXPECT_FALSE(ParseHelloFixed(garbage, &parsed, &region_length, &kind).ok());
  EXPECT_EQ(kind, HelloError::kBadMagic);
}

TEST(WireHello, OtherVersionIsBadVersion) {
  Hello hello;
  hello.version = kWireVersion + 1;
  hello.region = "us";
  Hello parsed;
  size_t region_length = 0;
  HelloError kind;
  const Status s = ParseHelloFixed(EncodeHello(hello), &parsed, &region_length, &kind);
  EXPECT_EQ(kind, HelloError::kBadVersion);
  EXPECT_NE(s.message().find("version 2"), std::string::npos) << s;
}

TEST(WireHello, BadFieldsAreRefused) {
  Hello hello;
  hello.region = "us";
  std::vector<uint8_t> bytes = EncodeHello(hello);
  bytes[18] = 0;  // region length 0
  Hello parsed;
  size_t region_length = 0;
  HelloError kind;
  EXPECT_FALSE(ParseHelloFixed(bytes, &parsed, &region_length, &kind).ok());
  EXPECT_EQ(kind, HelloError::kBadField);
  bytes = EncodeHello(hello);
  PutU16(bytes.data() + 16, kMaxStreams);
  EXPECT_FALSE(ParseHelloFixed(bytes, &parsed, &region_length, &kind).ok());
  EXPECT_FALSE(ParseHelloFixed(std::span(bytes).first(10), &parsed, &region_length, &kind).ok());
}

TEST(WireRegion, Validates) {
  EXPECT_TRUE(IsValidRegionName("us-east-1"));
  EXPECT_FALSE(IsValidRegionName(""));
  EXPECT_FALSE(IsValidRegionName("US"));
  EXPECT_FALSE(IsValidRegionName("a/b"));
  EXPECT_FALSE(IsValidRegionName(std::string(64, 'a')));
}

TEST(WireRecord, HeaderBoundsPerType) {
  uint8_t h[kRecordHeaderBytes];
  RecordHeader header;
  EncodeRecordHeader(RecordType::kData, kDataHeaderBytes + kMaxChunkPayload, h);
  EXPECT_TRUE(ParseRecordHeader(std::span<const uint8_t>(h), &header).ok());
  EncodeRecordHeader(RecordType::kData, kDataHeaderBytes + kMaxChunkPayload + 1, h);
  EXPECT_FALSE(ParseRecordHeader(std::span<const uint8_t>(h), &header).ok());
  EncodeRecordHeader(RecordType::kData, kDataHeaderBytes - 1, h);
  EXPECT_FALSE(ParseRecordHeader(std::span<const uint8_t>(h), &header).ok());
  EncodeRecordHeader(RecordType::kPing, 9, h);
  EXPECT_FALSE(ParseRecordHeader(std::span<const uint8_t>(h), &header).ok());
  EncodeRecordHeader(RecordType::kAck, 16 + 8, h);
  EXPECT_FALSE(ParseRecordHeader(std::span<const uint8_t>(h), &header).ok());
  EncodeRecordHeader(RecordType::kClose, 4, h);
  EXPECT_TRUE(ParseRecordHeader(std::span<const uint8_t>(h), &header).ok());
  EncodeRecordHeader(RecordType::kRetire, 1, h);
  EXPECT_FALSE(ParseRecordHeader(std::span<const uint8_t>(h), &header).ok());
  std::vector<uint8_t> retire;
  AppendRetireRecord(&retire);
  ASSERT_EQ(retire.size(), kRecordHeaderBytes);
  ASSERT_TRUE(ParseRecordHeader(retire, &header).ok());
  EXPECT_EQ(header.type, RecordType::kRetire);
  EXPECT_EQ(header.length, 0u);
  h[0] = 99;
  const Status s = ParseRecordHeader(std::span<const uint8_t>(h), &header);
  EXPECT_NE(s.message().find("unknown record type 99"), std::string::npos) << s;
}

TEST(WireRecord, DataHeaderRoundTripsAndChecksBounds) {
  std::vector<uint8_t> out;
  DataHeader in{42, 3, 9, 1000, 900};
  AppendDataRecordHeaders(in, 100, &out);
  out.resize(out.size() + 100);
  RecordHeader rh;
  ASSERT_TRUE(ParseRecordHeader(out, &rh).ok());
  EXPECT_EQ(rh.length, kDataHeaderBytes + 100);
  DataHeader parsed;
  std::span<const uint8_t> body = std::span<const uint8_t>(out).subspan(kRecordHeaderBytes);
  ASSERT_TRUE(ParseDataHeader(body, &parsed).ok());
  EXPECT_EQ(parsed.seq, 42u);
  EXPECT_EQ(parsed.channel, 3u);
  EXPECT_EQ(parsed.message_id, 9u);
  EXPECT_EQ(parsed.message_length, 1000u);
  EXPECT_EQ(parsed.offset, 900u);
  // One byte more payload runs past the message's end.
  out.push_back(0);
  body = std::span<const uint8_t>(out).subspan(kRecordHeaderBytes);
  EXPECT_FALSE(ParseDataHeader(body, &parsed).ok());
}

TEST(WireRecord, AckRoundTripsAndRejectsDisorder) {
  Ack ack{10, {{12, 14}, {20, 21}}};
  std::vector<uint8_t> out;
  AppendAckRecord(ack, &out);
  Ack parsed;
  ASSERT_TRUE(ParseAck(std::span<const uint8_t>(out).subspan(kRecordHeaderBytes), &parsed).ok());
  EXPECT_EQ(parsed.cumulative, 10u);
  ASSERT_EQ(parsed.ranges.size(), 2u);
  EXPECT_EQ(parsed.ranges[1].begin, 20u);
  Ack bad{10, {{20, 21}, {12, 14}}};
  out.clear();
  AppendAckRecord(bad, &out);
  EXPECT_FALSE(ParseAck(std::span<const uint8_t>(out).subspan(kRecordHeaderBytes), &parsed).ok());
  Ack below{10, {{5, 6}}};
  out.clear();
  AppendAckRecord(below, &out);
  EXPECT_FALSE(ParseAck(std::span<const uint8_t>(out).subspan(kRecordHeaderBytes), &parsed).ok());
}

}  // namespace
}  // namespace strait::net

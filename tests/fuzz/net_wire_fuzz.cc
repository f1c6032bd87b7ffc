// libFuzzer target for the WAN stream wire format (lib/net/wire.h): arbitrary bytes are read the
// way a link reads what a peer sends after TLS, an optional hello and then records, and each
// record body goes through its parser and on into the delivery books (ReceiveBook for data,
// SendBook for acks). Besides "no crash, no out-of-bounds read, no unbounded allocation" it checks:
// an accepted hello or ack re-encodes to the same bytes, an accepted record header is within its
// type's bound, an accepted data chunk lies inside its message, and the receiver never holds more
// than its partial-message budget.
//
// Input layout: byte 0 bit 0 says whether a hello comes first; the rest is the stream.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <span>
#include <vector>

#include "net/delivery.h"
#include "net/wire.h"

namespace {

using strait::net::Ack;
using strait::net::DataHeader;
using strait::net::Hello;
using strait::net::RecordHeader;
using strait::net::RecordType;

// Small limits, so that the books' bounds are reached within a fuzz input.
constexpr uint64_t kMaxMessage = 1 << 16;
constexpr uint64_t kMaxPartial = 1 << 17;
constexpr int kSentChunks = 64;  // the SendBook has this many chunks out, for acks to cover

void Check(bool condition) {
  if (!condition) std::abort();
}

// Parses a hello at the front of `in`; returns the bytes it used, or 0 when refused.
size_t FuzzHello(std::span<const uint8_t> in) {
  if (in.size() < strait::net::kHelloFixedBytes) return 0;
  Hello hello;
  size_t region_length = 0;
  strait::net::HelloError error = strait::net::HelloError::kNone;
  const strait::Status s = strait::net::ParseHelloFixed(
      in.first(strait::net::kHelloFixedBytes), &hello, &region_length, &error);
  if (!s.ok()) {
    Check(error != strait::net::HelloError::kNone);
    return 0;
  }
  Check(region_length >= 1 && region_length <= strait::net::kMaxRegionLength);
  Check(hello.stream_index < strait::net::kMaxStreams);
  if (in.size() < strait::net::kHelloFixedBytes + region_length) return 0;
  hello.region.assign(in.begin() + strait::net::kHelloFixedBytes,
                      in.begin() + strait::net::kHelloFixedBytes + region_length);
  if (!strait::net::IsValidRegionName(hello.region)) return 0;
  // Re-encoding gives the same bytes, except the flags and reserved fields, which are ignored.
  std::vector<uint8_t> again = strait::net::EncodeHello(hello);
  const size_t used = strait::net::kHelloFixedBytes + region_length;
  Check(again.size() == used);
  std::vector<uint8_t> original(in.begin(), in.begin() + used);
  for (size_t i : {6, 7, 19}) original[i] = again[i];
  Check(original == again);
  return used;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  std::span<const uint8_t> in(data + 1, size - 1);
  if ((data[0] & 1) != 0) {
    const size_t used = FuzzHello(in);
    if (used == 0) return 0;  // a refused hello closes the stream
    in = in.subspan(used);
  }

  strait::net::ReceiveBook receive(kMaxMessage, kMaxPartial);
  strait::net::SendBook send;
  send.set_max_started_bytes(kMaxPartial);
  std::vector<strait::net::Completion> completions;
  for (int i = 0; i < kSentChunks / 4; ++i) {
    send.Enqueue(static_cast<uint32_t>(i % 3), std::vector<uint8_t>(100 * i), INT64_MAX,
                 [](strait::Status) {});
  }
  for (int i = 0; i < kSentChunks; ++i) {
    if (send.Next(i % 4, 512, UINT64_MAX) == nullptr) break;
  }

  while (in.size() >= strait::net::kRecordHeaderBytes) {
    RecordHeader header;
    if (!strait::net::ParseRecordHeader(in.first(strait::net::kRecordHeaderBytes), &header)
             .ok()) {
      return 0;  // the stream is closed
    }
    Check(header.length <= strait::net::kDataHeaderBytes + strait::net::kMaxChunkPayload);
    in = in.subspan(strait::net::kRecordHeaderBytes);
    if (in.size() < header.length) return 0;  // truncated: the read would wait
    const std::span<const uint8_t> body = in.first(header.length);
    in = in.subspan(header.length);
    switch (header.type) {
      case RecordType::kData: {
        DataHeader d;
        if (!strait::net::ParseDataHeader(body, &d).ok()) return 0;
        const auto payload = body.subspan(strait::net::kDataHeaderBytes);
        Check(d.offset <= d.message_length && payload.size() <= d.message_length - d.offset);
        bool duplicate = false;
        std::vector<strait::net::Delivery> deliveries;
        if (!receive.OnChunk(d, payload, &duplicate, &deliveries).ok()) return 0;
        Check(receive.partial_bytes() <= kMaxPartial);
        for (const auto& delivery : deliveries) Check(delivery.data.size() <= kMaxMessage);
        const Ack ack = receive.MakeAck();
        Check(ack.ranges.size() <= strait::net::kMaxAckRanges);
        break;
      }
      case RecordType::kAck: {
        Ack ack;
        if (!strait::net::ParseAck(body, &ack).ok()) return 0;
        std::vector<uint8_t> again;
        strait::net::AppendAckRecord(ack, &again);
        Check(again.size() == strait::net::kRecordHeaderBytes + body.size());
        // The reserved u16 and u32 after the range count are ignored by the parser.
        Check(body.size() >= 16);
        std::vector<uint8_t> original(body.begin(), body.end());
        for (size_t i = 10; i < 16; ++i) original[i] = 0;
        Check(std::memcmp(again.data() + strait::net::kRecordHeaderBytes, original.data(),
                          original.size()) == 0);
        uint64_t acked = 0;
        if (!send.OnAck(ack, &acked, &completions).ok()) return 0;
        for (auto& c : completions) c.done(c.status);
        completions.clear();
        break;
      }
      case RecordType::kPing:
      case RecordType::kPong:
        Check(body.size() == 8);
        break;
      case RecordType::kClose:
        Check(body.size() == 4);
        return 0;  // the link ends
      case RecordType::kRetire:
        Check(body.empty());
        break;
    }
  }
  return 0;
}

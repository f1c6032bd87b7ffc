// Encoding and validation of the stream wire format (see wire.h for the layout).
#include "net/wire.h"

#include <cstring>
#include <string>

namespace strait::net {

bool IsValidRegionName(std::string_view region) noexcept {
  if (region.empty() || region.size() > kMaxRegionLength) return false;
  for (char c : region) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '.' || c == '_' ||
                    c == '-';
    if (!ok) return false;
  }
  return true;
}

std::vector<uint8_t> EncodeHello(const Hello& hello) {
  std::vector<uint8_t> out(kHelloFixedBytes + hello.region.size(), 0);
  PutU32(out.data(), kWireMagic);
  PutU16(out.data() + 4, hello.version);
  PutU16(out.data() + 6, hello.flags);
  PutU64(out.data() + 8, hello.session_id);
  PutU16(out.data() + 16, hello.stream_index);
  out[18] = static_cast<uint8_t>(hello.region.size());
  std::memcpy(out.data() + kHelloFixedBytes, hello.region.data(), hello.region.size());
  return out;
}

Status ParseHelloFixed(std::span<const uint8_t> fixed, Hello* hello, size_t* region_length,
                       HelloError* error) {
  *error = HelloError::kBadField;
  if (fixed.size() < kHelloFixedBytes) return DataLossError("hello truncated");
  const uint32_t magic = GetU32(fixed.data());
  if (magic != kWireMagic) {
    *error = HelloError::kBadMagic;
    return DataLossError("not a Strait stream (bad magic in hello); is the peer speaking "
                         "something else, or is TLS configured on one side only?");
  }
  const uint16_t version = GetU16(fixed.data() + 4);
  if (version != kWireVersion) {
    *error = HelloError::kBadVersion;
    return FailedPreconditionError("peer speaks wire version " + std::to_string(version) +
                                   ", this build speaks " + std::to_string(kWireVersion) +
                                   "; upgrade one side");
  }
  hello->version = version;
  hello->flags = GetU16(fixed.data() + 6);
  hello->session_id = GetU64(fixed.data() + 8);
  hello->stream_index = GetU16(fixed.data() + 16);
  if (hello->stream_index >= kMaxStreams) {
    return DataLossError("hello names stream index " + std::to_string(hello->stream_index) +
                         ", the limit is " + std::to_string(kMaxStreams - 1));
  }
  *region_length = fixed[18];
  if (*region_length == 0 || *region_length > kMaxRegionLength) {
    return DataLossError("hello region length " + std::to_string(*region_length) +
                         " out of range 1.." + std::to_string(kMaxRegionLength));
  }
  *error = HelloError::kNone;
  return Status::Ok();
}

Status ParseRecordHeader(std::span<const uint8_t> bytes, RecordHeader* header) {
  if (bytes.size() < kRecordHeaderBytes) return DataLossError("record header truncated");
  const uint8_t type = bytes[0];
  const uint32_t length = GetU32(bytes.data() + 4);
  auto bad_length = [&](const char* what, uint64_t lo, uint64_t hi) {
    return DataLossError(std::string(what) + " record of " + std::to_string(length) +
                         " bytes; allowed " + std::to_string(lo) + ".." + std::to_string(hi));
  };
  switch (type) {
    case static_cast<uint8_t>(RecordType::kData):
      if (length < kDataHeaderBytes || length > kDataHeaderBytes + kMaxChunkPayload) {
        return bad_length("data", kDataHeaderBytes, kDataHeaderBytes + kMaxChunkPayload);
      }
      break;
    case static_cast<uint8_t>(RecordType::kAck):
      if (length < 16 || length > 16 + 16u * kMaxAckRanges || (length - 16) % 16 != 0) {
        return bad_length("ack", 16, 16 + 16u * kMaxAckRanges);
      }
      break;
    case static_cast<uint8_t>(RecordType::kPing):
    case static_cast<uint8_t>(RecordType::kPong):
      if (length != 8) return bad_length("ping/pong", 8, 8);
      break;
    case static_cast<uint8_t>(RecordType::kClose):
      if (length != 4) return bad_length("close", 4, 4);
      break;
    case static_cast<uint8_t>(RecordType::kRetire):
      if (length != 0) return bad_length("retire", 0, 0);
      break;
    default:
      return DataLossError("unknown record type " + std::to_string(type));
  }
  header->type = static_cast<RecordType>(type);
  header->length = length;
  return Status::Ok();
}

void EncodeRecordHeader(RecordType type, uint32_t length, uint8_t out[kRecordHeaderBytes]) {
  out[0] = static_cast<uint8_t>(type);
  out[1] = 0;
  PutU16(out + 2, 0);
  PutU32(out + 4, length);
}

void AppendDataRecordHeaders(const DataHeader& header, uint32_t payload_length,
                             std::vector<uint8_t>* out) {
  const size_t at = out->size();
  out->resize(at + kRecordHeaderBytes + kDataHeaderBytes);
  uint8_t* p = out->data() + at;
  EncodeRecordHeader(RecordType::kData, static_cast<uint32_t>(kDataHeaderBytes + payload_length),
                     p);
  p += kRecordHeaderBytes;
  PutU64(p, header.seq);
  PutU32(p + 8, header.channel);
  PutU32(p + 12, 0);
  PutU64(p + 16, header.message_id);
  PutU64(p + 24, header.message_length);
  PutU64(p + 32, header.offset);
}

Status ParseDataHeader(std::span<const uint8_t> body, DataHeader* header) {
  if (body.size() < kDataHeaderBytes) return DataLossError("data record truncated");
  const uint8_t* p = body.data();
  header->seq = GetU64(p);
  header->channel = GetU32(p + 8);
  header->message_id = GetU64(p + 16);
  header->message_length = GetU64(p + 24);
  header->offset = GetU64(p + 32);
  const uint64_t payload = body.size() - kDataHeaderBytes;
  if (header->offset > header->message_length ||
      payload > header->message_length - header->offset) {
    return DataLossError("data chunk [" + std::to_string(header->offset) + ", +" +
                         std::to_string(payload) + ") lies outside its message of " +
                         std::to_string(header->message_length) + " bytes");
  }
  if (payload == 0 && header->message_length != 0) {
    return DataLossError("empty data chunk in a non-empty message");
  }
  return Status::Ok();
}

void AppendAckRecord(const Ack& ack, std::vector<uint8_t>* out) {
  const size_t n = ack.ranges.size() < kMaxAckRanges ? ack.ranges.size() : kMaxAckRanges;
  const size_t at = out->size();
  out->resize(at + kRecordHeaderBytes + 16 + 16 * n);
  uint8_t* p = out->data() + at;
  EncodeRecordHeader(RecordType::kAck, static_cast<uint32_t>(16 + 16 * n), p);
  p += kRecordHeaderBytes;
  PutU64(p, ack.cumulative);
  PutU16(p + 8, static_cast<uint16_t>(n));
  PutU16(p + 10, 0);
  PutU32(p + 12, 0);
  p += 16;
  for (size_t i = 0; i < n; ++i, p += 16) {
    PutU64(p, ack.ranges[i].begin);
    PutU64(p + 8, ack.ranges[i].end);
  }
}

Status ParseAck(std::span<const uint8_t> body, Ack* ack) {
  if (body.size() < 16) return DataLossError("ack record truncated");
  const uint8_t* p = body.data();
  ack->cumulative = GetU64(p);
  const uint16_t n = GetU16(p + 8);
  if (n > kMaxAckRanges || body.size() != 16 + 16u * n) {
    return DataLossError("ack claims " + std::to_string(n) + " ranges in " +
                         std::to_string(body.size()) + " bytes");
  }
  ack->ranges.clear();
  ack->ranges.reserve(n);
  uint64_t floor = ack->cumulative;
  for (uint16_t i = 0; i < n; ++i) {
    AckRange r{GetU64(p + 16 + 16 * i), GetU64(p + 24 + 16 * i)};
    if (r.begin < floor || r.end <= r.begin) {
      return DataLossError("ack range [" + std::to_string(r.begin) + ", " +
                           std::to_string(r.end) + ") is empty, unordered or below " +
                           std::to_string(floor));
    }
    floor = r.end;
    ack->ranges.push_back(r);
  }
  return Status::Ok();
}

void AppendPingRecord(RecordType type, uint64_t stamp, std::vector<uint8_t>* out) {
  const size_t at = out->size();
  out->resize(at + kRecordHeaderBytes + 8);
  EncodeRecordHeader(type, 8, out->data() + at);
  PutU64(out->data() + at + kRecordHeaderBytes, stamp);
}

void AppendCloseRecord(CloseReason reason, std::vector<uint8_t>* out) {
  const size_t at = out->size();
  out->resize(at + kRecordHeaderBytes + 4);
  EncodeRecordHeader(RecordType::kClose, 4, out->data() + at);
  PutU32(out->data() + at + kRecordHeaderBytes, static_cast<uint32_t>(reason));
}

void AppendRetireRecord(std::vector<uint8_t>* out) {
  const size_t at = out->size();
  out->resize(at + kRecordHeaderBytes);
  EncodeRecordHeader(RecordType::kRetire, 0, out->data() + at);
}

}  // namespace strait::net

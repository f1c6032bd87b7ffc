// Cross-region tunnels in straitd (see tunnel.h): the wire format between gateways and the WAN
// hop's codec. The service that runs tunnels is in tunnel_service.cc.
#include "common/strings.h"
#include "gateway/tunnel.h"

#include <algorithm>
#include <utility>

#include "common/clock.h"
#include "common/endian.h"

namespace strait::gateway {
namespace {

// Reads little-endian fields; the first that does not fit sets a sticky error naming it.
class WireReader {
 public:
  explicit WireReader(std::span<const uint8_t> b) : b_(b) {}
  uint64_t Le(int n, const char* field) {
    if (!status_.ok()) return 0;
    if (b_.size() - pos_ < static_cast<size_t>(n)) {
      status_ = DataLossError("truncated tunnel message: field `" + std::string(field) +
                              "` needs " + std::to_string(n) + " bytes at offset " +
                              std::to_string(pos_) + " of " + std::to_string(b_.size()));
      return 0;
    }
    const uint64_t v = GetLe(b_.data() + pos_, static_cast<size_t>(n));
    pos_ += static_cast<size_t>(n);
    return v;
  }
  std::string Str(const char* field) {
    const size_t n = static_cast<size_t>(Le(2, field));
    if (!status_.ok()) return {};
    if (n > kMaxReplyTextBytes) {
      status_ = InvalidArgumentError("tunnel message field `" + std::string(field) + "` is " +
                                     std::to_string(n) + " bytes; at most " +
                                     std::to_string(kMaxReplyTextBytes) + " allowed");
      return {};
    }
    if (b_.size() - pos_ < n) {
      status_ = DataLossError("truncated tunnel message: field `" + std::string(field) +
                              "` runs past the end");
      return {};
    }
    std::string s(reinterpret_cast<const char*>(b_.data() + pos_), n);
    pos_ += n;
    return s;
  }
  std::span<const uint8_t> Rest() {
    auto r = b_.subspan(pos_);
    pos_ = b_.size();
    return r;
  }
  size_t remaining() const { return b_.size() - pos_; }
  const Status& status() const { return status_; }

 private:
  std::span<const uint8_t> b_;
  size_t pos_ = 0;
  Status status_;
};

StatusCode CheckedCode(uint64_t code, Status* error) {
  const std::optional<StatusCode> known = localproto::StatusCodeFromWire(code);
  if (!known.has_value()) {
    *error =
        InvalidArgumentError("tunnel message carries unknown status code " + std::to_string(code));
    return StatusCode::kUnknown;
  }
  return *known;
}

}  // namespace

// ---- Wire format -----------------------------------------------------------------------------

void EncodeTunnelDataPrefix(const TunnelWire& w, uint8_t* out) {
  out[0] = kTunnelWireVersion;
  out[1] = static_cast<uint8_t>(TunnelWireKind::kData);
  out[2] = static_cast<uint8_t>(w.codec);
  out[3] = 0;
  PutLe(out + 4, w.tag, 4);
  PutLe(out + 8, w.tunnel_id, 8);
  PutLe(out + kTunnelWireHeaderSize, w.raw_size, 8);
}

std::vector<uint8_t> EncodeTunnelWire(const TunnelWire& w) {
  if (w.kind == TunnelWireKind::kData) {
    std::vector<uint8_t> out(kTunnelDataPrefixSize + w.payload.size());
    EncodeTunnelDataPrefix(w, out.data());
    std::copy(w.payload.begin(), w.payload.end(), out.begin() + kTunnelDataPrefixSize);
    return out;
  }
  std::vector<uint8_t> out;
  out.reserve(kTunnelWireHeaderSize + 32 + w.payload.size() + w.text.size());
  out.push_back(kTunnelWireVersion);
  out.push_back(static_cast<uint8_t>(w.kind));
  out.push_back(w.kind == TunnelWireKind::kData ? static_cast<uint8_t>(w.codec) : 0);
  out.push_back(0);
  AppendLe(&out, w.kind == TunnelWireKind::kData ? w.tag : 0, 4);
  AppendLe(&out, w.tunnel_id, 8);
  switch (w.kind) {
    case TunnelWireKind::kOpen:
      AppendLe(&out, w.shard, 4);
      AppendLe(&out, w.listen_id, 8);
      AppendLe(&out, w.window, 8);
      break;
    case TunnelWireKind::kOpenOk: AppendLe(&out, w.window, 8); break;
    case TunnelWireKind::kOpenRefused:
    case TunnelWireKind::kClose: {
      const std::string text = w.text.substr(0, kMaxReplyTextBytes);
      AppendLe(&out, static_cast<uint32_t>(w.code), 4);
      AppendLe(&out, text.size(), 2);
      out.insert(out.end(), text.begin(), text.end());
      break;
    }
    case TunnelWireKind::kData:
      AppendLe(&out, w.raw_size, 8);
      out.insert(out.end(), w.payload.begin(), w.payload.end());
      break;
    case TunnelWireKind::kCredit: AppendLe(&out, w.credit, 8); break;
  }
  return out;
}

StatusOr<TunnelWire> DecodeTunnelWire(std::span<const uint8_t> bytes, uint64_t max_raw_bytes) {
  WireReader r(bytes);
  TunnelWire w;
  const uint64_t version = r.Le(1, "version");
  const uint64_t kind = r.Le(1, "kind");
  const uint64_t codec = r.Le(1, "codec");
  const uint64_t reserved = r.Le(1, "reserved");
  w.tag = static_cast<uint32_t>(r.Le(4, "tag"));
  w.tunnel_id = r.Le(8, "tunnel id");
  if (!r.status().ok()) return r.status();
  if (version != kTunnelWireVersion) {
    return UnimplementedError("tunnel wire version " + std::to_string(version) +
                              " is not supported; this gateway speaks version " +
                              std::to_string(kTunnelWireVersion) + " (upgrade the older side)");
  }
  if (kind < 1 || kind > 6) {
    return InvalidArgumentError("unknown tunnel message kind " + std::to_string(kind));
  }
  w.kind = static_cast<TunnelWireKind>(kind);
  Status bad;
  switch (w.kind) {
    case TunnelWireKind::kOpen:
      w.shard = static_cast<uint32_t>(r.Le(4, "shard"));
      w.listen_id = r.Le(8, "listen id");
      w.window = r.Le(8, "window");
      break;
    case TunnelWireKind::kOpenOk: w.window = r.Le(8, "window"); break;
    case TunnelWireKind::kOpenRefused:
    case TunnelWireKind::kClose:
      w.code = CheckedCode(r.Le(4, "status code"), &bad);
      w.text = r.Str("reason");
      break;
    case TunnelWireKind::kData: {
      w.raw_size = r.Le(8, "raw size");
      if (!r.status().ok()) break;
      if (codec != static_cast<uint8_t>(CodecId::kNone) &&
          codec != static_cast<uint8_t>(CodecId::kZstd)) {
        return InvalidArgumentError("tunnel data with codec " + std::to_string(codec) +
                                    "; tunnels carry only lossless none or zstd");
      }
      w.codec = static_cast<CodecId>(codec);
      if (w.raw_size > max_raw_bytes) {
        return InvalidArgumentError("tunnel data of " + std::to_string(w.raw_size) +
                                    " bytes exceeds the limit of " + std::to_string(max_raw_bytes));
      }
      const auto payload = r.Rest();
      if (w.codec == CodecId::kNone && payload.size() != w.raw_size) {
        return InvalidArgumentError("raw tunnel data says " + std::to_string(w.raw_size) +
                                    " bytes but carries " + std::to_string(payload.size()));
      }
      w.payload.assign(payload.begin(), payload.end());
      break;
    }
    case TunnelWireKind::kCredit: w.credit = r.Le(8, "credit"); break;
  }
  if (!r.status().ok()) return r.status();
  if (!bad.ok()) return bad;
  if (w.kind != TunnelWireKind::kData && (codec != 0 || w.tag != 0)) {
    return InvalidArgumentError("tunnel control message with codec " + std::to_string(codec) +
                                " and tag " + std::to_string(w.tag) + "; both must be 0");
  }
  if (reserved != 0) {
    return InvalidArgumentError("tunnel message with reserved byte " + std::to_string(reserved) +
                                "; must be 0");
  }
  if (r.remaining() != 0) {
    return InvalidArgumentError(std::to_string(r.remaining()) +
                                " trailing bytes after a tunnel message of kind " +
                                std::to_string(kind));
  }
  return w;
}

// ---- Codec -----------------------------------------------------------------------------------

TunnelCodec::TunnelCodec(bool zstd_allowed, int zstd_level)
    : zstd_allowed_(zstd_allowed), zstd_level_(zstd_level) {
  zstd_.codec = CodecId::kZstd;
}

bool TunnelCodec::TryZstd(std::span<const uint8_t> data, TunnelWire* wire) {
  // The bytes carry no type; NCCL mostly moves 4- and 2-byte floats, and the byte-plane shuffle
  // by the element width groups their exponent bytes where zstd finds them.
  CodecOptions o;
  o.codec = CodecId::kZstd;
  o.zstd_level = zstd_level_;
  DataType dtype = DataType::kUint8;
  size_t count = data.size();
  o.byte_shuffle = false;
  if (data.size() % 4 == 0) {
    dtype = DataType::kFloat32;
    count = data.size() / 4;
    o.byte_shuffle = true;
  } else if (data.size() % 2 == 0) {
    dtype = DataType::kBfloat16;
    count = data.size() / 2;
    o.byte_shuffle = true;
  }
  const int64_t start = MonotonicNanos();
  std::vector<uint8_t> frame;
  if (!encoder_.Encode(data.data(), count, dtype, o, &frame).ok()) return false;
  const double seconds =
      std::max<double>(1e-9, static_cast<double>(MonotonicNanos() - start) * 1e-9);
  const double speed = static_cast<double>(data.size()) / seconds;
  const double ratio = static_cast<double>(data.size()) / static_cast<double>(frame.size());
  const bool first = zstd_.encode_bytes_per_s == 0;
  zstd_.encode_bytes_per_s = first ? speed : 0.7 * zstd_.encode_bytes_per_s + 0.3 * speed;
  // zstd decodes several times faster than it encodes; the receiver's speed is not measured here.
  zstd_.decode_bytes_per_s = 3 * zstd_.encode_bytes_per_s;
  zstd_.ratio = first ? ratio : 0.7 * zstd_.ratio + 0.3 * ratio;
  if (frame.size() >= data.size()) return false;  // incompressible: the raw bytes are smaller
  wire->codec = CodecId::kZstd;
  wire->payload = std::move(frame);
  ++zstd_messages_;
  return true;
}

bool TunnelCodec::Compress(std::span<const uint8_t> data, const net::LinkEstimates& link,
                           TunnelWire* wire) {
  wire->kind = TunnelWireKind::kData;
  wire->raw_size = data.size();
  if (zstd_allowed_ && data.size() >= kMinCompressBytes) {
    ++eligible_;
    bool use = force_zstd_ || zstd_.encode_bytes_per_s == 0 || eligible_ % kReprobeEvery == 0;
    if (!use) {
      const net::CodecProfile profiles[1] = {zstd_};
      const CodecId allowed[2] = {CodecId::kNone, CodecId::kZstd};
      use = net::ChooseCodec(link, profiles, allowed, data.size()).codec == CodecId::kZstd;
    }
    if (use && TryZstd(data, wire)) return true;
  }
  wire->codec = CodecId::kNone;
  wire->payload.clear();
  return false;
}

void TunnelCodec::Encode(std::span<const uint8_t> data, const net::LinkEstimates& link,
                         TunnelWire* wire) {
  if (!Compress(data, link, wire)) wire->payload.assign(data.begin(), data.end());
}

Status TunnelCodec::Decode(Decoder& decoder, TunnelWire& wire, std::vector<uint8_t>* out) {
  if (wire.codec == CodecId::kNone) {
    if (wire.payload.size() != wire.raw_size) {
      return DataLossError("raw tunnel data of " + std::to_string(wire.payload.size()) +
                           " bytes, expected " + std::to_string(wire.raw_size));
    }
    *out = std::move(wire.payload);
    return Status::Ok();
  }
  DecodeExpectations expect;
  expect.codec = CodecId::kZstd;
  STRAIT_ASSIGN_OR_RETURN(FrameInfo info, InspectFrame(wire.payload, expect));
  const size_t elem = DataTypeSize(info.dtype);
  if (elem == 0 || info.element_count > wire.raw_size / elem ||
      info.element_count * elem != wire.raw_size) {
    return DataLossError("tunnel zstd frame holds " + std::to_string(info.element_count) +
                         " elements of " + DataTypeName(info.dtype) + ", not " +
                         std::to_string(wire.raw_size) + " bytes");
  }
  out->resize(wire.raw_size);
  return decoder.Decode(wire.payload, out->data(), static_cast<size_t>(info.element_count),
                        info.dtype, expect);
}

}  // namespace strait::gateway

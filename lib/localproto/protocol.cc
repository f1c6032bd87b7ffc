// Encoding and decoding of the local protocol (see protocol.h).
#include "localproto/protocol.h"

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "common/endian.h"

namespace strait::localproto {
namespace {

class Writer {
 public:
  void U8(uint8_t v) { out_.push_back(v); }
  void U16(uint16_t v) { AppendLe(&out_, v, 2); }
  void U32(uint32_t v) { AppendLe(&out_, v, 4); }
  void U64(uint64_t v) { AppendLe(&out_, v, 8); }
  void Str(const std::string& s) {
    U16(static_cast<uint16_t>(s.size()));
    out_.insert(out_.end(), s.begin(), s.end());
  }
  void Bytes(const std::vector<uint8_t>& b) { out_.insert(out_.end(), b.begin(), b.end()); }
  std::vector<uint8_t>& out() { return out_; }

 private:
  std::vector<uint8_t> out_;
};

// Reads fields from a body; the first field that does not fit sets a sticky error naming it.
class Reader {
 public:
  explicit Reader(std::span<const uint8_t> body) : body_(body) {}
  bool Need(size_t n, const char* field) {
    if (!status_.ok()) return false;
    if (body_.size() - pos_ < n) {
      status_ = DataLossError("truncated local message: field `" + std::string(field) +
                              "` needs " + std::to_string(n) + " bytes at offset " +
                              std::to_string(pos_) + " but the body has " +
                              std::to_string(body_.size()));
      return false;
    }
    return true;
  }
  uint64_t Le(int n, const char* field) {
    if (!Need(static_cast<size_t>(n), field)) return 0;
    const uint64_t v = GetLe(body_.data() + pos_, static_cast<size_t>(n));
    pos_ += static_cast<size_t>(n);
    return v;
  }
  std::string Str(const char* field, size_t max, bool required) {
    const size_t n = static_cast<size_t>(Le(2, field));
    if (!status_.ok()) return {};
    if (n > max) {
      status_ = InvalidArgumentError("local message field `" + std::string(field) + "` is " +
                                     std::to_string(n) + " bytes; at most " +
                                     std::to_string(max) + " allowed");
      return {};
    }
    if (required && n == 0) {
      status_ = InvalidArgumentError("local message field `" + std::string(field) +
                                     "` is empty; a non-empty name is required");
      return {};
    }
    if (!Need(n, field)) return {};
    std::string s(reinterpret_cast<const char*>(body_.data() + pos_), n);
    pos_ += n;
    return s;
  }
  // The rest of the body into *out, reusing its capacity (DecodeMessageInto).
  void RestInto(std::vector<uint8_t>* out) {
    out->assign(body_.begin() + static_cast<std::ptrdiff_t>(pos_), body_.end());
    pos_ = body_.size();
  }
  void Fail(Status s) {
    if (status_.ok()) status_ = std::move(s);
  }
  bool AtEnd() const { return pos_ == body_.size(); }
  size_t remaining() const { return body_.size() - pos_; }
  const Status& status() const { return status_; }

 private:
  std::span<const uint8_t> body_;
  size_t pos_ = 0;
  Status status_;
};

Status CheckStr(const std::string& s, const char* field, size_t max, bool required) {
  if (s.size() > max) {
    return InvalidArgumentError(std::string(field) + " is " + std::to_string(s.size()) +
                                " bytes; at most " + std::to_string(max) + " allowed");
  }
  if (required && s.empty()) return InvalidArgumentError(std::string(field) + " is empty");
  return Status::Ok();
}

// kAllReduceFrame reduces lossy frames in fp32: only sum and avg mean anything there.
Status CheckFrameOp(uint8_t op) {
  if (op == static_cast<uint8_t>(ReduceOp::kSum) || op == static_cast<uint8_t>(ReduceOp::kAvg)) {
    return Status::Ok();
  }
  const std::string name =
      IsValidReduceOp(op) ? ReduceOpName(static_cast<ReduceOp>(op)) : std::to_string(op);
  return InvalidArgumentError(
      "all-reduce-frame op " + name +
      " is not supported: a quantized frame is summed or averaged (sum, avg); send other "
      "reductions with all-reduce and a lossless codec");
}

}  // namespace

Message ReplyMessage(MessageType to, const Status& status) {
  Message m;
  m.type = MessageType::kReply;
  m.reply_to = to;
  m.code = status.code();
  m.text = status.message().substr(0, kMaxReplyTextBytes);
  return m;
}

std::optional<StatusCode> StatusCodeFromWire(uint64_t raw) noexcept {
  if (raw > static_cast<uint64_t>(kHighestStatusCode)) return std::nullopt;
  return static_cast<StatusCode>(raw);
}

bool IsRequestType(uint8_t raw) noexcept {
  return (raw >= static_cast<uint8_t>(MessageType::kHello) &&
          raw <= static_cast<uint8_t>(MessageType::kRegionAllReduceShm));
}

bool IsMessageType(uint8_t raw) noexcept {
  return IsRequestType(raw) || raw == static_cast<uint8_t>(MessageType::kReply);
}

const char* MessageTypeName(MessageType type) noexcept {
  switch (type) {
    case MessageType::kHello: return "hello";
    case MessageType::kRegisterJob: return "register-job";
    case MessageType::kAllReduce: return "all-reduce";
    case MessageType::kRegionAllReduce: return "region-all-reduce";
    case MessageType::kAllReduceFrame: return "all-reduce-frame";
    case MessageType::kJoinJob: return "join-job";
    case MessageType::kFetchResult: return "fetch-result";
    case MessageType::kAttachShm: return "attach-shm";
    case MessageType::kAllReduceShm: return "all-reduce-shm";
    case MessageType::kRegionAllReduceShm: return "region-all-reduce-shm";
    case MessageType::kStats: return "stats";
    case MessageType::kReply: return "reply";
    case MessageType::kTunnelListen: return "tunnel-listen";
    case MessageType::kTunnelConnect: return "tunnel-connect";
    case MessageType::kTunnelAccept: return "tunnel-accept";
    case MessageType::kTunnelData: return "tunnel-data";
    case MessageType::kTunnelClose: return "tunnel-close";
  }
  return "invalid";
}

namespace {

// EncodeMessage (data = &m.data) and EncodeMessageHead (data = nullptr: `data_size` bytes follow
// the head, written by the caller).
StatusOr<std::vector<uint8_t>> Encode(const Message& m, const std::vector<uint8_t>* data,
                                      size_t data_size, uint32_t max_message_bytes) {
  Writer w;
  bool carries_data = false;
  w.U32(0);  // length, filled in below
  w.U8(static_cast<uint8_t>(m.type));
  switch (m.type) {
    case MessageType::kHello:
      STRAIT_RETURN_IF_ERROR(CheckStr(m.client_name, "client name", kMaxNameBytes, false));
      w.U32(m.magic);
      w.U16(m.version);
      w.Str(m.client_name);
      if (m.client_shard != kAnyShard) w.U32(m.client_shard);
      break;
    case MessageType::kRegisterJob:
      STRAIT_RETURN_IF_ERROR(CheckStr(m.job, "job id", kMaxNameBytes, true));
      STRAIT_RETURN_IF_ERROR(CheckStr(m.policy, "policy", kMaxPolicyBytes, false));
      w.Str(m.job);
      w.Str(m.policy);
      break;
    case MessageType::kRegionAllReduce:  // the same fields
    case MessageType::kAllReduceShm:     // the same fields and an offset, no data
    case MessageType::kRegionAllReduceShm:
    case MessageType::kAllReduce: {
      STRAIT_RETURN_IF_ERROR(CheckStr(m.job, "job id", kMaxNameBytes, true));
      STRAIT_RETURN_IF_ERROR(CheckStr(m.tensor_key, "tensor key", kMaxNameBytes, true));
      const size_t elem = DataTypeSize(m.dtype);
      const bool shm = InSharedRegion(m.type);
      if (shm && (elem == 0 || m.count > kMaxShmBytes / elem)) {
        return InvalidArgumentError("all-reduce-shm of " + std::to_string(m.count) +
                                    " elements is larger than a shared region may be");
      }
      if (!shm && (elem == 0 || m.count > data_size / elem || m.count * elem != data_size)) {
        return InvalidArgumentError("all-reduce data is " + std::to_string(data_size) +
                                    " bytes; count " + std::to_string(m.count) + " of " +
                                    DataTypeName(m.dtype) + " needs count x element size");
      }
      w.Str(m.job);
      w.Str(m.tensor_key);
      w.U8(static_cast<uint8_t>(m.dtype));
      w.U8(static_cast<uint8_t>(m.op));
      w.U64(m.count);
      w.U32(m.timeout_ms);
      w.U64(m.generation);
      w.U64(m.sequence);
      w.U64(m.scope);
      if (shm) w.U64(m.shm_offset);
      carries_data = !shm;
      break;
    }
    case MessageType::kAttachShm:
      w.U64(m.shm_bytes);
      break;
    case MessageType::kAllReduceFrame:
      STRAIT_RETURN_IF_ERROR(CheckStr(m.job, "job id", kMaxNameBytes, true));
      STRAIT_RETURN_IF_ERROR(CheckStr(m.tensor_key, "tensor key", kMaxNameBytes, true));
      STRAIT_RETURN_IF_ERROR(CheckFrameOp(static_cast<uint8_t>(m.op)));
      w.Str(m.job);
      w.Str(m.tensor_key);
      w.U8(static_cast<uint8_t>(m.op));
      w.U32(m.timeout_ms);
      w.U64(m.generation);
      w.U64(m.sequence);
      w.U64(m.scope);
      carries_data = true;
      break;
    case MessageType::kJoinJob:
      STRAIT_RETURN_IF_ERROR(CheckStr(m.job, "job id", kMaxNameBytes, true));
      w.Str(m.job);
      w.U64(m.scope);
      w.U32(m.timeout_ms);
      w.U64(m.resume);
      break;
    case MessageType::kFetchResult:
      STRAIT_RETURN_IF_ERROR(CheckStr(m.job, "job id", kMaxNameBytes, true));
      w.Str(m.job);
      w.U64(m.scope);
      w.U64(m.generation);
      w.U64(m.sequence);
      w.U32(m.timeout_ms);
      break;
    case MessageType::kStats:
      break;
    case MessageType::kTunnelListen:
      break;
    case MessageType::kTunnelConnect:
      STRAIT_RETURN_IF_ERROR(CheckStr(m.tunnel_region, "tunnel region", kMaxNameBytes, true));
      w.Str(m.tunnel_region);
      w.U32(m.tunnel_shard);
      w.U64(m.listen_id);
      w.U32(m.timeout_ms);
      break;
    case MessageType::kTunnelAccept:
      w.U64(m.tunnel_id);
      break;
    case MessageType::kTunnelData:
      w.U32(m.tag);
      carries_data = true;
      break;
    case MessageType::kTunnelClose:
      STRAIT_RETURN_IF_ERROR(CheckStr(m.text, "close reason", kMaxReplyTextBytes, false));
      w.U32(static_cast<uint32_t>(m.code));
      w.Str(m.text);
      break;
    case MessageType::kReply:
      STRAIT_RETURN_IF_ERROR(CheckStr(m.text, "reply message", kMaxReplyTextBytes, false));
      w.U8(static_cast<uint8_t>(m.reply_to));
      w.U32(static_cast<uint32_t>(m.code));
      w.Str(m.text);
      carries_data = true;
      break;
    default:
      return InvalidArgumentError("unknown local message type " +
                                  std::to_string(static_cast<int>(m.type)));
  }
  if (!carries_data && data == nullptr && data_size > 0) {
    return InvalidArgumentError(std::string("a ") + MessageTypeName(m.type) +
                                " message carries no data, but " + std::to_string(data_size) +
                                " data bytes were to follow it");
  }
  if (!carries_data) data_size = 0;  // EncodeMessage ignores the data of such types
  std::vector<uint8_t>& out = w.out();
  const size_t body = out.size() - kFrameLengthBytes + data_size;
  if (body > max_message_bytes) {
    return ResourceExhaustedError("local message of " + std::to_string(body) +
                                  " bytes exceeds the limit of " +
                                  std::to_string(max_message_bytes) +
                                  " bytes; split the tensor into smaller all-reduces");
  }
  // The frame length, whose 4 bytes U32(0) reserved; body <= max_message_bytes fits them.
  static_assert(kFrameLengthBytes == 4);
  PutU32(out.data(), static_cast<uint32_t>(body));
  if (carries_data && data != nullptr) w.Bytes(*data);
  return std::move(out);
}

// DecodeMessage into `m`, a fresh Message whose data buffer may hold capacity to reuse.
Status DecodeInto(std::span<const uint8_t> body, uint32_t max_message_bytes, Message& m) {
  if (body.size() > max_message_bytes) {
    return ResourceExhaustedError("local message of " + std::to_string(body.size()) +
                                  " bytes exceeds the limit of " +
                                  std::to_string(max_message_bytes));
  }
  Reader r(body);
  const uint8_t type = static_cast<uint8_t>(r.Le(1, "type"));
  if (!r.status().ok()) return r.status();
  if (!IsMessageType(type)) {
    return InvalidArgumentError("unknown local message type " + std::to_string(type) +
                                "; this gateway speaks version " +
                                std::to_string(kLocalVersion));
  }
  m.type = static_cast<MessageType>(type);
  switch (m.type) {
    case MessageType::kHello:
      m.magic = static_cast<uint32_t>(r.Le(4, "magic"));
      m.version = static_cast<uint16_t>(r.Le(2, "version"));
      if (r.status().ok() && m.magic != kLocalMagic) {
        return DataLossError("not a Strait local-protocol hello (bad magic)");
      }
      if (r.status().ok() && m.version != kLocalVersion) {
        return UnimplementedError("local protocol version " + std::to_string(m.version) +
                                  " is not supported; this gateway speaks version " +
                                  std::to_string(kLocalVersion));
      }
      m.client_name = r.Str("client name", kMaxNameBytes, false);
      if (r.status().ok() && !r.AtEnd()) {
        m.client_shard = static_cast<uint32_t>(r.Le(4, "shard"));
        if (r.status().ok() && m.client_shard == kAnyShard) {
          return InvalidArgumentError("hello names shard " + std::to_string(kAnyShard) +
                                      "; allowed: a shard index, or no shard field");
        }
      }
      break;
    case MessageType::kRegisterJob:
      m.job = r.Str("job", kMaxNameBytes, true);
      m.policy = r.Str("policy", kMaxPolicyBytes, false);
      break;
    case MessageType::kRegionAllReduce:  // the same fields
    case MessageType::kAllReduceShm:     // the same fields and an offset, no data
    case MessageType::kRegionAllReduceShm:
    case MessageType::kAllReduce: {
      const bool shm = InSharedRegion(m.type);
      m.job = r.Str("job", kMaxNameBytes, true);
      m.tensor_key = r.Str("tensor key", kMaxNameBytes, true);
      const uint8_t dtype = static_cast<uint8_t>(r.Le(1, "dtype"));
      const uint8_t op = static_cast<uint8_t>(r.Le(1, "op"));
      m.count = r.Le(8, "count");
      m.timeout_ms = static_cast<uint32_t>(r.Le(4, "timeout_ms"));
      m.generation = r.Le(8, "generation");
      m.sequence = r.Le(8, "sequence");
      m.scope = r.Le(8, "scope");
      if (shm) m.shm_offset = r.Le(8, "offset");
      if (!r.status().ok()) break;
      const std::string name = MessageTypeName(m.type);
      if (!IsValidDataType(dtype)) {
        return InvalidArgumentError(name + " dtype " + std::to_string(dtype) +
                                    " is not a known data type");
      }
      if (!IsValidReduceOp(op)) {
        return InvalidArgumentError(name + " op " + std::to_string(op) +
                                    " is not a known reduction (sum, prod, max, min, avg)");
      }
      m.dtype = static_cast<DataType>(dtype);
      m.op = static_cast<ReduceOp>(op);
      const size_t elem = DataTypeSize(m.dtype);
      if (shm) {
        if (m.count > kMaxShmBytes / elem) {
          return InvalidArgumentError(name + " of " + std::to_string(m.count) + " " +
                                      DataTypeName(m.dtype) +
                                      " elements is larger than a shared region may be");
        }
        break;  // trailing bytes are refused below
      }
      if (m.count > r.remaining() / elem || m.count * elem != r.remaining()) {
        return InvalidArgumentError(name + " of " + std::to_string(m.count) + " " +
                                    DataTypeName(m.dtype) + " elements carries " +
                                    std::to_string(r.remaining()) + " data bytes; needs " +
                                    "count x " + std::to_string(elem));
      }
      r.RestInto(&m.data);
      break;
    }
    case MessageType::kAttachShm:
      m.shm_bytes = r.Le(8, "bytes");
      break;
    case MessageType::kAllReduceFrame: {
      m.job = r.Str("job", kMaxNameBytes, true);
      m.tensor_key = r.Str("tensor key", kMaxNameBytes, true);
      const uint8_t op = static_cast<uint8_t>(r.Le(1, "op"));
      m.timeout_ms = static_cast<uint32_t>(r.Le(4, "timeout_ms"));
      m.generation = r.Le(8, "generation");
      m.sequence = r.Le(8, "sequence");
      m.scope = r.Le(8, "scope");
      if (!r.status().ok()) break;
      STRAIT_RETURN_IF_ERROR(CheckFrameOp(op));
      m.op = static_cast<ReduceOp>(op);
      // The frame itself is checked by the gateway (InspectFrame), which names what is wrong.
      r.RestInto(&m.data);
      break;
    }
    case MessageType::kJoinJob:
      m.job = r.Str("job", kMaxNameBytes, true);
      m.scope = r.Le(8, "scope");
      m.timeout_ms = static_cast<uint32_t>(r.Le(4, "timeout_ms"));
      m.resume = r.Le(8, "resume");
      break;
    case MessageType::kFetchResult:
      m.job = r.Str("job", kMaxNameBytes, true);
      m.scope = r.Le(8, "scope");
      m.generation = r.Le(8, "generation");
      m.sequence = r.Le(8, "sequence");
      m.timeout_ms = static_cast<uint32_t>(r.Le(4, "timeout_ms"));
      break;
    case MessageType::kStats:
    case MessageType::kTunnelListen:
      break;
    case MessageType::kTunnelConnect:
      m.tunnel_region = r.Str("tunnel region", kMaxNameBytes, true);
      m.tunnel_shard = static_cast<uint32_t>(r.Le(4, "tunnel shard"));
      m.listen_id = r.Le(8, "listen id");
      m.timeout_ms = static_cast<uint32_t>(r.Le(4, "timeout_ms"));
      break;
    case MessageType::kTunnelAccept:
      m.tunnel_id = r.Le(8, "tunnel id");
      break;
    case MessageType::kTunnelData:
      m.tag = static_cast<uint32_t>(r.Le(4, "tag"));
      if (r.status().ok()) r.RestInto(&m.data);
      break;
    case MessageType::kTunnelClose: {
      const uint32_t code = static_cast<uint32_t>(r.Le(4, "status code"));
      if (!r.status().ok()) break;
      const std::optional<StatusCode> known = StatusCodeFromWire(code);
      if (!known.has_value()) {
        return InvalidArgumentError("tunnel close carries unknown status code " +
                                    std::to_string(code));
      }
      m.code = *known;
      m.text = r.Str("close reason", kMaxReplyTextBytes, false);
      break;
    }
    case MessageType::kReply: {
      const uint8_t to = static_cast<uint8_t>(r.Le(1, "reply type"));
      const uint32_t code = static_cast<uint32_t>(r.Le(4, "status code"));
      if (!r.status().ok()) break;
      if (!IsRequestType(to)) {
        return InvalidArgumentError("reply to unknown request type " + std::to_string(to));
      }
      const std::optional<StatusCode> known = StatusCodeFromWire(code);
      if (!known.has_value()) {
        return InvalidArgumentError("reply carries unknown status code " + std::to_string(code));
      }
      m.reply_to = static_cast<MessageType>(to);
      m.code = *known;
      m.text = r.Str("reply message", kMaxReplyTextBytes, false);
      if (r.status().ok()) r.RestInto(&m.data);
      break;
    }
  }
  if (!r.status().ok()) return r.status();
  if (!r.AtEnd()) {
    return InvalidArgumentError(std::to_string(r.remaining()) + " trailing bytes after a " +
                                MessageTypeName(m.type) + " message");
  }
  return Status::Ok();
}

}  // namespace

StatusOr<std::vector<uint8_t>> EncodeMessage(const Message& m, uint32_t max_message_bytes) {
  return Encode(m, &m.data, m.data.size(), max_message_bytes);
}

StatusOr<std::vector<uint8_t>> EncodeMessageHead(const Message& m, size_t data_size,
                                                 uint32_t max_message_bytes) {
  return Encode(m, nullptr, data_size, max_message_bytes);
}

StatusOr<Message> DecodeMessage(std::span<const uint8_t> body, uint32_t max_message_bytes) {
  Message m;
  STRAIT_RETURN_IF_ERROR(DecodeInto(body, max_message_bytes, m));
  return m;
}

Status DecodeMessageInto(std::span<const uint8_t> body, Message* out,
                         uint32_t max_message_bytes) {
  std::vector<uint8_t> keep = std::move(out->data);
  keep.clear();
  *out = Message{};
  out->data = std::move(keep);
  return DecodeInto(body, max_message_bytes, *out);
}

void EncodeTunnelDataHead(uint32_t tag, size_t data_size, uint8_t out[kTunnelDataHeadBytes]) {
  PutU32(out, static_cast<uint32_t>(kTunnelDataOverhead + data_size));
  out[kFrameLengthBytes] = static_cast<uint8_t>(MessageType::kTunnelData);
  PutU32(out + kFrameLengthBytes + 1, tag);
}

std::vector<uint8_t> EncodeTunnelEvent(const TunnelEvent& event) {
  Writer w;
  w.U8(static_cast<uint8_t>(event.kind));
  w.U64(event.id);
  w.U32(event.shard);
  w.Str(event.region.substr(0, kMaxNameBytes));
  return std::move(w.out());
}

StatusOr<TunnelEvent> DecodeTunnelEvent(std::span<const uint8_t> data) {
  Reader r(data);
  TunnelEvent e;
  const uint8_t kind = static_cast<uint8_t>(r.Le(1, "event kind"));
  e.id = r.Le(8, "event id");
  e.shard = static_cast<uint32_t>(r.Le(4, "event shard"));
  e.region = r.Str("event region", kMaxNameBytes, false);
  if (!r.status().ok()) return r.status();
  if (kind != static_cast<uint8_t>(TunnelEventKind::kListening) &&
      kind != static_cast<uint8_t>(TunnelEventKind::kIncoming)) {
    return InvalidArgumentError("unknown tunnel event kind " + std::to_string(kind) +
                                " (1 = listening, 2 = incoming)");
  }
  e.kind = static_cast<TunnelEventKind>(kind);
  if (!r.AtEnd()) {
    return InvalidArgumentError(std::to_string(r.remaining()) +
                                " trailing bytes after a tunnel event");
  }
  return e;
}

}  // namespace strait::localproto

// Encoding and validation of the listen handle and the connection wire messages.
#include "plugins/nccl/handle.h"

#include <algorithm>
#include <cstring>
#include <span>
#include <stdexcept>

#include "common/endian.h"
#include "common/hash.h"

namespace strait::nccl {
namespace {

constexpr size_t kChecksumOffset = kListenChecksumOffset;
constexpr uint8_t kFlagTunnel = 0x01;

}  // namespace

Status EncodeHandle(const ListenHandle& h, void* out) {
  if (h.region.size() > 63) return InvalidArgumentError("region name longer than 63 bytes");
  unsigned char* p = static_cast<unsigned char*>(out);
  std::memset(p, 0, kHandleSize);
  PutU32(p, kHandleMagic);
  PutU16(p + 4, kHandleVersion);
  p[7] = static_cast<unsigned char>(h.region.size());
  PutU64(p + 8, h.nonce);
  if (h.addr.ss_family == AF_INET) {
    const auto* a = reinterpret_cast<const sockaddr_in*>(&h.addr);
    p[6] = 4;
    std::memcpy(p + 16, &a->sin_addr, 4);
    PutU16(p + 32, ntohs(a->sin_port));
  } else if (h.addr.ss_family == AF_INET6) {
    const auto* a = reinterpret_cast<const sockaddr_in6*>(&h.addr);
    p[6] = 6;
    std::memcpy(p + 16, &a->sin6_addr, 16);
    PutU16(p + 32, ntohs(a->sin6_port));
  } else {
    return InvalidArgumentError("listen address is neither IPv4 nor IPv6");
  }
  std::memcpy(p + 36, h.region.data(), h.region.size());
  if (h.tunnel) {
    if (h.region.empty()) return InvalidArgumentError("a tunnel listen needs the gateway's region");
    p[34] = kFlagTunnel;
    PutU32(p + 100, h.gateway_shard);
    PutU64(p + 104, h.listen_id);
  }
  PutU32(p + kChecksumOffset, Fnv1a32(p, kChecksumOffset));
  return Status::Ok();
}

StatusOr<ListenHandle> DecodeHandle(const void* in) {
  const unsigned char* p = static_cast<const unsigned char*>(in);
  constexpr const char* kWhat =
      "; the handle did not come from a Strait listen() (another plugin's, or corrupted in "
      "transit): make every rank load the same NCCL_NET_PLUGIN";
  if (GetU32(p) != kHandleMagic)
    return InvalidArgumentError("listen handle has a bad magic" + std::string(kWhat));
  const uint16_t version = GetU16(p + 4);
  if (version != kHandleVersion) {
    return InvalidArgumentError("listen handle has version " + std::to_string(version) +
                                ", this plugin reads version " + std::to_string(kHandleVersion) +
                                ": run the same libnccl-net-strait.so version on every rank");
  }
  if (GetU32(p + kChecksumOffset) != Fnv1a32(p, kChecksumOffset)) {
    return InvalidArgumentError("listen handle checksum mismatch" + std::string(kWhat));
  }
  ListenHandle h;
  const unsigned region_len = p[7];
  if (region_len > 63)
    return InvalidArgumentError("listen handle region length > 63" + std::string(kWhat));
  h.nonce = GetU64(p + 8);
  const uint16_t port = GetU16(p + 32);
  if (port == 0) return InvalidArgumentError("listen handle has port 0" + std::string(kWhat));
  if (p[6] == 4) {
    auto* a = reinterpret_cast<sockaddr_in*>(&h.addr);
    a->sin_family = AF_INET;
    std::memcpy(&a->sin_addr, p + 16, 4);
    a->sin_port = htons(port);
  } else if (p[6] == 6) {
    auto* a = reinterpret_cast<sockaddr_in6*>(&h.addr);
    a->sin6_family = AF_INET6;
    std::memcpy(&a->sin6_addr, p + 16, 16);
    a->sin6_port = htons(port);
  } else {
    return InvalidArgumentError("listen handle has an unknown address family" + std::string(kWhat));
  }
  h.region.assign(reinterpret_cast<const char*>(p + 36), region_len);
  if ((p[34] & ~kFlagTunnel) != 0) {
    return InvalidArgumentError("listen handle has unknown flags" + std::string(kWhat));
  }
  h.tunnel = (p[34] & kFlagTunnel) != 0;
  if (h.tunnel) {
    if (h.region.empty())
      return InvalidArgumentError("listen handle has a tunnel but no region" + std::string(kWhat));
    h.gateway_shard = GetU32(p + 100);
    h.listen_id = GetU64(p + 104);
  }
  return h;
}

uint64_t ReadScratch(const void* handle) {
  return GetU64(static_cast<const unsigned char*>(handle) + kHandleScratchOffset);
}
void WriteScratch(void* handle, uint64_t value) {
  PutU64(static_cast<unsigned char*>(handle) + kHandleScratchOffset, value);
}

void EncodeHello(const Hello& h, unsigned char out[kHelloSize]) {
  std::memset(out, 0, kHelloSize);
  PutU32(out, kHelloMagic);
  PutU16(out + 4, kWireVersion);
  PutU16(out + 6, h.socket_index);
  PutU16(out + 8, h.socket_count);
  PutU64(out + 16, h.nonce);
  PutU64(out + 24, h.connection_id);
}

StatusOr<Hello> DecodeHello(const unsigned char in[kHelloSize], ReplyStatus* why) {
  if (GetU32(in) != kHelloMagic) {
    *why = ReplyStatus::kBadHello;
    return InvalidArgumentError("connection hello has a bad magic (not a Strait plugin peer)");
  }
  if (GetU16(in + 4) != kWireVersion) {
    *why = ReplyStatus::kUnsupportedVersion;
    return InvalidArgumentError("connection hello has unsupported version " +
                                std::to_string(GetU16(in + 4)));
  }
  Hello h;
  h.socket_index = GetU16(in + 6);
  h.socket_count = GetU16(in + 8);
  h.nonce = GetU64(in + 16);
  h.connection_id = GetU64(in + 24);
  if (h.socket_count == 0 || h.socket_count > 16 || h.socket_index >= h.socket_count) {
    *why = ReplyStatus::kBadHello;
    return InvalidArgumentError("connection hello has socket " + std::to_string(h.socket_index) +
                                " of " + std::to_string(h.socket_count));
  }
  return h;
}

void EncodeReply(ReplyStatus status, unsigned char out[kReplySize]) {
  PutU32(out, kReplyMagic);
  PutU32(out + 4, static_cast<uint32_t>(status));
}

StatusOr<ReplyStatus> DecodeReply(const unsigned char in[kReplySize]) {
  if (GetU32(in) != kReplyMagic) {
    return UnavailableError("the listener answered with a bad magic (not a Strait plugin)");
  }
  const uint32_t s = GetU32(in + 4);
  if (s > 3)
    return UnavailableError("the listener answered with unknown status " + std::to_string(s));
  return static_cast<ReplyStatus>(s);
}

void EncodeChunkHeader(const ChunkHeader& h, unsigned char out[kChunkHeaderSize]) {
  PutU64(out, h.seq);
  PutU64(out + 8, h.message_size);
  PutU64(out + 16, h.offset);
  PutU32(out + 24, h.length);
  PutU32(out + 28, static_cast<uint32_t>(h.tag));
}

ChunkHeader DecodeChunkHeader(const unsigned char in[kChunkHeaderSize]) {
  ChunkHeader h;
  h.seq = GetU64(in);
  h.message_size = GetU64(in + 8);
  h.offset = GetU64(in + 16);
  h.length = GetU32(in + 24);
  h.tag = static_cast<int32_t>(GetU32(in + 28));
  return h;
}

// ---- straitd's local protocol ----

namespace {

// The whole frame of a message whose fields the callers keep within the protocol's limits, so
// that encoding cannot fail (a failure is a programmer error; the C boundary catches it).
std::vector<unsigned char> Frame(const localproto::Message& m) {
  StatusOr<std::vector<uint8_t>> frame = localproto::EncodeMessage(m);
  if (!frame.ok()) throw std::logic_error("local frame: " + frame.status().ToString());
  return std::move(*frame);
}

localproto::Message Request(LocalType type) {
  localproto::Message m;
  m.type = type;
  return m;
}

StatusOr<LocalReply> DecodeOf(LocalType type, const unsigned char* body, size_t size) {
  StatusOr<localproto::Message> m = localproto::DecodeMessage(std::span(body, size));
  if (!m.ok()) return m.status().WithContext("bad frame from the gateway");
  if (m->type != type) {
    return InvalidArgumentError(std::string("the gateway sent a ") +
                                localproto::MessageTypeName(m->type) + " message where a " +
                                localproto::MessageTypeName(type) + " was due (protocol error)");
  }
  return m;
}

}  // namespace

std::vector<unsigned char> EncodeLocalHello(const std::string& client_name) {
  localproto::Message m = Request(LocalType::kHello);
  m.client_name = client_name;
  return Frame(m);
}

std::vector<unsigned char> EncodeTunnelListen() { return Frame(Request(LocalType::kTunnelListen)); }

std::vector<unsigned char> EncodeTunnelConnect(const std::string& region, uint32_t shard,
                                               uint64_t listen_id, uint32_t timeout_ms) {
  localproto::Message m = Request(LocalType::kTunnelConnect);
  m.tunnel_region = region;
  m.tunnel_shard = shard;
  m.listen_id = listen_id;
  m.timeout_ms = timeout_ms;
  return Frame(m);
}

std::vector<unsigned char> EncodeTunnelAccept(uint64_t tunnel_id) {
  localproto::Message m = Request(LocalType::kTunnelAccept);
  m.tunnel_id = tunnel_id;
  return Frame(m);
}

std::vector<unsigned char> EncodeTunnelClose(StatusCode code, const std::string& reason) {
  localproto::Message m = Request(LocalType::kTunnelClose);
  m.code = code;
  m.text = reason.substr(0, localproto::kMaxReplyTextBytes);
  return Frame(m);
}

void EncodeTunnelDataHead(const ChunkHeader& h, unsigned char out[kTunnelDataHead]) {
  localproto::EncodeTunnelDataHead(static_cast<uint32_t>(h.tag), kChunkHeaderSize + h.length, out);
  EncodeChunkHeader(h, out + localproto::kTunnelDataHeadBytes);
}

StatusOr<LocalReply> DecodeLocalReply(const unsigned char* body, size_t size) {
  return DecodeOf(LocalType::kReply, body, size);
}

StatusOr<LocalReply> DecodeTunnelClose(const unsigned char* body, size_t size) {
  return DecodeOf(LocalType::kTunnelClose, body, size);
}

}  // namespace strait::nccl

// The listen handle NCCL copies from a receiver to its sender (at most 128 bytes), the small
// wire messages that open a direct connection, and the few frames of straitd's local protocol the
// plugin speaks for cross-region tunnels. All are versioned wire formats: fields are little-endian
// at fixed offsets, and the version is checked before anything else is read.
//
// Listen handle, version 2 (offsets in bytes):
//    0 u32 magic "STRH"     4 u16 version (2)     6 u8 address family (4 or 6)   7 u8 region length
//    8 u64 listener nonce  16 16 bytes address   32 u16 port
//   34 u8 flags (bit 0: the listener also listens on its gateway's tunnel; the fields at 100 and
//      104 are valid and `region` is the gateway's region)   35 u8 reserved (0)
//   36 64 bytes region name (zero-padded)
//  100 u32 gateway shard index   104 u64 gateway listen id (kTunnelConnect's fields)
//  112 u32 checksum (FNV-1a of bytes 0-111)   116 u32 reserved (0)
//  120 u64 connector scratch: written by the *connecting* side into its own copy of the handle to
//      find its in-progress connection on the next connect() call (NCCL passes the same buffer
//      every retry); zero as produced by listen(). Not covered by the checksum.
// Version 1 (the first slice) had no tunnel fields and its checksum at 100; it is refused with a
// message saying to run one plugin version on every rank.
// A handle that fails any check (garbage, another plugin's, a future version) is rejected with an
// InvalidArgument that says which check failed.
//
// Socket hello (connector -> listener, once per socket, 32 bytes):
//    0 u32 magic "STRC"  4 u16 version (1)  6 u16 socket index  8 u16 socket count  10 u16 0
//   12 u32 reserved  16 u64 listener nonce (from the handle)  24 u64 connection id
// Hello reply (listener -> connector, once per socket, 8 bytes): u32 magic "STRA", u32 status
// (0 accepted, 1 unknown listener, 2 unsupported version, 3 bad hello).
// Data chunks (sender -> receiver), each a 32-byte header followed by `length` payload bytes:
//    0 u64 message index within its tag (the sender's k-th message with this tag: it fills the
//      receiver's k-th posted buffer with this tag)   8 u64 message size   16 u64 offset
//   24 u32 length   28 i32 tag
// Every message sends at least one chunk (a zero-byte message sends one with length 0).
//
// Through a gateway tunnel (straitd's local protocol, lib/localproto/protocol.h: a frame is u32
// body length + body, the body starts with a type byte) a chunk travels as one kTunnelData frame:
// body = u8 8, u32 tag, then the same 32-byte chunk header and its payload (kTunnelDataHead bytes
// precede the payload on the wire). So the receiver places tunnel chunks with the same code as
// TCP chunks. The frames come from strait::localproto, which the plugin links (it does not link
// the gateway library: no Asio, OpenSSL or toml in the plugin).
#ifndef STRAIT_PLUGINS_NCCL_HANDLE_H_
#define STRAIT_PLUGINS_NCCL_HANDLE_H_

#include <netinet/in.h>
#include <sys/socket.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "localproto/protocol.h"
#include "strait/status.h"

namespace strait::nccl {

constexpr uint32_t kHandleMagic = 0x48525453;  // "STRH" little-endian
constexpr uint16_t kHandleVersion = 2;
constexpr size_t kHandleSize = 128;
constexpr size_t kListenChecksumOffset = 112;
constexpr size_t kHandleScratchOffset = 120;
static_assert(kHandleScratchOffset + 8 <= kHandleSize, "the scratch must fit in the handle");
static_assert(kHandleSize <= 128, "NCCL_NET_HANDLE_MAXSIZE is 128 bytes");

struct ListenHandle {
  uint64_t nonce = 0;
  sockaddr_storage addr = {};  // address and port
  std::string region;          // empty: the listener's region is unknown
  // The gateway tunnel listen next to the TCP listener (STRAIT_GATEWAY set at the listener).
  bool tunnel = false;
  uint32_t gateway_shard = 0;
  uint64_t listen_id = 0;
};

// Writes `h` into `out` (kHandleSize bytes; the scratch is zeroed).
Status EncodeHandle(const ListenHandle& h, void* out);
// Reads and validates a handle.
StatusOr<ListenHandle> DecodeHandle(const void* in);

uint64_t ReadScratch(const void* handle);
void WriteScratch(void* handle, uint64_t value);

constexpr uint32_t kHelloMagic = 0x43525453;  // "STRC"
constexpr uint32_t kReplyMagic = 0x41525453;  // "STRA"
constexpr uint16_t kWireVersion = 1;
constexpr size_t kHelloSize = 32;
constexpr size_t kReplySize = 8;
constexpr size_t kChunkHeaderSize = 32;

enum class ReplyStatus : uint32_t {
  kAccepted = 0,
  kUnknownListener = 1,
  kUnsupportedVersion = 2,
  kBadHello = 3,
};

struct Hello {
  uint16_t socket_index = 0;
  uint16_t socket_count = 0;
  uint64_t nonce = 0;
  uint64_t connection_id = 0;
};
void EncodeHello(const Hello& h, unsigned char out[kHelloSize]);
// kUnsupportedVersion / kBadHello on failure.
StatusOr<Hello> DecodeHello(const unsigned char in[kHelloSize], ReplyStatus* why);

void EncodeReply(ReplyStatus status, unsigned char out[kReplySize]);
StatusOr<ReplyStatus> DecodeReply(const unsigned char in[kReplySize]);

struct ChunkHeader {
  uint64_t seq = 0;  // message index within its tag
  uint64_t message_size = 0;
  uint64_t offset = 0;
  uint32_t length = 0;
  int32_t tag = 0;
};
void EncodeChunkHeader(const ChunkHeader& h, unsigned char out[kChunkHeaderSize]);
ChunkHeader DecodeChunkHeader(const unsigned char in[kChunkHeaderSize]);

// ---- straitd's local protocol: the frames of the plugin's tunnels ----
// The protocol is localproto/protocol.h's (its one definition); these are the plugin's names for
// the few frames it speaks, as whole frames (length prefix included) in the plugin's byte type.
using LocalType = localproto::MessageType;
using LocalReply = localproto::Message;  // a decoded kReply or kTunnelClose
using localproto::TunnelEvent;
using localproto::TunnelEventKind;
// Frame prefix of a tunnel chunk: u32 body length, u8 kTunnelData, u32 tag, chunk header.
constexpr size_t kTunnelFramePrefix = localproto::kFrameLengthBytes + 1;  // length + type
constexpr size_t kTunnelDataHead = localproto::kTunnelDataHeadBytes + kChunkHeaderSize;
// Control frames (replies, close) the plugin accepts are at most this long (body).
constexpr uint32_t kMaxControlBody = localproto::kMaxControlBodyBytes;

std::vector<unsigned char> EncodeLocalHello(const std::string& client_name);
std::vector<unsigned char> EncodeTunnelListen();
std::vector<unsigned char> EncodeTunnelConnect(const std::string& region, uint32_t shard,
                                               uint64_t listen_id, uint32_t timeout_ms);
std::vector<unsigned char> EncodeTunnelAccept(uint64_t tunnel_id);
// `reason` is cut to the protocol's limit.
std::vector<unsigned char> EncodeTunnelClose(StatusCode code, const std::string& reason);
// The kTunnelDataHead bytes before a chunk's payload.
void EncodeTunnelDataHead(const ChunkHeader& h, unsigned char out[kTunnelDataHead]);

// A kReply body (without the length prefix): DecodeMessage's errors, and kInvalidArgument when
// it is not a reply.
StatusOr<LocalReply> DecodeLocalReply(const unsigned char* body, size_t size);
// A kTunnelClose body: the code and reason the gateway ended the tunnel with.
StatusOr<LocalReply> DecodeTunnelClose(const unsigned char* body, size_t size);
// The data of a kReply to kTunnelListen.
using localproto::DecodeTunnelEvent;

}  // namespace strait::nccl

#endif  // STRAIT_PLUGINS_NCCL_HANDLE_H_

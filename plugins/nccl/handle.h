// The listen handle NCCL copies from a receiver to its sender (at most 128 bytes), and the small
// wire messages that open a connection. Both are versioned wire formats: fields are little-endian
// at fixed offsets, and the version is checked before anything else is read.
//
// Listen handle, version 1 (offsets in bytes):
//    0 u32 magic "STRH"     4 u16 version (1)     6 u8 address family (4 or 6)   7 u8 region length
//    8 u64 listener nonce  16 16 bytes address   32 u16 port   34 u16 reserved (0)
//   36 64 bytes region name (zero-padded)        100 u32 checksum (FNV-1a of bytes 0-99)
//  104 u64 connector scratch: written by the *connecting* side into its own copy of the handle to
//      find its in-progress connection on the next connect() call (NCCL passes the same buffer
//      every retry); zero as produced by listen(). Not covered by the checksum.
//  112-127 reserved (0)
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
#ifndef STRAIT_PLUGINS_NCCL_HANDLE_H_
#define STRAIT_PLUGINS_NCCL_HANDLE_H_

#include <netinet/in.h>
#include <sys/socket.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "strait/status.h"

namespace strait::nccl {

constexpr uint32_t kHandleMagic = 0x48525453;  // "STRH" little-endian
constexpr uint16_t kHandleVersion = 1;
constexpr size_t kHandleSize = 128;
constexpr size_t kHandleScratchOffset = 104;

struct ListenHandle {
  uint64_t nonce = 0;
  sockaddr_storage addr = {};  // address and port
  std::string region;          // empty: the listener's region is unknown
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

}  // namespace strait::nccl

#endif  // STRAIT_PLUGINS_NCCL_HANDLE_H_

// The local protocol: how rank processes talk to their node's straitd over a Unix socket.
//
// Every message is a frame: a 4-byte little-endian body length (1..max_message_bytes) and the
// body. A body starts with one type byte; all integers are little-endian; a string is a 2-byte
// length and that many bytes; `data` runs to the end of the body.
//   kHello        u32 magic "STLP", u16 version, string client name      (first on a connection)
//   kRegisterJob  string job, string policy ("" = the gateway's default; see policy.h)
//   kAllReduce    string job, string tensor key, u8 dtype, u8 op, u64 count, u32 timeout_ms,
//                 data (count x dtype size bytes)
//   kStats        (nothing)
//   kReply        u8 type of the request answered, u32 StatusCode, string message, data
//                 (hello: nothing; register: the resolved policy text; all-reduce: the result;
//                  stats: a text report)
// Enum values are explicit and never renumbered; a new version adds types, never changes one.
// Decoding checks every length against the body and the limits below and never reads past it.
// Thread-safe: pure functions; the fd helpers block the calling thread up to their deadline.
#ifndef STRAIT_LIB_GATEWAY_LOCAL_PROTOCOL_H_
#define STRAIT_LIB_GATEWAY_LOCAL_PROTOCOL_H_

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "common/clock.h"
#include "strait/status.h"
#include "strait/types.h"

namespace strait::gateway {

inline constexpr uint32_t kLocalMagic = 0x504C5453;  // "STLP"
inline constexpr uint16_t kLocalVersion = 1;
inline constexpr size_t kFrameLengthBytes = 4;
// The default cap on one frame's body; a gateway may configure less, never more.
inline constexpr uint32_t kDefaultMaxMessageBytes = 256u << 20;
inline constexpr size_t kMaxNameBytes = 256;     // job ids, tensor keys, client names
inline constexpr size_t kMaxPolicyBytes = 256;
inline constexpr size_t kMaxReplyTextBytes = 16384;

enum class MessageType : uint8_t {
  kHello = 1,
  kRegisterJob = 2,
  kAllReduce = 3,
  kStats = 4,
  kReply = 128,
};
const char* MessageTypeName(MessageType type) noexcept;

// One decoded message; only the fields of its type are meaningful.
struct Message {
  MessageType type = MessageType::kHello;
  // kHello
  uint32_t magic = kLocalMagic;
  uint16_t version = kLocalVersion;
  std::string client_name;
  // kRegisterJob, kAllReduce
  std::string job;
  std::string policy;
  std::string tensor_key;
  DataType dtype = DataType::kFloat32;
  ReduceOp op = ReduceOp::kSum;
  uint64_t count = 0;
  uint32_t timeout_ms = 0;  // 0 = the gateway's allreduce.deadline
  // kReply
  MessageType reply_to = MessageType::kHello;
  StatusCode code = StatusCode::kOk;
  std::string text;
  // kAllReduce (the tensor) and kReply (the result or report)
  std::vector<uint8_t> data;
};

// The whole frame (length prefix + body). kInvalidArgument when a field breaks a limit (the
// message names it), so a client never sends what the gateway would refuse.
StatusOr<std::vector<uint8_t>> EncodeMessage(const Message& message,
                                             uint32_t max_message_bytes = kDefaultMaxMessageBytes);

// Decodes one body (without the length prefix). kDataLoss "truncated ..." when a field runs past
// the end, kInvalidArgument for a bad value (unknown type, dtype, op, wrong data length, trailing
// bytes), kResourceExhausted for a body over the limit, kUnimplemented for a hello of another
// version, each naming the field.
StatusOr<Message> DecodeMessage(std::span<const uint8_t> body,
                                uint32_t max_message_bytes = kDefaultMaxMessageBytes);

// Writes all of `bytes` to the socket by `deadline`. kDeadlineExceeded, or kUnavailable when the
// peer is gone.
Status WriteAll(int fd, std::span<const uint8_t> bytes, Deadline deadline);
// Reads one frame's body by `deadline`. kUnavailable "connection closed" on a clean EOF before
// the first byte, kDataLoss on EOF mid-frame, kResourceExhausted when the length prefix exceeds
// `max_message_bytes` (nothing more is read), kInvalidArgument for a zero length.
StatusOr<std::vector<uint8_t>> ReadFrame(int fd, uint32_t max_message_bytes, Deadline deadline);

}  // namespace strait::gateway

#endif  // STRAIT_LIB_GATEWAY_LOCAL_PROTOCOL_H_

// The wire format of one WAN stream: a hello in each direction, then typed records.
//
// Every stream of a link (TLS 1.3 by default, plain TCP only when configured) carries, after the
// TLS handshake, first a hello from the dialer, answered by a hello from the acceptor, then
// records in both directions until either side closes. All integers are little-endian.
//
// Hello (20 bytes fixed + region):
//   0  u32 magic          0x4C525453 ("STRL" in memory order)
//   4  u16 version        kWireVersion; a different value closes the stream (counted)
//   6  u16 flags          HelloFlag bits; a receiver ignores unknown bits. Dialer: kResume when
//                         this link had a stream up before (a redial of a known session).
//                         Acceptor: kUnknownSession when it has no such session for a
//                         kResume hello (it restarted and lost the link's state): it closes the
//                         stream and the dialer fails the link, whose sequence numbers and
//                         message ids the new process would not match. (Added within wire
//                         version 1 before any release; older peers send and ignore 0.)
//   8  u64 session id     chosen at random by the dialer per link; every stream of a link
//                         (and every redial) carries the same id, so that the acceptor joins them
//  16  u16 stream index   0..kMaxStreams-1: the slot this stream fills in the link's pool
//  18  u8  region length  1..kMaxRegionLength
//  19  u8  reserved       0
//  20  region             the sender's region name: [a-z0-9._-], as in its certificate
//
// Record header (8 bytes), followed by `length` bytes of body:
//   0  u8  type           RecordType below; unknown types close the stream
//   1  u8  flags          0
//   2  u16 reserved       0
//   4  u32 length         validated against the type's bound before the body is read
//
// Bodies:
//   kData (40 + payload): u64 seq, u32 channel, u32 reserved, u64 message id (per channel, from
//                         0), u64 message length, u64 offset of this chunk, payload bytes.
//                         A zero-length message is one chunk with no payload.
//   kAck  (16 + 16 n):    u64 cumulative (every seq below it was received), u16 n, u16 0,
//                         u32 0, then n ranges of u64 begin, u64 end: seqs [begin, end) above
//                         the cumulative point that were received too (selective acks).
//   kPing (8):            u64 sender's monotonic nanoseconds; answered by kPong echoing it.
//   kPong (8):            the echoed u64.
//   kClose (4):           u32 CloseReason: the sender closes the whole link and will not redial.
//   kRetire (0):          the sender takes this one stream out of the pool (the link shrinks):
//                         it cuts no new chunks onto it. The acceptor answers with its own
//                         kRetire once everything it wrote on the stream was acknowledged; the
//                         dialer then closes the stream, and neither side treats that as a
//                         failure. (Added within wire version 1 before any release; a peer that
//                         does not know it closes the stream, which the sender also tolerates.)
//
// Sequence numbers count chunks per link and direction from 0. The format is versioned by the
// hello; enum values are explicit and never renumbered (regions upgrade one at a time).
#ifndef STRAIT_LIB_NET_WIRE_H_
#define STRAIT_LIB_NET_WIRE_H_

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/endian.h"
#include "strait/status.h"

namespace strait::net {

inline constexpr uint32_t kWireMagic = 0x4C525453;  // "STRL"
inline constexpr uint16_t kWireVersion = 1;
inline constexpr size_t kHelloFixedBytes = 20;
inline constexpr size_t kMaxRegionLength = 63;
inline constexpr uint16_t kMaxStreams = 64;
inline constexpr size_t kRecordHeaderBytes = 8;
inline constexpr size_t kDataHeaderBytes = 40;
// The largest chunk payload a receiver accepts; senders never cut larger chunks.
inline constexpr uint32_t kMaxChunkPayload = 16u << 20;
inline constexpr uint16_t kMaxAckRanges = 128;

enum class RecordType : uint8_t {
  kData = 1,
  kAck = 2,
  kPing = 3,
  kPong = 4,
  kClose = 5,
  kRetire = 6,
};

enum class CloseReason : uint32_t {
  kNormal = 0,     // the link's owner closed it
  kShutdown = 1,   // the endpoint is shutting down
  kProtocol = 2,   // the peer violated the protocol
};

enum HelloFlag : uint16_t {
  kHelloResume = 0x1,
  kHelloUnknownSession = 0x2,
};

struct Hello {
  uint16_t version = kWireVersion;
  uint16_t flags = 0;  // HelloFlag bits
  uint64_t session_id = 0;
  uint16_t stream_index = 0;
  std::string region;
};

// Whether `region` is a valid region name (1..63 chars of [a-z0-9._-]).
bool IsValidRegionName(std::string_view region) noexcept;

// Encodes a hello (fixed part + region). The region must be valid.
std::vector<uint8_t> EncodeHello(const Hello& hello);

// What ParseHelloFixed found wrong: the caller counts garbage and version mismatches apart.
enum class HelloError { kNone, kBadMagic, kBadVersion, kBadField };

// Parses the 20 fixed bytes; on success fills everything but `region` and sets *region_length.
// On failure returns the kind in *error and a Status saying what was wrong.
Status ParseHelloFixed(std::span<const uint8_t> fixed, Hello* hello, size_t* region_length,
                       HelloError* error);

struct RecordHeader {
  RecordType type = RecordType::kData;
  uint32_t length = 0;
};

// Parses and validates a record header: the type must be known and the length within that
// type's bound (so a reader never allocates more than kDataHeaderBytes + kMaxChunkPayload).
Status ParseRecordHeader(std::span<const uint8_t> bytes, RecordHeader* header);
void EncodeRecordHeader(RecordType type, uint32_t length, uint8_t out[kRecordHeaderBytes]);

struct DataHeader {
  uint64_t seq = 0;
  uint32_t channel = 0;
  uint64_t message_id = 0;
  uint64_t message_length = 0;
  uint64_t offset = 0;
};

// Appends the record header and data header for a chunk of `payload_length` bytes to `out`.
void AppendDataRecordHeaders(const DataHeader& header, uint32_t payload_length,
                             std::vector<uint8_t>* out);
// Parses a data body's fixed part; checks offset + payload <= message length.
Status ParseDataHeader(std::span<const uint8_t> body, DataHeader* header);

struct AckRange {
  uint64_t begin = 0;
  uint64_t end = 0;  // exclusive
};
struct Ack {
  uint64_t cumulative = 0;
  std::vector<AckRange> ranges;
};
void AppendAckRecord(const Ack& ack, std::vector<uint8_t>* out);
// Validates ranges: begin < end, above the cumulative point, ascending, at most kMaxAckRanges.
Status ParseAck(std::span<const uint8_t> body, Ack* ack);

void AppendPingRecord(RecordType type, uint64_t stamp, std::vector<uint8_t>* out);
void AppendCloseRecord(CloseReason reason, std::vector<uint8_t>* out);
void AppendRetireRecord(std::vector<uint8_t>* out);

// The little-endian helpers (common/endian.h), also spelled net::PutU16 etc. for this module's
// code and tests.
using ::strait::GetU16;
using ::strait::GetU32;
using ::strait::GetU64;
using ::strait::PutU16;
using ::strait::PutU32;
using ::strait::PutU64;

}  // namespace strait::net

#endif  // STRAIT_LIB_NET_WIRE_H_

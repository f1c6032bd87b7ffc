// The local protocol: how rank processes talk to their node's straitd over a Unix socket.
//
// Every message is a frame: a 4-byte little-endian body length (1..max_message_bytes) and the
// body. A body starts with one type byte; all integers are little-endian; a string is a 2-byte
// length and that many bytes; `data` runs to the end of the body.
//   kHello        u32 magic "STLP", u16 version, string client name      (first on a connection)
//                 [, u32 shard]: optional, the shard index this client (a rank) uses; a gateway
//                 serving several shards (config `shards`) needs it and routes every later
//                 request of the connection to that shard; one serving a single shard accepts
//                 its own index or none. Another index is refused with kFailedPrecondition
//                 naming the shards served.
//   kRegisterJob  string job, string policy ("" = the gateway's default; see policy_grammar.h)
//   kAllReduce    string job, string tensor key, u8 dtype, u8 op, u64 count, u32 timeout_ms,
//                 u64 generation, u64 sequence, u64 scope, data (count x dtype size bytes)
//                 (generation, sequence, scope): the operation's identity (version 2; see "Operation
//                 identity" below); generation 0 is refused ("join the job first").
//   kStats        (nothing)
//   kRegionAllReduce (10) the fields of kAllReduce: the region all-reduce (CollNet mode): the
//                 gateways of the region reduce-scatter over the LAN, all-reduce their shards
//                 across regions, and all-gather (gateway.h); the reply is kAllReduce's
//   kAllReduceFrame (11) string job, string tensor key, u8 op (sum or avg only), u32 timeout_ms,
//                 u64 generation, u64 sequence, u64 scope, data = ONE codec frame (strait/codec.h: header and checksums included): the
//                 rank's contribution, already quantized by the rank (library mode: its GPU
//                 kernel or the CPU codec, with the rank's own error-feedback residual). Lossy
//                 codec (int8, int4, fp8), dtype float32/bfloat16/float16, any valid block size,
//                 not zstd-chained; the count and dtype come from the frame's header. The job's
//                 (agreed) policy must be fixed and give this codec for this tensor; otherwise
//                 kFailedPrecondition naming both. Every region's ranks must send frames of the
//                 same codec, block size and count for a key (a different block size never pairs:
//                 the operation fails by its deadline rather than mixing cuts).
//                 Reply data: ONE frame of the same codec and block size, dtype float32, the
//                 frame's count, flags 0 (kFrameFlagStochastic if the policy rounds
//                 stochastically), never zstd: the all-reduce result (sum, or avg = sum / number
//                 of regions) as the owners quantized it from their fp32 sums, with the owner
//                 error feedback the job's policy asks for. Decode it with Decoder::Decode into
//                 float32, bfloat16 or float16 (or the GPU dequantize kernel from its stage).
//                 Every rank of every region receives byte-identical frames. Tensors with fewer
//                 blocks than regions are reduced exactly in fp32 from the decoded frames and the
//                 result quantized (round to nearest) by each gateway alike, still identical.
//   kJoinJob (12) string job, u64 scope, u32 timeout_ms (0 = the gateway's allreduce.deadline),
//                 u64 resume (0 = unknown, else 1 + the all-reduces the rank's process completed
//                 for the job before: regions whose ranks resume at different steps are refused
//                 with kFailedPrecondition naming them, see generation.h):
//                 joins the next generation of (job, scope) -- scope 0 for a rank's comm, a
//                 comm id where one process runs several comms of a job at once (CollNet) -- with the gateways of every other region (the same shard
//                 index); blocks until all of them joined the same generation. Reply data: u64
//                 generation (>= 1). Every comm (host or GPU backend, CollNet) joins once when it
//                 is created and numbers its operations 0, 1, 2, ... within that generation.
//   kFetchResult (13) string job, u64 scope, u64 generation, u64 sequence, u32 timeout_ms:
//                 "Result recovery": the result of a step that the regions committed but whose
//                 reply this rank never read (its gateway was killed in between; ask the
//                 restarted one). Reply data: what that all-reduce's reply carried (the tensor,
//                 or the result frame); kNotFound when no region committed the step (it failed
//                 everywhere). Each gateway keeps the last committed step per (job, scope).
//   kAttachShm (14) u64 bytes, then (after the frame, as its own send) one byte carrying a
//                 memfd in SCM_RIGHTS: the connection's shared-memory region (see "Shared
//                 memory" below). Reply: no data. Attaching again replaces the region.
//   kAllReduceShm (15) the fields of kAllReduce, u64 offset, no data: kAllReduce on the
//                 count x dtype size bytes at `offset` of the connection's region, reduced in
//                 place there; the reply (kReply to kAllReduceShm) carries no data on success
//                 (its text as kAllReduce's) and the same refusal marker on error.
//   kRegionAllReduceShm (16) the fields of kAllReduceShm: kRegionAllReduce on the tensor in the
//                 connection's region, in place (the CollNet plugin's path).
//   Tunnels (see "Tunnels" below):
//   kTunnelListen  (nothing)
//   kTunnelConnect string region, u32 shard, u64 listen id, u32 timeout_ms (0 = 30 s)
//   kTunnelAccept  u64 tunnel id
//   kTunnelData    u32 tag, data (one message; 0 bytes is a message too)
//   kTunnelClose   u32 StatusCode, string reason
//   kReply        u8 type of the request answered, u32 StatusCode, string message, data
//                 (hello: nothing; register: the resolved policy text; all-reduce: the result,
//                  with the codecs used and the shard split as text, e.g. "int8 shards=400,300,300"
//                  (elements per owner region, in rank order); all-reduce-frame: the result
//                  frame, text as all-reduce's; stats: a text report)
// Enum values are explicit and never renumbered; a new version adds types, never changes one.
// Version 2 (this one) added kJoinJob and the (generation, sequence) fields of the all-reduces;
// a version-1 client's hello is refused with kUnimplemented naming both versions.
//
// Operation identity: an all-reduce is (job, scope, generation, sequence, tensor key, dtype, op, count;
// frames also codec and block size). The generation comes from kJoinJob, which every region's
// gateway of the shard agrees on (gateway/generation.h); the sequence is the comm's own counter.
// The gateways match contributions by that identity alone, so steps of different comms, or of
// different positions in one comm, can never be summed: two regions that disagree on a step's
// tensor key, dtype or count fail that step with kFailedPrecondition naming both identities, and
// a step of an old generation fails at once with kAborted once any region joined a newer one.
// An all-reduce's error reply carries one data byte 0 when the gateway refused the request before
// its step was used (not registered, another uid's job, a bad frame, shutting down): the comm may
// issue the same step again. Any other error reply (no data, or a byte 1) means the step failed
// in every region: the comm must join a new generation (localproto::Client does so by itself).
//
// Shared memory (shm.h): a rank may move its all-reduce tensors through a memfd it shares with
// straitd instead of the socket. It creates the memfd, seals it against shrinking
// (F_SEAL_SHRINK; a gateway refuses an unsealed one, or anything that is not a memfd, with
// kInvalidArgument), sends kAttachShm with the size and then the fd, and then issues
// kAllReduceShm descriptors. A descriptor that does not lie inside the region is refused
// (kInvalidArgument, refusal marker 0) before anything is read or written; kAllReduceShm on a
// connection without a region gets kFailedPrecondition "attach a shared region first". The
// region is the connection's alone and is unmapped when the connection closes (a killed rank's
// too). A gateway that refuses a region (an error reply to kAttachShm) leaves the connection
// usable: clients then keep using the socket. One that predates these types answers "unknown
// local message type 14" and loses the framing: use a library and straitd of one release (or
// turn shared memory off in the client, Client::UseSharedMemory).
//
// Tunnels: a point-to-point byte-message pipe between a rank here and a rank in another region,
// carried by the two regions' gateways that hold the same shard index (the NCCL plugin's
// cross-region connections). Every tunnel connection is a Unix connection of its own that
// starts with kHello like any other, then:
//   Listen (the receiving rank): send kTunnelListen. The connection now belongs to the listen:
//     the gateway answers with a kReply(reply_to kTunnelListen) whose data is a TunnelEvent of
//     kind kListening (listen id, this gateway's region and shard: what the rank publishes, e.g.
//     in its NCCL handle), then one more kReply(kTunnelListen, kOk) with a TunnelEvent of kind
//     kIncoming (tunnel id, connecting region) for every connect to that listen id. A reply with
//     another code ends the listen. Closing the connection ends the listen, and connects it
//     announced that are not yet accepted are refused (accept first, as NCCL does).
//   Accept: open a new connection, send kTunnelAccept(tunnel id from kIncoming). The reply
//     (kReply, kTunnelAccept; text = the connecting region) opens the tunnel, or says why not
//     (kNotFound: unknown or expired id; kPermissionDenied: another uid than the listener's).
//     An incoming tunnel not accepted within 30 s, or whose listen closed, is refused.
//   Connect (the sending rank, another region): open a new connection, send kTunnelConnect with
//     the listener's region, shard and listen id. The reply (kReply, kTunnelConnect) comes once
//     the listener accepted (data: u64 tunnel id), or when the open failed: kNotFound (no such
//     listen id there, or an unknown region), kDeadlineExceeded (no answer by timeout_ms: the
//     peer gateway or the listener is not there), kUnavailable (no link to that region, the link
//     failed, or the listen closed before accepting), kFailedPrecondition (the listener is behind
//     another shard index than this gateway's: a gateway links only to its own shard index in
//     other regions), kInvalidArgument (the region is the gateway's own).
//   Data: after an OK connect/accept reply the connection is a full-duplex pipe of kTunnelData
//     frames in both directions. Each frame is one message: boundaries, order and tags are kept
//     and nothing is lost or duplicated. The receiver must size its buffer from the frame length.
//   Close: either rank ends the tunnel by closing its connection (or sending kTunnelClose first,
//     e.g. with a reason); the gateway delivers everything sent before, then sends the other side
//     kTunnelClose and closes that connection. kTunnelClose from the gateway carries kOk when the
//     peer rank closed, or the error that ended the tunnel (kUnavailable: the peer gateway is
//     gone or restarted; kInvalidArgument: a bad frame on the pipe).
//   Flow control: the gateways keep a bounded window per tunnel direction; while it is full the
//     sending rank's gateway stops reading that connection, so a rank that writes faster than the
//     remote rank reads simply blocks in write (or sees EAGAIN). Read your pipe promptly.
//   A plugin drives all of this with non-blocking sockets: it never has to wait for one frame
//   before writing the next, except for the hello, listen/connect/accept replies.
// Decoding checks every length against the body and the limits below and never reads past it.
// Thread-safe: pure functions. Reading and writing frames on a socket: frame_io.h; the client:
// client.h; the compression-policy text a register-job carries: policy_grammar.h.
#ifndef STRAIT_LIB_LOCALPROTO_PROTOCOL_H_
#define STRAIT_LIB_LOCALPROTO_PROTOCOL_H_

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "strait/status.h"
#include "strait/types.h"

namespace strait::localproto {

inline constexpr uint32_t kLocalMagic = 0x504C5453;  // "STLP"
inline constexpr uint16_t kLocalVersion = 2;
inline constexpr size_t kFrameLengthBytes = 4;
// The default cap on one frame's body; a gateway may configure less, never more.
inline constexpr uint32_t kDefaultMaxMessageBytes = 256u << 20;
inline constexpr size_t kMaxNameBytes = 256;     // job ids, tensor keys, client names
// The largest shared region a gateway maps for one connection (kAttachShm), and so the largest
// tensor of one kAllReduceShm.
inline constexpr uint64_t kMaxShmBytes = uint64_t{1} << 30;
inline constexpr size_t kMaxPolicyBytes = 256;
inline constexpr size_t kMaxReplyTextBytes = 16384;
// A hello's client_shard when the client names no shard.
inline constexpr uint32_t kAnyShard = 0xFFFFFFFFu;

// The highest StatusCode a reply or a tunnel close may carry: a newer code from a newer peer is
// refused rather than guessed at. Every wire that carries a StatusCode (this protocol, the
// gateways' tunnel messages) checks it with StatusCodeFromWire.
inline constexpr StatusCode kHighestStatusCode = StatusCode::kDataLoss;
// The code a wire value names, or nothing when it is above kHighestStatusCode.
std::optional<StatusCode> StatusCodeFromWire(uint64_t raw) noexcept;

enum class MessageType : uint8_t {
  kHello = 1,
  kRegisterJob = 2,
  kAllReduce = 3,
  kStats = 4,
  kTunnelListen = 5,
  kTunnelConnect = 6,
  kTunnelAccept = 7,
  kTunnelData = 8,
  kTunnelClose = 9,
  kRegionAllReduce = 10,  // the fields of kAllReduce; hierarchical across the region's gateways
  kAllReduceFrame = 11,   // a pre-quantized codec frame in, the result frame out
  kJoinJob = 12,          // agree on the job's next generation (reply data: u64 generation)
  kFetchResult = 13,      // a committed step's result, from the other regions if need be
  kAttachShm = 14,        // a shared-memory region for the connection (its memfd follows)
  kAllReduceShm = 15,     // kAllReduce on a tensor in that region (a descriptor, no data)
  kRegionAllReduceShm = 16,  // kRegionAllReduce on a tensor in that region
  kReply = 128,
};
const char* MessageTypeName(MessageType type) noexcept;
// kAllReduceShm and kRegionAllReduceShm: the tensor lies in the connection's shared region.
constexpr bool InSharedRegion(MessageType type) noexcept {
  return type == MessageType::kAllReduceShm || type == MessageType::kRegionAllReduceShm;
}
// kRegionAllReduce in either form (the tensor on the socket or in the shared region).
constexpr bool IsRegionAllReduce(MessageType type) noexcept {
  return type == MessageType::kRegionAllReduce || type == MessageType::kRegionAllReduceShm;
}
// The type of the same operation with its tensor on the socket: how regions and the region's
// gateways pair an operation whatever path each rank's tensor took.
constexpr MessageType OnTheSocket(MessageType type) noexcept {
  return type == MessageType::kAllReduceShm         ? MessageType::kAllReduce
         : type == MessageType::kRegionAllReduceShm ? MessageType::kRegionAllReduce
                                                    : type;
}
// Whether `raw` is a type of this version: a request type (everything but kReply), or a message
// type at all.
bool IsRequestType(uint8_t raw) noexcept;
bool IsMessageType(uint8_t raw) noexcept;

// One decoded message; only the fields of its type are meaningful.
struct Message {
  MessageType type = MessageType::kHello;
  // kHello
  uint32_t magic = kLocalMagic;
  uint16_t version = kLocalVersion;
  std::string client_name;
  // kHello: the shard the client names, or kAnyShard when it names none (not sent). Later
  // requests of the connection carry it too, filled in by the gateway (not on the wire).
  uint32_t client_shard = kAnyShard;
  // kRegisterJob, kAllReduce
  std::string job;
  std::string policy;
  std::string tensor_key;
  DataType dtype = DataType::kFloat32;
  ReduceOp op = ReduceOp::kSum;
  uint64_t count = 0;
  uint32_t timeout_ms = 0;  // 0 = the gateway's allreduce.deadline
  // kAllReduce, kRegionAllReduce, kAllReduceFrame: the operation's identity within the job (see
  // "Operation identity"): the generation kJoinJob agreed, and the comm's own step counter.
  uint64_t generation = 0;
  uint64_t sequence = 0;
  uint64_t scope = 0;  // and kJoinJob: which of the job's comms (0 = a rank's one comm)
  uint64_t resume = 0;  // kJoinJob: 0 = unknown, else 1 + the steps the rank completed before
  uint64_t shm_bytes = 0;   // kAttachShm: the region's size
  uint64_t shm_offset = 0;  // kAllReduceShm: where the tensor starts in the region
  // Never on the wire: kAllReduceShm's tensor in the connection's region (count x dtype size
  // bytes at shm_offset), filled in by the gateway once the descriptor was checked; the
  // all-reduce reads its input there and writes its result there.
  std::span<uint8_t> shm_data;
  // kTunnelConnect (tunnel_region, tunnel_shard, listen_id, timeout_ms), kTunnelAccept
  // (tunnel_id), kTunnelData (tag, data); kTunnelClose uses code and text.
  std::string tunnel_region;
  uint32_t tunnel_shard = 0;
  uint64_t listen_id = 0;
  uint64_t tunnel_id = 0;
  uint32_t tag = 0;
  // Never on the wire: the uid of the client that sent the request (its connection's
  // SO_PEERCRED), filled in by the gateway before it handles the request; jobs belong to it.
  uint32_t client_uid = 0;
  // kReply
  MessageType reply_to = MessageType::kHello;
  StatusCode code = StatusCode::kOk;
  std::string text;
  // kAllReduce (the tensor), kAllReduceFrame (the codec frame; job, tensor_key, op and
  // timeout_ms as kAllReduce, dtype and count unused on the wire) and kReply (the result or
  // report)
  std::vector<uint8_t> data;
};

// A kReply to a request of type `to` carrying `status` (its text cut to kMaxReplyTextBytes) and
// no data yet.
Message ReplyMessage(MessageType to, const Status& status);

// The whole frame (length prefix + body). kInvalidArgument when a field breaks a limit (the
// message names it), so a client never sends what the gateway would refuse.
StatusOr<std::vector<uint8_t>> EncodeMessage(const Message& message,
                                             uint32_t max_message_bytes = kDefaultMaxMessageBytes);

// The frame's length prefix and every field before `data`, for a message whose data
// (`data_size` bytes; message.data is ignored) the caller writes right after it, e.g. straight
// from its own buffer: EncodeMessage without copying the data. Same checks and errors as
// EncodeMessage (the data size counts toward the limit and the all-reduce count check).
StatusOr<std::vector<uint8_t>> EncodeMessageHead(
    const Message& message, size_t data_size,
    uint32_t max_message_bytes = kDefaultMaxMessageBytes);

// Decodes one body (without the length prefix). kDataLoss "truncated ..." when a field runs past
// the end, kInvalidArgument for a bad value (unknown type, dtype, op, wrong data length, trailing
// bytes), kResourceExhausted for a body over the limit, kUnimplemented for a hello of another
// version, each naming the field.
StatusOr<Message> DecodeMessage(std::span<const uint8_t> body,
                                uint32_t max_message_bytes = kDefaultMaxMessageBytes);

// DecodeMessage into `*out`, reusing out->data's capacity: a connection that decodes many large
// requests into the same Message allocates (and page-faults) its data buffer once instead of
// per request. Every other field of `*out` is reset. On error `*out` is unspecified.
Status DecodeMessageInto(std::span<const uint8_t> body, Message* out,
                         uint32_t max_message_bytes = kDefaultMaxMessageBytes);

// What a listen connection's replies carry (kReply to kTunnelListen, in `data`):
//   u8 kind (1 = listening, 2 = incoming), u64 id (kListening: the listen id; kIncoming: the
//   tunnel id to accept), u32 shard (the gateway's shard index; 0 for kIncoming),
//   string region (kListening: the gateway's region; kIncoming: the connecting rank's region).
enum class TunnelEventKind : uint8_t { kListening = 1, kIncoming = 2 };
struct TunnelEvent {
  TunnelEventKind kind = TunnelEventKind::kListening;
  uint64_t id = 0;
  uint32_t shard = 0;
  std::string region;
};
std::vector<uint8_t> EncodeTunnelEvent(const TunnelEvent& event);
// kDataLoss for a short event, kInvalidArgument for an unknown kind or trailing bytes.
StatusOr<TunnelEvent> DecodeTunnelEvent(std::span<const uint8_t> data);
// Bytes a kTunnelData body spends before its data (type and tag).
inline constexpr size_t kTunnelDataOverhead = 5;
// A kTunnelData frame's bytes before its data: the length prefix, type and tag.
inline constexpr size_t kTunnelDataHeadBytes = kFrameLengthBytes + kTunnelDataOverhead;
// Writes those bytes for `data_size` bytes of data (the caller sends the data right after them):
// the hot path of a tunnel, without an allocation. data_size + kTunnelDataOverhead must fit the
// receiver's max_message_bytes.
void EncodeTunnelDataHead(uint32_t tag, size_t data_size, uint8_t out[kTunnelDataHeadBytes]);
// The largest control frame body (a reply without bulk data, a tunnel close) a client must take:
// the longest text plus room for the fields and a small data part such as a tunnel event.
inline constexpr uint32_t kMaxControlBodyBytes = 64 * 1024;

}  // namespace strait::localproto

#endif  // STRAIT_LIB_LOCALPROTO_PROTOCOL_H_

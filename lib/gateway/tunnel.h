// Cross-region point-to-point tunnels in straitd: what carries the NCCL plugin's connections
// between ranks of different regions. The local side of the protocol (kTunnelListen,
// kTunnelConnect, kTunnelAccept, kTunnelData, kTunnelClose) is in localproto/protocol.h; this file
// holds the WAN side (the tunnel wire format between two gateways), the lossless codec choice for
// the WAN hop, and TunnelService, the state machine the gateway runs.
//
// Route: a rank in region B asks its gateway (shard s) to connect to a listen id of region A; the
// gateway sends kOpen over its link to region A's gateway of the same shard index, which finds
// the listen, announces the tunnel to the listening rank and, once that rank accepts, answers
// kOpenOk. Then both gateways pump kData messages between the link and the two ranks' Unix
// connections. Everything of one tunnel travels on one link channel (TunnelChannel(id)), so the
// link's per-channel order keeps open, data and close in order; tunnels hash over the
// collective::kTunnelChannels range (collective/channels.h) so that a big message of one tunnel
// holds up few others.
//
// Wire message (link channel TunnelChannel(id)), little-endian:
//   off size field
//     0    1 version (kTunnelWireVersion = 1)
//     1    1 kind (TunnelWireKind)
//     2    1 codec (kData: CodecId of the payload; otherwise 0)
//     3    1 reserved, 0
//     4    4 tag (kData: the rank's message tag; otherwise 0)
//     8    8 tunnel id (chosen by the connecting side's gateway)
//    16    . by kind:
//            kOpen         u32 shard the connector addressed, u64 listen id, u64 window
//            kOpenOk       u64 window
//            kOpenRefused  u32 StatusCode, u16 length + reason
//            kClose        u32 StatusCode (kOk: the rank closed), u16 length + reason
//            kData         u64 raw size, payload (raw bytes, or a codec frame for kZstd)
//            kCredit       u64 bytes (the receiver wrote that much to its rank; see below)
//   Enum values are explicit and never renumbered; a gateway refuses a version it does not speak
//   by closing the tunnel with a reason.
//
// Flow control: each side announces a receive window (bytes); the sending gateway reads its
// rank's next message only while the bytes it sent and the peer has not yet credited back are
// below the peer's window (every message counts its raw size + kTunnelMessageCost). So a gateway
// holds at most window + one message per tunnel direction, and a slow reader makes the sending
// rank block in write instead of making a gateway buffer without limit.
//
// Threads: none of its own. Listens and tunnels run on the local server's event loop
// (local_server.h; TunnelService::Start), as state machines over the ranks' Unix connections: a
// tunnel reads its rank's next frame while the peer's window allows and writes the peer's next
// message while one is queued. WAN messages arrive on the endpoint's I/O thread (OnWanMessage),
// which only queues, sends and posts a kick to the loop, never blocks. A supervisor timer on the
// loop expires unaccepted tunnels, closes tunnels whose link failed or was replaced (the peer
// gateway restarted: its tunnel state is gone) and ends everything when the gateway stops. So an
// open tunnel costs its connection and buffers, not threads. The wire format and the codec live
// in tunnel.cc, the service in tunnel_service.cc.
#ifndef STRAIT_LIB_GATEWAY_TUNNEL_H_
#define STRAIT_LIB_GATEWAY_TUNNEL_H_

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <span>
#include <string>
#include <system_error>
#include <vector>

#include "collective/channels.h"
#include "localproto/frame_io.h"
#include "localproto/protocol.h"
#include "net/adapt.h"
#include "net/estimates.h"
#include "strait/codec.h"
#include "strait/status.h"

namespace asio {
class io_context;
}  // namespace asio

namespace strait::net {
class Link;
}  // namespace strait::net

namespace strait::gateway {

// The local protocol the tunnels serve (localproto/protocol.h).
using localproto::DecodeMessage;
using localproto::EncodeMessage;
using localproto::EncodeTunnelEvent;
using localproto::kDefaultMaxMessageBytes;
using localproto::kMaxReplyTextBytes;
using localproto::Message;
using localproto::MessageType;
using localproto::MessageTypeName;
using localproto::ReadFrame;
using localproto::TunnelEvent;
using localproto::TunnelEventKind;
using localproto::WriteAll;
using localproto::WriteMessage;

inline constexpr uint8_t kTunnelWireVersion = 1;
inline constexpr size_t kTunnelWireHeaderSize = 16;
// A kData message's bytes before its payload: the header and the u64 raw size.
inline constexpr size_t kTunnelDataPrefixSize = kTunnelWireHeaderSize + 8;
// Bookkeeping cost of one message in the flow-control window, so that empty messages count.
inline constexpr uint64_t kTunnelMessageCost = 64;

// The link channel of a tunnel: tunnel ids hash over collective::kTunnelChannels.
inline uint32_t TunnelChannel(uint64_t tunnel_id) {
  const collective::ChannelRange& r = collective::kTunnelChannels;
  return r.first + static_cast<uint32_t>(tunnel_id % r.count);
}

enum class TunnelWireKind : uint8_t {
  kOpen = 1,
  kOpenOk = 2,
  kOpenRefused = 3,
  kData = 4,
  kClose = 5,
  kCredit = 6,
};

// One decoded wire message; only the fields of its kind are meaningful.
struct TunnelWire {
  TunnelWireKind kind = TunnelWireKind::kData;
  uint64_t tunnel_id = 0;
  // kOpen
  uint32_t shard = 0;
  uint64_t listen_id = 0;
  // kOpen, kOpenOk: the receive window of the side that sends this message.
  uint64_t window = 0;
  // kOpenRefused, kClose
  StatusCode code = StatusCode::kOk;
  std::string text;
  // kData
  CodecId codec = CodecId::kNone;
  uint32_t tag = 0;
  uint64_t raw_size = 0;
  std::vector<uint8_t> payload;
  // kCredit
  uint64_t credit = 0;
};

// Encodes `wire` (texts are cut to kMaxReplyTextBytes). Pure.
std::vector<uint8_t> EncodeTunnelWire(const TunnelWire& wire);
// Writes the kTunnelDataPrefixSize bytes of kData message `wire` (its payload, raw_size bytes
// long, follows them) at `out`: what lets a payload already in place be sent without copying it.
void EncodeTunnelDataPrefix(const TunnelWire& wire, uint8_t* out);
// Decodes one wire message: kDataLoss when a field runs past the end, kUnimplemented for another
// version, kInvalidArgument for an unknown kind or codec, a lossy codec, trailing bytes, a raw
// payload whose length is not raw size, or a raw size above `max_raw_bytes`. Never reads past
// `bytes`. Pure.
StatusOr<TunnelWire> DecodeTunnelWire(std::span<const uint8_t> bytes,
                                      uint64_t max_raw_bytes = kDefaultMaxMessageBytes);

// The WAN-hop codec of one tunnel direction: raw, or byte-shuffled zstd when net::ChooseCodec
// says it pays on this link for this size (lossless only: NCCL's bytes must arrive exact).
// It learns zstd's speed and ratio from its own encodes, probing every kReprobeEvery eligible
// messages so that a change of data or link is noticed. Not thread-safe (one per tunnel side).
class TunnelCodec {
 public:
  // Messages below this go raw: their latency matters more than their bytes.
  static constexpr uint64_t kMinCompressBytes = 64 * 1024;
  static constexpr int kReprobeEvery = 16;

  explicit TunnelCodec(bool zstd_allowed, int zstd_level = 1);
  // Fills wire->codec, raw_size and payload for `data`, chosen from `link`.
  void Encode(std::span<const uint8_t> data, const net::LinkEstimates& link, TunnelWire* wire);
  // Encode, but a payload that goes raw is left out (wire->codec kNone, payload empty): the
  // caller sends `data` from where it lies. True when wire->payload holds a zstd frame.
  bool Compress(std::span<const uint8_t> data, const net::LinkEstimates& link, TunnelWire* wire);
  // Test hook: always use zstd (when allowed) for eligible sizes.
  void ForceZstdForTest() { force_zstd_ = true; }
  uint64_t zstd_messages() const { return zstd_messages_; }

  // Restores a kData payload to the rank's bytes. kDataLoss / kInvalidArgument for a frame
  // that does not decode or whose size differs from raw_size.
  // Takes the payload out of `wire`.
  static Status Decode(Decoder& decoder, TunnelWire& wire, std::vector<uint8_t>* out);

 private:
  bool TryZstd(std::span<const uint8_t> data, TunnelWire* wire);

  bool zstd_allowed_;
  int zstd_level_;
  bool force_zstd_ = false;
  Encoder encoder_;
  net::CodecProfile zstd_;  // learned; encode speed 0 = not measured yet
  uint64_t eligible_ = 0;
  uint64_t zstd_messages_ = 0;
};

struct TunnelServiceOptions {
  std::string region;
  int shard = 0;
  std::vector<std::string> world;  // region names by rank (the gateway's WorldRegions())
  bool zstd_allowed = true;        // policy allows lossless zstd on the WAN
  uint32_t max_message_bytes = kDefaultMaxMessageBytes;
  uint64_t window_bytes = 16u << 20;
  int64_t accept_timeout_ns = int64_t{30'000'000'000};
  int64_t default_open_timeout_ns = int64_t{30'000'000'000};
  int64_t send_timeout_ns = int64_t{120'000'000'000};
};

class TunnelService {
 public:
  // Returns the current link to the gateway of region rank `peer` (null when none). Called from
  // the loop and the I/O thread: it must only take a short lock.
  using LinkLookup = std::function<std::shared_ptr<net::Link>(int peer)>;

  // `stopping` is the gateway's flag: when it turns true, listens and tunnels end (their ranks
  // get a reason) within about 100 ms, and once none is left the supervisor stops, so that the
  // loop can end.
  TunnelService(TunnelServiceOptions options, LinkLookup links, const std::atomic<bool>* stopping);
  // The loop must have ended first (it runs this service's handlers).
  ~TunnelService();
  TunnelService(const TunnelService&) = delete;
  TunnelService& operator=(const TunnelService&) = delete;

  // Runs the service's connections and its supervisor on `loop` from now on. Call once, before
  // Serve; `loop` outlives the service's use of it (its run() ends only after the gateway
  // stopped and every listen and tunnel ended).
  void Start(asio::io_context& loop);

  static bool IsTunnelRequest(MessageType type) {
    return type == MessageType::kTunnelListen || type == MessageType::kTunnelConnect ||
           type == MessageType::kTunnelAccept;
  }

  // Takes over local connection `fd` (after its hello) for a listen, connect or accept request:
  // writes the replies, then runs the listen or the tunnel until it ends, and closes `fd`. On the
  // loop only; never blocks.
  void Serve(int fd, const Message& request);

  // A tunnel-channel message from the gateway of region rank `peer`. Runs on the I/O thread;
  // only queues, sends and posts to the loop, never blocks. Thread-safe.
  void OnWanMessage(int peer, uint32_t channel, std::vector<uint8_t> message);

  // What the tunnels did since start (raw = as the ranks handed it, wire = as sent, zstd
  // included), for /metrics and the stats text.
  struct Counters {
    uint64_t open = 0;
    uint64_t listens = 0, opened = 0, refused = 0, closed_with_error = 0;
    uint64_t messages_sent = 0, messages_received = 0;
    uint64_t raw_bytes_sent = 0, wire_bytes_sent = 0, raw_bytes_received = 0;
    uint64_t zstd_messages = 0;
  };
  Counters GetCounters() const;
  // Counters, one "name value" per line (part of the gateway's stats).
  std::string StatsText() const;

  struct State;  // one tunnel
  struct Listen;
  class RankConn;  // a rank's connection on the loop

 private:
  // All on the loop (tunnel_service.cc says what each does).
  void ServeListen(std::unique_ptr<RankConn> rank, uint32_t uid);
  void PumpListen(const std::shared_ptr<Listen>& listen);
  void EndListen(const std::shared_ptr<Listen>& listen);
  void ServeConnect(std::unique_ptr<RankConn> rank, const Message& request);
  void WaitForLinkAndOpen(const std::shared_ptr<State>& t);
  void Resolve(const std::shared_ptr<State>& t);
  void EndConnect(const std::shared_ptr<State>& t, bool answered, Status result);
  void ServeAccept(std::unique_ptr<RankConn> rank, const Message& request, uint32_t uid);
  void ReplyThenPipe(const std::shared_ptr<State>& t, const Message& reply);
  void PipeFailed(const std::shared_ptr<State>& t);
  void Pump(const std::shared_ptr<State>& t);
  void PumpFromRank(const std::shared_ptr<State>& t);
  void OnRankLength(const std::shared_ptr<State>& t, const std::error_code& ec, size_t n);
  void OnRankFrame(const std::shared_ptr<State>& t);
  // A tunnel-data frame of the rank (in t->body) to the peer gateway.
  void SendRankData(const std::shared_ptr<State>& t, uint32_t tag);
  void RankBroke(const std::shared_ptr<State>& t, const Status& why);
  void EndRankSide(const std::shared_ptr<State>& t, StatusCode code, const std::string& text,
                   bool tell_rank);
  void PumpToRank(const std::shared_ptr<State>& t);
  void CloseToRank(const std::shared_ptr<State>& t, bool closing, StatusCode code,
                   const std::string& text);
  void FinishPipe(const std::shared_ptr<State>& t);
  // Writes *out, then *data when given (both must stay put until `done`).
  void WriteToRank(RankConn& rank, std::vector<uint8_t>* out, int64_t timeout_ns,
                   std::shared_ptr<void> owner, std::function<void(const Status&)> done,
                   const std::vector<uint8_t>* data = nullptr);
  void RefuseAndClose(std::unique_ptr<RankConn> rank, const Message& reply);
  void ArmSupervisor();
  void Supervise();
  // Any thread.
  void Kick(const std::shared_ptr<State>& t);  // Pump(t) on the loop
  // Ends `t` from the peer's side (or the link's): the rank gets everything already received,
  // then kTunnelClose with `why`. A tunnel still opening fails its open with `why`.
  void PeerClosed(const std::shared_ptr<State>& t, Status why);
  void SendWire(const std::shared_ptr<net::Link>& link, const TunnelWire& wire, int64_t timeout_ns,
                std::function<void(Status)> done = nullptr);
  uint64_t NewIdLocked();
  void Forget(uint64_t tunnel_id);
  std::string RegionName(int peer) const;
  bool Stopping() const { return stopping_->load(); }

  const TunnelServiceOptions options_;
  const LinkLookup links_;
  const std::atomic<bool>* stopping_;

  mutable std::mutex mu_;  // guards the maps and rng_; taken before any tunnel's own mutex
  std::map<uint64_t, std::shared_ptr<State>> tunnels_;
  std::map<uint64_t, std::shared_ptr<Listen>> listens_;
  std::mt19937_64 rng_;

  asio::io_context* loop_ = nullptr;  // set by Start
  class Timer;
  std::unique_ptr<Timer> supervisor_;
  int live_ = 0;  // loop only: connections this service holds (listens, connects, pipes)

  std::atomic<uint64_t> listens_total_{0}, opened_{0}, refused_{0}, closed_with_error_{0};
  std::atomic<uint64_t> messages_sent_{0}, messages_received_{0};
  std::atomic<uint64_t> raw_bytes_sent_{0}, wire_bytes_sent_{0}, raw_bytes_received_{0};
  std::atomic<uint64_t> zstd_messages_{0};
};

}  // namespace strait::gateway

#endif  // STRAIT_LIB_GATEWAY_TUNNEL_H_

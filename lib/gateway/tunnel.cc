// Cross-region tunnels in straitd (see tunnel.h).
#include "common/strings.h"
#include "gateway/tunnel.h"

#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <deque>
#include <sstream>
#include <utility>

#include "common/clock.h"
#include "common/endian.h"
#include "common/log.h"
#include "common/units.h"
#include "net/link.h"

namespace strait::gateway {
namespace {

constexpr const char* kLog = "tunnel";
constexpr auto kSlice = std::chrono::milliseconds(100);
constexpr int kSliceMs = 100;

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

// Writes all of `bytes` to the rank, in slices so that `give_up` (checked between them) can
// end a write to a rank that stopped reading. kCancelled when given up.
Status WriteToFd(int fd, std::span<const uint8_t> bytes, const std::function<bool()>& give_up) {
  size_t done = 0;
  while (done < bytes.size()) {
    if (give_up()) return CancelledError("tunnel ended while writing to the rank");
    pollfd p{fd, POLLOUT, 0};
    const int rc = ::poll(&p, 1, kSliceMs);
    if (rc == 0 || (rc < 0 && errno == EINTR)) continue;
    if (rc < 0) return UnavailableError(std::string("poll: ") + std::strerror(errno));
    const ssize_t n =
        ::send(fd, bytes.data() + done, bytes.size() - done, MSG_DONTWAIT | MSG_NOSIGNAL);
    if (n > 0) {
      done += static_cast<size_t>(n);
    } else if (n < 0 && errno != EINTR && errno != EAGAIN && errno != EWOULDBLOCK) {
      return UnavailableError(std::string("write to the rank failed: ") + std::strerror(errno));
    }
  }
  return Status::Ok();
}

Message ReplyTo(MessageType to, const Status& status) { return localproto::ReplyMessage(to, status); }

uint64_t Cost(uint64_t raw_bytes) {
  return raw_bytes + kTunnelMessageCost;
}

}  // namespace

// ---- Wire format -----------------------------------------------------------------------------

std::vector<uint8_t> EncodeTunnelWire(const TunnelWire& w) {
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

void TunnelCodec::Encode(std::span<const uint8_t> data, const net::LinkEstimates& link,
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
    if (use && TryZstd(data, wire)) return;
  }
  wire->codec = CodecId::kNone;
  wire->payload.assign(data.begin(), data.end());
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

// ---- Service ---------------------------------------------------------------------------------

struct TunnelService::State {
  enum class Phase { kOpening, kAwaitingAccept, kOpen };
  uint64_t id = 0;
  uint64_t listen_id = 0;   // the listen it came in on (accepting side)
  uint32_t listen_uid = 0;  // the uid that listened: only it may accept (accepting side)
  int peer = -1;
  std::string peer_name;  // "region X"
  uint32_t channel = 0;
  std::shared_ptr<net::Link> link;

  std::mutex mu;
  std::condition_variable cv;
  // Atomic because it is read under the service's mu_ (Supervise, ServeListen, ServeAccept look
  // for kAwaitingAccept) but kOpening -> kOpen is written under `mu` alone (OnWanMessage);
  // every other field here stays under `mu`.
  std::atomic<Phase> phase{Phase::kOpening};
  int64_t accept_deadline_ns = 0;
  bool open_done = false;  // kOpening: the peer answered (open_status) or the link failed
  Status open_status;
  uint64_t remote_window = 0;
  uint64_t unacked = 0;  // cost of messages sent to the peer and not yet credited
  std::deque<TunnelWire> inbound;
  uint64_t inbound_cost = 0;
  bool peer_closed = false;  // no more will come from the peer: deliver inbound, then close
  StatusCode close_code = StatusCode::kOk;
  std::string close_text;
  bool rank_closed = false;  // the local rank is gone or ended the tunnel
  bool notify_rank = false;  // ... and is still there to be told why (rank_code / rank_text)
  StatusCode rank_code = StatusCode::kOk;
  std::string rank_text;
  bool writer_done = false;
};

struct TunnelService::Listen {
  uint64_t id = 0;
  uint32_t uid = 0;  // of the listening rank
  std::mutex mu;
  std::condition_variable cv;
  std::deque<TunnelEvent> events;
};

TunnelService::TunnelService(TunnelServiceOptions options, LinkLookup links,
                             const std::atomic<bool>* stopping)
    : options_(std::move(options)),
      links_(std::move(links)),
      stopping_(stopping),
      rng_(std::random_device{}()) {
  supervisor_ = std::thread([this] { Supervise(); });
}

TunnelService::~TunnelService() {
  quit_.store(true);
  if (supervisor_.joinable()) supervisor_.join();
}

std::string TunnelService::RegionName(int peer) const {
  if (peer >= 0 && static_cast<size_t>(peer) < options_.world.size()) {
    return "region " + options_.world[static_cast<size_t>(peer)];
  }
  return "region #" + std::to_string(peer);
}

uint64_t TunnelService::NewIdLocked() {
  for (;;) {
    const uint64_t id = rng_();
    if (id != 0 && tunnels_.count(id) == 0 && listens_.count(id) == 0) return id;
  }
}

void TunnelService::Forget(uint64_t tunnel_id) {
  std::lock_guard<std::mutex> lock(mu_);
  tunnels_.erase(tunnel_id);
}

void TunnelService::SendWire(const std::shared_ptr<net::Link>& link, const TunnelWire& wire,
                             int64_t timeout_ns, std::function<void(Status)> done) {
  if (link == nullptr) {
    if (done) done(UnavailableError("no link"));
    return;
  }
  std::vector<uint8_t> bytes = EncodeTunnelWire(wire);
  wire_bytes_sent_ += bytes.size();
  link->Send(TunnelChannel(wire.tunnel_id), std::move(bytes), Deadline::After(timeout_ns),
             [done = std::move(done)](Status s) {
               if (done) done(std::move(s));
             });
}

void TunnelService::PeerClosed(const std::shared_ptr<State>& t, Status why) {
  std::lock_guard<std::mutex> lock(t->mu);
  if (t->phase == State::Phase::kOpening) {
    if (!t->open_done) {
      t->open_done = true;
      t->open_status = why.ok() ? UnavailableError("closed before it opened") : why;
    }
  }
  if (!t->peer_closed) {
    t->peer_closed = true;
    t->close_code = why.code();
    t->close_text = why.ok() ? "the rank in " + t->peer_name + " closed the tunnel"
                             : std::string(why.message());
  }
  t->cv.notify_all();
}

void TunnelService::Serve(int fd, const Message& request) {
  // Only the uid that listened may accept what comes in on its listen, so that another local
  // user who learns a tunnel id cannot take the tunnel (the gateway admits several uids).
  ucred cred{};
  socklen_t len = sizeof(cred);
  const uint32_t uid =
      ::getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) == 0 ? cred.uid : UINT32_MAX;
  switch (request.type) {
    case MessageType::kTunnelListen: ServeListen(fd, uid); break;
    case MessageType::kTunnelConnect: ServeConnect(fd, request); break;
    case MessageType::kTunnelAccept: ServeAccept(fd, request, uid); break;
    default:
      WriteMessage(fd, ReplyTo(request.type, InvalidArgumentError("not a tunnel request")),
                   Deadline::AfterSeconds(5))
          .IgnoreError();
  }
}

void TunnelService::ServeListen(int fd, uint32_t uid) {
  auto listen = std::make_shared<Listen>();
  listen->uid = uid;
  {
    std::lock_guard<std::mutex> lock(mu_);
    listen->id = NewIdLocked();
    listens_[listen->id] = listen;
  }
  ++listens_total_;
  Message reply = ReplyTo(MessageType::kTunnelListen, Status::Ok());
  const TunnelEvent listening{TunnelEventKind::kListening, listen->id,
                              static_cast<uint32_t>(options_.shard), options_.region};
  reply.data = EncodeTunnelEvent(listening);
  bool ok = WriteMessage(fd, reply, Deadline::AfterSeconds(10)).ok();
  while (ok) {
    std::deque<TunnelEvent> events;
    {
      std::unique_lock<std::mutex> lock(listen->mu);
      listen->cv.wait_for(lock, kSlice, [&] { return !listen->events.empty(); });
      events.swap(listen->events);
    }
    for (const TunnelEvent& e : events) {
      Message m = ReplyTo(MessageType::kTunnelListen, Status::Ok());
      m.data = EncodeTunnelEvent(e);
      if (!WriteMessage(fd, m, Deadline::AfterSeconds(10)).ok()) ok = false;
    }
    if (Stopping()) {
      WriteMessage(fd,
                   ReplyTo(MessageType::kTunnelListen,
                           UnavailableError("the gateway of " + options_.region +
                                            " is shutting down; the listen ended")),
                   Deadline::AfterSeconds(1))
          .IgnoreError();
      break;
    }
    // The rank sends nothing on a listen: readable means it closed (or broke the protocol).
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, 0) > 0) break;
  }
  // Connects announced on this listen and not accepted have nobody left to accept them.
  std::vector<std::shared_ptr<State>> orphans;
  {
    std::lock_guard<std::mutex> lock(mu_);
    listens_.erase(listen->id);
    for (auto it = tunnels_.begin(); it != tunnels_.end();) {
      if (it->second->phase == State::Phase::kAwaitingAccept &&
          it->second->listen_id == listen->id) {
        orphans.push_back(it->second);
        it = tunnels_.erase(it);
      } else {
        ++it;
      }
    }
  }
  for (const auto& t : orphans) {
    ++refused_;
    TunnelWire r;
    r.kind = TunnelWireKind::kOpenRefused;
    r.tunnel_id = t->id;
    r.code = StatusCode::kUnavailable;
    r.text =
        "the listening rank in region " + options_.region + " closed its listen before accepting";
    SendWire(t->link, r, options_.send_timeout_ns);
  }
}

void TunnelService::ServeConnect(int fd, const Message& req) {
  const int64_t timeout_ns =
      req.timeout_ms > 0 ? int64_t{req.timeout_ms} * 1'000'000 : options_.default_open_timeout_ns;
  const Deadline deadline = Deadline::After(timeout_ns);
  auto refuse = [&](const Status& s) {
    ++refused_;
    STRAIT_LOG(kInfo, kLog) << "tunnel connect refused: " << s;
    WriteMessage(fd, ReplyTo(MessageType::kTunnelConnect, s), Deadline::AfterSeconds(5))
        .IgnoreError();
  };
  const std::string& region = req.tunnel_region;
  if (region == options_.region) {
    return refuse(
        InvalidArgumentError("region " + region +
                             " is this gateway's own region; tunnels cross regions (connect "
                             "to ranks of the same region directly)"));
  }
  auto it = std::find(options_.world.begin(), options_.world.end(), region);
  if (it == options_.world.end()) {
    std::string known;
    for (const auto& r : options_.world) AppendToList(known, r);
    return refuse(NotFoundError("region " + region + " is not among this gateway's regions (" +
                                known +
                                "); check the listener's handle and peers.* in the "
                                "gateway config"));
  }
  const int peer = static_cast<int>(it - options_.world.begin());
  if (req.tunnel_shard != static_cast<uint32_t>(options_.shard)) {
    return refuse(FailedPreconditionError(
        "the listener is behind shard " + std::to_string(req.tunnel_shard) + " of region " +
        region + ", but this gateway holds shard " + std::to_string(options_.shard) +
        " and links only to shard " + std::to_string(options_.shard) +
        " of other regions; connect through a gateway of shard " +
        std::to_string(req.tunnel_shard)));
  }
  std::shared_ptr<net::Link> link = links_(peer);
  while (link == nullptr && !deadline.Expired() && !Stopping()) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    link = links_(peer);
  }
  if (link == nullptr) {
    return refuse(UnavailableError(
        "no link to the gateway of region " + region + " shard " + std::to_string(options_.shard) +
        " yet; check that it runs and that peers." + region + " in the config is right"));
  }
  auto t = std::make_shared<State>();
  t->peer = peer;
  t->peer_name = RegionName(peer);
  t->link = link;
  t->phase = State::Phase::kOpening;
  {
    std::lock_guard<std::mutex> lock(mu_);
    t->id = NewIdLocked();
    tunnels_[t->id] = t;
  }
  t->channel = TunnelChannel(t->id);
  TunnelWire open;
  open.kind = TunnelWireKind::kOpen;
  open.tunnel_id = t->id;
  open.shard = req.tunnel_shard;
  open.listen_id = req.listen_id;
  open.window = options_.window_bytes;
  SendWire(link, open, timeout_ns, [t](Status s) {
    if (!s.ok()) PeerClosed(t, s.WithContext("sending the open"));
  });
  Status result;
  bool answered = false;
  {
    std::unique_lock<std::mutex> lock(t->mu);
    while (!t->open_done && !deadline.Expired() && !Stopping()) t->cv.wait_for(lock, kSlice);
    answered = t->open_done;
    if (t->open_done) {
      result = t->open_status;
    } else if (Stopping()) {
      result = UnavailableError("the gateway is shutting down");
    } else {
      result = DeadlineExceededError(
          "no answer from the gateway of region " + region + " shard " +
          std::to_string(options_.shard) + " within " + FormatDuration(timeout_ns) +
          " to the open of listen id " + std::to_string(req.listen_id) +
          ": that gateway is down or unreachable, or the listening rank did not accept");
    }
  }
  if (!result.ok()) {
    Forget(t->id);
    if (answered) return refuse(result);
    // If the open arrives late, the peer learns at once that nobody waits for it.
    TunnelWire close;
    close.kind = TunnelWireKind::kClose;
    close.tunnel_id = t->id;
    close.code = StatusCode::kCancelled;
    close.text = "the connecting rank in region " + options_.region +
                 " gave up: " + std::string(result.message());
    SendWire(link, close, options_.send_timeout_ns);
    return refuse(result);
  }
  Message reply = ReplyTo(MessageType::kTunnelConnect, Status::Ok());
  AppendLe(&reply.data, t->id, 8);
  reply.text = region;
  ++opened_;
  RunPipe(t, fd, WriteMessage(fd, reply, Deadline::AfterSeconds(10)));
}

void TunnelService::ServeAccept(int fd, const Message& req, uint32_t uid) {
  std::shared_ptr<State> t;
  Status refusal;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = tunnels_.find(req.tunnel_id);
    if (it == tunnels_.end() || it->second->phase != State::Phase::kAwaitingAccept) {
      refusal = NotFoundError("no incoming tunnel " + std::to_string(req.tunnel_id) +
                              " to accept at this gateway (unknown, already accepted, or not "
                              "accepted within " +
                              FormatDuration(options_.accept_timeout_ns) + ")");
    } else if (it->second->listen_uid != uid) {
      refusal = PermissionDeniedError(
          "incoming tunnel " + std::to_string(req.tunnel_id) + " belongs to the listen of uid " +
          std::to_string(it->second->listen_uid) + ", not to this client's uid " +
          std::to_string(uid) + "; accept it from the process that listened");
    } else {
      t = it->second;
      std::lock_guard<std::mutex> tl(t->mu);
      if (t->peer_closed) {
        refusal = UnavailableError("incoming tunnel " + std::to_string(req.tunnel_id) +
                                   " is gone: " + t->close_text);
        tunnels_.erase(it);
      } else {
        t->phase = State::Phase::kOpen;
      }
    }
  }
  if (!refusal.ok()) {
    ++refused_;
    WriteMessage(fd, ReplyTo(MessageType::kTunnelAccept, refusal), Deadline::AfterSeconds(5))
        .IgnoreError();
    return;
  }
  TunnelWire ok;
  ok.kind = TunnelWireKind::kOpenOk;
  ok.tunnel_id = t->id;
  ok.window = options_.window_bytes;
  SendWire(t->link, ok, options_.send_timeout_ns, [t](Status s) {
    if (!s.ok()) PeerClosed(t, s.WithContext("answering the open"));
  });
  Message reply = ReplyTo(MessageType::kTunnelAccept, Status::Ok());
  reply.text = options_.world[static_cast<size_t>(t->peer)];
  ++opened_;
  RunPipe(t, fd, WriteMessage(fd, reply, Deadline::AfterSeconds(10)));
}

void TunnelService::RunPipe(const std::shared_ptr<State>& t, int fd, const Status& replied) {
  if (!replied.ok()) {
    // The rank did not get its reply: it cannot use the tunnel. Tell the peer and stop here.
    {
      std::lock_guard<std::mutex> lock(t->mu);
      t->rank_closed = true;
      t->rank_code = StatusCode::kUnavailable;
    }
    TunnelWire close;
    close.kind = TunnelWireKind::kClose;
    close.tunnel_id = t->id;
    close.code = StatusCode::kUnavailable;
    close.text = "the rank in region " + options_.region + " went away while the tunnel opened";
    SendWire(t->link, close, options_.send_timeout_ns);
    Forget(t->id);
    return;
  }
  STRAIT_LOG(kInfo, kLog) << "tunnel " << t->id << " with " << t->peer_name << " open";
  std::thread writer([this, t, fd] { WriteToRank(t, fd); });
  ReadFromRank(t, fd);
  writer.join();
  Forget(t->id);
  bool error = false;
  {
    std::lock_guard<std::mutex> lock(t->mu);
    error = (t->peer_closed && t->close_code != StatusCode::kOk) ||
            (t->rank_closed && t->rank_code != StatusCode::kOk);
  }
  if (error) ++closed_with_error_;
  STRAIT_LOG(kInfo, kLog) << "tunnel " << t->id << " with " << t->peer_name << " closed";
}

void TunnelService::ReadFromRank(const std::shared_ptr<State>& t, int fd) {
  TunnelCodec codec(options_.zstd_allowed);
  // Why the rank's side ended: told to the peer (and to the rank when it is still there).
  StatusCode code = StatusCode::kOk;
  std::string text = "the rank in region " + options_.region + " closed the tunnel";
  bool tell_rank = false;
  for (;;) {
    bool writer_failed = false;
    {
      std::unique_lock<std::mutex> lock(t->mu);
      while (!t->writer_done && !t->peer_closed && !t->rank_closed && !Stopping() &&
             t->unacked >= t->remote_window) {
        t->cv.wait_for(lock, kSlice);
      }
      if (t->peer_closed || t->rank_closed) return;
      writer_failed = t->writer_done;
    }
    if (writer_failed) {
      code = StatusCode::kUnavailable;
      text = "the connection to the rank in region " + options_.region + " failed";
      break;
    }
    if (Stopping()) {
      code = StatusCode::kUnavailable;
      text = "the gateway of region " + options_.region + " is shutting down";
      tell_rank = true;
      break;
    }
    pollfd p{fd, POLLIN, 0};
    const int rc = ::poll(&p, 1, kSliceMs);
    if (rc == 0 || (rc < 0 && errno == EINTR)) continue;
    auto body = ReadFrame(fd, options_.max_message_bytes, Deadline::AfterSeconds(30));
    if (!body.ok()) {
      if (body.status().code() != StatusCode::kUnavailable) {
        code = body.status().code();
        text = "the rank in region " + options_.region +
               " broke its tunnel connection: " + std::string(body.status().message());
        tell_rank = true;
      }
      break;
    }
    auto m = DecodeMessage(*body, options_.max_message_bytes);
    if (!m.ok() || (m->type != MessageType::kTunnelData && m->type != MessageType::kTunnelClose)) {
      code = StatusCode::kInvalidArgument;
      text = "bad frame on the tunnel from region " + options_.region + ": " +
             (m.ok() ? std::string("a ") + MessageTypeName(m->type) +
                           " message (only tunnel-data and tunnel-close are allowed)"
                     : std::string(m.status().message()));
      tell_rank = true;
      break;
    }
    if (m->type == MessageType::kTunnelClose) {
      code = m->code;
      if (!m->text.empty()) text = m->text;
      break;
    }
    TunnelWire w;
    w.tunnel_id = t->id;
    w.tag = m->tag;
    codec.Encode(m->data, t->link->Estimates(), &w);
    const uint64_t raw = m->data.size();
    {
      std::lock_guard<std::mutex> lock(t->mu);
      t->unacked += Cost(raw);
    }
    ++messages_sent_;
    raw_bytes_sent_ += raw;
    if (w.codec == CodecId::kZstd) ++zstd_messages_;
    SendWire(t->link, w, options_.send_timeout_ns, [t, name = t->peer_name](Status s) {
      if (!s.ok())
        PeerClosed(
            t, UnavailableError("the link to " + name + " failed: " + std::string(s.message())));
    });
  }
  bool tell_peer = false;
  {
    std::lock_guard<std::mutex> lock(t->mu);
    if (!t->rank_closed) {
      t->rank_closed = true;
      t->rank_code = code;
      t->rank_text = text;
      t->notify_rank = tell_rank;
      tell_peer = !t->peer_closed;
    }
    t->cv.notify_all();
  }
  if (tell_peer) {
    TunnelWire close;
    close.kind = TunnelWireKind::kClose;
    close.tunnel_id = t->id;
    close.code = code;
    close.text = text;
    SendWire(t->link, close, options_.send_timeout_ns);
  }
}

void TunnelService::WriteToRank(const std::shared_ptr<State>& t, int fd) {
  Decoder decoder;
  uint64_t credit = 0;
  const uint64_t credit_batch = std::max<uint64_t>(options_.window_bytes / 4, 1);
  auto give_up = [this, &t] {
    std::lock_guard<std::mutex> lock(t->mu);
    return t->rank_closed || Stopping();
  };
  bool closing = false;
  StatusCode code = StatusCode::kOk;
  std::string text;
  for (;;) {
    TunnelWire w;
    bool have = false;
    bool more = false;
    {
      std::unique_lock<std::mutex> lock(t->mu);
      while (t->inbound.empty() && !t->peer_closed && !t->rank_closed && !Stopping()) {
        t->cv.wait_for(lock, kSlice);
      }
      if (t->rank_closed) {
        closing = t->notify_rank;
        code = t->rank_code;
        text = t->rank_text;
        break;
      }
      if (!t->inbound.empty()) {
        w = std::move(t->inbound.front());
        t->inbound.pop_front();
        t->inbound_cost -= std::min(t->inbound_cost, Cost(w.raw_size));
        have = true;
        more = !t->inbound.empty();
      } else if (t->peer_closed) {
        closing = true;
        code = t->close_code;
        text = t->close_text;
        break;
      } else {
        closing = true;
        code = StatusCode::kUnavailable;
        text = "the gateway of region " + options_.region + " is shutting down";
        break;
      }
    }
    if (!have) continue;
    std::vector<uint8_t> raw;
    Status s = TunnelCodec::Decode(decoder, w, &raw);
    if (!s.ok()) {
      // The peer's bytes are corrupt: end the tunnel on both sides rather than deliver them.
      const Status why = s.WithContext("undecodable tunnel data from " + t->peer_name);
      STRAIT_LOG(kWarn, kLog) << why;
      TunnelWire close;
      close.kind = TunnelWireKind::kClose;
      close.tunnel_id = t->id;
      close.code = why.code();
      close.text = std::string(why.message());
      SendWire(t->link, close, options_.send_timeout_ns);
      PeerClosed(t, why);
      std::lock_guard<std::mutex> lock(t->mu);
      t->inbound.clear();
      t->inbound_cost = 0;
      continue;
    }
    Message m;
    m.type = MessageType::kTunnelData;
    m.tag = w.tag;
    const uint64_t size = raw.size();
    m.data = std::move(raw);
    auto frame = EncodeMessage(m, options_.max_message_bytes);
    s = frame.ok() ? WriteToFd(fd, *frame, give_up) : frame.status();
    if (!s.ok()) {
      std::lock_guard<std::mutex> lock(t->mu);
      t->cv.notify_all();
      if (t->rank_closed || Stopping()) continue;  // the loop head decides what to say
      break;  // the rank's connection failed; its reader sees that too
    }
    ++messages_received_;
    raw_bytes_received_ += size;
    credit += Cost(size);
    if (credit >= credit_batch || !more) {
      TunnelWire c;
      c.kind = TunnelWireKind::kCredit;
      c.tunnel_id = t->id;
      c.credit = credit;
      SendWire(t->link, c, options_.send_timeout_ns);
      credit = 0;
    }
  }
  if (closing) {
    Message m;
    m.type = MessageType::kTunnelClose;
    m.code = code;
    m.text = text.substr(0, kMaxReplyTextBytes);
    WriteMessage(fd, m, Deadline::AfterSeconds(1)).IgnoreError();
    // The rank reads the close, then end of file.
    ::shutdown(fd, SHUT_WR);
  }
  std::lock_guard<std::mutex> lock(t->mu);
  t->writer_done = true;
  t->cv.notify_all();
}

void TunnelService::OnWanMessage(int peer, uint32_t channel, std::vector<uint8_t> message) {
  if (peer < 0 || static_cast<size_t>(peer) >= options_.world.size()) {
    // Tunnels run only between regions; a link to another gateway of this region carries none.
    STRAIT_LOG(kWarn, kLog) << "dropped a tunnel message from link #" << peer
                            << ", which is not a peer region's";
    return;
  }
  auto decoded = DecodeTunnelWire(message, options_.max_message_bytes);
  if (!decoded.ok()) {
    STRAIT_LOG(kWarn, kLog) << "dropped a bad tunnel message from " << RegionName(peer) << ": "
                            << decoded.status();
    // The tunnel it belongs to may have lost data: end it if the id is readable.
    if (message.size() >= kTunnelWireHeaderSize) {
      const uint64_t id = GetU64(message.data() + 8);
      std::shared_ptr<State> t;
      {
        std::lock_guard<std::mutex> lock(mu_);
        auto it = tunnels_.find(id);
        if (it != tunnels_.end() && it->second->peer == peer) t = it->second;
      }
      if (t)
        PeerClosed(t, decoded.status().WithContext("bad tunnel message from " + RegionName(peer)));
    }
    return;
  }
  TunnelWire& w = *decoded;
  if (TunnelChannel(w.tunnel_id) != channel) {
    STRAIT_LOG(kWarn, kLog) << "dropped a tunnel message from " << RegionName(peer)
                            << " on channel " << channel << ", which is not its tunnel's";
    return;
  }
  if (w.kind == TunnelWireKind::kOpen) {
    std::shared_ptr<net::Link> link = links_(peer);
    auto refuse = [&](const Status& s) {
      ++refused_;
      STRAIT_LOG(kInfo, kLog) << "refused a tunnel from " << RegionName(peer) << ": " << s;
      TunnelWire r;
      r.kind = TunnelWireKind::kOpenRefused;
      r.tunnel_id = w.tunnel_id;
      r.code = s.code();
      r.text = std::string(s.message());
      SendWire(link, r, options_.send_timeout_ns);
    };
    if (w.shard != static_cast<uint32_t>(options_.shard)) {
      return refuse(FailedPreconditionError("the gateway of region " + options_.region +
                                            " reached is shard " + std::to_string(options_.shard) +
                                            ", not shard " + std::to_string(w.shard)));
    }
    std::lock_guard<std::mutex> lock(mu_);
    auto lit = listens_.find(w.listen_id);
    if (lit == listens_.end()) {
      return refuse(NotFoundError("region " + options_.region + " shard " +
                                  std::to_string(options_.shard) + " has no listen id " +
                                  std::to_string(w.listen_id) +
                                  " (the listening rank closed it, or it never existed)"));
    }
    if (tunnels_.count(w.tunnel_id) != 0 || listens_.count(w.tunnel_id) != 0) {
      return refuse(AlreadyExistsError("tunnel id " + std::to_string(w.tunnel_id) +
                                       " is already in use here; connect again"));
    }
    auto t = std::make_shared<State>();
    t->id = w.tunnel_id;
    t->listen_id = w.listen_id;
    t->listen_uid = lit->second->uid;
    t->peer = peer;
    t->peer_name = RegionName(peer);
    t->channel = channel;
    t->link = link;
    t->phase = State::Phase::kAwaitingAccept;
    t->accept_deadline_ns = MonotonicNanos() + options_.accept_timeout_ns;
    t->remote_window = w.window;
    tunnels_[t->id] = t;
    std::lock_guard<std::mutex> ll(lit->second->mu);
    lit->second->events.push_back(TunnelEvent{TunnelEventKind::kIncoming, t->id, 0,
                                              options_.world[static_cast<size_t>(peer)]});
    lit->second->cv.notify_all();
    return;
  }
  std::shared_ptr<State> t;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = tunnels_.find(w.tunnel_id);
    if (it != tunnels_.end() && it->second->peer == peer) t = it->second;
  }
  if (t == nullptr) return;  // a tunnel that ended here already: nothing waits for it
  switch (w.kind) {
    case TunnelWireKind::kOpenOk:
    case TunnelWireKind::kOpenRefused: {
      std::lock_guard<std::mutex> lock(t->mu);
      if (t->phase != State::Phase::kOpening || t->open_done) return;
      t->open_done = true;
      if (w.kind == TunnelWireKind::kOpenOk) {
        t->phase = State::Phase::kOpen;
        t->remote_window = w.window;
        t->open_status = Status::Ok();
      } else {
        t->open_status = Status(w.code == StatusCode::kOk ? StatusCode::kUnknown : w.code,
                                t->peer_name + " refused the tunnel: " + w.text);
      }
      t->cv.notify_all();
      return;
    }
    case TunnelWireKind::kData: {
      std::unique_lock<std::mutex> lock(t->mu);
      if (t->phase != State::Phase::kOpen || t->peer_closed || t->rank_closed) return;
      const uint64_t cost = Cost(w.raw_size);
      // An honest peer stops at our window plus the one message it read last.
      if (t->inbound_cost + cost >
          options_.window_bytes + Cost(options_.max_message_bytes) + cost) {
        lock.unlock();
        PeerClosed(t, DataLossError(t->peer_name + " overran the tunnel's window of " +
                                    std::to_string(options_.window_bytes) + " bytes"));
        return;
      }
      t->inbound_cost += cost;
      t->inbound.push_back(std::move(w));
      t->cv.notify_all();
      return;
    }
    case TunnelWireKind::kCredit: {
      std::lock_guard<std::mutex> lock(t->mu);
      t->unacked -= std::min(t->unacked, w.credit);
      t->cv.notify_all();
      return;
    }
    case TunnelWireKind::kClose:
      PeerClosed(t, w.code == StatusCode::kOk
                        ? Status::Ok()
                        : Status(w.code, t->peer_name + " ended the tunnel: " + w.text));
      return;
    case TunnelWireKind::kOpen: return;  // handled above
  }
}

void TunnelService::Supervise() {
  while (!quit_.load()) {
    std::this_thread::sleep_for(kSlice);
    const int64_t now = MonotonicNanos();
    std::vector<std::shared_ptr<State>> expired, live;
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (auto it = tunnels_.begin(); it != tunnels_.end();) {
        const auto& t = it->second;
        if (t->phase == State::Phase::kAwaitingAccept && now > t->accept_deadline_ns) {
          expired.push_back(t);
          it = tunnels_.erase(it);
        } else {
          live.push_back(t);
          ++it;
        }
      }
    }
    for (const auto& t : expired) {
      ++refused_;
      TunnelWire r;
      r.kind = TunnelWireKind::kOpenRefused;
      r.tunnel_id = t->id;
      r.code = StatusCode::kDeadlineExceeded;
      r.text = "the listening rank in region " + options_.region + " did not accept within " +
               FormatDuration(options_.accept_timeout_ns);
      SendWire(t->link, r, options_.send_timeout_ns);
    }
    // A link that ended (peer gone, closed) or was replaced (the peer restarted and linked
    // anew) will carry nothing more for these tunnels: end them with the reason.
    std::map<net::Link*, Status> health;
    for (const auto& t : live) {
      if (t->link == nullptr) continue;
      Status why;
      if (links_(t->peer) != t->link) {
        why = UnavailableError("the link to " + t->peer_name +
                               " was replaced (its gateway restarted); the tunnel is lost");
      } else {
        auto h = health.find(t->link.get());
        if (h == health.end()) {
          Status s = t->link->WaitForStreams(1, Deadline::After(0));
          if (s.code() != StatusCode::kUnavailable) s = Status::Ok();
          h = health.emplace(t->link.get(), s).first;
        }
        if (!h->second.ok()) {
          why = UnavailableError("the gateway of " + t->peer_name +
                                 " is gone: " + std::string(h->second.message()));
        }
      }
      if (!why.ok()) PeerClosed(t, why);
    }
  }
}

std::string TunnelService::StatsText() const {
  size_t open = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    open = tunnels_.size();
  }
  std::ostringstream os;
  os << "tunnels_open " << open << "\ntunnel_listens " << listens_total_ << "\ntunnels_opened "
     << opened_ << "\ntunnels_refused " << refused_ << "\ntunnels_closed_with_error "
     << closed_with_error_ << "\ntunnel_messages_sent " << messages_sent_
     << "\ntunnel_messages_received " << messages_received_ << "\ntunnel_raw_bytes_sent "
     << raw_bytes_sent_ << "\ntunnel_wire_bytes_sent " << wire_bytes_sent_
     << "\ntunnel_raw_bytes_received " << raw_bytes_received_ << "\ntunnel_zstd_messages "
     << zstd_messages_ << "\n";
  return os.str();
}

}  // namespace strait::gateway

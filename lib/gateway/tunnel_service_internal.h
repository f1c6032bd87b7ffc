// Internal to lib/gateway's tunnel service (tunnel.h): the loop-side objects its three files
// share: a rank's connection (RankConn), a tunnel's state (State), a listen (Listen), and the
// deadlines. tunnel_service.cc holds the service's life, dispatch and supervisor;
// tunnel_open.cc listens, connects and accepts; tunnel_pipe.cc the two directions of an open
// tunnel and the WAN side. Not installed.
#ifndef STRAIT_LIB_GATEWAY_TUNNEL_SERVICE_INTERNAL_H_
#define STRAIT_LIB_GATEWAY_TUNNEL_SERVICE_INTERNAL_H_

#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <deque>
#include <sstream>
#include <utility>

#include <asio.hpp>

#include "common/clock.h"
#include "common/endian.h"
#include "common/log.h"
#include "common/units.h"
#include "common/strings.h"
#include "gateway/tunnel.h"
#include "net/link.h"

namespace strait::gateway {
namespace tunnel_internal {

inline constexpr const char* kLog = "tunnel";
// How often the supervisor looks at tunnels (accept deadlines, link health, shutdown), and how
// often a connect waiting for its link looks again.
inline constexpr auto kSuperviseEvery = std::chrono::milliseconds(100);
inline constexpr auto kLinkRetry = std::chrono::milliseconds(20);
// Deadlines of the writes to a rank: a reply, a listen's event, a close; and of a frame's body
// once its length arrived.
inline constexpr int64_t kReplyTimeoutNs = 10'000'000'000;
inline constexpr int64_t kRefusalTimeoutNs = 5'000'000'000;
inline constexpr int64_t kCloseTimeoutNs = 1'000'000'000;
inline constexpr int64_t kFrameTimeoutNs = 30'000'000'000;

using Socket = asio::local::stream_protocol::socket;

inline Message ReplyTo(MessageType to, const Status& status) {
  return localproto::ReplyMessage(to, status);
}

inline uint64_t Cost(uint64_t raw_bytes) { return raw_bytes + kTunnelMessageCost; }


}  // namespace tunnel_internal

using tunnel_internal::Socket;


// A rank's Unix connection on the loop, with one deadline timer for the transfer under way.
// Loop only.
class TunnelService::RankConn {
 public:
  RankConn(asio::io_context& loop, int fd) : socket_(loop), timer_(loop) {
    asio::error_code ec;
    socket_.assign(asio::local::stream_protocol(), fd, ec);
    if (ec) ::close(fd);
  }
  Socket& socket() { return socket_; }
  bool open() const { return socket_.is_open(); }
  // Cancels the socket's transfers when `ns` pass before Disarm(); `keep` lives until then.
  void Arm(int64_t ns, std::shared_ptr<void> keep) {
    timed_out_ = false;
    const uint64_t arming = ++arming_;
    timer_.expires_after(std::chrono::nanoseconds(ns));
    timer_.async_wait([this, arming, keep = std::move(keep)](const asio::error_code& ec) {
      if (ec || arming != arming_) return;
      timed_out_ = true;
      asio::error_code ignored;
      socket_.cancel(ignored);
    });
  }
  void Disarm() {
    ++arming_;
    timer_.cancel();
  }
  bool timed_out() const { return timed_out_; }
  void Cancel() {
    asio::error_code ignored;
    socket_.cancel(ignored);
  }
  void ShutdownWrite() {
    asio::error_code ignored;
    socket_.shutdown(asio::socket_base::shutdown_send, ignored);
  }
  void Close() {
    Disarm();
    asio::error_code ignored;
    socket_.close(ignored);
  }

 private:
  Socket socket_;
  asio::steady_timer timer_;
  uint64_t arming_ = 0;
  bool timed_out_ = false;
};

class TunnelService::Timer : public asio::steady_timer {
 public:
  using asio::steady_timer::steady_timer;
};

struct TunnelService::State {
  enum class Phase { kOpening, kAwaitingAccept, kOpen };
  uint64_t id = 0;
  uint64_t listen_id = 0;   // the listen it came in on (accepting side)
  uint32_t listen_uid = 0;  // the uid that listened: only it may accept (accepting side)
  int peer = -1;
  std::string peer_name;  // "region X"
  uint32_t channel = 0;
  std::shared_ptr<net::Link> link;

  // Shared with the I/O thread (OnWanMessage, send callbacks), under `mu`.
  std::mutex mu;
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

  // Loop only: the rank's connection (null on the accepting side until accepted) and the
  // progress of each direction.
  std::unique_ptr<RankConn> rank;
  bool connecting = false;  // a connect waiting for the peer's answer (Resolve)
  Deadline open_deadline = Deadline::After(0);
  std::unique_ptr<asio::steady_timer> open_timer;  // Pump at open_deadline
  uint64_t requested_listen = 0;
  int64_t open_timeout_ns = 0;
  bool piping = false;   // the rank has its reply: data flows (Pump)
  bool reading = false;  // a read of the rank's next frame is under way
  bool writing = false;  // a write to the rank is under way
  bool writer_done = false;
  bool finished = false;
  std::array<uint8_t, localproto::kFrameLengthBytes> length{};
  // The rank's frame body, read kBodyOffset bytes in: a tunnel-data frame's bytes then lie where
  // a wire kData message carries them, and the buffer goes to the link as it is (OnRankFrame).
  static constexpr size_t kBodyOffset = kTunnelDataPrefixSize - 5;  // 5: type and tag
  std::vector<uint8_t> body;
  std::vector<uint8_t> out;
  std::vector<uint8_t> out_data;  // a tunnel-data frame's data, written after `out` (its head)
  std::unique_ptr<TunnelCodec> codec;  // set when the pipe starts
  bool closing_write = false;  // the write under way is the last one (kTunnelClose)
  Decoder decoder;
  uint64_t credit = 0;
};

struct TunnelService::Listen {
  uint64_t id = 0;
  uint32_t uid = 0;  // of the listening rank
  std::mutex mu;
  std::deque<TunnelEvent> events;  // under mu (OnWanMessage adds)
  // Loop only.
  std::unique_ptr<RankConn> rank;
  bool writing = false;
  bool ended = false;
  std::vector<uint8_t> out;
};

}  // namespace strait::gateway

#endif  // STRAIT_LIB_GATEWAY_TUNNEL_SERVICE_INTERNAL_H_

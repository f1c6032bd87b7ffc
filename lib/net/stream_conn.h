// StreamConn: one TCP stream of a link (TLS 1.3 or plain), its setup deadline and the link-side
// state the link keeps per stream (slot, write queue, read buffers, retiring flags). Internal to
// strait::net (the link_*.cc and endpoint.cc files); other modules use net/link.h.
//
// It is apart from LinkCore because both sides create streams before any link owns them: the
// dialer per slot (link_handshake.cc), the endpoint's acceptor for every incoming connection
// (endpoint.cc); only once a stream passed the hello does it join a link (LinkCore::Attach).
#ifndef STRAIT_LIB_NET_STREAM_CONN_H_
#define STRAIT_LIB_NET_STREAM_CONN_H_

#include <array>
#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <asio.hpp>
#include <asio/ssl.hpp>

#include "net/delivery.h"
#include "net/link.h"
#include "net/socket_options.h"
#include "net/wire.h"
#include "strait/status.h"

namespace strait::net {

class LinkCore;

// One TCP (optionally TLS) stream. I/O-thread only.
class StreamConn : public std::enable_shared_from_this<StreamConn> {
 public:
  using tcp = asio::ip::tcp;
  using TlsStream = asio::ssl::stream<tcp::socket>;

  StreamConn(tcp::socket socket, asio::ssl::context* tls, std::string peer)
      : timer_(socket.get_executor()), peer_(std::move(peer)) {
    if (tls != nullptr) {
      tls_ = std::make_unique<TlsStream>(std::move(socket), *tls);
    } else {
      plain_.emplace(std::move(socket));
    }
  }

  tcp::socket& Lowest() { return tls_ ? tls_->next_layer() : *plain_; }
  TlsStream* tls() { return tls_.get(); }

  template <typename Buffers, typename Handler>
  void Write(const Buffers& buffers, Handler&& handler) {
    if (tls_) {
      asio::async_write(*tls_, buffers, std::forward<Handler>(handler));
    } else {
      asio::async_write(*plain_, buffers, std::forward<Handler>(handler));
    }
  }
  template <typename Buffers, typename Handler>
  void Read(const Buffers& buffers, Handler&& handler) {
    if (tls_) {
      asio::async_read(*tls_, buffers, std::forward<Handler>(handler));
    } else {
      asio::async_read(*plain_, buffers, std::forward<Handler>(handler));
    }
  }

  // Applies the per-socket options; errors are returned for logging (the stream stays usable
  // unless congestion control was refused, which Create() already checked).
  Status Configure(const LinkOptions& options) {
    const int fd = Lowest().native_handle();
    STRAIT_RETURN_IF_ERROR(SetNoDelay(fd));
    STRAIT_RETURN_IF_ERROR(SetCongestionControl(fd, options.congestion_control));
    STRAIT_RETURN_IF_ERROR(SetTcpRtoMax(fd, options.tcp_rto_max_ns));
    return SetNotSentLowat(fd, options.notsent_lowat);
  }

  // Closes a stream still setting up to make room for a newer one (the pending setup step then
  // fails and is counted as an overflow, as a timeout is by ArmDeadline).
  void Evict() {
    evicted_ = true;
    Close();
  }

  // Arms the setup deadline: when it fires, the socket closes and pending setup steps fail.
  void ArmDeadline(int64_t nanos) {
    timer_.expires_after(std::chrono::nanoseconds(nanos));
    timer_.async_wait([self = shared_from_this()](const asio::error_code& ec) {
      if (ec || self->closed_) return;
      self->timed_out_ = true;
      self->Close();
    });
  }
  void DisarmDeadline() { timer_.cancel(); }

  void Close() {
    if (closed_) return;
    closed_ = true;
    asio::error_code ec;
    timer_.cancel();
    if (Lowest().is_open()) {
      if (auto info = ReadTcpInfo(Lowest().native_handle()); info.ok()) {
        final_retrans_ = info->total_retrans;
      }
      Lowest().shutdown(tcp::socket::shutdown_both, ec);
      Lowest().close(ec);
    }
  }

  bool closed() const { return closed_; }
  bool timed_out() const { return timed_out_; }
  bool evicted() const { return evicted_; }
  const std::string& peer() const { return peer_; }

  // Link-side state (set when the stream joins a link).
  std::shared_ptr<LinkCore> link;
  int slot = -1;
  bool up = false;
  bool writing = false;
  bool close_after_write = false;
  // Retiring (the pool shrinks): no new data chunks go onto this stream; see kRetire in wire.h.
  bool retiring = false;
  bool retire_sent = false;
  bool retire_received = false;
  int64_t retire_started_ns = 0;
  std::vector<uint8_t> control;  // acks, pings, pongs, close: written before any data
  std::vector<uint8_t> out;      // the write in progress: control records, data record headers
  // The data chunk written after `out`, straight from its message: payload bytes, where.
  uint64_t out_payload = 0;
  std::shared_ptr<const OutMessage> out_message;
  uint64_t out_offset = 0;
  std::array<uint8_t, kRecordHeaderBytes> header{};
  std::vector<uint8_t> body;
  std::vector<uint8_t> hello;  // the hello being read or written during setup
  int64_t last_rx_ns = 0;
  int64_t accepted_ns = 0;  // when the acceptor took it (the oldest setting up yields first)
  // Accepted on the plain in-region listener (Endpoint::ListenInRegion): only a gateway of this
  // endpoint's own region, from a listed address, may set it up.
  bool in_region = false;
  int64_t last_ping_ns = 0;
  uint64_t final_retrans_ = 0;

 private:
  std::unique_ptr<TlsStream> tls_;
  std::optional<tcp::socket> plain_;
  asio::steady_timer timer_;
  std::string peer_;
  bool closed_ = false;
  bool timed_out_ = false;
  bool evicted_ = false;
};

}  // namespace strait::net

#endif  // STRAIT_LIB_NET_STREAM_CONN_H_

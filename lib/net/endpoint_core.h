// EndpointCore: the part of an Endpoint that lives on the I/O thread and that links need -- the
// options, the TLS context, the refusal counters, the acceptor and the registry of links.
// Internal to strait::net; other modules use net/link.h.
//
// Its methods live in two files: endpoint.cc (accepting, the registry, shutdown) and
// link_handshake.cc (admitting an accepted stream: TLS, hello checks, finding its link), the
// latter beside the dialer's half of the same handshake.
#ifndef STRAIT_LIB_NET_ENDPOINT_CORE_H_
#define STRAIT_LIB_NET_ENDPOINT_CORE_H_

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include <asio.hpp>
#include <asio/ssl.hpp>

#include "common/log_limiter.h"
#include "net/accept_pause.h"
#include "net/link.h"

namespace strait::net {

class LinkCore;
class Runtime;
class StreamConn;

// An address as a peer's connection shows it, compared as configured: IPv4 peers of an IPv6
// socket appear as ::ffff:a.b.c.d, which is the IPv4 address a.b.c.d.
asio::ip::address UnmappedAddress(const asio::ip::address& a);

// Shared parts of the endpoint that links need: options, TLS, counters, the registry.
class EndpointCore : public std::enable_shared_from_this<EndpointCore> {
 public:
  EndpointCore(asio::io_context& io, EndpointOptions options,
               std::unique_ptr<asio::ssl::context> tls, AcceptCallback on_accept,
               std::shared_ptr<Runtime> runtime)
      : io_(io),
        options_(std::move(options)),
        tls_(std::move(tls)),
        on_accept_(std::move(on_accept)),
        runtime_(std::move(runtime)),
        peers_(options_.peer_regions.begin(), options_.peer_regions.end()) {}

  asio::io_context& io() { return io_; }
  const EndpointOptions& options() const { return options_; }
  // The context for new handshakes. Each stream keeps the context it was created with; old
  // contexts stay alive in retired_tls_ (a few KiB per reload) so that pointer never dangles.
  asio::ssl::context* tls() {
    std::lock_guard<std::mutex> lock(tls_mu_);
    return tls_.get();
  }
  void ReplaceTls(std::unique_ptr<asio::ssl::context> tls) {
    std::lock_guard<std::mutex> lock(tls_mu_);
    retired_tls_.push_back(std::move(tls_));
    tls_ = std::move(tls);
  }
  bool AllowedPeer(const std::string& region) const { return peers_.count(region) > 0; }

  template <typename F>
  void Count(F&& update) {
    std::lock_guard<std::mutex> lock(counters_mu_);
    update(counters_);
  }
  EndpointCounters Counters() const {
    std::lock_guard<std::mutex> lock(counters_mu_);
    return counters_;
  }

  void StartAccepting(std::unique_ptr<asio::ip::tcp::acceptor> acceptor);
  // The plain in-region listener (Endpoint::ListenInRegion) and the addresses it admits.
  void StartAcceptingInRegion(std::unique_ptr<asio::ip::tcp::acceptor> acceptor,
                              std::set<asio::ip::address> hosts);
  void Register(const std::shared_ptr<LinkCore>& link);
  // A link ended. One whose streams are still writing their close records stays in ended_
  // until the last of them is dropped (Released), so that endpoint shutdown waits for them
  // and then drops them: otherwise nothing would, and the StreamConn <-> LinkCore cycle would
  // keep their sockets open.
  void Unregister(LinkCore* link);
  void Released(LinkCore* link);
  // Endpoint shutdown: close records on every stream (BeginShutdown), then, once they went out
  // or the grace period passed, every stream dropped (FinishShutdown).
  void BeginShutdown();
  bool ShutdownDrained() const;
  void FinishShutdown();

  // The Runtime is needed to hand out Link handles for accepted links; held weakly so that the
  // io_context never owns its own Runtime.
  std::weak_ptr<Runtime> runtime_weak() const { return runtime_; }

 private:
  // Accepts the next connection on the WAN listener, or on the in-region one (plain streams
  // that only this region's gateways may open).
  void AcceptNext(bool in_region);
  void SetUpAccepted(std::shared_ptr<StreamConn> stream);
  // Before a new stream joins handshaking_: at max_pending_ streams still setting up, the oldest
  // one is evicted (see EndpointOptions::max_pending_streams).
  void MakeRoomForSetup();
  // A stream left setup (refused, answered or admitted). Once a burst of setups is over -- none
  // left for kReleaseSettleNs -- the heap it grew goes back to the kernel (common/heap.h).
  void EndSetup(const std::shared_ptr<StreamConn>& stream);
  void ReleaseHeapIfQuiet();
  void ReadHello(std::shared_ptr<StreamConn> stream, std::string cert_region);
  void Refuse(const std::shared_ptr<StreamConn>& stream, const std::string& why,
              uint64_t EndpointCounters::*counter);

  asio::io_context& io_;
  EndpointOptions options_;
  std::mutex tls_mu_;  // guards tls_ and retired_tls_ (ReloadIdentity runs on any thread)
  std::unique_ptr<asio::ssl::context> tls_;
  std::vector<std::unique_ptr<asio::ssl::context>> retired_tls_;
  AcceptCallback on_accept_;
  std::weak_ptr<Runtime> runtime_;
  std::set<std::string> peers_;
  std::unique_ptr<asio::ip::tcp::acceptor> acceptor_;
  std::unique_ptr<asio::ip::tcp::acceptor> region_acceptor_;
  std::set<asio::ip::address> region_hosts_;  // who may open a stream on region_acceptor_
  // Accepted links by (region, session id); dialed links under session id only in links_.
  std::map<std::pair<std::string, uint64_t>, std::shared_ptr<LinkCore>> sessions_;
  std::vector<std::shared_ptr<LinkCore>> links_;
  std::set<std::shared_ptr<StreamConn>> handshaking_;
  size_t max_pending_ = 256;  // set by StartAccepting (options and descriptor limit)
  // Streams set up since the heap was last released, and the timer that waits for the quiet
  // after a burst (EndSetup).
  uint64_t setups_since_release_ = 0;
  bool release_armed_ = false;
  asio::steady_timer release_timer_{io_};
  std::vector<std::shared_ptr<LinkCore>> ended_;    // ended links with streams still up
  std::vector<std::shared_ptr<LinkCore>> closing_;  // links ended by shutdown, still draining
  mutable std::mutex counters_mu_;
  EndpointCounters counters_;
  LogRateLimiter refusal_log_{10'000'000'000};  // Refuse's WARN lines, per address and reason
  bool shut_down_ = false;
  // Out of descriptors or memory: accepting pauses instead of spinning (net/accept_pause.h).
  AcceptPause accept_pause_{io_.get_executor(), "a WAN connection", "net"};
  AcceptPause region_accept_pause_{io_.get_executor(), "an in-region connection", "net"};
};

}  // namespace strait::net

#endif  // STRAIT_LIB_NET_ENDPOINT_CORE_H_

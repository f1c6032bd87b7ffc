// Endpoint (see link.h): the public object and its I/O-thread half, EndpointCore -- option
// checks, the TLS identity and its reload, listening and accepting, dialing links (Connect),
// the registry of links, and shutdown (close records first, then every stream dropped).
// Admitting an accepted stream is in link_handshake.cc, beside the dialer's half.
//
// Apart from the links because an endpoint is the one object that owns the I/O thread and
// outlives none of its links' handles: its shutdown is the place that breaks every
// StreamConn <-> LinkCore cycle (see link_core.h for the ownership).
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include <asio.hpp>
#include <asio/ssl.hpp>

#include "common/clock.h"
#include "common/heap.h"
#include "common/log.h"
#include "common/system_error.h"
#include "common/units.h"
#include "net/endpoint_core.h"
#include "net/link.h"
#include "net/link_core.h"
#include "net/runtime.h"
#include "net/socket_options.h"
#include "net/stream_conn.h"
#include "net/tls.h"
#include "net/wire.h"

namespace strait::net {
namespace {

using asio::ip::tcp;

// Endpoint shutdown waits this long for close records to go out before dropping the streams.
constexpr int64_t kShutdownDrainNs = 500'000'000;

// After this many setups the heap is worth handing back once they are over (a handful of redials
// is not); and how long no stream may be setting up before that counts as over. The release
// costs milliseconds on the I/O thread, so it waits for a quiet moment rather than running
// under load.
constexpr uint64_t kReleaseAfterSetups = 64;
constexpr int64_t kReleaseSettleNs = 1'000'000'000;

// EndpointOptions::max_pending_streams as it applies to this process: the default filled in,
// then capped at half the descriptor limit. Without the cap, a flood at the limit took every
// descriptor for half-open connections, and /healthz waited seconds for one (issue #17).
size_t PendingStreamLimit(const EndpointOptions& o) {
  size_t limit = o.max_pending_streams;
  if (limit == 0) {
    limit = std::max<size_t>(256, 2 * o.peer_regions.size() *
                                      static_cast<size_t>(std::max(o.link.max_streams, 1)));
  }
  rlimit files{};
  if (::getrlimit(RLIMIT_NOFILE, &files) == 0 && files.rlim_cur != RLIM_INFINITY) {
    limit = std::min<size_t>(limit, std::max<size_t>(8, files.rlim_cur / 2));
  }
  return limit;
}

// Asio's reactor gives every descriptor it watches a small state object from a pool that only
// grows, to the most descriptors ever open at once. Grown during a flood, a few hundred of these
// land between the flood's short-lived allocations, and once the flood is freed each keeps a page
// of the heap resident: 1-2 MB that never came back (issue #17's RSS goal). Grown here, at
// start, they sit side by side and later floods reuse them. At most a quarter of the descriptor
// limit is held for it, for a moment: the process's other threads are still starting (event
// loops, listeners) and must not find the table full -- at a limit of 64 or 128 they did, and
// straitd failed to start ("epoll: Too many open files"). Below that, a flood grows the pool.
void ReserveDescriptorStates(asio::io_context& io, size_t count) {
  rlimit files{};
  if (::getrlimit(RLIMIT_NOFILE, &files) == 0 && files.rlim_cur != RLIM_INFINITY) {
    count = std::min<size_t>(count, files.rlim_cur / 4);
  }
  std::vector<tcp::socket> sockets;
  sockets.reserve(count);
  for (size_t i = 0; i < count; ++i) {
    asio::error_code ec;
    tcp::socket socket(io);
    socket.open(tcp::v4(), ec);
    if (ec) break;
    sockets.push_back(std::move(socket));
  }
  STRAIT_LOG(kDebug, "net") << "reserved reactor states for " << sockets.size()
                            << " descriptors";
}

}  // namespace

// ---- EndpointCore -----------------------------------------------------------------------------

void EndpointCore::StartAccepting(std::unique_ptr<tcp::acceptor> acceptor) {
  acceptor_ = std::move(acceptor);
  max_pending_ = PendingStreamLimit(options_);
  STRAIT_LOG(kDebug, "net") << "at most " << max_pending_
                            << " accepted streams setting up at once";
  // The peak a flood reaches: every pending slot taken, the one being accepted, and the links'
  // own streams beside them.
  ReserveDescriptorStates(io_, max_pending_ + 1 + options_.peer_regions.size() *
                                                   static_cast<size_t>(options_.link.max_streams));
  AcceptNext(false);
}

void EndpointCore::StartAcceptingInRegion(std::unique_ptr<tcp::acceptor> acceptor,
                                          std::set<asio::ip::address> hosts) {
  region_acceptor_ = std::move(acceptor);
  region_hosts_ = std::move(hosts);
  AcceptNext(true);
}

void EndpointCore::MakeRoomForSetup() {
  if (handshaking_.size() < max_pending_) return;
  // Closed streams wait here for their pending step's handler; only open ones count.
  size_t open = 0;
  StreamConn* oldest = nullptr;
  for (const auto& stream : handshaking_) {
    if (stream->closed()) continue;
    ++open;
    if (oldest == nullptr || stream->accepted_ns < oldest->accepted_ns) oldest = stream.get();
  }
  if (open >= max_pending_ && oldest != nullptr) oldest->Evict();
}

void EndpointCore::EndSetup(const std::shared_ptr<StreamConn>& stream) {
  handshaking_.erase(stream);
  if (!handshaking_.empty() || setups_since_release_ < kReleaseAfterSetups || release_armed_ ||
      shut_down_) {
    return;
  }
  release_armed_ = true;
  release_timer_.expires_after(std::chrono::nanoseconds(kReleaseSettleNs));
  release_timer_.async_wait([self = shared_from_this()](const asio::error_code& ec) {
    self->release_armed_ = false;
    if (!ec) self->ReleaseHeapIfQuiet();
  });
}

void EndpointCore::ReleaseHeapIfQuiet() {
  // Still busy: the next EndSetup that empties handshaking_ arms the timer again.
  if (shut_down_ || !handshaking_.empty()) return;
  const uint64_t setups = setups_since_release_;
  setups_since_release_ = 0;
  Stopwatch took;
  const bool released = ReleaseFreeHeap();
  STRAIT_LOG(kDebug, "net") << "after " << setups << " stream setups: "
                            << (released ? "released free heap to the system"
                                         : "no free heap to release")
                            << " in " << FormatDuration(took.ElapsedNanos());
}

void EndpointCore::AcceptNext(bool in_region) {
  tcp::acceptor* acceptor = in_region ? region_acceptor_.get() : acceptor_.get();
  if (acceptor == nullptr || shut_down_) return;
  acceptor->async_accept([self = shared_from_this(), in_region](const asio::error_code& ec,
                                                                tcp::socket socket) {
    if (self->shut_down_) return;
    if (ec == asio::error::operation_aborted) return;  // the acceptor was closed
    AcceptPause& pause = in_region ? self->region_accept_pause_ : self->accept_pause_;
    if (ec) {
      return pause.OnFailure(ec, [self, in_region] {
        if (!self->shut_down_) self->AcceptNext(in_region);
      });
    }
    pause.OnSuccess();
    {
      asio::error_code pec;
      const tcp::endpoint remote = socket.remote_endpoint(pec);
      const std::string peer = pec ? std::string("unknown peer")
                                   : remote.address().to_string() + ":" +
                                         std::to_string(remote.port());
      // The in-region listener is plain TCP whatever the endpoint's transport, and nothing
      // authenticates its streams but where they come from: others are refused before they
      // take a setup slot (MakeRoomForSetup would evict a pending one for them).
      const bool listed =
          !pec && self->region_hosts_.count(UnmappedAddress(remote.address())) != 0;
      if (in_region && !listed) {
        auto stream = std::make_shared<StreamConn>(std::move(socket), nullptr, peer);
        self->Refuse(stream,
                     pec ? "its address cannot be read (" + pec.message() + ")"
                         : "not a gateway of region '" + self->options_.region +
                               "': the in-region listener admits only the region's gateway "
                               "addresses (a gateway with several addresses must dial from "
                               "the one listed)",
                     &EndpointCounters::unknown_region);
      } else {
        self->MakeRoomForSetup();
        auto stream = std::make_shared<StreamConn>(std::move(socket),
                                                   in_region ? nullptr : self->tls(), peer);
        stream->accepted_ns = MonotonicNanos();
        stream->in_region = in_region;
        ++self->setups_since_release_;
        self->SetUpAccepted(std::move(stream));
      }
    }
    self->AcceptNext(in_region);
  });
}

void EndpointCore::Register(const std::shared_ptr<LinkCore>& link) {
  if (shut_down_) {
    link->Shutdown();
    return;
  }
  links_.push_back(link);
}

void EndpointCore::Unregister(LinkCore* link) {
  for (auto it = sessions_.begin(); it != sessions_.end(); ++it) {
    if (it->second.get() == link) {
      sessions_.erase(it);
      break;
    }
  }
  auto it = std::find_if(links_.begin(), links_.end(),
                         [link](const auto& l) { return l.get() == link; });
  if (it == links_.end()) return;
  if (link->streams_up() > 0) {
    ended_.push_back(std::move(*it));
  } else {
    // Deferred: the caller is a member function of `link`, which this may be the last owner of.
    asio::post(io_, [keep = std::move(*it)] {});
  }
  links_.erase(it);
}

void EndpointCore::Released(LinkCore* link) {
  auto it = std::find_if(ended_.begin(), ended_.end(),
                         [link](const auto& l) { return l.get() == link; });
  if (it == ended_.end()) return;
  asio::post(io_, [keep = std::move(*it)] {});  // deferred, as in Unregister
  ended_.erase(it);
}

void EndpointCore::BeginShutdown() {
  shut_down_ = true;
  accept_pause_.Cancel();
  region_accept_pause_.Cancel();
  release_timer_.cancel();
  for (auto* acceptor : {acceptor_.get(), region_acceptor_.get()}) {
    asio::error_code ec;
    if (acceptor != nullptr) acceptor->close(ec);
  }
  for (auto& stream : handshaking_) stream->Close();
  handshaking_.clear();
  // Links that ended before (Link::Close) may still be writing close records: wait for those as
  // well, and drop their streams with the rest.
  closing_ = links_;
  closing_.insert(closing_.end(), ended_.begin(), ended_.end());
  for (auto& link : closing_) link->Shutdown();
  ended_.clear();  // Shutdown() added the links it ended; closing_ holds them all
  links_.clear();
  sessions_.clear();
  on_accept_ = nullptr;
}

bool EndpointCore::ShutdownDrained() const {
  return std::all_of(closing_.begin(), closing_.end(),
                     [](const auto& link) { return link->streams_up() == 0; });
}

void EndpointCore::FinishShutdown() {
  for (auto& link : closing_) link->DropAllStreams();
  closing_.clear();
}

// ---- Endpoint ---------------------------------------------------------------------------------

struct Endpoint::Impl {
  std::shared_ptr<Runtime> runtime;
  std::shared_ptr<EndpointCore> core;
  EndpointOptions options;
  std::mutex mu;
  bool listening = false;
  bool listening_in_region = false;
};

Endpoint::Endpoint(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Endpoint::~Endpoint() {
  // Close records go out first (so that peers do not redial for unreachable_after_ns), for at
  // most kShutdownDrainNs.
  impl_->runtime->Shutdown([core = impl_->core] { core->BeginShutdown(); },
                           [core = impl_->core] { return core->ShutdownDrained(); },
                           [core = impl_->core] { core->FinishShutdown(); }, kShutdownDrainNs);
}

namespace {

Status CheckOptions(const EndpointOptions& o) {
  if (!IsValidRegionName(o.region)) {
    return InvalidArgumentError("region '" + o.region +
                                "' is not a valid region name (1-63 of a-z 0-9 . _ -)");
  }
  for (const std::string& peer : o.peer_regions) {
    if (!IsValidRegionName(peer)) {
      return InvalidArgumentError("peer region '" + peer + "' is not a valid region name");
    }
  }
  const LinkOptions& l = o.link;
  if (l.streams < 1 || l.streams > kMaxStreams || l.min_streams < 1 ||
      l.max_streams > kMaxStreams || l.min_streams > l.max_streams) {
    return InvalidArgumentError("streams must satisfy 1 <= min_streams <= streams <= "
                                "max_streams <= " + std::to_string(kMaxStreams));
  }
  if (l.adapt_streams && (l.streams < l.min_streams || l.streams > l.max_streams)) {
    return InvalidArgumentError("with adapt_streams, streams (" + std::to_string(l.streams) +
                                ") must lie within [min_streams, max_streams] = [" +
                                std::to_string(l.min_streams) + ", " +
                                std::to_string(l.max_streams) +
                                "]; raise max_streams or set adapt_streams = false for a fixed K");
  }
  if (l.max_partial_bytes < l.max_message_bytes) {
    return InvalidArgumentError("max_partial_bytes must be at least max_message_bytes");
  }
  if (l.close_flush_ns < 0) return InvalidArgumentError("close_flush_ns must not be negative");
  if (l.chunk_bytes == 0 || l.chunk_bytes > kMaxChunkPayload || l.min_chunk_bytes == 0 ||
      l.max_chunk_bytes > kMaxChunkPayload || l.min_chunk_bytes > l.max_chunk_bytes) {
    return InvalidArgumentError("chunk sizes must be within 1 byte .. 16 MiB, min <= max");
  }
  if (l.max_inflight_per_stream == 0 || l.handshake_timeout_ns <= 0 ||
      l.redial_initial_ns <= 0 || l.redial_max_ns < l.redial_initial_ns ||
      l.unreachable_after_ns <= 0 || l.ping_interval_ns <= 0 ||
      l.stream_timeout_ns <= l.ping_interval_ns) {
    return InvalidArgumentError("link timeouts and limits must be positive, with "
                                "redial_max >= redial_initial and stream_timeout > ping_interval");
  }
  if (l.tcp_rto_max_ns != 0 &&
      (l.tcp_rto_max_ns < kMinTcpRtoMaxNs || l.tcp_rto_max_ns > kMaxTcpRtoMaxNs)) {
    return InvalidArgumentError("tcp_rto_max must be 0 (the kernel's) or 1s .. 120s");
  }
  return Status::Ok();
}

}  // namespace

Status CheckEndpoint(const EndpointOptions& options, EndpointSetting* setting) {
  EndpointSetting ignored = EndpointSetting::kNone;
  if (setting == nullptr) setting = &ignored;
  *setting = EndpointSetting::kOptions;
  STRAIT_RETURN_IF_ERROR(CheckOptions(options));
  *setting = EndpointSetting::kCongestionControl;
  STRAIT_RETURN_IF_ERROR(CheckCongestionControl(options.link.congestion_control));
  *setting = EndpointSetting::kNone;
  if (options.transport == Transport::kTls) {
    STRAIT_RETURN_IF_ERROR(LoadTlsIdentity(options.region, options.ca_file, options.cert_file,
                                           options.key_file, setting)
                               .status());
  }
  return Status::Ok();
}

StatusOr<std::unique_ptr<Endpoint>> Endpoint::Create(EndpointOptions options,
                                                     AcceptCallback on_accept) {
  STRAIT_RETURN_IF_ERROR(CheckOptions(options));
  STRAIT_RETURN_IF_ERROR(CheckCongestionControl(options.link.congestion_control));
  std::unique_ptr<asio::ssl::context> tls;
  if (options.transport == Transport::kTls) {
    STRAIT_ASSIGN_OR_RETURN(tls, LoadTlsIdentity(options.region, options.ca_file,
                                                 options.cert_file, options.key_file));
  } else {
    STRAIT_LOG(kWarn, "net") << "endpoint " << options.region
                             << " uses plain TCP: no encryption, no peer authentication";
  }
  auto impl = std::make_unique<Impl>();
  impl->options = options;
  impl->runtime = std::make_shared<Runtime>();
  impl->core = std::make_shared<EndpointCore>(impl->runtime->io(), std::move(options),
                                              std::move(tls), std::move(on_accept),
                                              impl->runtime);
  return std::unique_ptr<Endpoint>(new Endpoint(std::move(impl)));
}

namespace {

// A bound, listening acceptor on the endpoint's io_context (not yet accepting: the I/O thread
// starts that), and the port it got; Listen and ListenInRegion share it.
StatusOr<std::pair<std::shared_ptr<tcp::acceptor>, uint16_t>> OpenAcceptor(
    asio::io_context& io, const std::string& address, uint16_t port) {
  asio::error_code ec;
  const asio::ip::address ip = asio::ip::make_address(address, ec);
  if (ec) return InvalidArgumentError("listen address '" + address + "' is not a numeric IP");
  auto acceptor = std::make_shared<tcp::acceptor>(io);
  const tcp::endpoint at(ip, port);
  const std::string where = address + ":" + std::to_string(port);
  acceptor->open(at.protocol(), ec);
  if (!ec) acceptor->set_option(tcp::acceptor::reuse_address(true), ec);
  if (!ec) acceptor->bind(at, ec);
  if (!ec) acceptor->listen(asio::socket_base::max_listen_connections, ec);
  if (ec) return ErrorCodeStatus("cannot listen on " + where, ec);
  const uint16_t bound = acceptor->local_endpoint(ec).port();
  if (ec) return InternalError("cannot read the bound port: " + ec.message());
  return std::make_pair(std::move(acceptor), bound);
}

}  // namespace

asio::ip::address UnmappedAddress(const asio::ip::address& a) {
  if (a.is_v6() && a.to_v6().is_v4_mapped()) {
    return asio::ip::make_address_v4(asio::ip::v4_mapped, a.to_v6());
  }
  return a;
}

StatusOr<uint16_t> Endpoint::Listen(const std::string& address, uint16_t port) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  if (impl_->listening) return FailedPreconditionError("this endpoint already listens");
  // The acceptor is set up here, before the I/O thread ever sees it.
  STRAIT_ASSIGN_OR_RETURN(auto opened, OpenAcceptor(impl_->runtime->io(), address, port));
  if (!impl_->runtime->Post([core = impl_->core, shared = opened.first]() mutable {
        core->StartAccepting(std::make_unique<tcp::acceptor>(std::move(*shared)));
      })) {
    return UnavailableError("endpoint is shutting down");
  }
  impl_->listening = true;
  STRAIT_LOG(kInfo, "net") << "region " << impl_->options.region << " listening on " << address
                           << ":" << opened.second;
  return opened.second;
}

StatusOr<uint16_t> Endpoint::ListenInRegion(const std::string& address, uint16_t port,
                                            const std::vector<std::string>& region_hosts) {
  std::set<asio::ip::address> hosts;
  for (const std::string& h : region_hosts) {
    asio::error_code ec;
    const asio::ip::address ip = asio::ip::make_address(h, ec);
    if (ec) return InvalidArgumentError("region gateway address '" + h + "' is not a numeric IP");
    hosts.insert(UnmappedAddress(ip));
  }
  if (hosts.empty()) {
    return InvalidArgumentError("an in-region listener needs the region's gateway addresses");
  }
  const std::vector<std::string>& peers = impl_->options.peer_regions;
  if (std::find(peers.begin(), peers.end(), impl_->options.region) == peers.end()) {
    return FailedPreconditionError("an in-region listener admits region '" +
                                   impl_->options.region +
                                   "' only, which is not among the endpoint's peer_regions; add "
                                   "it there");
  }
  std::lock_guard<std::mutex> lock(impl_->mu);
  if (impl_->listening_in_region) {
    return FailedPreconditionError("this endpoint already listens for its region");
  }
  STRAIT_ASSIGN_OR_RETURN(auto opened, OpenAcceptor(impl_->runtime->io(), address, port));
  if (!impl_->runtime->Post([core = impl_->core, shared = opened.first,
                             hosts = std::move(hosts)]() mutable {
        core->StartAcceptingInRegion(std::make_unique<tcp::acceptor>(std::move(*shared)),
                                     std::move(hosts));
      })) {
    return UnavailableError("endpoint is shutting down");
  }
  impl_->listening_in_region = true;
  STRAIT_LOG(kInfo, "net") << "region " << impl_->options.region
                           << " listening for its own gateways on " << address << ":"
                           << opened.second << " (plain TCP)";
  return opened.second;
}

StatusOr<std::shared_ptr<Link>> Endpoint::Connect(const std::string& peer_region,
                                                  const std::string& address, uint16_t port,
                                                  MessageCallback on_message) {
  return Dial(peer_region, address, port, std::move(on_message), /*in_region=*/false);
}

StatusOr<std::shared_ptr<Link>> Endpoint::ConnectInRegion(const std::string& address,
                                                          uint16_t port,
                                                          MessageCallback on_message) {
  return Dial(impl_->options.region, address, port, std::move(on_message), /*in_region=*/true);
}

StatusOr<std::shared_ptr<Link>> Endpoint::Dial(const std::string& peer_region,
                                               const std::string& address, uint16_t port,
                                               MessageCallback on_message, bool in_region) {
  if (!IsValidRegionName(peer_region)) {
    return InvalidArgumentError("peer region '" + peer_region + "' is not a valid region name");
  }
  asio::error_code ec;
  const asio::ip::address ip = asio::ip::make_address(address, ec);
  if (ec) return InvalidArgumentError("peer address '" + address + "' is not a numeric IP");
  if (port == 0) return InvalidArgumentError("peer port must not be 0");
  auto core = std::make_shared<LinkCore>(impl_->core, LinkCore::Role::kDialer, peer_region,
                                         tcp::endpoint(ip, port), RandomU64(),
                                         std::move(on_message), in_region);
  if (!impl_->runtime->Post([endpoint = impl_->core, core] {
        endpoint->Register(core);
        if (core->active()) core->Start();
      })) {
    return UnavailableError("endpoint is shutting down");
  }
  return std::make_shared<Link>(
      std::make_unique<Link::Impl>(Link::Impl{impl_->runtime, std::move(core)}));
}

EndpointCounters Endpoint::Counters() const { return impl_->core->Counters(); }

Status Endpoint::ReloadIdentity() {
  const EndpointOptions& o = impl_->options;
  if (o.transport != Transport::kTls) {
    return FailedPreconditionError(
        "this endpoint uses plain TCP: there is no TLS identity to reload");
  }
  StatusOr<std::unique_ptr<asio::ssl::context>> tls =
      LoadTlsIdentity(o.region, o.ca_file, o.cert_file, o.key_file);
  if (!tls.ok()) {
    return tls.status().WithContext("reloading the TLS identity (the old one stays in use)");
  }
  impl_->core->ReplaceTls(std::move(*tls));
  STRAIT_LOG(kInfo, "net") << "region " << o.region << " reloaded its TLS identity from '"
                           << o.cert_file << "'; new handshakes use it";
  return Status::Ok();
}

const EndpointOptions& Endpoint::options() const { return impl_->options; }

}  // namespace strait::net

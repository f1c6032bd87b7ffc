// The process around a gateway's shards (Gateway::Host in gateway_impl.h; "Multi-shard gateways"
// in config.h): one WAN endpoint and port, one local socket, one HTTP server and one lock file
// per shard for all the shards a straitd serves, with links to peer gateways shared by the shards
// that reach the same address, each shard on its own block of link channels. Also the Gateway's
// public lifecycle (Start, Shutdown) which sets all of that up and takes it down.
#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <system_error>
#include <thread>
#include <utility>
#include <vector>

#include "collective/channels.h"
#include "common/log.h"
#include "common/system_error.h"
#include "gateway/config_check.h"
#include "gateway/gateway_impl.h"

namespace strait::gateway {
namespace {

constexpr const char* kLog = "gateway";

std::string ShardLockPath(const GatewayConfig& config, int shard) {
  const size_t slash = config.local_socket.rfind('/');
  const std::string dir =
      slash == std::string::npos ? std::string("./") : config.local_socket.substr(0, slash + 1);
  return dir + ".straitd-" + config.region + "-shard-" + std::to_string(shard) + ".lock";
}

// Takes shard `shard`'s lock file (exclusive, not waiting); its descriptor, or the error naming
// the other process. `keep` false: released at once (a config check).
StatusOr<int> LockShard(const GatewayConfig& config, int shard, bool keep) {
  const std::string path = ShardLockPath(config, shard);
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  if (fd < 0) {
    const int err = errno;
    // The socket's directory is checked (and created by systemd/Kubernetes) where the socket is
    // bound; without write access there the lock cannot guard anything, and the start fails on
    // the socket anyway.
    return ErrnoStatus("cannot open the shard lock " + path, err, StatusCode::kUnavailable,
                       err == ENOENT
                           ? "; fix: create local.socket's directory, owned by straitd's user "
                             "(systemd: RuntimeDirectory=strait makes /run/strait)"
                           : "; fix: make local.socket's directory writable for straitd");
  }
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    char pid[32] = {};
    const ssize_t n = ::pread(fd, pid, sizeof(pid) - 1, 0);
    ::close(fd);
    if (err != EWOULDBLOCK) {
      return UnavailableError("cannot lock " + path + ": " + std::strerror(err));
    }
    std::string holder = n > 0 ? std::string(pid, static_cast<size_t>(n)) : std::string("?");
    holder.erase(std::remove(holder.begin(), holder.end(), '\n'), holder.end());
    return FailedPreconditionError(
        config.file + ": shard " + std::to_string(shard) + " of region " + config.region +
        " is already served by another straitd on this node (pid " + holder + ", lock " + path +
        "); fix: give each straitd of a node its own shards (shard_index / shards), or stop the "
        "other one");
  }
  if (!keep) {
    ::close(fd);
    return -1;
  }
  const std::string text = std::to_string(::getpid()) + "\n";
  if (::ftruncate(fd, 0) != 0 ||
      ::pwrite(fd, text.data(), text.size(), 0) != static_cast<ssize_t>(text.size())) {
    STRAIT_LOG(kWarn, kLog) << "cannot write the pid into " << path;
  }
  return fd;
}

// Whether process `pid` was started with `config_file` (the same file, by real path) as an
// argument: the running straitd of the config being checked.
bool RunsConfig(const std::string& pid, const std::string& config_file) {
  std::error_code ec;
  const std::filesystem::path mine = std::filesystem::weakly_canonical(config_file, ec);
  std::ifstream in("/proc/" + pid + "/cmdline", std::ios::binary);
  std::string arg;
  while (std::getline(in, arg, '\0')) {
    if (arg.rfind("--config=", 0) == 0) arg = arg.substr(9);
    std::error_code ec2;
    const std::filesystem::path p = std::filesystem::weakly_canonical(arg, ec2);
    if (!ec && !ec2 && !arg.empty() && p == mine) return true;
  }
  return false;
}

}  // namespace

Status CheckShardLocks(const GatewayConfig& config) {
  for (const int k : config.shards) {
    auto fd = LockShard(config, k, /*keep=*/false);
    // A lock file that cannot be opened (no socket directory yet: nothing runs there) guards
    // nothing to check; the start reports it.
    if (fd.ok() || fd.status().code() != StatusCode::kFailedPrecondition) continue;
    // Held: fine when the holder is this very config's straitd (a check of the running config).
    std::ifstream in(ShardLockPath(config, k));
    std::string pid;
    std::getline(in, pid);
    if (pid.empty() || !RunsConfig(pid, config.file)) return fd.status();
  }
  return Status::Ok();
}


Gateway::Impl* Gateway::Host::Shard(uint32_t k) const {
  for (const auto& s : shards) {
    if (static_cast<uint32_t>(s->config.shard_index) == k) return s.get();
  }
  return nullptr;
}

net::MessageCallback Gateway::Host::Demux(std::map<uint32_t, net::MessageCallback> by_shard,
                                          const std::string& from) {
  auto dropped = std::make_shared<std::atomic<uint64_t>>(0);
  return [by_shard = std::move(by_shard), from, dropped](uint32_t channel,
                                                         std::vector<uint8_t> message) {
    const uint32_t k = channel / collective::kShardChannelStride;
    auto it = by_shard.find(k);
    if (it != by_shard.end()) {
      it->second(channel % collective::kShardChannelStride, std::move(message));
      return;
    }
    // Once per power of two: a peer that keeps sending a shard this gateway does not serve
    // (peers' shard addresses pointing here) must not flood the log.
    const uint64_t n = ++*dropped;
    if ((n & (n - 1)) == 0) {
      STRAIT_LOG(kWarn, kLog) << "dropped " << n << " message(s) from region " << from
                              << " for shard " << k
                              << ", which this gateway does not serve (do peers."
                              << "<region>.shard_" << k << " addresses point here by mistake?)";
    }
  };
}

StatusOr<std::shared_ptr<net::Link>> Gateway::Host::Dial(const std::string& region,
                                                         const HostPort& addr, int k) {
  const std::string key = region + " " + addr.ToString();
  std::shared_ptr<net::Link> link;
  {
    std::lock_guard<std::mutex> lock(mu);
    auto it = dialled.find(key);
    if (it != dialled.end() && !it->second->Estimates().ended) link = it->second;
  }
  if (link == nullptr) {
    std::map<uint32_t, net::MessageCallback> by_shard;
    for (const auto& s : shards) {
      const int p = s->RankOf(region);
      if (p >= 0) by_shard[static_cast<uint32_t>(s->config.shard_index)] = s->DialledReceiver(p);
    }
    auto dialed = endpoint->Connect(region, addr.host, addr.port,
                                    Demux(std::move(by_shard), region));
    if (!dialed.ok()) return dialed.status();
    std::lock_guard<std::mutex> lock(mu);
    // Two shards may have dialled at once: keep the first, the other's link is dropped unused.
    auto it = dialled.find(key);
    if (it != dialled.end() && !it->second->Estimates().ended) {
      (*dialed)->Close();
      link = it->second;
    } else {
      dialled[key] = *dialed;
      link = *dialed;
    }
  }
  return link->WithChannelBase(static_cast<uint32_t>(k) * collective::kShardChannelStride);
}

net::MessageCallback Gateway::Host::OnAccept(std::shared_ptr<net::Link> link) {
  if (link->peer_region() == config.region) {
    // Region links exist only with one shard per process (config.cc refuses the rest).
    STRAIT_LOG(kInfo, kLog) << "accepted link from a gateway of this region";
    return shards.front()->RegionReceiver();
  }
  STRAIT_LOG(kInfo, kLog) << "accepted link from " << link->peer_region();
  {
    std::lock_guard<std::mutex> lock(mu);
    std::deque<std::shared_ptr<net::Link>>& newest = accepted[link->peer_region()];
    newest.push_back(link);
    while (newest.size() > shards.size()) newest.pop_front();
  }
  std::map<uint32_t, net::MessageCallback> by_shard;
  for (const auto& s : shards) {
    by_shard[static_cast<uint32_t>(s->config.shard_index)] = s->AcceptedReceiver(link);
  }
  return Demux(std::move(by_shard), link->peer_region());
}

Message Gateway::Host::Handle(Message& request) {
  const uint32_t k = request.client_shard;
  Impl* shard = k == localproto::kAnyShard && shards.size() == 1 ? shards.front().get()
                                                                  : Shard(k);
  if (shard == nullptr) {
    const std::string served = ShardListText(config.shards);
    const Status why =
        k == localproto::kAnyShard
            ? FailedPreconditionError("this straitd serves shards " + served +
                                      " of region " + config.region +
                                      "; the client must name its shard in its hello "
                                      "(libstrait: the rank's index in its region)")
            : FailedPreconditionError("this straitd serves shard" +
                                      std::string(shards.size() > 1 ? "s " : " ") + served +
                                      " of region " + config.region + ", not shard " +
                                      std::to_string(k) +
                                      "; connect to the straitd that serves it (each rank r of "
                                      "a region uses the gateway of shard r)");
    // A hello naming no shard is fine: the requests that need one are refused.
    if (request.type == MessageType::kHello && k == localproto::kAnyShard) {
      Message m = localproto::ReplyMessage(MessageType::kHello, Status::Ok());
      m.text = "straitd " + config.region + " shards " + served;
      return m;
    }
    return localproto::ReplyMessage(request.type, why);
  }
  return shard->Handle(request);
}

void Gateway::Host::ServeTunnel(int fd, const Message& request) {
  // A connect names the listener's shard (the gateway pair that carries it); a listen or accept
  // belongs to the client's shard, or the first one when it named none.
  Impl* shard = nullptr;
  if (request.type == MessageType::kTunnelConnect) shard = Shard(request.tunnel_shard);
  if (shard == nullptr) shard = Shard(request.client_shard);
  if (shard == nullptr) shard = shards.front().get();
  shard->tunnels->Serve(fd, request);
}

Status Gateway::Host::ServeSocket() {
  LocalServerOptions options;
  options.path = config.local_socket;
  options.allowed_uids = config.allowed_uids;
  options.allowed_gids = config.allowed_gids;
  LocalServerHooks hooks;
  hooks.may_block = &Impl::MayBlock;
  hooks.handle = [this](Message& request) { return Handle(request); };
  hooks.serve_tunnel = [this](int fd, const Message& request) { ServeTunnel(fd, request); };
  hooks.attach = [this](asio::io_context& loop) {
    for (const auto& s : shards) s->tunnels->Start(loop);
  };
  hooks.tick = [this] {
    for (const auto& s : shards) s->RedialEndedLinks();
  };
  // Connection counters are the process's: they appear on the first shard.
  Impl& first = *shards.front();
  auto server = LocalServer::Start(
      std::move(options), std::move(hooks),
      {&first.connections, &first.refused_connections, &first.bad_requests,
       &first.shm_regions});
  if (!server.ok()) return server.status();
  local = std::move(server).value();
  return Status::Ok();
}

StatusOr<std::unique_ptr<Gateway>> Gateway::Start(const GatewayConfig& config) {
  try {
    return StartOrThrow(config);
  } catch (const std::system_error& e) {
    // Asio's event loops (epoll, eventfd, timerfd) and std::thread throw what the kernel refused.
    return SystemErrorStatus("cannot start", e, StatusCode::kResourceExhausted,
                             "; check the process's limits (ulimit -a)");
  }
}

StatusOr<std::unique_ptr<Gateway>> Gateway::StartOrThrow(const GatewayConfig& config) {
  auto host = std::make_unique<Host>();
  Host* h = host.get();
  h->config = config;
  // A config built in code may set shard_index alone: that is its one shard.
  if (h->config.shards.size() <= 1) h->config.shards = {config.shard_index};
  for (const int k : h->config.shards) {
    auto fd = LockShard(h->config, k, /*keep=*/true);
    if (!fd.ok()) {
      h->UnlockShards();
      return fd.status();
    }
    h->lock_fds.push_back(*fd);
  }
  // Released with the process, or here when the start fails.
  struct Unlock {
    Host* h;
    bool armed = true;
    ~Unlock() {
      if (armed) h->UnlockShards();
    }
  } unlock{h};

  const std::vector<net::CodecProfile> profiles = net::MeasureCodecProfiles();
  for (const net::CodecProfile& cp : profiles) {
    STRAIT_LOG(kInfo, kLog) << "codec " << CodecName(cp.codec) << ": encode "
                            << cp.encode_bytes_per_s / 1e6 << " MB/s, decode "
                            << cp.decode_bytes_per_s / 1e6 << " MB/s, ratio " << cp.ratio
                            << " (measured for policy auto)";
  }
  for (const int k : h->config.shards) {
    auto shard = std::make_unique<Impl>();
    shard->Init(h->config.ForShard(k), h, profiles);
    h->shards.push_back(std::move(shard));
  }

  // The same options `straitd --check-config` checks (config_check.h).
  const net::EndpointOptions o = EndpointOptionsOf(config);
  auto endpoint = net::Endpoint::Create(
      o, [h](std::shared_ptr<net::Link> link) { return h->OnAccept(std::move(link)); });
  if (!endpoint.ok()) return endpoint.status().WithContext("config " + config.file);
  h->endpoint = std::move(endpoint).value();
  auto port = h->endpoint->Listen(config.wan_listen.host, config.wan_listen.port);
  if (!port.ok()) return port.status().WithContext("wan.listen " + config.wan_listen.ToString());
  h->wan_port = *port;
  if (config.region_listen) {
    // Plain region links ("Plain region links" in config.h): only the region's gateways get in.
    std::vector<std::string> hosts;
    for (const auto& [index, addr] : config.region_gateways) hosts.push_back(addr.host);
    auto region_port =
        h->endpoint->ListenInRegion(config.region_listen->host, config.region_listen->port, hosts);
    if (!region_port.ok()) {
      return region_port.status().WithContext("region_links.listen " +
                                              config.region_listen->ToString());
    }
  }
  // Each pair's link is dialled by one side only (config.h, "Dial-only regions"): the lower
  // rank, or the side behind NAT.
  if (config.dial_only) {
    STRAIT_LOG(kInfo, kLog) << "wan.dial = \"outbound-only\": this region admits no "
                               "inbound link, so this gateway dials every peer region";
  }
  for (const auto& s : h->shards) {
    for (size_t p = 0; p < s->world.size(); ++p) {
      if (static_cast<int>(p) == s->rank || !config.Dials(s->world[p])) continue;
      STRAIT_RETURN_IF_ERROR(s->DialPeer(static_cast<int>(p)));
    }
    for (const auto& [index, addr] : s->config.region_gateways) {
      STRAIT_RETURN_IF_ERROR(s->DialRegionGateway(index));
    }
  }
  std::unique_ptr<Gateway> gateway(new Gateway(std::move(host)));  // private constructor
  unlock.armed = false;
  STRAIT_RETURN_IF_ERROR(h->ServeSocket());
  STRAIT_RETURN_IF_ERROR(h->StartHttp());
  STRAIT_LOG(kInfo, kLog) << "serving " << h->config.Summary() << ", wan port " << h->wan_port;
  return gateway;
}

void Gateway::Host::Shutdown(Deadline grace) {
  {
    std::lock_guard<std::mutex> lock(mu);
    if (shut_down) return;
    shut_down = true;
  }
  for (const auto& s : shards) {
    // Under the lock that all-reduces take to count themselves in flight: each either saw
    // `stopping` and refused, or is counted before the wait below.
    std::lock_guard<std::mutex> lock(s->mu);
    s->stopping.store(true);
  }
  http.reset();  // its handlers read the links and jobs
  // Stop accepting, so that no new request starts while in-flight ones finish.
  if (local != nullptr) local->StopAccepting();
  auto in_flight = [this] {
    int n = 0;
    for (const auto& s : shards) n += s->in_flight.load();
    return n;
  };
  while (in_flight() > 0 && !grace.Expired()) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  if (in_flight() > 0) {
    STRAIT_LOG(kWarn, kLog) << in_flight()
                            << " all-reduce(s) still running at the end of the shutdown grace; "
                               "closing the links fails them";
  }
  // All-reduces answer before their last sends are acknowledged (collective/allreduce.cc), so
  // the links may still carry results that other regions wait for: close them with a flush
  // (Link::Close sends what is queued and waits for its acknowledgements), within the grace,
  // before the endpoint goes. A link with no stream up has nothing to flush.
  std::vector<std::shared_ptr<net::Link>> open;
  for (const auto& s : shards) {
    std::lock_guard<std::mutex> lock(s->mu);
    for (const auto& l : s->links) {
      if (l != nullptr) open.push_back(l);
    }
    for (const auto& l : s->region_links) {
      if (l != nullptr) open.push_back(l);
    }
  }
  for (const auto& l : open) l->Close();
  for (const auto& l : open) {
    for (;;) {
      const net::LinkEstimates e = l->Estimates();
      if (e.ended || e.streams_up == 0 || grace.Expired()) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  }
  // Closing the endpoint fails the links, which ends any all-reduce still waiting on a peer.
  endpoint.reset();
  // The requests still running end now; their replies go out, then every connection closes.
  if (local != nullptr) local->Stop();
  UnlockShards();
}

void Gateway::Host::UnlockShards() {
  // Removed while still held, so that a clean stop leaves no file behind; a process that opened
  // the file just before may still lock the removed file, a window of microseconds at a stop.
  for (size_t i = 0; i < lock_fds.size(); ++i) {
    ::unlink(ShardLockPath(config, config.shards[i]).c_str());
    ::close(lock_fds[i]);
  }
  lock_fds.clear();
}

Gateway::Host::~Host() {
  if (local != nullptr) local->Stop();
  for (const auto& s : shards) s->tunnels.reset();
  local.reset();
}

Gateway::Gateway(std::unique_ptr<Host> host) : host_(std::move(host)) {}

Gateway::~Gateway() { Shutdown(Deadline::After(host_->config.shutdown_grace_ns)); }

void Gateway::Shutdown(Deadline grace) { host_->Shutdown(grace); }

uint16_t Gateway::wan_port() const { return host_->wan_port; }

Status Gateway::ReloadIdentity() {
  if (host_->endpoint == nullptr) return FailedPreconditionError("the gateway is shut down");
  return host_->endpoint->ReloadIdentity();
}

std::string Gateway::StatsText() const {
  Message m;
  m.type = MessageType::kStats;
  const Message reply = host_->shards.front()->Handle(m);  // stats take nothing from the request
  return std::string(reply.data.begin(), reply.data.end());
}

}  // namespace strait::gateway

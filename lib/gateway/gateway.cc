// The gateway behind straitd (see gateway.h).
#include "gateway/gateway.h"

#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <map>
#include <mutex>
#include <sstream>
#include <thread>
#include <utility>
#include <vector>

#include "collective/allreduce.h"
#include "collective/net_transport.h"
#include "common/log.h"
#include "gateway/gateway_impl.h"

namespace strait::gateway {
namespace {

constexpr const char* kLog = "gateway";
constexpr int kPollSliceMs = 100;

// FNV-1a: stable across builds and machines, which std::hash is not.
uint64_t Fnv1a(uint64_t h, const void* data, size_t n) {
  const auto* p = static_cast<const uint8_t*>(data);
  for (size_t i = 0; i < n; ++i) {
    h ^= p[i];
    h *= 0x100000001b3ull;
  }
  return h;
}

}  // namespace

uint64_t OperationId(const std::string& job, const std::string& tensor_key, uint64_t sequence) {
  uint64_t h = 0xcbf29ce484222325ull;
  const uint64_t sizes[2] = {job.size(), tensor_key.size()};
  h = Fnv1a(h, sizes, sizeof(sizes));  // lengths first, so ("ab","c") differs from ("a","bc")
  h = Fnv1a(h, job.data(), job.size());
  h = Fnv1a(h, tensor_key.data(), tensor_key.size());
  h = Fnv1a(h, &sequence, sizeof(sequence));
  return h & ((uint64_t{1} << 38) - 1);
}


Message Reply(MessageType to, const Status& status) {
  Message m;
  m.type = MessageType::kReply;
  m.reply_to = to;
  m.code = status.code();
  m.text = status.message().substr(0, kMaxReplyTextBytes);
  return m;
}

Status Gateway::Impl::ServeSocket() {
  const std::string& path = config.local_socket;
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, path.data(), std::min(path.size(), sizeof(addr.sun_path) - 1));
  // A socket file left by a crashed straitd blocks bind(); nothing else may live there.
  struct stat st {};
  if (::lstat(path.c_str(), &st) == 0) {
    if (!S_ISSOCK(st.st_mode)) {
      return FailedPreconditionError("local.socket " + path +
                                     " exists and is not a socket; refusing to replace it");
    }
    ::unlink(path.c_str());
  }
  listen_fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (listen_fd < 0) return UnavailableError(std::string("socket(): ") + std::strerror(errno));
  if (::bind(listen_fd, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)) != 0) {
    return UnavailableError("cannot bind local.socket " + path + ": " + std::strerror(errno));
  }
  if (::chmod(path.c_str(), 0660) != 0) {
    return UnavailableError("cannot chmod 0660 local.socket " + path + ": " +
                            std::strerror(errno));
  }
  if (::listen(listen_fd, 64) != 0) {
    return UnavailableError("cannot listen on local.socket " + path + ": " +
                            std::strerror(errno));
  }
  accept_thread = std::thread([this] { AcceptLoop(); });
  return Status::Ok();
}

void Gateway::Impl::AcceptLoop() {
  while (!stopping.load()) {
    pollfd p{listen_fd, POLLIN, 0};
    if (::poll(&p, 1, kPollSliceMs) <= 0) continue;
    const int fd = ::accept4(listen_fd, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) continue;
    ucred cred{};
    socklen_t len = sizeof(cred);
    bool allowed = false;
    if (::getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) == 0) {
      const auto& uids = config.allowed_uids;
      const auto& gids = config.allowed_gids;
      allowed = std::find(uids.begin(), uids.end(), cred.uid) != uids.end() ||
                std::find(gids.begin(), gids.end(), cred.gid) != gids.end();
    }
    if (!allowed) {
      ++refused_connections;
      STRAIT_LOG(kWarn, kLog) << "refused local client pid " << cred.pid << " uid " << cred.uid
                              << " gid " << cred.gid << ": not in local.allowed_uids/gids";
      // Answer the hello so that the client sees why, then drop it.
      auto body = ReadFrame(fd, 1024, Deadline::AfterSeconds(1));
      auto frame = EncodeMessage(Reply(
          MessageType::kHello,
          PermissionDeniedError("uid " + std::to_string(cred.uid) + " gid " +
                                std::to_string(cred.gid) +
                                " is not allowed by the gateway's local.allowed_uids / "
                                "local.allowed_gids")));
      if (body.ok() && frame.ok()) WriteAll(fd, *frame, Deadline::AfterSeconds(1)).IgnoreError();
      ::close(fd);
      continue;
    }
    ++connections;
    std::lock_guard<std::mutex> lock(mu);
    for (auto it = connection_threads.begin(); it != connection_threads.end();) {
      if (it->done->load()) {
        it->thread.join();
        it = connection_threads.erase(it);
      } else {
        ++it;
      }
    }
    auto done = std::make_shared<std::atomic<bool>>(false);
    connection_threads.push_back({std::thread([this, fd, done] {
                                    ServeConnection(fd);
                                    done->store(true);
                                  }),
                                  done});
  }
}

void Gateway::Impl::ServeConnection(int fd) {
  bool greeted = false;
  while (!stopping.load()) {
    pollfd p{fd, POLLIN, 0};
    const int rc = ::poll(&p, 1, kPollSliceMs);
    if (rc == 0) continue;
    if (rc < 0 && errno == EINTR) continue;
    auto body = ReadFrame(fd, kDefaultMaxMessageBytes, Deadline::AfterSeconds(30));
    if (!body.ok()) {
      if (body.status().code() != StatusCode::kUnavailable) {
        // The framing is broken (oversized or truncated): say so and drop the connection.
        ++bad_requests;
        auto frame = EncodeMessage(Reply(MessageType::kHello, body.status()));
        if (frame.ok()) WriteAll(fd, *frame, Deadline::AfterSeconds(1)).IgnoreError();
        STRAIT_LOG(kWarn, kLog) << "local client dropped: " << body.status();
      }
      break;
    }
    Message reply;
    auto request = DecodeMessage(*body);
    if (!request.ok()) {
      ++bad_requests;
      const uint8_t t = (*body)[0];
      const bool known = t >= 1 && t <= 4;
      reply = Reply(known ? static_cast<MessageType>(t) : MessageType::kHello,
                    request.status().WithContext("bad request"));
    } else if (!greeted && request->type != MessageType::kHello) {
      ++bad_requests;
      reply = Reply(request->type, FailedPreconditionError("send a hello first"));
    } else if (request->type == MessageType::kReply) {
      ++bad_requests;
      reply = Reply(MessageType::kHello, InvalidArgumentError("clients do not send replies"));
    } else {
      greeted = true;
      reply = Handle(*request);
    }
    auto frame = EncodeMessage(reply);
    if (!frame.ok()) frame = EncodeMessage(Reply(reply.reply_to, frame.status()));
    if (!frame.ok() || !WriteAll(fd, *frame, Deadline::AfterSeconds(30)).ok()) break;
  }
  ::close(fd);
}

Message Gateway::Impl::Handle(Message& request) {
  switch (request.type) {
    case MessageType::kHello: {
      Message m = Reply(MessageType::kHello, Status::Ok());
      m.text = "straitd " + config.region + " shard " + std::to_string(config.shard_index);
      return m;
    }
    case MessageType::kRegisterJob: {
      auto policy = ResolvePolicy(request.policy, config.policy);
      if (!policy.ok()) {
        ++bad_requests;
        return Reply(request.type, policy.status());
      }
      STRAIT_LOG(kInfo, kLog) << "job " << request.job << ": policy " << policy->ToString();
      Message m = Reply(request.type, Status::Ok());
      m.text = policy->ToString();
      std::lock_guard<std::mutex> lock(mu);
      jobs[request.job] = *policy;
      return m;
    }
    case MessageType::kAllReduce:
      return HandleAllReduce(request);
    case MessageType::kStats: {
      Message m = Reply(request.type, Status::Ok());
      std::ostringstream os;
      os << "connections " << connections << "\nrefused_connections " << refused_connections
         << "\nbad_requests " << bad_requests << "\nallreduce_ok " << allreduce_ok
         << "\nallreduce_failed " << allreduce_failed << "\nbytes_sent " << bytes_sent
         << "\nbytes_received " << bytes_received << "\nin_flight " << in_flight << "\n";
      const std::string s = os.str();
      m.data.assign(s.begin(), s.end());
      return m;
    }
    default:
      return Reply(MessageType::kHello, InvalidArgumentError("unexpected message"));
  }
}

Message Gateway::Impl::HandleAllReduce(Message& request) {
  JobPolicy policy;
  uint64_t sequence = 0;
  {
    std::lock_guard<std::mutex> lock(mu);
    auto it = jobs.find(request.job);
    if (it == jobs.end()) {
      ++bad_requests;
      return Reply(request.type, FailedPreconditionError("job \"" + request.job +
                                                         "\" is not registered; send "
                                                         "register-job with its policy first"));
    }
    if (stopping.load()) {
      return Reply(request.type, UnavailableError("the gateway is shutting down"));
    }
    policy = it->second;
    sequence = sequences[{request.job, request.tensor_key}]++;
    ++in_flight;
  }
  int64_t budget = config.allreduce_deadline_ns;
  if (request.timeout_ms > 0) budget = std::min<int64_t>(budget, request.timeout_ms * 1'000'000ll);
  const Deadline deadline = Deadline::After(budget);

  Message reply = Reply(request.type, Status::Ok());
  reply.data = std::move(request.data);
  const TensorCodec tc = ChooseTensorCodec(policy, request.dtype, request.op, request.count);
  collective::AllReduceRequest req;
  req.job = request.job;
  req.tensor_key = request.tensor_key;
  req.op_id = OperationId(request.job, request.tensor_key, sequence);
  req.dtype = request.dtype;
  req.op = request.op;
  req.count = static_cast<size_t>(request.count);
  req.data = reply.data.data();
  req.codec = tc.codec;
  req.error_feedback = tc.error_feedback;
  req.feedback = &feedback;
  req.deadline = deadline;
  collective::AllReduceStats stats;
  Status s = WaitForLinks(deadline);
  if (s.ok()) s = collective::AllReduce(*transport, req, &stats);
  --in_flight;
  if (!s.ok()) {
    ++allreduce_failed;
    STRAIT_LOG(kWarn, kLog) << "all-reduce " << request.job << "/" << request.tensor_key << " #"
                            << sequence << " failed: " << s;
    return Reply(request.type, s.WithContext("all-reduce of " + request.job + "/" +
                                             request.tensor_key + " #" +
                                             std::to_string(sequence)));
  }
  ++allreduce_ok;
  bytes_sent += stats.bytes_sent;
  bytes_received += stats.bytes_received;
  reply.text = CodecName(tc.codec.codec);
  return reply;
}

Gateway::Gateway(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Gateway::~Gateway() { Shutdown(Deadline::After(impl_->config.shutdown_grace_ns)); }

StatusOr<std::unique_ptr<Gateway>> Gateway::Start(const GatewayConfig& config) {
  auto impl = std::make_unique<Impl>();
  Impl* g = impl.get();
  g->config = config;
  g->world = config.WorldRegions();
  g->rank = g->RankOf(config.region);
  g->links.resize(g->world.size());
  g->transport = std::make_unique<collective::NetTransport>(
      g->rank, static_cast<int>(g->world.size()), g->world);

  net::EndpointOptions o;
  o.region = config.region;
  o.transport = config.transport;
  o.ca_file = config.tls_ca;
  o.cert_file = config.tls_cert;
  o.key_file = config.tls_key;
  for (const auto& [region, shards] : config.peers) o.peer_regions.push_back(region);
  o.link = config.link;
  auto endpoint = net::Endpoint::Create(o, [g](std::shared_ptr<net::Link> link) {
    const int peer = g->RankOf(link->peer_region());
    g->KeepLink(peer, link);
    STRAIT_LOG(kInfo, kLog) << "accepted link from " << link->peer_region();
    return net::MessageCallback(g->transport->ReceiverFor(peer));
  });
  if (!endpoint.ok()) return endpoint.status().WithContext("config " + config.file);
  g->endpoint = std::move(endpoint).value();
  auto port = g->endpoint->Listen(config.wan_listen.host, config.wan_listen.port);
  if (!port.ok()) return port.status().WithContext("wan.listen " + config.wan_listen.ToString());
  g->wan_port = *port;
  for (size_t p = static_cast<size_t>(g->rank) + 1; p < g->world.size(); ++p) {
    const HostPort& addr = config.peers.at(g->world[p]).at(config.shard_index);
    auto link = g->endpoint->Connect(g->world[p], addr.host, addr.port,
                                     g->transport->ReceiverFor(static_cast<int>(p)));
    if (!link.ok()) {
      return link.status().WithContext("peers." + g->world[p] + ".shard_" +
                                       std::to_string(config.shard_index));
    }
    g->KeepLink(static_cast<int>(p), *link);
  }
  std::unique_ptr<Gateway> gateway(new Gateway(std::move(impl)));  // private constructor
  STRAIT_RETURN_IF_ERROR(g->ServeSocket());
  STRAIT_LOG(kInfo, kLog) << "serving " << config.Summary() << ", wan port " << g->wan_port;
  return gateway;
}

void Gateway::Shutdown(Deadline grace) {
  Impl* g = impl_.get();
  {
    std::lock_guard<std::mutex> lock(g->mu);
    if (g->shut_down) return;
    g->shut_down = true;
    // Under the lock that all-reduces take to count themselves in flight: each either saw
    // `stopping` and refused, or is counted before the wait below.
    g->stopping.store(true);
  }
  // Stop accepting, so that no new request starts while in-flight ones finish.
  if (g->accept_thread.joinable()) g->accept_thread.join();
  if (g->listen_fd >= 0) {
    ::close(g->listen_fd);
    ::unlink(g->config.local_socket.c_str());
  }
  while (g->in_flight.load() > 0 && !grace.Expired()) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  if (g->in_flight.load() > 0) {
    STRAIT_LOG(kWarn, kLog) << g->in_flight.load()
                            << " all-reduce(s) still running at the end of the shutdown grace; "
                               "closing the links fails them";
  }
  // Closing the endpoint fails the links, which ends any all-reduce still waiting on a peer.
  g->endpoint.reset();
  std::vector<Impl::Connection> threads;
  {
    std::lock_guard<std::mutex> lock(g->mu);
    threads.swap(g->connection_threads);
  }
  for (auto& c : threads) c.thread.join();
}

uint16_t Gateway::wan_port() const { return impl_->wan_port; }

std::string Gateway::StatsText() const {
  Message m;
  m.type = MessageType::kStats;
  const Message reply = impl_->Handle(m);  // stats take nothing from the request
  return std::string(reply.data.begin(), reply.data.end());
}

}  // namespace strait::gateway

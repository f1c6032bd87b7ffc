// The gateway behind straitd (see gateway.h).
#include "common/strings.h"
#include "gateway/gateway.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cmath>
#include <condition_variable>
#include <cstring>
#include <map>
#include <mutex>
#include <sstream>
#include <thread>
#include <utility>
#include <vector>

#include "collective/allreduce.h"
#include "collective/hierarchical.h"
#include "collective/net_transport.h"
#include "common/endian.h"
#include "common/log.h"
#include "gateway/config_check.h"
#include "gateway/gateway_impl.h"

namespace strait::gateway {
namespace {

constexpr const char* kLog = "gateway";

// FNV-1a: stable across builds and machines, which std::hash is not.
uint64_t Fnv1a(uint64_t h, const void* data, size_t n) {
  const auto* p = static_cast<const uint8_t*>(data);
  for (size_t i = 0; i < n; ++i) {
    h ^= p[i];
    h *= 0x100000001b3ull;
  }
  return h;
}

// What every region's gateway must see alike for one step (see "Operation identity" in
// localproto/protocol.h), as readable text: hashed into the op id and named in mismatch errors.
std::string IdentityText(const Message& request, const FrameInfo* frame) {
  std::string t = std::string(MessageTypeName(request.type)) + " key=" + request.tensor_key +
                  " count=" + std::to_string(request.count) + " dtype=" +
                  DataTypeName(request.dtype) + " op=" + ReduceOpName(request.op);
  if (frame != nullptr) {
    t += " frame=" + std::string(CodecName(frame->codec)) + "/" + std::to_string(frame->block_size);
  }
  return t;
}

// The key of a (job, scope) in Generations: a job's comms of different scopes have generations
// of their own.
std::string GenerationKey(const std::string& job, uint64_t scope) {
  return scope == 0 ? job : job + "\x1f#" + std::to_string(scope);
}

// (generation, sequence) folded into OperationId's sequence argument (splitmix64's finaliser:
// stable across builds and machines).
uint64_t Mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}
uint64_t IdentityWord(uint64_t generation, uint64_t sequence) {
  return Mix64(Mix64(generation) ^ sequence);
}

}  // namespace

uint32_t JobLane(const std::string& job) {
  const uint64_t h = Fnv1a(0xcbf29ce484222325ull, job.data(), job.size());
  return static_cast<uint32_t>((h ^ (h >> 32)) % collective::kCollectiveChannelCount);
}

uint64_t OperationId(const std::string& job, const std::string& tensor_key, uint64_t sequence) {
  uint64_t h = 0xcbf29ce484222325ull;
  const uint64_t sizes[2] = {job.size(), tensor_key.size()};
  h = Fnv1a(h, sizes, sizeof(sizes));  // lengths first, so ("ab","c") differs from ("a","bc")
  h = Fnv1a(h, job.data(), job.size());
  h = Fnv1a(h, tensor_key.data(), tensor_key.size());
  h = Fnv1a(h, &sequence, sizeof(sequence));
  // The low bits carry the job's lane, so NetTransport sends all of a job's ops on one channel.
  constexpr uint64_t kLanes = collective::kCollectiveChannelCount;
  static_assert(((uint64_t{1} << 38) % kLanes) == 0, "lanes must divide the op id space");
  const uint64_t mixed = (h ^ (h >> 38)) & ((uint64_t{1} << 38) - 1);
  return mixed - mixed % kLanes + JobLane(job);
}


Message Reply(MessageType to, const Status& status) { return localproto::ReplyMessage(to, status); }

Message Refused(MessageType to, const Status& status) {
  Message m = Reply(to, status);
  m.data = {0};
  return m;
}

// ---- Policy: the regions agree on each job's policy; `auto` picks codecs per link -------------

void Gateway::Impl::RouteChannels() {
  // The link channel map (collective/channels.h): each owner gets its range's messages.
  router.Route(collective::kTunnelChannels, [this](int peer, uint32_t channel,
                                                   std::vector<uint8_t> message) {
    tunnels->OnWanMessage(peer, channel, std::move(message));
  });
  router.Route(collective::kGenerationChannels,
               [this](int peer, uint32_t, std::vector<uint8_t> message) {
                 OnGenerationMessage(peer, std::move(message));
               });
  router.Route(collective::kPolicyChannels, [this](int peer, uint32_t, std::vector<uint8_t> m) {
    OnPolicyMessage(peer, std::move(m));
  });
  router.Route(collective::kRatesChannels, [this](int peer, uint32_t, std::vector<uint8_t> m) {
    if (Status st = weights_agreement->OnMessage(peer, m); !st.ok()) {
      STRAIT_LOG(kWarn, kLog) << "bad rates message from " << world[static_cast<size_t>(peer)]
                              << ": " << st;
    }
  });
}

void Gateway::Impl::OnOtherChannel(int peer, uint32_t channel, std::vector<uint8_t> message) {
  if (!router.Dispatch(peer, channel, std::move(message))) {
    STRAIT_LOG(kDebug, kLog) << "dropped a message on unused link channel " << channel << " from "
                             << world[static_cast<size_t>(peer)];
  }
}

void Gateway::Impl::OnGenerationMessage(int peer, std::vector<uint8_t> message) {
  // Generations and operation identities; fetches of committed results share the channel and
  // its header, told apart by its kind byte (generation.h).
  if (message.size() >= 2 &&
      (message[1] == static_cast<uint8_t>(GenerationMessageKind::kFetch) ||
       message[1] == static_cast<uint8_t>(GenerationMessageKind::kFetched))) {
    OnFetchMessage(peer, message);
    return;
  }
  auto effects = generations->OnMessage(peer, message);
  if (!effects.ok()) {
    STRAIT_LOG(kWarn, kLog) << "bad generation message from " << world[static_cast<size_t>(peer)]
                            << ": " << effects.status();
    return;
  }
  for (auto& [op_id, why] : effects->aborts) {
    STRAIT_LOG(kInfo, kLog) << "aborting an all-reduce: " << why.message();
    transport->Abort(op_id, why);
  }
  if (effects->reply.has_value()) {
    if (std::shared_ptr<net::Link> link = LinkTo(peer)) {
      link->Send(kGenerationChannel, std::move(*effects->reply), Deadline::AfterSeconds(30),
                 [](Status) {});
    }
  }
}

void Gateway::Impl::OnPolicyMessage(int peer, std::vector<uint8_t> message) {
  auto reply = agreement->OnMessage(peer, message);
  if (!reply.ok()) {
    STRAIT_LOG(kWarn, kLog) << "bad policy message from " << world[static_cast<size_t>(peer)]
                            << ": " << reply.status();
    return;
  }
  // A reply lost here (no link yet) is recovered by the peer, which offers again while it waits.
  if (reply->has_value()) {
    if (std::shared_ptr<net::Link> link = LinkTo(peer)) {
      link->Send(kPolicyChannel, std::move(**reply), Deadline::AfterSeconds(30), [](Status) {});
    }
  }
}

void Gateway::Impl::SendPolicyOffers(const std::string& job, const std::vector<int>& peers) {
  auto offer = agreement->LocalOffer(job);
  if (!offer.has_value()) return;
  for (int p : peers) {
    if (p == rank) continue;
    std::shared_ptr<net::Link> link;
    {
      std::lock_guard<std::mutex> lock(mu);
      link = links[static_cast<size_t>(p)];
    }
    if (link) link->Send(kPolicyChannel, *offer, Deadline::AfterSeconds(30), [](Status) {});
  }
}

StatusOr<JobPolicy> Gateway::Impl::AgreedPolicy(const std::string& job, Deadline deadline) {
  if (auto agreed = agreement->Agreed(job); agreed.has_value()) return *agreed;
  // Offer ours to every peer (those that offered already wait for it; the others' replies bring
  // theirs), then every second to those still missing: a peer that registers the job later, or
  // restarted, or whose reply was lost, is reached without any other trigger.
  std::vector<int> peers(world.size());
  for (size_t p = 0; p < peers.size(); ++p) peers[p] = static_cast<int>(p);
  for (;;) {
    SendPolicyOffers(job, peers);
    const Deadline slice =
        Deadline::After(std::min<int64_t>(deadline.RemainingNanos(), 1'000'000'000));
    auto merged = agreement->Wait(job, slice, [this] { return stopping.load(); });
    if (merged.ok()) {
      STRAIT_LOG(kInfo, kLog) << "job " << job << ": regions agreed on policy "
                              << merged->ToString();
      return merged;
    }
    if (merged.status().code() != StatusCode::kDeadlineExceeded || deadline.Expired() ||
        stopping.load()) {
      return merged;
    }
    peers = agreement->Missing(job);
  }
}

Status Gateway::Impl::ChooseCodecs(const Message& request, Deadline deadline, TensorCodec* tc) {
  STRAIT_ASSIGN_OR_RETURN(JobPolicy policy, AgreedPolicy(request.job, deadline));
  std::vector<net::LinkEstimates> estimates(world.size());
  if (policy.automatic) {
    std::vector<std::shared_ptr<net::Link>> peers;
    {
      std::lock_guard<std::mutex> lock(mu);
      peers = links;
    }
    for (size_t p = 0; p < peers.size(); ++p) {
      if (peers[p]) estimates[p] = peers[p]->Estimates();
    }
  }
  *tc = ChooseLinkCodecs(policy, request.dtype, request.op, static_cast<size_t>(request.count),
                         rank, estimates, codec_profiles);
  return Status::Ok();
}

// ---- Shard weights: the gateways agree on weights from their measured egress rates -----------

namespace {
constexpr uint64_t kMinMeasuredBytes = uint64_t{1} << 20;
}  // namespace

std::vector<uint64_t> Gateway::Impl::EgressRates() {
  std::vector<std::shared_ptr<net::Link>> peers;
  {
    std::lock_guard<std::mutex> lock(mu);
    peers = links;
  }
  std::vector<uint64_t> rates(world.size(), 0);
  for (size_t p = 0; p < peers.size(); ++p) {
    if (static_cast<int>(p) == rank || peers[p] == nullptr) continue;
    // A link that has carried only control messages (policy offers, pings) has a goodput
    // estimate of those few bytes, not of its capacity: unknown until it carried some data.
    const net::LinkEstimates e = peers[p]->Estimates();
    if (!e.ended && e.goodput_bytes_per_s > 0 && e.bytes_acked >= kMinMeasuredBytes) {
      rates[p] = static_cast<uint64_t>(std::llround(e.goodput_bytes_per_s));
    }
  }
  return rates;
}

void Gateway::Impl::SendToPeers(const std::vector<uint8_t>& message,
                                const std::vector<int>& peers, uint32_t channel) {
  for (int p : peers) {
    if (p == rank) continue;
    if (std::shared_ptr<net::Link> link = LinkTo(p)) {
      link->Send(channel, message, Deadline::AfterSeconds(30), [](Status) {});
    }
  }
}

void Gateway::Impl::SendToPeers(uint32_t channel, const std::vector<uint8_t>& message) {
  std::vector<int> everyone(world.size());
  for (size_t p = 0; p < everyone.size(); ++p) everyone[p] = static_cast<int>(p);
  SendToPeers(message, everyone, channel);
}

Status Gateway::Impl::Commit(uint64_t op_id, Deadline deadline) {
  // Each gateway says it holds the whole result, then waits for every other one to say so: a
  // gateway killed before it had everything makes every region fail the step, not just its own.
  const uint64_t tag = collective::MakeTag(op_id, collective::TagPhase::kMeshScatter,
                                           collective::kCommitChunk);
  const int n = static_cast<int>(world.size());
  for (int p = 0; p < n; ++p) {
    if (p != rank) transport->Send(p, tag, std::vector<uint8_t>{1}, deadline, [](Status) {});
  }
  std::vector<uint8_t> got;
  for (int p = 0; p < n; ++p) {
    if (p == rank) continue;
    if (Status s = transport->Recv(p, tag, deadline, &got); !s.ok()) {
      s = s.WithContext("waiting for " + world[static_cast<size_t>(p)] +
                        " to confirm it holds the result");
      transport->Abort(op_id, s);
      return s;
    }
  }
  return Status::Ok();
}

void Gateway::Impl::OnFetchMessage(int peer, std::span<const uint8_t> m) {
  constexpr size_t kHead = kGenerationHeaderBytes;
  const size_t job_len = m.size() >= kHead ? GetU16(m.data() + 2) : 0;
  if (m.size() < kHead || m[0] != kGenerationMessageVersion || job_len == 0 ||
      kHead + job_len > m.size()) {
    STRAIT_LOG(kWarn, kLog) << "bad result-recovery message from "
                            << world[static_cast<size_t>(peer)] << " (" << m.size() << " bytes)";
    return;
  }
  const uint64_t generation = GetU64(m.data() + 4);
  const uint64_t sequence = GetU64(m.data() + 12);
  const std::string key(reinterpret_cast<const char*>(m.data() + kHead), job_len);
  if (m[1] == static_cast<uint8_t>(GenerationMessageKind::kFetch)) {
    std::vector<uint8_t> answer;
    {
      std::lock_guard<std::mutex> lock(committed_mu);
      auto it = committed.find(key);
      const bool found = it != committed.end() && it->second.generation == generation &&
                         it->second.sequence == sequence;
      answer = EncodeGenerationMessage(GenerationMessageKind::kFetched, key, generation, sequence,
                                       found ? 1 : 0,
                                       found ? std::span<const uint8_t>(it->second.data)
                                             : std::span<const uint8_t>());
    }
    if (std::shared_ptr<net::Link> link = LinkTo(peer)) {
      link->Send(kGenerationChannel, std::move(answer), Deadline::AfterSeconds(60), [](Status) {});
    }
    return;
  }
  std::lock_guard<std::mutex> lock(committed_mu);
  auto it = fetches.find({key, generation, sequence});
  if (it == fetches.end()) return;  // nobody waits any more
  ++it->second.answers;
  if (GetU64(m.data() + 20) == 1 && !it->second.found) {
    it->second.found = true;
    it->second.data.assign(m.begin() + static_cast<std::ptrdiff_t>(kHead + job_len), m.end());
  }
  fetch_cv.notify_all();
}

Message Gateway::Impl::HandleFetch(Message& request) {
  {
    std::lock_guard<std::mutex> lock(mu);
    if (jobs.find(request.job) == jobs.end()) {
      return Reply(request.type, FailedPreconditionError("job \"" + request.job +
                                                         "\" is not registered; send "
                                                         "register-job with its policy first"));
    }
    if (Status owner = CheckJobOwner(request.job, request.client_uid); !owner.ok()) {
      ++refused_requests;
      return Reply(request.type, owner);
    }
  }
  int64_t budget = config.allreduce_deadline_ns;
  if (request.timeout_ms > 0) budget = std::min<int64_t>(budget, request.timeout_ms * 1'000'000ll);
  const Deadline deadline = Deadline::After(budget);
  const std::string key = GenerationKey(request.job, request.scope);
  const auto id = std::make_tuple(key, request.generation, request.sequence);
  const std::string what = "job \"" + request.job + "\" generation " +
                           std::to_string(request.generation) + " step " +
                           std::to_string(request.sequence);
  {
    std::lock_guard<std::mutex> lock(committed_mu);
    if (auto it = committed.find(key); it != committed.end() &&
                                       it->second.generation == request.generation &&
                                       it->second.sequence == request.sequence) {
      Message m = Reply(request.type, Status::Ok());
      m.data = it->second.data;
      return m;
    }
    fetches[id];
  }
  struct Forget {
    Impl* g;
    std::tuple<std::string, uint64_t, uint64_t> id;
    ~Forget() {
      std::lock_guard<std::mutex> lock(g->committed_mu);
      g->fetches.erase(id);
    }
  } forget{this, id};
  if (Status s = WaitForLinks(deadline); !s.ok()) {
    return Reply(request.type, s.WithContext("recovering the result of " + what));
  }
  SendToPeers(kGenerationChannel,
              EncodeGenerationMessage(GenerationMessageKind::kFetch, key, request.generation,
                                      request.sequence, 0));
  std::unique_lock<std::mutex> lock(committed_mu);
  const int peers = static_cast<int>(world.size()) - 1;
  for (;;) {
    Fetch& f = fetches[id];
    if (f.found) {
      STRAIT_LOG(kInfo, kLog) << "recovered the result of " << what << " from a peer region";
      Message m = Reply(request.type, Status::Ok());
      m.data = std::move(f.data);
      return m;
    }
    if (f.answers >= peers) {
      return Reply(request.type,
                   NotFoundError("no region holds a committed result of " + what +
                                 ": the step failed in every region"));
    }
    if (deadline.Expired() || stopping.load()) {
      return Reply(request.type, DeadlineExceededError("no region answered for the result of " +
                                                       what + " in time"));
    }
    fetch_cv.wait_for(lock, std::chrono::milliseconds(50));
  }
}

Message Gateway::Impl::HandleJoin(Message& request) {
  {
    std::lock_guard<std::mutex> lock(mu);
    if (jobs.find(request.job) == jobs.end()) {
      ++bad_requests;
      return Reply(request.type, FailedPreconditionError("job \"" + request.job +
                                                         "\" is not registered; send "
                                                         "register-job with its policy first"));
    }
    if (Status owner = CheckJobOwner(request.job, request.client_uid); !owner.ok()) {
      ++refused_requests;
      return Reply(request.type, owner);
    }
    if (stopping.load()) {
      return Reply(request.type, UnavailableError("the gateway is shutting down"));
    }
    ++in_flight;  // Shutdown's grace covers joins as it covers all-reduces
  }
  struct Done {
    Impl* g;
    bool ok = false;
    ~Done() {
      --g->in_flight;
      if (!ok) ++g->join_failed;
    }
  } done{this};
  int64_t budget = config.allreduce_deadline_ns;
  if (request.timeout_ms > 0) budget = std::min<int64_t>(budget, request.timeout_ms * 1'000'000ll);
  const Deadline deadline = Deadline::After(budget);
  if (Status s = WaitForLinks(deadline); !s.ok()) {
    return Reply(request.type, s.WithContext("joining job " + request.job));
  }
  const std::string key = GenerationKey(request.job, request.scope);
  std::vector<std::pair<uint64_t, Status>> aborts;
  SendToPeers(kGenerationChannel, generations->BeginJoin(key, request.resume, &aborts));
  for (auto& [op_id, why] : aborts) transport->Abort(op_id, why);
  for (;;) {
    // Short slices: a peer's higher proposal raises ours, which the peers must hear soon.
    const Deadline slice = Deadline::After(std::min<int64_t>(deadline.RemainingNanos(), 200'000'000));
    std::vector<std::pair<uint64_t, Status>> superseded;
    auto g = generations->AwaitJoin(key, slice, [this] { return stopping.load(); }, &superseded);
    for (auto& [op_id, why] : superseded) transport->Abort(op_id, why);
    if (g.ok()) {
      STRAIT_LOG(kInfo, kLog) << "job " << request.job << " (scope " << request.scope
                              << "): joined generation " << *g;
      Message m = Reply(request.type, Status::Ok());
      m.text = "generation " + std::to_string(*g);
      m.data.resize(8);
      PutU64(m.data.data(), *g);
      done.ok = true;
      return m;
    }
    if (g.status().code() != StatusCode::kDeadlineExceeded || deadline.Expired()) {
      return Reply(request.type, g.status());
    }
    SendToPeers(generations->StateMessage(key, GenerationMessageKind::kJoin),
                generations->Missing(key), kGenerationChannel);
  }
}

StatusOr<std::vector<uint64_t>> Gateway::Impl::MeasuredWeights(const std::string& job,
                                                               uint64_t generation,
                                                               uint64_t sequence,
                                                               Deadline deadline) {
  std::vector<int> everyone(world.size());
  for (size_t p = 0; p < everyone.size(); ++p) everyone[p] = static_cast<int>(p);
  const WeightsRound round{0, generation, sequence / kWeightsRoundOps};
  // From the middle of a round on, the next round's rates go out ahead, so that they are in
  // when the first operation of that round needs them (no round trip then).
  if (sequence % kWeightsRoundOps >= kWeightsRoundOps / 2) {
    WeightsRound next = round;
    ++next.round;
    if (auto m = weights_agreement->Offer(job, next, EgressRates())) SendToPeers(*m, everyone, kRatesChannel);
  }
  if (auto m = weights_agreement->Offer(job, round, EgressRates())) SendToPeers(*m, everyone, kRatesChannel);
  for (;;) {
    const Deadline slice =
        Deadline::After(std::min<int64_t>(deadline.RemainingNanos(), 1'000'000'000));
    auto weights = weights_agreement->Weights(job, round, slice, [this] { return stopping.load(); });
    if (weights.ok() && sequence % kWeightsRoundOps == 0) {
      std::string text;
      for (uint64_t w : *weights) AppendToList(text, std::to_string(w), ",");
      std::string rates;
      for (uint64_t r : EgressRates()) AppendToList(rates, std::to_string(r), ",");
      STRAIT_LOG(kInfo, kLog) << "job " << job << ": weights round " << round.round << " (epoch "
                              << round.epoch << "): "
                              << (text.empty() ? std::string("equal") : text)
                              << "; egress now " << rates << " B/s";
    }
    if (weights.ok() || deadline.Expired() || stopping.load()) return weights;
    // A peer whose link came back, or that restarted, may have lost our offer: send it again.
    if (auto m = weights_agreement->LocalOffer(job, round)) {
      SendToPeers(*m, weights_agreement->Missing(job, round), kRatesChannel);
    }
  }
}

Status Gateway::Impl::ServeSocket() {
  LocalServerOptions options;
  options.path = config.local_socket;
  options.allowed_uids = config.allowed_uids;
  options.allowed_gids = config.allowed_gids;
  LocalServerHooks hooks;
  hooks.may_block = &Impl::MayBlock;
  hooks.handle = [this](Message& request) { return Handle(request); };
  hooks.serve_tunnel = [this](int fd, const Message& request) { tunnels->Serve(fd, request); };
  hooks.attach = [this](asio::io_context& loop) { tunnels->Start(loop); };
  hooks.tick = [this] { RedialEndedLinks(); };
  auto server = LocalServer::Start(std::move(options), std::move(hooks),
                                   {&connections, &refused_connections, &bad_requests});
  if (!server.ok()) return server.status();
  local = std::move(server).value();
  return Status::Ok();
}

bool Gateway::Impl::MayBlock(MessageType type) {
  // Hello, job registration and stats only take short locks; everything else may wait for the
  // other regions (all-reduce, join, fetch) and so leaves the loop.
  return type != MessageType::kHello && type != MessageType::kRegisterJob &&
         type != MessageType::kStats;
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
      if (Status owner = CheckJobOwner(request.job, request.client_uid); !owner.ok()) {
        ++refused_requests;
        STRAIT_LOG(kWarn, kLog) << "refused register-job: " << owner.message();
        return Reply(request.type, owner);
      }
      // Measured shard weights unless the operator configured them (see "Shard weights").
      policy->measured_weights = config.ShardWeights().empty();
      jobs[request.job] = *policy;
      agreement->SetLocal(request.job, *policy);  // offered to the other regions (see policy.h)
      job_owners[request.job] = request.client_uid;
      return m;
    }
    case MessageType::kAllReduce:
    case MessageType::kRegionAllReduce:
    case MessageType::kAllReduceFrame: return HandleAllReduce(request);
    case MessageType::kJoinJob: return HandleJoin(request);
    case MessageType::kFetchResult: return HandleFetch(request);
    case MessageType::kStats: {
      Message m = Reply(request.type, Status::Ok());
      std::ostringstream os;
      os << "connections " << connections << "\nrefused_connections " << refused_connections
         << "\nbad_requests " << bad_requests << "\nrefused_requests " << refused_requests
         << "\nallreduce_ok " << allreduce_ok
         << "\nallreduce_failed " << allreduce_failed << "\njoin_failed " << join_failed
         << "\nbytes_sent " << bytes_sent
         << "\nbytes_received " << bytes_received << "\nin_flight " << in_flight << "\n";
      // Time of the successful all-reduces (collective::AllReduceStats, summed over both of
      // each operation's threads).
      os << "handle_ns " << handle_ns << "\nallreduce_ns " << allreduce_ns << "\nencode_ns " << encode_ns << "\nreduce_ns "
         << reduce_ns << "\ndecode_ns " << decode_ns << "\nwait_ns " << wait_ns
         << "\nack_wait_ns " << ack_wait_ns << "\n";
      // Failure recovery (see "Operations" in gateway.h).
      os << "peer_restarts " << transport->PeerRestarts() << "\n";
      os << tunnels->StatsText();
      os << "region_allreduce_ok " << region_allreduce_ok << "\nregion_bytes_sent "
         << region_bytes_sent << "\nregion_bytes_received " << region_bytes_received << "\n";
      const std::string s = os.str();
      m.data.assign(s.begin(), s.end());
      return m;
    }
    default:
      return Reply(MessageType::kHello, InvalidArgumentError("unexpected message"));
  }
}

namespace {

// kAllReduceFrame: the rank's frame must be a valid, unchained lossy frame; its header gives the
// request's dtype and count.
Status InspectRequestFrame(Message& request, FrameInfo* info) {
  auto inspected = InspectFrame(request.data);
  if (!inspected.ok()) return inspected.status().WithContext("the rank's frame");
  if (!IsLossyCodec(inspected->codec)) {
    return InvalidArgumentError(std::string("the rank's frame is ") + CodecName(inspected->codec) +
                                ", not a lossy codec (int8, int4, fp8): send lossless tensors "
                                "raw with all-reduce");
  }
  if ((inspected->flags & kFrameFlagZstd) != 0) {
    return InvalidArgumentError(
        "the rank's frame is zstd-chained; send the quantized frame "
        "without chain_zstd (the gateway forwards its blocks as they are)");
  }
  *info = *inspected;
  request.dtype = info->dtype;
  request.count = info->element_count;
  return Status::Ok();
}

// kAllReduceFrame: the job's policy must give the frame's codec for this tensor, fixed (auto
// chooses codecs per link inside the gateway, which a pre-quantized frame cannot follow).
Status CheckFramePolicy(const std::string& job, const std::string& policy_text, bool automatic,
                        const TensorCodec& tc, CodecId frame_codec, const char* whose) {
  const std::string frame = CodecName(frame_codec);
  if (automatic || !tc.send_codecs.empty() || !tc.result_codecs.empty()) {
    return FailedPreconditionError(
        std::string(whose) + " policy for job \"" + job + "\" is " + policy_text +
        ": auto chooses codecs per link, but this frame is " + frame +
        " already; register the job with policy \"" + frame + "\" to send quantized frames");
  }
  if (tc.codec.codec != frame_codec) {
    return FailedPreconditionError(
        std::string(whose) + " policy for job \"" + job + "\" (" + policy_text + ") gives " +
        CodecName(tc.codec.codec) + " for this tensor, but the frame is " + frame +
        "; register the job with policy \"" + frame + "\" (and let it allow " + frame +
        " for tensors this size), or quantize with " + CodecName(tc.codec.codec));
  }
  return Status::Ok();
}

}  // namespace

Message Gateway::Impl::HandleAllReduce(Message& request) {
  const int64_t handle_start = MonotonicNanos();
  JobPolicy policy;
  uint64_t sequence = 0;
  bool began = false;  // registered with `generations` (EndOp pending)
  {
    std::lock_guard<std::mutex> lock(mu);
    auto it = jobs.find(request.job);
    if (it == jobs.end()) {
      ++bad_requests;
      return Refused(request.type, FailedPreconditionError("job \"" + request.job +
                                                         "\" is not registered; send "
                                                         "register-job with its policy first"));
    }
    if (stopping.load()) {
      return Refused(request.type, UnavailableError("the gateway is shutting down"));
    }
    if (Status owner = CheckJobOwner(request.job, request.client_uid); !owner.ok()) {
      ++refused_requests;
      STRAIT_LOG(kWarn, kLog) << "refused all-reduce: " << owner.message();
      return Refused(request.type, owner);
    }
    policy = it->second;
    ++in_flight;
  }
  const bool frame_mode = request.type == MessageType::kAllReduceFrame;
  FrameInfo frame_info;
  if (frame_mode) {
    // Refused before the operation is numbered: the other regions never hear of it.
    Status fs = InspectRequestFrame(request, &frame_info);
    if (fs.ok()) {
      fs = CheckFramePolicy(
          request.job, policy.ToString(), policy.automatic,
          ChooseTensorCodec(policy, request.dtype, request.op, static_cast<size_t>(request.count)),
          frame_info.codec, "this gateway's");
    }
    if (!fs.ok()) {
      --in_flight;
      ++bad_requests;
      STRAIT_LOG(kWarn, kLog) << "refused all-reduce-frame " << request.job << "/"
                              << request.tensor_key << ": " << fs;
      return Refused(request.type,
                   fs.WithContext("all-reduce-frame of " + request.job + "/" + request.tensor_key));
    }
  }
  int64_t budget = config.allreduce_deadline_ns;
  if (request.timeout_ms > 0) budget = std::min<int64_t>(budget, request.timeout_ms * 1'000'000ll);
  const Deadline deadline = Deadline::After(budget);

  Message reply = Reply(request.type, Status::Ok());
  reply.data = std::move(request.data);
  // Frame mode: the rank's frame is the input, and the reply's data becomes the result frame.
  std::vector<uint8_t> input_frame;
  if (frame_mode) input_frame = std::exchange(reply.data, {});
  std::vector<float> tiny_values;  // frame mode, fewer blocks than regions (below)
  TensorCodec tc = ChooseTensorCodec(policy, request.dtype, request.op, request.count);
  collective::AllReduceRequest req;
  req.job = request.job;
  req.tensor_key = request.tensor_key;
  req.dtype = request.dtype;
  req.op = request.op;
  req.count = static_cast<size_t>(request.count);
  req.data = reply.data.data();
  req.feedback = &feedback;
  req.shard_weights = config.ShardWeights();  // empty (equal shards) unless configured
  req.deadline = deadline;
  collective::AllReduceStats stats;
  Status s = WaitForLinks(deadline);
  // The policy the regions agreed on for the job, and per link under `auto` (see policy.h).
  if (s.ok()) s = ChooseCodecs(request, deadline, &tc);
  req.codec = tc.codec;
  req.error_feedback = tc.error_feedback;
  req.send_codecs = tc.send_codecs;
  req.result_codecs = tc.result_codecs;
  req.accept_codecs = tc.accept_codecs;
  if (s.ok() && frame_mode) {
    s = CheckFramePolicy(request.job, tc.ToString(), false, tc, frame_info.codec,
                         "the regions' agreed");
  }
  if (s.ok() && frame_mode) {
    req.codec.block_size = frame_info.block_size;
    const size_t blocks = (req.count + frame_info.block_size - 1) / frame_info.block_size;
    if (blocks >= world.size() || req.count == 0) {
      // The frame's blocks go to their owners as they are (AllReduceRequest::input_stage).
      req.data = nullptr;
      req.input_stage = std::span<const uint8_t>(input_frame).subspan(kFrameHeaderSize);
      req.result_frame = &reply.data;
    } else {
      // Fewer blocks than regions: a block would straddle two owners. The tensor is tiny, so it
      // is all-reduced exactly in fp32 from the decoded frames, and every gateway quantizes the
      // identical fp32 result the same way afterwards (round to nearest): identical frames.
      tiny_values.resize(req.count);
      Decoder decoder;
      s = decoder.Decode(input_frame, tiny_values.data(), req.count, DataType::kFloat32);
      req.dtype = DataType::kFloat32;
      req.data = tiny_values.data();
      req.codec = CodecOptions{};
      req.error_feedback = false;
    }
  }
  // From here on the step's identity is used: a failure now spends it in every region.
  const bool spent = s.ok();
  if (s.ok()) {
    // The operation's identity (see "Operation identity" in localproto/protocol.h): its op id hashes
    // all of it, so steps of different comms or positions never meet; the announcement makes
    // a disagreement between regions a clear error instead of a wait for the deadline.
    sequence = request.sequence;
    std::string identity = IdentityText(request, frame_mode ? &frame_info : nullptr);
    const uint64_t word = IdentityWord(request.generation, request.sequence);
    if (request.scope != 0) identity += " scope=" + std::to_string(request.scope);
    req.op_id = OperationId(request.job, identity, word);
    // Shard weights from the regions' measured link rates (see "Shard weights" in gateway.h),
    // when every region's gateway measures (none configured allreduce.shard_weights).
    const auto agreed = agreement->Agreed(request.job);
    if (req.shard_weights.empty() && agreed.has_value() && agreed->ok() &&
        (*agreed)->measured_weights) {
      auto weights = MeasuredWeights(request.job, request.generation, request.sequence, deadline);
      if (!weights.ok()) {
        s = weights.status();
        // The peers run this operation too: tell them, so that every region fails this step.
        transport->Abort(req.op_id, s);
      } else if (!weights->empty()) {
        // Operations cut differently never meet, and the announcement names both splits.
        identity += " weights=";
        for (size_t i = 0; i < weights->size(); ++i) {
          identity += (i ? "/" : "") + std::to_string((*weights)[i]);
        }
        req.op_id = OperationId(request.job, identity, word);
        req.shard_weights = *std::move(weights);
      }
    }
    // The region's gateways pair by (job, scope, generation, step, key) alone, so that node
    // heads that disagree on the count or dtype meet and the region phase names the mismatch.
    const uint64_t region_op_id = OperationId(
        request.job, "\x1fregion-side/" + request.tensor_key + "/" + std::to_string(request.scope),
        word);
    std::vector<uint8_t> announce;
    if (s.ok()) {
      s = generations->BeginOp(GenerationKey(request.job, request.scope), request.generation,
                               request.sequence, identity, req.op_id, &announce);
      began = s.ok();
      if (!began) {
        // Refused here (another region announced another identity, or a newer generation):
        // the peers that run this step must not wait for it -- this region's other gateways
        // included.
        transport->Abort(req.op_id, s);
        if (request.type == MessageType::kRegionAllReduce) region_transport->Abort(region_op_id, s);
      }
    }
    if (began) SendToPeers(kGenerationChannel, announce);
    const int64_t started = MonotonicNanos();
    if (!s.ok()) {
      // Refused or failed before the operation started: counted below like any failure.
    } else if (request.type == MessageType::kRegionAllReduce) {
      s = RunRegionAllReduce(req, region_op_id, &stats);
    } else {
      s = collective::AllReduce(*transport, req, &stats);
      if (s.ok()) s = Commit(req.op_id, deadline);
    }
    if (s.ok()) allreduce_ns += MonotonicNanos() - started;
    if (began) {
      // A peer's announcement of another identity for this step aborted it: that is the error.
      if (Status mismatch = generations->EndOp(req.op_id); !s.ok() && !mismatch.ok()) {
        s = mismatch;
      }
    }
  }
  --in_flight;
  RecordAllReduce(request, s, MonotonicNanos() - handle_start, stats);
  if (!s.ok()) {
    ++allreduce_failed;
    STRAIT_LOG(kWarn, kLog) << "all-reduce " << request.job << "/" << request.tensor_key
                            << " generation " << request.generation << " step " << sequence
                            << " failed: " << s;
    const Status failed =
        s.WithContext("all-reduce of " + request.job + "/" + request.tensor_key +
                      " (generation " + std::to_string(request.generation) + " step " +
                      std::to_string(sequence) + ")");
    return spent ? Reply(request.type, failed) : Refused(request.type, failed);
  }
  ++allreduce_ok;
  bytes_sent += stats.bytes_sent;
  bytes_received += stats.bytes_received;
  encode_ns += stats.encode_ns;
  reduce_ns += stats.reduce_ns;
  decode_ns += stats.decode_ns;
  wait_ns += stats.wait_ns;
  ack_wait_ns += stats.ack_wait_ns;
  handle_ns += MonotonicNanos() - handle_start;
  if (frame_mode && !tiny_values.empty()) {
    CodecOptions o;
    o.codec = frame_info.codec;
    o.block_size = frame_info.block_size;
    Encoder encoder;
    if (Status e = encoder.Encode(tiny_values.data(), tiny_values.size(), DataType::kFloat32, o,
                                  &reply.data);
        !e.ok()) {
      return Reply(request.type, e.WithContext("encoding the result frame"));
    }
  }
  if (request.type != MessageType::kRegionAllReduce) {
    // Kept until the job's next step commits: what a rank whose gateway dies before it read
    // this reply gets back from the other regions (HandleFetch).
    std::lock_guard<std::mutex> lock(committed_mu);
    Committed& c = committed[GenerationKey(request.job, request.scope)];
    c.generation = request.generation;
    c.sequence = request.sequence;
    c.data.assign(reply.data.begin(), reply.data.end());
  }
  reply.text = tc.ToString();
  if (request.type == MessageType::kRegionAllReduce) {
    // The split among the region's gateways (each all-reduces its shard across the regions),
    // e.g. "zstd region_shards=334,333,333".
    const auto shards = collective::RegionShards(req.count, config.RegionSize());
    reply.text += " region_shards=";
    for (size_t i = 0; i < shards.size(); ++i) {
      reply.text += (i ? "," : "") + std::to_string(shards[i].count);
    }
    return reply;
  }
  // The shard split (elements per owner, in rank order) so that clients and tests can see how
  // the tensor was divided, e.g. "int8 shards=400,300,300".
  if (auto plan = collective::MakePlan(collective::PlanFor(req, static_cast<int>(world.size())));
      plan.ok()) {
    reply.text += " shards=";
    for (size_t i = 0; i < plan->shards.size(); ++i) {
      reply.text += (i ? "," : "") + std::to_string(plan->shards[i].count);
    }
  }
  return reply;
}

// ---- Region all-reduce ----------------------------------------------------------------------

net::MessageCallback Gateway::Impl::RegionReceiver() {
  return [this](uint32_t channel, std::vector<uint8_t> message) {
    // NetTransport's header names the sender's rank in bytes 4..7 (net_transport.h); that
    // rank's receiver checks the rest, the rank included.
    if (message.size() >= collective::kNetTransportHeaderSize) {
      const uint32_t sender = GetU32(message.data() + 4);
      if (sender < region_receivers.size() && static_cast<int>(sender) != config.shard_index) {
        region_receivers[sender](channel, std::move(message));
        return;
      }
    }
    STRAIT_LOG(kWarn, kLog) << "dropped a " << message.size() << "-byte message on channel "
                            << channel << " from a gateway of region " << config.region
                            << " that names no other gateway of it (do the region's gateways "
                               "agree on [peers." << config.region << "]?)";
  };
}

Status Gateway::Impl::WaitForRegionLinks(Deadline deadline) {
  for (;;) {
    std::string missing;
    for (int i = 0; i < region_transport->size(); ++i) {
      if (i != region_transport->rank() && region_transport->PeerIncarnation(i) == 0) {
        missing += (missing.empty() ? "shard_" : ", shard_") + std::to_string(i);
      }
    }
    if (missing.empty()) return Status::Ok();
    if (deadline.Expired() || stopping.load()) {
      return UnavailableError("nothing heard yet from gateway(s) " + missing + " of region " +
                              config.region + "; check that they run and that [peers." +
                              config.region + "] lists the right addresses");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

Status Gateway::Impl::RunRegionAllReduce(collective::AllReduceRequest& req, uint64_t region_op_id,
                                         collective::AllReduceStats* stats) {
  const int m = config.RegionSize();
  // Apart from plain all-reduces' op ids, and from those of gateways whose region runs another
  // number of gateways (they would cut the tensor differently): such gateways never pair, so
  // the operation fails by its deadline instead of mixing different shards. The lane stays.
  req.op_id = OperationId(req.job, req.tensor_key + "\x1fregion/" + std::to_string(m), req.op_id);
  Status s;
  if (config.shard_index >= m) {
    s = FailedPreconditionError(
        "this gateway is shard_" + std::to_string(config.shard_index) + " of region " +
        config.region + " but its config lists no other gateway of the region; a region "
        "all-reduce needs them all: add [peers." + config.region + "] with shard_0..shard_" +
        std::to_string(config.shard_index));
  }
  if (s.ok()) s = WaitForRegionLinks(req.deadline);
  if (!s.ok()) {
    // The shard's gateways in the other regions run this operation too: tell them.
    transport->Abort(req.op_id, s);
    return s;
  }
  collective::RegionSide side;
  side.transport = region_transport.get();
  side.op_id = region_op_id;
  collective::HierarchicalStats hs;
  s = collective::HierarchicalAllReduce(side, *transport, req, &hs);
  *stats = hs.cross;
  region_bytes_sent += hs.region_bytes_sent;
  region_bytes_received += hs.region_bytes_received;
  if (!s.ok()) {
    return s.WithContext("gateway " + std::to_string(config.shard_index) + " of " +
                         std::to_string(m) + " in " + config.region);
  }
  ++region_allreduce_ok;
  return s;
}

Status Gateway::Impl::DialPeer(int p) {
  const std::string& region = world[static_cast<size_t>(p)];
  const HostPort& addr = config.peers.at(region).at(config.shard_index);
  auto link = endpoint->Connect(
      region, addr.host, addr.port,
      transport->ReceiverFor(p, [this, p](uint32_t ch, std::vector<uint8_t> m) {
        OnOtherChannel(p, ch, std::move(m));
      }));
  if (!link.ok()) {
    return link.status().WithContext("peers." + region + ".shard_" +
                                     std::to_string(config.shard_index));
  }
  KeepLink(p, *link);
  return Status::Ok();
}

Status Gateway::Impl::DialRegionGateway(int index) {
  const HostPort& addr = config.region_gateways.at(index);
  auto link = endpoint->Connect(config.region, addr.host, addr.port,
                                region_receivers[static_cast<size_t>(index)]);
  if (!link.ok()) {
    return link.status().WithContext("peers." + config.region + ".shard_" +
                                     std::to_string(index));
  }
  {
    std::lock_guard<std::mutex> lock(mu);
    region_links[static_cast<size_t>(index)] = *link;
  }
  region_transport->SetLink(index, *link);
  return Status::Ok();
}

void Gateway::Impl::RedialEndedLinks() {
  // A dialed link ends for good when its peer stayed unreachable past link.unreachable_after or
  // restarted (the net layer then refuses to resume the old session). The dialing side opens a
  // new one; accepted links come back when their peer dials again.
  std::vector<int> peers, gateways;
  {
    std::lock_guard<std::mutex> lock(mu);
    for (size_t p = static_cast<size_t>(rank) + 1; p < links.size(); ++p) {
      if (links[p] != nullptr && links[p]->Estimates().ended) peers.push_back(static_cast<int>(p));
    }
    for (const auto& [index, addr] : config.region_gateways) {
      const auto& link = region_links[static_cast<size_t>(index)];
      if (link != nullptr && link->Estimates().ended) gateways.push_back(index);
    }
  }
  for (int p : peers) {
    STRAIT_LOG(kInfo, kLog) << "link to " << world[static_cast<size_t>(p)]
                            << " ended; dialling a new one";
    if (Status s = DialPeer(p); !s.ok()) {
      STRAIT_LOG(kWarn, kLog) << s;
    }
  }
  for (int index : gateways) {
    STRAIT_LOG(kInfo, kLog) << "link to gateway " << index << " of this region ended; "
                            << "dialling a new one";
    if (Status s = DialRegionGateway(index); !s.ok()) {
      STRAIT_LOG(kWarn, kLog) << s;
    }
  }
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
      g->rank, static_cast<int>(g->world.size()), g->world, collective::kDefaultCollectiveChannel,
      collective::kCollectiveChannelCount);
  g->generations = std::make_unique<Generations>(g->rank, g->world);

  // Region all-reduces (see gateway.h): the region's gateways, this one at its shard index (a
  // gateway that is not among them refuses region all-reduces; see RunRegionAllReduce).
  {
    const int m = config.RegionSize();
    std::vector<std::string> names;
    for (int i = 0; i < m; ++i) names.push_back(config.region + "/shard_" + std::to_string(i));
    g->region_transport = std::make_unique<collective::NetTransport>(
        config.shard_index < m ? config.shard_index : 0, m, names,
        collective::kRegionCollectiveChannel,
        collective::kCollectiveChannelCount);
    for (int i = 0; i < m; ++i) g->region_receivers.push_back(g->region_transport->ReceiverFor(i));
    g->region_links.resize(static_cast<size_t>(m));
  }

  TunnelServiceOptions tunnel_options;
  tunnel_options.region = config.region;
  tunnel_options.shard = config.shard_index;
  tunnel_options.world = g->world;
  tunnel_options.zstd_allowed =
      std::find(config.policy.allowed_codecs.begin(), config.policy.allowed_codecs.end(),
                CodecId::kZstd) != config.policy.allowed_codecs.end();
  g->tunnels = std::make_unique<TunnelService>(
      std::move(tunnel_options), [g](int peer) { return g->LinkTo(peer); }, &g->stopping);

  g->agreement = std::make_unique<PolicyAgreement>(g->rank, g->world);
  g->weights_agreement =
      std::make_unique<WeightsAgreement>(g->rank, static_cast<int>(g->world.size()));
  g->RouteChannels();  // before any link: every message finds its owner
  g->codec_profiles = net::MeasureCodecProfiles();
  for (const net::CodecProfile& cp : g->codec_profiles) {
    STRAIT_LOG(kInfo, kLog) << "codec " << CodecName(cp.codec) << ": encode "
                            << cp.encode_bytes_per_s / 1e6 << " MB/s, decode "
                            << cp.decode_bytes_per_s / 1e6 << " MB/s, ratio " << cp.ratio
                            << " (measured for policy auto)";
  }

  // The same options `straitd --check-config` checks (config_check.h).
  const net::EndpointOptions o = EndpointOptionsOf(config);
  auto endpoint = net::Endpoint::Create(o, [g](std::shared_ptr<net::Link> link) {
    if (link->peer_region() == g->config.region) {
      STRAIT_LOG(kInfo, kLog) << "accepted link from a gateway of this region";
      return g->RegionReceiver();
    }
    const int peer = g->RankOf(link->peer_region());
    STRAIT_LOG(kInfo, kLog) << "accepted link from " << link->peer_region();
    // The new link replaces the one in use only once a message arrived over it (a dialing
    // gateway greets at once): an admitted peer whose fresh connections fail right after the
    // handshake must not take down the link that works (it did: /readyz went "not ready" and
    // the next all-reduce timed out).
    auto receiver = g->transport->ReceiverFor(peer, [g, peer](uint32_t ch, std::vector<uint8_t> m) {
      g->OnOtherChannel(peer, ch, std::move(m));
    });
    auto adopted = std::make_shared<std::atomic<bool>>(false);
    std::weak_ptr<net::Link> weak = link;
    {
      std::lock_guard<std::mutex> lock(g->mu);
      g->pending_links[peer] = link;
    }
    return net::MessageCallback([g, peer, adopted, weak, receiver = std::move(receiver)](
                                    uint32_t ch, std::vector<uint8_t> m) {
      if (!adopted->exchange(true)) {
        if (std::shared_ptr<net::Link> l = weak.lock()) {
          {
            std::lock_guard<std::mutex> lock(g->mu);
            auto it = g->pending_links.find(peer);
            if (it != g->pending_links.end() && it->second == l) g->pending_links.erase(it);
          }
          g->KeepLink(peer, std::move(l));
        }
      }
      receiver(ch, std::move(m));
    });
  });
  if (!endpoint.ok()) return endpoint.status().WithContext("config " + config.file);
  g->endpoint = std::move(endpoint).value();
  auto port = g->endpoint->Listen(config.wan_listen.host, config.wan_listen.port);
  if (!port.ok()) return port.status().WithContext("wan.listen " + config.wan_listen.ToString());
  g->wan_port = *port;
  for (size_t p = static_cast<size_t>(g->rank) + 1; p < g->world.size(); ++p) {
    STRAIT_RETURN_IF_ERROR(g->DialPeer(static_cast<int>(p)));
  }
  for (const auto& [index, addr] : config.region_gateways) {
    STRAIT_RETURN_IF_ERROR(g->DialRegionGateway(index));
  }
  std::unique_ptr<Gateway> gateway(new Gateway(std::move(impl)));  // private constructor
  g->DeclareMetrics();  // before any request can record into it
  STRAIT_RETURN_IF_ERROR(g->ServeSocket());
  STRAIT_RETURN_IF_ERROR(g->StartHttp());
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
  g->http.reset();  // its handlers read the links and jobs
  // Stop accepting, so that no new request starts while in-flight ones finish.
  if (g->local != nullptr) g->local->StopAccepting();
  while (g->in_flight.load() > 0 && !grace.Expired()) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  if (g->in_flight.load() > 0) {
    STRAIT_LOG(kWarn, kLog) << g->in_flight.load()
                            << " all-reduce(s) still running at the end of the shutdown grace; "
                               "closing the links fails them";
  }
  // All-reduces answer before their last sends are acknowledged (collective/allreduce.cc), so
  // the links may still carry results that other regions wait for: close them with a flush
  // (Link::Close sends what is queued and waits for its acknowledgements), within the grace,
  // before the endpoint goes. A link with no stream up has nothing to flush.
  {
    std::vector<std::shared_ptr<net::Link>> open;
    {
      std::lock_guard<std::mutex> lock(g->mu);
      for (const auto& l : g->links) {
        if (l != nullptr) open.push_back(l);
      }
      for (const auto& l : g->region_links) {
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
  }
  // Closing the endpoint fails the links, which ends any all-reduce still waiting on a peer.
  g->endpoint.reset();
  // The requests still running end now; their replies go out, then every connection closes.
  if (g->local != nullptr) g->local->Stop();
}

uint16_t Gateway::wan_port() const { return impl_->wan_port; }

Status Gateway::ReloadIdentity() {
  if (impl_->endpoint == nullptr) return FailedPreconditionError("the gateway is shut down");
  return impl_->endpoint->ReloadIdentity();
}

std::string Gateway::StatsText() const {
  Message m;
  m.type = MessageType::kStats;
  const Message reply = impl_->Handle(m);  // stats take nothing from the request
  return std::string(reply.data.begin(), reply.data.end());
}

}  // namespace strait::gateway

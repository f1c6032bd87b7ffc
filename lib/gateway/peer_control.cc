// Peer control: what straitd's gateways tell each other outside the collective's data (see
// gateway_impl.h for the state, PeerControl, and the locking). The router hands each link
// channel range to its owner; the regions agree on each job's policy (policy.h) and on shard
// weights from measured link rates; kJoinJob agrees on a job's next generation (generation.h);
// after an all-reduce every gateway confirms it holds the result (commit.cc); kFetchResult recovers
// a committed result from a peer. Messages arrive on the endpoint's I/O thread and never block;
// the request handlers here block up to their request's deadline.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <mutex>
#include <span>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "common/endian.h"
#include "common/log.h"
#include "common/strings.h"
#include "gateway/gateway_impl.h"
#include "gateway/numbering.h"

namespace strait::gateway {
namespace {

constexpr const char* kLog = "gateway";

}  // namespace

// ---- The channel router, generations and policy messages ------------------------------------

void Gateway::Impl::RouteChannels() {
  // The link channel map (collective/channels.h): each owner gets its range's messages.
  peer_control.router.Route(collective::kTunnelChannels,
                            [this](int peer, uint32_t channel, std::vector<uint8_t> message) {
                              tunnels->OnWanMessage(peer, channel, std::move(message));
                            });
  peer_control.router.Route(collective::kGenerationChannels,
                            [this](int peer, uint32_t, std::vector<uint8_t> message) {
                              OnGenerationMessage(peer, std::move(message));
                            });
  peer_control.router.Route(
      collective::kPolicyChannels,
      [this](int peer, uint32_t, std::vector<uint8_t> m) { OnPolicyMessage(peer, std::move(m)); });
  peer_control.router.Route(
      collective::kRatesChannels, [this](int peer, uint32_t, std::vector<uint8_t> m) {
        if (Status st = peer_control.weights_agreement->OnMessage(peer, m); !st.ok()) {
          STRAIT_LOG(kWarn, kLog) << "bad rates message from " << world[static_cast<size_t>(peer)]
                                  << ": " << st;
        }
      });
}

void Gateway::Impl::OnOtherChannel(int peer, uint32_t channel, std::vector<uint8_t> message) {
  if (!peer_control.router.Dispatch(peer, channel, std::move(message))) {
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
  if (message.size() >= 2 &&
      message[1] == static_cast<uint8_t>(GenerationMessageKind::kConfirmed)) {
    OnConfirmedMessage(peer, message);
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
  auto reply = peer_control.agreement->OnMessage(peer, message);
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
  auto offer = peer_control.agreement->LocalOffer(job);
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
  if (auto agreed = peer_control.agreement->Agreed(job); agreed.has_value()) return *agreed;
  // Offer ours to every peer (those that offered already wait for it; the others' replies bring
  // theirs), then every second to those still missing: a peer that registers the job later, or
  // restarted, or whose reply was lost, is reached without any other trigger.
  std::vector<int> peers(world.size());
  for (size_t p = 0; p < peers.size(); ++p) peers[p] = static_cast<int>(p);
  for (;;) {
    SendPolicyOffers(job, peers);
    const Deadline slice =
        Deadline::After(std::min<int64_t>(deadline.RemainingNanos(), 1'000'000'000));
    auto merged = peer_control.agreement->Wait(job, slice, [this] { return stopping.load(); });
    if (merged.ok()) {
      STRAIT_LOG(kInfo, kLog) << "job " << job << ": regions agreed on policy "
                              << merged->ToString();
      return merged;
    }
    if (merged.status().code() != StatusCode::kDeadlineExceeded || deadline.Expired() ||
        stopping.load()) {
      return merged;
    }
    peers = peer_control.agreement->Missing(job);
  }
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
    // The peak, not the smoothed goodput: an all-reduce keeps a link busy in bursts, and the
    // smoothed figure of equal links read 4.2-5.9 MB/s at a 6.25 MB/s cap, enough for a split
    // 6.2:3.3:5.2 that cost the next job's uncompressed all-reduce 12% (bench/README.md,
    // "2026-12-07 (later)").
    const net::LinkEstimates e = peers[p]->Estimates();
    const double rate =
        e.peak_goodput_bytes_per_s > 0 ? e.peak_goodput_bytes_per_s : e.goodput_bytes_per_s;
    if (!e.ended && rate > 0 && e.bytes_acked >= kMinMeasuredBytes) {
      rates[p] = static_cast<uint64_t>(std::llround(rate));
    }
  }
  return rates;
}

void Gateway::Impl::SendToPeers(const std::vector<uint8_t>& message, const std::vector<int>& peers,
                                uint32_t channel) {
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

// ---- Result recovery (the commit confirmation is in commit.cc) -------------------------------

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
      std::lock_guard<std::mutex> lock(peer_control.results.mu);
      auto it = peer_control.results.committed.find(key);
      const bool found = it != peer_control.results.committed.end() &&
                         it->second.generation == generation && it->second.sequence == sequence;
      answer = EncodeGenerationMessage(
          GenerationMessageKind::kFetched, key, generation, sequence, found ? 1 : 0,
          found ? std::span<const uint8_t>(it->second.data) : std::span<const uint8_t>());
    }
    if (std::shared_ptr<net::Link> link = LinkTo(peer)) {
      link->Send(kGenerationChannel, std::move(answer), Deadline::AfterSeconds(60), [](Status) {});
    }
    return;
  }
  std::lock_guard<std::mutex> lock(peer_control.results.mu);
  auto it = peer_control.results.fetches.find({key, generation, sequence});
  if (it == peer_control.results.fetches.end()) return;  // nobody waits any more
  ++it->second.answers;
  if (GetU64(m.data() + 20) == 1 && !it->second.found) {
    it->second.found = true;
    it->second.data.assign(m.begin() + static_cast<std::ptrdiff_t>(kHead + job_len), m.end());
  }
  peer_control.results.fetch_cv.notify_all();
}

Message Gateway::Impl::HandleFetch(Message& request) {
  {
    std::lock_guard<std::mutex> lock(mu);
    if (jobs.Find(request.job) == nullptr) {
      return Reply(request.type, JobTable::NotRegistered(request.job));
    }
    if (Status owner = jobs.CheckOwner(request.job, request.client_uid); !owner.ok()) {
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
    std::lock_guard<std::mutex> lock(peer_control.results.mu);
    if (auto it = peer_control.results.committed.find(key);
        it != peer_control.results.committed.end() && it->second.generation == request.generation &&
        it->second.sequence == request.sequence) {
      Message m = Reply(request.type, Status::Ok());
      m.data = it->second.data;
      return m;
    }
    peer_control.results.fetches[id];
  }
  struct Forget {
    Impl* g;
    std::tuple<std::string, uint64_t, uint64_t> id;
    ~Forget() {
      std::lock_guard<std::mutex> lock(g->peer_control.results.mu);
      g->peer_control.results.fetches.erase(id);
    }
  } forget{this, id};
  if (Status s = WaitForLinks(deadline); !s.ok()) {
    return Reply(request.type, s.WithContext("recovering the result of " + what));
  }
  SendToPeers(kGenerationChannel, EncodeGenerationMessage(GenerationMessageKind::kFetch, key,
                                                          request.generation, request.sequence, 0));
  std::unique_lock<std::mutex> lock(peer_control.results.mu);
  const int peers = static_cast<int>(world.size()) - 1;
  for (;;) {
    CommittedResults::Fetch& f = peer_control.results.fetches[id];
    if (f.found) {
      STRAIT_LOG(kInfo, kLog) << "recovered the result of " << what << " from a peer region";
      Message m = Reply(request.type, Status::Ok());
      m.data = std::move(f.data);
      return m;
    }
    if (f.answers >= peers) {
      return Reply(request.type, NotFoundError("no region holds a committed result of " + what +
                                               ": the step failed in every region"));
    }
    if (deadline.Expired() || stopping.load()) {
      return Reply(request.type, DeadlineExceededError("no region answered for the result of " +
                                                       what + " in time"));
    }
    peer_control.results.fetch_cv.wait_for(lock, std::chrono::milliseconds(50));
  }
}

// ---- Joins: the gateways agree on a job's next generation -------------------------------------

Message Gateway::Impl::HandleJoin(Message& request) {
  {
    std::lock_guard<std::mutex> lock(mu);
    if (jobs.Find(request.job) == nullptr) {
      ++bad_requests;
      return Reply(request.type, JobTable::NotRegistered(request.job));
    }
    if (Status owner = jobs.CheckOwner(request.job, request.client_uid); !owner.ok()) {
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
    const Deadline slice =
        Deadline::After(std::min<int64_t>(deadline.RemainingNanos(), 200'000'000));
    std::vector<std::pair<uint64_t, Status>> superseded;
    auto g = generations->AwaitJoin(
        key, slice, [this] { return stopping.load(); }, &superseded);
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

// ---- Shard weights (continued) -----------------------------------------------------------------

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
    if (auto m = peer_control.weights_agreement->Offer(job, next, EgressRates()))
      SendToPeers(*m, everyone, kRatesChannel);
  }
  if (auto m = peer_control.weights_agreement->Offer(job, round, EgressRates()))
    SendToPeers(*m, everyone, kRatesChannel);
  for (;;) {
    const Deadline slice =
        Deadline::After(std::min<int64_t>(deadline.RemainingNanos(), 1'000'000'000));
    auto weights = peer_control.weights_agreement->Weights(job, round, slice,
                                                           [this] { return stopping.load(); });
    if (weights.ok() && sequence % kWeightsRoundOps == 0) {
      std::string text;
      for (uint64_t w : *weights) AppendToList(text, std::to_string(w), ",");
      std::string rates;
      for (uint64_t r : EgressRates()) AppendToList(rates, std::to_string(r), ",");
      STRAIT_LOG(kInfo, kLog) << "job " << job << ": weights round " << round.round << " (epoch "
                              << round.epoch
                              << "): " << (text.empty() ? std::string("equal") : text)
                              << "; egress now " << rates << " B/s";
    }
    if (weights.ok() || deadline.Expired() || stopping.load()) return weights;
    // A peer whose link came back, or that restarted, may have lost our offer: send it again.
    if (auto m = peer_control.weights_agreement->LocalOffer(job, round)) {
      SendToPeers(*m, peer_control.weights_agreement->Missing(job, round), kRatesChannel);
    }
  }
}

}  // namespace strait::gateway

// Internal to lib/gateway: the state behind Gateway, shared by the files that implement its
// services. Not installed. Gateway::Impl is the context every service reaches; its parts:
//
//   gateway.cc            lifecycle (Start, Shutdown, ReloadIdentity), request dispatch
//                         (Handle), link supervision (redial, on the local server's timer).
//   local_server.*        the local socket on one Asio loop; blocking requests on its workers.
//   tunnel_service.cc     cross-region tunnels on the local server's loop.
//   allreduce_service.*   the all-reduce as stages: admit -> resolve codecs -> prepare -> number
//                         -> run -> commit -> reply (AllReduceService, `allreduce`).
//   peer_control.cc       what the gateways tell each other outside the collective: the channel
//                         router, policy offers and agreement, generations (kJoinJob), shard
//                         weights from measured rates, the commit confirmation, result recovery
//                         (kFetchResult) (PeerControl, `peer_control`).
//   region.cc             the hierarchical region all-reduce over this region's gateways
//                         (RegionState, `region_state`).
//   gateway_metrics.cc    Prometheus metrics, /metrics, /healthz, /readyz.
//   numbering.*           op ids and generation keys (pure).
//
// Locking, from outside in (never take an outer lock while holding an inner one):
//   `mu`                  links, region_links, jobs (JobTable), shut_down. The jobs stay under `mu` (not a lock of their own)
//                         because admission checks `stopping` and counts itself in flight under
//                         the same lock that Shutdown sets `stopping` under.
//   `peer_control.results.mu`  committed results and pending fetches (CommittedResults).
//   Generations, PolicyAgreement, WeightsAgreement, TunnelService, NetTransport and
//   ErrorFeedbackStore lock themselves; counters are atomics.
// Handlers of requests that may block (all-reduce, join, fetch) run on the local server's
// workers, up to their request's deadline; the others run on its loop and must not block
// (local_server.h); messages from peers arrive on the endpoint's I/O thread and never block.
#ifndef STRAIT_LIB_GATEWAY_GATEWAY_IMPL_H_
#define STRAIT_LIB_GATEWAY_GATEWAY_IMPL_H_

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "strait/codec.h"
#include "collective/allreduce.h"
#include "collective/channels.h"
#include "collective/net_transport.h"
#include "common/log_limiter.h"
#include "common/strings.h"
#include "gateway/allreduce_service.h"
#include "gateway/config.h"
#include "gateway/gateway.h"
#include "gateway/generation.h"
#include "gateway/http.h"
#include "gateway/local_server.h"
#include "gateway/metrics.h"
#include "gateway/policy.h"
#include "gateway/relayed_confirmations.h"
#include "gateway/straggler.h"
#include "gateway/tunnel.h"
#include "localproto/frame_io.h"
#include "localproto/protocol.h"
#include "net/link.h"

namespace strait::gateway {

// The local protocol straitd serves (localproto/protocol.h); tunnel.h names the rest of it.
using localproto::DecodeMessageInto;
using localproto::EncodeMessageHead;
using localproto::ReadFrameInto;

// Results this gateway committed, for result recovery (kFetchResult; see "Result recovery" in
// localproto/protocol.h): each gateway keeps the result of the last step it committed per
// (job, scope); a rank whose gateway was killed after the commit asks its restarted gateway,
// which asks the peers (peer_control.cc). Thread-safe through `mu`.
struct CommittedResults {
  struct Committed {
    uint64_t generation = 0;
    uint64_t sequence = 0;
    std::vector<uint8_t> data;  // what the all-reduce's reply carried (tensor or frame)
  };
  struct Fetch {
    int answers = 0;
    bool found = false;
    std::vector<uint8_t> data;
  };
  std::mutex mu;
  std::map<std::string, Committed> committed;  // by generation key
  std::condition_variable fetch_cv;
  std::map<std::tuple<std::string, uint64_t, uint64_t>, Fetch> fetches;  // our fetches waiting

  // Keeps `data` as the committed result of `key`'s (generation, sequence), replacing the last.
  void Keep(const std::string& key, uint64_t generation, uint64_t sequence,
            std::span<const uint8_t> data) {
    std::lock_guard<std::mutex> lock(mu);
    Committed& c = committed[key];
    c.generation = generation;
    c.sequence = sequence;
    c.data.assign(data.begin(), data.end());
  }
};

// Peer control's state (peer_control.cc): set up by Start before any link exists, so that every
// message from a peer finds its owner; each part locks itself.
struct PeerControl {
  // Messages on link channels the collective does not use arrive in OnOtherChannel (I/O thread;
  // never blocks), which the router hands to the owner of the channel's range in
  // collective/channels.h: tunnels, generations, policy, rates.
  collective::ChannelRouter router;
  // The regions' agreement on each job's policy, and this machine's codec speeds for `auto`
  // (measured once at start; see policy.h).
  std::unique_ptr<PolicyAgreement> agreement;
  std::vector<net::CodecProfile> codec_profiles;
  // Shard weights from measured link rates (the rule is in policy.h): rates messages on
  // kRatesChannel arrive here.
  std::unique_ptr<WeightsAgreement> weights_agreement;
  CommittedResults results;
  RelayedConfirmations relayed;  // commit confirmations relayed by third regions (commit.cc)
};

// The region all-reduce's state (region.cc; "Region all-reduce" in gateway.h): the region's
// gateways as a second NetTransport, rank = shard index, world = config.RegionSize(), on link
// channels collective::kRegionCollectiveChannels of same-region links. Each gateway dials every
// other gateway of its region and sends over the link it dialed (Impl::region_links); what they
// send arrives on links they dialed, which RegionReceiver() routes by the sender rank in the
// NetTransport trailer. Set up by Start before any link.
struct RegionState {
  std::unique_ptr<collective::NetTransport> transport;
  std::vector<collective::NetTransport::Receiver> receivers;  // by shard index
  std::atomic<uint64_t> allreduce_ok{0}, bytes_sent{0}, bytes_received{0};
  std::atomic<uint64_t> scatter_ns{0}, gather_ns{0};  // HierarchicalStats' phases 1 and 3, summed
};

// The jobs registered here and their owners (see "Jobs and isolation" in gateway.h). Under
// Impl::mu, not a lock of its own: see the file comment.
struct JobTable {
  std::map<std::string, JobPolicy> policies;
  std::map<std::string, uint32_t> owners;  // job -> the uid that registered it

  // The job's policy, or null when it is not registered.
  const JobPolicy* Find(const std::string& job) const {
    auto it = policies.find(job);
    return it == policies.end() ? nullptr : &it->second;
  }
  // kFailedPrecondition for an unregistered job, saying how to register it.
  static Status NotRegistered(const std::string& job) {
    return FailedPreconditionError("job \"" + job +
                                   "\" is not registered; send register-job with its policy first");
  }
  // OK when `job` is unregistered or belongs to `uid`; otherwise kPermissionDenied saying
  // whose it is.
  Status CheckOwner(const std::string& job, uint32_t uid) const {
    auto it = owners.find(job);
    if (it == owners.end() || it->second == uid) return Status::Ok();
    return PermissionDeniedError("job \"" + job + "\" belongs to uid " +
                                 std::to_string(it->second) + ", not to this client's uid " +
                                 std::to_string(uid) +
                                 "; a job's data is reachable only by the uid that registered it "
                                 "(use another job id, or run as that user)");
  }
  void Register(const std::string& job, const JobPolicy& policy, uint32_t uid) {
    policies[job] = policy;
    owners[job] = uid;
  }
};

// What the shards of one straitd share ("Multi-shard gateways" in config.h; host.cc): the WAN
// endpoint and its port, the local socket, the HTTP server, the shard lock files, and the links
// dialled to peer gateways by (region, address), so that shards reaching the same peer gateway
// share one link, each on its own block of channels (collective::kShardChannelStride). Accepted
// links are shared the same way: the accept callback hands each shard its block. A single-shard
// gateway is a Host with one shard. Locking: `mu` (dialled, shut_down) is taken before no other
// lock and never held while calling into a shard.
struct Gateway::Host {
  GatewayConfig config;                       // the whole config (all shards)
  std::vector<std::unique_ptr<Impl>> shards;  // in config.shards order
  std::unique_ptr<net::Endpoint> endpoint;
  uint16_t wan_port = 0;
  std::unique_ptr<LocalServer> local;
  std::unique_ptr<HttpServer> http;
  std::vector<int> lock_fds;  // one per shard (ShardLockPath), held for the process' life

  std::mutex mu;
  std::map<std::string, std::shared_ptr<net::Link>> dialled;  // "region host:port" -> link
  // Per peer region, the newest accepted links (at most one per shard served: a peer that runs
  // one process per shard dials that many), kept open until a newer one pushes them out; a shard
  // adopts one on its first message for that shard (Impl::AcceptedReceiver). Bounded under
  // reconnect floods.
  std::map<std::string, std::deque<std::shared_ptr<net::Link>>> accepted;
  bool shut_down = false;

  // Stops the local server, then ends each shard's tunnel service while the local loop it runs
  // on still exists (its timers belong to that loop), then the rest.
  ~Host();

  // The shard's state, or null when this gateway does not serve shard `k`.
  Impl* Shard(uint32_t k) const;
  // A handle on the link to peer region `region` at `addr` for shard `k` (its channel block):
  // the one that is up if another shard dialled it, else a new one.
  StatusOr<std::shared_ptr<net::Link>> Dial(const std::string& region, const HostPort& addr,
                                            int k);
  // The endpoint's accept callback: region links go to the one shard; a peer region's link is
  // offered to every shard on its own block, and its messages are routed by channel block.
  net::MessageCallback OnAccept(std::shared_ptr<net::Link> link);
  // A link's receiver that hands each message to its block's shard (channel modulo the stride),
  // or drops it with a warning when this gateway does not serve that shard.
  net::MessageCallback Demux(std::map<uint32_t, net::MessageCallback> by_shard,
                             const std::string& from);
  // The local socket's handler: routes by the shard the client named (Message::client_shard).
  Message Handle(Message& request);
  void ServeTunnel(int fd, const Message& request);
  Status ServeSocket();
  Status StartHttp();
  std::string MetricsText();
  HttpResponse Readiness();
  void Shutdown(Deadline grace);
  // Removes and releases the shard lock files taken so far (lock_fds, in config.shards order).
  void UnlockShards();
};

struct Gateway::Impl {
  GatewayConfig config;  // this shard's (GatewayConfig::ForShard)
  Host* host = nullptr;  // what the shards share
  std::vector<std::string> world;
  int rank = 0;
  std::unique_ptr<collective::NetTransport> transport;

  std::mutex mu;
  std::condition_variable links_cv;
  std::vector<std::shared_ptr<net::Link>> links;
  JobTable jobs;
  // Each job's generations and its operations' identities (generation.h); thread-safe on its
  // own. Set up by Start before any link exists.
  std::unique_ptr<Generations> generations;

  std::atomic<bool> stopping{false};
  std::atomic<int> in_flight{0};

  // Counters for the stats request.
  std::atomic<uint64_t> connections{0}, refused_connections{0}, bad_requests{0};
  std::atomic<uint64_t> refused_requests{0};  // requests for a job of another uid
  std::atomic<uint64_t> join_failed{0};  // kJoinJob requests that failed (e.g. a region missing)
  std::atomic<int64_t> shm_regions{0};   // ranks' shared regions mapped now (the process's)

  int RankOf(const std::string& region) const {
    auto it = std::find(world.begin(), world.end(), region);
    return it == world.end() ? -1 : static_cast<int>(it - world.begin());
  }
  void KeepLink(int peer, std::shared_ptr<net::Link> link) {
    transport->SetLink(peer, link);
    std::lock_guard<std::mutex> lock(mu);
    links[static_cast<size_t>(peer)] = std::move(link);
    links_cv.notify_all();
  }
  Status WaitForLinks(Deadline deadline) {
    std::unique_lock<std::mutex> lock(mu);
    for (;;) {
      std::string missing, dialled, awaited;
      for (size_t p = 0; p < links.size(); ++p) {
        // A link counts once the peer's hello came over it: numbering needs its incarnation.
        if (static_cast<int>(p) != rank &&
            (links[p] == nullptr || transport->PeerIncarnation(static_cast<int>(p)) == 0)) {
          AppendToList(missing, world[p]);
          AppendToList(config.Dials(world[p]) ? dialled : awaited, world[p]);
        }
      }
      if (missing.empty()) return Status::Ok();
      if (deadline.Expired() || stopping.load()) {
        // Which side dials tells the operator where to look (config.h, "Dial-only regions").
        std::string why = "no link yet to the gateway(s) of " + missing + " (shard " +
                          std::to_string(config.shard_index) +
                          "); check that they run and that peers.* addresses are right";
        if (!dialled.empty()) {
          why += "; this gateway dials " + dialled +
                 ": a region that admits no inbound connection (NAT, firewall) must dial "
                 "instead (wan.dial = \"outbound-only\" there, peers.<region>.dial = "
                 "\"outbound-only\" here)";
        }
        if (!awaited.empty()) {
          why += "; " + awaited + " dial(s) this gateway: check that they reach wan.listen " +
                 config.wan_listen.ToString();
        }
        return UnavailableError(why);
      }
      links_cv.wait_for(lock, std::chrono::milliseconds(50));
    }
  }

  // ---- Peer control (peer_control.cc) ----
  PeerControl peer_control;
  void RouteChannels();  // fills peer_control.router; by Start, before any link
  void OnOtherChannel(int peer, uint32_t channel, std::vector<uint8_t> message);
  void OnGenerationMessage(int peer, std::vector<uint8_t> message);
  // Policy agreement: offers from peers, offers to peers; the agreed policy of a job, waiting
  // for the other regions' offers until `deadline`.
  void OnPolicyMessage(int peer, std::vector<uint8_t> message);
  void SendPolicyOffers(const std::string& job, const std::vector<int>& peers);
  StatusOr<JobPolicy> AgreedPolicy(const std::string& job, Deadline deadline);

  // Shard weights: MeasuredWeights gives the agreed weights of operation (generation,
  // sequence) (empty = equal shards), offering this gateway's egress rates and waiting for the
  // peers' until `deadline`.
  std::vector<uint64_t> EgressRates();
  void SendToPeers(const std::vector<uint8_t>& message, const std::vector<int>& peers,
                   uint32_t channel);
  void SendToPeers(uint32_t channel, const std::vector<uint8_t>& message);  // to every peer
  StatusOr<std::vector<uint64_t>> MeasuredWeights(const std::string& job, uint64_t generation,
                                                  uint64_t sequence, Deadline deadline);
  // After a successful all-reduce: every gateway confirms it holds the result before any
  // answers its rank, so a step fails in every region or in none (short of a crash in the few
  // microseconds between two sends). Each confirmation received is relayed to the other regions
  // (kConfirmed on the generation channel, which needs the op's `job` for its header), and a
  // relay counts as the confirmation itself: one region pair cut while the step commits no
  // longer leaves those two failing it at their deadline while the third succeeds (commit.cc).
  Status ConfirmCommit(uint64_t op_id, const std::string& job, Deadline deadline);
  // Generation-channel kind kConfirmed from `peer` (I/O thread; never blocks).
  void OnConfirmedMessage(int peer, std::span<const uint8_t> message);
  // kJoinJob: agrees on the job's next generation with every peer (generation.h); blocks up to
  // the request's deadline.
  Message HandleJoin(Message& request);
  // kFetchResult: this gateway's committed result of the step, or a peer's; blocks up to the
  // request's deadline.
  Message HandleFetch(Message& request);
  // Generation-channel kinds kFetch / kFetched from `peer` (I/O thread; never blocks).
  void OnFetchMessage(int peer, std::span<const uint8_t> message);

  // Cross-region tunnels (tunnel.h): created by Start before any link, so that tunnel-channel
  // messages always find it; runs on `local`'s loop (ServeSocket attaches it), and its listens and
  // tunnels end when `stopping` turns true.
  std::unique_ptr<TunnelService> tunnels;
  std::shared_ptr<net::Link> LinkTo(int peer) {
    std::lock_guard<std::mutex> lock(mu);
    return peer >= 0 && static_cast<size_t>(peer) < links.size() ? links[static_cast<size_t>(peer)]
                                                                 : nullptr;
  }

  // ---- Region all-reduce (region.cc) ----
  RegionState region_state;
  std::vector<std::shared_ptr<net::Link>> region_links;  // dialed, by shard index; under `mu`
  // The receiver of a link another gateway of this region dialed (I/O thread; never blocks).
  net::MessageCallback RegionReceiver();
  // Until every gateway of the region was heard from (its incarnation is known).
  Status WaitForRegionLinks(Deadline deadline);
  // Runs `req` as a hierarchical all-reduce; its op_id is already the cross-region one
  // (RegionCrossOpId), `region_op_id` pairs the region's gateways (RegionSideOpId).
  Status RunRegionAllReduce(collective::AllReduceRequest& req, uint64_t region_op_id,
                            collective::AllReduceStats* stats);

  // Operations (gateway_metrics.cc): the Prometheus registry (families declared by Start),
  // per-all-reduce recording, and the /metrics, /healthz, /readyz server when metrics.listen
  // is set (started after the local socket, stopped first by Shutdown).
  MetricsRegistry metrics;
  void DeclareMetrics();
  void RecordAllReduce(const Message& request, const Status& status, int64_t elapsed_ns,
                       const collective::AllReduceStats& stats);
  std::string MetricsText();
  // Straggler detection (straggler.h) from each successful cross-region all-reduce's per-peer
  // waits: strait_peer_wait_seconds_total, strait_peer_slow, a WARN per named peer (at most one
  // a minute each) and /readyz's detail. Set up by Start.
  std::unique_ptr<StragglerDetector> stragglers;
  LogRateLimiter straggler_log{60'000'000'000};
  void RecordPeerWaits(const collective::AllReduceStats& stats);
  // What this shard lacks to be ready (one line each; empty when ready), and its slow peers.
  std::string MissingForReadiness();

  // Opens the link to peer region `p` (one that config.Dials: ranked above this one, or any
  // when this region is dial-only) / to gateway `index` of this region, replacing an ended one. Does not wait for streams.
  Status DialPeer(int p);
  Status DialRegionGateway(int index);
  // Called about twice a second on the local server's loop.
  void RedialEndedLinks();
  // The receiver of this shard's block on a link that peer region `peer` accepted from this
  // gateway (dialled) / on `link`, which the peer dialled (accepted: this shard's handle on it,
  // WithChannelBase, replaces links[peer] on the shard's first message over it, if Host::accepted
  // still holds it then). I/O thread; never block.
  net::MessageCallback DialledReceiver(int peer);
  net::MessageCallback AcceptedReceiver(const std::shared_ptr<net::Link>& link);
  // Sets up everything but the links, endpoint and socket (Host::Start does those).
  void Init(const GatewayConfig& shard_config, Host* shared,
            const std::vector<net::CodecProfile>& profiles);
  // Whether Handle may block on a request of this type (it then runs on a worker).
  static bool MayBlock(MessageType type);
  // Takes the request's data (an all-reduce answers in place).
  Message Handle(Message& request);
  Message HandleRegister(Message& request);
  // The all-reduce service (allreduce_service.h); kAllReduce, kAllReduceFrame, kRegionAllReduce.
  AllReduceService allreduce{*this};
};

// A reply to a request of type `to` carrying `status` (and nothing else yet).
Message Reply(MessageType to, const Status& status);
// An all-reduce's error reply for a request refused before its step was used (data: one byte 0;
// see "Operation identity" in localproto/protocol.h): the comm may issue that step again.
Message Refused(MessageType to, const Status& status);

}  // namespace strait::gateway

#endif  // STRAIT_LIB_GATEWAY_GATEWAY_IMPL_H_

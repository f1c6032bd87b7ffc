// Internal to lib/gateway: the state behind Gateway, shared by the files that implement its
// request handlers (gateway.cc: sockets, jobs, all-reduce, lifecycle). Not installed.
//
// Locking: `mu` guards links and jobs (`numbering` locks itself); counters are atomics. Handlers
// of requests that may block (all-reduce, join, fetch) run on the local server's workers, up to
// their request's deadline; the others run on its loop and must not block (local_server.h).
#ifndef STRAIT_LIB_GATEWAY_GATEWAY_IMPL_H_
#define STRAIT_LIB_GATEWAY_GATEWAY_IMPL_H_

#include <algorithm>
#include <atomic>
#include <condition_variable>
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
#include "common/strings.h"
#include "gateway/config.h"
#include "gateway/gateway.h"
#include "gateway/generation.h"
#include "gateway/http.h"
#include "gateway/local_server.h"
#include "gateway/metrics.h"
#include "gateway/policy.h"
#include "gateway/tunnel.h"
#include "localproto/frame_io.h"
#include "localproto/protocol.h"
#include "net/link.h"

namespace strait::gateway {

// The local protocol straitd serves (localproto/protocol.h); tunnel.h names the rest of it.
using localproto::DecodeMessageInto;
using localproto::EncodeMessageHead;
using localproto::ReadFrameInto;

struct Gateway::Impl {
  GatewayConfig config;
  std::vector<std::string> world;
  int rank = 0;
  std::unique_ptr<collective::NetTransport> transport;
  std::unique_ptr<net::Endpoint> endpoint;
  uint16_t wan_port = 0;
  ErrorFeedbackStore feedback;
  // The regions' agreement on each job's policy, and this machine's codec speeds for `auto`
  // (measured once at start; see policy.h). Set up by Start before any link exists.
  std::unique_ptr<PolicyAgreement> agreement;
  std::vector<net::CodecProfile> codec_profiles;

  std::mutex mu;
  std::condition_variable links_cv;
  std::vector<std::shared_ptr<net::Link>> links;
  // Per peer, the newest accepted link not yet adopted (it replaces links[peer] on its first
  // message; until then this handle keeps it open). One per peer: bounded under reconnect floods.
  std::map<int, std::shared_ptr<net::Link>> pending_links;
  std::map<std::string, JobPolicy> jobs;
  // job -> the uid that registered it (see "Jobs and isolation" in gateway.h).
  std::map<std::string, uint32_t> job_owners;
  // Each job's generations and its operations' identities (generation.h); thread-safe on its
  // own. Set up by Start before any link exists.
  std::unique_ptr<Generations> generations;

  std::atomic<bool> stopping{false};
  std::atomic<int> in_flight{0};
  // The local socket and its connections (local_server.h): started by Start after the links,
  // StopAccepting()ed first and Stop()ped last by Shutdown.
  std::unique_ptr<LocalServer> local;
  bool shut_down = false;

  // Counters for the stats request.
  std::atomic<uint64_t> connections{0}, refused_connections{0}, bad_requests{0};
  std::atomic<uint64_t> refused_requests{0};  // requests for a job of another uid
  std::atomic<uint64_t> allreduce_ok{0}, allreduce_failed{0}, bytes_sent{0}, bytes_received{0};
  std::atomic<uint64_t> join_failed{0};  // kJoinJob requests that failed (e.g. a region missing)
  // Where successful all-reduces spent their time (collective::AllReduceStats, summed; the
  // wall time of the cross-region operation itself), for `strait-bench allreduce`.
  std::atomic<int64_t> handle_ns{0}, allreduce_ns{0}, encode_ns{0}, reduce_ns{0}, decode_ns{0},
      wait_ns{0}, ack_wait_ns{0};

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
      std::string missing;
      for (size_t p = 0; p < links.size(); ++p) {
        // A link counts once the peer's hello came over it: numbering needs its incarnation.
        if (static_cast<int>(p) != rank &&
            (links[p] == nullptr || transport->PeerIncarnation(static_cast<int>(p)) == 0)) {
          AppendToList(missing, world[p]);
        }
      }
      if (missing.empty()) return Status::Ok();
      if (deadline.Expired() || stopping.load()) {
        return UnavailableError("no link yet to the gateway(s) of " + missing + " (shard " +
                                std::to_string(config.shard_index) +
                                "); check that they run and that peers.* addresses are right");
      }
      links_cv.wait_for(lock, std::chrono::milliseconds(50));
    }
  }

  // OK when `job` is unregistered or belongs to `uid`; otherwise kPermissionDenied saying
  // whose it is. Call with `mu` held.
  Status CheckJobOwner(const std::string& job, uint32_t uid) const {
    auto it = job_owners.find(job);
    if (it == job_owners.end() || it->second == uid) return Status::Ok();
    return PermissionDeniedError("job \"" + job + "\" belongs to uid " +
                                 std::to_string(it->second) + ", not to this client's uid " +
                                 std::to_string(uid) +
                                 "; a job's data is reachable only by the uid that registered it "
                                 "(use another job id, or run as that user)");
  }


  // Messages on link channels the collective does not use arrive in OnOtherChannel (I/O thread;
  // never blocks), which `router` (set up by RouteChannels, before any link) hands to the owner
  // of the channel's range in collective/channels.h: tunnels, generations, policy, rates.
  collective::ChannelRouter router;
  void RouteChannels();
  void OnOtherChannel(int peer, uint32_t channel, std::vector<uint8_t> message);
  void OnGenerationMessage(int peer, std::vector<uint8_t> message);
  // Policy agreement (gateway.cc, "Policy"): offers from peers, offers to peers; the agreed
  // policy of a job, waiting for the other regions' offers until `deadline`; the tensor's codecs
  // from it.
  void OnPolicyMessage(int peer, std::vector<uint8_t> message);
  void SendPolicyOffers(const std::string& job, const std::vector<int>& peers);
  StatusOr<JobPolicy> AgreedPolicy(const std::string& job, Deadline deadline);
  Status ChooseCodecs(const Message& request, Deadline deadline, TensorCodec* tc);

  // Shard weights from measured link rates (gateway.cc, "Shard weights"; the rule is in
  // policy.h): rates messages on kRatesChannel arrive in `weights_agreement` (set up by Start
  // before any link); MeasuredWeights gives the agreed weights of operation `number` (empty =
  // equal shards), offering this gateway's egress rates and waiting for the peers' until
  // `deadline`.
  std::unique_ptr<WeightsAgreement> weights_agreement;
  std::vector<uint64_t> EgressRates();
  void SendToPeers(const std::vector<uint8_t>& message, const std::vector<int>& peers,
                   uint32_t channel);
  void SendToPeers(uint32_t channel, const std::vector<uint8_t>& message);  // to every peer
  StatusOr<std::vector<uint64_t>> MeasuredWeights(const std::string& job, uint64_t generation,
                                                  uint64_t sequence, Deadline deadline);

  // Cross-region tunnels (tunnel.h): created by Start before any link, so that tunnel-channel
  // messages always find it; runs on `local`'s loop (ServeSocket attaches it), and its listens and
  // tunnels end when `stopping` turns true.
  std::unique_ptr<TunnelService> tunnels;
  std::shared_ptr<net::Link> LinkTo(int peer) {
    std::lock_guard<std::mutex> lock(mu);
    return peer >= 0 && static_cast<size_t>(peer) < links.size() ? links[static_cast<size_t>(peer)]
                                                                 : nullptr;
  }

  // Region all-reduces (gateway.cc, "Region all-reduce"; gateway.h): the region's gateways as a
  // second NetTransport, rank = shard index, world = config.RegionSize(), on link channels
  // collective::kRegionCollectiveChannels of same-region links. Each gateway
  // dials every other gateway of its region and sends over the link it dialed; what they send
  // arrives on links they dialed, which RegionReceiver() routes by the sender rank in the
  // NetTransport header. Set up by Start before any link; null when the region has one gateway.
  std::unique_ptr<collective::NetTransport> region_transport;
  std::vector<collective::NetTransport::Receiver> region_receivers;  // by shard index
  std::vector<std::shared_ptr<net::Link>> region_links;             // dialed, by shard index
  std::atomic<uint64_t> region_allreduce_ok{0}, region_bytes_sent{0}, region_bytes_received{0};
  // The receiver of a link another gateway of this region dialed (I/O thread; never blocks).
  net::MessageCallback RegionReceiver();
  // Until every gateway of the region was heard from (its incarnation is known).
  Status WaitForRegionLinks(Deadline deadline);
  // Runs `req` (numbered for the cross-region transport) as a hierarchical all-reduce.
  // `region_op_id` pairs the region's gateways (see HandleAllReduce).
  Status RunRegionAllReduce(collective::AllReduceRequest& req, uint64_t region_op_id,
                            collective::AllReduceStats* stats);

  // Operations (gateway_metrics.cc): the Prometheus registry (families declared by Start),
  // per-all-reduce recording, and the /metrics, /healthz, /readyz server when metrics.listen
  // is set (started after the local socket, stopped first by Shutdown).
  MetricsRegistry metrics;
  std::unique_ptr<HttpServer> http;
  void DeclareMetrics();
  void RecordAllReduce(const Message& request, const Status& status, int64_t elapsed_ns,
                       const collective::AllReduceStats& stats);
  std::string MetricsText();
  HttpResponse Readiness();  // 200, or 503 naming what is missing
  Status StartHttp();

  // Opens the link to peer region `p` (ranked above this one) / to gateway `index` of this
  // region, replacing an ended one. Does not wait for streams.
  Status DialPeer(int p);
  Status DialRegionGateway(int index);
  // Called about twice a second on the local server's loop.
  void RedialEndedLinks();
  // Starts `local` on config.local_socket.
  Status ServeSocket();
  // Whether Handle may block on a request of this type (it then runs on a worker).
  static bool MayBlock(MessageType type);
  // Takes the request's data (an all-reduce answers in place).
  Message Handle(Message& request);
  Message HandleAllReduce(Message& request);
  // kJoinJob: agrees on the job's next generation with every peer (generation.h); blocks up to
  // the request's deadline.
  Message HandleJoin(Message& request);

  // Recovering a step's result (kFetchResult; see "Result recovery" in localproto/protocol.h): each
  // gateway keeps the result of the last step it committed per (job, scope); a rank whose
  // gateway was killed after the commit asks its restarted gateway, which asks the peers.
  struct Committed {
    uint64_t generation = 0;
    uint64_t sequence = 0;
    std::vector<uint8_t> data;  // what the all-reduce's reply carried (tensor or frame)
  };
  std::mutex committed_mu;
  std::map<std::string, Committed> committed;  // by generation key
  struct Fetch {
    int answers = 0;
    bool found = false;
    std::vector<uint8_t> data;
  };
  std::condition_variable fetch_cv;
  std::map<std::tuple<std::string, uint64_t, uint64_t>, Fetch> fetches;  // under committed_mu
  Message HandleFetch(Message& request);
  // Generation-channel kinds kFetch / kFetched from `peer` (I/O thread; never blocks).
  void OnFetchMessage(int peer, std::span<const uint8_t> message);
  // After a successful all-reduce: every gateway confirms it holds the result before any
  // answers its rank, so a step fails in every region or in none (short of a crash in the few
  // microseconds between two sends).
  Status Commit(uint64_t op_id, Deadline deadline);
};

// A reply to a request of type `to` carrying `status` (and nothing else yet).
Message Reply(MessageType to, const Status& status);
// An all-reduce's error reply for a request refused before its step was used (data: one byte 0;
// see "Operation identity" in localproto/protocol.h): the comm may issue that step again.
Message Refused(MessageType to, const Status& status);

}  // namespace strait::gateway

#endif  // STRAIT_LIB_GATEWAY_GATEWAY_IMPL_H_

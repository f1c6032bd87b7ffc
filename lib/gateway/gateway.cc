// The gateway behind straitd (see gateway.h): its lifecycle (Start, Shutdown, ReloadIdentity),
// the local socket and its connections, request dispatch (Handle), and link supervision
// (RedialEndedLinks). The services it dispatches to live beside it (gateway_impl.h lists them):
// allreduce_service.cc, peer_control.cc, region.cc, gateway_metrics.cc.
#include "common/strings.h"
#include "gateway/gateway.h"

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
#include "common/endian.h"
#include "common/log.h"
#include "gateway/config_check.h"
#include "gateway/gateway_impl.h"

namespace strait::gateway {
namespace {

constexpr const char* kLog = "gateway";

}  // namespace

Message Reply(MessageType to, const Status& status) { return localproto::ReplyMessage(to, status); }

Message Refused(MessageType to, const Status& status) {
  Message m = Reply(to, status);
  m.data = {0};
  return m;
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
    case MessageType::kRegisterJob: return HandleRegister(request);
    case MessageType::kAllReduce:
    case MessageType::kAllReduceShm:
    case MessageType::kRegionAllReduce:
    case MessageType::kRegionAllReduceShm:
    case MessageType::kAllReduceFrame: return allreduce.Handle(request);
    case MessageType::kJoinJob: return HandleJoin(request);
    case MessageType::kFetchResult: return HandleFetch(request);
    case MessageType::kStats: {
      const AllReduceCounters& c = allreduce.counters();
      Message m = Reply(request.type, Status::Ok());
      std::ostringstream os;
      os << "connections " << connections << "\nrefused_connections " << refused_connections
         << "\nbad_requests " << bad_requests << "\nrefused_requests " << refused_requests
         << "\nallreduce_ok " << c.ok << "\nallreduce_failed " << c.failed << "\njoin_failed "
         << join_failed << "\nbytes_sent " << c.bytes_sent << "\nbytes_received "
         << c.bytes_received << "\nin_flight " << in_flight << "\nshm_regions " << shm_regions
         << "\n";
      // Time of the successful all-reduces (collective::AllReduceStats, summed over both of
      // each operation's threads).
      os << "handle_ns " << c.handle_ns << "\nallreduce_ns " << c.allreduce_ns << "\nencode_ns "
         << c.encode_ns << "\nreduce_ns " << c.reduce_ns << "\ndecode_ns " << c.decode_ns
         << "\nwait_ns " << c.wait_ns << "\nack_wait_ns " << c.ack_wait_ns << "\n";
      // Failure recovery (see "Operations" in gateway.h).
      os << "peer_restarts " << transport->PeerRestarts() << "\n";
      // Straggler detection (straggler.h): the peers named slow now, as /readyz says them.
      os << "slow_peers " << stragglers->SlowText() << "\n";
      // Operations numbered and announced to the peers that have not ended (0 when idle).
      os << "numbered_ops_in_flight " << generations->OpsInFlight() << "\n";
      // Peer regions whose link has not ended (past link.unreachable_after or by a restart): the
      // transport's own view, looser than /metrics' strait_peer_up (hello seen, a stream up,
      // not unreachable), which is what readiness and alerts use.
      int links_up = 0;
      {
        std::lock_guard<std::mutex> lock(mu);
        for (size_t p = 0; p < links.size(); ++p) {
          if (static_cast<int>(p) != rank && links[p] != nullptr && !links[p]->Estimates().ended) {
            ++links_up;
          }
        }
      }
      os << "peer_links_open " << links_up << "\n";
      os << tunnels->StatsText();
      os << "region_allreduce_ok " << region_state.allreduce_ok << "\nregion_bytes_sent "
         << region_state.bytes_sent << "\nregion_bytes_received " << region_state.bytes_received
         << "\nregion_scatter_ns " << region_state.scatter_ns << "\nregion_gather_ns "
         << region_state.gather_ns << "\n";
      const std::string s = os.str();
      m.data.assign(s.begin(), s.end());
      return m;
    }
    default:
      return Reply(MessageType::kHello, InvalidArgumentError("unexpected message"));
  }
}

Message Gateway::Impl::HandleRegister(Message& request) {
  auto policy = ResolvePolicy(request.policy, config.policy);
  if (!policy.ok()) {
    ++bad_requests;
    return Reply(request.type, policy.status());
  }
  STRAIT_LOG(kInfo, kLog) << "job " << request.job << ": policy " << policy->ToString();
  Message m = Reply(request.type, Status::Ok());
  m.text = policy->ToString();
  std::lock_guard<std::mutex> lock(mu);
  if (Status owner = jobs.CheckOwner(request.job, request.client_uid); !owner.ok()) {
    ++refused_requests;
    STRAIT_LOG(kWarn, kLog) << "refused register-job: " << owner.message();
    return Reply(request.type, owner);
  }
  // Measured shard weights unless the operator configured them (see "Shard weights").
  policy->measured_weights = config.ShardWeights().empty();
  jobs.Register(request.job, *policy, request.client_uid);
  // Offered to the other regions (see policy.h).
  peer_control.agreement->SetLocal(request.job, *policy);
  return m;
}

net::MessageCallback Gateway::Impl::DialledReceiver(int p) {
  return transport->ReceiverFor(p, [this, p](uint32_t ch, std::vector<uint8_t> m) {
    OnOtherChannel(p, ch, std::move(m));
  });
}

net::MessageCallback Gateway::Impl::AcceptedReceiver(const std::shared_ptr<net::Link>& link) {
  const int peer = RankOf(link->peer_region());
  const uint32_t base =
      static_cast<uint32_t>(config.shard_index) * collective::kShardChannelStride;
  // The new link replaces the one in use only once a message arrived over it (a dialing
  // gateway greets at once): an admitted peer whose fresh connections fail right after the
  // handshake must not take down the link that works (it did: /readyz went "not ready" and
  // the next all-reduce timed out). Weak: the link's own callback must not keep it alive.
  auto receiver = DialledReceiver(peer);
  auto adopted = std::make_shared<std::atomic<bool>>(false);
  std::weak_ptr<net::Link> weak = link;
  return net::MessageCallback([this, peer, base, adopted, weak, receiver = std::move(receiver)](
                                  uint32_t ch, std::vector<uint8_t> m) {
    if (!adopted->exchange(true)) {
      if (std::shared_ptr<net::Link> l = weak.lock()) KeepLink(peer, l->WithChannelBase(base));
    }
    receiver(ch, std::move(m));
  });
}

Status Gateway::Impl::DialPeer(int p) {
  const std::string& region = world[static_cast<size_t>(p)];
  const HostPort& addr = config.peers.at(region).at(config.shard_index);
  auto link = host->Dial(region, addr, config.shard_index);
  if (!link.ok()) {
    return link.status().WithContext("peers." + region + ".shard_" +
                                     std::to_string(config.shard_index));
  }
  KeepLink(p, *link);
  return Status::Ok();
}

void Gateway::Impl::RedialEndedLinks() {
  // A dialed link ends for good when its peer stayed unreachable past link.unreachable_after or
  // restarted (the net layer then refuses to resume the old session). The dialing side opens a
  // new one (config.Dials: the dial-only side of a pair, whatever the ranks); accepted links
  // come back when their peer dials again.
  std::vector<int> peers, gateways;
  {
    std::lock_guard<std::mutex> lock(mu);
    for (size_t p = 0; p < links.size(); ++p) {
      if (static_cast<int>(p) != rank && config.Dials(world[p]) && links[p] != nullptr &&
          links[p]->Estimates().ended) {
        peers.push_back(static_cast<int>(p));
      }
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

void Gateway::Impl::Init(const GatewayConfig& shard_config, Host* shared,
                         const std::vector<net::CodecProfile>& profiles) {
  Impl* g = this;
  g->config = shard_config;
  g->host = shared;
  g->world = config.WorldRegions();
  g->rank = g->RankOf(config.region);
  g->links.resize(g->world.size());
  g->transport = std::make_unique<collective::NetTransport>(
      g->rank, static_cast<int>(g->world.size()), g->world, collective::kDefaultCollectiveChannel,
      collective::kCollectiveChannelCount);
  g->generations = std::make_unique<Generations>(g->rank, g->world);
  g->stragglers = std::make_unique<StragglerDetector>(g->world, g->rank);

  // Region all-reduces (see gateway.h): the region's gateways, this one at its shard index (a
  // gateway that is not among them refuses region all-reduces; see RunRegionAllReduce).
  {
    const int m = config.RegionSize();
    std::vector<std::string> names;
    for (int i = 0; i < m; ++i) names.push_back(config.region + "/shard_" + std::to_string(i));
    g->region_state.transport = std::make_unique<collective::NetTransport>(
        config.shard_index < m ? config.shard_index : 0, m, names,
        collective::kRegionCollectiveChannel,
        collective::kCollectiveChannelCount);
    for (int i = 0; i < m; ++i) {
      g->region_state.receivers.push_back(g->region_state.transport->ReceiverFor(i));
    }
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

  g->peer_control.agreement = std::make_unique<PolicyAgreement>(g->rank, g->world);
  g->peer_control.weights_agreement =
      std::make_unique<WeightsAgreement>(g->rank, static_cast<int>(g->world.size()));
  g->RouteChannels();  // before any link: every message finds its owner
  g->peer_control.codec_profiles = profiles;
  g->DeclareMetrics();  // before any request can record into it
}

}  // namespace strait::gateway

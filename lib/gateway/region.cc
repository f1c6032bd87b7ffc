// The region all-reduce (kRegionAllReduce; "Region all-reduce" in gateway.h): the gateways of
// one region reduce-scatter a node head's tensor over the LAN, each all-reduces its shard across
// the regions, and they all-gather the result (collective/hierarchical.h). This file dials the
// region's other gateways, routes what they send, waits until every one was heard from, and runs
// the operation; its state is RegionState in gateway_impl.h. RegionReceiver's callback runs on
// the endpoint's I/O thread and never blocks; RunRegionAllReduce blocks up to the deadline.
#include <chrono>
#include <mutex>
#include <string>
#include <thread>
#include <utility>

#include "collective/hierarchical.h"
#include "common/endian.h"
#include "common/log.h"
#include "gateway/gateway_impl.h"

namespace strait::gateway {
namespace {

constexpr const char* kLog = "gateway";

}  // namespace

net::MessageCallback Gateway::Impl::RegionReceiver() {
  return [this](uint32_t channel, std::vector<uint8_t> message) {
    // NetTransport's trailer names the sender's rank (net_transport.h); that rank's receiver
    // checks the rest, the rank included.
    const int sender = collective::NetMessageSender(message);
    if (sender >= 0 && static_cast<size_t>(sender) < region_state.receivers.size() &&
        sender != config.shard_index) {
      region_state.receivers[static_cast<size_t>(sender)](channel, std::move(message));
      return;
    }
    STRAIT_LOG(kWarn, kLog) << "dropped a " << message.size() << "-byte message on channel "
                            << channel << " from a gateway of region " << config.region
                            << " that names no other gateway of it (do the region's gateways "
                               "agree on [peers."
                            << config.region << "]?)";
  };
}

Status Gateway::Impl::WaitForRegionLinks(Deadline deadline) {
  for (;;) {
    std::string missing;
    for (int i = 0; i < region_state.transport->size(); ++i) {
      if (i != region_state.transport->rank() && region_state.transport->PeerIncarnation(i) == 0) {
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
  Status s;
  if (config.shard_index >= m) {
    s = FailedPreconditionError("this gateway is shard_" + std::to_string(config.shard_index) +
                                " of region " + config.region +
                                " but its config lists no other gateway of the region; a region "
                                "all-reduce needs them all: add [peers." +
                                config.region + "] with shard_0..shard_" +
                                std::to_string(config.shard_index));
  }
  if (s.ok()) s = WaitForRegionLinks(req.deadline);
  if (!s.ok()) {
    // The shard's gateways in the other regions run this operation too: tell them.
    transport->Abort(req.op_id, s);
    return s;
  }
  collective::RegionSide side;
  side.transport = region_state.transport.get();
  side.op_id = region_op_id;
  collective::HierarchicalStats hs;
  s = collective::HierarchicalAllReduce(side, *transport, req, &hs);
  *stats = hs.cross;
  region_state.bytes_sent += hs.region_bytes_sent;
  region_state.bytes_received += hs.region_bytes_received;
  region_state.scatter_ns += static_cast<uint64_t>(hs.region_scatter_ns);
  region_state.gather_ns += static_cast<uint64_t>(hs.region_gather_ns);
  if (!s.ok()) {
    return s.WithContext("gateway " + std::to_string(config.shard_index) + " of " +
                         std::to_string(m) + " in " + config.region);
  }
  ++region_state.allreduce_ok;
  return s;
}

Status Gateway::Impl::DialRegionGateway(int index) {
  const HostPort& addr = config.region_gateways.at(index);
  auto link =
      config.region_plain
          ? host->endpoint->ConnectInRegion(addr.host, addr.port,
                                            region_state.receivers[static_cast<size_t>(index)])
          : host->endpoint->Connect(config.region, addr.host, addr.port,
                                    region_state.receivers[static_cast<size_t>(index)]);
  if (!link.ok()) {
    return link.status().WithContext("peers." + config.region + ".shard_" + std::to_string(index));
  }
  {
    std::lock_guard<std::mutex> lock(mu);
    region_links[static_cast<size_t>(index)] = *link;
  }
  region_state.transport->SetLink(index, *link);
  return Status::Ok();
}

}  // namespace strait::gateway

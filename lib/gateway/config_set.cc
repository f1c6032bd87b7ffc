// `straitd --check-config FILE...` with several files (config_check.h, CheckConfigSet): what no
// single config can tell, because it is spread over the configs of a deployment -- a shard served
// by two gateways of one region, both sides of a pair dial-only, a dial-only region its peers do
// not mark (or one they mark that does not dial), regions that disagree on shard weights, a
// region's gateways that disagree on plain region links or do not dial each other's
// region_links.listen.
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "gateway/config_check.h"

namespace strait::gateway {
namespace {

// "a.toml" or "a.toml and b.toml"-style naming of where a region's setting comes from.
std::string FileOf(const GatewayConfig& c) { return c.file.empty() ? "(config)" : c.file; }

// "262144", or "unset (by op size)" for the default.
std::string ChunkText(size_t chunk_elements) {
  return chunk_elements == 0 ? std::string("unset (by op size)") : std::to_string(chunk_elements);
}

}  // namespace

Status CheckConfigSet(const std::vector<GatewayConfig>& configs) {
  // A shard of a region served by two configs (two straitds of one node, or of two nodes).
  std::map<std::pair<std::string, int>, const GatewayConfig*> served;
  for (const GatewayConfig& c : configs) {
    for (const int k : c.shards) {
      auto [it, fresh] = served.emplace(std::make_pair(c.region, k), &c);
      if (!fresh) {
        return InvalidArgumentError(
            FileOf(c) + ": shards: shard " + std::to_string(k) + " of region " + c.region +
            " is also served by " + FileOf(*it->second) +
            "; fix: give each shard of a region to exactly one straitd (shard_index / shards)");
      }
    }
  }
  // Dial-only regions: both sides of a pair dial-only can never link; a peer must mark a
  // dial-only region (it does not dial it) and must not mark one that does not dial (then
  // nobody dials). Regions are taken from the configs given; a region none of them belongs to
  // is not judged.
  std::map<std::string, const GatewayConfig*> by_region;
  for (const GatewayConfig& c : configs) by_region.emplace(c.region, &c);
  for (const GatewayConfig& c : configs) {
    for (const auto& [peer, addresses] : c.peers) {
      auto it = by_region.find(peer);
      if (it == by_region.end()) continue;
      const GatewayConfig& p = *it->second;
      const bool marked = c.dial_only_peers.count(peer) != 0;
      if (c.dial_only && p.dial_only) {
        return InvalidArgumentError(
            FileOf(c) + ": wan.dial: regions " + c.region + " and " + peer +
            " are both dial-only (wan.dial = \"outbound-only\" here and in " + FileOf(p) +
            "), so neither accepts the other's link; fix: at most one side of a pair behind NAT "
            "(or connect them through a region that accepts)");
      }
      if (p.dial_only && !marked) {
        return InvalidArgumentError(
            FileOf(c) + ": peers." + peer + ".dial: region " + peer + " is dial-only (" +
            FileOf(p) + ") but this config does not mark it, so this gateway would dial it and "
            "never get through; fix: set peers." + peer + ".dial = \"outbound-only\"");
      }
      if (!p.dial_only && marked) {
        return InvalidArgumentError(
            FileOf(c) + ": peers." + peer + ".dial: marks region " + peer +
            " dial-only, but its config " + FileOf(p) +
            " does not dial (no wan.dial = \"outbound-only\"), so nobody dials that pair; fix: "
            "set wan.dial = \"outbound-only\" there, or remove the mark here");
      }
    }
  }
  // Region links: a gateway that dials plain TCP finds only TLS at a neighbour's address, and
  // the reverse; the region's gateways must agree ("Plain region links" in config.h).
  for (const GatewayConfig& c : configs) {
    const GatewayConfig& p = *by_region.at(c.region);
    if (c.region_plain != p.region_plain) {
      return InvalidArgumentError(
          FileOf(c) + ": region_links.transport: \"" + (c.region_plain ? "plain" : "tls") +
          "\" but \"" + (p.region_plain ? "plain" : "tls") + "\" in " + FileOf(p) +
          ", of the same region " + c.region +
          ", so their region links never come up; fix: the same [region_links] in every "
          "gateway of the region");
    }
  }
  // With plain region links, the region's other gateways dial each one at its
  // region_links.listen: their [peers.<own region>] must name it (a wildcard listen, its port).
  for (const GatewayConfig& c : configs) {
    if (!c.region_listen) continue;
    for (const GatewayConfig& p : configs) {
      if (&p == &c || p.region != c.region) continue;
      auto it = p.region_gateways.find(c.shard_index);
      if (it == p.region_gateways.end()) continue;
      if (!c.region_listen->Accepts(it->second)) {
        return InvalidArgumentError(
            FileOf(p) + ": peers." + c.region + ".shard_" + std::to_string(c.shard_index) + ": \"" +
            it->second.ToString() + "\", but that gateway (" + FileOf(c) +
            ") takes its plain region links on region_links.listen = \"" +
            c.region_listen->ToString() + "\"; fix: name that address here");
      }
    }
  }
  // Shard weights and chunk size: every region's gateways must configure the same (gateway.h).
  const GatewayConfig* first = nullptr;
  for (const GatewayConfig& c : configs) {
    if (first == nullptr) {
      first = &c;
      continue;
    }
    if (c.shard_weights != first->shard_weights) {
      return InvalidArgumentError(
          FileOf(c) + ": allreduce.shard_weights: differs from " + FileOf(*first) +
          "; fix: give every gateway of every region the same weights (or none anywhere), "
          "since each rank computes the split itself");
    }
    if (c.chunk_elements != first->chunk_elements) {
      return InvalidArgumentError(
          FileOf(c) + ": allreduce.chunk_elements: " + ChunkText(c.chunk_elements) +
          " differs from " + ChunkText(first->chunk_elements) + " in " + FileOf(*first) +
          "; fix: give every gateway of every region the same chunk size (or leave it unset "
          "everywhere), since every gateway cuts the tensor itself");
    }
  }
  return Status::Ok();
}

}  // namespace strait::gateway

// The parsed config's own logic, apart from its loading (config.cc): addresses (HostPort), the
// world and region sizes it implies, who dials whom, shard weights in world order, and the
// one-line summary for logs and --check-config.
#include <arpa/inet.h>

#include <algorithm>
#include <sstream>
#include <string>
#include <vector>

#include "common/units.h"
#include "gateway/config.h"
#include "strait/codec.h"

namespace strait::gateway {

std::string HostPort::ToString() const {
  if (host.find(':') != std::string::npos) return "[" + host + "]:" + std::to_string(port);
  return host + ":" + std::to_string(port);
}

namespace {

// Rewrites a numeric IPv4 or IPv6 address in its canonical spelling; false if it is neither.
// Dotted quads only: inet_aton's shorthands ("127.1") and octal ("010.0.0.1") are refused.
bool Canonicalize(std::string* host) {
  unsigned char v4[4], v6[16];
  char text[INET6_ADDRSTRLEN];
  if (::inet_pton(AF_INET, host->c_str(), v4) == 1) {
    if (::inet_ntop(AF_INET, v4, text, sizeof(text)) == nullptr) return false;
  } else if (::inet_pton(AF_INET6, host->c_str(), v6) == 1) {
    static constexpr unsigned char kMapped[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
    const bool mapped = std::equal(kMapped, kMapped + 12, v6);
    if (::inet_ntop(mapped ? AF_INET : AF_INET6, mapped ? v6 + 12 : v6, text, sizeof(text)) ==
        nullptr) {
      return false;
    }
  } else {
    return false;
  }
  *host = text;
  return true;
}

}  // namespace

StatusOr<HostPort> ParseHostPort(std::string_view text) {
  const std::string allowed =
      "allowed: \"<numeric IPv4>:<port>\" or \"[<numeric IPv6>]:<port>\", port 1-65535";
  HostPort hp;
  std::string_view port;
  if (!text.empty() && text[0] == '[') {
    const size_t close = text.find(']');
    if (close == std::string_view::npos || close + 1 >= text.size() || text[close + 1] != ':') {
      return InvalidArgumentError(allowed);
    }
    hp.host = std::string(text.substr(1, close - 1));
    port = text.substr(close + 2);
  } else {
    const size_t colon = text.rfind(':');
    if (colon == std::string_view::npos || text.find(':') != colon) {
      return InvalidArgumentError(allowed);
    }
    hp.host = std::string(text.substr(0, colon));
    port = text.substr(colon + 1);
  }
  // The host in its canonical spelling ("0:0:0:0:0:0:0:0" is "::", "::0001" is "::1", an
  // IPv4-mapped "::ffff:10.0.0.7" and a bracketed "[10.0.0.7]" are "10.0.0.7"), so that
  // comparing two addresses as text (the wildcard, a listener's own entry among its peers)
  // compares the addresses, as the net layer does (it unmaps mapped addresses too).
  const bool host_ok = hp.host.find('\0') == std::string::npos && Canonicalize(&hp.host);
  if (!host_ok || port.empty() || port.size() > 5 ||
      !std::all_of(port.begin(), port.end(), [](char c) { return c >= '0' && c <= '9'; })) {
    return InvalidArgumentError(allowed);
  }
  const int p = std::stoi(std::string(port));
  if (p < 1 || p > 65535) return InvalidArgumentError(allowed);
  hp.port = static_cast<uint16_t>(p);
  return hp;
}

std::vector<std::string> GatewayConfig::WorldRegions() const {
  std::vector<std::string> regions{region};
  for (const auto& [name, addresses] : peers) regions.push_back(name);
  std::sort(regions.begin(), regions.end());
  return regions;
}

bool GatewayConfig::Dials(const std::string& peer) const {
  if (dial_only) return true;
  if (dial_only_peers.count(peer) != 0) return false;
  return region < peer;  // the rank rule: ranks are the sorted order of WorldRegions()
}

int GatewayConfig::RegionSize() const {
  if (region_gateways.empty()) return 1;
  return std::max(shard_index, region_gateways.rbegin()->first) + 1;
}

std::vector<uint64_t> GatewayConfig::ShardWeights() const {
  std::vector<uint64_t> weights;
  if (shard_weights.empty()) return weights;
  for (const std::string& r : WorldRegions()) weights.push_back(shard_weights.at(r));
  return weights;
}

std::string GatewayConfig::Summary() const {
  std::ostringstream os;
  os << "region " << region << (shards.size() > 1 ? " shards " : " shard ")
     << ShardListText(shards) << ", world [";
  const auto world = WorldRegions();
  for (size_t i = 0; i < world.size(); ++i) os << (i ? ", " : "") << world[i];
  os << "], wan " << wan_listen.ToString() << " ("
     << (transport == net::Transport::kTls ? "tls" : "plain") << "), socket " << local_socket
     << ", policy " << policy.default_codec << (policy.default_error_feedback ? "+ef" : "")
     << " allowed [";
  for (size_t i = 0; i < policy.allowed_codecs.size(); ++i) {
    os << (i ? "," : "") << CodecName(policy.allowed_codecs[i]);
  }
  os << "]";
  if (!region_gateways.empty()) {
    os << ", region gateways " << RegionSize();
    if (region_listen) os << " (plain TCP on " << region_listen->ToString() << ")";
  }
  if (dial_only) os << ", dial-only (dials every peer region)";
  if (!dial_only_peers.empty()) {
    os << ", dial-only peers [";
    size_t i = 0;
    for (const std::string& r : dial_only_peers) os << (i++ ? ", " : "") << r;
    os << "]";
  }
  if (link.max_rate_bps != 0 || !link.peer_max_rate_bps.empty()) {
    const double rate = static_cast<double>(link.max_rate_bps);
    os << ", paced at " << (rate != 0 ? FormatRate(rate) : std::string("no cap"));
    for (const auto& [peer, peer_rate] : link.peer_max_rate_bps) {
      os << ", " << peer << " " << FormatRate(static_cast<double>(peer_rate));
    }
  }
  if (!shard_weights.empty()) {
    os << ", shard weights [";
    const std::vector<uint64_t> w = ShardWeights();
    for (size_t i = 0; i < w.size(); ++i) os << (i ? ", " : "") << w[i];
    os << "]";
  }
  if (chunk_elements != 0) {
    os << ", chunks of " << chunk_elements << " elements";
  }
  return os.str();
}

GatewayConfig GatewayConfig::ForShard(int k) const {
  GatewayConfig c = *this;
  c.shard_index = k;
  c.shards = {k};
  return c;
}

std::string ShardListText(const std::vector<int>& shards) {
  if (shards.empty()) return "none";
  bool contiguous = true;
  for (size_t i = 1; i < shards.size(); ++i) contiguous &= shards[i] == shards[i - 1] + 1;
  if (shards.size() == 1) return std::to_string(shards[0]);
  if (contiguous) return std::to_string(shards.front()) + "-" + std::to_string(shards.back());
  std::string text;
  for (const int k : shards) text += (text.empty() ? "" : ", ") + std::to_string(k);
  return text;
}

}  // namespace strait::gateway

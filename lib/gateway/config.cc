// Loading and validating the straitd TOML config (see config.h for the format).
//
// Validation walks the document table by table with a Reader (config_reader.h) that remembers
// which keys it consumed; whatever is left over is an unknown key. The first problem found becomes the one
// error returned, so the operator fixes one clear thing at a time.
#include "common/strings.h"
#include "gateway/config.h"

#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <iterator>
#include <set>
#include <sstream>

#include <toml++/toml.h>

#include "common/units.h"
#include "gateway/config_reader.h"
#include "gateway/policy.h"
#include "net/socket_options.h"

namespace strait::gateway {
namespace {

using config_internal::Reader;
using config_internal::TypeName;

// Region names as net::Endpoint accepts them: they end up in certificate URIs.
bool ValidRegionName(std::string_view name) {
  if (name.empty() || name.size() > 63) return false;
  for (char c : name) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-' || c == '_' ||
                    (c >= 'A' && c <= 'Z') || c == '.';
    if (!ok) return false;
  }
  return true;
}
constexpr const char* kRegionAllowed =
    "1-63 characters from letters, digits, '-', '_' and '.'";

std::string ResolvePath(const std::string& file, const std::string& path) {
  if (path.empty() || path[0] == '/') return path;
  const size_t slash = file.rfind('/');
  if (slash == std::string::npos) return path;
  return file.substr(0, slash + 1) + path;
}

// wan.dial and peers.<region>.dial: who dials the links of a region ("Dial-only regions" in
// config.h). Sets *outbound_only; the error names the key and both values.
constexpr const char* kDialAllowed =
    "\"outbound-only\" (the region is behind NAT or a firewall that admits no inbound "
    "connection, and dials every link itself) or \"any\" (the default: it accepts links, and "
    "the region of lower rank dials)";
Status ReadDialMode(const Reader& r, const toml::node& n, const std::string& key_path,
                    bool* outbound_only) {
  if (!n.is_string()) {
    return r.Error(n.source(), key_path,
                   std::string("found ") + TypeName(n.type()) + "; allowed: " + kDialAllowed);
  }
  const std::string& v = n.as_string()->get();
  if (v != "outbound-only" && v != "any") {
    return r.Error(n.source(), key_path, "found \"" + v + "\"; allowed: " + kDialAllowed);
  }
  *outbound_only = v == "outbound-only";
  return Status::Ok();
}

// `shards`: an array of distinct indices, or a string range "first-last" (both included).
constexpr const char* kShardsAllowed =
    "an array of distinct shard indices in [0, 4095] such as [0, 1, 2, 3], or a range string "
    "such as \"0-3\"";
Status ReadShardSet(const Reader& top, const toml::node& n, std::vector<int>* out) {
  out->clear();
  if (const toml::array* a = n.as_array(); a != nullptr) {
    for (size_t i = 0; i < a->size(); ++i) {
      const toml::node& e = (*a)[i];
      const std::string path = "shards[" + std::to_string(i) + "]";
      if (!e.is_integer()) {
        return top.Error(e.source(), path,
                         std::string("found ") + TypeName(e.type()) + "; allowed: " +
                             kShardsAllowed);
      }
      const int64_t v = e.as_integer()->get();
      if (v < 0 || v > kMaxConfigShard) {
        return top.Error(e.source(), path,
                         "found " + std::to_string(v) + "; allowed: " + kShardsAllowed);
      }
      if (std::find(out->begin(), out->end(), v) != out->end()) {
        return top.Error(e.source(), path,
                         "shard " + std::to_string(v) +
                             " is listed twice; allowed: each shard once (one process serves "
                             "a shard once)");
      }
      out->push_back(static_cast<int>(v));
    }
  } else if (const toml::value<std::string>* range = n.as_string(); range != nullptr) {
    const std::string& text = range->get();
    const size_t dash = text.find('-');
    auto number = [](std::string_view digits, int* v) {
      if (digits.empty() || digits.size() > 4 ||
          !std::all_of(digits.begin(), digits.end(), [](char ch) { return ch >= '0' && ch <= '9'; })) {
        return false;
      }
      *v = std::stoi(std::string(digits));
      return *v <= kMaxConfigShard;
    };
    int first = 0, last = 0;
    if (dash == std::string::npos || !number(std::string_view(text).substr(0, dash), &first) ||
        !number(std::string_view(text).substr(dash + 1), &last) || last < first) {
      return top.Error(n.source(), "shards",
                       "found \"" + text + "\"; allowed: " + kShardsAllowed);
    }
    for (int k = first; k <= last; ++k) out->push_back(k);
  } else {
    return top.Error(n.source(), "shards",
                     std::string("found ") + TypeName(n.type()) + "; allowed: " + kShardsAllowed);
  }
  if (out->empty()) {
    return top.Error(n.source(), "shards", std::string("found no shard; allowed: ") + kShardsAllowed);
  }
  std::sort(out->begin(), out->end());
  return Status::Ok();
}

Status ReadTopLevel(Reader& top, GatewayConfig* c) {
  STRAIT_RETURN_IF_ERROR(top.ReadString("region", true, &c->region));
  if (!ValidRegionName(c->region)) {
    return top.Error(top.Get("region")->source(), "region",
                     "found \"" + c->region + "\"; allowed: " + kRegionAllowed);
  }
  const toml::node* index = top.Get("shard_index");
  const toml::node* set = top.Get("shards");
  if (index == nullptr && set == nullptr) {
    // A misspelt key (`shard_idx`) is the likelier mistake than a forgotten one: name it, as the
    // unknown-key check at the end would, rather than report shard_index missing.
    static constexpr std::string_view kTopLevel[] = {
        "region", "shard_index", "shards",    "local",    "wan", "tls", "peers", "region_links",
        "link",   "policy",      "allreduce", "metrics"};
    for (const auto& entry : top.table()) {
      const toml::key& key = entry.first;
      if (std::find(std::begin(kTopLevel), std::end(kTopLevel), key.str()) ==
          std::end(kTopLevel)) {
        return top.Error(key.source(), std::string(key.str()),
                         "unknown key; allowed keys here: region, shard_index, shards, local, "
                         "wan, tls, peers, region_links, link, policy, allreduce, metrics");
      }
    }
  }
  if ((index == nullptr) == (set == nullptr)) {
    const toml::node* at = index != nullptr ? index : set;
    const std::string why =
        at != nullptr ? "both shard_index and shards are given" : "missing shard_index";
    return at != nullptr
               ? top.Error(at->source(), "shards", why + "; allowed: exactly one of them")
               : top.ErrorAtTable(why + "; allowed: shard_index = <0..4095> (this gateway "
                                        "serves one shard) or shards = [0, 1, ...] / \"0-3\" "
                                        "(one gateway for the node's shards)");
  }
  if (index != nullptr) {
    int64_t shard = 0;
    STRAIT_RETURN_IF_ERROR(top.ReadInt("shard_index", true, 0, kMaxConfigShard, &shard));
    c->shard_index = static_cast<int>(shard);
    c->shards = {c->shard_index};
    return Status::Ok();
  }
  STRAIT_RETURN_IF_ERROR(ReadShardSet(top, *set, &c->shards));
  c->shard_index = c->shards.front();
  return Status::Ok();
}

Status ReadLocal(Reader& top, const std::string& file, GatewayConfig* c) {
  const toml::table* t = nullptr;
  STRAIT_RETURN_IF_ERROR(top.ReadTable("local", true, &t));
  Reader r(*t, "local", file);
  STRAIT_RETURN_IF_ERROR(r.ReadString("socket", true, &c->local_socket));
  // sockaddr_un::sun_path holds 108 bytes including the terminator.
  if (c->local_socket.empty() || c->local_socket.size() > 107) {
    return r.Error(r.Get("socket")->source(), "local.socket",
                   "found a path of " + std::to_string(c->local_socket.size()) +
                       " bytes; allowed: a path of 1-107 bytes (the Unix socket limit)");
  }
  STRAIT_RETURN_IF_ERROR(r.ReadIdList("allowed_uids", &c->allowed_uids));
  STRAIT_RETURN_IF_ERROR(r.ReadIdList("allowed_gids", &c->allowed_gids));
  if (c->allowed_uids.empty() && c->allowed_gids.empty()) {
    return r.ErrorAtTable(
        "neither allowed_uids nor allowed_gids lists anyone, so no rank could connect; "
        "allowed: at least one uid or gid");
  }
  return r.CheckNoUnknownKeys({"socket", "allowed_uids", "allowed_gids"});
}

Status ReadWanAndTls(Reader& top, const std::string& file, GatewayConfig* c) {
  const toml::table* t = nullptr;
  STRAIT_RETURN_IF_ERROR(top.ReadTable("wan", true, &t));
  Reader r(*t, "wan", file);
  std::string listen;
  STRAIT_RETURN_IF_ERROR(r.ReadString("listen", true, &listen));
  auto hp = ParseHostPort(listen);
  if (!hp.ok()) {
    return r.Error(r.Get("listen")->source(), "wan.listen",
                   "found \"" + listen + "\"; " + hp.status().message());
  }
  c->wan_listen = *hp;
  std::string transport = "tls";
  STRAIT_RETURN_IF_ERROR(r.ReadString("transport", false, &transport));
  if (transport == "tls") {
    c->transport = net::Transport::kTls;
  } else if (transport == "plain") {
    c->transport = net::Transport::kPlainTcp;
  } else {
    return r.Error(r.Get("transport")->source(), "wan.transport",
                   "found \"" + transport + "\"; allowed: \"tls\" or \"plain\"");
  }
  if (const toml::node* n = r.Get("dial"); n != nullptr) {
    STRAIT_RETURN_IF_ERROR(ReadDialMode(r, *n, "wan.dial", &c->dial_only));
  }
  STRAIT_RETURN_IF_ERROR(r.CheckNoUnknownKeys({"listen", "transport", "dial"}));

  const toml::table* tls = nullptr;
  STRAIT_RETURN_IF_ERROR(top.ReadTable("tls", false, &tls));
  if (c->transport == net::Transport::kPlainTcp) {
    if (tls != nullptr) {
      return top.Error(tls->source(), "tls",
                       "a [tls] table was given but wan.transport = \"plain\"; allowed: remove "
                       "[tls], or set wan.transport = \"tls\"");
    }
    return Status::Ok();
  }
  if (tls == nullptr) {
    return top.ErrorAtTable(
        "missing table [tls] (ca, cert, key) required by wan.transport = \"tls\" (the default); "
        "allowed: a [tls] table, or wan.transport = \"plain\" for trusted test networks");
  }
  Reader rt(*tls, "tls", file);
  STRAIT_RETURN_IF_ERROR(rt.ReadString("ca", true, &c->tls_ca));
  STRAIT_RETURN_IF_ERROR(rt.ReadString("cert", true, &c->tls_cert));
  STRAIT_RETURN_IF_ERROR(rt.ReadString("key", true, &c->tls_key));
  c->tls_ca = ResolvePath(file, c->tls_ca);
  c->tls_cert = ResolvePath(file, c->tls_cert);
  c->tls_key = ResolvePath(file, c->tls_key);
  return rt.CheckNoUnknownKeys({"ca", "cert", "key"});
}

int ShardIndexOf(const std::string& key) {
  if (key.rfind("shard_", 0) != 0 || key.size() <= 6 || key.size() > 10 ||
      !std::all_of(key.begin() + 6, key.end(), [](char ch) { return ch >= '0' && ch <= '9'; })) {
    return -1;
  }
  return std::stoi(key.substr(6));
}

// [peers.<own region>]: the region's gateways must be shard_0..shard_<m-1> (this one's own
// entry may be listed, so that every gateway of a cluster can share one [peers] section; it is
// not used). Leaves the others in c->region_gateways.
Status CheckRegionGateways(Reader& peers, const toml::node& node, const std::string& path,
                           GatewayConfig* c) {
  std::map<int, HostPort>& gateways = c->region_gateways;
  int last = c->shard_index;
  for (const auto& [index, addr] : gateways) last = std::max(last, index);
  for (int k = 0; k <= last; ++k) {
    if (k == c->shard_index || gateways.count(k) != 0) continue;
    return peers.Error(node.source(), path + ".shard_" + std::to_string(k),
                       "missing: the gateways of region " + c->region + " are numbered shard_0.." +
                           "shard_" + std::to_string(last) + " (this is shard_" +
                           std::to_string(c->shard_index) +
                           ") and a region all-reduce needs every one; allowed: add shard_" +
                           std::to_string(k) + " = \"host:port\", or list fewer gateways");
  }
  if (auto self = gateways.find(c->shard_index); self != gateways.end()) {
    c->region_self_entry = self->second;
    gateways.erase(self);
  }
  if (gateways.empty()) {
    return peers.Error(node.source(), path,
                       "lists no gateway of region " + c->region + " but this one; allowed: "
                       "shard_<index> = \"host:port\" for the region's other gateways, or no "
                       "[" + path + "] table");
  }
  return Status::Ok();
}

// A region all-reduce pairs gateway i of this region with shard_i of every other: once this
// region lists m gateways, no other region may list a shard index >= m.
Status CheckSameGatewayCount(Reader& peers, const toml::table& table, const GatewayConfig* c) {
  if (c->region_gateways.empty()) return Status::Ok();
  const int m = c->RegionSize();
  for (auto&& [region_key, node] : table) {
    if (region_key.str() == c->region || !node.is_table()) continue;
    for (auto&& [shard_key, addr] : *node.as_table()) {
      if (ShardIndexOf(std::string(shard_key.str())) < m) continue;
      return peers.Error(
          shard_key.source(), "peers." + std::string(region_key.str()) + "." +
                                  std::string(shard_key.str()),
          "region " + c->region + " runs " + std::to_string(m) + " gateways ([peers." +
              c->region + "] lists shard_0..shard_" + std::to_string(m - 1) +
              "), and a region all-reduce pairs the gateways of every region by shard index; "
              "allowed: the same number of gateways in every region (shard_0..shard_" +
              std::to_string(m - 1) + ")");
    }
  }
  return Status::Ok();
}

// peers.<region>.dial. For a peer region: "outbound-only" marks it dial-only, which a gateway
// that is dial-only itself cannot accept (neither side would take the other's link). For this
// gateway's own region (a [peers] section shared by every config of a cluster): it must say
// what wan.dial says, so that the two never disagree.
Status CheckPeerDial(const Reader& peers, const toml::node& n, const std::string& key_path,
                     const std::string& region, GatewayConfig* c) {
  bool outbound_only = false;
  STRAIT_RETURN_IF_ERROR(ReadDialMode(peers, n, key_path, &outbound_only));
  const char* own_mode = c->dial_only ? "\"outbound-only\"" : "\"any\"";
  if (region == c->region) {
    if (outbound_only == c->dial_only) return Status::Ok();
    return peers.Error(n.source(), key_path,
                       "names this gateway's own region, whose dial mode is wan.dial (" +
                           std::string(own_mode) + " here), and differs from it; allowed: " +
                           "the same value as wan.dial, or remove it (set wan.dial = "
                           "\"outbound-only\" if this region is the one behind NAT)");
  }
  if (!outbound_only) return Status::Ok();
  if (c->dial_only) {
    return peers.Error(n.source(), key_path,
                       "both sides of the pair are dial-only: region " + region +
                           " is marked \"outbound-only\" and so is this gateway (wan.dial), so "
                           "neither would accept the other's link; allowed: remove one of the "
                           "two: a region behind NAT needs peers that accept inbound links (open "
                           "or forward the wan.listen port of one side)");
  }
  c->dial_only_peers.insert(region);
  return Status::Ok();
}

Status ReadPeers(Reader& top, const std::string& file, GatewayConfig* c) {
  const toml::table* t = nullptr;
  STRAIT_RETURN_IF_ERROR(top.ReadTable("peers", true, &t));
  Reader peers(*t, "peers", file);
  for (auto&& [region_key, node] : *t) {
    const std::string region(region_key.str());
    const std::string path = "peers." + region;
    if (!ValidRegionName(region)) {
      return peers.Error(region_key.source(), path,
                         "invalid region name; allowed: " + std::string(kRegionAllowed));
    }
    // The own region's table lists the region's gateways, for region all-reduces.
    const bool own = region == c->region;
    if (!node.is_table()) {
      return peers.Error(node.source(), path,
                         std::string("found ") + TypeName(node.type()) +
                             "; allowed: a table of shard_<index> = \"host:port\"");
    }
    std::map<int, HostPort>& shards = own ? c->region_gateways : c->peers[region];
    for (auto&& [shard_key, addr] : *node.as_table()) {
      const std::string key(shard_key.str());
      const std::string kpath = path + "." + key;
      if (key == "dial") {
        STRAIT_RETURN_IF_ERROR(CheckPeerDial(peers, addr, kpath, region, c));
        continue;
      }
      if (key == "max_rate") {
        Reader table(*node.as_table(), path, file);
        uint64_t rate = 0;
        STRAIT_RETURN_IF_ERROR(table.ReadRate("max_rate", &rate));
        c->link.peer_max_rate_bps[region] = rate;
        continue;
      }
      const int index = ShardIndexOf(key);
      if (index < 0 || index > 4095) {
        return peers.Error(shard_key.source(), kpath,
                           "unknown key; allowed: shard_<index> with index in [0, 4095], "
                           "dial, or max_rate");
      }
      if (!addr.is_string()) {
        return peers.Error(addr.source(), kpath,
                           std::string("found ") + TypeName(addr.type()) +
                               "; allowed: a string \"host:port\"");
      }
      auto hp = ParseHostPort(addr.as_string()->get());
      if (!hp.ok()) {
        return peers.Error(addr.source(), kpath,
                           "found \"" + addr.as_string()->get() + "\"; " + hp.status().message());
      }
      shards[index] = *hp;
    }
    if (own) {
      // A shared [peers] section's table for a NAT'd region that runs one gateway holds only
      // `dial`: no region gateways.
      if ((!shards.empty() || !node.as_table()->contains("dial")) && c->shards.size() > 1) {
        return peers.Error(node.source(), path,
                           "region all-reduces (the NCCL plugin's CollNet mode) need one "
                           "gateway process per shard, and this config serves shards " +
                               ShardListText(c->shards) +
                               "; allowed: shard_index = <k> in each region gateway's config, "
                               "or no [" + path + "] table");
      }
      if (!shards.empty() || !node.as_table()->contains("dial")) {
        STRAIT_RETURN_IF_ERROR(CheckRegionGateways(peers, node, path, c));
      }
      continue;
    }
    // A dial-only peer dials this gateway, so it needs no address here.
    for (const int k : c->shards) {
      if (shards.count(k) != 0 || c->dial_only_peers.count(region) != 0) continue;
      return peers.Error(node.source(), path + ".shard_" + std::to_string(k),
                         "missing: this gateway serves shard " + std::to_string(k) +
                             " and runs its all-reduces with that shard of every peer region; "
                             "allowed: add shard_" + std::to_string(k) +
                             " = \"host:port\"" +
                             (c->dial_only ? std::string()
                                           : ", or dial = \"outbound-only\" if region " +
                                                 region + " is behind NAT and dials this "
                                                 "gateway"));
    }
  }
  if (c->peers.empty()) {
    return peers.ErrorAtTable(
        "no peer regions; allowed: at least one [peers.<region>] table with shard addresses");
  }
  return CheckSameGatewayCount(peers, *t, c);
}

Status ReadLink(Reader& top, const std::string& file, GatewayConfig* c) {
  const toml::table* t = nullptr;
  STRAIT_RETURN_IF_ERROR(top.ReadTable("link", false, &t));
  if (t == nullptr) return Status::Ok();
  Reader r(*t, "link", file);
  int64_t streams = c->link.streams;
  STRAIT_RETURN_IF_ERROR(r.ReadInt("streams", false, 1, 64, &streams));
  c->link.streams = static_cast<int>(streams);
  if (c->link.streams > c->link.max_streams) c->link.max_streams = c->link.streams;
  STRAIT_RETURN_IF_ERROR(r.ReadBool("adapt_streams", &c->link.adapt_streams));
  STRAIT_RETURN_IF_ERROR(r.ReadString("congestion_control", false, &c->link.congestion_control));
  if (const toml::node* n = r.Get("congestion_control"); n != nullptr) {
    const std::string& cc = c->link.congestion_control;
    const bool ok = !cc.empty() && cc.size() < 16 &&
                    std::all_of(cc.begin(), cc.end(), [](char ch) {
                      return (ch >= 'a' && ch <= 'z') || (ch >= '0' && ch <= '9') || ch == '_';
                    });
    if (!ok) {
      return r.Error(n->source(), "link.congestion_control",
                     "found \"" + cc + "\"; allowed: a kernel algorithm name such as \"bbr\", "
                     "\"cubic\", \"reno\"");
    }
  }
  STRAIT_RETURN_IF_ERROR(r.ReadRate("max_rate", &c->link.max_rate_bps));
  STRAIT_RETURN_IF_ERROR(r.ReadDuration("handshake_timeout", &c->link.handshake_timeout_ns));
  STRAIT_RETURN_IF_ERROR(r.ReadDuration("unreachable_after", &c->link.unreachable_after_ns));
  STRAIT_RETURN_IF_ERROR(r.ReadDuration("stream_timeout", &c->link.stream_timeout_ns));
  if (const toml::node* n = r.Get("stream_timeout");
      n != nullptr && c->link.stream_timeout_ns <= c->link.ping_interval_ns) {
    // A stream is declared dead when nothing, not even a keepalive ping, came for this long.
    return r.Error(n->source(), "link.stream_timeout",
                   "found \"" + std::string(*n->value<std::string>()) +
                       "\"; allowed: longer than the streams' keepalive interval (" +
                       std::to_string(c->link.ping_interval_ns / 1'000'000) + "ms), e.g. \"10s\"");
  }
  STRAIT_RETURN_IF_ERROR(r.ReadDuration("tcp_rto_max", &c->link.tcp_rto_max_ns));
  if (const toml::node* n = r.Get("tcp_rto_max");
      n != nullptr && (c->link.tcp_rto_max_ns < net::kMinTcpRtoMaxNs ||
                       c->link.tcp_rto_max_ns > net::kMaxTcpRtoMaxNs)) {
    return r.Error(n->source(), "link.tcp_rto_max",
                   "found \"" + std::string(*n->value<std::string>()) +
                       "\"; allowed: a duration from 1s to 120s (the kernel's bounds)");
  }
  return r.CheckNoUnknownKeys({"streams", "adapt_streams", "congestion_control", "max_rate",
                               "handshake_timeout", "unreachable_after", "stream_timeout",
                               "tcp_rto_max"});
}

Status ReadPolicy(Reader& top, const std::string& file, GatewayConfig* c) {
  const toml::table* t = nullptr;
  STRAIT_RETURN_IF_ERROR(top.ReadTable("policy", false, &t));
  if (t == nullptr) return Status::Ok();
  Reader r(*t, "policy", file);
  PolicyLimits& p = c->policy;
  const char* codec_choices =
      "\"auto\", \"none\", \"zstd\", \"int8\", \"int4\", \"fp8\", \"auto:int8\" (auto that may go "
      "lossy with that codec), or any job policy string such as \"zstd:3\" or \"int8,ef\"";
  std::string codec = p.default_codec;
  STRAIT_RETURN_IF_ERROR(r.ReadString("codec", false, &codec));
  if (!ParsePolicyRequest(codec).ok()) {  // the grammar of a job's request (policy.h)
    return r.Error(r.Get("codec")->source(), "policy.codec",
                   "found \"" + codec + "\"; allowed: " + codec_choices);
  }
  p.default_codec = codec;
  STRAIT_RETURN_IF_ERROR(r.ReadBool("error_feedback", &p.default_error_feedback));
  STRAIT_RETURN_IF_ERROR(r.ReadSize("min_lossy_bytes", &p.min_lossy_bytes));
  STRAIT_RETURN_IF_ERROR(r.ReadDouble("max_relative_error", 0.0, 1.0, &p.max_relative_error));
  if (const toml::node* n = r.Get("allowed_codecs"); n != nullptr) {
    const char* allowed = "an array of codec names from \"none\", \"zstd\", \"int8\", \"int4\", "
                          "\"fp8\" with at least one lossless codec (none or zstd)";
    if (!n->is_array()) {
      return r.Error(n->source(), "policy.allowed_codecs",
                     std::string("found ") + TypeName(n->type()) + "; allowed: " + allowed);
    }
    p.allowed_codecs.clear();
    const toml::array& a = *n->as_array();
    for (size_t i = 0; i < a.size(); ++i) {
      const std::string path = "policy.allowed_codecs[" + std::to_string(i) + "]";
      if (!a[i].is_string()) {
        return r.Error(a[i].source(), path,
                       std::string("found ") + TypeName(a[i].type()) + "; allowed: " + allowed);
      }
      auto id = ParseCodecId(a[i].as_string()->get());
      if (!id.has_value()) {
        return r.Error(a[i].source(), path,
                       "found \"" + a[i].as_string()->get() + "\"; allowed: " + allowed);
      }
      if (std::find(p.allowed_codecs.begin(), p.allowed_codecs.end(), *id) ==
          p.allowed_codecs.end()) {
        p.allowed_codecs.push_back(*id);
      }
    }
    const bool lossless = std::any_of(p.allowed_codecs.begin(), p.allowed_codecs.end(),
                                      [](CodecId id) { return !IsLossyCodec(id); });
    if (!lossless) {
      return r.Error(n->source(), "policy.allowed_codecs",
                     "no lossless codec listed, so integer and max/min tensors could not be "
                     "sent; allowed: " + std::string(allowed));
    }
  }
  return r.CheckNoUnknownKeys({"codec", "error_feedback", "min_lossy_bytes",
                               "max_relative_error", "allowed_codecs"});
}

Status ReadAllReduce(Reader& top, const std::string& file, GatewayConfig* c) {
  const toml::table* t = nullptr;
  STRAIT_RETURN_IF_ERROR(top.ReadTable("allreduce", false, &t));
  if (t == nullptr) return Status::Ok();
  Reader r(*t, "allreduce", file);
  STRAIT_RETURN_IF_ERROR(r.ReadDuration("deadline", &c->allreduce_deadline_ns));
  STRAIT_RETURN_IF_ERROR(r.ReadDuration("shutdown_grace", &c->shutdown_grace_ns));
  int64_t chunk = static_cast<int64_t>(c->chunk_elements);
  STRAIT_RETURN_IF_ERROR(
      r.ReadInt("chunk_elements", false, kMinChunkElements, kMaxChunkElements, &chunk));
  c->chunk_elements = static_cast<size_t>(chunk);
  if (const toml::node* n = r.Get("shard_weights"); n != nullptr) {
    const char* allowed =
        "a table of region = positive integer (e.g. each region's slowest link in Mbit/s) "
        "naming every region of the world";
    if (!n->is_table()) {
      return r.Error(n->source(), "allreduce.shard_weights",
                     std::string("found ") + TypeName(n->type()) + "; allowed: " + allowed);
    }
    const std::vector<std::string> world = c->WorldRegions();
    for (auto&& [key, value] : *n->as_table()) {
      const std::string region(key.str());
      const std::string path = "allreduce.shard_weights." + region;
      if (std::find(world.begin(), world.end(), region) == world.end()) {
        return r.Error(key.source(), path,
                       "not a region of this gateway's world (its own region and its peers); "
                       "allowed: " + std::string(allowed));
      }
      if (!value.is_integer() || value.as_integer()->get() <= 0) {
        return r.Error(value.source(), path,
                       std::string("found ") + TypeName(value.type()) +
                           (value.is_integer() ? " <= 0" : "") + "; allowed: " + allowed);
      }
      c->shard_weights[region] = static_cast<uint64_t>(value.as_integer()->get());
    }
    for (const std::string& region : world) {
      if (c->shard_weights.count(region) == 0) {
        return r.Error(n->source(), "allreduce.shard_weights",
                       "no weight for region " + region + "; allowed: " + allowed);
      }
    }
  }
  return r.CheckNoUnknownKeys({"deadline", "shutdown_grace", "shard_weights", "chunk_elements"});
}

// [region_links]: how the region's own gateways link ("Plain region links" in config.h).
Status ReadRegionLinks(Reader& top, const std::string& file, GatewayConfig* c) {
  const toml::table* t = nullptr;
  STRAIT_RETURN_IF_ERROR(top.ReadTable("region_links", false, &t));
  if (t == nullptr) return Status::Ok();
  Reader r(*t, "region_links", file);
  std::string transport = "tls", listen;
  STRAIT_RETURN_IF_ERROR(r.ReadString("transport", false, &transport));
  STRAIT_RETURN_IF_ERROR(r.ReadString("listen", false, &listen));
  STRAIT_RETURN_IF_ERROR(r.CheckNoUnknownKeys({"transport", "listen"}));
  if (transport != "tls" && transport != "plain") {
    return r.Error(r.Get("transport")->source(), "region_links.transport",
                   "found \"" + transport + "\"; allowed: \"tls\" (over wan.listen) or "
                   "\"plain\" (plain TCP on region_links.listen, inside a trusted LAN)");
  }
  c->region_plain = transport == "plain";
  if (c->region_plain && c->transport == net::Transport::kPlainTcp) {
    return r.Error(r.Get("transport")->source(), "region_links.transport",
                   "\"plain\" with wan.transport = \"plain\": the WAN port is plain TCP already "
                   "and admits any address, so a second listener would protect nothing; allowed: "
                   "remove [region_links] (the region's links then use wan.listen), or "
                   "wan.transport = \"tls\"");
  }
  if (c->region_plain && c->region_gateways.empty()) {
    return r.Error(r.Get("transport")->source(), "region_links.transport",
                   "\"plain\" for the links among region " + c->region +
                       "'s gateways, but [peers." + c->region +
                       "] lists none; allowed: list them there (shard_<k> = \"host:port\"), "
                       "or remove [region_links]");
  }
  if (!c->region_plain) {
    if (r.Get("listen") == nullptr) return Status::Ok();
    return r.Error(r.Get("listen")->source(), "region_links.listen",
                   "given with region_links.transport = \"tls\", whose links use wan.listen; "
                   "allowed: remove it, or set region_links.transport = \"plain\"");
  }
  if (r.Get("listen") == nullptr) {
    return r.ErrorAtTable("missing region_links.listen, required by region_links.transport = "
                          "\"plain\"; allowed: listen = \"<LAN address>:<port>\" (the address "
                          "[peers." + c->region + "] gives this gateway)");
  }
  auto hp = ParseHostPort(listen);
  if (!hp.ok()) {
    return r.Error(r.Get("listen")->source(), "region_links.listen",
                   "found \"" + listen + "\"; " + hp.status().message());
  }
  if (hp->port == c->wan_listen.port &&
      (hp->host == c->wan_listen.host || hp->IsWildcard() || c->wan_listen.IsWildcard())) {
    return r.Error(r.Get("listen")->source(), "region_links.listen",
                   "found \"" + listen + "\", the port of wan.listen (" +
                       c->wan_listen.ToString() +
                       "); allowed: another port (the two listeners speak TLS and plain TCP)");
  }
  if (c->region_self_entry && !hp->Accepts(*c->region_self_entry)) {
    return r.Error(r.Get("listen")->source(), "region_links.listen",
                   "found \"" + listen + "\", but [peers." + c->region + "] gives this gateway (shard_" +
                       std::to_string(c->shard_index) + ") \"" + c->region_self_entry->ToString() +
                       "\", where the region's other gateways dial it; allowed: the same address "
                       "in both");
  }
  c->region_listen = *hp;
  return Status::Ok();
}

Status ReadMetrics(Reader& top, const std::string& file, GatewayConfig* c) {
  const toml::table* t = nullptr;
  STRAIT_RETURN_IF_ERROR(top.ReadTable("metrics", false, &t));
  if (t == nullptr) return Status::Ok();
  Reader r(*t, "metrics", file);
  std::string listen;
  STRAIT_RETURN_IF_ERROR(r.ReadString("listen", true, &listen));
  auto hp = ParseHostPort(listen);
  if (!hp.ok()) {
    return r.Error(r.Get("listen")->source(), "metrics.listen",
                   "found \"" + listen + "\"; " + hp.status().message());
  }
  c->metrics_listen = *hp;
  return r.CheckNoUnknownKeys({"listen"});
}

}  // namespace

StatusOr<GatewayConfig> ParseConfig(std::string_view text, const std::string& file) {
  toml::table doc;
  try {
    doc = toml::parse(text, file);
  } catch (const toml::parse_error& e) {
    std::ostringstream os;
    os << file << ":" << e.source().begin.line << ":" << e.source().begin.column
       << ": TOML syntax error: " << e.description();
    return InvalidArgumentError(os.str());
  }
  GatewayConfig c;
  c.file = file;
  Reader top(doc, "", file);
  STRAIT_RETURN_IF_ERROR(ReadTopLevel(top, &c));
  STRAIT_RETURN_IF_ERROR(ReadLocal(top, file, &c));
  STRAIT_RETURN_IF_ERROR(ReadWanAndTls(top, file, &c));
  STRAIT_RETURN_IF_ERROR(ReadPeers(top, file, &c));
  STRAIT_RETURN_IF_ERROR(ReadRegionLinks(top, file, &c));
  STRAIT_RETURN_IF_ERROR(ReadLink(top, file, &c));
  STRAIT_RETURN_IF_ERROR(ReadPolicy(top, file, &c));
  STRAIT_RETURN_IF_ERROR(ReadAllReduce(top, file, &c));
  STRAIT_RETURN_IF_ERROR(ReadMetrics(top, file, &c));
  STRAIT_RETURN_IF_ERROR(top.CheckNoUnknownKeys({"region", "shard_index", "shards", "local",
                                                 "wan", "tls", "peers", "region_links", "link",
                                                 "policy", "allreduce", "metrics"}));
  return c;
}

StatusOr<GatewayConfig> LoadConfig(const std::string& file) {
  std::ifstream in(file, std::ios::binary);
  if (!in) {
    const int err = errno;
    std::string why = std::strerror(err);
    if (err == EACCES) return PermissionDeniedError("cannot read config " + file + ": " + why);
    return NotFoundError("cannot read config " + file + ": " + why);
  }
  // A directory "opens" and reads as empty, and /dev/zero never ends: only a regular file of a
  // config's size is read (a real one is a few KiB).
  struct stat st {};
  if (::stat(file.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) {
    return InvalidArgumentError("cannot read config " + file +
                                ": not a regular file; give the path of the TOML file");
  }
  if (st.st_size > kMaxConfigFileBytes) {
    return InvalidArgumentError("config " + file + " is " + std::to_string(st.st_size) +
                                " bytes, more than a config's limit of " +
                                std::to_string(kMaxConfigFileBytes) + "; is it the right file?");
  }
  std::ostringstream ss;
  ss << in.rdbuf();
  return ParseConfig(ss.str(), file);
}

}  // namespace strait::gateway

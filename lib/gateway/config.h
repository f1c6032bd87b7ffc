// The straitd configuration file: one TOML file per gateway, loaded and validated in one pass.
//
//   region = "us-east"            # this gateway's region (matches its certificate under TLS)
//   shard_index = 0               # which gateway of the region this is; peers use the same index
//   # shards = [0, 1, 2, 3]       # instead of shard_index: one gateway for several shards
//                                 # (or "0-3"); see "Multi-shard gateways" below
//   [local]                       # the Unix-domain socket the ranks on this node talk to
//   socket = "/run/strait/straitd.sock"
//   allowed_uids = [1000]         # peer credentials (SO_PEERCRED) accepted: uid OR gid listed
//   allowed_gids = [1000]
//   [wan]
//   listen = "0.0.0.0:7400"       # numeric address:port ("[::]:7400" for IPv6)
//   transport = "tls"             # or "plain" (no encryption: trusted test networks only)
//   dial = "any"                  # or "outbound-only": this region is behind NAT (see below)
//   [tls]                         # required with transport = "tls", refused with "plain"
//   ca = "ca.pem"                 # relative paths are relative to the config file
//   cert = "gw.pem"
//   key = "gw.key"
//   [peers.eu-west]               # region -> its gateways' WAN addresses by shard index
//   shard_0 = "10.1.0.7:7400"
//   [peers.on-prem]               # a region behind NAT: it dials this gateway, so its
//   dial = "outbound-only"        # addresses may be omitted (see "Dial-only regions" below)
//   [peers.us-east]               # optional: this region's own gateways (LAN addresses), for
//   shard_0 = "10.0.0.7:7400"     # region all-reduces (see below); this gateway's own entry
//   shard_1 = "10.0.0.8:7400"     # may be listed and is not used
//   [region_links]                # optional, with [peers.<own region>]: the region's links
//   transport = "plain"           # "tls" (default: over wan.listen, [tls]) or "plain" (below)
//   listen = "10.0.0.7:7401"      # with "plain": the LAN address [peers.<own region>] names
//   [link]                        # optional; see net::LinkOptions
//   streams = 1
//   congestion_control = "bbr"
//   max_rate = "500mbit"          # pacing: this gateway's share of the WAN path to each peer;
//                                 # [peers.<region>] max_rate sets one peer's (see below)
//   handshake_timeout = "5s"
//   unreachable_after = "30s"
//   stream_timeout = "10s"
//   tcp_rto_max = "1s"            # TCP's retransmission backoff cap: resume soon after outages
//   [policy]                      # job compression: defaults and the operator's limits
//   codec = "auto"                # the default for jobs: auto, auto:int8, none, zstd, int8, ...
//                                 # (any job policy string; see policy.h)
//   error_feedback = true
//   min_lossy_bytes = "64KiB"     # smaller tensors are never sent lossy
//   max_relative_error = 0.01     # lossy codecs whose worst-case error exceeds this are refused
//   allowed_codecs = ["none", "zstd", "int8", "fp8"]
//   [metrics]                     # optional; off when absent
//   listen = "127.0.0.1:9464"     # HTTP: GET /metrics (Prometheus), /healthz, /readyz
//   [allreduce]
//   deadline = "60s"
//   shutdown_grace = "30s"        # SIGTERM: how long in-flight all-reduces may still run
//   shard_weights = { us-east = 100, eu-west = 50, ap-south = 50 }   # optional, see below
//   chunk_elements = 262144       # pipelined chunk size; the same in every region (plan.h);
//                                 # unset: 65536 for lossy ops of 2^22+ elements, else 262144
//
// Dial-only regions. Links between regions are dialled by one side and accepted by the other:
// by default the region of lower rank (WorldRegions() order) dials. A region behind NAT or a
// firewall that admits no inbound connection sets wan.dial = "outbound-only" in its gateways'
// configs, and every other region marks it with peers.<region>.dial = "outbound-only": the
// dial-only region then dials all its links (to lower and higher ranks), the others only accept
// them, with the same mutual-TLS identity checks, and after a restart or an ended link it is
// again the dial-only side that dials a new one. Two dial-only regions cannot reach each other,
// so a config that is dial-only itself and marks a peer dial-only is refused. Both sides must
// agree: a region marked dial-only that does not dial (or one that dials unmarked) leaves the
// pair without a link (the all-reduce names the region it cannot reach). Links among one
// region's own gateways are not affected.
//
// Multi-shard gateways. A node with several ranks runs one straitd for all of them: `shards`
// lists the shard indices it serves (each rank names its shard when it connects: libstrait's
// rank r within its region is shard r). The process runs each shard as before -- the mesh with
// that shard of every other region, its jobs, generations and policies -- behind one local
// socket, one WAN port and one endpoint, and shards whose peer addresses are the same
// (peers.<region>.shard_<k>) share one link to that peer gateway, each on its own block of link
// channels (collective/channels.h). Peers may run one process per shard or any grouping. Each
// served shard needs its address in every peer region that is not dial-only. Region all-reduces
// ([peers.<own region>]) need one process per shard and are refused with `shards`. Two straitd
// processes on one node serving the same shard (with sockets in the same directory) are refused
// when the second starts or checks its config: each shard holds a lock file beside the socket.
//
// Plain region links. A region all-reduce moves twice each tensor between the region's own
// gateways (reduce-scatter, all-gather), inside the datacenter, where NCCL's own traffic is not
// encrypted either; TLS there costs CPU the WAN transfers need (CollNet, 3 regions x 2 gateways
// on two cores: a median 1475 ms per 64 MiB with plain region links against 1713 ms with TLS,
// bench/README.md "2026-12-07 (later)"). [region_links] transport = "plain"
// moves those links to plain TCP on region_links.listen, a second listener that admits only the
// addresses listed in [peers.<own region>] (which then name each gateway's region_links.listen) and
// hellos naming this region; the WAN links stay on wan.listen with TLS. Nothing on it is
// encrypted or authenticated beyond the source address: bind it to the LAN, never the internet.
// Every gateway of a region must use the same transport for it.
//
// Every problem is reported as ONE error naming the file, the line and column, the key path
// (e.g. `peers.eu-west.shard_1`), what was found and what is allowed. Unknown keys are errors,
// so that a typo never silently falls back to a default.
#ifndef STRAIT_LIB_GATEWAY_CONFIG_H_
#define STRAIT_LIB_GATEWAY_CONFIG_H_

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "collective/plan.h"
#include "net/link.h"
#include "strait/codec.h"
#include "strait/status.h"

namespace strait::gateway {

// A numeric host and a port, as written in the config ("10.0.0.7:7400", "[::1]:7400").
struct HostPort {
  std::string host;
  uint16_t port = 0;
  std::string ToString() const;
  // Whether this names every address of the host ("0.0.0.0", "::"), as a listen address may.
  bool IsWildcard() const { return host == "0.0.0.0" || host == "::"; }
  // Whether a peer dialling `dialled` reaches a listener bound here: the same port, and the same
  // host unless this one is a wildcard.
  bool Accepts(const HostPort& dialled) const {
    return port == dialled.port && (IsWildcard() || host == dialled.host);
  }
};
// Parses "host:port" / "[v6]:port" with a numeric host; the error says what is accepted.
StatusOr<HostPort> ParseHostPort(std::string_view text);

// The job-policy part of the config: what jobs get by default and what they may ask for.
struct PolicyLimits {
  std::string default_codec = "auto";  // a job policy string: auto, auto:int8, zstd:3, int8,ef...
  bool default_error_feedback = true;
  uint64_t min_lossy_bytes = 64 * 1024;
  double max_relative_error = 0.1;
  // Codecs jobs may use; always holds at least one lossless codec.
  std::vector<CodecId> allowed_codecs = {CodecId::kNone, CodecId::kZstd, CodecId::kInt8,
                                         CodecId::kInt4, CodecId::kFp8E4M3};
};

// link.streams' default: one stream per peer link, grown while goodput grows. An all-reduce
// loads each region pair with one link per gateway group; four BBR streams on each dropped
// 26-33k packets per run into a one-BDP buffer and left the links 79-81% busy, where one
// stream each dropped 10-24k and kept them 83-86% busy (3 regions x 2 ranks, 64 MiB at 100
// Mbit/s: int8 1.11 s against 1.22, zstd 3.81 against 3.96; unequal links: 1.28 s against 1.63).
inline constexpr int kDefaultLinkStreams = 1;

// allreduce.chunk_elements' range: below 2^12 elements per-frame costs dominate; above 2^24
// (64 MiB of fp32) a tensor is one chunk and nothing pipelines.
inline constexpr int64_t kMinChunkElements = int64_t{1} << 12;
inline constexpr int64_t kMaxChunkElements = int64_t{1} << 24;

// The highest shard index a config may name.
inline constexpr int kMaxConfigShard = 4095;
// LoadConfig reads no more than this: a config is a few KiB, so a larger file is the wrong one
// (a log, a device), and reading it whole would only exhaust memory.
inline constexpr int64_t kMaxConfigFileBytes = int64_t{1} << 20;

struct GatewayConfig {
  std::string file;  // where it was loaded from (for messages)
  std::string region;
  // The shards this gateway serves, ascending (`shards`, or {shard_index}); shard_index is the
  // first. A single-shard config (and each shard's own config, ForShard) has exactly one.
  int shard_index = 0;
  std::vector<int> shards = {0};

  std::string local_socket;
  std::vector<uint32_t> allowed_uids;
  std::vector<uint32_t> allowed_gids;

  HostPort wan_listen;
  net::Transport transport = net::Transport::kTls;
  // wan.dial = "outbound-only": this region admits no inbound connection from other regions
  // (NAT), so this gateway dials every peer region ("Dial-only regions" above).
  bool dial_only = false;
  std::string tls_ca, tls_cert, tls_key;  // absolute or relative to the working directory

  // region -> (shard index -> address). Never contains this gateway's own region.
  // A dial-only peer region may have no address (its map is then empty): it is never dialled.
  std::map<std::string, std::map<int, HostPort>> peers;
  // Peer regions marked peers.<region>.dial = "outbound-only": they dial this gateway.
  std::set<std::string> dial_only_peers;
  // [peers.<own region>]: the other gateways of this region (shard index -> address), for region
  // all-reduces (the hierarchical all-reduce of gateway/gateway.h: intra-region reduce-scatter,
  // cross-region all-reduce of each gateway's shard, intra-region all-gather). With it, the
  // region's gateways are shard_0..shard_<m-1>, all listed but this one, and no other region
  // lists a shard index >= m (every region runs the same number of gateways). Empty: m = 1.
  // Links to them follow wan.transport and [tls] like any peer's (their certificates name this
  // region) unless [region_links] says "plain"; each gateway dials every other one of its region.
  std::map<int, HostPort> region_gateways;
  // region_links.transport = "plain": the links among the region's gateways are plain TCP,
  // accepted on region_listen (set exactly then) and dialled at region_gateways' addresses.
  bool region_plain = false;
  std::optional<HostPort> region_listen;
  // This gateway's own entry in [peers.<own region>] when listed (a [peers] section shared by
  // every config): never dialled, but with plain region links it must name region_listen.
  std::optional<HostPort> region_self_entry;

  // Links start at kDefaultLinkStreams streams (link.streams) and adapt from there.
  net::LinkOptions link = [] {
    net::LinkOptions o;
    o.streams = kDefaultLinkStreams;
    return o;
  }();
  PolicyLimits policy;
  int64_t allreduce_deadline_ns = int64_t{60'000'000'000};
  int64_t shutdown_grace_ns = int64_t{30'000'000'000};
  // allreduce.shard_weights: region -> positive integer, naming every region of the world or
  // none. Empty (the default): equal shards. Otherwise each region owns a share of every tensor
  // proportional to its weight (collective::PlanOptions::weights). The owner of a shard sends and
  // receives that shard over each of its links, so a good weight is the rate of the region's
  // slowest link (e.g. in Mbit/s). Every region's gateways must be given the SAME weights: the
  // ranks compute the split independently, and differing splits fail the all-reduce.
  std::map<std::string, uint64_t> shard_weights;
  // allreduce.chunk_elements: elements per pipelined chunk of a cross-region all-reduce
  // (collective::kDefaultChunkElements says how to choose). 0 (unset): by the op's size and
  // codec (collective::ChunkElementsFor). Every gateway of every region must use the same: the
  // op identity names it, so regions that differ fail each step with an error saying so instead
  // of cutting the tensor differently.
  size_t chunk_elements = 0;
  // metrics.listen: where the operational HTTP server (/metrics, /healthz, /readyz; see
  // gateway/http.h) listens. Off (no server) when absent.
  std::optional<HostPort> metrics_listen;

  // The gateways this one runs all-reduces with: every region (this one included) in sorted
  // order, the rank of a region being its index. Every region has an address for shard_index.
  std::vector<std::string> WorldRegions() const;
  // Whether this gateway dials the link to peer region `peer` (else it waits for the peer to
  // dial it): the dial-only side of a pair dials, otherwise the region of lower rank does.
  bool Dials(const std::string& peer) const;
  // m, the number of gateways of this region that run region all-reduces together:
  // region_gateways plus this one (1 when none are listed).
  int RegionSize() const;
  // allreduce.shard_weights in WorldRegions() order; empty when none are configured.
  std::vector<uint64_t> ShardWeights() const;
  // One line for logs and --check-config: region, shard, world, transport, socket, policy.
  std::string Summary() const;
  // This config as the gateway of shard `k` alone (one of `shards`): what each shard of a
  // multi-shard gateway runs with.
  GatewayConfig ForShard(int k) const;
};

// "3", "0-3" or "0, 2, 5": a sorted shard list as configs and messages write it.
std::string ShardListText(const std::vector<int>& shards);

// Parses and validates `text` as if read from `file` (relative TLS paths resolve against the
// file's directory). Errors are kInvalidArgument, formatted
//   "<file>:<line>:<col>: <key path>: <problem>; <what is allowed>".
StatusOr<GatewayConfig> ParseConfig(std::string_view text, const std::string& file);
// Reads `file` and parses it; kNotFound / kPermissionDenied naming the file if it cannot be read.
StatusOr<GatewayConfig> LoadConfig(const std::string& file);

// Every key ParseConfig accepts, dotted ("link.streams"), with the names an operator chooses
// as placeholders: "peers.<region>.shard_<index>", "allreduce.shard_weights.<region>". The
// parser's unknown-key checks are held to this list, and deploy/CONFIG.md documents exactly
// these keys (tests/deploy/config_reference_test.cc). Thread-safe; does not block.
std::vector<std::string> KnownConfigKeys();

}  // namespace strait::gateway

#endif  // STRAIT_LIB_GATEWAY_CONFIG_H_

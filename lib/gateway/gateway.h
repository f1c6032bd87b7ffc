// The gateway: what straitd runs. It joins the WAN mesh of the gateways that hold the same shard
// index in every region, serves the ranks of its node over the local Unix socket, and runs each
// client all-reduce as collective::AllReduce over NetTransport among those gateways. A gateway
// may serve several shards ("Multi-shard gateways" in config.h): each runs as described below,
// behind one socket, port and endpoint, with links shared per peer address (gateway_impl.h,
// Gateway::Host).
//
// Ranks: every region of the config's world (this one and its peers), sorted by name; a
// region's rank is its index, so every gateway derives the same numbering from its own config.
// Each gateway dials the peers ranked above it and accepts the others.
//
// Operations (see "Operation identity" in localproto/protocol.h and generation.h): every comm joins
// its job once when it is created (kJoinJob); the gateways of every region agree on the job's
// next generation g before any of them answers. The comm numbers its all-reduces 0, 1, 2, ...
// within g and sends (g, sequence) with each; the collective op id hashes (job, g, sequence,
// tensor key, dtype, op, count, ...), so contributions of different steps or comms never meet,
// by construction. When an operation starts its gateway announces its identity to the peers; a
// peer whose step at the same (g, sequence) has another identity fails with kFailedPrecondition
// naming both.
// Failures are symmetric:
//   - An all-reduce that fails on one gateway (deadline, lost peer, corrupt frame) aborts on all:
//     its abort (collective::NetTransport kind 1) ends the others' waits at once with kAborted
//     naming that region and its reason; a peer that had not started that step yet fails it at
//     once when it does (the transport remembers aborted op ids).
//   - A successful all-reduce answers its rank only after every gateway confirmed it holds the
//     whole result (Commit): a gateway killed mid-step makes every region fail that step. Each
//     confirmation is relayed by the regions that received it, so that one region pair's link
//     cut while the step commits does not make only those two fail it (commit.cc).
//   - A gateway that hears a newer generation of a job (some region's ranks created a new comm,
//     after a failure or a gateway restart) aborts its operations of older generations at once
//     and refuses later requests of them, so every rank fails and recreates its comm, and the new
//     comms start every region at sequence 0 of the same generation.
//   - A restarted gateway remembers no generation; it proposes the survivors' next one (their
//     agreed generation + 1), and its peers' messages from its previous life are dropped.
//   Links after a restart: the restarted gateway dials the peers ranked above it afresh. The
//   peers ranked below it redial with their old link session, which the restarted process does
//   not know: it answers so (net wire: hello flag kUnknownSession), their old links end, and
//   every gateway dials a new link in place of an ended one it had dialed (checked twice a
//   second), so any region's gateway recovers from a restart by itself.
//
// Policy: each gateway clamps a job's request to its own [policy] limits; before the job's first
// all-reduce the gateways of the shard exchange their resolved policies for it (a versioned
// control message on link channel kPolicyChannel; see policy.h) and each takes the same merge,
// the most conservative one, so every region runs the job with one effective policy whatever
// their [policy] sections or the job's requests say. Regions with no lossless codec in common
// fail the job's all-reduces with one kFailedPrecondition naming both sides; a region that never
// registers the job makes the others' all-reduces fail at their deadline naming it. `auto`
// chooses per tensor and per link from the link's goodput estimate and the codec speeds measured
// when the gateway started (lossless per link; one lossy frame for all only with "auto:<lossy>";
// the rule is in policy.h). Receivers accept a frame in any codec the agreed policy allows and
// refuse others with a codec-mismatch error, never a wrong sum.
//
// Shard weights: with allreduce.shard_weights in the config, those (the operator's choice; every
// region should configure the same). Otherwise, when every region's gateway measures (its
// policy offer says so: no shard_weights configured, and a version that exchanges rates), the
// split follows the measured link rates: each gateway sends its links' egress goodput for a
// job's weights round (a rates message on kRatesChannel), and every gateway computes
// collective::BalancedShardWeights of the same matrix, the split that minimises the busiest
// link's time. Round = operation sequence / kWeightsRoundOps (16) within the job's generation, so the weights are re-agreed every 16 operations of a tensor key; the next round's
// rates go out mid-round, so only a job's first round per generation waits for a round trip. A
// round keeps the previous round's weights unless some rate moved by more than 25%. Unknown
// rates (a link with less than 1 MiB carried) and near-equal links give equal shards. Measured
// weights are hashed into the operation id: gateways that computed different splits (which the
// rule prevents, short of a bug or a gateway that skipped a round after a failure) never meet,
// so the operation fails by its deadline instead of summing mismatched shards. The all-reduce
// reply names the split ("shards=a,b,c"). Details in policy.h ("Shard weights").
//
// Jobs and isolation: a job belongs to the uid (SO_PEERCRED) of the client that first registered
// it on this gateway; only clients of that uid may register it again (replacing its policy) or
// all-reduce under it. Anyone else gets kPermissionDenied naming the owner, and the gateway goes
// on serving. Root is no exception, so one user's jobs never see another's data. Everything a job
// keeps is keyed by its id: op ids hash (job, tensor key, number), so two jobs using the same
// tensor key never exchange messages, and error-feedback residuals live under (job, tensor key).
// The stats request reports gateway-wide counters only (no job data) and is open to every
// allowed client. Ownership is per gateway: each region's gateway checks its own clients.
//
// Sharing links: the link cuts chunks round-robin over channels (net::SendBook), and every job
// has a lane, one of collective::kCollectiveChannelCount link channels, carried in its op ids
// (JobLane), so a job's 1 GiB all-reduce delays another job's small one by a few chunks, not by
// its whole transfer. Two jobs on the same lane (a hash collision) share a channel: still correct,
// only FIFO between them.
//
// Region all-reduce (kRegionAllReduce; the NCCL plugin's CollNet mode): a region runs m gateways
// (config [peers.<own region>]: shard_0..shard_<m-1>), each serving one node head that holds the
// whole tensor. The gateways of the region reduce-scatter it over the LAN, each all-reduces its
// shard across the regions with the shard's gateways of the other regions (the job's codec, as a
// plain all-reduce), and they all-gather the result: every node head of every region gets the
// same bytes (collective/hierarchical.h has the algorithm and numerics). Each gateway dials every
// other gateway of its region (same wan.transport and TLS identity as for peer regions; their
// certificates name this region) and sends over the link it dialed; the region's operations are
// identified by the node heads' (generation, sequence) like the cross-region ones, and the
// cross-region op id of a region all-reduce also hashes m, so regions that run different numbers of gateways fail by the deadline rather than pairing
// different shards. With m = 1 it is the plain all-reduce. Every region must run as many
// gateways; every node head issues the same region all-reduces in the same order.
//
// Local clients: the socket file gets mode 0660 and each connection's peer credentials
// (SO_PEERCRED) must match local.allowed_uids or local.allowed_gids. A malformed or refused
// request gets an error reply; the connection survives unless its framing is broken.
//
// Tunnels: ranks also open cross-region point-to-point tunnels through the gateway (the NCCL
// plugin's cross-region connections); see "Tunnels" in localproto/protocol.h and tunnel.h. They
// travel on link channels 1024..1279 (collective::kTunnelChannels) to the gateway of the same
// shard index in the other region.
//
// Threads: one accept thread, one thread per client connection (plus a writer thread per open
// tunnel and one tunnel supervisor); the WAN side runs on the endpoint's I/O thread. Public
// methods are thread-safe.
#ifndef STRAIT_LIB_GATEWAY_GATEWAY_H_
#define STRAIT_LIB_GATEWAY_GATEWAY_H_

#include <memory>
#include <string>

#include "common/clock.h"
#include "gateway/config.h"
#include "strait/status.h"

namespace strait::gateway {

class Gateway {
 public:
  // Creates the endpoint (TLS identity), listens on wan.listen, dials the higher-ranked peers,
  // and serves the local socket (replacing a stale socket file). Does not wait for peers.
  // Errors name the config key or file at fault.
  static StatusOr<std::unique_ptr<Gateway>> Start(const GatewayConfig& config);

  // Stops accepting local connections and new requests, lets in-flight all-reduces finish until
  // `grace` expires, then closes the WAN links and joins every thread. Blocks; idempotent.
  void Shutdown(Deadline grace);

  // Shutdown(after the config's shutdown_grace) if not done yet.
  ~Gateway();
  Gateway(const Gateway&) = delete;
  Gateway& operator=(const Gateway&) = delete;

  // The WAN port actually listened on (useful with port 0 in tests).
  uint16_t wan_port() const;
  // Certificate rotation (straitd on SIGHUP): re-reads tls.ca, tls.cert and tls.key for new
  // WAN handshakes; links up keep their streams. On error the old identity stays in use.
  // kFailedPrecondition with wan.transport = "plain". Thread-safe; blocks on reading files.
  Status ReloadIdentity();
  // Counters as text, one "name value" per line (what the stats request returns).
  std::string StatsText() const;

  struct Impl;  // one shard's gateway
  struct Host;  // what a multi-shard gateway's shards share (gateway_impl.h)

 private:
  explicit Gateway(std::unique_ptr<Host> host);
  // Start's work; what the system refuses (descriptors, threads) comes out as std::system_error
  // from Asio and std::thread, which Start turns into a Status.
  static StatusOr<std::unique_ptr<Gateway>> StartOrThrow(const GatewayConfig& config);
  std::unique_ptr<Host> host_;
};

// The link lane of `job`: a stable hash of its id, in [0, collective::kCollectiveChannelCount).
uint32_t JobLane(const std::string& job);

// The collective op id for the `sequence`-th all-reduce of (job, tensor key): equal on every
// gateway, 38 bits (the part of a tag the transport keeps); op id mod kCollectiveChannelCount is
// JobLane(job), which NetTransport turns into the link channel.
uint64_t OperationId(const std::string& job, const std::string& tensor_key, uint64_t sequence);

}  // namespace strait::gateway

#endif  // STRAIT_LIB_GATEWAY_GATEWAY_H_

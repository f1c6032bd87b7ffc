// The gateway: what straitd runs. It joins the WAN mesh of the gateways that hold the same shard
// index in every region, serves the ranks of its node over the local Unix socket, and runs each
// client all-reduce as collective::AllReduce over NetTransport among those gateways.
//
// Ranks: every region of the config's world (this one and its peers), sorted by name; a
// region's rank is its index, so every gateway derives the same numbering from its own config.
// Each gateway dials the peers ranked above it and accepts the others.
//
// Operations: the ranks of every region issue their all-reduces of a (job, tensor key) in the
// same order; the gateway numbers them per key (0, 1, 2, ...) and derives the collective op id
// from (job, tensor key, number), so the same operation meets on every gateway without any
// coordination message. The codec comes from the job's policy, clamped to this gateway's limits
// (gateways of one cluster should share their [policy] section; a mismatch fails the operation
// with a codec-mismatch error rather than a wrong sum).
//
// Local clients: the socket file gets mode 0660 and each connection's peer credentials
// (SO_PEERCRED) must match local.allowed_uids or local.allowed_gids. A malformed or refused
// request gets an error reply; the connection survives unless its framing is broken.
//
// Threads: one accept thread, one thread per client connection; the WAN side runs on the
// endpoint's I/O thread. Public methods are thread-safe.
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
  // Counters as text, one "name value" per line (what the stats request returns).
  std::string StatsText() const;

  struct Impl;

 private:
  explicit Gateway(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// The collective op id for the `sequence`-th all-reduce of (job, tensor key): equal on every
// gateway, 38 bits (the part of a tag the transport keeps).
uint64_t OperationId(const std::string& job, const std::string& tensor_key, uint64_t sequence);

}  // namespace strait::gateway

#endif  // STRAIT_LIB_GATEWAY_GATEWAY_H_

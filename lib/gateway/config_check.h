// The half of `straitd --check-config` that the config's text alone cannot tell: whether the
// files and kernel features it names are there and fit together, checked exactly as
// Gateway::Start will use them, so that a config which passes the check also starts.
//
//   std::vector<std::string> warnings;
//   if (Status s = CheckConfigEnvironment(config, &warnings); !s.ok()) { ... exit 2 ... }
//   for (const std::string& w : warnings) { ... log it ... }
//
// Errors (kInvalidArgument) and warnings read "<file>: <key>: <what is wrong>; fix: <what to
// do>", naming the config key (`tls.ca`, `tls.cert`, `tls.key`, `link.congestion_control`).
#ifndef STRAIT_LIB_GATEWAY_CONFIG_CHECK_H_
#define STRAIT_LIB_GATEWAY_CONFIG_CHECK_H_

#include <string>
#include <vector>

#include "gateway/config.h"
#include "net/link.h"
#include "strait/status.h"

namespace strait::gateway {

// The options of the gateway's WAN endpoint (what Gateway::Start creates it with).
net::EndpointOptions EndpointOptionsOf(const GatewayConfig& config);

// The configs of one deployment together (`straitd --check-config a.toml b.toml ...`), each
// already valid alone: kInvalidArgument naming the file, the key and the fix when a shard of a
// region is served by two configs, both regions of a pair are dial-only, a dial-only region
// is not marked by a peer (or a marked one does not dial), or shard weights differ. config_set.cc.
Status CheckConfigSet(const std::vector<GatewayConfig>& configs);

// Checks, under TLS: the CA, certificate and key files load, the key is the certificate's, the
// certificate names `region`; always: the kernel offers link.congestion_control. Appends to
// `warnings` what does not stop a start but should be fixed: a private key that others may read
// or write (group read is allowed: 0640 root:strait is the documented setup). Thread-safe;
// reads files, does not touch the network.
Status CheckConfigEnvironment(const GatewayConfig& config, std::vector<std::string>* warnings);

// kFailedPrecondition when another straitd on this node already serves one of config.shards
// (it holds that shard's lock file beside local.socket; see "Multi-shard gateways" in
// config.h), naming the shard, its pid and the fix. Takes and releases the locks; host.cc.
Status CheckShardLocks(const GatewayConfig& config);

}  // namespace strait::gateway

#endif  // STRAIT_LIB_GATEWAY_CONFIG_CHECK_H_

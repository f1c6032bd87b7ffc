// The plugin's configuration, read from STRAIT_* environment variables when NCCL calls init.
//
// Every variable is optional; a set variable must be valid. A bad value is an InvalidArgument
// Status whose message names the variable, shows what was found and says what is allowed; the
// plugin WARNs it through NCCL's logger and fails init so that NCCL falls back to its own
// transports (never a silent default, never a crash).
//
//   STRAIT_REGION        this rank's region name (1-63 of letters, digits, '-', '_', '.')
//   STRAIT_REGION_MAP    "10.1.0.0/16=us-east,10.2.0.7=eu-west,fd00::/8=ap-south": used when
//                        STRAIT_REGION is unset, looked up with the rank's own address
//   STRAIT_GATEWAY       the local straitd's Unix socket (absolute path): cross-region
//                        connections go through its tunnels
//   STRAIT_WAN_LATENCY_US  the latency (us) getProperties reports: 0-10000000 (default 0
//                        without STRAIT_GATEWAY, else 10000)
//   STRAIT_WAN_SPEED_MBPS  the speed (Mbit/s) getProperties reports: 1-10000000 (default: the
//                        interface's speed)
//   STRAIT_JOB_ID        the job's name at the gateway (1-64 of letters, digits, '-', '_', '.')
//   STRAIT_COMPRESSION   the job's cross-region policy in the gateway's grammar
//                        (localproto/policy_grammar.h): auto, none, zstd, zstd:3, int8, int8,ef,
//                        auto:int8, ...; kept as its canonical text
//   STRAIT_SOCKET_IFNAME interfaces to use, NCCL_SOCKET_IFNAME syntax: comma-separated prefixes,
//                        "^" to exclude, "=" for exact names (default: first up non-loopback
//                        IPv4 interface, else loopback)
//   STRAIT_NSOCKS        TCP sockets per connection, 1-16 (default 4)
//   STRAIT_CONNECT_TIMEOUT  how long connect() keeps saying "call again" before it gives up on a
//                        listener that does not answer: a duration such as "60s" or "500ms",
//                        from 1ms to 1h (default 60s)
//
// Thread-safe (pure functions over the getter's answers).
#ifndef STRAIT_PLUGINS_NCCL_CONFIG_H_
#define STRAIT_PLUGINS_NCCL_CONFIG_H_

#include <netinet/in.h>
#include <sys/socket.h>

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "strait/status.h"

namespace strait::nccl {

// One entry of STRAIT_REGION_MAP: an address prefix and the region it belongs to.
struct RegionRule {
  int family = AF_INET;  // AF_INET or AF_INET6
  unsigned char addr[16] = {};
  int prefix_len = 32;
  std::string region;
};

struct PluginConfig {
  std::string region;  // empty: not set (see RegionFor)
  std::vector<RegionRule> region_map;
  std::string gateway;
  std::string job_id;
  std::string compression = "auto";
  std::string socket_ifname;  // empty: default choice
  int nsocks = 4;
  int64_t connect_timeout_ns = int64_t{60} * 1000 * 1000 * 1000;
  std::optional<double> wan_latency_us;  // unset: the default (see above)
  std::optional<int> wan_speed_mbps;     // unset: the interface's speed
  bool local_shm = true;  // STRAIT_LOCAL_SHM: CollNet's tensors to straitd through shared memory
};

// What getProperties reports for latency when STRAIT_WAN_LATENCY_US is unset and STRAIT_GATEWAY is
// set: a one-way latency typical of regions on one continent.
constexpr double kDefaultWanLatencyUs = 10000;

// Returns the value of an environment variable, or nullopt when it is unset.
using EnvGetter = std::function<std::optional<std::string>(const char* name)>;
EnvGetter ProcessEnv();

// Parses and validates every STRAIT_* variable above.
StatusOr<PluginConfig> ParseConfig(const EnvGetter& env);

// Parses a STRAIT_REGION_MAP value (exposed for tests).
StatusOr<std::vector<RegionRule>> ParseRegionMap(std::string_view text);
bool ValidRegionName(std::string_view name);

// The region of `addr` under `map` (longest prefix wins), or nullopt.
std::optional<std::string> LookupRegion(const std::vector<RegionRule>& map,
                                        const sockaddr_storage& addr);

// The interface the plugin listens on.
struct Interface {
  std::string name;
  sockaddr_storage addr = {};  // port 0
  int speed_mbps = 0;          // from /sys/class/net/<name>/speed; 0 if unknown
};

// Picks the interface by STRAIT_SOCKET_IFNAME's rules (`spec` empty: the default choice). An
// error lists the interfaces that exist.
StatusOr<Interface> SelectInterface(const std::string& spec);

// "10.1.2.3" / "fd00::1" (no port).
std::string AddressToString(const sockaddr_storage& addr);

}  // namespace strait::nccl

#endif  // STRAIT_PLUGINS_NCCL_CONFIG_H_

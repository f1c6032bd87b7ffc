// A test cluster of real straitd processes over strait-wanem, for integration tests of the
// gateway: `regions` network namespaces joined by emulated WAN links, and in region r one straitd
// per rank index i (shard_index = i), so that the daemons of one index form one cross-region mesh
// (the layout `strait-bench allreduce` uses). Clients in the test process talk to any daemon
// through its Unix socket (a path: reachable from every namespace).
//
// Usage:
//   WanClusterOptions o;
//   o.straitd = STRAITD_PATH;
//   auto cluster = WanCluster::Start(o);        // needs root: check wanem::CheckPrivileges()
//   auto client = Client::Connect((*cluster)->Socket(r, i), Deadline::AfterSeconds(10));
// The destructor kills every daemon, stops the emulator (removing its namespaces) and deletes
// the working directory. Not thread-safe; Start blocks until every daemon said it is ready.
#ifndef STRAIT_TESTS_GATEWAY_WAN_CLUSTER_H_
#define STRAIT_TESTS_GATEWAY_WAN_CLUSTER_H_

#include <sys/types.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "bench/wanem/emulator.h"
#include "common/clock.h"
#include "strait/status.h"
#include "tests/net/test_certs.h"

namespace strait::gateway::testing {

struct WanClusterOptions {
  std::string straitd;          // the straitd binary
  std::string name = "gwtest";  // the emulator instance (1-16 of [a-z0-9_]); unique per test
  int regions = 3;
  int ranks_per_region = 2;
  // strait-wanem link spec for every directed pair, then "SELECTOR=SPEC" overrides (see
  // bench/wanem/config.h), e.g. {"0>1=rate=200mbit", "0>2=rate=200mbit"}.
  std::string link = "100mbit,5ms";
  std::vector<std::string> pair_overrides;
  bool tls = true;  // mutual TLS with a throwaway CA, as in production; else plain TCP
  // allowed_uids of every daemon (the test's own uid is always added).
  std::vector<uint32_t> allowed_uids;
  // allreduce.shard_weights per region (empty: none, equal shards).
  std::vector<uint64_t> shard_weights;
  // The [policy] section's body (without the header).
  std::string policy =
      "allowed_codecs = [\"none\", \"zstd\", \"int8\", \"int4\", \"fp8\"]\n"
      "max_relative_error = 1.0\nmin_lossy_bytes = \"0B\"\n";
  std::string allreduce_deadline = "20s";
  // link.stream_timeout and link.unreachable_after: how soon a cut link ends for good.
  std::string stream_timeout = "10s";
  std::string unreachable_after = "10s";
  // Every daemon lists every daemon of every region, its own region's too (what CollNet's region
  // all-reduce needs: straitds of one region reduce-scatter among themselves); else each lists
  // only the daemons of its own index in the other regions.
  bool full_mesh = false;
  // Regions configured dial-only (behind NAT): wan.dial = "outbound-only" in their daemons'
  // configs, and in everyone else's peers.<region>.dial = "outbound-only" with no address (nobody
  // dials them). The NAT itself is a pair override, e.g. "*>2=syn=drop".
  std::vector<int> dial_only_regions;
  // Shards each straitd serves (config `shards`): 1 is one straitd per rank index; k > 1 (a
  // divisor of ranks_per_region) runs ranks_per_region / k straitds per region, gateway g
  // serving shards g*k .. g*k+k-1 behind one socket. Methods taking `index` take a rank index
  // and act on the straitd serving it.
  int shards_per_gateway = 1;
};

// The failure-path tests' cluster: `regions` regions of one straitd (`straitd`) each, 100 Mbit/s
// and 10 ms one way, TLS, an all-reduce deadline of `deadline_seconds`; `tag` (a few letters)
// and the pid name the emulator instance.
WanClusterOptions OneGatewayPerRegion(const std::string& straitd, const std::string& tag,
                                      int regions, int64_t deadline_seconds);

class WanCluster {
 public:
  static StatusOr<std::unique_ptr<WanCluster>> Start(WanClusterOptions options);
  ~WanCluster();
  WanCluster(const WanCluster&) = delete;
  WanCluster& operator=(const WanCluster&) = delete;

  const WanClusterOptions& options() const { return options_; }
  // The working directory (mode 0755 so that other uids can reach the sockets).
  const std::string& dir() const { return dir_; }
  static std::string RegionName(int region) { return "r" + std::to_string(region); }
  std::string Socket(int region, int index) const;
  std::string ConfigFile(int region, int index) const;
  // The daemon's stdout + stderr so far (for failure messages).
  std::string Logs(int region, int index) const;
  // Whether the daemon is still running (false once it exited).
  bool Running(int region, int index);
  // Polls counter `name` of the daemon's stats (localproto::Client::Stats) until `done` holds or
  // `deadline` passes; returns its last value (-1: not read, or no such counter).
  int64_t WaitForStat(int region, int index, const std::string& name,
                      const std::function<bool(int64_t)>& done, Deadline deadline) const;
  // ... until it is at least `want`.
  int64_t WaitForStat(int region, int index, const std::string& name, int64_t want,
                      Deadline deadline) const {
    return WaitForStat(
        region, index, name, [want](int64_t v) { return v >= want; }, deadline);
  }

  // The emulator, to change a link while traffic runs (Emulator::SetLink).
  wanem::Emulator& emulator() { return *emulator_; }

  // SIGKILL / restart (same config) of one daemon; Restart waits for its ready line.
  void Kill(int region, int index);
  Status Restart(int region, int index);

 private:
  explicit WanCluster(WanClusterOptions options) : options_(std::move(options)) {}
  Status WriteConfig(int region, int index);
  Status Spawn(int region, int index);
  Status WaitReady(int region, int index);
  // Straitds per region, and the one serving rank index `index`.
  int Gateways() const { return options_.ranks_per_region / options_.shards_per_gateway; }
  int GatewayOf(int index) const { return index / options_.shards_per_gateway; }
  size_t Slot(int region, int index) const {
    return static_cast<size_t>(region * Gateways() + GatewayOf(index));
  }
  // The files' common path of the straitd serving `index` (without the extension).
  std::string Base(int region, int index) const;

  WanClusterOptions options_;
  std::string dir_;
  std::unique_ptr<wanem::Emulator> emulator_;
  std::optional<net::testing::TestPki> pki_;
  std::vector<pid_t> pids_;
  std::vector<size_t> starts_;  // per daemon: how many times it was started (ready lines)
};

}  // namespace strait::gateway::testing

#endif  // STRAIT_TESTS_GATEWAY_WAN_CLUSTER_H_

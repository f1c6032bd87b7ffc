// The pieces of `strait-bench allreduce` shared between its files (see allreduce_bench.h for
// what the command measures). Not installed, not used outside bench/allreduce_*.cc.
//
// Files, by concern:
//   allreduce_bench.cc    the flags and the orchestrator's top level (one run: set-up, rows,
//                         report);
//   allreduce_rank.cc     the hidden rank mode through a straitd: the per-iteration barrier,
//                         the all-reduce loop and the check against the reference;
//   allreduce_ring.cc     the hidden rank mode of the baseline: a flat TCP ring;
//   allreduce_collnet.cc  the hidden rank mode of --collnet: a node head driving the NCCL
//                         plugin's CollNet table;
//   allreduce_cluster.cc  processes, straitd configs and start-up, certificates, shard weights
//                         and the per-pair floor of the emulated links;
//   allreduce_runner.cc   one row: rank processes started, waited for and folded into a
//                         RunResult, the emulated links sampled meanwhile;
//   allreduce_report.cc   the human table and the --json report.
//
// Rank processes report on stdout, which the orchestrator sends to a file per rank:
//   "progress <iterations done>\n" after each iteration, then one "result <json>\n" line.
#ifndef STRAIT_BENCH_ALLREDUCE_INTERNAL_H_
#define STRAIT_BENCH_ALLREDUCE_INTERNAL_H_

#include <signal.h>
#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "bench/bench_common.h"
#include "bench/wanem/config.h"
#include "bench/wanem/emulator.h"
#include "common/clock.h"
#include "gateway/config.h"
#include "strait/status.h"
#include "strait/types.h"

namespace strait::bench::allreduce {

using Json = nlohmann::ordered_json;

inline constexpr const char* kCommand = "allreduce";
inline constexpr const char* kJob = "strait-bench-allreduce";
// Ports inside each region's namespace (fresh namespaces: nothing else listens there).
inline constexpr int kGatewayPortBase = 7400;
inline constexpr int kRingPortBase = 7600;

struct Flags {
  int regions = 3;
  int ranks_per_region = 2;
  uint64_t size = uint64_t{64} << 20;
  std::string codec = "int8";  // a list: one mesh row per codec (and shard mode)
  std::string link = "100mbit,20ms";
  std::vector<std::string> pairs;   // strait-wanem --pair overrides
  // --dial-only: this region is behind NAT (strait-wanem drops connections into it, `*>R=syn=drop`)
  // and its straitds are dial-only (wan.dial = "outbound-only"); -1: every region symmetric.
  int dial_only = -1;
  std::string shards = "weighted";  // a list of "weighted", "balanced", "measured", "even"
  // --straitds-per-region: a list of straitd counts per region (each dividing ranks_per_region;
  // "" = ranks_per_region, one per rank): one set of mesh rows per count, straitd g of a region
  // serving shards g*s .. g*s+s-1 (config `shards`) for s = ranks_per_region / count.
  std::string straitds;
  std::string transport = "auto";   // auto (tls when emulated), tls, plain
  int iters = 5;
  int warmup = 1;
  std::string baseline = "none";
  bool loopback = false;
  int streams = gateway::kDefaultLinkStreams;  // straitd's link.streams default
  bool adapt_streams = true;
  std::string cc;  // straitd's link.congestion_control; empty: the namespace's default
  // Emulating: each gateway paces its link to a peer region at its share of that directed
  // pair's rate (straitd's peers.<region>.max_rate = rate / gateways per region).
  bool pace = true;
  // straitd's allreduce.chunk_elements; 0: its rule by op (collective::ChunkElementsFor).
  int64_t chunk_elements = 0;
  std::string straitd;
  double timeout_s = 600;
  // nccl-tests' size sweep: -b/--minbytes, -e/--maxbytes (0: not given), -f/--stepfactor.
  uint64_t min_bytes = 0;
  uint64_t max_bytes = 0;
  uint64_t step_factor = 2;
  std::string dtype_name = "float32";    // --dtype as given
  DataType dtype = DataType::kFloat32;   // --dtype parsed (ranks are passed dtype_name)
  bool phases = false;                   // --phases: per-gateway time split under the table
  // --zero-copy: mesh ranks keep their tensor in their straitd's shared region
  // (Client::SharedBuffer/AllReduceShared) instead of copying it in and the result out per call.
  bool zero_copy = false;
  // --link-trace: the emulated links' router counters through every run, one CSV row per
  // directed pair and sample (where and when packets are dropped); "" = none.
  std::string link_trace;
  // --gateway: one rank against an already running straitd (the operator's smoke test).
  std::string gateway;
  int region_index = -1;
  int shard_index = 0;
  // Hidden: rank mode.
  std::string role;
  int rank_region = 0;
  int rank_index = 0;
  std::string socket;
  std::string ring_addrs;
  std::string job = kJob;
  std::string barrier;  // the directory of the per-iteration barrier (see IterationBarrier)
  // --collnet: the NCCL plugin whose CollNet table a row per codec drives (one node head per
  // rank, each on its own straitd); empty: no CollNet rows. --collnet-chunk: the bytes of one
  // iallreduce (NCCL's CollNet chunk).
  std::string collnet;
  uint64_t collnet_chunk = uint64_t{4} << 20;
  // --region-links plain: CollNet's region links on plain TCP (straitd's [region_links]
  // transport = "plain", a listener of their own) while the WAN links keep --transport.
  std::string region_links = "tls";
};

// Set by SIGINT/SIGTERM in the orchestrator: its waits give up, and Cluster's destructor stops
// the gateways and the emulator instead of leaving them behind.
extern volatile sig_atomic_t g_interrupted;

// --- Shared by both rank modes (allreduce_rank.cc) ---------------------------------------------

uint64_t RegionSeed(int region);
// [begin, end) of slice `index` of `count` elements split `parts` ways.
std::pair<size_t, size_t> Slice(size_t count, int parts, int index);
std::string Hex(uint64_t v);

struct Check {
  double max_error = 0;
  uint64_t wrong = 0;
};

// Compares result[0, end-begin) with the fp64 sum over regions of elements [begin, end) of each
// region's tensor, within fp32 rounding (levels 0) or the lossy codec's step bound (levels:
// LossyLevels of the resolved policy).
// `result` is the rank's result widened to fp32; for bfloat16 and float16 the reference's
// inputs are rounded to `dtype` and the allowance is that type's rounding.
Check CheckAgainstReference(const float* result, size_t count_total, size_t begin, size_t end,
                            int regions, double levels, DataType dtype);
// One line on stdout, flushed.
void Emit(const std::string& line);
// Waits until `ranks` ranks arrived at `iteration` (files in `dir`).
Status IterationBarrier(const std::string& dir, int rank, int ranks, int iteration,
                        Deadline deadline);

// Worst-case error per block step of a policy (127 for int8, ...); 0 for lossless ones.
double LossyLevels(const std::string& policy);
// straitd's stats text: the rest of line `key ...` ("" without one), and its value (0).
std::string StatLine(const std::string& stats, const std::string& key);
uint64_t StatValue(const std::string& stats, const std::string& key);

// A rank's "result" object (allreduce_runner.cc reads it): its times, its gateway's counters
// over the measured iterations (from `stats_before` to `stats`), the check and the result hash.
Json RankResult(const Flags& f, const std::string& policy, const Json& times, const Json& starts,
                const std::string& stats_before, const StatusOr<std::string>& stats,
                const Check& check, const std::vector<uint8_t>& data);

int RunMeshRank(const Flags& f);
int RunRingRank(const Flags& f);     // allreduce_ring.cc
int RunCollNetRank(const Flags& f);  // allreduce_collnet.cc

// straitd's time counters (see gateway_impl.h) that the report splits an iteration into.
inline constexpr const char* kTimeKeys[] = {"handle_ns",   "allreduce_ns",      "encode_ns",
                                            "reduce_ns",   "decode_ns",         "wait_ns",
                                            "ack_wait_ns", "region_scatter_ns", "region_gather_ns"};

// --- Processes, gateways and links (allreduce_cluster.cc) ---------------------------------------

std::string SelfExe();
// Starts argv (searched on PATH) with stdout and stderr into files.
StatusOr<pid_t> Spawn(const std::vector<std::string>& argv, const std::string& out,
                      const std::string& err);
std::string ReadFile(const std::string& path);
// Ports the kernel just handed out for 127.0.0.1 (all held open at once, so they differ).
std::vector<uint16_t> FreeLoopbackPorts(int n);

struct Proc {
  pid_t pid = -1;
  std::string name, out, err;
};

// Everything the run started, stopped and removed however the run ends.
struct Cluster {
  std::string dir;
  std::unique_ptr<wanem::Emulator> emulator;
  std::vector<Proc> daemons;
  // Bumped each time the gateways are (re)started, so that a new set never reuses the sockets
  // and ports of the previous one (closed listeners may linger in TIME_WAIT).
  int generation = 0;
  std::vector<uint64_t> weights;  // the shard weights the running gateways were given
  int shards_per_gateway = 1;     // the layout of the running gateways (Flags::straitds)
  wanem::LinkTable table;         // what the emulator applies

  Cluster() = default;
  Cluster(const Cluster&) = delete;
  Cluster& operator=(const Cluster&) = delete;
  ~Cluster();
  void StopDaemons();
};

struct Setup {
  bool emulated = false;
  bool tls = false;
  std::string why_loopback;
  wanem::LinkTable table;
};

// argv run inside region `region`'s namespace when emulating.
std::vector<std::string> InRegion(const Cluster& c, int region, std::vector<std::string> argv);
// The address region `region`'s processes listen on.
std::string Addr(const Setup& s, int region);
std::string RegionName(int region);
// A throwaway CA and one certificate per region, in `dir`.
Status MakeCertificates(const std::string& dir, int regions);
// The Unix socket of the straitd serving rank `index` of `region` (of the running generation).
std::string SocketPath(const Cluster& c, int region, int index);
// Starts ranks_per_region / c.shards_per_gateway straitds per region with `weights` as
// allreduce.shard_weights (none when empty: equal shards), after stopping any running set.
Status StartGateways(const Flags& f, const Setup& s, const std::vector<uint64_t>& weights,
                     Cluster& c);

// The rate of a directed pair in bit/s; "unlimited" (0) counts as 100 Gbit/s.
double RateBps(const wanem::LinkTable& t, int src, int dst);
// Each region's weight: the rate (kbit/s) of its slowest link in either direction.
std::vector<uint64_t> SlowestLinkWeights(const wanem::LinkTable& t);
// collective::BalancedShardWeights on the emulated per-pair rates.
std::vector<uint64_t> BalancedWeights(const wanem::LinkTable& t);
// The mesh's floor on strait-wanem's per-pair links for a split and a codec ratio.
double PairFloor(const wanem::LinkTable& t, const std::vector<uint64_t>& weights, double bytes,
                 double ratio);
bool LinksEqual(const wanem::LinkTable& t);

// --- One row (allreduce_runner.cc) -------------------------------------------------------------

// One straitd's time counters per measured iteration, in ms (keys of kTimeKeys without "_ns").
struct GatewayTimes {
  int region = 0;
  int index = 0;  // shard index, = the rank's index in its region
  std::vector<std::pair<std::string, double>> ms;
  // The rank's own all-reduce call per measured iteration (mean, ms): the gateway's request
  // plus what the rank does around it (copies in and out of the shared region, the socket).
  double rank_call_ms = 0;
  // straitd's straggler detection after the run (its stats' slow_peers line): the peer regions
  // it names persistently slow, e.g. "r1 (waited 120 ms per op against 4 ms)"; empty if none.
  std::string slow_peers;

  double Get(const std::string& key) const;
};

struct RunResult {
  std::string label;
  std::string algorithm = "mesh";  // "mesh" (library mode), "collnet" or "ring"
  int straitds_per_region = 0;  // mesh: the gateway layout's straitds per region
  uint64_t size = 0;   // bytes all-reduced per iteration (the sweep's size)
  std::string codec;   // mesh: the --codec entry
  std::string shards;  // mesh: "weighted", "balanced", "measured" or "even"; ring: ""
  std::vector<uint64_t> weights;
  std::string policy;
  int participants = 0;  // busbw's n
  double time_s = 0;     // mean over iterations of the slowest rank's time
  // Each measured iteration's time (its slowest rank's), in order: the mean hides whether every
  // iteration is a little slow or some are very slow (OSU's benchmarks print min and max too).
  std::vector<double> iteration_s;
  double max_error = 0;
  uint64_t wrong = 0;
  bool identical = true;
  uint64_t wan_bytes_per_iter = 0;                  // mesh: every gateway's WAN bytes sent, summed
  std::vector<uint64_t> region_wan_bytes_per_iter;  // mesh: the same per region
  double codec_ratio = 0;  // mesh: uncompressed mesh bytes / wan_bytes_per_iter
  double bound_s = 0;      // DESIGN's link bound (0: not applicable)
  double floor_s = 0;      // PairFloor for this row's split and ratio
  int64_t wall_ns = 0;
  // Emulated links over the measured iterations (first start to last end, every rank): bytes
  // the router delivered / (rate x window), mean and lowest over the directed pairs that carry
  // data (not only acks), and packets it dropped (tail drop, loss or policer). Below 1: idle
  // link time.
  double link_use_mean = 0;
  double link_use_min = 0;
  uint64_t link_drops = 0;
  // The same per directed pair (src region > dst region), every pair that carried bytes.
  struct PairUse {
    int src = 0, dst = 0;
    double busy = 0;  // delivered bytes / (rate x window)
    uint64_t delivered_bytes = 0;
    uint64_t queue_full = 0, lost = 0, policed = 0;  // dropped packets by cause
    uint64_t peak_backlog_bytes = 0;  // the most bytes seen waiting, against queue_limit_bytes
    uint64_t queue_limit_bytes = 0;
  };
  std::vector<PairUse> pairs;
  // Mesh: straitd's time counters per measured iteration, mean over the gateways, in ms (keys
  // of kTimeKeys without "_ns").
  std::vector<std::pair<std::string, double>> gateway_ms;
  // Mesh: the same per gateway, in rank order (region-major).
  std::vector<GatewayTimes> gateways;
};

// Runs one rank process per (region, index) with `extra` rank flags, waits with a progress
// line, and folds their results.
StatusOr<RunResult> RunRanks(const Flags& f, Cluster& c, const std::string& role,
                             const std::string& codec, const std::string& job,
                             const std::vector<std::string>& extra, ProgressLine* progress);

// --- The report (allreduce_report.cc) ----------------------------------------------------------

struct Report {
  Flags flags;
  Setup setup;
  std::vector<uint64_t> sizes;   // the sweep's sizes, ascending (one: --size)
  // The mesh rows (per shard mode, codec, size), then the ring baseline's (per size).
  std::vector<RunResult> runs;
  bool links_equal = true;
};

// DESIGN "Performance model": T >= 2L + 2S(n-1)/(n r B), for equal links.
double LinkBound(const Setup& s, int n, double bytes, double ratio);
// --codec's entries: '/' separates them, since a policy itself may hold commas ("int8,noef").
std::vector<std::string> SplitCodecs(const std::string& text);
std::string FormatTable(const Report& rep);
std::string FormatJson(const Report& rep);

}  // namespace strait::bench::allreduce

#endif  // STRAIT_BENCH_ALLREDUCE_INTERNAL_H_

// `strait-bench allreduce`: its flags, and the orchestrator's top level -- set-up (emulator,
// certificates, gateways), one row per shard mode and codec, the ring baseline, the report --
// and the dispatch into the hidden rank modes. See allreduce_bench.h for what it measures and
// allreduce_internal.h for where the rest lives.
#include "bench/allreduce_bench.h"

#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <climits>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>

#include "bench/allreduce_internal.h"
#include "bench/allreduce_sweep.h"
#include "bench/wanem/netns.h"
#include "common/strings.h"
#include "localproto/policy_grammar.h"
#include "tools/cli/cli.h"

namespace strait::bench::allreduce {

volatile sig_atomic_t g_interrupted = 0;

namespace {

void OnStopSignal(int) {
  g_interrupted = 1;
}

// The row of `codec` at `size` with shard `mode` (gateways running with `weights`): library
// mode ("mesh": each rank hands its slice to its straitd) or "collnet" (each rank a node head
// driving the plugin's CollNet table with the whole tensor).
StatusOr<RunResult> RunMeshRow(const Flags& f, const Setup& s, bool links_equal, Cluster& c,
                               const std::string& role, const std::string& codec,
                               const std::string& mode, bool several_modes,
                               const std::vector<uint64_t>& weights, uint64_t size,
                               const std::string& job, ProgressLine* progress) {
  Flags sized = f;
  sized.size = size;
  std::vector<std::string> extra;
  if (role == "collnet") {
    extra = {"--collnet", f.collnet, "--collnet-chunk", std::to_string(f.collnet_chunk)};
  }
  if (role == "mesh" && f.zero_copy) extra = {"--zero-copy"};
  StatusOr<RunResult> mesh = RunRanks(sized, c, role, codec, job, extra, progress);
  if (!mesh.ok()) return mesh;
  mesh->algorithm = role;
  const double n = f.regions;
  const double bytes = static_cast<double>(size);
  // Every gateway's WAN bytes together, uncompressed, whatever the split: each region sends its
  // parts of the n-1 other shards, and each owner its result to n-1 regions: 2(n-1)S in all.
  const double plain_bytes_total = 2.0 * bytes * (n - 1);
  mesh->label = role + " " + codec + (several_modes ? " " + mode : "");
  mesh->shards = mode;
  mesh->weights = weights;
  mesh->participants = f.regions;
  if (mesh->wan_bytes_per_iter > 0) {
    mesh->codec_ratio = plain_bytes_total / static_cast<double>(mesh->wan_bytes_per_iter);
  }
  const double ratio = mesh->codec_ratio > 0 ? mesh->codec_ratio : 1.0;
  // Measured: straitd should land on the balanced split of the rates it sees.
  mesh->floor_s =
      PairFloor(s.table, mode == "measured" && !links_equal ? BalancedWeights(s.table) : weights,
                bytes, ratio);
  mesh->bound_s = links_equal ? LinkBound(s, f.regions, bytes, ratio) : mesh->floor_s;
  return mesh;
}

int RunOrchestrator(const Flags& f, const std::vector<uint64_t>& sizes,
                    const GlobalFlags& globals) {
  struct sigaction sa {};
  sa.sa_handler = OnStopSignal;
  ::sigaction(SIGINT, &sa, nullptr);
  ::sigaction(SIGTERM, &sa, nullptr);
  const std::vector<std::string> codecs = SplitCodecs(f.codec);
  const std::vector<std::string> shard_modes = SplitList(f.shards);
  if (codecs.empty()) return UsageError(kCommand, "--codec", "give at least one codec");
  if (shard_modes.empty()) {
    return UsageError(kCommand, "--shards", "a list of even, weighted, balanced and measured");
  }
  for (const std::string& m : shard_modes) {
    if (m != "even" && m != "weighted" && m != "balanced" && m != "measured") {
      return UsageError(kCommand, "--shards",
                        "a list of even, weighted, balanced and measured, not '" + m + "'");
    }
  }
  // Gateway layouts: straitds per region (one per rank unless --straitds-per-region says).
  std::vector<int> layouts;
  std::string layout_list = f.straitds;
  std::replace(layout_list.begin(), layout_list.end(), '/', ',');
  for (const std::string& item : SplitList(layout_list)) {
    int count = 0;
    const bool number = !item.empty() && item.size() <= 2 &&
                        std::all_of(item.begin(), item.end(), ::isdigit);
    if (number) count = std::stoi(item);
    if (count < 1 || f.ranks_per_region % count != 0) {
      return UsageError(kCommand, "--straitds-per-region",
                        "a list of straitd counts per region that divide --ranks-per-region (" +
                            std::to_string(f.ranks_per_region) + "), e.g. " +
                            std::to_string(f.ranks_per_region) + "/1; not '" + item + "'");
    }
    layouts.push_back(count);
  }
  if (layouts.empty()) layouts.push_back(f.ranks_per_region);
  Setup s;
  if (f.loopback) {
    s.why_loopback = "--loopback";
  } else if (Status p = wanem::CheckPrivileges(); !p.ok()) {
    s.why_loopback = "no emulation: " + p.message();
  } else {
    s.emulated = true;
  }
  if (!f.link_trace.empty() && !s.emulated) {
    return UsageError(kCommand, "--link-trace",
                      "traces emulated links, and this run has none (" + s.why_loopback +
                          "): run as root without --loopback, or drop --link-trace");
  }
  if (!f.link_trace.empty()) {
    // Each run appends its samples: start from an empty file.
    std::FILE* trace = std::fopen(f.link_trace.c_str(), "w");
    if (trace == nullptr) {
      return UsageError(kCommand, "--link-trace",
                        "cannot write '" + f.link_trace + "': " + std::strerror(errno));
    }
    std::fclose(trace);
  }
  // TLS by default where the links are emulated WAN links (what a deployment runs); loopback
  // runs are demos and smoke tests, where plain TCP keeps the CPU for the gateways.
  s.tls = f.transport == "tls" || (f.transport == "auto" && s.emulated);
  if (!f.collnet.empty() && f.region_links == "plain" && !s.tls) {
    // straitd refuses [region_links] plain beside a plain WAN port, which admits anyone already.
    return UsageError(kCommand, "--region-links",
                      "plain needs TLS gateway links (the links are plain TCP already: --transport "
                      "plain, or auto on loopback); add --transport tls");
  }
  std::vector<std::string> pairs = f.pairs;
  // The NAT'd region's firewall: no TCP connection into it completes (its straitds dial).
  if (f.dial_only >= 0) pairs.push_back("*>" + std::to_string(f.dial_only) + "=syn=drop");
  StatusOr<wanem::LinkTable> table = wanem::BuildLinkTable(f.regions, f.link, pairs);
  if (!table.ok()) return UsageError(kCommand, "--link/--pair", table.status().message());
  s.table = *std::move(table);

  Cluster c;
  char tmpl[] = "/tmp/strait-allreduce-XXXXXX";
  if (::mkdtemp(tmpl) == nullptr) {
    std::cerr << "strait-bench allreduce: cannot create a temporary directory\n";
    return kExitFailure;
  }
  c.dir = tmpl;
  ::chmod(c.dir.c_str(), 0755);
  ProgressLine progress;
  auto fail = [&](const Status& st) {
    progress.Clear();
    std::cerr << "strait-bench allreduce: FAILED: " << st.ToString() << '\n';
    return kExitFailure;
  };
  if (s.tls) {
    progress.Update("making throwaway TLS certificates");
    if (Status st = MakeCertificates(c.dir, f.regions); !st.ok()) return fail(st);
  }
  if (s.emulated) {
    progress.Update("starting strait-wanem");
    wanem::EmulatorOptions eo;
    eo.name = "bench" + std::to_string(::getpid() % 100000);
    eo.table = s.table;
    c.table = s.table;
    StatusOr<std::unique_ptr<wanem::Emulator>> emu = wanem::Emulator::Start(std::move(eo));
    if (!emu.ok()) return fail(emu.status());
    c.emulator = *std::move(emu);
  }

  Report rep;
  rep.flags = f;
  rep.setup = s;
  rep.links_equal = LinksEqual(s.table);
  rep.sizes = sizes;
  int job_index = 0;
  for (const int straitds : layouts) {
  c.shards_per_gateway = f.ranks_per_region / straitds;
  bool new_layout = true;  // a new layout starts new gateways
  for (const std::string& mode : shard_modes) {
    // Equal links, and measured: none (straitd measures its links and balances on them, which
    // gives equal shards on equal links). Even on unequal links: all 1, which straitd takes as
    // the operator's choice over its measurements.
    std::vector<uint64_t> weights;
    if (!rep.links_equal && mode == "even") weights.assign(static_cast<size_t>(f.regions), 1);
    if (!rep.links_equal && mode == "weighted") weights = SlowestLinkWeights(s.table);
    if (!rep.links_equal && mode == "balanced") weights = BalancedWeights(s.table);
    if (new_layout || c.daemons.empty() || weights != c.weights) {
      new_layout = false;
      progress.Update("starting " + std::to_string(f.regions * straitds) + " straitd");
      if (Status st = StartGateways(f, s, weights, c); !st.ok()) return fail(st);
    }
    // CollNet needs a straitd per node head (shard): only on the one-per-rank layout.
    std::vector<std::string> roles = {"mesh"};
    if (!f.collnet.empty() && straitds == f.ranks_per_region) roles.push_back("collnet");
    for (const std::string& role : roles) {
      for (const std::string& codec : codecs) {
        // The sweep runs on the same gateways, a job per row and size: error-feedback residuals
        // and op sequences never carry over.
        for (const uint64_t size : sizes) {
          const std::string job = std::string(kJob) + "-" + std::to_string(job_index++);
          StatusOr<RunResult> row = RunMeshRow(f, s, rep.links_equal, c, role, codec, mode,
                                               shard_modes.size() > 1, weights, size, job,
                                               &progress);
          if (!row.ok()) return fail(row.status());
          row->straitds_per_region = straitds;
          if (role == "mesh" && layouts.size() > 1) {
            row->label += " " + std::to_string(straitds) + " straitd" +
                          (straitds > 1 ? "s" : "") + "/region";
          }
          rep.runs.push_back(*std::move(row));
        }
      }
    }
  }
  }

  if (f.baseline == "ring") {
    std::vector<std::string> addrs;
    const std::vector<uint16_t> ports =
        s.emulated ? std::vector<uint16_t>{} : FreeLoopbackPorts(f.regions * f.ranks_per_region);
    for (int r = 0; r < f.regions; ++r) {
      for (int i = 0; i < f.ranks_per_region; ++i) {
        const int port =
            s.emulated ? kRingPortBase + i : ports[static_cast<size_t>(r * f.ranks_per_region + i)];
        addrs.push_back(Addr(s, r) + ":" + std::to_string(port));
      }
    }
    std::string list;
    for (const std::string& a : addrs) AppendToList(list, a, ",");
    for (size_t k = 0; k < sizes.size(); ++k) {
      Flags sized = f;
      sized.size = sizes[k];
      StatusOr<RunResult> ring = RunRanks(sized, c, "ring", "none", "ring" + std::to_string(k),
                                          {"--ring-addrs", list}, &progress);
      if (!ring.ok()) return fail(ring.status());
      ring->label = "ring none (baseline)";
      ring->algorithm = "ring";
      ring->codec = "none";
      ring->participants = f.regions * f.ranks_per_region;
      // Held to the uncompressed mesh (DESIGN's bound, or with unequal links the even split's
      // floor); the ring's own floor is not computed (floor_s stays 0).
      const double bytes = static_cast<double>(sizes[k]);
      ring->bound_s = rep.links_equal ? LinkBound(s, f.regions, bytes, 1.0)
                                      : PairFloor(s.table, {}, bytes, 1.0);
      rep.runs.push_back(*std::move(ring));
    }
  }
  progress.Clear();

  std::cout << (globals.json ? FormatJson(rep) : FormatTable(rep));
  std::cout.flush();
  bool ok = true;
  for (const RunResult& r : rep.runs) ok = ok && r.wrong == 0 && r.identical;
  if (!ok) std::cerr << "strait-bench allreduce: FAILED: wrong or non-identical results\n";
  return ok ? kExitOk : kExitFailure;
}


}  // namespace

}  // namespace strait::bench::allreduce

namespace strait::bench {

using allreduce::Flags;
using allreduce::kCommand;
using allreduce::RunMeshRank;
using allreduce::RunOrchestrator;
using allreduce::RunRingRank;
using allreduce::RunCollNetRank;

CommandMain SetupAllReduceCommand(CLI::App& cmd) {
  auto f = std::make_shared<Flags>();
  cmd.add_option("--regions", f->regions, "Regions (each its own network namespace)")
      ->check(IntValidator(2, 16))
      ->capture_default_str();
  cmd.add_option("--ranks-per-region", f->ranks_per_region,
                 "Rank processes per region (rank i all-reduces shard i through a straitd)")
      ->check(IntValidator(1, 8))
      ->capture_default_str();
  CLI::Option* size =
      cmd.add_option("--size", f->size, "Bytes all-reduced per iteration (e.g. 64MiB); one size")
          ->transform(SizeValidator(1024, uint64_t{4} << 30))
          ->type_name("SIZE")
          ->default_str("64MiB");
  // nccl-tests' sweep flags, short and long forms alike.
  CLI::Option* min_bytes =
      cmd.add_option("-b,--minbytes", f->min_bytes,
                     "Sweep: the first size (e.g. 4KiB); with -e and -f, one row per size, the "
                     "gateways started once")
          ->transform(SizeValidator(1024, uint64_t{4} << 30))
          ->type_name("SIZE");
  CLI::Option* max_bytes =
      cmd.add_option("-e,--maxbytes", f->max_bytes, "Sweep: the largest size (e.g. 256MiB)")
          ->transform(SizeValidator(1024, uint64_t{4} << 30))
          ->type_name("SIZE");
  CLI::Option* step =
      cmd.add_option("-f,--stepfactor", f->step_factor,
                     "Sweep: each size is the previous one times this (at least 2)")
          ->capture_default_str();
  size->excludes(min_bytes)->excludes(max_bytes)->excludes(step);
  auto sweep_given = [min_bytes, max_bytes, step] {
    return min_bytes->count() + max_bytes->count() + step->count() > 0;
  };
  cmd.add_option("--dtype", f->dtype_name,
                 "Element type of the tensor: float32, bfloat16 or float16 (the ring baseline: "
                 "float32 only)")
      ->capture_default_str();
  cmd.add_flag("--zero-copy", f->zero_copy,
               "Mesh ranks keep their tensor in their straitd's shared region "
               "(Client::SharedBuffer + AllReduceShared): nothing is copied in or out per call. "
               "The input is rewritten there before each iteration, outside the timing");
  cmd.add_flag("--phases", f->phases,
               "Print each gateway's time per op split into encode, waiting for frames, on the "
               "wire, reduce, decode and local hand-over (straitd's stats counters)");
  cmd.add_option("--link-trace", f->link_trace,
                 "Write the emulated links' router counters to this CSV through every run: per "
                 "directed pair and ~50 ms sample, bytes delivered, packets dropped by cause "
                 "(queue full, lost, policed) and the queue's backlog")
      ->type_name("PATH");
  cmd.add_option("--codec", f->codec,
                 "Job policy for the mesh: none, zstd[:L], int8, int4, fp8, auto [,ef|,noef]; "
                 "several separated by '/' run one mesh row each (e.g. int8/zstd)")
      ->capture_default_str();
  cmd.add_option("--link", f->link,
                 "Every emulated link: rate,one-way delay[,loss=...] (strait-wanem link spec)")
      ->capture_default_str();
  cmd.add_option("--pair", f->pairs,
                 "Per-pair override as strait-wanem's --pair: SELECTOR=SPEC, e.g. "
                 "0:1=rate=200mbit (both directions) or 2>0=rate=50mbit; repeatable")
      ->type_name("SELECTOR=SPEC");
  cmd.add_option("--straitds-per-region", f->straitds,
                 "Gateway layout: straitds per region, each serving ranks-per-region / N "
                 "consecutive shards behind one socket (config `shards`); default: one per rank. "
                 "Several, '/'- or comma-separated (e.g. 4/1), run one set of rows each, the "
                 "gateways restarted in between")
      ->type_name("N[/N...]");
  cmd.add_option("--shards", f->shards,
                 "Shard split of the mesh, given to straitd as allreduce.shard_weights: weighted "
                 "(each region's weight = its slowest link's rate), balanced (the split that "
                 "minimises the busiest link's time, a small linear program), measured (no "
                 "shard_weights: straitd applies the balanced rule to the link rates it "
                 "measures), even; several "
                 "comma-separated run one row each, the gateways restarted in between. Equal "
                 "links give equal shards in every mode")
      ->capture_default_str();
  cmd.add_option("--transport", f->transport,
                 "Gateway WAN links: tls (throwaway CA and certificates via the openssl CLI), "
                 "plain, or auto (tls when emulating, plain on loopback)")
      ->check(CLI::IsMember({"auto", "tls", "plain"}))
      ->capture_default_str();
  cmd.add_option("--iters", f->iters, "Measured iterations")
      ->check(IntValidator(1, 10000))
      ->capture_default_str();
  cmd.add_option("--warmup", f->warmup, "Warm-up iterations (not measured)")
      ->check(IntValidator(0, 1000))
      ->capture_default_str();
  cmd.add_option("--baseline", f->baseline,
                 "none, or ring: an uncompressed flat TCP ring over all ranks on the same links")
      ->check(CLI::IsMember({"none", "ring"}))
      ->capture_default_str();
  cmd.add_option("--dial-only", f->dial_only,
                 "Put this region (0 .. regions-1) behind NAT: strait-wanem drops every TCP "
                 "connection into it (syn=drop) and its straitds are dial-only (wan.dial = "
                 "\"outbound-only\"), dialling every link; compare with a run without it")
      ->type_name("REGION")
      ->check(IntValidator(0, 15));
  cmd.add_flag("--loopback", f->loopback,
               "Everything on 127.0.0.1, no emulation (the default without root)");
  cmd.add_option("--streams", f->streams, "WAN streams per gateway link")
      ->check(IntValidator(1, 64))
      ->capture_default_str();
  cmd.add_option("--adapt-streams", f->adapt_streams,
                 "Let each gateway link adapt its stream count from --streams (straitd's "
                 "link.adapt_streams); false keeps --streams fixed")
      ->capture_default_str();
  cmd.add_option("--cc", f->cc,
                 "Congestion control of the gateways' WAN streams (straitd's "
                 "link.congestion_control, e.g. bbr or reno; default: the system's)")
      ->check(CLI::IsMember({"bbr", "reno", "cubic"}));
  cmd.add_option("--pace", f->pace,
                 "When emulating, pace each gateway's link to a peer at its share of the pair's "
                 "rate (straitd's peers.<region>.max_rate: rate / straitds per region); false "
                 "leaves the streams to TCP alone")
      ->capture_default_str();
  cmd.add_option("--chunk-elements", f->chunk_elements,
                 "Elements per pipelined chunk (straitd's allreduce.chunk_elements; 0: its "
                 "rule by op, 65536 for lossy ops of 2^22 elements or more, else 262144)")
      ->check(cli::NumberIn(static_cast<double>(gateway::kMinChunkElements),
                            static_cast<double>(gateway::kMaxChunkElements), "elements",
                            "straitd's default"))
      ->capture_default_str();
  cmd.add_option("--straitd", f->straitd,
                 "straitd binary (default: next to strait-bench, the build tree, then PATH)")
      ->type_name("PATH");
  cmd.add_option("--timeout", f->timeout_s, "Seconds one all-reduce may take")
      ->check(cli::NumberIn(1, 86400, "seconds"))
      ->capture_default_str();
  // The operator's smoke test: one rank of a deployed job, against gateways already running.
  cmd.add_option("--gateway", f->gateway,
                 "Smoke-test deployed gateways: all-reduce through the straitd at this local "
                 "socket instead of starting any; run it at once in every region with the same "
                 "--regions, --ranks-per-region, --size, --codec, --iters and --job, each with its "
                 "own --region-index (and --shard-index); exits 1 on a wrong result")
      ->type_name("SOCKET");
  cmd.add_option("--region-index", f->region_index,
                 "With --gateway: this region's index, 0 .. regions-1 (the same order everywhere)")
      ->check(IntValidator(0, 15));
  CLI::Option* shard_index = cmd.add_option("--shard-index", f->shard_index,
                 "With --gateway: which of the region's --ranks-per-region slices this rank "
                 "all-reduces (its straitd's shard)")
      ->check(IntValidator(0, 7))
      ->capture_default_str();
  cmd.add_option("--job", f->job, "With --gateway: the job id the ranks share")
      ->capture_default_str();
  cmd.add_option("--collnet", f->collnet,
                 "Also run each codec through the NCCL plugin's CollNet table (this "
                 "libnccl-net-strait.so, loaded with dlopen): one node head per rank, each on its "
                 "own straitd, driving iallreduce/test as NCCL's proxy does, beside library mode "
                 "on the same gateways and links")
      ->type_name("PLUGIN.so");
  cmd.add_option("--collnet-chunk", f->collnet_chunk,
                 "With --collnet: bytes of one CollNet iallreduce (NCCL's chunk; 8 in flight)")
      ->transform(SizeValidator(4096, uint64_t{16} << 20))
      ->capture_default_str();
  cmd.add_option("--region-links", f->region_links,
                 "With --collnet: the links among a region's gateways: tls (over the WAN port, "
                 "as --transport) or plain (straitd's [region_links] transport = \"plain\": plain "
                 "TCP on a port of their own, inside the region)")
      ->check(CLI::IsMember({"tls", "plain"}))
      ->capture_default_str();
  // Rank mode, used by the orchestrator only.
  cmd.add_option("--rank-role", f->role)->group("");
  cmd.add_option("--rank-region", f->rank_region)->group("");
  cmd.add_option("--rank-index", f->rank_index)->group("");
  cmd.add_option("--rank-socket", f->socket)->group("");
  cmd.add_option("--rank-job", f->job)->group("");
  cmd.add_option("--rank-barrier", f->barrier)->group("");
  cmd.add_option("--ring-addrs", f->ring_addrs)->group("");

  return [f, sweep_given, shard_index](const GlobalFlags& globals) -> int {
    ::signal(SIGPIPE, SIG_IGN);
    StatusOr<DataType> dtype = ParseSweepDtype(f->dtype_name);
    if (!dtype.ok()) return UsageError(kCommand, "--dtype", dtype.status().message());
    f->dtype = *dtype;
    const size_t elem = DataTypeSize(f->dtype);
    if (f->size % elem != 0) {
      return UsageError(kCommand, "--size",
                        "must be a multiple of " + std::to_string(elem) + " (" +
                            f->dtype_name + ")");
    }
    // A codec the gateways would refuse is refused here, before any gateway or rank starts.
    if (f->role.empty()) {
      for (const std::string& codec : allreduce::SplitCodecs(f->codec)) {
        if (auto parsed = localproto::ParsePolicyRequest(codec); !parsed.ok()) {
          return UsageError(kCommand, "--codec", parsed.status().message());
        }
      }
    }
    if (!f->gateway.empty()) {
      if (f->region_index < 0 || f->region_index >= f->regions) {
        return UsageError(kCommand, "--region-index",
                          "--gateway needs this region's index, 0 .. " +
                              std::to_string(f->regions - 1) + " (--regions " +
                              std::to_string(f->regions) + ")");
      }
      if (f->shard_index >= f->ranks_per_region) {
        return UsageError(kCommand, "--shard-index",
                          "must be below --ranks-per-region (" +
                              std::to_string(f->ranks_per_region) + ")");
      }
      f->socket = f->gateway;
      f->rank_region = f->region_index;
      f->rank_index = f->shard_index;
      return RunMeshRank(*f);
    }
    if (f->region_index >= 0) return UsageError(kCommand, "--region-index", "goes with --gateway");
    if (shard_index->count() > 0) {
      return UsageError(kCommand, "--shard-index", "goes with --gateway");
    }
    if (f->role == "mesh") return RunMeshRank(*f);
    if (f->role == "ring") return RunRingRank(*f);
    if (f->role == "collnet") return RunCollNetRank(*f);
    if (!f->role.empty()) return UsageError(kCommand, "--rank-role", "mesh, ring or collnet");
    if (!f->collnet.empty()) {
      if (::access(f->collnet.c_str(), R_OK) != 0) {
        return UsageError(kCommand, "--collnet",
                          "cannot read '" + f->collnet +
                              "': give the path of libnccl-net-strait.so (build: plugins/nccl/)");
      }
      for (const std::string& codec : allreduce::SplitCodecs(f->codec)) {
        if (codec.rfind("auto", 0) == 0) {
          return UsageError(kCommand, "--codec",
                            "--collnet rows check results against the codec's error bound, "
                            "which 'auto' does not fix in advance: name the codec");
        }
      }
      // The heads run inside the regions' namespaces, from wherever strait-wanem starts them.
      char resolved[PATH_MAX];
      if (::realpath(f->collnet.c_str(), resolved) != nullptr) f->collnet = resolved;
    }
    // No sweep flag: the one --size. Only one of -b/-e: that one size.
    std::vector<uint64_t> sizes = {f->size};
    if (sweep_given()) {
      const uint64_t b = f->min_bytes != 0 ? f->min_bytes : f->max_bytes;
      const uint64_t e = f->max_bytes != 0 ? f->max_bytes : f->min_bytes;
      if (b == 0) {
        return UsageError(kCommand, "--stepfactor", "needs -b/--minbytes and -e/--maxbytes");
      }
      StatusOr<std::vector<uint64_t>> swept = SweepSizes(b, e, f->step_factor, elem);
      if (!swept.ok()) {
        // The message names the flag.
        std::cerr << "strait-bench " << kCommand << ": " << swept.status().message() << '\n';
        return kExitUsage;
      }
      sizes = *std::move(swept);
    }
    if (f->dial_only >= f->regions) {
      return UsageError(kCommand, "--dial-only",
                        "must name a region, 0 .. " + std::to_string(f->regions - 1));
    }
    if (f->dial_only >= 0 && f->baseline == "ring") {
      return UsageError(kCommand, "--baseline",
                        "the ring baseline's ranks dial into every region, which --dial-only "
                        "forbids; drop one of them");
    }
    if (f->baseline == "ring" && f->dtype != DataType::kFloat32) {
      return UsageError(kCommand, "--baseline",
                        "the ring baseline sums float32 only; drop it or use --dtype float32");
    }
    return RunOrchestrator(*f, sizes, globals);
  };
}


}  // namespace strait::bench

// `strait-bench allreduce`'s report: the human table (nccl-tests-like rows, then the notes
// under them) and the --json object. See allreduce_internal.h.
#include <algorithm>
#include <cstdio>
#include <functional>
#include <sstream>

#include "bench/allreduce_internal.h"
#include "bench/allreduce_sweep.h"
#include "common/units.h"
#include "tools/cli/cli.h"

namespace strait::bench::allreduce {

namespace {

std::string WeightsText(const std::vector<uint64_t>& w) {
  if (w.empty()) return "equal";
  std::string t;
  for (size_t i = 0; i < w.size(); ++i) {
    if (i > 0) t += ':';
    t += std::to_string(w[i]);
  }
  return t;
}

const RunResult* FindRun(const Report& rep, const std::string& codec, const std::string& shards,
                         uint64_t size) {
  for (const RunResult& r : rep.runs) {
    if (r.algorithm == "mesh" && r.codec == codec && r.shards == shards && r.size == size) {
      return &r;
    }
  }
  return nullptr;
}

// The rows of one size, in run order (mesh rows, then the ring).
std::vector<const RunResult*> RowsOf(const Report& rep, uint64_t size) {
  std::vector<const RunResult*> rows;
  for (const RunResult& r : rep.runs) {
    if (r.size == size) rows.push_back(&r);
  }
  return rows;
}

// "4 KiB", "64 MiB" for whole binary units, else FormatBytes ("1.50 MiB").
std::string SizeText(uint64_t bytes) {
  static constexpr const char* kNames[] = {"B", "KiB", "MiB", "GiB"};
  int i = 0;
  uint64_t v = bytes;
  while (i < 3 && v >= 1024 && v % 1024 == 0) {
    v /= 1024;
    ++i;
  }
  return i > 0 || bytes < 1024 ? std::to_string(v) + " " + kNames[i] : FormatBytes(bytes);
}

// The emulated round-trip time: the largest delay(i>j) + delay(j>i) over the pairs.
double RttSeconds(const wanem::LinkTable& t) {
  double rtt = 0;
  for (int i = 0; i < t.regions; ++i) {
    for (int j = 0; j < t.regions; ++j) {
      if (i != j) {
        rtt = std::max(rtt, static_cast<double>(t.at(i, j).delay_ns + t.at(j, i).delay_ns) / 1e9);
      }
    }
  }
  return rtt;
}

// One gateway's time per op split the way --phases prints it, in ms: encode; waiting for
// frames (from the slowest region, and those still in flight); the rest of the cross-region
// all-reduce (on the wire and not overlapped with the others: sends queued behind the link,
// the commit round); reduce (decoding frames into the accumulator); decode (of results); the
// local hand-over (the request minus the all-reduce: admission, the local socket, copies).
// The codec and wait counters are summed over the op's two threads, so the rest is floored
// at 0.
struct Phases {
  double encode, wait, wire, reduce, decode, handover, allreduce, handle;
  double region_scatter, region_gather;  // CollNet's region phases (0 in library mode)
};
Phases PhasesOf(const GatewayTimes& g) {
  Phases p{};
  p.encode = g.Get("encode");
  p.wait = g.Get("wait");
  p.reduce = g.Get("reduce");
  p.decode = g.Get("decode");
  p.allreduce = g.Get("allreduce");
  p.region_scatter = g.Get("region_scatter");
  p.region_gather = g.Get("region_gather");
  p.handle = g.Get("handle");
  p.wire = std::max(0.0, p.allreduce - p.encode - p.wait - p.reduce - p.decode - g.Get("ack_wait") -
                             p.region_scatter - p.region_gather);
  p.handover = std::max(0.0, p.handle - p.allreduce);
  return p;
}

// Small messages: at most this many bytes, their time is held to 2 x RTT.
constexpr uint64_t kSmallMessageBytes = 64 * 1024;

struct Spread {
  double min = 0, median = 0, max = 0;
};

// Lowest, median (the mean of the middle two for an even count) and highest of `v`.
Spread SpreadOf(std::vector<double> v) {
  if (v.empty()) return {};
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  const double median = n % 2 == 1 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
  return {v.front(), median, v.back()};
}

double AlgBw(const RunResult& r) {
  return static_cast<double>(r.size) / r.time_s / 1e9;
}
double BusBw(const RunResult& r) {
  return AlgBw(r) * 2.0 * (r.participants - 1) / r.participants;
}

}  // namespace

// DESIGN "Performance model": T >= 2L + 2S(n-1)/(n r B), for equal links.
double LinkBound(const Setup& s, int n, double bytes, double ratio) {
  const wanem::LinkParams& p = s.table.at(0, n > 1 ? 1 : 0);
  const double b = static_cast<double>(p.rate_bps) / 8.0;
  if (b <= 0 || ratio <= 0) return 0;
  return 2.0 * static_cast<double>(p.delay_ns) / 1e9 + 2.0 * bytes * (n - 1) / (n * ratio * b);
}

// --codec's entries: '/' separates them, since a policy itself may hold commas ("int8,noef").
std::vector<std::string> SplitCodecs(const std::string& text) {
  std::vector<std::string> out;
  size_t at = 0;
  while (at <= text.size()) {
    const size_t slash = std::min(text.find('/', at), text.size());
    if (slash > at) out.push_back(text.substr(at, slash - at));
    at = slash + 1;
  }
  return out;
}

std::string FormatTable(const Report& rep) {
  const Flags& f = rep.flags;
  const char* type = NcclTestsTypeName(f.dtype);
  const size_t elem = DataTypeSize(f.dtype);
  const bool sweep = rep.sizes.size() > 1;
  std::ostringstream o;
  char line[512];
  o << "# strait-bench allreduce: " << f.regions << " regions x " << f.ranks_per_region
    << " ranks, " << DataTypeName(f.dtype) << " sum, " << f.iters << " iterations after "
    << f.warmup << " warm-up";
  if (sweep) {
    o << ", sizes " << SizeText(rep.sizes.front()) << " to " << SizeText(rep.sizes.back())
      << " x " << f.step_factor << " on the same gateways";
  }
  o << '\n';
  o << "# " << CpuModelName() << ", " << UtcTimestamp() << '\n';
  if (rep.setup.emulated) {
    if (rep.links_equal) {
      wanem::LinkParams every = rep.setup.table.at(0, 1);
      every.drop_syn = false;  // --dial-only's firewall has a line of its own
      o << "# links: strait-wanem, every pair " << every.ToString() << '\n';
    } else {
      o << "# links: strait-wanem, per directed pair:\n";
      for (int i = 0; i < f.regions; ++i) {
        for (int j = 0; j < f.regions; ++j) {
          if (i != j)
            o << "#   r" << i << " > r" << j << ": " << rep.setup.table.at(i, j).ToString() << '\n';
        }
      }
    }
  } else {
    o << "# links: 127.0.0.1 loopback, NOT emulated (" << rep.setup.why_loopback
      << "): the link bound does not apply\n";
  }
  o << "# gateway links: " << (rep.setup.tls ? "TLS 1.3 (throwaway CA)" : "plain TCP")
    << (!f.collnet.empty() && f.region_links == "plain"
            ? " (CollNet's region links: plain TCP, [region_links])"
            : "")
    << ", "
    << f.streams << (f.streams == 1 ? " stream" : " streams")
    << (f.adapt_streams ? " at first, adaptive" : ", fixed")
    << ", congestion control " << (f.cc.empty() ? "the system's" : f.cc)
    << (rep.setup.emulated
            ? (f.pace ? ", paced at each pair's rate / gateways per region" : ", unpaced")
            : "")
    << (f.chunk_elements != 0
            ? ", chunks of " + std::to_string(f.chunk_elements) + " elements"
            : ", chunks by op (straitd's rule: " + std::to_string(collective::kLargeOpChunkElements) +
                  " elements for lossy ops of " + std::to_string(collective::kLargeOpElements) +
                  " or more, else " + std::to_string(collective::kDefaultChunkElements) + ")")
    << "; the ring baseline is plain TCP between the ranks\n";
  if (f.dial_only >= 0) {
    o << "# r" << f.dial_only << " is behind NAT (--dial-only): no connection into it "
      << (rep.setup.emulated ? "completes (strait-wanem syn=drop)" : "is made")
      << ", its straitds dial every link\n";
  }
  o << "# sidecar mode: rank i of each region all-reduces its 1/" << f.ranks_per_region
    << " slice through the straitd of shard i ("
    << (f.straitds.empty() ? "one straitd per rank"
                           : "--straitds-per-region " + f.straitds +
                                 ": a straitd serves ranks-per-region/N shards on shared links")
    << "); the shard-i gateways form the mesh. "
    << (f.zero_copy ? "Each rank's slice lives in its straitd's shared region (--zero-copy)"
                    : "Each rank copies its slice into its straitd's shared region and the "
                      "result out per call (--zero-copy: neither)")
    << ". No NCCL here: the intra-region reduce-scatter/all-gather are not run.\n";
  o << "# busbw = algbw x 2(n-1)/n with n = regions (mesh) or all ranks (ring); floor: the "
       "per-pair floor of the row's split (below); busy: emulated links' mean use\n";
  std::snprintf(line, sizeof(line),
                "%-30s %12s %11s %8s %6s %10s %9s %9s %9s %7s %5s %7s %10s %7s %9s %9s %s\n",
                "#run", "size", "count", "type", "redop", "time(ms)", "algbw", "busbw",
                "floor(ms)", "t/floor", "busy", "drops", "maxerr", "#wrong", "bound(ms)",
                "meas/bnd", "identical");
  o << line;
  std::snprintf(line, sizeof(line),
                "%-30s %12s %11s %8s %6s %10s %9s %9s %9s %7s %5s %7s %10s %7s %9s %9s\n", "#",
                "(B)", "(elements)", "", "", "", "(GB/s)", "(GB/s)", "", "", "", "(pkts)", "", "",
                "", "");
  o << line;
  for (const uint64_t size : rep.sizes) {
    for (const RunResult* r : RowsOf(rep, size)) {
      char bound_text[32] = "n/a", ratio_text[32] = "n/a", floor_text[32] = "n/a",
           tfloor_text[32] = "n/a", busy_text[32] = "n/a", drops_text[32] = "n/a";
      if (rep.setup.emulated && r->bound_s > 0) {
        std::snprintf(bound_text, sizeof(bound_text), "%.1f", r->bound_s * 1e3);
        std::snprintf(ratio_text, sizeof(ratio_text), "%.2f", r->time_s / r->bound_s);
      }
      if (rep.setup.emulated && r->floor_s > 0) {
        std::snprintf(floor_text, sizeof(floor_text), "%.1f", r->floor_s * 1e3);
        std::snprintf(tfloor_text, sizeof(tfloor_text), "%.2f", r->time_s / r->floor_s);
      }
      if (rep.setup.emulated) {
        std::snprintf(busy_text, sizeof(busy_text), "%.0f%%", r->link_use_mean * 100);
        std::snprintf(drops_text, sizeof(drops_text), "%llu",
                      static_cast<unsigned long long>(r->link_drops));
      }
      std::snprintf(line, sizeof(line),
                    "%-30s %12llu %11llu %8s %6s %10.1f %9.4f %9.4f %9s %7s %5s %7s %10.3g %7llu "
                    "%9s %9s %s\n",
                    r->label.c_str(), static_cast<unsigned long long>(size),
                    static_cast<unsigned long long>(size / elem), type, "sum", r->time_s * 1e3,
                    AlgBw(*r), BusBw(*r), floor_text, tfloor_text, busy_text, drops_text,
                    r->max_error, static_cast<unsigned long long>(r->wrong), bound_text,
                    ratio_text, r->identical ? "yes" : "NO");
      o << line;
    }
  }
  for (const uint64_t size : rep.sizes) {
    for (const RunResult* rp : RowsOf(rep, size)) {
      const RunResult& r = *rp;
      const std::string label = sweep ? r.label + " @ " + SizeText(size) : r.label;
      if (r.shards.empty()) {
        std::snprintf(line, sizeof(line), "# %s:", label.c_str());
      } else {
        std::snprintf(
            line, sizeof(line), "# %s: policy %s, shard weights %s, codec ratio on the wire %.2f,",
            label.c_str(), r.policy.c_str(), WeightsText(r.weights).c_str(), r.codec_ratio);
      }
      o << line;
      if (rep.setup.emulated && r.floor_s > 0) {
        std::snprintf(line, sizeof(line), " per-pair floor %.1f ms, measured/floor %.2f;",
                      r.floor_s * 1e3, r.time_s / r.floor_s);
        o << line;
      }
      if (r.iteration_s.size() > 1) {
        const Spread s = SpreadOf(r.iteration_s);
        std::snprintf(line, sizeof(line), " iterations min/median/max %.1f/%.1f/%.1f ms",
                      s.min * 1e3, s.median * 1e3, s.max * 1e3);
        o << line;
        if (rep.setup.emulated && r.floor_s > 0) {
          std::snprintf(line, sizeof(line), " (%.2f/%.2f/%.2f x floor)", s.min / r.floor_s,
                        s.median / r.floor_s, s.max / r.floor_s);
          o << line;
        }
        o << ';';
      }
      if (rep.setup.emulated) {
        std::snprintf(line, sizeof(line),
                      " links busy %.0f%% (least %.0f%%), %llu packets dropped",
                      r.link_use_mean * 100, r.link_use_min * 100,
                      static_cast<unsigned long long>(r.link_drops));
        o << line;
      }
      o << '\n';
      if (!r.gateway_ms.empty()) {
        auto ms = [&](const char* key) {
          for (const auto& [k, v] : r.gateway_ms) {
            if (k == key) return v;
          }
          return 0.0;
        };
        std::snprintf(line, sizeof(line),
                      "#   per iteration, mean of the %d shards' gateways: request %.1f ms (the rest of "
                      "the rank's time: local socket and copies), of it all-reduce %.1f; both "
                      "threads' encode %.1f, decode+reduce %.1f, decode results %.1f, waiting "
                      "for frames %.1f; then waiting for acks %.1f\n",
                      f.regions * f.ranks_per_region, ms("handle"), ms("allreduce"),
                      ms("encode"), ms("reduce"), ms("decode"), ms("wait"), ms("ack_wait"));
        o << line;
      }
    }
  }
  if (rep.setup.emulated) {
    if (rep.links_equal) {
      o << "# link bound: T >= 2L + 2S(n-1)/(n r B), L one-way delay, B one directed link; the "
           "ring row is held to the uncompressed mesh bound (r = 1)\n";
    } else {
      o << "# unequal links: DESIGN's bound assumes equal links, so bound = the per-pair floor "
           "of each row's split (the ring row: even split, r = 1)\n";
    }
    o << "# per-pair floor (every directed pair has its own rate on strait-wanem; link j>i "
         "carries owner i's shard and owner j's result): 2 max L + max (s_i + s_j) S / (r B_ji)\n";
  }
  // Small messages: latency, held to two round trips (reduce-scatter and all-gather each cross
  // a link once; the commit round is one more exchange).
  bool small_header = false;
  const double rtt = rep.setup.emulated ? RttSeconds(rep.setup.table) : 0;
  for (const uint64_t size : rep.sizes) {
    if (size > kSmallMessageBytes) continue;
    for (const RunResult* r : RowsOf(rep, size)) {
      if (!small_header) {
        o << "# small messages (<= 64 KiB): time against 2 x RTT, RTT = 2 x the emulated one-way "
             "delay (the largest pair's)\n";
        small_header = true;
      }
      if (rtt > 0) {
        std::snprintf(line, sizeof(line), "#   %s, %s: %.1f ms = %.2f x (2 x RTT %.0f ms)\n",
                      r->label.c_str(), SizeText(size).c_str(), r->time_s * 1e3,
                      r->time_s / (2 * rtt), 2 * rtt * 1e3);
      } else {
        std::snprintf(line, sizeof(line),
                      "#   %s, %s: %.1f ms (not emulated: no RTT to compare with)\n",
                      r->label.c_str(), SizeText(size).c_str(), r->time_s * 1e3);
      }
      o << line;
    }
  }
  // One table per row of the report under a "# <row>:" heading; `table` gives its rows after
  // the header, none to leave the row out.
  using Rows = std::vector<std::vector<std::string>>;
  auto per_row = [&](const std::vector<std::string>& header,
                     const std::function<Rows(const RunResult&)>& table) {
    for (const uint64_t size : rep.sizes) {
      for (const RunResult* r : RowsOf(rep, size)) {
        Rows rows = table(*r);
        if (rows.empty()) continue;
        rows.insert(rows.begin(), header);
        o << "# " << r->label << (sweep ? " @ " + SizeText(size) : "") << ":\n";
        o << AlignColumns(rows, 2);
      }
    }
  };
  if (f.phases) {
    o << "# phases per op and gateway (ms, straitd's stats counters over the measured "
         "iterations): encode; wait = waiting for frames (the slowest region's, and those still "
         "in flight); wire = the all-reduce minus the other phases (transfer not overlapped "
         "with them, and the commit round; codec and wait counters add the op's two threads, "
         "so it is floored at 0); reduce = frames decoded into the sum; decode = results "
         "decoded; hand-over = the request minus the all-reduce (admission, local socket, "
         "copies); rank call = the rank's AllReduce call (the request, and the rank's copies "
         "into and out of the shared region unless --zero-copy); region rs / region ag = "
         "CollNet's reduce-scatter and all-gather among the region's gateways, around the "
         "all-reduce (0 in library mode)\n";
    per_row({"#", "gateway", "encode", "wait", "wire", "reduce", "decode", "hand-over",
             "all-reduce", "request", "rank call", "region rs", "region ag"},
            [](const RunResult& r) {
              Rows rows;
              for (const GatewayTimes& g : r.gateways) {
                const Phases p = PhasesOf(g);
                rows.push_back({"#", "r" + std::to_string(g.region) + "." + std::to_string(g.index),
                                Fixed(p.encode, 1), Fixed(p.wait, 1), Fixed(p.wire, 1),
                                Fixed(p.reduce, 1), Fixed(p.decode, 1), Fixed(p.handover, 1),
                                Fixed(p.allreduce, 1), Fixed(p.handle, 1),
                                Fixed(g.rank_call_ms, 1), Fixed(p.region_scatter, 1),
                                Fixed(p.region_gather, 1)});
              }
              return rows;
            });
  }
  if (f.phases && rep.setup.emulated) {
    o << "# links per directed pair over the measured iterations: busy = delivered / (rate x "
         "window); drops by cause (tail drop when the queue is full, the model's loss, the "
         "per-flow policer); peak backlog = the most bytes seen waiting, beside the queue's "
         "limit\n";
    per_row({"#", "pair", "busy", "MB", "queue full", "lost", "policed", "peak backlog KB",
             "queue KB"},
            [](const RunResult& r) {
              Rows rows;
              for (const RunResult::PairUse& p : r.pairs) {
                rows.push_back({"#", std::to_string(p.src) + ">" + std::to_string(p.dst),
                                Fixed(p.busy * 100, 0) + "%",
                                Fixed(static_cast<double>(p.delivered_bytes) / 1e6, 1),
                                std::to_string(p.queue_full), std::to_string(p.lost),
                                std::to_string(p.policed),
                                Fixed(static_cast<double>(p.peak_backlog_bytes) / 1e3, 0),
                                Fixed(static_cast<double>(p.queue_limit_bytes) / 1e3, 0)});
              }
              return rows;
            });
  }
  // Straggler detection (straitd's slow_peers): printed whenever a gateway names a peer, which
  // on equal emulated links means something other than the links held the run back.
  for (const uint64_t size : rep.sizes) {
    for (const RunResult* r : RowsOf(rep, size)) {
      for (const GatewayTimes& g : r->gateways) {
        if (g.slow_peers.empty()) continue;
        o << "# slow peers (" << r->label << (sweep ? " @ " + SizeText(size) : "") << "): r"
          << g.region << "." << g.index << " names " << g.slow_peers << "\n";
      }
    }
  }
  for (const uint64_t size : rep.sizes) {
    const std::string at = sweep ? " @ " + SizeText(size) : "";
    for (const std::string& codec : SplitCodecs(f.codec)) {
      const RunResult* even = FindRun(rep, codec, "even", size);
      for (const char* mode : {"weighted", "balanced", "measured"}) {
        const RunResult* other = FindRun(rep, codec, mode, size);
        if (even == nullptr || other == nullptr) continue;
        std::snprintf(line, sizeof(line), "# %s%s: even / %s shards time: %.2fx", codec.c_str(),
                      at.c_str(), mode, even->time_s / other->time_s);
        o << line;
        if (rep.setup.emulated) {
          std::snprintf(line, sizeof(line), " (floors: %.2fx)", even->floor_s / other->floor_s);
          o << line;
        }
        o << '\n';
      }
    }
    // CollNet against library mode on the same gateways and links (issue #16's goal: <= 1.2x).
    for (const RunResult* r : RowsOf(rep, size)) {
      if (r->algorithm != "collnet") continue;
      const RunResult* mesh = FindRun(rep, r->codec, r->shards, size);
      if (mesh == nullptr) continue;
      std::snprintf(line, sizeof(line), "# %s%s / %s time: %.2fx (library mode's time, same links)\n",
                    r->label.c_str(), at.c_str(), mesh->label.c_str(), r->time_s / mesh->time_s);
      o << line;
    }
    const std::vector<const RunResult*> rows = RowsOf(rep, size);
    if (!rows.empty() && rows.back()->shards.empty()) {
      const RunResult& ring = *rows.back();
      for (const RunResult* r : rows) {
        if (r->shards.empty()) continue;
        std::snprintf(line, sizeof(line), "# ring baseline / %s%s time: %.2fx\n",
                      r->label.c_str(), at.c_str(), ring.time_s / r->time_s);
        o << line;
      }
    }
  }
  return o.str();
}

namespace {

Json RunJson(const Report& rep, const RunResult& r) {
  const bool emulated = rep.setup.emulated;
  Json x;
  x["name"] = r.label;
  if (r.straitds_per_region > 0) x["straitds_per_region"] = r.straitds_per_region;
  x["algorithm"] = r.algorithm;
  x["codec"] = r.codec;
  x["shards"] = r.shards.empty() ? Json(nullptr) : Json(r.shards);
  x["shard_weights"] = r.weights;
  x["policy"] = r.policy;
  x["size_bytes"] = r.size;
  x["count"] = r.size / DataTypeSize(rep.flags.dtype);
  x["time_s"] = r.time_s;
  x["iteration_s"] = r.iteration_s;
  if (!r.iteration_s.empty()) {
    const Spread s = SpreadOf(r.iteration_s);
    x["time_min_s"] = s.min;
    x["time_median_s"] = s.median;
    x["time_max_s"] = s.max;
  }
  x["algbw_gbs"] = AlgBw(r);
  x["busbw_gbs"] = BusBw(r);
  x["max_error"] = r.max_error;
  x["wrong"] = r.wrong;
  x["identical"] = r.identical;
  x["codec_ratio"] = r.codec_ratio;
  x["wan_bytes_per_iter"] = r.wan_bytes_per_iter;
  x["region_wan_bytes_per_iter"] = r.region_wan_bytes_per_iter;
  x["bound_s"] = emulated && r.bound_s > 0 ? Json(r.bound_s) : Json(nullptr);
  x["measured_over_bound"] =
      emulated && r.bound_s > 0 ? Json(r.time_s / r.bound_s) : Json(nullptr);
  x["floor_s"] = emulated && r.floor_s > 0 ? Json(r.floor_s) : Json(nullptr);
  x["measured_over_floor"] =
      emulated && r.floor_s > 0 ? Json(r.time_s / r.floor_s) : Json(nullptr);
  x["link_busy_mean"] = emulated ? Json(r.link_use_mean) : Json(nullptr);
  x["link_busy_min"] = emulated ? Json(r.link_use_min) : Json(nullptr);
  x["link_drops"] = emulated ? Json(r.link_drops) : Json(nullptr);
  Json pairs = Json::array();
  for (const RunResult::PairUse& p : r.pairs) {
    Json y;
    y["src"] = p.src;
    y["dst"] = p.dst;
    y["busy"] = p.busy;
    y["delivered_bytes"] = p.delivered_bytes;
    y["drops_queue_full"] = p.queue_full;
    y["drops_lost"] = p.lost;
    y["drops_policed"] = p.policed;
    y["peak_backlog_bytes"] = p.peak_backlog_bytes;
    y["queue_limit_bytes"] = p.queue_limit_bytes;
    pairs.push_back(y);
  }
  x["link_pairs"] = emulated ? pairs : Json(nullptr);
  if (r.size <= kSmallMessageBytes) {
    const double rtt = emulated ? RttSeconds(rep.setup.table) : 0;
    Json sm;
    sm["rtt_s"] = rtt > 0 ? Json(rtt) : Json(nullptr);
    sm["over_2rtt"] = rtt > 0 ? Json(r.time_s / (2 * rtt)) : Json(nullptr);
    x["small_message"] = sm;
  }
  Json g = Json::object();
  for (const auto& [k, v] : r.gateway_ms) g[k] = v;
  x["gateway_ms_per_iter"] = g;
  Json phases = Json::array();
  for (const GatewayTimes& t : r.gateways) {
    const Phases p = PhasesOf(t);
    Json y;
    y["region"] = t.region;
    y["index"] = t.index;
    y["encode_ms"] = p.encode;
    y["wait_ms"] = p.wait;
    y["wire_ms"] = p.wire;
    y["reduce_ms"] = p.reduce;
    y["decode_ms"] = p.decode;
    y["handover_ms"] = p.handover;
    y["allreduce_ms"] = p.allreduce;
    y["request_ms"] = p.handle;
    y["rank_call_ms"] = t.rank_call_ms;
    y["region_scatter_ms"] = p.region_scatter;
    y["region_gather_ms"] = p.region_gather;
    y["slow_peers"] = t.slow_peers;
    phases.push_back(y);
  }
  x["gateway_phases_ms"] = phases;
  return x;
}

// Each CollNet row's time / library mode's (the mesh row of its codec and split), by codec;
// null without CollNet rows.
Json CollNetOverMesh(const Report& rep, const std::vector<const RunResult*>& rows) {
  Json out = Json::object();
  for (const RunResult* r : rows) {
    if (r->algorithm != "collnet") continue;
    const RunResult* mesh = FindRun(rep, r->codec, r->shards, r->size);
    if (mesh != nullptr) out[r->codec] = r->time_s / mesh->time_s;
  }
  return out.empty() ? Json(nullptr) : out;
}

// ring baseline time / the first mesh row's, among `rows` (one size); null without a ring.
Json BaselineOverMesh(const std::vector<const RunResult*>& rows) {
  const bool ring = !rows.empty() && rows.back()->shards.empty();
  return ring && rows.size() > 1 ? Json(rows.back()->time_s / rows[0]->time_s) : Json(nullptr);
}

}  // namespace

std::string FormatJson(const Report& rep) {
  const Flags& f = rep.flags;
  const uint64_t first = rep.sizes.empty() ? f.size : rep.sizes.front();
  const std::vector<const RunResult*> first_rows = RowsOf(rep, first);
  Json j;
  cli::SetReportHeader(j, kToolName);
  j["command"] = kCommand;
  j["cpu"] = CpuModelName();
  j["regions"] = f.regions;
  j["ranks_per_region"] = f.ranks_per_region;
  // size_bytes, count, codec_ratio, mesh_pair_floor_s, runs and baseline_over_mesh are the first
  // size's, for readers of the single-size form; "sizes" holds one object per size.
  j["size_bytes"] = first;
  j["count"] = first / DataTypeSize(f.dtype);
  j["type"] = NcclTestsTypeName(f.dtype);
  j["dtype"] = DataTypeName(f.dtype);
  j["redop"] = "sum";
  j["codec"] = f.codec;
  j["iters"] = f.iters;
  j["warmup"] = f.warmup;
  j["emulated"] = rep.setup.emulated;
  j["transport"] = rep.setup.tls ? "tls" : "plain";
  if (f.dial_only >= 0) j["dial_only_region"] = f.dial_only;
  j["streams"] = f.streams;
  j["adapt_streams"] = f.adapt_streams;
  j["congestion_control"] = f.cc.empty() ? Json(nullptr) : Json(f.cc);
  j["zero_copy"] = f.zero_copy;
  j["region_links"] = f.collnet.empty() ? Json(nullptr) : Json(f.region_links);
  j["paced"] = rep.setup.emulated && f.pace;
  // null: straitd's rule by op (collective::ChunkElementsFor).
  j["chunk_elements"] = f.chunk_elements != 0 ? Json(f.chunk_elements) : Json(nullptr);
  j["links_equal"] = rep.links_equal;
  j["link"] = rep.setup.emulated ? Json(rep.setup.table.at(0, 1).ToString()) : Json(nullptr);
  j["rtt_s"] = rep.setup.emulated ? Json(RttSeconds(rep.setup.table)) : Json(nullptr);
  Json pairs = Json::array();
  for (int a = 0; a < f.regions && rep.setup.emulated; ++a) {
    for (int b = 0; b < f.regions; ++b) {
      if (a == b) continue;
      Json p;
      p["src"] = a;
      p["dst"] = b;
      p["link"] = rep.setup.table.at(a, b).ToString();
      p["rate_bps"] = rep.setup.table.at(a, b).rate_bps;
      pairs.push_back(p);
    }
  }
  j["pairs"] = pairs;
  j["loopback_reason"] = rep.setup.emulated ? Json(nullptr) : Json(rep.setup.why_loopback);
  j["mode"] = "sidecar: rank i of each region all-reduces its slice through its own straitd";
  // The first mesh row's, for readers of the single-codec form.
  j["codec_ratio"] = first_rows.empty() ? 0.0 : first_rows[0]->codec_ratio;
  j["mesh_pair_floor_s"] =
      rep.setup.emulated && !first_rows.empty() ? Json(first_rows[0]->floor_s) : Json(nullptr);
  Json runs = Json::array();
  for (const RunResult* r : first_rows) runs.push_back(RunJson(rep, *r));
  j["runs"] = runs;
  j["baseline_over_mesh"] = BaselineOverMesh(first_rows);
  j["collnet_over_mesh"] = CollNetOverMesh(rep, first_rows);
  Json sizes = Json::array();
  for (const uint64_t size : rep.sizes) {
    const std::vector<const RunResult*> rows = RowsOf(rep, size);
    Json s;
    s["size_bytes"] = size;
    s["count"] = size / DataTypeSize(f.dtype);
    Json size_runs = Json::array();
    for (const RunResult* r : rows) size_runs.push_back(RunJson(rep, *r));
    s["runs"] = size_runs;
    s["baseline_over_mesh"] = BaselineOverMesh(rows);
    s["collnet_over_mesh"] = CollNetOverMesh(rep, rows);
    sizes.push_back(s);
  }
  j["sizes"] = sizes;
  return j.dump(2) + "\n";
}

}  // namespace strait::bench::allreduce

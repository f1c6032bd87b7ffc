// `strait-bench allreduce`'s report: the human table (nccl-tests-like rows, then the notes
// under them) and the --json object. See allreduce_internal.h.
#include <algorithm>
#include <cstdio>
#include <sstream>

#include "bench/allreduce_internal.h"
#include "tools/cli/cli.h"

namespace strait::bench::allreduce {

namespace {

std::string WeightsText(const std::vector<uint64_t>& w) {
  if (w.empty()) return "equal";
  std::string t;
  for (size_t i = 0; i < w.size(); ++i) t += (i ? ":" : "") + std::to_string(w[i]);
  return t;
}

const RunResult* FindRun(const Report& rep, const std::string& codec, const std::string& shards) {
  for (const RunResult& r : rep.runs) {
    if (r.codec == codec && r.shards == shards) return &r;
  }
  return nullptr;
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
  std::ostringstream o;
  char line[512];
  o << "# strait-bench allreduce: " << f.regions << " regions x " << f.ranks_per_region
    << " ranks, fp32 sum, " << f.iters << " iterations after " << f.warmup << " warm-up\n";
  o << "# " << CpuModelName() << ", " << UtcTimestamp() << '\n';
  if (rep.setup.emulated) {
    if (rep.links_equal) {
      o << "# links: strait-wanem, every pair " << rep.setup.table.at(0, 1).ToString() << '\n';
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
  o << "# gateway links: " << (rep.setup.tls ? "TLS 1.3 (throwaway CA)" : "plain TCP") << ", "
    << f.streams << (f.streams == 1 ? " stream" : " streams")
    << (f.adapt_streams ? " at first, adaptive" : ", fixed")
    << ", congestion control " << (f.cc.empty() ? "the system's" : f.cc)
    << "; the ring baseline is plain TCP between the ranks\n";
  o << "# sidecar mode: rank i of each region all-reduces its 1/" << f.ranks_per_region
    << " slice through its own straitd (shard i); the straitds of shard i form the mesh. No "
       "NCCL here: the intra-region reduce-scatter/all-gather are not run.\n";
  o << "# busbw = algbw x 2(n-1)/n with n = regions (mesh) or all ranks (ring)\n";
  std::snprintf(line, sizeof(line), "%-30s %12s %11s %6s %6s %10s %9s %9s %10s %7s %9s %9s %s\n",
                "#run", "size", "count", "type", "redop", "time(ms)", "algbw", "busbw", "maxerr",
                "#wrong", "bound(ms)", "meas/bnd", "identical");
  o << line;
  std::snprintf(line, sizeof(line), "%-30s %12s %11s %6s %6s %10s %9s %9s %10s %7s %9s %9s\n", "#",
                "(B)", "(elements)", "", "", "", "(GB/s)", "(GB/s)", "", "", "", "");
  o << line;
  for (const RunResult& r : rep.runs) {
    const double algbw = static_cast<double>(f.size) / r.time_s / 1e9;
    const double busbw = algbw * 2.0 * (r.participants - 1) / r.participants;
    char bound_text[32] = "n/a", ratio_text[32] = "n/a";
    if (rep.setup.emulated && r.bound_s > 0) {
      std::snprintf(bound_text, sizeof(bound_text), "%.1f", r.bound_s * 1e3);
      std::snprintf(ratio_text, sizeof(ratio_text), "%.2f", r.time_s / r.bound_s);
    }
    std::snprintf(line, sizeof(line),
                  "%-30s %12llu %11llu %6s %6s %10.1f %9.4f %9.4f %10.3g %7llu %9s %9s %s\n",
                  r.label.c_str(), static_cast<unsigned long long>(f.size),
                  static_cast<unsigned long long>(f.size / 4), "float", "sum", r.time_s * 1e3,
                  algbw, busbw, r.max_error, static_cast<unsigned long long>(r.wrong), bound_text,
                  ratio_text, r.identical ? "yes" : "NO");
    o << line;
  }
  for (const RunResult& r : rep.runs) {
    if (r.shards.empty()) {
      std::snprintf(line, sizeof(line), "# %s:", r.label.c_str());
    } else {
      std::snprintf(
          line, sizeof(line), "# %s: policy %s, shard weights %s, codec ratio on the wire %.2f,",
          r.label.c_str(), r.policy.c_str(), WeightsText(r.weights).c_str(), r.codec_ratio);
    }
    o << line;
    if (rep.setup.emulated && r.floor_s > 0) {
      std::snprintf(line, sizeof(line), " per-pair floor %.1f ms, measured/floor %.2f;",
                    r.floor_s * 1e3, r.time_s / r.floor_s);
      o << line;
    }
    if (rep.setup.emulated) {
      std::snprintf(line, sizeof(line), " links busy %.0f%% (least %.0f%%), %llu packets dropped",
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
                    "#   per iteration, mean of the %d straitds: request %.1f ms (the rest of the "
                    "rank's time: local socket and copies), of it all-reduce %.1f; both threads' "
                    "encode %.1f, decode+reduce %.1f, decode results %.1f, waiting for frames "
                    "%.1f; then waiting for acks %.1f\n",
                    f.regions * f.ranks_per_region, ms("handle"), ms("allreduce"), ms("encode"),
                    ms("reduce"), ms("decode"), ms("wait"), ms("ack_wait"));
      o << line;
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
  for (const std::string& codec : SplitCodecs(f.codec)) {
    const RunResult* even = FindRun(rep, codec, "even");
    for (const char* mode : {"weighted", "balanced", "measured"}) {
      const RunResult* other = FindRun(rep, codec, mode);
      if (even == nullptr || other == nullptr) continue;
      std::snprintf(line, sizeof(line), "# %s: even / %s shards time: %.2fx", codec.c_str(), mode,
                    even->time_s / other->time_s);
      o << line;
      if (rep.setup.emulated) {
        std::snprintf(line, sizeof(line), " (floors: %.2fx)", even->floor_s / other->floor_s);
        o << line;
      }
      o << '\n';
    }
  }
  if (!rep.runs.empty() && rep.runs.back().shards.empty()) {
    const RunResult& ring = rep.runs.back();
    for (const RunResult& r : rep.runs) {
      if (r.shards.empty()) continue;
      std::snprintf(line, sizeof(line), "# ring baseline / %s time: %.2fx\n", r.label.c_str(),
                    ring.time_s / r.time_s);
      o << line;
    }
  }
  return o.str();
}

std::string FormatJson(const Report& rep) {
  const Flags& f = rep.flags;
  Json j;
  cli::SetReportHeader(j, kToolName);
  j["command"] = kCommand;
  j["cpu"] = CpuModelName();
  j["regions"] = f.regions;
  j["ranks_per_region"] = f.ranks_per_region;
  j["size_bytes"] = f.size;
  j["count"] = f.size / 4;
  j["type"] = "float";
  j["redop"] = "sum";
  j["codec"] = f.codec;
  j["iters"] = f.iters;
  j["warmup"] = f.warmup;
  j["emulated"] = rep.setup.emulated;
  j["transport"] = rep.setup.tls ? "tls" : "plain";
  j["streams"] = f.streams;
  j["adapt_streams"] = f.adapt_streams;
  j["congestion_control"] = f.cc.empty() ? Json(nullptr) : Json(f.cc);
  j["links_equal"] = rep.links_equal;
  j["link"] = rep.setup.emulated ? Json(rep.setup.table.at(0, 1).ToString()) : Json(nullptr);
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
  j["codec_ratio"] = rep.runs.empty() ? 0.0 : rep.runs[0].codec_ratio;
  j["mesh_pair_floor_s"] =
      rep.setup.emulated && !rep.runs.empty() ? Json(rep.runs[0].floor_s) : Json(nullptr);
  Json runs = Json::array();
  for (const RunResult& r : rep.runs) {
    const double algbw = static_cast<double>(f.size) / r.time_s / 1e9;
    Json x;
    x["name"] = r.label;
    x["algorithm"] = r.shards.empty() ? "ring" : "mesh";
    x["codec"] = r.codec;
    x["shards"] = r.shards.empty() ? Json(nullptr) : Json(r.shards);
    x["shard_weights"] = r.weights;
    x["policy"] = r.policy;
    x["time_s"] = r.time_s;
    x["algbw_gbs"] = algbw;
    x["busbw_gbs"] = algbw * 2.0 * (r.participants - 1) / r.participants;
    x["max_error"] = r.max_error;
    x["wrong"] = r.wrong;
    x["identical"] = r.identical;
    x["codec_ratio"] = r.codec_ratio;
    x["wan_bytes_per_iter"] = r.wan_bytes_per_iter;
    x["region_wan_bytes_per_iter"] = r.region_wan_bytes_per_iter;
    x["bound_s"] = rep.setup.emulated && r.bound_s > 0 ? Json(r.bound_s) : Json(nullptr);
    x["measured_over_bound"] =
        rep.setup.emulated && r.bound_s > 0 ? Json(r.time_s / r.bound_s) : Json(nullptr);
    x["floor_s"] = rep.setup.emulated && r.floor_s > 0 ? Json(r.floor_s) : Json(nullptr);
    x["link_busy_mean"] = rep.setup.emulated ? Json(r.link_use_mean) : Json(nullptr);
    x["link_busy_min"] = rep.setup.emulated ? Json(r.link_use_min) : Json(nullptr);
    x["link_drops"] = rep.setup.emulated ? Json(r.link_drops) : Json(nullptr);
    Json g = Json::object();
    for (const auto& [k, v] : r.gateway_ms) g[k] = v;
    x["gateway_ms_per_iter"] = g;
    runs.push_back(x);
  }
  j["runs"] = runs;
  const bool ring = !rep.runs.empty() && rep.runs.back().shards.empty();
  j["baseline_over_mesh"] = ring && rep.runs.size() > 1
                                ? Json(rep.runs.back().time_s / rep.runs[0].time_s)
                                : Json(nullptr);
  return j.dump(2) + "\n";
}

}  // namespace strait::bench::allreduce

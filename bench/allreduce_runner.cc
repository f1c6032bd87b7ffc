// `strait-bench allreduce`'s runner: one row of the report, i.e. one rank process per (region,
// index) started, watched with a progress line and folded into a RunResult, with the emulated
// links' router counters sampled meanwhile. See allreduce_internal.h.
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <thread>

#include "bench/allreduce_internal.h"
#include "common/units.h"

namespace strait::bench::allreduce {

namespace {

// Router counters sampled through a run, to tell how busy the emulated links were in the
// measured window (where the time goes: a link that idles is time not spent sending) and where
// and when packets were dropped.
class LinkSampler {
 public:
  explicit LinkSampler(const wanem::Emulator* emulator) : emulator_(emulator) {
    if (emulator_ == nullptr) return;
    thread_ = std::thread([this] {
      while (!stop_.load()) {
        Take();
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      }
    });
  }
  ~LinkSampler() { Stop(); }
  void Stop() {
    if (!thread_.joinable()) return;
    stop_.store(true);
    thread_.join();
    Take();
  }
  // Fills the link_* fields and `pairs` of `r` for the window [begin_ns, end_ns).
  void Summarise(const wanem::LinkTable& t, int64_t begin_ns, int64_t end_ns, RunResult* r) const {
    if (samples_.size() < 2 || end_ns <= begin_ns) return;
    const size_t first = At(begin_ns), last = At(end_ns);
    const Sample& a = samples_[first];
    const Sample& b = samples_[last];
    const double secs = static_cast<double>(b.at_ns - a.at_ns) / 1e9;
    if (secs <= 0) return;
    double sum = 0, lowest = 1e300, busiest = 0;
    int used = 0;
    for (size_t k = 0; k < b.links.size(); ++k) {
      busiest = std::max(busiest, static_cast<double>(b.links[k].delivered_bytes -
                                                      a.links[k].delivered_bytes));
    }
    for (int i = 0; i < t.regions; ++i) {
      for (int j = 0; j < t.regions; ++j) {
        if (i == j) continue;
        const size_t k = static_cast<size_t>(i * t.regions + j);
        const Delta d = DeltaOf(a.links[k], b.links[k]);
        RunResult::PairUse p;
        p.src = i;
        p.dst = j;
        p.delivered_bytes = d.delivered_bytes;
        p.queue_full = d.queue_full;
        p.lost = d.lost;
        p.policed = d.policed;
        p.queue_limit_bytes = QueueLimit(t, i, j);
        for (size_t s = first; s <= last; ++s) {
          p.peak_backlog_bytes = std::max(p.peak_backlog_bytes, samples_[s].links[k].backlog_bytes);
        }
        r->link_drops += d.drops();
        const double bytes = static_cast<double>(p.delivered_bytes);
        p.busy = bytes * 8.0 / (RateBps(t, i, j) * secs);
        if (bytes > 0) r->pairs.push_back(p);
        // Pairs that carried only acknowledgements (the ring's backward direction) are not
        // links the algorithm uses.
        if (bytes <= 0.05 * busiest) continue;
        sum += p.busy;
        lowest = std::min(lowest, p.busy);
        ++used;
      }
    }
    if (used == 0) return;
    r->link_use_mean = sum / used;
    r->link_use_min = lowest;
  }

  // Appends this run's samples to the CSV at `path` (its header first when the file is new or
  // empty): per directed pair that moved, what it delivered and dropped since the previous
  // sample, and its backlog. Time is relative to `begin_ns` (the measured window's start).
  Status AppendTrace(const wanem::LinkTable& t, const std::string& path, const std::string& run,
                     int64_t begin_ns, int64_t end_ns) const {
    std::FILE* out = std::fopen(path.c_str(), "a");
    if (out == nullptr) {
      return UnavailableError("--link-trace " + path + ": " + std::strerror(errno) +
                              " (give a writable path)");
    }
    if (std::ftell(out) == 0) {
      std::fputs("run,t_ms,measured,src,dst,delivered_bytes,queue_full,lost,policed,"
                 "backlog_bytes,queue_limit_bytes\n",
                 out);
    }
    const size_t n = static_cast<size_t>(t.regions);
    for (size_t s = 1; s < samples_.size(); ++s) {
      const Sample& a = samples_[s - 1];
      const Sample& b = samples_[s];
      const bool measured = b.at_ns > begin_ns && a.at_ns < end_ns;
      for (size_t k = 0; k < b.links.size(); ++k) {
        const Delta d = DeltaOf(a.links[k], b.links[k]);
        const uint64_t backlog = b.links[k].backlog_bytes;
        if (d.delivered_bytes == 0 && d.drops() == 0 && backlog == 0) continue;
        const int src = static_cast<int>(k / n), dst = static_cast<int>(k % n);
        std::fprintf(out, "%s,%.1f,%d,%d,%d,%llu,%llu,%llu,%llu,%llu,%llu\n", run.c_str(),
                     static_cast<double>(b.at_ns - begin_ns) / 1e6, measured ? 1 : 0, src, dst,
                     static_cast<unsigned long long>(d.delivered_bytes),
                     static_cast<unsigned long long>(d.queue_full),
                     static_cast<unsigned long long>(d.lost),
                     static_cast<unsigned long long>(d.policed),
                     static_cast<unsigned long long>(backlog),
                     static_cast<unsigned long long>(QueueLimit(t, src, dst)));
      }
    }
    const bool failed = std::ferror(out) != 0;
    if (std::fclose(out) != 0 || failed) {
      return UnavailableError("--link-trace " + path + ": write failed (disk full?)");
    }
    return Status::Ok();
  }

 private:
  struct Sample {
    int64_t at_ns = 0;
    std::vector<wanem::LinkStats> links;  // [src * regions + dst]
  };
  // What a directed pair delivered and dropped between two samples.
  struct Delta {
    uint64_t delivered_bytes = 0, queue_full = 0, lost = 0, policed = 0;
    uint64_t drops() const { return queue_full + lost + policed; }
  };
  static Delta DeltaOf(const wanem::LinkStats& from, const wanem::LinkStats& to) {
    auto count = [&](wanem::Verdict v) {
      return to.packets[static_cast<int>(v)] - from.packets[static_cast<int>(v)];
    };
    return {to.delivered_bytes - from.delivered_bytes, count(wanem::Verdict::kQueueFull),
            count(wanem::Verdict::kLost), count(wanem::Verdict::kPoliced)};
  }
  // The pair's tail-drop limit as strait-wanem applies it (0 in the table: one BDP).
  static uint64_t QueueLimit(const wanem::LinkTable& t, int src, int dst) {
    if (src == dst) return 0;
    const wanem::LinkParams& p = t.at(src, dst);
    return p.queue_limit_bytes != 0 ? p.queue_limit_bytes : wanem::DefaultQueueLimit(p);
  }
  void Take() {
    const wanem::RouterStats st = emulator_->Stats();
    Sample s;
    s.at_ns = MonotonicNanos();
    for (int i = 0; i < st.regions; ++i) {
      for (int j = 0; j < st.regions; ++j) {
        s.links.push_back(st.links[static_cast<size_t>(i)][static_cast<size_t>(j)]);
      }
    }
    std::lock_guard<std::mutex> lock(mu_);
    samples_.push_back(std::move(s));
  }
  // The index of the last sample at or before `ns` (the first one if none is).
  size_t At(int64_t ns) const {
    size_t k = 0;
    while (k + 1 < samples_.size() && samples_[k + 1].at_ns <= ns) ++k;
    return k;
  }

  const wanem::Emulator* emulator_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
  mutable std::mutex mu_;
  std::vector<Sample> samples_;
};

}  // namespace

double GatewayTimes::Get(const std::string& key) const {
  for (const auto& [k, v] : ms) {
    if (k == key) return v;
  }
  return 0.0;
}

StatusOr<RunResult> RunRanks(const Flags& f, Cluster& c, const std::string& role,
                             const std::string& codec, const std::string& job,
                             const std::vector<std::string>& extra, ProgressLine* progress) {
  const int n = f.regions, k = f.ranks_per_region;
  std::vector<Proc> ranks;
  const Stopwatch wall;
  // A fresh barrier directory per run (IterationBarrier): the iteration numbers restart.
  static int runs = 0;
  const std::string barrier = c.dir + "/barrier" + std::to_string(++runs);
  if (::mkdir(barrier.c_str(), 0755) != 0) {
    return UnavailableError("cannot create " + barrier + ": " + std::strerror(errno));
  }
  for (int r = 0; r < n; ++r) {
    for (int i = 0; i < k; ++i) {
      const std::string base = c.dir + "/" + role + std::to_string(c.generation) + "_" +
                               std::to_string(r) + "_" + std::to_string(i) + "_" + job;
      std::vector<std::string> argv = {SelfExe(),
                                       kCommand,
                                       "--rank-role",
                                       role,
                                       "--rank-region",
                                       std::to_string(r),
                                       "--rank-index",
                                       std::to_string(i),
                                       "--regions",
                                       std::to_string(n),
                                       "--ranks-per-region",
                                       std::to_string(k),
                                       "--size",
                                       std::to_string(f.size),
                                       "--iters",
                                       std::to_string(f.iters),
                                       "--warmup",
                                       std::to_string(f.warmup),
                                       "--dtype",
                                       f.dtype_name,
                                       "--codec",
                                       codec,
                                       "--timeout",
                                       std::to_string(f.timeout_s),
                                       "--rank-job",
                                       job,
                                       "--rank-socket",
                                       SocketPath(c, r, i),
                                       "--rank-barrier",
                                       barrier};
      argv.insert(argv.end(), extra.begin(), extra.end());
      Proc p{-1, role + " rank r" + std::to_string(r) + "." + std::to_string(i), base + ".out",
             base + ".err"};
      StatusOr<pid_t> pid = Spawn(InRegion(c, r, argv), p.out, p.err);
      if (!pid.ok()) return std::move(pid).status();
      p.pid = *pid;
      ranks.push_back(p);
    }
  }
  const int total_iters = f.warmup + f.iters;
  LinkSampler sampler(c.emulator.get());
  Status failure;
  size_t running = ranks.size();
  const Deadline deadline = Deadline::AfterSeconds(f.timeout_s * total_iters + 120);
  const std::string what = role == "ring" ? role : role + " " + codec;
  while (running > 0) {
    for (Proc& p : ranks) {
      int status = 0;
      if (p.pid > 0 && ::waitpid(p.pid, &status, WNOHANG) == p.pid) {
        p.pid = -1;
        --running;
        if (!(WIFEXITED(status) && WEXITSTATUS(status) == 0) && failure.ok()) {
          failure = UnknownError(p.name + " failed: " + ReadFile(p.err));
        }
      }
    }
    if (g_interrupted && failure.ok()) failure = CancelledError("interrupted");
    if (!failure.ok() || deadline.Expired()) {
      for (Proc& p : ranks) {
        if (p.pid > 0) {
          ::kill(p.pid, SIGKILL);
          ::waitpid(p.pid, nullptr, 0);
        }
      }
      return failure.ok() ? DeadlineExceededError(role + " ranks did not finish in time") : failure;
    }
    int slowest = total_iters;
    for (const Proc& p : ranks) {
      const std::string out = ReadFile(p.out);
      const size_t at = out.rfind("progress ");
      slowest = std::min(slowest, at == std::string::npos ? 0 : std::atoi(out.c_str() + at + 9));
    }
    progress->Update(what + ": " + std::to_string(slowest) + "/" + std::to_string(total_iters) +
                     " iterations (" + std::to_string(f.warmup) + " warm-up), " +
                     FormatDuration(wall.ElapsedNanos()));
    if (running > 0) std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  RunResult res;
  res.codec = codec;
  res.size = f.size;
  res.wall_ns = wall.ElapsedNanos();
  std::vector<int64_t> slowest(static_cast<size_t>(f.iters), 0);
  std::vector<std::string> hashes(static_cast<size_t>(k));
  sampler.Stop();
  uint64_t wan_bytes = 0;
  std::vector<uint64_t> region_bytes(static_cast<size_t>(n), 0);
  int64_t window_begin = INT64_MAX, window_end = 0;
  for (size_t idx = 0; idx < ranks.size(); ++idx) {
    const std::string out = ReadFile(ranks[idx].out);
    const size_t at = out.find("result ");
    if (at == std::string::npos) return UnknownError(ranks[idx].name + " printed no result");
    Json j = Json::parse(out.substr(at + 7), nullptr, false);
    if (j.is_discarded()) return UnknownError(ranks[idx].name + " printed a bad result");
    for (size_t it = 0; it < slowest.size() && it < j["times_ns"].size(); ++it) {
      slowest[it] = std::max(slowest[it], j["times_ns"][it].get<int64_t>());
    }
    if (j.contains("starts_ns") && !j["starts_ns"].empty()) {
      const size_t last = j["starts_ns"].size() - 1;
      window_begin = std::min(window_begin, j["starts_ns"][0].get<int64_t>());
      window_end = std::max(
          window_end, j["starts_ns"][last].get<int64_t>() + j["times_ns"][last].get<int64_t>());
    }
    res.policy = j["policy"].get<std::string>();
    res.max_error = std::max(res.max_error, j["max_error"].get<double>());
    res.wrong += j["wrong"].get<uint64_t>();
    // Mesh: rank i of every region holds the same slice; ring and CollNet: every rank the whole
    // tensor.
    const size_t slot = role == "mesh" ? idx % static_cast<size_t>(k) : 0;
    const std::string h = j["hash"].get<std::string>();
    if (hashes[slot].empty()) hashes[slot] = h;
    res.identical = res.identical && hashes[slot] == h;
    wan_bytes += j["wan_bytes_sent"].get<uint64_t>();
    region_bytes[idx / static_cast<size_t>(k)] += j["wan_bytes_sent"].get<uint64_t>();
    if (j.contains("gateway_ns")) {
      GatewayTimes g;
      g.region = j["region"].get<int>();
      g.index = j["rank"].get<int>();
      for (const char* key : kTimeKeys) {
        std::string name(key);
        name.resize(name.size() - 3);  // "_ns"
        g.ms.emplace_back(name, j["gateway_ns"].value(key, 0.0) / 1e6);
      }
      g.slow_peers = j.value("slow_peers", std::string());
      if (!j["times_ns"].empty()) {
        double total = 0;
        for (const auto& t : j["times_ns"]) total += t.get<double>();
        g.rank_call_ms = total / static_cast<double>(j["times_ns"].size()) / 1e6;
      }
      res.gateways.push_back(std::move(g));
      for (const char* key : kTimeKeys) {
        std::string name(key);
        name.resize(name.size() - 3);  // "_ns"
        auto it = std::find_if(res.gateway_ms.begin(), res.gateway_ms.end(),
                               [&](const auto& kv) { return kv.first == name; });
        if (it == res.gateway_ms.end()) {
          res.gateway_ms.emplace_back(name, 0.0);
          it = res.gateway_ms.end() - 1;
        }
        it->second += j["gateway_ns"].value(key, 0.0) / 1e6 / static_cast<double>(ranks.size());
      }
    }
  }
  double sum = 0;
  for (int64_t t : slowest) sum += static_cast<double>(t);
  res.time_s = sum / std::max(1, f.iters) / 1e9;
  for (int64_t t : slowest) res.iteration_s.push_back(static_cast<double>(t) / 1e9);
  res.wan_bytes_per_iter = wan_bytes / static_cast<uint64_t>(std::max(1, f.iters));
  for (uint64_t b : region_bytes) {
    res.region_wan_bytes_per_iter.push_back(b / static_cast<uint64_t>(std::max(1, f.iters)));
  }
  if (c.emulator) {
    sampler.Summarise(c.table, window_begin, window_end, &res);
    if (!f.link_trace.empty()) {
      // One CSV field: codec lists use commas ("int8,ef").
      std::string run = what + " " + std::to_string(f.size) + "B " + job;
      std::replace(run.begin(), run.end(), ',', '+');
      STRAIT_RETURN_IF_ERROR(sampler.AppendTrace(c.table, f.link_trace, run, window_begin, window_end));
    }
  }
  return res;
}

}  // namespace strait::bench::allreduce

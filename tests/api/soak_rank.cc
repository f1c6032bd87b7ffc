// One rank of the gateway-restart soak (issue 13: "after a gateway restart, steps must never mix
// across regions"): repeated fp32 sum all-reduces through the C API (strait.hpp over
// libstrait.so), each result checked against a reference, a failed call handled the way strait.h
// asks (destroy the comm, create a new one, go on with the next step). Used by
// tests/api/restart_soak_test.cc (3 regions x 1 rank, a straitd SIGKILLed and restarted per
// region) and bench/chaos.sh (the long form with more faults).
//
// Data: element i of rank (region g, rank k) at step s is ((7i + 29s + 13g + 5k) mod 17) - 8, a
// small integer, so every sum is exact in fp32 whatever the reduction order; the first
// kLabelCount elements instead carry the step number s itself (a whole codec block of it, so
// that a lossy codec's block scale is the label and the label survives quantization). A result
// that sums different steps of different ranks shows in element 0 (sum != ranks * s) and in the
// data (which varies with s).
//
// Every call is classified:
//   ok      SUCCESS and the reference (lossless: bit-exact; --lossy: within --lossy-tol)
//   failed  an error code (kept with strait_last_error()); the comm is then re-created
//   mixed   SUCCESS but element 0 is not (regions * nranks) * s: steps of different ranks summed
//   wrong   SUCCESS, element 0 right, but some other element is not the reference (a mix of
//           steps can give the right label by chance, 15 + 14 + 13 = 3 * 14; the data shows it)
// and logged with wall-clock timestamps (Unix ms, so that a test or script can line them up
// with the faults it injects), a 64-bit hash of the result (for --lossy, where the bench checks
// that every rank got the same bits at the same step) and the error message. Nothing here can
// hang: every call runs under the comm's timeout_ms, and a watchdog thread ends the process
// (exit 4, "hang" in the log and the summary) when a call outlives timeout_ms by --hang-grace-s
// or the whole run outlives --watchdog-s.
//
// Usage:
//   soak_rank --region G --regions N [--rank K --nranks M --root HOST:PORT] --gateway SOCKET
//             --job JOB --out PREFIX [--compression none] [--count 1048576] [--timeout-ms 10000]
//             [--duration-s 60] [--steps 0] [--stop-file PATH] [--recovery-deadline-s 60]
//             [--lossy [--lossy-tol 0.75]] [--key soak] [--hang-grace-s 10] [--watchdog-s S]
// Writes PREFIX.log (one line per comm creation and per step, see WriteStep/WriteInit) and, at
// exit, PREFIX.summary ("key value" lines). --stop-file: when the file exists the rank stops
// before the step number written in it (or at once when it holds no number), so that every rank
// of a job can be told to stop after the same step; once it exists, a rank whose call failed, or
// that cannot create a comm, stops too instead of re-creating (its peers may be gone).
// Exit codes: 0 no wrong, mixed or hang (failed calls are allowed: the caller judges them);
// 1 a wrong or mixed result; 2 bad usage; 4 the watchdog fired; 5 no comm could be created
// again within --recovery-deadline-s.
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "strait/strait.hpp"

namespace {

// One int8/int4/fp8 block (the codecs' default block size) of labels: its absmax is the label.
constexpr size_t kLabelCount = 256;
constexpr int kModulus = 17;

int64_t NowMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

struct Options {
  int region = -1;
  int regions = 0;
  int rank = 0;
  int nranks = 1;
  std::string region_name;  // default "r<region>", as tests/gateway/wan_cluster.h names them
  std::string root;
  std::string gateway;
  std::string job;
  std::string compression = "none";
  std::string key = "soak";
  std::string out;
  std::string stop_file;
  size_t count = size_t{1} << 20;  // 4 MiB of fp32, the size of the measured bug
  int timeout_ms = 10000;
  double duration_s = 60;
  int64_t steps = 0;  // 0: no limit
  double recovery_deadline_s = 60;
  bool lossy = false;
  double lossy_tol = 0.75;
  double hang_grace_s = 10;
  double watchdog_s = 0;  // 0: duration + recovery deadline + 2 timeouts + 30 s
};

bool ParseArgs(int argc, char** argv, Options* o) {
  std::map<std::string, std::string> kv;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--lossy") {
      o->lossy = true;
      continue;
    }
    if (a.rfind("--", 0) != 0 || i + 1 >= argc) {
      std::fprintf(stderr, "soak_rank: bad argument '%s'\n", a.c_str());
      return false;
    }
    kv[a.substr(2)] = argv[++i];
  }
  // One setter per flag: the flag names are the whole interface, in one place.
  const auto i32 = [](int* f) { return [f](const std::string& v) { *f = std::stoi(v); }; };
  const auto f64 = [](double* f) { return [f](const std::string& v) { *f = std::stod(v); }; };
  const auto str = [](std::string* f) { return [f](const std::string& v) { *f = v; }; };
  const std::map<std::string, std::function<void(const std::string&)>> setters = {
      {"region", i32(&o->region)},
      {"regions", i32(&o->regions)},
      {"rank", i32(&o->rank)},
      {"nranks", i32(&o->nranks)},
      {"region-name", str(&o->region_name)},
      {"root", str(&o->root)},
      {"gateway", str(&o->gateway)},
      {"job", str(&o->job)},
      {"compression", str(&o->compression)},
      {"key", str(&o->key)},
      {"out", str(&o->out)},
      {"stop-file", str(&o->stop_file)},
      {"count", [o](const std::string& v) { o->count = std::stoull(v); }},
      {"timeout-ms", i32(&o->timeout_ms)},
      {"duration-s", f64(&o->duration_s)},
      {"steps", [o](const std::string& v) { o->steps = std::stoll(v); }},
      {"recovery-deadline-s", f64(&o->recovery_deadline_s)},
      {"lossy-tol", f64(&o->lossy_tol)},
      {"hang-grace-s", f64(&o->hang_grace_s)},
      {"watchdog-s", f64(&o->watchdog_s)},
  };
  try {
    for (const auto& [k, v] : kv) {
      const auto it = setters.find(k);
      if (it == setters.end()) {
        std::fprintf(stderr, "soak_rank: unknown flag --%s\n", k.c_str());
        return false;
      }
      it->second(v);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "soak_rank: bad number: %s\n", e.what());
    return false;
  }
  if (o->region < 0 || o->regions < 1 || o->nranks < 1 || o->rank < 0 || o->rank >= o->nranks ||
      o->gateway.empty() || o->job.empty() || o->out.empty() || o->count <= kLabelCount ||
      o->timeout_ms <= 0 || (o->nranks > 1 && o->root.empty())) {
    std::fprintf(stderr,
                 "usage: soak_rank --region G --regions N [--rank K --nranks M --root HOST:PORT] "
                 "--gateway SOCKET --job JOB --out PREFIX [--compression C] [--count N > %zu] "
                 "[--timeout-ms T] [--duration-s D] [--steps S] [--stop-file PATH] "
                 "[--recovery-deadline-s R] [--lossy [--lossy-tol X]] [--key K] "
                 "[--hang-grace-s G] [--watchdog-s W]\n",
                 kLabelCount);
    return false;
  }
  if (o->region_name.empty()) o->region_name = "r" + std::to_string(o->region);
  if (o->watchdog_s <= 0) {
    o->watchdog_s = o->duration_s + o->recovery_deadline_s + 2.0 * o->timeout_ms / 1000.0 + 30;
  }
  return true;
}

// Counters shared with the watchdog thread, which may have to write the summary while the main
// thread is stuck inside a call.
struct Counters {
  std::atomic<int64_t> calls{0}, ok{0}, failed{0}, wrong{0}, mixed{0}, hangs{0};
  std::atomic<int64_t> inits{0}, init_failures{0}, last_step{0}, last_ok_step{0};
  std::atomic<int64_t> call_start_ms{0};  // 0: not inside a library call
  std::atomic<int64_t> call_step{0};      // the step of that call (0: comm creation)
};

class Output {
 public:
  explicit Output(const Options& o) : o_(o), log_(std::fopen((o.out + ".log").c_str(), "w")) {
    start_ms_ = NowMs();
  }
  bool good() const { return log_ != nullptr; }

  void Line(const std::string& line) {
    std::lock_guard<std::mutex> l(mu_);
    if (log_ == nullptr) return;
    std::fputs(line.c_str(), log_);
    std::fputc('\n', log_);
    std::fflush(log_);  // a killed or watchdog-ended run keeps every line so far
  }

  // Writes PREFIX.summary once (the first caller wins: main at the end, or the watchdog).
  void Summary(const Counters& c, const std::string& exit_reason) {
    std::lock_guard<std::mutex> l(mu_);
    if (summary_written_) return;
    summary_written_ = true;
    std::FILE* f = std::fopen((o_.out + ".summary.tmp").c_str(), "w");
    if (f == nullptr) return;
    std::fprintf(
        f,
        "region %s\nrank %d\nnranks %d\nregions %d\ncompression %s\ncount %zu\n"
        "calls %lld\nok %lld\nfailed %lld\nwrong %lld\nmixed %lld\nhangs %lld\n"
        "inits %lld\ninit_failures %lld\nlast_step %lld\nlast_ok_step %lld\n"
        "start_ms %lld\nend_ms %lld\nexit %s\n",
        o_.region_name.c_str(), o_.rank, o_.nranks, o_.regions, o_.compression.c_str(), o_.count,
        static_cast<long long>(c.calls.load()), static_cast<long long>(c.ok.load()),
        static_cast<long long>(c.failed.load()), static_cast<long long>(c.wrong.load()),
        static_cast<long long>(c.mixed.load()), static_cast<long long>(c.hangs.load()),
        static_cast<long long>(c.inits.load()), static_cast<long long>(c.init_failures.load()),
        static_cast<long long>(c.last_step.load()), static_cast<long long>(c.last_ok_step.load()),
        static_cast<long long>(start_ms_), static_cast<long long>(NowMs()), exit_reason.c_str());
    std::fclose(f);
    // Renamed into place: a reader never sees half a summary.
    std::rename((o_.out + ".summary.tmp").c_str(), (o_.out + ".summary").c_str());
  }

 private:
  const Options& o_;
  std::mutex mu_;
  std::FILE* log_;
  int64_t start_ms_ = 0;
  bool summary_written_ = false;
};

// A message on one line (the log is one record per line).
std::string OneLine(std::string s) {
  for (char& ch : s) {
    if (ch == '\n' || ch == '\r') ch = ' ';
  }
  return s;
}

// The result code's name: the first word of a wrapper Status's message ("STRAIT_ERROR_X: ...").
std::string CodeOf(const strait::Status& s) {
  const std::string m(s.message());
  const size_t colon = m.find(':');
  return colon == std::string::npos ? "unknown" : m.substr(0, colon);
}

// The data of (region, rank) at `step`, as described at the top of the file.
inline float DataValue(size_t i, int64_t step, int region, int rank) {
  const int64_t a = (static_cast<int64_t>(i % kModulus) * 7 + (step % kModulus) * 29 +
                     int64_t{region} * 13 + int64_t{rank} * 5) %
                    kModulus;
  return static_cast<float>(a - 8);
}

// The reference of the sum over every rank, by residue class: element i's sum depends only on
// a = (7i + 29s) mod 17, so 17 values describe the whole reference of every step.
std::vector<float> ReferenceTable(int regions, int nranks) {
  std::vector<float> t(kModulus, 0.0f);
  for (int a = 0; a < kModulus; ++a) {
    int64_t sum = 0;
    for (int g = 0; g < regions; ++g) {
      for (int k = 0; k < nranks; ++k) sum += (a + g * 13 + k * 5) % kModulus - 8;
    }
    t[static_cast<size_t>(a)] = static_cast<float>(sum);
  }
  return t;
}

// FNV-1a over 8-byte words: the bench compares it across ranks (a lossy run's results must be
// bit-identical everywhere).
uint64_t Hash(const std::vector<float>& v) {
  uint64_t h = 1469598103934665603ull;
  const size_t bytes = v.size() * sizeof(float);
  const auto* p = reinterpret_cast<const unsigned char*>(v.data());
  for (size_t off = 0; off + 8 <= bytes; off += 8) {
    uint64_t w = 0;
    std::memcpy(&w, p + off, 8);
    h = (h ^ w) * 1099511628211ull;
  }
  for (size_t off = bytes & ~size_t{7}; off < bytes; ++off) h = (h ^ p[off]) * 1099511628211ull;
  return h;
}

// The stop step in --stop-file: nullopt while the file does not exist; 0 (stop now) when it
// holds no number.
std::optional<int64_t> StopStep(const std::string& path) {
  if (path.empty()) return std::nullopt;
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return std::nullopt;
  std::ifstream in(path);
  long long s = 0;
  if (in >> s) return static_cast<int64_t>(s);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  if (!ParseArgs(argc, argv, &o)) return 2;
  Output out(o);
  if (!out.good()) {
    std::fprintf(stderr, "soak_rank: cannot write %s.log\n", o.out.c_str());
    return 2;
  }
  Counters c;
  const int64_t start_ms = NowMs();
  const int64_t total_ranks = int64_t{o.regions} * o.nranks;
  char head[512];
  std::snprintf(head, sizeof(head),
                "# soak_rank %s/%d of %d regions x %d ranks, job %s, compression %s, %zu fp32, "
                "timeout %d ms, %s check; lines: init START_MS END_MS ok|failed CODE MESSAGE / "
                "step N START_MS END_MS CLASS LABEL HASH [CODE MESSAGE]",
                o.region_name.c_str(), o.rank, o.regions, o.nranks, o.job.c_str(),
                o.compression.c_str(), o.count, o.timeout_ms, o.lossy ? "lossy" : "exact");
  out.Line(head);

  // The watchdog: a call stuck past its own deadline, or a run past its whole budget, is a hang
  // -- the thing this soak exists to catch -- so it is recorded and the process ends rather than
  // leaving its caller to guess.
  std::atomic<bool> done{false};
  std::thread watchdog([&] {
    const int64_t hang_ms = o.timeout_ms + static_cast<int64_t>(o.hang_grace_s * 1000);
    const int64_t budget_end = start_ms + static_cast<int64_t>(o.watchdog_s * 1000);
    while (!done.load()) {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      const int64_t now = NowMs();
      const int64_t in_call = c.call_start_ms.load();
      std::string why;
      if (in_call != 0 && now - in_call > hang_ms) {
        why = "a call (step " + std::to_string(c.call_step.load()) +
              ", 0 = comm creation, -1 = destroy) " + "still running " +
              std::to_string(now - in_call) + " ms after it started (timeout " +
              std::to_string(o.timeout_ms) + " ms)";
      } else if (now > budget_end) {
        why = "the run is still going after the watchdog's " + std::to_string(o.watchdog_s) + " s";
      }
      if (!why.empty()) {
        c.hangs.fetch_add(1);
        out.Line("hang " + std::to_string(now) + " " + why);
        out.Summary(c, "watchdog");
        std::fprintf(stderr, "soak_rank %s/%d: watchdog: %s\n", o.region_name.c_str(), o.rank,
                     why.c_str());
        std::_Exit(4);
      }
    }
  });

  strait::HostConfig cfg;
  cfg.region = o.region_name.c_str();
  cfg.rank = o.rank;
  cfg.nranks = o.nranks;
  cfg.root_address = o.nranks > 1 ? o.root.c_str() : nullptr;
  cfg.gateway = o.gateway.c_str();
  cfg.job_id = o.job.c_str();
  cfg.compression = o.compression.c_str();
  cfg.timeout_ms = o.timeout_ms;

  // Creates the comm, retrying until it works or --recovery-deadline-s passed (a restarting
  // straitd refuses connections for a while; that is what the retry is for).
  const auto create = [&]() -> std::optional<strait::Comm> {
    const int64_t give_up = NowMs() + static_cast<int64_t>(o.recovery_deadline_s * 1000);
    for (;;) {
      c.call_step.store(0);
      const int64_t t0 = NowMs();
      c.call_start_ms.store(t0);
      auto comm = strait::Comm::InitHost(cfg);
      const int64_t t1 = NowMs();
      c.call_start_ms.store(0);
      c.inits.fetch_add(1);
      if (comm.ok()) {
        out.Line("init " + std::to_string(t0) + " " + std::to_string(t1) + " ok");
        return std::move(comm).value();
      }
      c.init_failures.fetch_add(1);
      out.Line("init " + std::to_string(t0) + " " + std::to_string(t1) + " failed " +
               CodeOf(comm.status()) + " " + OneLine(std::string(comm.status().message())));
      if (t1 >= give_up) return std::nullopt;
      // Told to stop: the other ranks may be gone already, so a comm may never come up again.
      if (StopStep(o.stop_file)) return std::nullopt;
      // Not a spin against a daemon that is still starting: a fifth of a second between tries.
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
    }
  };

  std::string exit_reason = "duration";
  int rc = 0;
  std::optional<strait::Comm> comm = create();
  std::vector<float> data(o.count);
  const std::vector<float> ref = ReferenceTable(o.regions, o.nranks);
  if (!comm) {
    exit_reason = "no_comm";
    rc = 5;
  }
  const int64_t end_ms = start_ms + static_cast<int64_t>(o.duration_s * 1000);
  for (int64_t step = 1; comm; ++step) {
    if (o.steps > 0 && step > o.steps) {
      exit_reason = "steps";
      break;
    }
    if (NowMs() >= end_ms) {
      exit_reason = "duration";
      break;
    }
    if (const std::optional<int64_t> stop = StopStep(o.stop_file); stop && step >= *stop) {
      exit_reason = "stop_file";
      break;
    }
    for (size_t i = 0; i < kLabelCount; ++i) data[i] = static_cast<float>(step);
    for (size_t i = kLabelCount; i < o.count; ++i) data[i] = DataValue(i, step, o.region, o.rank);

    c.call_step.store(step);
    const int64_t t0 = NowMs();
    c.call_start_ms.store(t0);
    const strait::Status s =
        comm->AllReduce(data.data(), data.data(), o.count, STRAIT_FLOAT32, STRAIT_SUM, o.key);
    const int64_t t1 = NowMs();
    c.call_start_ms.store(0);
    c.calls.fetch_add(1);
    c.last_step.store(step);

    const float want_label = static_cast<float>(total_ranks * step);
    std::string cls;
    std::string detail;
    if (!s.ok()) {
      cls = "failed";
      c.failed.fetch_add(1);
      detail = CodeOf(s) + " " + OneLine(std::string(s.message()));
    } else {
      const bool label_ok =
          o.lossy ? std::fabs(data[0] - want_label) <= 0.5f : data[0] == want_label;
      // The rest against the reference: the first element off says where and by how much.
      size_t bad = 0;
      size_t first_bad = 0;
      for (size_t i = 0; i < o.count; ++i) {
        const float want = i < kLabelCount
                               ? want_label
                               : ref[static_cast<size_t>((static_cast<int64_t>(i % kModulus) * 7 +
                                                          (step % kModulus) * 29) %
                                                         kModulus)];
        const bool same = o.lossy ? std::fabs(data[i] - want) <= o.lossy_tol : data[i] == want;
        if (!same && bad++ == 0) first_bad = i;
      }
      if (!label_ok) {
        cls = "mixed";
        c.mixed.fetch_add(1);
      } else if (bad > 0) {
        cls = "wrong";
        c.wrong.fetch_add(1);
      } else {
        cls = "ok";
        c.ok.fetch_add(1);
        c.last_ok_step.store(step);
      }
      if (cls != "ok") {
        char buf[200];
        std::snprintf(buf, sizeof(buf),
                      "SUCCESS label_sum=%.3f (want %lld), %zu elements off, "
                      "first [%zu]",
                      data[0], static_cast<long long>(total_ranks * step), bad, first_bad);
        detail = buf;
        std::fprintf(stderr, "soak_rank %s/%d: op_%s step=%lld label_sum=%g (want %lld)\n",
                     o.region_name.c_str(), o.rank, cls == "mixed" ? "MIXED" : "WRONG",
                     static_cast<long long>(step), static_cast<double>(data[0]),
                     static_cast<long long>(total_ranks * step));
        rc = 1;
      }
    }
    char line[160];
    std::snprintf(line, sizeof(line), "step %lld %lld %lld %s %.3f %016llx",
                  static_cast<long long>(step), static_cast<long long>(t0),
                  static_cast<long long>(t1), cls.c_str(),
                  s.ok() ? static_cast<double>(data[0]) : 0.0,
                  static_cast<unsigned long long>(s.ok() ? Hash(data) : 0));
    out.Line(std::string(line) + (detail.empty() ? "" : " " + detail));

    if (!s.ok()) {
      // strait.h: after a failed all-reduce the comm is failed; destroy it and create a new one.
      // Destroy blocks (briefly, says strait.h): the watchdog watches it like a call (step -1).
      c.call_step.store(-1);
      c.call_start_ms.store(NowMs());
      const strait::Status d = comm->Destroy();
      c.call_start_ms.store(0);
      if (!d.ok()) out.Line("destroy " + std::to_string(NowMs()) + " " + OneLine(d.ToString()));
      // Told to stop: no new comm (the others may have stopped after this step already).
      if (StopStep(o.stop_file)) {
        exit_reason = "stop_file";
        break;
      }
      comm = create();
      if (!comm && StopStep(o.stop_file)) {
        exit_reason = "stop_file";
      } else if (!comm) {
        exit_reason = "no_comm";
        rc = 5;
      }
    }
  }
  if (comm) {
    const strait::Status d = comm->Destroy();
    if (!d.ok()) out.Line("destroy " + std::to_string(NowMs()) + " " + OneLine(d.ToString()));
  }
  done.store(true);
  watchdog.join();
  out.Summary(c, exit_reason);
  std::fprintf(stderr,
               "soak_rank %s/%d: %lld calls: %lld ok, %lld failed, %lld wrong, %lld mixed (%s)\n",
               o.region_name.c_str(), o.rank, static_cast<long long>(c.calls.load()),
               static_cast<long long>(c.ok.load()), static_cast<long long>(c.failed.load()),
               static_cast<long long>(c.wrong.load()), static_cast<long long>(c.mixed.load()),
               exit_reason.c_str());
  return rc;
}

// Issue 13, as a test: after a gateway restart, steps must never mix across regions. 3 regions x
// 1 rank; each rank is a soak_rank process (the C API through strait.hpp over libstrait.so)
// running repeated 4 MiB fp32 sum all-reduces with the lossless policy, each result checked
// exactly, element 0 carrying the step number; a failed call destroys the comm and creates a new
// one, as strait.h asks. One straitd (TLS) per region. While the ranks run, each region's
// straitd in turn is SIGKILLed and restarted 2 s later.
//
// Asserted: no result was WRONG (SUCCESS but not the reference) or MIXED (SUCCESS with element 0
// != 3 * step: different regions' steps summed); no hang (every rank process exits by itself
// before a deadline, and none's own watchdog fired); and after each restart every rank has a
// successful step within kRecoveryBound of the restart.
//
// Where: over strait-wanem (100 Mbit/s, 20 ms one way: the conditions the bug was measured in)
// when the test runs as root, as the other WAN tests do; otherwise on loopback (straitd
// processes on 127.0.0.1, TLS as well), which still restarts real daemons under real ranks.
// Bounded to about a minute of soak so that CI (root, 2 cores, ASan) can afford it; the long
// form with more faults is bench/chaos.sh.
//
// On failure the rank logs (one line per step: timestamps, class, label, result hash, error) are
// kept and their directory is printed.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "bench/wanem/netns.h"
#include "strait/status.h"
#include "tests/common/free_ports.h"
#include "tests/common/straitd_process.h"
#include "tests/gateway/wan_cluster.h"
#include "tests/net/test_certs.h"

namespace strait::api {
namespace {

constexpr int kRegions = 3;
constexpr int kTimeoutMs = 10000;   // the comms' timeout_ms: every call ends within it
constexpr char kDeadline[] = "8s";  // straitd's allreduce.deadline, below the comms' timeout
constexpr int kKillGapMs = 2000;    // SIGKILL, then the restart 2 s later (the measured bug)
constexpr int kWarmSteps = 2;       // ok steps per rank before the first fault
// The goal is 5 s from the restart to every rank's first good step. What that time holds: the
// new straitd's start, the survivors learning of its new incarnation (the hello on its new links)
// and failing their step, every rank destroying and re-creating its comm, and one 4 MiB step.
// Measured on this 2-core machine under load 4-6 (2026-12-02, while the bug still made every
// recovery fail): straitd ready 40-130 ms after the restart in release, 100-170 ms with
// ASan+UBSan (the CI preset); survivors told of the restart 0.4-1 s after it; a comm created
// within about 1 s once its daemon serves; destroying the failed one up to 1 s (strait.h); one
// step 0.55-0.8 s in release, 0.7-1.4 s under ASan (the daemons, the emulator's router and the
// ranks share two cores). That is 3-4 s in release and about 1.6 times the CPU part under ASan:
// instrumented builds get twice the goal, 10 s, which still fails a recovery that has to wait
// out a deadline (the gateways' 8 s, the comms' 10 s); release builds are held to the goal.
// With result recovery (813fe2a) recoveries measured 1.1-2.5 s in release, 1.7-2.7 s with ASan.
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define STRAIT_SOAK_INSTRUMENTED 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define STRAIT_SOAK_INSTRUMENTED 1
#endif
#endif
#ifdef STRAIT_SOAK_INSTRUMENTED
constexpr int64_t kRecoveryBoundMs = 10000;
#else
constexpr int64_t kRecoveryBoundMs = 5000;
#endif

int64_t NowMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

void SleepMs(int64_t ms) {
  std::this_thread::sleep_for(std::chrono::milliseconds(ms));
}

std::string ReadText(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// One "step" line of a soak_rank log.
struct Step {
  int64_t step = 0;
  int64_t start_ms = 0;
  int64_t end_ms = 0;
  std::string cls;   // ok, failed, wrong, mixed
  std::string rest;  // label, hash, code and message
};

std::vector<Step> ReadSteps(const std::string& log) {
  std::vector<Step> steps;
  std::istringstream in(ReadText(log));
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream l(line);
    std::string tag;
    Step s;
    if (!(l >> tag) || tag != "step" || !(l >> s.step >> s.start_ms >> s.end_ms >> s.cls)) {
      continue;
    }
    std::getline(l, s.rest);
    steps.push_back(std::move(s));
  }
  return steps;
}

// When the rank was first refused a comm because the regions' ranks would go on from different
// steps (gateway/generation.h, "Resume positions": a straitd killed after it confirmed a step and
// before its rank read the result, so that step succeeded in the other regions only); -1 if never.
// From then on the job cannot continue in step, by design: it must restart from a checkpoint.
int64_t SplitRefusedMs(const std::string& log) {
  std::istringstream in(ReadText(log));
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("init ", 0) == 0 && line.find(" failed ") != std::string::npos &&
        line.find("would go on from different steps") != std::string::npos) {
      std::istringstream f(line.substr(5));
      int64_t start = -1;
      f >> start;
      return start;
    }
  }
  return -1;
}

// A soak_rank summary: "key value" lines.
std::map<std::string, std::string> ReadSummary(const std::string& path) {
  std::map<std::string, std::string> kv;
  std::istringstream in(ReadText(path));
  std::string k, v;
  while (in >> k >> v) kv[k] = v;
  return kv;
}

// The straitd daemons the ranks talk to: strait-wanem namespaces as root (WanCluster), loopback
// processes otherwise. Both give a socket per region, SIGKILL and restart with the same config.
class Daemons {
 public:
  virtual ~Daemons() = default;
  virtual std::string Socket(int region) const = 0;
  virtual void Kill(int region) = 0;
  virtual Status Restart(int region) = 0;
  virtual std::string Logs(int region) const = 0;
  // The command prefix that runs a program where region `region`'s ranks live.
  virtual std::vector<std::string> RankPrefix(int region) const = 0;
  virtual std::string Where() const = 0;
};

class WanDaemons : public Daemons {
 public:
  explicit WanDaemons(std::unique_ptr<gateway::testing::WanCluster> c) : c_(std::move(c)) {}
  std::string Socket(int region) const override { return c_->Socket(region, 0); }
  void Kill(int region) override { c_->Kill(region, 0); }
  Status Restart(int region) override { return c_->Restart(region, 0); }
  std::string Logs(int region) const override { return c_->Logs(region, 0); }
  std::vector<std::string> RankPrefix(int region) const override {
    return {"ip", "netns", "exec", wanem::NamespaceName(c_->options().name, region)};
  }
  std::string Where() const override { return "strait-wanem 100mbit,20ms, TLS"; }

 private:
  std::unique_ptr<gateway::testing::WanCluster> c_;
};

// Loopback: one TLS straitd per region on 127.0.0.1 (the layout of tests/gateway/straitd_test).
class LoopbackDaemons : public Daemons {
 public:
  static StatusOr<std::unique_ptr<LoopbackDaemons>> Start() {
    std::unique_ptr<LoopbackDaemons> d(new LoopbackDaemons);
    char tmpl[] = "/tmp/strait-soak-gw-XXXXXX";
    if (::mkdtemp(tmpl) == nullptr) return UnavailableError("mkdtemp failed");
    d->dir_ = tmpl;
    auto pki = net::testing::TestPki::Create();
    if (!pki.ok()) return pki.status();
    d->pki_.emplace(std::move(pki).value());
    STRAIT_RETURN_IF_ERROR(d->pki_->MakeCa("soak-ca"));
    const std::vector<uint16_t> ports = test::FreePorts(kRegions);
    for (int r = 0; r < kRegions; ++r) {
      const std::string name = "r" + std::to_string(r);
      std::string c = "region = \"" + name + "\"\nshard_index = 0\n";
      c += "[local]\nsocket = \"" + d->Socket(r) + "\"\nallowed_uids = [" +
           std::to_string(::getuid()) + "]\n";
      c += "[wan]\nlisten = \"127.0.0.1:" + std::to_string(ports[static_cast<size_t>(r)]) + "\"\n";
      auto files = d->pki_->MakeGateway("soak-ca", name, name);
      if (!files.ok()) return files.status();
      c += "[tls]\nca = \"" + files->ca + "\"\ncert = \"" + files->cert + "\"\nkey = \"" +
           files->key + "\"\n";
      for (int p = 0; p < kRegions; ++p) {
        if (p == r) continue;
        c += "[peers.r" + std::to_string(p) +
             "]\nshard_0 = \"127.0.0.1:" + std::to_string(ports[static_cast<size_t>(p)]) + "\"\n";
      }
      // As WanCluster writes them, so that both modes test the same daemon settings.
      c += "[link]\nstreams = 2\nunreachable_after = \"10s\"\n";
      c += "[policy]\nallowed_codecs = [\"none\", \"zstd\", \"int8\", \"int4\", \"fp8\"]\n"
           "max_relative_error = 1.0\nmin_lossy_bytes = \"0B\"\n";
      c += "[allreduce]\ndeadline = \"" + std::string(kDeadline) + "\"\nshutdown_grace = \"2s\"\n";
      std::ofstream(d->Config(r)) << c;
    }
    d->pids_.assign(kRegions, -1);
    d->starts_.assign(kRegions, 0);
    for (int r = 0; r < kRegions; ++r) STRAIT_RETURN_IF_ERROR(d->Spawn(r));
    for (int r = 0; r < kRegions; ++r) STRAIT_RETURN_IF_ERROR(d->WaitReady(r));
    return d;
  }
  ~LoopbackDaemons() override {
    test::KillProcesses(&pids_);
    pki_.reset();
    std::error_code ec;
    if (!dir_.empty()) std::filesystem::remove_all(dir_, ec);
  }
  std::string Socket(int region) const override {
    return dir_ + "/r" + std::to_string(region) + ".sock";
  }
  void Kill(int region) override {
    pid_t& pid = pids_[static_cast<size_t>(region)];
    if (pid <= 0) return;
    ::kill(pid, SIGKILL);
    ::waitpid(pid, nullptr, 0);
    pid = -1;
  }
  Status Restart(int region) override {
    Kill(region);
    STRAIT_RETURN_IF_ERROR(Spawn(region));
    return WaitReady(region);
  }
  std::string Logs(int region) const override {
    return "--- stdout\n" + ReadText(Base(region) + ".out") + "--- stderr\n" +
           ReadText(Base(region) + ".err");
  }
  std::vector<std::string> RankPrefix(int) const override { return {}; }
  std::string Where() const override { return "loopback (not root), TLS"; }

 private:
  LoopbackDaemons() = default;
  std::string Base(int r) const { return dir_ + "/r" + std::to_string(r); }
  std::string Config(int r) const { return Base(r) + ".toml"; }
  Status Spawn(int r) {
    test::SpawnOptions o;
    o.stdout_path = Base(r) + ".out";
    o.stderr_path = Base(r) + ".err";
    const pid_t pid = test::SpawnProcess({STRAITD_PATH, "--config", Config(r)}, o);
    if (pid < 0) return UnavailableError("cannot start straitd");
    pids_[static_cast<size_t>(r)] = pid;
    ++starts_[static_cast<size_t>(r)];
    return Status::Ok();
  }
  // Each start appends one "straitd ready" line to the (appended) stdout: wait for as many.
  Status WaitReady(int r) {
    const int64_t until = NowMs() + 30000;
    for (;;) {
      const std::string text = ReadText(Base(r) + ".out");
      size_t lines = 0;
      for (size_t at = text.find("straitd ready"); at != std::string::npos;
           at = text.find("straitd ready", at + 1)) {
        ++lines;
      }
      if (lines >= starts_[static_cast<size_t>(r)]) return Status::Ok();
      if (test::ProcessEnded(pids_[static_cast<size_t>(r)])) {
        return UnavailableError("straitd r" + std::to_string(r) + " exited:\n" + Logs(r));
      }
      if (NowMs() > until) return DeadlineExceededError("straitd not ready:\n" + Logs(r));
      SleepMs(20);
    }
  }

  std::string dir_;
  std::optional<net::testing::TestPki> pki_;
  std::vector<pid_t> pids_;
  std::vector<size_t> starts_;
};

StatusOr<std::unique_ptr<Daemons>> StartDaemons() {
  if (wanem::CheckPrivileges().ok()) {
    gateway::testing::WanClusterOptions o;
    o.straitd = STRAITD_PATH;
    o.name = "soak" + std::to_string(::getpid() % 100000);
    o.regions = kRegions;
    o.ranks_per_region = 1;
    o.link = "rate=100mbit,delay=20ms";
    o.allreduce_deadline = kDeadline;
    auto c = gateway::testing::WanCluster::Start(o);
    if (!c.ok()) return c.status();
    return std::unique_ptr<Daemons>(new WanDaemons(std::move(c).value()));
  }
  auto d = LoopbackDaemons::Start();
  if (!d.ok()) return d.status();
  return std::unique_ptr<Daemons>(std::move(d).value());
}

class RestartSoak : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/strait-soak-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    ::chmod(dir_.c_str(), 0755);
  }
  void TearDown() override {
    test::KillProcesses(&ranks_);
    if (HasFailure()) {
      std::printf("restart_soak: rank logs kept in %s\n", dir_.c_str());
    } else {
      std::error_code ec;
      std::filesystem::remove_all(dir_, ec);
    }
  }
  std::string Prefix(int r) const { return dir_ + "/rank_r" + std::to_string(r); }

  // Every rank's first ok step that ended after `after_ms`, or -1 for none yet.
  std::vector<int64_t> FirstOkAfter(int64_t after_ms) const {
    std::vector<int64_t> end(kRegions, -1);
    for (int r = 0; r < kRegions; ++r) {
      for (const Step& s : ReadSteps(Prefix(r) + ".log")) {
        if (s.cls == "ok" && s.end_ms > after_ms) {
          end[static_cast<size_t>(r)] = s.end_ms;
          break;
        }
      }
    }
    return end;
  }

  std::string dir_;
  std::vector<pid_t> ranks_;
};

TEST_F(RestartSoak, GatewayRestartsNeverMixStepsAndEveryRankRecovers) {
  auto started = StartDaemons();
  ASSERT_TRUE(started.ok()) << started.status();
  Daemons& d = **started;
  const std::string job = "soak" + std::to_string(::getpid());
  const std::string stop_file = dir_ + "/stop";
  std::printf("restart_soak: %s, %d regions x 1 rank, 4 MiB fp32, timeout %d ms\n",
              d.Where().c_str(), kRegions, kTimeoutMs);

  for (int r = 0; r < kRegions; ++r) {
    std::vector<std::string> argv = d.RankPrefix(r);
    const std::vector<std::string> args = {SOAK_RANK_PATH,
                                           "--region",
                                           std::to_string(r),
                                           "--regions",
                                           std::to_string(kRegions),
                                           "--gateway",
                                           d.Socket(r),
                                           "--job",
                                           job,
                                           "--compression",
                                           "none",
                                           "--timeout-ms",
                                           std::to_string(kTimeoutMs),
                                           "--duration-s",
                                           "150",
                                           "--stop-file",
                                           stop_file,
                                           "--recovery-deadline-s",
                                           "40",
                                           "--out",
                                           Prefix(r)};
    argv.insert(argv.end(), args.begin(), args.end());
    test::SpawnOptions o;
    o.stdout_path = Prefix(r) + ".stderr";
    o.stderr_path = o.stdout_path;
    o.truncate = true;
    ranks_.push_back(test::SpawnProcess(argv, o));
    ASSERT_GT(ranks_.back(), 0);
  }

  // Warm: every rank has kWarmSteps good steps before any fault (else the faults prove nothing).
  {
    const int64_t until = NowMs() + 60000;
    for (;;) {
      int warm = 0;
      for (int r = 0; r < kRegions; ++r) {
        int ok = 0;
        for (const Step& s : ReadSteps(Prefix(r) + ".log")) ok += s.cls == "ok" ? 1 : 0;
        warm += ok >= kWarmSteps ? 1 : 0;
      }
      if (warm == kRegions) break;
      ASSERT_LT(NowMs(), until) << "the ranks did not get " << kWarmSteps
                                << " good steps each within 60 s, before any fault:\n"
                                << ReadText(Prefix(0) + ".log").substr(0, 4000);
      SleepMs(100);
    }
  }

  // Each region's straitd in turn: SIGKILL, restart 2 s later, wait for every rank to recover.
  struct Fault {
    int region;
    int64_t kill_ms, restart_ms, ready_ms;
    std::vector<int64_t> recovered_ms;  // per rank: first ok step's end after the restart
  };
  std::vector<Fault> faults;
  for (int r = 0; r < kRegions; ++r) {
    Fault f{r, NowMs(), 0, 0, {}};
    d.Kill(r);
    SleepMs(kKillGapMs);
    f.restart_ms = NowMs();
    const Status restarted = d.Restart(r);
    ASSERT_TRUE(restarted.ok()) << restarted;
    f.ready_ms = NowMs();
    // Wait for recovery a little past the bound, so that a slow recovery is measured, not just
    // flagged; then a short pause so that the next fault starts from steady steps.
    const int64_t until = f.restart_ms + kRecoveryBoundMs + 5000;
    for (;;) {
      f.recovered_ms = FirstOkAfter(f.restart_ms);
      const bool all = std::all_of(f.recovered_ms.begin(), f.recovered_ms.end(),
                                   [](int64_t t) { return t > 0; });
      if (all || NowMs() > until) break;
      SleepMs(100);
    }
    faults.push_back(f);
    SleepMs(1000);
  }

  // Stop every rank after the same step: a little beyond the furthest one, so that all of them
  // get there (a rank that stopped alone would leave the others' next call to time out).
  int64_t furthest = 0;
  for (int r = 0; r < kRegions; ++r) {
    for (const Step& s : ReadSteps(Prefix(r) + ".log")) furthest = std::max(furthest, s.step);
  }
  {
    // +3: a rank may be inside step furthest + 1 (logged only at its end) and finish it, and
    // start furthest + 2, between this read and the file's appearance; with +2 a rank that
    // checked just before the file appeared ran a step that the others never joined.
    std::ofstream(stop_file + ".tmp") << furthest + 3 << "\n";
    std::filesystem::rename(stop_file + ".tmp", stop_file);
  }
  // No hang: each rank exits by itself within two of its timeouts (a step and the re-creation
  // after it) plus the time to reach the stop step.
  const int64_t exit_until = NowMs() + 2 * kTimeoutMs + 20000;
  std::vector<int> codes(kRegions, -1);
  std::vector<bool> exited(kRegions, false);
  while (NowMs() < exit_until &&
         !std::all_of(exited.begin(), exited.end(), [](bool e) { return e; })) {
    for (int r = 0; r < kRegions; ++r) {
      int code = -1;
      if (!exited[static_cast<size_t>(r)] &&
          test::ProcessEnded(ranks_[static_cast<size_t>(r)], &code)) {
        exited[static_cast<size_t>(r)] = true;
        codes[static_cast<size_t>(r)] = code;
      }
    }
    SleepMs(50);
  }

  // The report first (so that a failure shows the whole picture), then the assertions.
  int64_t wrong = 0, mixed = 0, hangs = 0;
  for (int r = 0; r < kRegions; ++r) {
    auto sum = ReadSummary(Prefix(r) + ".summary");
    const auto num = [&](const char* k) { return sum.count(k) ? std::stoll(sum[k]) : 0; };
    const bool hung = !exited[static_cast<size_t>(r)] || num("hangs") > 0 || sum.empty();
    wrong += num("wrong");
    mixed += num("mixed");
    hangs += hung ? 1 : 0;
    std::printf(
        "restart_soak: r%d: %lld calls, %lld ok, %lld failed, %lld wrong, %lld mixed, "
        "%lld comm creations (%lld failed), exit %s, code %d%s\n",
        r, num("calls"), num("ok"), num("failed"), num("wrong"), num("mixed"), num("inits"),
        num("init_failures"), sum.count("exit") ? sum["exit"].c_str() : "?",
        codes[static_cast<size_t>(r)], hung ? ", HUNG" : "");
    // The first few bad results and errors, quoted: what a reader of a CI failure needs.
    int quoted = 0;
    for (const Step& s : ReadSteps(Prefix(r) + ".log")) {
      if (s.cls != "ok" && quoted++ < 6) {
        std::printf("restart_soak:   r%d step %lld %s%s\n", r, static_cast<long long>(s.step),
                    s.cls.c_str(), s.rest.substr(0, 300).c_str());
      }
    }
  }
  // Partial steps: a step number that some ranks finished well and others failed. Not wrong in
  // itself, but there the replicas part ways (one applied the step, another did not), and a
  // rank that failed one step more than the others is how mixed steps began on 9b047d6 and
  // 43b4dc1. Reported here, not asserted (issue 13 asks for no mixing; chaos.sh counts it too).
  {
    std::map<int64_t, std::pair<int, int>> by_step;  // step -> (ok ranks, failed ranks)
    for (int r = 0; r < kRegions; ++r) {
      for (const Step& s : ReadSteps(Prefix(r) + ".log")) {
        if (s.cls == "ok") ++by_step[s.step].first;
        if (s.cls == "failed") ++by_step[s.step].second;
      }
    }
    int partial = 0;
    for (const auto& [step, n] : by_step) partial += n.first > 0 && n.second > 0 ? 1 : 0;
    std::printf("restart_soak: %d step number(s) succeeded on some ranks and failed on others\n",
                partial);
  }
  for (const Fault& f : faults) {
    std::string per;
    for (int r = 0; r < kRegions; ++r) {
      const int64_t t = f.recovered_ms[static_cast<size_t>(r)];
      per += " r" + std::to_string(r) + "=" +
             (t > 0 ? std::to_string(t - f.restart_ms) + "ms" : std::string("none"));
    }
    std::printf(
        "restart_soak: r%d killed, restarted 2 s later (ready in %lld ms); first good "
        "step after the restart:%s (bound %lld ms)\n",
        f.region, static_cast<long long>(f.ready_ms - f.restart_ms), per.c_str(),
        static_cast<long long>(kRecoveryBoundMs));
  }

  EXPECT_EQ(mixed, 0) << "results that summed steps of different regions (op_MIXED)";
  EXPECT_EQ(wrong, 0) << "successful results that are not the reference";
  EXPECT_EQ(hangs, 0) << "rank processes that hung (did not exit by themselves in time, or "
                         "their watchdog fired)";
  // A step that succeeded in some regions only (a straitd killed between its commit and its
  // rank's read) is recovered from the other regions (kFetchResult), so the job goes on; had it
  // not been, every later comm would be refused ("regions at different steps") and the job
  // would end here. That is a failure of this test, named as such.
  for (int r = 0; r < kRegions; ++r) {
    EXPECT_LT(SplitRefusedMs(Prefix(r) + ".log"), 0)
        << "rank r" << r << " was refused a comm because the regions' ranks were at different "
        << "steps: a step's result was not recovered after its straitd was killed";
  }
  for (const Fault& f : faults) {
    for (int r = 0; r < kRegions; ++r) {
      const int64_t t = f.recovered_ms[static_cast<size_t>(r)];
      EXPECT_TRUE(t > 0 && t - f.restart_ms <= kRecoveryBoundMs)
          << "after r" << f.region << "'s straitd restarted, rank r" << r
          << (t > 0 ? " needed " + std::to_string(t - f.restart_ms) + " ms"
                    : std::string(" had no good step"))
          << " (bound " << kRecoveryBoundMs << " ms)";
    }
  }
  if (HasFailure()) {
    for (int r = 0; r < kRegions; ++r) {
      const std::string logs = d.Logs(r);
      std::printf("restart_soak: straitd r%d, last of its log:\n%s\n", r,
                  logs.substr(logs.size() > 3000 ? logs.size() - 3000 : 0).c_str());
    }
  }
}

}  // namespace
}  // namespace strait::api

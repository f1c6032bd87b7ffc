// strait-wanem's subcommands: argument parsing, process lifetime (signals, parent death, the
// background daemon), and the self-check report.
#include "bench/wanem/commands.h"

#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "bench/wanem/config.h"
#include "bench/wanem/emulator.h"
#include "bench/wanem/netns.h"
#include "bench/wanem/probe.h"
#include "common/clock.h"
#include "common/log.h"
#include "common/strings.h"
#include "common/units.h"
#include "common/version.h"
#include "tools/cli/cli.h"

extern char** environ;

namespace strait::wanem {
namespace {

constexpr const char* kTool = "strait-wanem";

// Flags shared by run, up and selfcheck.
struct TopologyFlags {
  std::string name = "wanem";
  int regions = 2;
  std::string link = "1gbit,0ms";
  std::vector<std::string> pairs;
  std::string schedule;
  int mtu = 1500;
  std::string cc = "bbr";
  bool no_gso = false;
  uint64_t seed = 1;
};

void AddTopologyFlags(CLI::App* sub, TopologyFlags& f) {
  sub->add_option("--name", f.name, "Instance name; namespaces are strait-<name>-r<i>")
      ->capture_default_str();
  sub->add_option("--regions,-n", f.regions, "Number of regions (2-64)")->capture_default_str();
  sub->add_option("--link", f.link,
                  "Every directed pair's settings, e.g. '100mbit,25ms,loss=0.1%' (see bench/README.md)")
      ->capture_default_str();
  sub->add_option("--pair", f.pairs,
                  "Per-pair override SELECTOR=SPEC, e.g. '0:1=rate=20mbit,delay=80ms' "
                  "(i:j both directions, i>j one, *>j every link into j, i>* out of i; "
                  "'*>2=syn=drop': region 2 admits no inbound TCP connection); repeatable");
  sub->add_option("--schedule", f.schedule, "Schedule file of timed changes (see bench/README.md)");
  sub->add_option("--mtu", f.mtu, "MTU of the region devices (576-65535)")->capture_default_str();
  sub->add_option("--cc", f.cc,
                  "TCP congestion control in every region: one of sysctl "
                  "net.ipv4.tcp_allowed_congestion_control, e.g. bbr, cubic, reno")
      ->capture_default_str();
  sub->add_flag("--no-gso", f.no_gso,
                "Turn software GSO off in the regions (costs CPU; packets are MTU-sized either "
                "way)");
  sub->add_option("--seed", f.seed, "Seed of the loss and jitter generators")
      ->capture_default_str();
}

StatusOr<EmulatorOptions> BuildOptions(const TopologyFlags& f) {
  EmulatorOptions o;
  STRAIT_RETURN_IF_ERROR(ValidateInstanceName(f.name));
  o.name = f.name;
  STRAIT_ASSIGN_OR_RETURN(o.table, BuildLinkTable(f.regions, f.link, f.pairs));
  if (!f.schedule.empty()) {
    STRAIT_ASSIGN_OR_RETURN(o.schedule, LoadScheduleFile(f.schedule, o.table));
  }
  if (f.mtu < 576 || f.mtu > 65535) {
    return InvalidArgumentError("bad --mtu " + std::to_string(f.mtu) + ": must be 576..65535");
  }
  o.mtu = f.mtu;
  // Checked here, before any namespace exists (SetUpRegion checks again, for library users).
  // Both lists are global, so the tool's own namespace reads the same as a region would; where
  // /proc/sys cannot be read, the region's own check still reports a bad name.
  auto available = ReadSysctl("net/ipv4/tcp_available_congestion_control");
  auto allowed = ReadSysctl("net/ipv4/tcp_allowed_congestion_control");
  if (available.ok() && allowed.ok()) {
    STRAIT_RETURN_IF_ERROR(CheckCongestionControl(f.cc, *available, *allowed));
  } else {
    STRAIT_RETURN_IF_ERROR(CheckCongestionControl(f.cc, f.cc, f.cc));  // The name's form only.
  }
  o.cc = f.cc;
  o.gso = !f.no_gso;
  o.seed = f.seed;
  return o;
}

// "0", "0.5", "nan": a flag's value as the user would have typed it.
std::string FormatNumber(double v) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%g", v);
  return buf;
}

int Fail(const Status& s) {
  std::cerr << kTool << ": " << s.message() << "\n";
  return s.code() == StatusCode::kInvalidArgument ? kExitUsage : 1;
}

// SIGTERM when the parent dies, so a test or script that is killed takes the emulation with it.
// The check after prctl closes the race with a parent that died just before.
void DieWithParent() {
  const pid_t parent = getppid();
  prctl(PR_SET_PDEATHSIG, SIGTERM);
  if (getppid() != parent) raise(SIGTERM);
}

// Blocks the termination signals in every thread started from now on; WaitForSignal collects
// them synchronously. Must run before any thread exists.
sigset_t BlockSignals() {
  sigset_t set;
  sigemptyset(&set);
  for (int s : {SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGCHLD}) sigaddset(&set, s);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  return set;
}

void PrintRegions(const Emulator& emu) {
  for (int r = 0; r < emu.regions(); ++r) {
    std::cout << "  region " << r << ": namespace " << emu.NamespaceOf(r) << ", address "
              << RegionAddress(r) << "\n";
  }
  std::cout.flush();
}

std::vector<std::string> CommandEnv(const Emulator& emu) {
  std::vector<std::string> env;
  for (char** e = environ; *e != nullptr; ++e) env.emplace_back(*e);
  env.push_back("STRAIT_WANEM_NAME=" + emu.name());
  env.push_back("STRAIT_WANEM_REGIONS=" + std::to_string(emu.regions()));
  for (int r = 0; r < emu.regions(); ++r) {
    env.push_back("STRAIT_WANEM_NS" + std::to_string(r) + "=" + emu.NamespaceOf(r));
    env.push_back("STRAIT_WANEM_ADDR" + std::to_string(r) + "=" + RegionAddress(r));
  }
  return env;
}

// Waits for a termination signal, the child `child` (if > 0) to exit, or the router to fail.
// Returns the exit code the tool should give.
int Supervise(const sigset_t& set, Emulator& emu, pid_t child) {
  while (true) {
    timespec ts{0, 200'000'000};
    siginfo_t info{};
    const int sig = sigtimedwait(&set, &info, &ts);
    if (!emu.RouterStatus().ok()) {
      std::cerr << kTool << ": " << emu.RouterStatus().message() << "\n";
      if (child > 0) kill(child, SIGTERM);
      return 1;
    }
    if (sig == SIGCHLD && child > 0) {
      int status = 0;
      const pid_t r = waitpid(child, &status, WNOHANG);
      if (r == child) {
        if (WIFEXITED(status)) return WEXITSTATUS(status);
        return 128 + (WIFSIGNALED(status) ? WTERMSIG(status) : 0);
      }
      continue;
    }
    if (sig > 0 && sig != SIGCHLD) {
      STRAIT_LOG(kInfo, "wanem") << "signal " << sig << ": tearing down";
      if (child > 0) {
        kill(child, SIGTERM);
        Deadline d = Deadline::AfterSeconds(3.0);
        while (waitpid(child, nullptr, WNOHANG) == 0 && !d.Expired()) usleep(10'000);
        if (waitpid(child, nullptr, WNOHANG) == 0) {
          kill(child, SIGKILL);
          waitpid(child, nullptr, 0);
        }
      }
      return 128 + sig;
    }
  }
}

// `in` is --in (unset: COMMAND runs in the root namespace).
int CmdRun(const TopologyFlags& flags, std::vector<std::string> command, std::optional<int> in) {
  auto options = BuildOptions(flags);
  if (!options.ok()) return Fail(options.status());
  // --in is checked before the namespaces are made: a typo should cost no setup.
  if (in.has_value() && command.empty()) {
    return Fail(InvalidArgumentError("--in " + std::to_string(*in) +
                                     " needs a command after -- to run in that region"));
  }
  if (in.has_value() && (*in < 0 || *in >= options->table.regions)) {
    return Fail(InvalidArgumentError(
        "bad --in " + std::to_string(*in) + ": regions are numbered 0.." +
        std::to_string(options->table.regions - 1) + " (--regions " +
        std::to_string(options->table.regions) + ")"));
  }
  const int in_region = in.value_or(-1);
  const sigset_t set = BlockSignals();
  DieWithParent();
  auto emu = Emulator::Start(std::move(*options));
  if (!emu.ok()) return Fail(emu.status());
  std::cout << kTool << ": instance '" << flags.name << "' up (" << (*emu)->regions()
            << " regions)\n";
  PrintRegions(**emu);
  pid_t child = -1;
  if (!command.empty()) {
    // Everything the child needs is built before fork(): the router thread is running.
    std::vector<std::string> env = CommandEnv(**emu);
    std::vector<char*> envp, args;
    for (auto& e : env) envp.push_back(e.data());
    envp.push_back(nullptr);
    for (auto& a : command) args.push_back(a.data());
    args.push_back(nullptr);
    const std::string ns_path =
        in_region >= 0 ? std::string(kNetnsDir) + "/" + (*emu)->NamespaceOf(in_region) : "";
    child = fork();
    if (child < 0) return Fail(InternalError(std::string("fork: ") + std::strerror(errno)));
    if (child == 0) {
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      sigset_t none;
      sigemptyset(&none);
      sigprocmask(SIG_SETMASK, &none, nullptr);
      if (!ns_path.empty()) {
        const int fd = open(ns_path.c_str(), O_RDONLY | O_CLOEXEC);
        if (fd < 0 || setns(fd, CLONE_NEWNET) != 0) _exit(126);
      }
      execvpe(args[0], args.data(), envp.data());
      _exit(127);
    }
  }
  const int code = Supervise(set, **emu, child);
  Status s = (*emu)->Stop();
  if (!s.ok()) std::cerr << kTool << ": teardown: " << s.message() << "\n";
  return code;
}

int CmdUp(const TopologyFlags& flags, bool foreground) {
  if (foreground) return CmdRun(flags, {}, std::nullopt);
  auto options = BuildOptions(flags);
  if (!options.ok()) return Fail(options.status());
  Status priv = CheckPrivileges();
  if (!priv.ok()) return Fail(priv);
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) return Fail(InternalError("pipe2 failed"));
  const pid_t pid = fork();
  if (pid < 0) return Fail(InternalError("fork failed"));
  if (pid > 0) {
    close(fds[1]);
    std::string report;
    char buf[512];
    ssize_t n;
    while ((n = read(fds[0], buf, sizeof(buf))) > 0) report.append(buf, size_t(n));
    close(fds[0]);
    if (report.rfind("OK", 0) == 0) {
      std::cout << report.substr(3);
      return 0;
    }
    std::cerr << kTool << ": " << (report.empty() ? "the daemon died during setup" : report)
              << "\n";
    return 1;
  }
  // The daemon: own session, log to a file next to the pid file, report readiness on the pipe.
  close(fds[0]);
  setsid();
  mkdir(kStateDir, 0755);
  const std::string log_path = std::string(kStateDir) + "/" + flags.name + ".log";
  const int null_fd = open("/dev/null", O_RDONLY);
  const int log_fd = open(log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_APPEND, 0644);
  if (null_fd >= 0) dup2(null_fd, 0);
  if (log_fd >= 0) {
    dup2(log_fd, 1);
    dup2(log_fd, 2);
  }
  const sigset_t set = BlockSignals();
  auto emu = Emulator::Start(std::move(*options));
  std::string report;
  if (!emu.ok()) {
    report = emu.status().message();
  } else {
    report = "OK " + std::string(kTool) + ": instance '" + flags.name + "' up as pid " +
             std::to_string(getpid()) + "; log " + log_path + "\n";
    for (int r = 0; r < (*emu)->regions(); ++r) {
      report += "  region " + std::to_string(r) + ": namespace " + (*emu)->NamespaceOf(r) +
                ", address " + RegionAddress(r) + "\n";
    }
  }
  [[maybe_unused]] ssize_t w = write(fds[1], report.data(), report.size());
  close(fds[1]);
  if (!emu.ok()) return 1;
  const int code = Supervise(set, **emu, -1);
  (*emu)->Stop().IgnoreError();
  return code;
}

int CmdDown(const std::string& name) {
  Status v = ValidateInstanceName(name);
  if (!v.ok()) return Fail(v);
  if (geteuid() != 0) return Fail(PermissionDeniedError("strait-wanem down needs root"));
  const pid_t pid = LiveInstancePid(name);
  const size_t stale = ListNamespaces(NamespacePrefix(name)).size();
  if (pid == 0 && stale == 0) {
    // Like `ip netns del` or `docker rm` of an unknown name: a misspelt --name must not pass for
    // a successful teardown. The repository's scripts tolerate this (`down ... || true`) where
    // they clean up before `up`. Stray state files are still removed.
    RemoveInstance(name).IgnoreError();
    return Fail(NotFoundError("no instance '" + name + "' is up (no running owner, no " +
                              NamespacePrefix(name) + "* namespace); `" + kTool +
                              " list` shows the strait-<name>-r<i> namespaces there are"));
  }
  if (pid > 0) {
    kill(pid, SIGTERM);
    Deadline d = Deadline::AfterSeconds(10.0);
    while (kill(pid, 0) == 0 && !d.Expired()) usleep(20'000);
    if (kill(pid, 0) == 0) {
      std::cerr << kTool << ": pid " << pid << " ignored SIGTERM for 10 s; sending SIGKILL\n";
      kill(pid, SIGKILL);
      Deadline d2 = Deadline::AfterSeconds(2.0);
      while (kill(pid, 0) == 0 && !d2.Expired()) usleep(20'000);
    }
  }
  Status s = RemoveInstance(name);
  if (!s.ok()) return Fail(s);
  std::cout << kTool << ": instance '" << name << "' down"
            << (pid > 0 ? " (stopped pid " + std::to_string(pid) + ")" : " (no running owner)")
            << (stale > 0 ? "; removed " + std::to_string(stale) + " leftover namespaces" : "")
            << "\n";
  return 0;
}

int CmdExec(const std::string& name, int region, std::vector<std::string> command) {
  if (command.empty()) return Fail(InvalidArgumentError("exec needs a command after --"));
  Status v = ValidateInstanceName(name);
  if (!v.ok()) return Fail(v);
  const std::string path = std::string(kNetnsDir) + "/" + NamespaceName(name, region);
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    return Fail(NotFoundError("no region " + std::to_string(region) + " in instance '" + name +
                              "' (" + path + ": " + std::strerror(errno) + ")"));
  }
  if (setns(fd, CLONE_NEWNET) != 0) {
    return Fail(PermissionDeniedError(std::string("setns: ") + std::strerror(errno)));
  }
  close(fd);
  std::vector<char*> args;
  for (auto& a : command) args.push_back(a.data());
  args.push_back(nullptr);
  execvp(args[0], args.data());
  std::cerr << kTool << ": cannot run '" << command[0] << "': " << std::strerror(errno) << "\n";
  return 127;
}

int CmdList() {
  const auto all = ListNamespaces(kNsPrefix);
  if (all.empty()) std::cout << "no strait-wanem namespaces\n";
  for (const auto& ns : all) std::cout << ns << "\n";
  return 0;
}

struct SelfcheckFlags {
  // Two seconds: after BBR's start-up overshoot the receiver holds out-of-order data behind
  // tail drops, and counting its release inside the window reads up to 10% above the link rate
  // at 50-100 ms RTT.
  double warmup_s = 2.0;
  double seconds = 3.0;
  bool aggregate = false;
  int streams = 1;
  double min_aggregate_mbit = 800.0;
  bool json = false;
};

int CmdSelfcheck(TopologyFlags flags, const SelfcheckFlags& sc) {
  if (sc.aggregate) {
    // Capacity: the router's own ceiling, so every link is unlimited (delay and loss stay).
    flags.link += ",rate=unlimited";
    for (auto& p : flags.pairs) p += ",rate=unlimited";
  }
  // Each flag is named with its own range. Written as !(in range) so that NaN is refused too.
  if (!(sc.seconds > 0 && sc.seconds <= 600)) {
    return Fail(InvalidArgumentError("bad --seconds " + FormatNumber(sc.seconds) +
                                     ": the measured window must be more than 0 and at most "
                                     "600 seconds"));
  }
  if (!(sc.warmup_s >= 0 && sc.warmup_s <= 60)) {
    return Fail(InvalidArgumentError("bad --warmup " + FormatNumber(sc.warmup_s) +
                                     ": must be 0 to 60 seconds"));
  }
  if (sc.streams < 1 || sc.streams > 16) {
    return Fail(InvalidArgumentError("bad --streams " + std::to_string(sc.streams) +
                                     ": must be 1 to 16"));
  }
  auto options = BuildOptions(flags);
  if (!options.ok()) return Fail(options.status());
  DieWithParent();
  const LinkTable table = options->table;
  const int mtu = options->mtu;
  const std::string cc = options->cc;
  auto emu = Emulator::Start(std::move(*options));
  if (!emu.ok()) return Fail(emu.status());
  const RegionNamespaces ns = (*emu)->Namespaces();
  const int64_t warmup = int64_t(sc.warmup_s * 1e9);
  const int64_t window = int64_t(sc.seconds * 1e9);
  // TCP payload per IP packet: 20 bytes IP, 20 TCP, 12 of timestamp option.
  const double payload_ratio = double(mtu - 52) / double(mtu);
  nlohmann::json j;
  cli::SetReportHeader(j, kTool);
  j["command"] = "selfcheck";
  j["mtu"] = mtu;
  j["cc"] = cc;
  j["regions"] = table.regions;
  bool pass = true;
  std::ostringstream human;
  human << kTool << " selfcheck: " << table.regions << " regions, MTU " << mtu << ", cc " << cc
        << "\n";

  if (!sc.aggregate) {
    const LinkParams& fwd = table.at(0, 1);
    const LinkParams& back = table.at(1, 0);
    auto rtt = MeasureUdpRtt(ns, 0, 1, 20, 20'000'000);
    if (!rtt.ok()) return Fail(rtt.status().WithContext("RTT probe"));
    auto gp = MeasureTcpGoodput(ns, {{0, 1}}, warmup, window);
    if (!gp.ok()) return Fail(gp.status().WithContext("goodput probe"));
    const double rtt_cfg = double(fwd.delay_ns + back.delay_ns) * 1e-6;
    // Echo datagrams are 64 bytes: their serialisation adds a little at low rates.
    const double tol_ms = std::max(2.0, rtt_cfg * 0.05);
    const bool rtt_ok = std::fabs(rtt->min_ms - rtt_cfg) <= tol_ms + (fwd.jitter_ns > 0 ||
                                                                     back.jitter_ns > 0
                                                                 ? double(fwd.jitter_ns +
                                                                          back.jitter_ns) * 1e-6
                                                                 : 0.0);
    const double got = (*gp)[0].bits_per_second;
    const double want = fwd.rate_bps == 0 ? 0.0 : double(fwd.rate_bps) * payload_ratio;
    const double ratio = want > 0 ? got / want : 0.0;
    const bool rate_ok = want == 0 || std::fabs(ratio - 1.0) <= 0.15 || fwd.loss > 0 ||
                         fwd.ge.enabled();
    pass = rtt_ok && rate_ok;
    human << "link 0>1: " << fwd.ToString() << "\nlink 1>0: " << back.ToString() << "\n";
    char line[256];
    std::snprintf(line, sizeof(line),
                  "  RTT      configured %8.2f ms        measured %8.2f ms (min; median %.2f, "
                  "max %.2f, %d samples, %d lost)  %s\n",
                  rtt_cfg, rtt->min_ms, rtt->median_ms, rtt->max_ms, rtt->samples, rtt->lost,
                  rtt_ok ? "OK" : "OFF");
    human << line;
    std::snprintf(line, sizeof(line),
                  "  goodput  configured %8.2f Mbit/s    measured %8.2f Mbit/s (TCP payload, "
                  "%.1f s after %.1f s warm-up; %s IP rate = %.2f Mbit/s payload)  ratio %.3f  "
                  "%s\n",
                  double(fwd.rate_bps) * 1e-6, got * 1e-6, sc.seconds, sc.warmup_s,
                  FormatRate(double(fwd.rate_bps)).c_str(), want * 1e-6, ratio,
                  rate_ok ? "OK" : "OFF");
    human << line;
    j["link"] = fwd.ToString();
    j["rtt_configured_ms"] = rtt_cfg;
    j["rtt_measured_min_ms"] = rtt->min_ms;
    j["rtt_measured_median_ms"] = rtt->median_ms;
    j["rate_configured_bps"] = fwd.rate_bps;
    j["goodput_expected_bps"] = want;
    j["goodput_measured_bps"] = got;
    j["goodput_ratio"] = ratio;
  } else {
    std::vector<Flow> flows;
    for (int a = 0; a < table.regions; ++a) {
      for (int b = 0; b < table.regions; ++b) {
        for (int s = 0; a != b && s < sc.streams; ++s) flows.push_back({a, b});
      }
    }
    auto gp = MeasureTcpGoodput(ns, flows, warmup, window);
    if (!gp.ok()) return Fail(gp.status().WithContext("aggregate goodput probe"));
    double sum = 0;
    human << "aggregate capacity (every link unlimited, " << flows.size() << " TCP flows, "
          << sc.seconds << " s after " << sc.warmup_s << " s warm-up):\n";
    for (const auto& g : *gp) {
      sum += g.bits_per_second;
      human << "  flow " << g.flow.src << ">" << g.flow.dst << ": "
            << FormatRate(g.bits_per_second) << "\n";
    }
    pass = sum >= sc.min_aggregate_mbit * 1e6;
    char line[200];
    std::snprintf(line, sizeof(line), "  total    %8.1f Mbit/s  (target >= %.0f Mbit/s)  %s\n",
                  sum * 1e-6, sc.min_aggregate_mbit, pass ? "OK" : "BELOW TARGET");
    human << line;
    j["aggregate_bps"] = sum;
    j["aggregate_target_bps"] = sc.min_aggregate_mbit * 1e6;
    j["flows"] = flows.size();
  }
  const RouterStats st = (*emu)->Stats();
  uint64_t queue_drops = 0, lost = 0, filtered = 0;
  for (int a = 0; a < st.regions; ++a) {
    for (int b = 0; b < st.regions; ++b) {
      queue_drops += st.links[a][b].packets[int(Verdict::kQueueFull)];
      lost += st.links[a][b].packets[int(Verdict::kLost)];
      filtered += st.links[a][b].packets[int(Verdict::kFiltered)];
    }
  }
  human << "  router: " << st.packets_in << " packets in, " << lost << " lost (model), "
        << queue_drops << " tail drops, " << filtered << " SYNs filtered, " << st.invalid << " invalid, " << st.write_errors
        << " write errors, largest packet " << st.max_packet_bytes << " bytes\n";
  j["pass"] = pass;
  j["router_packets_in"] = st.packets_in;
  j["router_tail_drops"] = queue_drops;
  j["router_max_packet_bytes"] = st.max_packet_bytes;
  Status stop = (*emu)->Stop();
  if (!stop.ok()) return Fail(stop.WithContext("teardown"));
  if (sc.json) {
    std::cout << j.dump(2) << "\n";
  } else {
    std::cout << human.str();
  }
  return pass ? 0 : 1;
}

}  // namespace

int RunCli(int argc, char** argv) {
  CLI::App app{"strait-wanem: emulates WAN links between regions (network namespaces) on one "
               "machine; needs root"};
  app.require_subcommand(1);
  cli::AddVersionFlag(app, kTool);
  std::string log_level;
  app.add_option("--log-level", log_level, "error, warn, info, debug, trace")->configurable();

  TopologyFlags run_flags, up_flags, sc_flags;
  std::vector<std::string> run_cmd, exec_cmd;
  std::optional<int> run_in;
  CLI::App* run = app.add_subcommand(
      "run", "Bring up the regions, run COMMAND (in the root namespace, or --in REGION), tear "
             "down when it exits or on SIGINT/SIGTERM/parent death; without COMMAND, run until "
             "signalled");
  AddTopologyFlags(run, run_flags);
  run->add_option("--in", run_in,
                  "Run COMMAND inside this region's namespace (0 to regions-1; needs COMMAND)");
  run->add_option("command", run_cmd, "Command and arguments, after --");

  bool foreground = false;
  CLI::App* up = app.add_subcommand("up", "Bring up the regions in a background daemon");
  AddTopologyFlags(up, up_flags);
  up->add_flag("--foreground", foreground, "Stay in the foreground (same as run without a "
                                           "command)");

  std::string down_name = "wanem";
  CLI::App* down = app.add_subcommand("down", "Stop an instance and remove its namespaces");
  down->add_option("--name", down_name, "Instance name")->capture_default_str();

  std::string exec_name = "wanem";
  int exec_region = 0;
  CLI::App* exec = app.add_subcommand("exec", "Run a command inside a region's namespace");
  exec->add_option("--name", exec_name, "Instance name")->capture_default_str();
  exec->add_option("region", exec_region, "Region number")->required();
  exec->add_option("command", exec_cmd, "Command and arguments, after --")->required();

  app.add_subcommand("list", "List strait-wanem namespaces on this machine");

  SelfcheckFlags sc;
  CLI::App* selfcheck = app.add_subcommand(
      "selfcheck", "Measure RTT and TCP goodput between regions 0 and 1 against the "
                   "configuration, or with --aggregate the router's capacity");
  sc_flags.name = "selfcheck";
  sc_flags.link = "50mbit,25ms";
  AddTopologyFlags(selfcheck, sc_flags);
  selfcheck->add_option("--seconds", sc.seconds, "Measured window (more than 0, at most 600)")
      ->capture_default_str();
  selfcheck->add_option("--warmup", sc.warmup_s, "Seconds before the window (slow start), 0-60")
      ->capture_default_str();
  selfcheck->add_flag("--aggregate", sc.aggregate,
                      "Every pair unlimited, one TCP flow per directed pair; report the sum");
  selfcheck->add_option("--streams", sc.streams, "TCP flows per directed pair (--aggregate), 1-16")
      ->capture_default_str();
  selfcheck->add_option("--min-aggregate-mbit", sc.min_aggregate_mbit,
                        "Pass mark for --aggregate")
      ->capture_default_str();
  selfcheck->add_flag("--json", sc.json, "Print one JSON object");

  if (std::optional<int> done = cli::Parse(app, argc, argv, kTool)) return *done;
  Status env = InitLogLevelFromEnv();
  if (!env.ok()) return Fail(env);
  if (!log_level.empty()) {
    auto level = ParseLogLevel(log_level);
    if (!level.ok()) return Fail(level.status());
    SetLogLevel(*level);
  }
  if (run->parsed()) return CmdRun(run_flags, run_cmd, run_in);
  if (up->parsed()) return CmdUp(up_flags, foreground);
  if (down->parsed()) return CmdDown(down_name);
  if (exec->parsed()) return CmdExec(exec_name, exec_region, exec_cmd);
  if (selfcheck->parsed()) return CmdSelfcheck(sc_flags, sc);
  return CmdList();
}

}  // namespace strait::wanem

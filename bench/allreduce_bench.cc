// `strait-bench allreduce`: the orchestrator (emulator, straitds, rank processes, report) and the
// hidden rank mode the orchestrator re-executes this binary in. See allreduce_bench.h.
//
// Rank processes report on stdout, which the orchestrator sends to a file per rank:
//   "progress <iterations done>\n" after each iteration, then one "result <json>\n" line.
#include "bench/allreduce_bench.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "bench/gradient.h"
#include "bench/wanem/config.h"
#include "bench/wanem/emulator.h"
#include "bench/wanem/netns.h"
#include "common/clock.h"
#include "common/units.h"
#include "gateway/client.h"
#include "gateway/config.h"

extern char** environ;

namespace strait::bench {
namespace {

using Json = nlohmann::ordered_json;

constexpr const char* kCommand = "allreduce";
constexpr const char* kJob = "strait-bench-allreduce";
// Ports inside each region's namespace (fresh namespaces: nothing else listens there).
constexpr int kGatewayPortBase = 7400;
constexpr int kRingPortBase = 7600;

struct Flags {
  int regions = 3;
  int ranks_per_region = 2;
  uint64_t size = uint64_t{64} << 20;
  std::string codec = "int8";
  std::string link = "100mbit,20ms";
  int iters = 5;
  int warmup = 1;
  std::string baseline = "none";
  bool loopback = false;
  int streams = 4;
  std::string straitd;
  double timeout_s = 600;
  // Hidden: rank mode.
  std::string role;
  int rank_region = 0;
  int rank_index = 0;
  std::string socket;
  std::string ring_addrs;
};

// Set by SIGINT/SIGTERM in the orchestrator: its waits give up, and Cluster's destructor stops
// the gateways and the emulator instead of leaving them behind.
volatile sig_atomic_t g_interrupted = 0;
void OnStopSignal(int) {
  g_interrupted = 1;
}

uint64_t RegionSeed(int region) {
  return 0x5eed0000u + static_cast<uint64_t>(region);
}

// [begin, end) of slice `index` of `count` elements split `parts` ways.
std::pair<size_t, size_t> Slice(size_t count, int parts, int index) {
  const size_t p = static_cast<size_t>(parts);
  const size_t i = static_cast<size_t>(index);
  return {count * i / p, count * (i + 1) / p};
}

uint64_t Fnv1a(const void* data, size_t bytes) {
  const auto* p = static_cast<const uint8_t*>(data);
  uint64_t h = 0xcbf29ce484222325ull;
  for (size_t i = 0; i < bytes; ++i) h = (h ^ p[i]) * 0x100000001b3ull;
  return h;
}

std::string Hex(uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof(buf), "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

// Worst-case error per block step, by what the gateway resolved: a block's step is
// absmax / levels (int8 127, int4 7; fp8 e4m3's widest gap, 32 at the top of 448, is 1/14).
// 0 for lossless codecs.
double LossyLevels(const std::string& resolved_policy) {
  if (resolved_policy.rfind("int8", 0) == 0) return 127;
  if (resolved_policy.rfind("int4", 0) == 0) return 7;
  if (resolved_policy.rfind("fp8", 0) == 0) return 14;
  return 0;
}

struct Check {
  double max_error = 0;
  uint64_t wrong = 0;
};

// Compares result[0, end-begin) with the fp64 sum over regions of elements [begin, end) of each
// region's tensor. Lossless: within fp32 rounding of the n-term sum. Lossy: each input may be
// off by one step of its block (quantization plus the residual error feedback carries) and the
// result by half a step of its own block; blocks are taken as any 256-element window within two
// blocks either side, since the gateway's shards need not align with this slice.
Check CheckAgainstReference(const float* result, size_t count_total, size_t begin, size_t end,
                            int regions, double levels) {
  const size_t n = end - begin;
  constexpr size_t kBlock = 256;
  const size_t blocks = (n + kBlock - 1) / kBlock;
  std::vector<double> ref(n, 0.0), sum_abs(n, 0.0), step_sum(blocks, 0.0);
  std::vector<float> full(count_total);
  std::vector<double> block_max(blocks);
  auto widen = [&](std::vector<double>& v) {  // max over +-2 blocks
    std::vector<double> w(v.size(), 0.0);
    for (size_t b = 0; b < v.size(); ++b) {
      for (size_t d = (b >= 2 ? b - 2 : 0); d <= std::min(v.size() - 1, b + 2); ++d) {
        w[b] = std::max(w[b], v[d]);
      }
    }
    return w;
  };
  for (int r = 0; r < regions; ++r) {
    FillGradient(RegionSeed(r), full);
    std::fill(block_max.begin(), block_max.end(), 0.0);
    for (size_t i = 0; i < n; ++i) {
      const double x = full[begin + i];
      ref[i] += x;
      sum_abs[i] += std::fabs(x);
      block_max[i / kBlock] = std::max(block_max[i / kBlock], std::fabs(x));
    }
    const std::vector<double> w = widen(block_max);
    for (size_t b = 0; b < blocks; ++b) step_sum[b] += w[b];
  }
  std::fill(block_max.begin(), block_max.end(), 0.0);
  for (size_t i = 0; i < n; ++i) {
    block_max[i / kBlock] = std::max(block_max[i / kBlock], std::fabs(ref[i]));
  }
  const std::vector<double> out_max = widen(block_max);
  Check c;
  for (size_t i = 0; i < n; ++i) {
    const double err = std::fabs(static_cast<double>(result[i]) - ref[i]);
    double tol;
    if (levels > 0) {
      // 1.25: error feedback's compensated input can exceed the block's absmax by a step.
      tol = 1.25 * (step_sum[i / kBlock] + 0.5 * out_max[i / kBlock]) / levels;
    } else {
      tol = 4.0 * regions * 1.2e-7 * sum_abs[i];
    }
    tol += 1e-37;
    c.max_error = std::max(c.max_error, err);
    c.wrong += err > tol || std::isnan(result[i]);
  }
  return c;
}

void Emit(const std::string& line) {
  std::fwrite(line.data(), 1, line.size(), stdout);
  std::fputc('\n', stdout);
  std::fflush(stdout);
}

uint64_t BytesSent(const std::string& stats) {
  const size_t at = stats.find("bytes_sent ");
  if (at == std::string::npos) return 0;
  return std::strtoull(stats.c_str() + at + 11, nullptr, 10);
}

// --- Rank mode: mesh (through the rank's own straitd) -----------------------------------------

int RunMeshRank(const Flags& f) {
  const Deadline connect_deadline = Deadline::AfterSeconds(60);
  StatusOr<std::unique_ptr<gateway::Client>> client = UnavailableError("not tried");
  while (!connect_deadline.Expired()) {
    client = gateway::Client::Connect(f.socket, Deadline::AfterSeconds(5),
                                      "bench-r" + std::to_string(f.rank_region));
    if (client.ok()) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  if (!client.ok()) {
    std::cerr << "rank " << f.rank_region << "." << f.rank_index << ": " << client.status() << '\n';
    return kExitFailure;
  }
  StatusOr<std::string> policy = (*client)->RegisterJob(kJob, f.codec, Deadline::AfterSeconds(10));
  if (!policy.ok()) {
    std::cerr << "rank " << f.rank_region << ": register: " << policy.status() << '\n';
    return kExitFailure;
  }
  const size_t count = f.size / 4;
  const auto [begin, end] = Slice(count, f.ranks_per_region, f.rank_index);
  std::vector<float> input(end - begin), data(end - begin);
  {
    std::vector<float> full(count);
    FillGradient(RegionSeed(f.rank_region), full);
    std::copy(full.begin() + static_cast<ptrdiff_t>(begin),
              full.begin() + static_cast<ptrdiff_t>(end), input.begin());
  }
  Json times = Json::array();
  uint64_t sent_before = 0;
  for (int it = 0; it < f.warmup + f.iters; ++it) {
    if (it == f.warmup) {
      StatusOr<std::string> stats = (*client)->Stats(Deadline::AfterSeconds(10));
      sent_before = stats.ok() ? BytesSent(*stats) : 0;
    }
    data = input;
    const int64_t t0 = MonotonicNanos();
    Status s = (*client)->AllReduce(kJob, "grad", DataType::kFloat32, ReduceOp::kSum, data.data(),
                                    data.size(), Deadline::AfterSeconds(f.timeout_s));
    const int64_t t1 = MonotonicNanos();
    if (!s.ok()) {
      std::cerr << "rank " << f.rank_region << "." << f.rank_index << ": all-reduce " << it << ": "
                << s << '\n';
      return kExitFailure;
    }
    if (it >= f.warmup) times.push_back(t1 - t0);
    Emit("progress " + std::to_string(it + 1));
  }
  StatusOr<std::string> stats = (*client)->Stats(Deadline::AfterSeconds(10));
  const uint64_t sent = stats.ok() ? BytesSent(*stats) - sent_before : 0;
  const Check c =
      CheckAgainstReference(data.data(), count, begin, end, f.regions, LossyLevels(*policy));
  Json out;
  out["region"] = f.rank_region;
  out["rank"] = f.rank_index;
  out["policy"] = *policy;
  out["times_ns"] = times;
  out["wan_bytes_sent"] = sent;
  out["max_error"] = c.max_error;
  out["wrong"] = c.wrong;
  out["hash"] = Hex(Fnv1a(data.data(), data.size() * 4));
  Emit("result " + out.dump());
  return kExitOk;
}

// --- Rank mode: ring baseline (plain TCP between rank processes) -------------------------------

StatusOr<sockaddr_in> ToSockaddr(const std::string& host_port) {
  StatusOr<gateway::HostPort> hp = gateway::ParseHostPort(host_port);
  if (!hp.ok()) return std::move(hp).status();
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(hp->port);
  if (::inet_pton(AF_INET, hp->host.c_str(), &a.sin_addr) != 1) {
    return InvalidArgumentError("not an IPv4 address: " + hp->host);
  }
  return a;
}

bool SendAll(int fd, const void* p, size_t n) {
  const auto* b = static_cast<const uint8_t*>(p);
  while (n > 0) {
    const ssize_t k = ::send(fd, b, n, MSG_NOSIGNAL);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) return false;
    b += k;
    n -= static_cast<size_t>(k);
  }
  return true;
}

bool RecvAll(int fd, void* p, size_t n) {
  auto* b = static_cast<uint8_t*>(p);
  while (n > 0) {
    const ssize_t k = ::recv(fd, b, n, 0);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) return false;
    b += k;
    n -= static_cast<size_t>(k);
  }
  return true;
}

// Accepts the previous rank and connects to the next; returns {prev_fd, next_fd}.
StatusOr<std::pair<int, int>> ConnectRing(const std::vector<std::string>& addrs, int pos) {
  const int p = static_cast<int>(addrs.size());
  StatusOr<sockaddr_in> self = ToSockaddr(addrs[static_cast<size_t>(pos)]);
  StatusOr<sockaddr_in> next = ToSockaddr(addrs[static_cast<size_t>((pos + 1) % p)]);
  if (!self.ok()) return std::move(self).status();
  if (!next.ok()) return std::move(next).status();
  const int lfd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  const int one = 1;
  ::setsockopt(lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (::bind(lfd, reinterpret_cast<const sockaddr*>(&*self), sizeof(*self)) != 0 ||
      ::listen(lfd, 4) != 0) {
    const std::string why = std::strerror(errno);
    ::close(lfd);
    return UnavailableError("ring: cannot listen on " + addrs[static_cast<size_t>(pos)] + ": " +
                            why);
  }
  int nfd = -1;
  const Deadline deadline = Deadline::AfterSeconds(60);
  std::thread dialer([&] {
    while (!deadline.Expired()) {
      nfd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
      if (::connect(nfd, reinterpret_cast<const sockaddr*>(&*next), sizeof(*next)) == 0) return;
      ::close(nfd);
      nfd = -1;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  });
  const int pfd = ::accept4(lfd, nullptr, nullptr, SOCK_CLOEXEC);
  dialer.join();
  ::close(lfd);
  if (pfd < 0 || nfd < 0) {
    if (pfd >= 0) ::close(pfd);
    if (nfd >= 0) ::close(nfd);
    return UnavailableError("ring: cannot connect the ring at position " + std::to_string(pos));
  }
  ::setsockopt(nfd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  return std::make_pair(pfd, nfd);
}

// In-place ring all-reduce (reduce-scatter then all-gather) of fp32 sums: each chunk is summed
// along the ring once and then copied, so every rank ends with the same bits.
bool RingAllReduce(float* data, size_t count, int p, int pos, int prev_fd, int next_fd,
                   std::vector<float>& scratch) {
  auto chunk = [&](int c) { return Slice(count, p, ((c % p) + p) % p); };
  for (int phase = 0; phase < 2; ++phase) {
    for (int s = 0; s < p - 1; ++s) {
      const auto [sb, se] = chunk(phase == 0 ? pos - s : pos + 1 - s);
      const auto [rb, re] = chunk(phase == 0 ? pos - s - 1 : pos - s);
      bool sent = false;
      std::thread sender(
          [&, sb = sb, se = se] { sent = SendAll(next_fd, data + sb, (se - sb) * 4); });
      float* dst = phase == 0 ? scratch.data() : data + rb;
      const bool got = RecvAll(prev_fd, dst, (re - rb) * 4);
      sender.join();
      if (!sent || !got) return false;
      if (phase == 0) {
        for (size_t i = 0; i < re - rb; ++i) data[rb + i] += scratch[i];
      }
    }
  }
  return true;
}

int RunRingRank(const Flags& f) {
  const std::vector<std::string> addrs = SplitList(f.ring_addrs);
  const int p = static_cast<int>(addrs.size());
  const int pos = f.rank_region * f.ranks_per_region + f.rank_index;
  StatusOr<std::pair<int, int>> fds = ConnectRing(addrs, pos);
  if (!fds.ok()) {
    std::cerr << fds.status() << '\n';
    return kExitFailure;
  }
  const size_t count = f.size / 4;
  // The same data as the mesh run: this rank holds slice rank_index of its region's tensor
  // (zeros elsewhere), so the ring's sum equals the mesh's.
  std::vector<float> input(count, 0.0f), data(count), scratch(count / static_cast<size_t>(p) + 1);
  {
    std::vector<float> full(count);
    FillGradient(RegionSeed(f.rank_region), full);
    const auto [b, e] = Slice(count, f.ranks_per_region, f.rank_index);
    std::copy(full.begin() + static_cast<ptrdiff_t>(b), full.begin() + static_cast<ptrdiff_t>(e),
              input.begin() + static_cast<ptrdiff_t>(b));
  }
  Json times = Json::array();
  for (int it = 0; it < f.warmup + f.iters; ++it) {
    data = input;
    const int64_t t0 = MonotonicNanos();
    if (!RingAllReduce(data.data(), count, p, pos, fds->first, fds->second, scratch)) {
      std::cerr << "ring rank " << pos << ": connection lost in iteration " << it << '\n';
      return kExitFailure;
    }
    const int64_t t1 = MonotonicNanos();
    if (it >= f.warmup) times.push_back(t1 - t0);
    Emit("progress " + std::to_string(it + 1));
  }
  ::close(fds->first);
  ::close(fds->second);
  const Check c = CheckAgainstReference(data.data(), count, 0, count, f.regions, 0);
  Json out;
  out["region"] = f.rank_region;
  out["rank"] = f.rank_index;
  out["policy"] = "none (flat ring, plain TCP)";
  out["times_ns"] = times;
  out["wan_bytes_sent"] = 0;
  out["max_error"] = c.max_error;
  out["wrong"] = c.wrong;
  out["hash"] = Hex(Fnv1a(data.data(), data.size() * 4));
  Emit("result " + out.dump());
  return kExitOk;
}

// --- Orchestrator --------------------------------------------------------------------------------

std::string SelfExe() {
  std::error_code ec;
  return std::filesystem::read_symlink("/proc/self/exe", ec).string();
}

std::string FindStraitd(const std::string& flag) {
  if (!flag.empty()) return flag;
  const std::filesystem::path dir = std::filesystem::path(SelfExe()).parent_path();
  for (const auto& candidate : {dir / "straitd", dir / ".." / "tools" / "straitd" / "straitd"}) {
    if (::access(candidate.c_str(), X_OK) == 0) return candidate.lexically_normal().string();
  }
  return "straitd";  // PATH
}

// Starts argv (searched on PATH) with stdout and stderr into files.
StatusOr<pid_t> Spawn(const std::vector<std::string>& argv, const std::string& out,
                      const std::string& err) {
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, out.c_str(),
                                   O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_addopen(&actions, STDERR_FILENO, err.c_str(),
                                   O_WRONLY | O_CREAT | O_TRUNC, 0644);
  std::vector<char*> args;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  pid_t pid = 0;
  const int rc = ::posix_spawnp(&pid, args[0], &actions, nullptr, args.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  if (rc != 0) return UnavailableError("cannot start " + argv[0] + ": " + std::strerror(rc));
  return pid;
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Ports the kernel just handed out for 127.0.0.1 (all held open at once, so they differ).
std::vector<uint16_t> FreeLoopbackPorts(int n) {
  std::vector<int> fds;
  std::vector<uint16_t> ports;
  for (int i = 0; i < n; ++i) {
    const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof(a);
    if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0 &&
        ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0) {
      ports.push_back(ntohs(a.sin_port));
    } else {
      ports.push_back(0);
    }
    fds.push_back(fd);
  }
  for (int fd : fds) ::close(fd);
  return ports;
}

struct Proc {
  pid_t pid = -1;
  std::string name, out, err;
};

// Everything the run started, stopped and removed however the run ends.
struct Cluster {
  std::string dir;
  std::unique_ptr<wanem::Emulator> emulator;
  std::vector<Proc> daemons;

  ~Cluster() {
    for (Proc& d : daemons) {
      if (d.pid > 0) ::kill(d.pid, SIGTERM);
    }
    for (Proc& d : daemons) {
      if (d.pid <= 0) continue;
      int status = 0;
      bool gone = false;
      for (int i = 0; i < 100 && !gone; ++i) {
        gone = ::waitpid(d.pid, &status, WNOHANG) == d.pid;
        if (!gone) std::this_thread::sleep_for(std::chrono::milliseconds(50));
      }
      if (!gone) {
        ::kill(d.pid, SIGKILL);
        ::waitpid(d.pid, &status, 0);
      }
    }
    if (emulator) emulator->Stop().IgnoreError();
    if (!dir.empty()) {
      std::error_code ec;
      std::filesystem::remove_all(dir, ec);
    }
  }
};

struct Setup {
  bool emulated = false;
  std::string why_loopback;
  wanem::LinkTable table;
};

std::vector<std::string> InRegion(const Cluster& c, int region, std::vector<std::string> argv) {
  if (!c.emulator) return argv;
  std::vector<std::string> full = {"ip", "netns", "exec", c.emulator->NamespaceOf(region)};
  full.insert(full.end(), argv.begin(), argv.end());
  return full;
}

std::string Addr(const Setup& s, int region) {
  return s.emulated ? wanem::RegionAddress(region) : "127.0.0.1";
}

Status StartGateways(const Flags& f, const Setup& s, Cluster& c) {
  const int n = f.regions, k = f.ranks_per_region;
  const std::vector<uint16_t> free_ports =
      s.emulated ? std::vector<uint16_t>{} : FreeLoopbackPorts(n * k);
  auto port = [&](int r, int i) {
    return s.emulated ? kGatewayPortBase + i : free_ports[static_cast<size_t>(r * k + i)];
  };
  const std::string straitd = FindStraitd(f.straitd);
  for (int r = 0; r < n; ++r) {
    for (int i = 0; i < k; ++i) {
      const std::string base = c.dir + "/g" + std::to_string(r) + "_" + std::to_string(i);
      std::string t =
          "region = \"r" + std::to_string(r) + "\"\nshard_index = " + std::to_string(i) + "\n";
      t += "[local]\nsocket = \"" + base + ".sock\"\nallowed_uids = [" +
           std::to_string(::getuid()) + "]\n";
      t += "[wan]\nlisten = \"" + Addr(s, r) + ":" + std::to_string(port(r, i)) +
           "\"\ntransport = \"plain\"\n";
      for (int p = 0; p < n; ++p) {
        if (p == r) continue;
        t += "[peers.r" + std::to_string(p) + "]\nshard_" + std::to_string(i) + " = \"" +
             Addr(s, p) + ":" + std::to_string(port(p, i)) + "\"\n";
      }
      t += "[link]\nstreams = " + std::to_string(f.streams) + "\n";
      t += "[policy]\nmin_lossy_bytes = \"4KiB\"\nmax_relative_error = 1.0\n";
      const long secs = std::lround(f.timeout_s);
      t += "[allreduce]\ndeadline = \"" + std::to_string(secs) + "s\"\nshutdown_grace = \"2s\"\n";
      std::ofstream(base + ".toml") << t;
      Proc d{-1, "straitd r" + std::to_string(r) + "." + std::to_string(i), base + ".out",
             base + ".err"};
      StatusOr<pid_t> pid =
          Spawn(InRegion(c, r, {straitd, "--config", base + ".toml"}), d.out, d.err);
      if (!pid.ok()) return std::move(pid).status();
      d.pid = *pid;
      c.daemons.push_back(d);
    }
  }
  // Ready when each has printed its "ready" line; an early exit is an error with its stderr.
  const Deadline deadline = Deadline::AfterSeconds(30);
  for (Proc& d : c.daemons) {
    while (ReadFile(d.out).find("straitd ready") == std::string::npos) {
      int status = 0;
      if (::waitpid(d.pid, &status, WNOHANG) == d.pid) {
        d.pid = -1;
        return UnavailableError(d.name + " (" + straitd + ") exited: " + ReadFile(d.err));
      }
      if (deadline.Expired()) return DeadlineExceededError(d.name + " not ready in 30 s");
      if (g_interrupted) return CancelledError("interrupted");
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }
  return Status::Ok();
}

struct RunResult {
  std::string label;
  std::string policy;
  int participants = 0;  // busbw's n
  double time_s = 0;     // mean over iterations of the slowest rank's time
  double max_error = 0;
  uint64_t wrong = 0;
  bool identical = true;
  uint64_t wan_bytes_per_iter_max_region = 0;  // mesh: the busiest region's WAN bytes sent
  int64_t wall_ns = 0;
};

// Runs one rank process per (region, index) with `extra` rank flags, waits with a progress
// line, and folds their results.
StatusOr<RunResult> RunRanks(const Flags& f, Cluster& c, const std::string& role,
                             const std::vector<std::string>& extra, ProgressLine* progress) {
  const int n = f.regions, k = f.ranks_per_region;
  std::vector<Proc> ranks;
  const Stopwatch wall;
  for (int r = 0; r < n; ++r) {
    for (int i = 0; i < k; ++i) {
      const std::string base = c.dir + "/" + role + std::to_string(r) + "_" + std::to_string(i);
      std::vector<std::string> argv = {
          SelfExe(),
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
          "--codec",
          f.codec,
          "--timeout",
          std::to_string(f.timeout_s),
          "--rank-socket",
          c.dir + "/g" + std::to_string(r) + "_" + std::to_string(i) + ".sock"};
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
  Status failure;
  size_t running = ranks.size();
  const Deadline deadline = Deadline::AfterSeconds(f.timeout_s * total_iters + 120);
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
    progress->Update(role + ": " + std::to_string(slowest) + "/" + std::to_string(total_iters) +
                     " iterations (" + std::to_string(f.warmup) + " warm-up), " +
                     FormatDuration(wall.ElapsedNanos()));
    if (running > 0) std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  RunResult res;
  res.wall_ns = wall.ElapsedNanos();
  std::vector<int64_t> slowest(static_cast<size_t>(f.iters), 0);
  std::vector<std::string> hashes(static_cast<size_t>(k));
  std::vector<uint64_t> region_bytes(static_cast<size_t>(n), 0);
  for (size_t idx = 0; idx < ranks.size(); ++idx) {
    const std::string out = ReadFile(ranks[idx].out);
    const size_t at = out.find("result ");
    if (at == std::string::npos) return UnknownError(ranks[idx].name + " printed no result");
    Json j = Json::parse(out.substr(at + 7), nullptr, false);
    if (j.is_discarded()) return UnknownError(ranks[idx].name + " printed a bad result");
    for (size_t it = 0; it < slowest.size() && it < j["times_ns"].size(); ++it) {
      slowest[it] = std::max(slowest[it], j["times_ns"][it].get<int64_t>());
    }
    res.policy = j["policy"].get<std::string>();
    res.max_error = std::max(res.max_error, j["max_error"].get<double>());
    res.wrong += j["wrong"].get<uint64_t>();
    // Mesh: rank i of every region holds the same slice; ring: every rank the whole tensor.
    const size_t slot = role == "mesh" ? idx % static_cast<size_t>(k) : 0;
    const std::string h = j["hash"].get<std::string>();
    if (hashes[slot].empty()) hashes[slot] = h;
    res.identical = res.identical && hashes[slot] == h;
    region_bytes[idx / static_cast<size_t>(k)] += j["wan_bytes_sent"].get<uint64_t>();
  }
  double sum = 0;
  for (int64_t t : slowest) sum += static_cast<double>(t);
  res.time_s = sum / std::max(1, f.iters) / 1e9;
  res.wan_bytes_per_iter_max_region = *std::max_element(region_bytes.begin(), region_bytes.end()) /
                                      static_cast<uint64_t>(std::max(1, f.iters));
  return res;
}

struct Report {
  Flags flags;
  Setup setup;
  std::vector<RunResult> runs;
  double bound_s = 0;        // mesh, with the measured codec ratio
  double bound_plain_s = 0;  // r = 1
  double codec_ratio = 0;
  // strait-wanem gives every directed pair its own rate B, so each link carries 2S/(n r) and the
  // mesh's real floor is 2L + 2S/(n r B): below DESIGN's bound, which counts a region's egress
  // as one link of rate B. Printed beside it, so that measured/bound < 1 is explained.
  double pair_bound_s = 0;
};

// DESIGN "Performance model": T >= 2L + 2S(n-1)/(n r B), for equal links.
double LinkBound(const Setup& s, int n, double bytes, double ratio) {
  const wanem::LinkParams& p = s.table.at(0, n > 1 ? 1 : 0);
  const double b = static_cast<double>(p.rate_bps) / 8.0;
  if (b <= 0 || ratio <= 0) return 0;
  return 2.0 * static_cast<double>(p.delay_ns) / 1e9 + 2.0 * bytes * (n - 1) / (n * ratio * b);
}

std::string FormatTable(const Report& rep) {
  const Flags& f = rep.flags;
  std::ostringstream o;
  char line[512];
  o << "# strait-bench allreduce: " << f.regions << " regions x " << f.ranks_per_region
    << " ranks, fp32 sum, " << f.iters << " iterations after " << f.warmup << " warm-up\n";
  o << "# " << CpuModelName() << ", " << UtcTimestamp() << '\n';
  if (rep.setup.emulated) {
    o << "# links: strait-wanem, every pair " << rep.setup.table.at(0, 1).ToString() << '\n';
  } else {
    o << "# links: 127.0.0.1 loopback, NOT emulated (" << rep.setup.why_loopback
      << "): the link bound does not apply\n";
  }
  o << "# sidecar mode: rank i of each region all-reduces its 1/" << f.ranks_per_region
    << " slice through its own straitd (shard i); the straitds of shard i form the mesh. No "
       "NCCL here: the intra-region reduce-scatter/all-gather are not run.\n";
  o << "# busbw = algbw x 2(n-1)/n with n = regions (mesh) or all ranks (ring)\n";
  std::snprintf(line, sizeof(line), "%-22s %12s %11s %6s %6s %10s %9s %9s %10s %7s %9s %9s %s\n",
                "#run", "size", "count", "type", "redop", "time(ms)", "algbw", "busbw", "maxerr",
                "#wrong", "bound(ms)", "meas/bnd", "identical");
  o << line;
  std::snprintf(line, sizeof(line), "%-22s %12s %11s %6s %6s %10s %9s %9s %10s %7s %9s %9s\n", "#",
                "(B)", "(elements)", "", "", "", "(GB/s)", "(GB/s)", "", "", "", "");
  o << line;
  for (size_t i = 0; i < rep.runs.size(); ++i) {
    const RunResult& r = rep.runs[i];
    const double algbw = static_cast<double>(f.size) / r.time_s / 1e9;
    const double busbw = algbw * 2.0 * (r.participants - 1) / r.participants;
    const double bound = i == 0 ? rep.bound_s : rep.bound_plain_s;
    char bound_text[32] = "n/a", ratio_text[32] = "n/a";
    if (rep.setup.emulated && bound > 0) {
      std::snprintf(bound_text, sizeof(bound_text), "%.1f", bound * 1e3);
      std::snprintf(ratio_text, sizeof(ratio_text), "%.2f", r.time_s / bound);
    }
    std::snprintf(line, sizeof(line),
                  "%-22s %12llu %11llu %6s %6s %10.1f %9.4f %9.4f %10.3g %7llu %9s %9s %s\n",
                  r.label.c_str(), static_cast<unsigned long long>(f.size),
                  static_cast<unsigned long long>(f.size / 4), "float", "sum", r.time_s * 1e3,
                  algbw, busbw, r.max_error, static_cast<unsigned long long>(r.wrong), bound_text,
                  ratio_text, r.identical ? "yes" : "NO");
    o << line;
  }
  o << "# mesh policy (as the gateways resolved it): " << rep.runs[0].policy << '\n';
  if (rep.codec_ratio > 0) {
    std::snprintf(line, sizeof(line), "# codec ratio on the wire (measured): %.2f\n",
                  rep.codec_ratio);
    o << line;
  }
  if (rep.setup.emulated) {
    o << "# link bound: T >= 2L + 2S(n-1)/(n r B), L one-way delay, B one directed link; the "
         "ring row is held to the uncompressed mesh bound (r = 1)\n";
    std::snprintf(line, sizeof(line),
                  "# per-pair floor of the mesh (every directed pair has its own rate here, so "
                  "each carries 2S/(n r)): 2L + 2S/(n r B) = %.1f ms, measured/floor %.2f\n",
                  rep.pair_bound_s * 1e3, rep.runs[0].time_s / rep.pair_bound_s);
    o << line;
  }
  if (rep.runs.size() > 1) {
    std::snprintf(line, sizeof(line), "# ring baseline / mesh time: %.2fx\n",
                  rep.runs[1].time_s / rep.runs[0].time_s);
    o << line;
  }
  return o.str();
}

std::string FormatJson(const Report& rep) {
  const Flags& f = rep.flags;
  Json j;
  j["command"] = kCommand;
  j["timestamp"] = UtcTimestamp();
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
  j["link"] = rep.setup.emulated ? Json(rep.setup.table.at(0, 1).ToString()) : Json(nullptr);
  j["loopback_reason"] = rep.setup.emulated ? Json(nullptr) : Json(rep.setup.why_loopback);
  j["mode"] = "sidecar: rank i of each region all-reduces its slice through its own straitd";
  j["codec_ratio"] = rep.codec_ratio;
  j["mesh_pair_floor_s"] = rep.setup.emulated ? Json(rep.pair_bound_s) : Json(nullptr);
  Json runs = Json::array();
  for (size_t i = 0; i < rep.runs.size(); ++i) {
    const RunResult& r = rep.runs[i];
    const double algbw = static_cast<double>(f.size) / r.time_s / 1e9;
    const double bound = i == 0 ? rep.bound_s : rep.bound_plain_s;
    Json x;
    x["name"] = r.label;
    x["policy"] = r.policy;
    x["time_s"] = r.time_s;
    x["algbw_gbs"] = algbw;
    x["busbw_gbs"] = algbw * 2.0 * (r.participants - 1) / r.participants;
    x["max_error"] = r.max_error;
    x["wrong"] = r.wrong;
    x["identical"] = r.identical;
    x["bound_s"] = rep.setup.emulated && bound > 0 ? Json(bound) : Json(nullptr);
    x["measured_over_bound"] =
        rep.setup.emulated && bound > 0 ? Json(r.time_s / bound) : Json(nullptr);
    runs.push_back(x);
  }
  j["runs"] = runs;
  j["baseline_over_mesh"] =
      rep.runs.size() > 1 ? Json(rep.runs[1].time_s / rep.runs[0].time_s) : Json(nullptr);
  return j.dump(2) + "\n";
}

int RunOrchestrator(const Flags& f, const GlobalFlags& globals) {
  struct sigaction sa {};
  sa.sa_handler = OnStopSignal;
  ::sigaction(SIGINT, &sa, nullptr);
  ::sigaction(SIGTERM, &sa, nullptr);
  Setup s;
  if (f.loopback) {
    s.why_loopback = "--loopback";
  } else if (Status p = wanem::CheckPrivileges(); !p.ok()) {
    s.why_loopback = "no emulation: " + p.message();
  } else {
    s.emulated = true;
  }
  StatusOr<wanem::LinkTable> table = wanem::BuildLinkTable(f.regions, f.link, {});
  if (!table.ok()) return UsageError(kCommand, "--link", table.status().message());
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
  if (s.emulated) {
    progress.Update("starting strait-wanem");
    wanem::EmulatorOptions eo;
    eo.name = "bench" + std::to_string(::getpid() % 100000);
    eo.table = s.table;
    StatusOr<std::unique_ptr<wanem::Emulator>> emu = wanem::Emulator::Start(std::move(eo));
    if (!emu.ok()) return fail(emu.status());
    c.emulator = *std::move(emu);
  }
  progress.Update("starting " + std::to_string(f.regions * f.ranks_per_region) + " straitd");
  if (Status st = StartGateways(f, s, c); !st.ok()) return fail(st);

  Report rep;
  rep.flags = f;
  rep.setup = s;
  StatusOr<RunResult> mesh = RunRanks(f, c, "mesh", {}, &progress);
  if (!mesh.ok()) return fail(mesh.status());
  mesh->label = "mesh " + f.codec;
  mesh->participants = f.regions;
  rep.runs.push_back(*mesh);

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
    for (const std::string& a : addrs) list += (list.empty() ? "" : ",") + a;
    StatusOr<RunResult> ring = RunRanks(f, c, "ring", {"--ring-addrs", list}, &progress);
    if (!ring.ok()) return fail(ring.status());
    ring->label = "ring none (baseline)";
    ring->participants = f.regions * f.ranks_per_region;
    rep.runs.push_back(*ring);
  }
  progress.Clear();

  const double n = f.regions;
  const double plain_bytes_per_region = 2.0 * static_cast<double>(f.size) * (n - 1) / n;
  if (rep.runs[0].wan_bytes_per_iter_max_region > 0) {
    rep.codec_ratio =
        plain_bytes_per_region / static_cast<double>(rep.runs[0].wan_bytes_per_iter_max_region);
  }
  rep.bound_s = LinkBound(s, f.regions, static_cast<double>(f.size),
                          rep.codec_ratio > 0 ? rep.codec_ratio : 1.0);
  rep.bound_plain_s = LinkBound(s, f.regions, static_cast<double>(f.size), 1.0);
  if (s.emulated && f.regions > 1) {
    // LinkBound with the (n-1) factor undone: 2S(n-1)/(n r B) -> 2S/(n r B).
    const double latency = 2.0 * static_cast<double>(s.table.at(0, 1).delay_ns) / 1e9;
    rep.pair_bound_s = latency + (rep.bound_s - latency) / (f.regions - 1);
  }

  std::cout << (globals.json ? FormatJson(rep) : FormatTable(rep));
  std::cout.flush();
  bool ok = true;
  for (const RunResult& r : rep.runs) ok = ok && r.wrong == 0 && r.identical;
  if (!ok) std::cerr << "strait-bench allreduce: FAILED: wrong or non-identical results\n";
  return ok ? kExitOk : kExitFailure;
}

}  // namespace

CommandMain SetupAllReduceCommand(CLI::App& cmd) {
  auto f = std::make_shared<Flags>();
  cmd.add_option("--regions", f->regions, "Regions (each its own network namespace)")
      ->check(IntValidator(2, 16))
      ->capture_default_str();
  cmd.add_option("--ranks-per-region", f->ranks_per_region,
                 "Rank processes per region, each with its own straitd")
      ->check(IntValidator(1, 8))
      ->capture_default_str();
  cmd.add_option("--size", f->size, "fp32 bytes all-reduced per iteration (e.g. 64MiB)")
      ->transform(SizeValidator(1024, uint64_t{4} << 30))
      ->capture_default_str();
  cmd.add_option("--codec", f->codec,
                 "Job policy for the mesh: none, zstd[:L], int8, int4, fp8, auto [,ef|,noef]")
      ->capture_default_str();
  cmd.add_option("--link", f->link,
                 "Every emulated link: rate,one-way delay[,loss=...] (strait-wanem link spec)")
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
  cmd.add_flag("--loopback", f->loopback,
               "Everything on 127.0.0.1, no emulation (the default without root)");
  cmd.add_option("--streams", f->streams, "WAN streams per gateway link")
      ->check(IntValidator(1, 64))
      ->capture_default_str();
  cmd.add_option("--straitd", f->straitd,
                 "straitd binary (default: next to strait-bench, the build tree, then PATH)")
      ->type_name("PATH");
  cmd.add_option("--timeout", f->timeout_s, "Seconds one all-reduce may take")
      ->check(CLI::Range(1.0, 86400.0))
      ->capture_default_str();
  // Rank mode, used by the orchestrator only.
  cmd.add_option("--rank-role", f->role)->group("");
  cmd.add_option("--rank-region", f->rank_region)->group("");
  cmd.add_option("--rank-index", f->rank_index)->group("");
  cmd.add_option("--rank-socket", f->socket)->group("");
  cmd.add_option("--ring-addrs", f->ring_addrs)->group("");

  return [f](const GlobalFlags& globals) -> int {
    ::signal(SIGPIPE, SIG_IGN);
    if (f->size % 4 != 0) return UsageError(kCommand, "--size", "must be a multiple of 4 (fp32)");
    if (f->role == "mesh") return RunMeshRank(*f);
    if (f->role == "ring") return RunRingRank(*f);
    if (!f->role.empty()) return UsageError(kCommand, "--rank-role", "mesh or ring");
    return RunOrchestrator(*f, globals);
  };
}

}  // namespace strait::bench

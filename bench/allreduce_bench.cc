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
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "bench/gradient.h"
#include "bench/wanem/config.h"
#include "bench/wanem/emulator.h"
#include "bench/wanem/netns.h"
#include "collective/plan.h"
#include "common/clock.h"
#include "common/strings.h"
#include "common/units.h"
#include "localproto/client.h"
#include "gateway/config.h"
#include "tools/cli/cli.h"

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
  std::string codec = "int8";  // a list: one mesh row per codec (and shard mode)
  std::string link = "100mbit,20ms";
  std::vector<std::string> pairs;   // strait-wanem --pair overrides
  std::string shards = "weighted";  // a list of "weighted", "balanced", "measured", "even"
  std::string transport = "auto";   // auto (tls when emulated), tls, plain
  int iters = 5;
  int warmup = 1;
  std::string baseline = "none";
  bool loopback = false;
  int streams = gateway::kDefaultLinkStreams;  // straitd's link.streams default
  bool adapt_streams = true;
  std::string cc;  // straitd's link.congestion_control; empty: the namespace's default
  std::string straitd;
  double timeout_s = 600;
  // Hidden: rank mode.
  std::string role;
  int rank_region = 0;
  int rank_index = 0;
  std::string socket;
  std::string ring_addrs;
  std::string job = kJob;
  std::string barrier;  // the directory of the per-iteration barrier (see IterationBarrier)
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

// The value of line "<key> <value>" in straitd's stats text; 0 when absent.
uint64_t StatValue(const std::string& stats, const std::string& key) {
  const std::string needle = key + " ";
  size_t at = 0;
  while ((at = stats.find(needle, at)) != std::string::npos) {
    if (at == 0 || stats[at - 1] == '\n') {
      return std::strtoull(stats.c_str() + at + needle.size(), nullptr, 10);
    }
    at += needle.size();
  }
  return 0;
}

// straitd's time counters (see gateway_impl.h) that the report splits an iteration into.
constexpr const char* kTimeKeys[] = {"handle_ns", "allreduce_ns", "encode_ns",  "reduce_ns",
                                     "decode_ns", "wait_ns",      "ack_wait_ns"};

// Every rank of a run waits here before each iteration, so that an iteration's time is that of
// a synchronous collective whose ranks all arrive together (as in training, and as OSU's
// benchmarks put a barrier between iterations). Without it, back-to-back iterations drift apart
// (starts 0.3-0.6 s apart across the two gateway groups of a sidecar run), and a rank that
// starts early counts the late ones' start as its own time. The ranks share the file system
// (strait-wanem puts them in network namespaces only): each marks its arrival with a file
// "<iteration>.<rank>" and polls for the others' (release skew ~0.2 ms).
Status IterationBarrier(const std::string& dir, int rank, int ranks, int iteration,
                        Deadline deadline) {
  const std::string prefix = dir + "/" + std::to_string(iteration) + ".";
  const std::string mine = prefix + std::to_string(rank);
  const int fd = ::open(mine.c_str(), O_CREAT | O_WRONLY | O_CLOEXEC, 0644);
  if (fd < 0) {
    return UnavailableError("barrier: cannot create " + mine + ": " + std::strerror(errno));
  }
  ::close(fd);
  int next = 0;  // ranks below `next` have arrived
  while (next < ranks) {
    if (::access((prefix + std::to_string(next)).c_str(), F_OK) == 0) {
      ++next;
      continue;
    }
    if (deadline.Expired()) {
      return DeadlineExceededError("barrier before iteration " + std::to_string(iteration) +
                                   ": rank " + std::to_string(next) + " never arrived");
    }
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  return Status::Ok();
}

// --- Rank mode: mesh (through the rank's own straitd) -----------------------------------------

int RunMeshRank(const Flags& f) {
  const Deadline connect_deadline = Deadline::AfterSeconds(60);
  StatusOr<std::unique_ptr<localproto::Client>> client = UnavailableError("not tried");
  while (!connect_deadline.Expired()) {
    client = localproto::Client::Connect(f.socket, Deadline::AfterSeconds(5),
                                      "bench-r" + std::to_string(f.rank_region));
    if (client.ok()) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  if (!client.ok()) {
    std::cerr << "rank " << f.rank_region << "." << f.rank_index << ": " << client.status() << '\n';
    return kExitFailure;
  }
  StatusOr<std::string> policy = (*client)->RegisterJob(f.job, f.codec, Deadline::AfterSeconds(10));
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
  Json times = Json::array(), starts = Json::array();
  uint64_t sent_before = 0;
  std::string stats_before;
  for (int it = 0; it < f.warmup + f.iters; ++it) {
    if (it == f.warmup) {
      StatusOr<std::string> stats = (*client)->Stats(Deadline::AfterSeconds(10));
      sent_before = stats.ok() ? StatValue(*stats, "bytes_sent") : 0;
      if (stats.ok()) stats_before = *stats;
    }
    data = input;
    if (!f.barrier.empty()) {
      const Status b = IterationBarrier(f.barrier, f.rank_region * f.ranks_per_region + f.rank_index,
                                        f.regions * f.ranks_per_region, it,
                                        Deadline::AfterSeconds(f.timeout_s));
      if (!b.ok()) {
        std::cerr << "rank " << f.rank_region << "." << f.rank_index << ": " << b << '\n';
        return kExitFailure;
      }
    }
    const int64_t t0 = MonotonicNanos();
    Status s = (*client)->AllReduce(f.job, "grad", DataType::kFloat32, ReduceOp::kSum, data.data(),
                                    data.size(), Deadline::AfterSeconds(f.timeout_s));
    const int64_t t1 = MonotonicNanos();
    if (!s.ok()) {
      std::cerr << "rank " << f.rank_region << "." << f.rank_index << ": all-reduce " << it << ": "
                << s << '\n';
      return kExitFailure;
    }
    if (it >= f.warmup) {
      times.push_back(t1 - t0);
      starts.push_back(t0);
    }
    Emit("progress " + std::to_string(it + 1));
  }
  StatusOr<std::string> stats = (*client)->Stats(Deadline::AfterSeconds(10));
  const uint64_t sent = stats.ok() ? StatValue(*stats, "bytes_sent") - sent_before : 0;
  Json gateway_ns;  // per measured iteration, this rank's gateway
  for (const char* key : kTimeKeys) {
    const uint64_t after = stats.ok() ? StatValue(*stats, key) : 0;
    const uint64_t before = StatValue(stats_before, key);
    gateway_ns[key] = after >= before ? (after - before) / static_cast<uint64_t>(f.iters) : 0;
  }
  const Check c =
      CheckAgainstReference(data.data(), count, begin, end, f.regions, LossyLevels(*policy));
  Json out;
  out["region"] = f.rank_region;
  out["rank"] = f.rank_index;
  out["policy"] = *policy;
  out["times_ns"] = times;
  out["starts_ns"] = starts;  // CLOCK_MONOTONIC: one clock for every process on the machine
  out["wan_bytes_sent"] = sent;
  out["gateway_ns"] = gateway_ns;
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
  Json times = Json::array(), starts = Json::array();
  for (int it = 0; it < f.warmup + f.iters; ++it) {
    data = input;
    if (!f.barrier.empty()) {
      const Status b = IterationBarrier(f.barrier, pos, p, it, Deadline::AfterSeconds(f.timeout_s));
      if (!b.ok()) {
        std::cerr << "ring rank " << pos << ": " << b << '\n';
        return kExitFailure;
      }
    }
    const int64_t t0 = MonotonicNanos();
    if (!RingAllReduce(data.data(), count, p, pos, fds->first, fds->second, scratch)) {
      std::cerr << "ring rank " << pos << ": connection lost in iteration " << it << '\n';
      return kExitFailure;
    }
    const int64_t t1 = MonotonicNanos();
    if (it >= f.warmup) {
      times.push_back(t1 - t0);
      starts.push_back(t0);
    }
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
  out["starts_ns"] = starts;
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
  // Bumped each time the gateways are (re)started, so that a new set never reuses the sockets
  // and ports of the previous one (closed listeners may linger in TIME_WAIT).
  int generation = 0;
  std::vector<uint64_t> weights;  // the shard weights the running gateways were given
  wanem::LinkTable table;         // what the emulator applies

  void StopDaemons() {
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
    daemons.clear();
  }

  ~Cluster() {
    StopDaemons();
    if (emulator) emulator->Stop().IgnoreError();
    // STRAIT_BENCH_KEEP=1 keeps the gateways' logs and the ranks' outputs for a post-mortem.
    if (const char* keep = std::getenv("STRAIT_BENCH_KEEP"); keep != nullptr && *keep == '1') {
      std::cerr << "strait-bench allreduce: kept " << dir << '\n';
    } else if (!dir.empty()) {
      std::error_code ec;
      std::filesystem::remove_all(dir, ec);
    }
  }
};

struct Setup {
  bool emulated = false;
  bool tls = false;
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

std::string RegionName(int region) {
  return "r" + std::to_string(region);
}

// Runs a shell command quietly; paths in it come from mkdtemp and fixed names only.
Status Sh(const std::string& command) {
  const std::string full = command + " >/dev/null 2>&1";
  if (std::system(full.c_str()) != 0) {
    return UnavailableError("command failed: " + command +
                            " (TLS needs the openssl command-line tool; or use --transport plain)");
  }
  return Status::Ok();
}

// A throwaway CA and one certificate per region (SAN URI strait://region/r<i>, as straitd
// requires), made with the openssl CLI the way tests/net/test_certs.cc and link_vs_iperf.sh do.
Status MakeCertificates(const std::string& dir, int regions) {
  const std::string ca = dir + "/ca";
  STRAIT_RETURN_IF_ERROR(
      Sh("openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -keyout " + ca +
         ".key -out " + ca + ".pem -days 2 -subj /CN=strait-bench-ca"));
  for (int r = 0; r < regions; ++r) {
    const std::string base = dir + "/" + RegionName(r);
    std::ofstream(base + ".ext") << "subjectAltName=URI:strait://region/" << RegionName(r)
                                 << "\nbasicConstraints=CA:FALSE\nkeyUsage=digitalSignature\n"
                                    "extendedKeyUsage=serverAuth,clientAuth\n";
    STRAIT_RETURN_IF_ERROR(
        Sh("openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -keyout " + base +
           ".key -out " + base + ".csr -subj /CN=" + RegionName(r)));
    STRAIT_RETURN_IF_ERROR(Sh("openssl x509 -req -in " + base + ".csr -CA " + ca + ".pem -CAkey " +
                              ca + ".key -set_serial " + std::to_string(1000 + r) +
                              " -days 2 -out " + base + ".pem -extfile " + base + ".ext"));
  }
  return Status::Ok();
}

std::string SocketPath(const Cluster& c, int region, int index) {
  return c.dir + "/g" + std::to_string(c.generation) + "_" + std::to_string(region) + "_" +
         std::to_string(index) + ".sock";
}

// Starts one straitd per (region, rank index) with `weights` as allreduce.shard_weights (none
// when empty: equal shards), after stopping any running set.
Status StartGateways(const Flags& f, const Setup& s, const std::vector<uint64_t>& weights,
                     Cluster& c) {
  c.StopDaemons();
  ++c.generation;
  c.weights = weights;
  const int n = f.regions, k = f.ranks_per_region;
  const std::vector<uint16_t> free_ports =
      s.emulated ? std::vector<uint16_t>{} : FreeLoopbackPorts(n * k);
  // Fresh namespaces: nothing else listens there, but each generation takes new ports.
  auto port = [&](int r, int i) {
    return s.emulated ? kGatewayPortBase + 16 * c.generation + i
                      : free_ports[static_cast<size_t>(r * k + i)];
  };
  const std::string straitd = FindStraitd(f.straitd);
  for (int r = 0; r < n; ++r) {
    for (int i = 0; i < k; ++i) {
      const std::string base = c.dir + "/g" + std::to_string(c.generation) + "_" +
                               std::to_string(r) + "_" + std::to_string(i);
      std::string t =
          "region = \"" + RegionName(r) + "\"\nshard_index = " + std::to_string(i) + "\n";
      t += "[local]\nsocket = \"" + SocketPath(c, r, i) + "\"\nallowed_uids = [" +
           std::to_string(::getuid()) + "]\n";
      t += "[wan]\nlisten = \"" + Addr(s, r) + ":" + std::to_string(port(r, i)) +
           "\"\ntransport = \"" + (s.tls ? "tls" : "plain") + "\"\n";
      if (s.tls) {
        const std::string cert = c.dir + "/" + RegionName(r);
        t += "[tls]\nca = \"" + c.dir + "/ca.pem\"\ncert = \"" + cert + ".pem\"\nkey = \"" + cert +
             ".key\"\n";
      }
      for (int p = 0; p < n; ++p) {
        if (p == r) continue;
        t += "[peers." + RegionName(p) + "]\nshard_" + std::to_string(i) + " = \"" + Addr(s, p) +
             ":" + std::to_string(port(p, i)) + "\"\n";
      }
      t += "[link]\nstreams = " + std::to_string(f.streams) +
           "\nadapt_streams = " + (f.adapt_streams ? "true" : "false") + "\n";
      if (!f.cc.empty()) t += "congestion_control = \"" + f.cc + "\"\n";
      t += "[policy]\nmin_lossy_bytes = \"4KiB\"\nmax_relative_error = 1.0\n";
      const long secs = std::lround(f.timeout_s);
      t += "[allreduce]\ndeadline = \"" + std::to_string(secs) + "s\"\nshutdown_grace = \"2s\"\n";
      if (!weights.empty()) {
        t += "shard_weights = {";
        for (int p = 0; p < n; ++p) {
          t += std::string(p ? ", " : " ") + RegionName(p) + " = " +
               std::to_string(weights[static_cast<size_t>(p)]);
        }
        t += " }\n";
      }
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

// The rate of a directed pair in bit/s; "unlimited" (0) counts as 100 Gbit/s.
double RateBps(const wanem::LinkTable& t, int src, int dst) {
  const uint64_t r = t.at(src, dst).rate_bps;
  return r == 0 ? 100e9 : static_cast<double>(r);
}

// Bandwidth-weighted shards: each region's weight is the rate (kbit/s) of its slowest link in
// either direction. Owner i's shard crosses every link into i (reduce-scatter) and every link
// out of i (all-gather) once, so this makes each owner's own traffic take about equally long.
std::vector<uint64_t> SlowestLinkWeights(const wanem::LinkTable& t) {
  std::vector<uint64_t> w(static_cast<size_t>(t.regions));
  for (int i = 0; i < t.regions; ++i) {
    double slowest = 1e300;
    for (int j = 0; j < t.regions; ++j) {
      if (j != i) slowest = std::min({slowest, RateBps(t, i, j), RateBps(t, j, i)});
    }
    w[static_cast<size_t>(i)] = std::max<uint64_t>(1, static_cast<uint64_t>(slowest / 1000));
  }
  return w;
}

// Shares that minimise the busiest link's time: collective::BalancedShardWeights (plan.h) on the
// emulated per-pair rates, the rule straitd applies to its measured rates when no shard_weights
// are configured. A region may get (almost) nothing to own: with pairs 0-1 200, 0-2 100, 1-2
// 50 Mbit/s the optimum is (2/3, 1/3, 0), whose floor is half the even split's, where the
// slowest-link rule gets 1.32x.
std::vector<uint64_t> BalancedWeights(const wanem::LinkTable& t) {
  const size_t n = static_cast<size_t>(t.regions);
  std::vector<uint64_t> rates(n * n, 0);
  for (int i = 0; i < t.regions; ++i) {
    for (int j = 0; j < t.regions; ++j) {
      if (i != j) {
        rates[static_cast<size_t>(i) * n + static_cast<size_t>(j)] =
            static_cast<uint64_t>(RateBps(t, i, j));
      }
    }
  }
  auto w = collective::BalancedShardWeights(rates, t.regions);
  return w.ok() ? *w : std::vector<uint64_t>(n, 1);
}

// The mesh's floor on strait-wanem, where every directed pair has its own rate: link j -> i
// carries owner i's shard (reduce-scatter) and owner j's result (all-gather), each shrunk by the
// codec ratio, so T >= 2 max L + max over pairs of (s_i + s_j) S / (r B_ji). With equal links
// and shards that is 2L + 2S/(n r B).
double PairFloor(const wanem::LinkTable& t, const std::vector<uint64_t>& weights, double bytes,
                 double ratio) {
  const int n = t.regions;
  std::vector<double> share(static_cast<size_t>(n), 1.0 / n);
  if (!weights.empty()) {
    double total = 0;
    for (uint64_t w : weights) total += static_cast<double>(w);
    for (int i = 0; i < n; ++i)
      share[static_cast<size_t>(i)] = weights[static_cast<size_t>(i)] / total;
  }
  double latency = 0, wire = 0;
  for (int j = 0; j < n; ++j) {
    for (int i = 0; i < n; ++i) {
      if (i == j) continue;
      latency = std::max(latency, 2.0 * static_cast<double>(t.at(j, i).delay_ns) / 1e9);
      const double s = share[static_cast<size_t>(i)] + share[static_cast<size_t>(j)];
      wire = std::max(wire, s * bytes * 8.0 / (ratio * RateBps(t, j, i)));
    }
  }
  return latency + wire;
}

bool LinksEqual(const wanem::LinkTable& t) {
  const std::string first = t.at(0, 1).ToString();
  for (int i = 0; i < t.regions; ++i) {
    for (int j = 0; j < t.regions; ++j) {
      if (i != j && t.at(i, j).ToString() != first) return false;
    }
  }
  return true;
}

struct RunResult {
  std::string label;
  std::string codec;   // mesh: the --codec entry
  std::string shards;  // mesh: "weighted", "balanced", "measured" or "even"; ring: ""
  std::vector<uint64_t> weights;
  std::string policy;
  int participants = 0;  // busbw's n
  double time_s = 0;     // mean over iterations of the slowest rank's time
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
  // Mesh: straitd's time counters per measured iteration, mean over the gateways, in ms (keys
  // of kTimeKeys without "_ns").
  std::vector<std::pair<std::string, double>> gateway_ms;
};

// Router counters sampled through a run, to tell how busy the emulated links were in the
// measured window (where the time goes: a link that idles is time not spent sending).
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
  // Fills the link_* fields of `r` for the window [begin_ns, end_ns).
  void Summarise(const wanem::LinkTable& t, int64_t begin_ns, int64_t end_ns, RunResult* r) const {
    if (samples_.size() < 2 || end_ns <= begin_ns) return;
    const Sample& a = At(begin_ns);
    const Sample& b = At(end_ns);
    const double secs = static_cast<double>(b.at_ns - a.at_ns) / 1e9;
    if (secs <= 0) return;
    double sum = 0, lowest = 1e300, busiest = 0;
    int used = 0;
    for (size_t k = 0; k < b.delivered.size(); ++k) {
      busiest = std::max(busiest, static_cast<double>(b.delivered[k] - a.delivered[k]));
    }
    for (int i = 0; i < t.regions; ++i) {
      for (int j = 0; j < t.regions; ++j) {
        if (i == j) continue;
        const size_t k = static_cast<size_t>(i * t.regions + j);
        const double bytes = static_cast<double>(b.delivered[k] - a.delivered[k]);
        r->link_drops += b.dropped[k] - a.dropped[k];
        // Pairs that carried only acknowledgements (the ring's backward direction) are not
        // links the algorithm uses.
        if (bytes <= 0.05 * busiest) continue;
        const double use = bytes * 8.0 / (RateBps(t, i, j) * secs);
        sum += use;
        lowest = std::min(lowest, use);
        ++used;
      }
    }
    if (used == 0) return;
    r->link_use_mean = sum / used;
    r->link_use_min = lowest;
  }

 private:
  struct Sample {
    int64_t at_ns = 0;
    std::vector<uint64_t> delivered, dropped;  // [src * regions + dst]
  };
  void Take() {
    const wanem::RouterStats st = emulator_->Stats();
    Sample s;
    s.at_ns = MonotonicNanos();
    for (int i = 0; i < st.regions; ++i) {
      for (int j = 0; j < st.regions; ++j) {
        const wanem::LinkStats& l = st.links[static_cast<size_t>(i)][static_cast<size_t>(j)];
        s.delivered.push_back(l.delivered_bytes);
        s.dropped.push_back(l.packets[static_cast<int>(wanem::Verdict::kLost)] +
                            l.packets[static_cast<int>(wanem::Verdict::kQueueFull)] +
                            l.packets[static_cast<int>(wanem::Verdict::kPoliced)]);
      }
    }
    std::lock_guard<std::mutex> lock(mu_);
    samples_.push_back(std::move(s));
  }
  // The last sample at or before `ns` (the first one if none is).
  const Sample& At(int64_t ns) const {
    size_t k = 0;
    while (k + 1 < samples_.size() && samples_[k + 1].at_ns <= ns) ++k;
    return samples_[k];
  }

  const wanem::Emulator* emulator_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
  mutable std::mutex mu_;
  std::vector<Sample> samples_;
};

// Runs one rank process per (region, index) with `extra` rank flags, waits with a progress
// line, and folds their results.
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
  const std::string what = role == "mesh" ? "mesh " + codec : role;
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
    // Mesh: rank i of every region holds the same slice; ring: every rank the whole tensor.
    const size_t slot = role == "mesh" ? idx % static_cast<size_t>(k) : 0;
    const std::string h = j["hash"].get<std::string>();
    if (hashes[slot].empty()) hashes[slot] = h;
    res.identical = res.identical && hashes[slot] == h;
    wan_bytes += j["wan_bytes_sent"].get<uint64_t>();
    region_bytes[idx / static_cast<size_t>(k)] += j["wan_bytes_sent"].get<uint64_t>();
    if (j.contains("gateway_ns")) {
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
  res.wan_bytes_per_iter = wan_bytes / static_cast<uint64_t>(std::max(1, f.iters));
  for (uint64_t b : region_bytes) {
    res.region_wan_bytes_per_iter.push_back(b / static_cast<uint64_t>(std::max(1, f.iters)));
  }
  if (c.emulator) sampler.Summarise(c.table, window_begin, window_end, &res);
  return res;
}

struct Report {
  Flags flags;
  Setup setup;
  std::vector<RunResult> runs;  // the mesh rows, then the ring baseline when asked for
  bool links_equal = true;
};

// DESIGN "Performance model": T >= 2L + 2S(n-1)/(n r B), for equal links.
double LinkBound(const Setup& s, int n, double bytes, double ratio) {
  const wanem::LinkParams& p = s.table.at(0, n > 1 ? 1 : 0);
  const double b = static_cast<double>(p.rate_bps) / 8.0;
  if (b <= 0 || ratio <= 0) return 0;
  return 2.0 * static_cast<double>(p.delay_ns) / 1e9 + 2.0 * bytes * (n - 1) / (n * ratio * b);
}

std::string WeightsText(const std::vector<uint64_t>& w) {
  if (w.empty()) return "equal";
  std::string t;
  for (size_t i = 0; i < w.size(); ++i) t += (i ? ":" : "") + std::to_string(w[i]);
  return t;
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

const RunResult* FindRun(const Report& rep, const std::string& codec, const std::string& shards) {
  for (const RunResult& r : rep.runs) {
    if (r.codec == codec && r.shards == shards) return &r;
  }
  return nullptr;
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

int RunOrchestrator(const Flags& f, const GlobalFlags& globals) {
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
  Setup s;
  if (f.loopback) {
    s.why_loopback = "--loopback";
  } else if (Status p = wanem::CheckPrivileges(); !p.ok()) {
    s.why_loopback = "no emulation: " + p.message();
  } else {
    s.emulated = true;
  }
  // TLS by default where the links are emulated WAN links (what a deployment runs); loopback
  // runs are demos and smoke tests, where plain TCP keeps the CPU for the gateways.
  s.tls = f.transport == "tls" || (f.transport == "auto" && s.emulated);
  StatusOr<wanem::LinkTable> table = wanem::BuildLinkTable(f.regions, f.link, f.pairs);
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
  const double n = f.regions;
  const double bytes = static_cast<double>(f.size);
  // Every gateway's WAN bytes together, uncompressed, whatever the split: each region sends its
  // parts of the n-1 other shards, and each owner its result to n-1 regions: 2(n-1)S in all.
  const double plain_bytes_total = 2.0 * bytes * (n - 1);
  int job_index = 0;
  for (const std::string& mode : shard_modes) {
    // Equal links, and measured: none (straitd measures its links and balances on them, which
    // gives equal shards on equal links). Even on unequal links: all 1, which straitd takes as
    // the operator's choice over its measurements.
    std::vector<uint64_t> weights;
    if (!rep.links_equal && mode == "even") weights.assign(static_cast<size_t>(f.regions), 1);
    if (!rep.links_equal && mode == "weighted") weights = SlowestLinkWeights(s.table);
    if (!rep.links_equal && mode == "balanced") weights = BalancedWeights(s.table);
    if (c.daemons.empty() || weights != c.weights) {
      progress.Update("starting " + std::to_string(f.regions * f.ranks_per_region) + " straitd");
      if (Status st = StartGateways(f, s, weights, c); !st.ok()) return fail(st);
    }
    for (const std::string& codec : codecs) {
      // A job per row: error-feedback residuals and op sequences never carry over.
      const std::string job = std::string(kJob) + "-" + std::to_string(job_index++);
      StatusOr<RunResult> mesh = RunRanks(f, c, "mesh", codec, job, {}, &progress);
      if (!mesh.ok()) return fail(mesh.status());
      mesh->label = "mesh " + codec + (shard_modes.size() > 1 ? " " + mode : "");
      mesh->shards = mode;
      mesh->weights = weights;
      mesh->participants = f.regions;
      if (mesh->wan_bytes_per_iter > 0) {
        mesh->codec_ratio = plain_bytes_total / static_cast<double>(mesh->wan_bytes_per_iter);
      }
      const double ratio = mesh->codec_ratio > 0 ? mesh->codec_ratio : 1.0;
      // Measured: straitd should land on the balanced split of the rates it sees.
      mesh->floor_s = PairFloor(
          s.table, mode == "measured" && !rep.links_equal ? BalancedWeights(s.table) : weights,
          bytes, ratio);
      mesh->bound_s = rep.links_equal ? LinkBound(s, f.regions, bytes, ratio) : mesh->floor_s;
      rep.runs.push_back(*mesh);
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
    StatusOr<RunResult> ring =
        RunRanks(f, c, "ring", "none", "ring", {"--ring-addrs", list}, &progress);
    if (!ring.ok()) return fail(ring.status());
    ring->label = "ring none (baseline)";
    ring->codec = "none";
    ring->participants = f.regions * f.ranks_per_region;
    // Held to the uncompressed mesh (DESIGN's bound, or with unequal links the even split's
    // floor); the ring's own floor is not computed (floor_s stays 0).
    ring->bound_s =
        rep.links_equal ? LinkBound(s, f.regions, bytes, 1.0) : PairFloor(s.table, {}, bytes, 1.0);
    rep.runs.push_back(*ring);
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
  cmd.add_option("--rank-job", f->job)->group("");
  cmd.add_option("--rank-barrier", f->barrier)->group("");
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

// `strait-bench allreduce`'s set-up: rank and gateway processes, straitd configs and start-up,
// throwaway TLS certificates, and what the emulated links imply (shard weights, the per-pair
// floor). See allreduce_internal.h.
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>
#include <thread>

#include "bench/allreduce_internal.h"
#include "collective/plan.h"

extern char** environ;

namespace strait::bench::allreduce {

namespace {

std::string FindStraitd(const std::string& flag) {
  if (!flag.empty()) return flag;
  const std::filesystem::path dir = std::filesystem::path(SelfExe()).parent_path();
  for (const auto& candidate : {dir / "straitd", dir / ".." / "tools" / "straitd" / "straitd"}) {
    if (::access(candidate.c_str(), X_OK) == 0) return candidate.lexically_normal().string();
  }
  return "straitd";  // PATH
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


}  // namespace

std::string SelfExe() {
  std::error_code ec;
  return std::filesystem::read_symlink("/proc/self/exe", ec).string();
}

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

void Cluster::StopDaemons() {
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

Cluster::~Cluster() {
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
         std::to_string(index / c.shards_per_gateway) + ".sock";
}

// Starts ranks_per_region / c.shards_per_gateway straitds per region with `weights` as
// allreduce.shard_weights (none when empty: equal shards), after stopping any running set.
Status StartGateways(const Flags& f, const Setup& s, const std::vector<uint64_t>& weights,
                     Cluster& c) {
  c.StopDaemons();
  ++c.generation;
  c.weights = weights;
  // Gateway g of a region serves shards g*spg .. g*spg+spg-1 (one per rank index when spg = 1).
  const int spg = c.shards_per_gateway;
  const int n = f.regions, k = f.ranks_per_region / spg;
  // Each gateway's WAN port, then its in-region port (--region-links plain).
  const std::vector<uint16_t> free_ports =
      s.emulated ? std::vector<uint16_t>{} : FreeLoopbackPorts(2 * n * k);
  // Fresh namespaces: nothing else listens there, but each generation takes new ports.
  auto port = [&](int r, int g) {
    return s.emulated ? kGatewayPortBase + 64 * c.generation + g
                      : free_ports[static_cast<size_t>(r * k + g)];
  };
  auto region_port = [&](int r, int g) {
    return s.emulated ? kGatewayPortBase + 64 * c.generation + 32 + g
                      : free_ports[static_cast<size_t>(n * k + r * k + g)];
  };
  const bool plain_region = f.region_links == "plain";
  const std::string straitd = FindStraitd(f.straitd);
  for (int r = 0; r < n; ++r) {
    for (int i = 0; i < k; ++i) {  // gateway i
      const std::string base = c.dir + "/g" + std::to_string(c.generation) + "_" +
                               std::to_string(r) + "_" + std::to_string(i);
      std::string t = "region = \"" + RegionName(r) + "\"\n";
      t += spg == 1 ? "shard_index = " + std::to_string(i) + "\n"
                    : "shards = \"" + std::to_string(i * spg) + "-" +
                          std::to_string(i * spg + spg - 1) + "\"\n";
      t += "[local]\nsocket = \"" + SocketPath(c, r, i * spg) + "\"\nallowed_uids = [" +
           std::to_string(::getuid()) + "]\n";
      t += "[wan]\nlisten = \"" + Addr(s, r) + ":" + std::to_string(port(r, i)) +
           "\"\ntransport = \"" + (s.tls ? "tls" : "plain") + "\"\n";
      if (r == f.dial_only) t += "dial = \"outbound-only\"\n";
      if (s.tls) {
        const std::string cert = c.dir + "/" + RegionName(r);
        t += "[tls]\nca = \"" + c.dir + "/ca.pem\"\ncert = \"" + cert + ".pem\"\nkey = \"" + cert +
             ".key\"\n";
      }
      // CollNet's region all-reduce: the region's own gateways, one per shard.
      if (!f.collnet.empty() && spg == 1 && k > 1) {
        t += "[peers." + RegionName(r) + "]\n";
        for (int g = 0; g < k; ++g) {
          t += "shard_" + std::to_string(g) + " = \"" + Addr(s, r) + ":" +
               std::to_string(plain_region ? region_port(r, g) : port(r, g)) + "\"\n";
        }
        if (plain_region) {
          t += "[region_links]\ntransport = \"plain\"\nlisten = \"" + Addr(s, r) + ":" +
               std::to_string(region_port(r, i)) + "\"\n";
        }
      }
      for (int p = 0; p < n; ++p) {
        if (p == r) continue;
        t += "[peers." + RegionName(p) + "]\n";
        if (s.emulated && f.pace && s.table.at(r, p).rate_bps != 0) {
          // The region's k gateways send over this pair at once: each gets an equal share.
          t += "max_rate = \"" +
               std::to_string(s.table.at(r, p).rate_bps / static_cast<uint64_t>(k)) + "bit\"\n";
        }
        if (p == f.dial_only) {  // it dials this gateway: no address
          t += "dial = \"outbound-only\"\n";
          continue;
        }
        for (int shard = i * spg; shard < (i + 1) * spg; ++shard) {
          t += "shard_" + std::to_string(shard) + " = \"" + Addr(s, p) + ":" +
               std::to_string(port(p, i)) + "\"\n";
        }
      }
      t += "[link]\nstreams = " + std::to_string(f.streams) +
           "\nadapt_streams = " + (f.adapt_streams ? "true" : "false") + "\n";
      if (!f.cc.empty()) t += "congestion_control = \"" + f.cc + "\"\n";
      t += "[policy]\nmin_lossy_bytes = \"4KiB\"\nmax_relative_error = 1.0\n";
      const long secs = std::lround(f.timeout_s);
      t += "[allreduce]\ndeadline = \"" + std::to_string(secs) + "s\"\nshutdown_grace = \"2s\"\n";
      if (f.chunk_elements != 0) t += "chunk_elements = " + std::to_string(f.chunk_elements) + "\n";
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
  // Equal shaping: a one-way firewall (--dial-only's syn=drop) does not change a link's rate.
  const auto shaping = [&t](int i, int j) {
    wanem::LinkParams p = t.at(i, j);
    p.drop_syn = false;
    return p.ToString();
  };
  const std::string first = shaping(0, 1);
  for (int i = 0; i < t.regions; ++i) {
    for (int j = 0; j < t.regions; ++j) {
      if (i != j && shaping(i, j) != first) return false;
    }
  }
  return true;
}

}  // namespace strait::bench::allreduce

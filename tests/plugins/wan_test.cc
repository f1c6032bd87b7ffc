// libnccl-net-strait.so across regions over an emulated WAN (strait-wanem): two regions joined by
// a 75 Mbit/s link with 30 ms RTT and 0.1% loss, in each region two straitd processes (shards 0
// and 1, mutual TLS, inside the region's network namespace; tests/gateway/wan_cluster.h), and
// plugin processes inside the namespaces that load the library as NCCL would:
//   - point to point: two rings of two ranks at once, one per shard, every connection through
//     the gateways' tunnels over the WAN: messages of 0 B, 1 B, 4097 B, 1 MiB + 13 and
//     3 MiB + 5 arrive intact both ways, then 32 in flight, then a grouped receive matched by tag
//     (tests/plugins/plugin_node.cc, mode ring-wan);
//   - CollNet: four node heads (2 regions x 2) connect as one group and run every claimed type x
//     op with odd counts, 48 in flight, each checked against a reference; all four heads must end
//     with bit-identical results (tests/plugins/collnet_node.cc, mode all);
//   - three regions, one straitd each, the 0-2 pair at 20 Mbit/s and 80 ms RTT: a ring of three
//     ranks (every hop over another link) moves the same messages intact.
// The loopback tests (tunnel_test.cc, collnet_test.cc) cover the protocol; these add what only a
// real WAN path shows: latency between every request and its answer, TCP loss recovery under the
// tunnels, TLS between the gateways, and gateways in other network namespaces than their ranks'
// peers. Root only (namespaces, TUN devices); skipped with the reason otherwise.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <fstream>
#include <iterator>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "bench/wanem/netns.h"
#include "tests/gateway/wan_cluster.h"

extern char** environ;

namespace strait::nccl {
namespace {

using gateway::testing::WanCluster;
using gateway::testing::WanClusterOptions;

// A child process (a plugin node or a CollNet head) with its stdin and stdout piped to us.
struct Proc {
  pid_t pid = -1;
  int in = -1;   // our end of its stdin
  int out = -1;  // our end of its stdout (its stderr goes there too)
  std::string output;
  int exit_code = -1;
};

// Starts `args` inside network namespace `ns` (through `ip netns exec`) with our environment
// minus every STRAIT_* variable, plus `env`. Everything is built before fork().
Proc SpawnIn(const std::string& ns, const std::vector<std::string>& args,
             const std::map<std::string, std::string>& env) {
  Proc p;
  int to_child[2];
  int from_child[2];
  if (::pipe2(to_child, O_CLOEXEC) != 0) return p;
  if (::pipe2(from_child, O_CLOEXEC) != 0) {
    ::close(to_child[0]);
    ::close(to_child[1]);
    return p;
  }
  std::vector<std::string> envs;
  for (char** e = environ; *e != nullptr; ++e) {
    if (std::strncmp(*e, "STRAIT_", 7) != 0) envs.emplace_back(*e);
  }
  for (const auto& [k, v] : env) envs.push_back(k + "=" + v);
  std::vector<char*> envp;
  for (auto& e : envs) envp.push_back(e.data());
  envp.push_back(nullptr);
  std::vector<std::string> all = {"/usr/bin/env", "ip", "netns", "exec", ns};
  all.insert(all.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (auto& a : all) argv.push_back(a.data());
  argv.push_back(nullptr);
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::dup2(to_child[0], STDIN_FILENO);
    ::dup2(from_child[1], STDOUT_FILENO);
    ::dup2(from_child[1], STDERR_FILENO);
    ::execve(argv[0], argv.data(), envp.data());
    ::_exit(127);
  }
  ::close(to_child[0]);
  ::close(from_child[1]);
  if (pid < 0) {
    ::close(to_child[1]);
    ::close(from_child[0]);
    return p;
  }
  p.pid = pid;
  p.in = to_child[1];
  p.out = from_child[0];
  return p;
}

// Reads every process's output until each has printed one of `marks` or closed its output (which
// appends "\n<EOF>"), within `seconds`. False on timeout.
bool ReadUntil(std::vector<Proc>& procs, const std::vector<std::string>& marks, double seconds) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  auto has_mark = [&](const Proc& p) {
    if (p.output.find("\n<EOF>") != std::string::npos) return true;
    for (const auto& m : marks) {
      if (p.output.find(m) != std::string::npos) return true;
    }
    return false;
  };
  while (true) {
    std::vector<pollfd> fds;
    for (const Proc& p : procs) {
      if (!has_mark(p)) fds.push_back({p.out, POLLIN, 0});
    }
    if (fds.empty()) return true;
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) return false;
    if (::poll(fds.data(), fds.size(), static_cast<int>(left.count())) <= 0) continue;
    for (const pollfd& f : fds) {
      if ((f.revents & (POLLIN | POLLHUP | POLLERR)) == 0) continue;
      for (Proc& p : procs) {
        if (p.out != f.fd) continue;
        char buf[4096];
        const ssize_t got = ::read(p.out, buf, sizeof(buf));
        if (got > 0) {
          p.output.append(buf, static_cast<size_t>(got));
        } else {
          p.output += "\n<EOF>";
        }
      }
    }
  }
}

// Waits up to `seconds` for every process to end (SIGKILL after that) and records exit codes.
void Reap(std::vector<Proc>& procs, double seconds) {
  for (Proc& p : procs) {
    if (p.in >= 0) ::close(p.in);
    p.in = -1;
  }
  ReadUntil(procs, {}, seconds);
  for (Proc& p : procs) {
    int status = 0;
    if (p.pid > 0 && ::waitpid(p.pid, &status, WNOHANG) == 0) {
      ::kill(p.pid, SIGKILL);
      ::waitpid(p.pid, &status, 0);
      p.output += "\n<killed after the deadline>";
    }
    if (p.pid > 0) p.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    if (p.out >= 0) ::close(p.out);
    p.out = -1;
  }
}

// The rest of the line after the first "WORD " in `output` ("" when there is none).
std::string After(const std::string& output, const std::string& word) {
  const size_t at = output.find(word + " ");
  if (at == std::string::npos) return "";
  const size_t start = at + word.size() + 1;
  const size_t end = output.find('\n', start);
  return output.substr(start, end == std::string::npos ? std::string::npos : end - start);
}

bool WriteLine(const Proc& p, const std::string& line) {
  return ::write(p.in, line.data(), line.size()) == static_cast<ssize_t>(line.size());
}

std::string ReadFile(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
}

// One emulated WAN and its daemons per fixture, shared by the fixture's tests: `kR` regions of
// `kS` straitd processes each. The 2 x 2 cluster is a full mesh (CollNet's region all-reduce
// needs every gateway of a region to know the others).
template <int kR, int kS>
class WanFixture : public ::testing::Test {
 protected:
  static constexpr int kRegions = kR;
  static constexpr int kShards = kS;

  static void SetUpTestSuite() {
    Status priv = wanem::CheckPrivileges();
    if (!priv.ok()) {
      skip_ = new std::string("needs strait-wanem (root): " + priv.message());
      return;
    }
    WanClusterOptions o;
    o.straitd = STRAITD_PATH;
    // Unique per process and fixture: another build's run of this test may be up at once.
    instance_ = new std::string("pw" + std::to_string(kR) + "x" + std::to_string(kS) + "_" +
                                std::to_string(::getpid() % 1000000));
    o.name = *instance_;
    o.regions = kR;
    o.ranks_per_region = kS;
    // 30 ms RTT: every tunnel open and every CollNet step waits a few round trips, and 0.1%
    // loss makes TCP recover under the tunnels; 75 Mbit/s keeps the data phase short.
    o.link = "75mbit,15ms,loss=0.1%";
    if (kR == 3) {
      // Three regions: one pair much slower and farther, as a transoceanic hop would be.
      o.pair_overrides = {"0:2=rate=20mbit,delay=40ms"};
    }
    o.full_mesh = kS > 1;
    auto cluster = WanCluster::Start(o);
    if (!cluster.ok()) {
      error_ = new std::string(cluster.status().ToString());
      return;
    }
    cluster_ = std::move(cluster).value().release();
  }
  static void TearDownTestSuite() {
    delete cluster_;  // kills the daemons, removes the namespaces
    cluster_ = nullptr;
    delete skip_;
    skip_ = nullptr;
    delete error_;
    error_ = nullptr;
    delete instance_;
    instance_ = nullptr;
  }
  void SetUp() override {
    if (skip_ != nullptr) GTEST_SKIP() << *skip_;
    ASSERT_NE(cluster_, nullptr) << (error_ != nullptr ? *error_ : "no cluster");
  }
  void TearDown() override {
    if (!HasFailure() || cluster_ == nullptr) return;
    for (int r = 0; r < kR; ++r) {
      for (int s = 0; s < kS; ++s) {
        ADD_FAILURE() << "straitd " << WanCluster::RegionName(r) << "." << s << ":\n"
                      << cluster_->Logs(r, s);
      }
    }
  }

  static std::string Namespace(int r) { return wanem::NamespaceName(*instance_, r); }

  // What every rank of region `r` behind shard `s` runs with.
  static std::map<std::string, std::string> RankEnv(int r, int s) {
    return {{"STRAIT_REGION", WanCluster::RegionName(r)},
            {"STRAIT_GATEWAY", cluster_->Socket(r, s)},
            {"STRAIT_SOCKET_IFNAME", "lo"},
            {"STRAIT_CONNECT_TIMEOUT", "20s"}};
  }

  // Runs one ring of plugin_node processes (mode ring-wan) per shard at once: ring s has one
  // rank per region (rank r in region r, behind shard s), so every connection crosses a WAN
  // link through the gateways' tunnels. Checks that every node passed.
  static void RunRings() {
    // procs[s * kR + r]: rank r of the ring on shard s.
    std::vector<Proc> procs;
    for (int s = 0; s < kS; ++s) {
      for (int r = 0; r < kR; ++r) {
        procs.push_back(SpawnIn(Namespace(r),
                                {STRAIT_PLUGIN_NODE, STRAIT_NCCL_PLUGIN_PATH, std::to_string(r),
                                 std::to_string(kR), "ring-wan"},
                                RankEnv(r, s)));
        ASSERT_GT(procs.back().pid, 0) << "cannot start " << STRAIT_PLUGIN_NODE;
      }
    }
    EXPECT_TRUE(ReadUntil(procs, {"HANDLE "}, 30)) << "nodes did not print their handles";
    for (int s = 0; s < kS; ++s) {
      for (int r = 0; r < kR; ++r) {
        // Rank r sends to rank r + 1 of its ring: the next region, same shard.
        const Proc& peer = procs[size_t(s * kR + (r + 1) % kR)];
        EXPECT_TRUE(
            WriteLine(procs[size_t(s * kR + r)], "PEER " + After(peer.output, "HANDLE") + "\n"));
      }
    }
    Reap(procs, 60);
    for (size_t i = 0; i < procs.size(); ++i) {
      const Proc& p = procs[i];
      EXPECT_EQ(p.exit_code, 0) << "node " << i << " output:\n" << p.output;
      EXPECT_NE(p.output.find("\nOK"), std::string::npos) << "node " << i << ":\n" << p.output;
      // The tunnel opens only after a round trip over the WAN: connect said "call again" first.
      const std::string nulls = After(p.output, "CONNECTED");
      ASSERT_FALSE(nulls.empty()) << "node " << i << ":\n" << p.output;
      EXPECT_GT(std::stoi(nulls), 0) << "node " << i << ":\n" << p.output;
    }
  }

  static inline std::string* skip_ = nullptr;
  static inline std::string* error_ = nullptr;
  static inline std::string* instance_ = nullptr;
  static inline WanCluster* cluster_ = nullptr;
};

using PluginWan = WanFixture<2, 2>;
using PluginWanThreeRegions = WanFixture<3, 1>;

TEST_F(PluginWan, PointToPointCrossesTheWanIntactOnTwoShardsAtOnce) {
  RunRings();
}

TEST_F(PluginWanThreeRegions, ARingOverThreeRegionsAndUnequalLinksArrivesIntact) {
  RunRings();
}

TEST_F(PluginWan, CollNetAllReduceOfTwoRegionsMatchesTheReferenceBitIdentically) {
  constexpr int kHeads = kRegions * kShards;
  std::vector<Proc> heads;
  std::vector<std::string> results;
  for (int h = 0; h < kHeads; ++h) {
    const int r = h / kShards;
    const int s = h % kShards;
    results.push_back(cluster_->dir() + "/collnet-" + std::to_string(h) + ".bin");
    std::map<std::string, std::string> env = RankEnv(r, s);
    env["STRAIT_JOB_ID"] = "wanjob";
    env["STRAIT_COMPRESSION"] = "zstd";  // lossless: the reference is exact
    heads.push_back(
        SpawnIn(Namespace(r),
                {STRAIT_COLLNET_NODE, STRAIT_NCCL_PLUGIN_PATH, "11", "all", results.back()}, env));
    ASSERT_GT(heads.back().pid, 0) << "cannot start " << STRAIT_COLLNET_NODE;
  }
  EXPECT_TRUE(ReadUntil(heads, {"HANDLE ", "LISTEN-FAILED"}, 30)) << "heads did not listen";
  std::string group;
  for (int h = 0; h < kHeads; ++h) {
    const std::string handle = After(heads[size_t(h)].output, "HANDLE");
    if (handle.empty()) {
      Reap(heads, 10);  // the others wait for a GROUP line: closing their stdin ends them
      FAIL() << "head " << h << " published no handle:\n" << heads[size_t(h)].output;
    }
    group += " " + handle;
  }
  for (int h = 0; h < kHeads; ++h) {
    EXPECT_TRUE(WriteLine(heads[size_t(h)], "GROUP " + std::to_string(h) + " " +
                                                std::to_string(kHeads) + group + "\n"));
  }
  Reap(heads, 90);
  for (int h = 0; h < kHeads; ++h) {
    const Proc& p = heads[size_t(h)];
    EXPECT_EQ(p.exit_code, 0) << "head " << h << " output:\n" << p.output;
    EXPECT_NE(p.output.find("\nOK"), std::string::npos) << "head " << h << ":\n" << p.output;
  }
  // Each head checked its results against the reference; all four must hold the same bytes.
  const std::string first = ReadFile(results[0]);
  EXPECT_FALSE(first.empty());
  for (int h = 1; h < kHeads; ++h) {
    EXPECT_TRUE(ReadFile(results[size_t(h)]) == first)
        << "head " << h << "'s results differ from head 0's";
  }
}

}  // namespace
}  // namespace strait::nccl

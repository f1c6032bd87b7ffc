// libnccl-net-strait.so across regions: two straitd processes (regions "a" and "b") on 127.0.0.1
// over plain TCP, and one plugin_node process per region (each loads the library as NCCL would,
// with STRAIT_REGION and STRAIT_GATEWAY set). The two nodes form a ring, so every connection is
// cross-region and goes through both gateways' tunnels:
//   - connect returns "call again" until the tunnel is open, then messages of 0 B, 1 B, 4 KiB,
//     4097 B, 1 MiB + 13, 8 MiB, 16 MiB and 64 MiB arrive intact both ways, 32 in flight, and a
//     grouped receive matched by tag across the tunnel;
//   - closing comms with 8 MiB requests in flight neither crashes nor hangs;
//   - a gateway killed under running traffic makes both ranks' plugins report an error (not hang);
//   - a rank whose region is not its gateway's fails listen instead of publishing a handle.
// Real processes and sockets: label integration. No root needed.
#include <arpa/inet.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <string>
#include <thread>
#include <vector>
#include "tests/common/free_ports.h"
#include "tests/common/straitd_process.h"

namespace {

const char* const kRegions[2] = {"a", "b"};

using strait::test::FreePorts;
using strait::test::KillProcesses;
using strait::test::SpawnProcess;
using strait::test::WaitForSocket;

struct Node {
  pid_t pid = -1;
  int in = -1;   // our end of its stdin
  int out = -1;  // our end of its stdout
  std::string output;
};

Node Spawn(int rank, const std::string& mode, const std::string& region,
           const std::string& gateway) {
  int to_child[2];
  int from_child[2];
  if (pipe2(to_child, O_CLOEXEC) != 0 || pipe2(from_child, O_CLOEXEC) != 0) return {};
  const pid_t pid = fork();
  if (pid == 0) {
    dup2(to_child[0], STDIN_FILENO);
    dup2(from_child[1], STDOUT_FILENO);
    setenv("STRAIT_SOCKET_IFNAME", "lo", 1);
    setenv("STRAIT_REGION", region.c_str(), 1);
    setenv("STRAIT_GATEWAY", gateway.c_str(), 1);
    setenv("STRAIT_CONNECT_TIMEOUT", "20s", 1);
    const std::string r = std::to_string(rank);
    execl(STRAIT_PLUGIN_NODE, STRAIT_PLUGIN_NODE, STRAIT_NCCL_PLUGIN_PATH, r.c_str(), "2",
          mode.c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  close(to_child[0]);
  close(from_child[1]);
  Node node;
  node.pid = pid;
  node.in = to_child[1];
  node.out = from_child[0];
  return node;
}

// Reads from every node until each has printed `prefix` (or closed its output), within
// `seconds`. Returns false on timeout.
bool ReadUntil(std::vector<Node>& nodes, const std::string& prefix, double seconds) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  while (true) {
    bool all = true;
    std::vector<pollfd> fds;
    for (Node& n : nodes) {
      if (n.output.find(prefix) != std::string::npos) continue;
      all = false;
      fds.push_back({n.out, POLLIN, 0});
    }
    if (all) return true;
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) return false;
    if (poll(fds.data(), fds.size(), static_cast<int>(left.count())) <= 0) continue;
    for (const pollfd& p : fds) {
      if ((p.revents & (POLLIN | POLLHUP)) == 0) continue;
      for (Node& n : nodes) {
        if (n.out != p.fd) continue;
        char buf[4096];
        const ssize_t got = read(n.out, buf, sizeof(buf));
        if (got > 0) {
          n.output.append(buf, static_cast<size_t>(got));
        } else {
          n.output += "\n<EOF>" + prefix;  // closed: stop waiting for this one
        }
      }
    }
  }
}

std::string HandleOf(const Node& n) {
  const size_t at = n.output.find("HANDLE ");
  if (at == std::string::npos) return "";
  const size_t end = n.output.find('\n', at);
  return n.output.substr(at + 7, end - at - 7);
}

// Waits for every node to exit (killing stragglers after the deadline); returns exit codes.
std::vector<int> Reap(std::vector<Node>& nodes, double seconds) {
  const bool all_exited = ReadUntil(nodes, "\n<EOF>", seconds);
  std::vector<int> codes;
  for (Node& n : nodes) {
    int status = 0;
    if (!all_exited && waitpid(n.pid, &status, WNOHANG) == 0) {
      kill(n.pid, SIGKILL);
      waitpid(n.pid, &status, 0);
      codes.push_back(-1);
      n.output += "\n<killed after the deadline>";
    } else {
      if (all_exited) waitpid(n.pid, &status, 0);
      codes.push_back(WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status));
    }
    close(n.in);
    close(n.out);
  }
  return codes;
}

class PluginTunnel : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_EQ(::access(STRAITD_PATH, X_OK), 0) << STRAITD_PATH << " is not built";
    char tmpl[] = "/tmp/strait-plugin-tunnel-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    const std::vector<uint16_t> ports = FreePorts(2);
    for (int r = 0; r < 2; ++r) {
      std::string c = "region = \"" + std::string(kRegions[r]) + "\"\nshard_index = 0\n";
      c += "[local]\nsocket = \"" + Socket(r) + "\"\nallowed_uids = [" +
           std::to_string(::getuid()) + "]\n";
      c +=
          "[wan]\nlisten = \"127.0.0.1:" + std::to_string(ports[r]) + "\"\ntransport = \"plain\"\n";
      const int p = 1 - r;
      c += "[peers." + std::string(kRegions[p]) +
           "]\nshard_0 = \"127.0.0.1:" + std::to_string(ports[p]) + "\"\n";
      // A peer gateway that is gone is declared so after 2 s (the kill test waits for that).
      c += "[link]\nstreams = 2\nadapt_streams = false\nunreachable_after = \"2s\"\n";
      const std::string file = dir_ + "/" + kRegions[r] + ".toml";
      std::ofstream(file) << c;
      files_.push_back(file);
    }
    for (int r = 0; r < 2; ++r) {
      pids_.push_back(SpawnProcess({STRAITD_PATH, "--config", files_[static_cast<size_t>(r)]}));
    }
    // The plugin's listen needs its gateway's socket (it does not wait for a starting daemon).
    for (int r = 0; r < 2; ++r) {
      ASSERT_TRUE(WaitForSocket(Socket(r), pids_[static_cast<size_t>(r)], 20))
          << "straitd " << r << " did not start";
    }
  }

  void TearDown() override {
    KillProcesses(&pids_);
    for (const auto& f : files_) ::unlink(f.c_str());
    for (int r = 0; r < 2; ++r) ::unlink(Socket(r).c_str());
    ::rmdir(dir_.c_str());
  }

  std::string Socket(int r) const { return dir_ + "/" + kRegions[r] + ".sock"; }

  // Node r runs in region r behind gateway r; each gets the other's handle.
  std::vector<Node> StartPair(const std::string& mode) {
    std::vector<Node> nodes;
    for (int r = 0; r < 2; ++r) nodes.push_back(Spawn(r, mode, kRegions[r], Socket(r)));
    EXPECT_TRUE(ReadUntil(nodes, "HANDLE ", 30)) << "nodes did not print their handles";
    for (int r = 0; r < 2; ++r) {
      const std::string line = "PEER " + HandleOf(nodes[static_cast<size_t>(1 - r)]) + "\n";
      EXPECT_EQ(write(nodes[static_cast<size_t>(r)].in, line.data(), line.size()),
                static_cast<ssize_t>(line.size()));
    }
    return nodes;
  }

  std::string dir_;
  std::vector<std::string> files_;
  std::vector<pid_t> pids_;
};

TEST_F(PluginTunnel, MessagesCrossRegionsIntactBothWays) {
  std::vector<Node> nodes = StartPair("ring-big");
  const std::vector<int> codes = Reap(nodes, 90);
  for (size_t i = 0; i < nodes.size(); ++i) {
    EXPECT_EQ(codes[i], 0) << "node " << i << " output:\n" << nodes[i].output;
    EXPECT_NE(nodes[i].output.find("\nOK"), std::string::npos) << nodes[i].output;
    // A tunnel opens only after a round trip through both gateways: connect said "call again".
    const size_t at = nodes[i].output.find("CONNECTED ");
    ASSERT_NE(at, std::string::npos) << nodes[i].output;
    EXPECT_GT(std::stoi(nodes[i].output.substr(at + 10)), 0) << nodes[i].output;
  }
}

TEST_F(PluginTunnel, ClosingWithRequestsInFlightNeitherCrashesNorHangs) {
  std::vector<Node> nodes = StartPair("close-inflight");
  const std::vector<int> codes = Reap(nodes, 60);
  for (size_t i = 0; i < nodes.size(); ++i) {
    EXPECT_EQ(codes[i], 0) << "node " << i << " output:\n" << nodes[i].output;
    EXPECT_NE(nodes[i].output.find("\nOK"), std::string::npos) << nodes[i].output;
  }
}

TEST_F(PluginTunnel, AKilledGatewayIsAnErrorNotAHang) {
  std::vector<Node> nodes = StartPair("expect-loss");
  ASSERT_TRUE(ReadUntil(nodes, "CONNECTED ", 30)) << nodes[0].output << nodes[1].output;
  // Both nodes now send through the tunnel; region b's gateway dies under them.
  ::kill(pids_[1], SIGKILL);
  ::waitpid(pids_[1], nullptr, 0);
  pids_[1] = -1;
  const std::vector<int> codes = Reap(nodes, 60);
  for (size_t i = 0; i < nodes.size(); ++i) {
    EXPECT_EQ(codes[i], 0) << "node " << i << " output:\n" << nodes[i].output;
    EXPECT_NE(nodes[i].output.find("LOSS-REPORTED"), std::string::npos) << nodes[i].output;
  }
}

// A rank whose STRAIT_REGION is not its gateway's region must not publish a handle: listen fails
// (the node exits without printing one) instead of routing other regions' connects wrongly.
TEST_F(PluginTunnel, ARegionThatIsNotTheGatewaysFailsListen) {
  std::vector<Node> nodes;
  nodes.push_back(Spawn(0, "ring", "elsewhere", Socket(0)));
  const std::vector<int> codes = Reap(nodes, 30);
  EXPECT_NE(codes[0], 0) << nodes[0].output;
  EXPECT_EQ(nodes[0].output.find("HANDLE "), std::string::npos) << nodes[0].output;
}

}  // namespace

// libnccl-net-strait.so across real processes on loopback: each node is a plugin_node process
// that dlopens the library (as NCCL would in each rank), exchanges listen handles through the
// test and then runs a ring of point-to-point traffic; and a rank that dies mid-job makes its
// peer's plugin report a remote error instead of hanging.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <string>
#include <vector>

namespace {

struct Node {
  pid_t pid = -1;
  int in = -1;   // our end of its stdin
  int out = -1;  // our end of its stdout
  std::string output;
};

Node Spawn(int rank, int nranks, const std::string& mode) {
  int to_child[2];
  int from_child[2];
  if (pipe2(to_child, O_CLOEXEC) != 0 || pipe2(from_child, O_CLOEXEC) != 0) return {};
  const pid_t pid = fork();
  if (pid == 0) {
    dup2(to_child[0], STDIN_FILENO);
    dup2(from_child[1], STDOUT_FILENO);
    setenv("STRAIT_SOCKET_IFNAME", "lo", 1);
    setenv("STRAIT_REGION", "us-east", 1);
    setenv("STRAIT_NSOCKS", std::to_string(2 + rank % 3).c_str(), 1);
    const std::string r = std::to_string(rank);
    const std::string n = std::to_string(nranks);
    execl(STRAIT_PLUGIN_NODE, STRAIT_PLUGIN_NODE, STRAIT_NCCL_PLUGIN_PATH, r.c_str(), n.c_str(),
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

// Reads from every node until each has printed a line starting with `prefix` (or EOF), within
// `seconds`. Returns false on timeout.
bool ReadUntil(std::vector<Node>& nodes, const std::string& prefix, double seconds) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  std::vector<bool> done(nodes.size(), false);
  while (true) {
    bool all = true;
    std::vector<pollfd> fds;
    for (size_t i = 0; i < nodes.size(); ++i) {
      if (nodes[i].output.find(prefix) != std::string::npos) done[i] = true;
      if (!done[i]) {
        all = false;
        fds.push_back({nodes[i].out, POLLIN, 0});
      }
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

// Waits for every node to exit (killing them after the deadline); returns exit codes.
std::vector<int> Reap(std::vector<Node>& nodes, double seconds) {
  // A node closes its stdout only by exiting, so once every pipe is at EOF a blocking waitpid
  // returns promptly; after the deadline the stragglers are killed and reported as -1.
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

// Starts the nodes, gives each the handle of the next one, returns them running.
std::vector<Node> StartRing(const std::vector<std::string>& modes) {
  std::vector<Node> nodes;
  const int n = static_cast<int>(modes.size());
  for (int r = 0; r < n; ++r) nodes.push_back(Spawn(r, n, modes[static_cast<size_t>(r)]));
  EXPECT_TRUE(ReadUntil(nodes, "HANDLE ", 30)) << "nodes did not print their handles";
  for (int r = 0; r < n; ++r) {
    const std::string next = HandleOf(nodes[static_cast<size_t>((r + 1) % n)]);
    EXPECT_FALSE(next.empty());
    const std::string line = "PEER " + next + "\n";
    EXPECT_EQ(write(nodes[static_cast<size_t>(r)].in, line.data(), line.size()),
              static_cast<ssize_t>(line.size()));
  }
  return nodes;
}

TEST(NetPluginMultiProcess, ThreeNodeRingMovesEveryMessageIntact) {
  std::vector<Node> nodes = StartRing({"ring", "ring", "ring"});
  const std::vector<int> codes = Reap(nodes, 60);
  for (size_t i = 0; i < nodes.size(); ++i) {
    EXPECT_EQ(codes[i], 0) << "node " << i << " output:\n" << nodes[i].output;
    EXPECT_NE(nodes[i].output.find("OK"), std::string::npos) << nodes[i].output;
  }
}

TEST(NetPluginMultiProcess, ARankThatDiesIsReportedAsARemoteError) {
  std::vector<Node> nodes = StartRing({"expect-loss", "crash"});
  const std::vector<int> codes = Reap(nodes, 60);
  EXPECT_EQ(codes[1], 0) << nodes[1].output;
  EXPECT_EQ(codes[0], 0) << nodes[0].output;
  EXPECT_NE(nodes[0].output.find("LOSS-REPORTED"), std::string::npos) << nodes[0].output;
}

}  // namespace

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
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "tests/common/free_ports.h"
#include "tests/common/straitd_process.h"
#include "tests/plugins/node_process.h"

namespace {

const char* const kRegions[2] = {"a", "b"};

using strait::test::FreePorts;
using strait::test::KillProcesses;
using strait::test::LineAfter;
using strait::test::NodeProcess;
using strait::test::ReadUntil;
using strait::test::Reap;
using strait::test::SpawnNode;
using strait::test::SpawnProcess;
using strait::test::WaitForSocket;
using strait::test::WriteLine;

NodeProcess Spawn(int rank, const std::string& mode, const std::string& region,
                  const std::string& gateway) {
  return SpawnNode({STRAIT_PLUGIN_NODE, STRAIT_NCCL_PLUGIN_PATH, std::to_string(rank), "2", mode},
                   {{"STRAIT_SOCKET_IFNAME", "lo"},
                    {"STRAIT_REGION", region},
                    {"STRAIT_GATEWAY", gateway},
                    {"STRAIT_CONNECT_TIMEOUT", "20s"}});
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
  std::vector<NodeProcess> StartPair(const std::string& mode) {
    std::vector<NodeProcess> nodes;
    for (int r = 0; r < 2; ++r) {
      nodes.push_back(Spawn(r, mode, kRegions[r], Socket(r)));
      EXPECT_GT(nodes.back().pid, 0) << "cannot start " << STRAIT_PLUGIN_NODE;
    }
    EXPECT_TRUE(ReadUntil(nodes, {"HANDLE "}, 30)) << "nodes did not print their handles";
    for (int r = 0; r < 2; ++r) {
      const std::string peer = LineAfter(nodes[static_cast<size_t>(1 - r)].output, "HANDLE");
      EXPECT_TRUE(WriteLine(nodes[static_cast<size_t>(r)], "PEER " + peer + "\n"));
    }
    return nodes;
  }

  std::string dir_;
  std::vector<std::string> files_;
  std::vector<pid_t> pids_;
};

TEST_F(PluginTunnel, MessagesCrossRegionsIntactBothWays) {
  std::vector<NodeProcess> nodes = StartPair("ring-big");
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
  std::vector<NodeProcess> nodes = StartPair("close-inflight");
  const std::vector<int> codes = Reap(nodes, 60);
  for (size_t i = 0; i < nodes.size(); ++i) {
    EXPECT_EQ(codes[i], 0) << "node " << i << " output:\n" << nodes[i].output;
    EXPECT_NE(nodes[i].output.find("\nOK"), std::string::npos) << nodes[i].output;
  }
}

TEST_F(PluginTunnel, AKilledGatewayIsAnErrorNotAHang) {
  std::vector<NodeProcess> nodes = StartPair("expect-loss");
  ASSERT_TRUE(ReadUntil(nodes, {"CONNECTED "}, 30)) << nodes[0].output << nodes[1].output;
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
  std::vector<NodeProcess> nodes;
  nodes.push_back(Spawn(0, "ring", "elsewhere", Socket(0)));
  const std::vector<int> codes = Reap(nodes, 30);
  EXPECT_NE(codes[0], 0) << nodes[0].output;
  EXPECT_EQ(nodes[0].output.find("HANDLE "), std::string::npos) << nodes[0].output;
}

}  // namespace

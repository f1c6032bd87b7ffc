// libnccl-net-strait.so across real processes on loopback: each node is a plugin_node process
// that dlopens the library (as NCCL would in each rank), exchanges listen handles through the
// test and then runs a ring of point-to-point traffic; and a rank that dies mid-job makes its
// peer's plugin report a remote error instead of hanging.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "tests/plugins/node_process.h"

namespace {

using strait::test::LineAfter;
using strait::test::NodeProcess;
using strait::test::ReadUntil;
using strait::test::Reap;
using strait::test::SpawnNode;
using strait::test::WriteLine;

NodeProcess Spawn(int rank, int nranks, const std::string& mode) {
  return SpawnNode({STRAIT_PLUGIN_NODE, STRAIT_NCCL_PLUGIN_PATH, std::to_string(rank),
                    std::to_string(nranks), mode},
                   {{"STRAIT_SOCKET_IFNAME", "lo"},
                    {"STRAIT_REGION", "us-east"},
                    {"STRAIT_NSOCKS", std::to_string(2 + rank % 3)}});
}

// Starts the nodes, gives each the handle of the next one, returns them running.
std::vector<NodeProcess> StartRing(const std::vector<std::string>& modes) {
  std::vector<NodeProcess> nodes;
  const int n = static_cast<int>(modes.size());
  for (int r = 0; r < n; ++r) {
    nodes.push_back(Spawn(r, n, modes[static_cast<size_t>(r)]));
    EXPECT_GT(nodes.back().pid, 0) << "cannot start " << STRAIT_PLUGIN_NODE;
  }
  EXPECT_TRUE(ReadUntil(nodes, {"HANDLE "}, 30)) << "nodes did not print their handles";
  for (int r = 0; r < n; ++r) {
    const std::string next = LineAfter(nodes[static_cast<size_t>((r + 1) % n)].output, "HANDLE");
    EXPECT_FALSE(next.empty());
    EXPECT_TRUE(WriteLine(nodes[static_cast<size_t>(r)], "PEER " + next + "\n"));
  }
  return nodes;
}

TEST(NetPluginMultiProcess, ThreeNodeRingMovesEveryMessageIntact) {
  std::vector<NodeProcess> nodes = StartRing({"ring", "ring", "ring"});
  const std::vector<int> codes = Reap(nodes, 60);
  for (size_t i = 0; i < nodes.size(); ++i) {
    EXPECT_EQ(codes[i], 0) << "node " << i << " output:\n" << nodes[i].output;
    EXPECT_NE(nodes[i].output.find("OK"), std::string::npos) << nodes[i].output;
  }
}

TEST(NetPluginMultiProcess, ARankThatDiesIsReportedAsARemoteError) {
  std::vector<NodeProcess> nodes = StartRing({"expect-loss", "crash"});
  const std::vector<int> codes = Reap(nodes, 60);
  EXPECT_EQ(codes[1], 0) << nodes[1].output;
  EXPECT_EQ(codes[0], 0) << nodes[0].output;
  EXPECT_NE(nodes[0].output.find("LOSS-REPORTED"), std::string::npos) << nodes[0].output;
}

}  // namespace

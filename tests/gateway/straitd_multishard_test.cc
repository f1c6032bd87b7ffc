// Multi-shard gateways ("Multi-shard gateways" in gateway/config.h) with real straitd processes:
//   loopback (plain TCP, no root): region b runs ONE straitd for shards 0 and 1, regions a and c
//     one straitd per shard (the old layout), so b accepts a's per-shard links and dials c's:
//     both shards' all-reduces are exact and bit-identical, b's ranks reach both shards through
//     one socket, and each per-shard process has exactly one link with b. Refusals: a client naming no
//     shard (its all-reduce), one naming a shard the straitd does not serve (its hello), a second
//     straitd of a node serving a shard already served (at start and at --check-config), while
//     --check-config of the running config itself passes.
//   strait-wanem with mutual TLS (root): two regions, ONE straitd each for four shards: the four
//     shards' all-reduces, run at once for several steps, are exact, and each region pair carries
//     exactly one link (the accepting straitd accepted one link, not four).
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "bench/wanem/netns.h"
#include "common/clock.h"
#include "localproto/client.h"
#include "tests/common/free_ports.h"
#include "tests/common/straitd_process.h"
#include "tests/gateway/wan_cluster.h"

namespace strait::gateway {

// The local protocol and its client (strait::localproto), which these tests drive.
using namespace strait::localproto;  // NOLINT(build/namespaces)
namespace {

using strait::test::FreePorts;
using strait::test::KillProcesses;
using strait::test::SpawnProcess;
using strait::test::StopProcesses;
using testing::WanCluster;
using testing::WanClusterOptions;

constexpr size_t kCount = 20000;
constexpr char kJob[] = "multishard";

// Region `r`'s input for shard `s` at `step`: distinct everywhere, exact in fp32 sums.
std::vector<float> Input(int r, int s, int step) {
  std::vector<float> v(kCount);
  for (size_t i = 0; i < kCount; ++i) {
    const int k = static_cast<int>((i * 13 + static_cast<size_t>(r) * 7 +
                                    static_cast<size_t>(s) * 29 + static_cast<size_t>(step) * 3) %
                                   991);
    v[i] = static_cast<float>(k - 495) * 0.5f * static_cast<float>(s + 1);
  }
  return v;
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

size_t Occurrences(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

// Connects as the rank of shard `shard` (kAnyShard: naming none) and registers the job lossless.
StatusOr<std::unique_ptr<Client>> ConnectRank(const std::string& socket, uint32_t shard) {
  auto client = Client::Connect(socket, Deadline::AfterSeconds(20), "multishard-test", shard);
  if (!client.ok()) return client.status();
  auto policy = (*client)->RegisterJob(kJob, "none", Deadline::AfterSeconds(10));
  if (!policy.ok()) return policy.status();
  return client;
}

// Runs `steps` steps on every (region, shard) client at once and checks each result exactly.
void RunAndCheck(std::vector<std::vector<std::unique_ptr<Client>>>& clients, int steps) {
  const int regions = static_cast<int>(clients.size());
  const int shards = static_cast<int>(clients[0].size());
  for (int step = 0; step < steps; ++step) {
    std::vector<std::vector<std::vector<float>>> data(
        static_cast<size_t>(regions), std::vector<std::vector<float>>(static_cast<size_t>(shards)));
    std::vector<std::vector<Status>> status(
        static_cast<size_t>(regions),
        std::vector<Status>(static_cast<size_t>(shards), InternalError("did not run")));
    std::vector<std::thread> threads;
    for (int r = 0; r < regions; ++r) {
      for (int s = 0; s < shards; ++s) {
        threads.emplace_back([&, r, s] {
          auto& d = data[static_cast<size_t>(r)][static_cast<size_t>(s)];
          d = Input(r, s, step);
          status[static_cast<size_t>(r)][static_cast<size_t>(s)] =
              clients[static_cast<size_t>(r)][static_cast<size_t>(s)]->AllReduce(
                  kJob, "grad", DataType::kFloat32, ReduceOp::kSum, d.data(), kCount,
                  Deadline::AfterSeconds(30));
        });
      }
    }
    for (auto& t : threads) t.join();
    for (int s = 0; s < shards; ++s) {
      std::vector<float> want = Input(0, s, step);
      for (int r = 1; r < regions; ++r) {
        const std::vector<float> in = Input(r, s, step);
        for (size_t i = 0; i < kCount; ++i) want[i] += in[i];
      }
      for (int r = 0; r < regions; ++r) {
        const Status& st = status[static_cast<size_t>(r)][static_cast<size_t>(s)];
        ASSERT_TRUE(st.ok()) << "region " << r << " shard " << s << " step " << step << ": "
                             << st;
        EXPECT_EQ(std::memcmp(data[static_cast<size_t>(r)][static_cast<size_t>(s)].data(),
                              want.data(), kCount * sizeof(float)),
                  0)
            << "region " << r << " shard " << s << " step " << step << ": wrong sum";
      }
    }
  }
}

// Region a: one straitd for shards 0 and 1; region b: one straitd per shard. Plain TCP on
// loopback, so no root is needed.
class StraitdMultiShard : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_EQ(::access(STRAITD_PATH, X_OK), 0) << STRAITD_PATH << " is not built";
    char tmpl[] = "/tmp/straitd-multishard-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    ports_ = FreePorts(5);  // a0, a1, b, c0, c1
    WriteConfig("a", "shard_index = 0", 0, {{"b", {2, 2}}, {"c", {3, 4}}}, "a0");
    WriteConfig("a", "shard_index = 1", 1, {{"b", {2, 2}}, {"c", {3, 4}}}, "a1");
    WriteConfig("b", "shards = [0, 1]", 2, {{"a", {0, 1}}, {"c", {3, 4}}}, "b");
    WriteConfig("c", "shard_index = 0", 3, {{"a", {0, 1}}, {"b", {2, 2}}}, "c0");
    WriteConfig("c", "shard_index = 1", 4, {{"a", {0, 1}}, {"b", {2, 2}}}, "c1");
    for (const char* name : {"b", "a0", "a1", "c0", "c1"}) {
      strait::test::SpawnOptions out;
      out.stdout_path = out.stderr_path = dir_ + "/" + name + ".log";
      pids_.push_back(SpawnProcess({STRAITD_PATH, "--config", dir_ + "/" + name + ".toml"}, out));
    }
  }

  void TearDown() override {
    for (int code : StopProcesses(&pids_, 10)) {
      if (code != -1) {
        EXPECT_EQ(code, 0) << "a straitd did not exit cleanly on SIGTERM";
      }
    }
    KillProcesses(&pids_);
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }

  // `peers`: region -> the port index of its shard 0 and shard 1 gateway.
  void WriteConfig(const std::string& region, const std::string& shards, int port,
                   const std::vector<std::pair<std::string, std::vector<int>>>& peers,
                   const std::string& name) {
    const std::string socket = name + ".sock";
    std::string c = "region = \"" + region + "\"\n" + shards + "\n";
    c += "[local]\nsocket = \"" + dir_ + "/" + socket + "\"\nallowed_uids = [" +
         std::to_string(::getuid()) + "]\n";
    c += "[wan]\nlisten = \"127.0.0.1:" + std::to_string(ports_[static_cast<size_t>(port)]) +
         "\"\ntransport = \"plain\"\n";
    for (const auto& [peer, idx] : peers) {
      c += "[peers." + peer + "]\n";
      for (size_t k = 0; k < idx.size(); ++k) {
        c += "shard_" + std::to_string(k) + " = \"127.0.0.1:" +
             std::to_string(ports_[static_cast<size_t>(idx[k])]) + "\"\n";
      }
    }
    c += "[policy]\nallowed_codecs = [\"none\", \"zstd\"]\n";
    c += "[allreduce]\ndeadline = \"20s\"\nshutdown_grace = \"2s\"\n";
    std::ofstream(dir_ + "/" + name + ".toml") << c;
  }

  std::string Path(const std::string& name) const { return dir_ + "/" + name; }

  std::string dir_;
  std::vector<uint16_t> ports_;
  std::vector<pid_t> pids_;
};

TEST_F(StraitdMultiShard, OneStraitdServesTwoShardsBesideSingleShardPeers) {
  for (const char* s : {"b.sock", "a0.sock", "a1.sock", "c0.sock", "c1.sock"}) {
    ASSERT_TRUE(strait::test::WaitForSocket(Path(s), pids_[0], 20)) << s;
  }
  std::vector<std::vector<std::unique_ptr<Client>>> clients(3);
  for (uint32_t s = 0; s < 2; ++s) {
    const std::string k = std::to_string(s);
    for (const auto& [r, socket] : std::vector<std::pair<int, std::string>>{
             {0, "a" + k + ".sock"}, {1, "b.sock"}, {2, "c" + k + ".sock"}}) {
      auto c = ConnectRank(Path(socket), s);  // both ranks of b: one socket
      ASSERT_TRUE(c.ok()) << socket << ": " << c.status() << "\n" << ReadFile(Path("b.log"));
      clients[static_cast<size_t>(r)].push_back(std::move(c).value());
    }
  }
  RunAndCheck(clients, 3);
  if (HasFatalFailure()) {
    ADD_FAILURE() << ReadFile(Path("b.log"));
    return;
  }
  // Regions dial those that sort after them: b accepted one link from each a process, and each
  // c process accepted one link from b (b's two shards reach different c addresses).
  EXPECT_EQ(Occurrences(ReadFile(Path("b.log")), "accepted link from a"), 2u);
  EXPECT_EQ(Occurrences(ReadFile(Path("c0.log")), "accepted link from b"), 1u);
  EXPECT_EQ(Occurrences(ReadFile(Path("c1.log")), "accepted link from b"), 1u);
}

TEST_F(StraitdMultiShard, RefusesClientsWithoutOrWithAnotherShardAndASecondProcessOfAShard) {
  ASSERT_TRUE(strait::test::WaitForSocket(Path("b.sock"), pids_[0], 20));
  // No shard named: the hello passes (a plugin's tunnels go to the first shard), an all-reduce
  // does not, and the error says what to do.
  {
    auto client = Client::Connect(Path("b.sock"), Deadline::AfterSeconds(10), "no-shard");
    ASSERT_TRUE(client.ok()) << client.status();
    auto policy = (*client)->RegisterJob(kJob, "none", Deadline::AfterSeconds(10));
    ASSERT_FALSE(policy.ok());
    EXPECT_EQ(policy.status().code(), StatusCode::kFailedPrecondition);
    EXPECT_NE(policy.status().message().find("serves shards 0-1 of region b; the client must "
                                             "name its shard"),
              std::string::npos)
        << policy.status();
  }
  // A shard it does not serve: refused at the hello, naming the served ones.
  {
    auto client = Client::Connect(Path("b.sock"), Deadline::AfterSeconds(10), "wrong", 2);
    ASSERT_FALSE(client.ok());
    EXPECT_EQ(client.status().code(), StatusCode::kFailedPrecondition);
    EXPECT_NE(client.status().message().find("serves shards 0-1 of region b, not shard 2"),
              std::string::npos)
        << client.status();
    auto single = Client::Connect(Path("a1.sock"), Deadline::AfterSeconds(10), "wrong", 0);
    ASSERT_FALSE(single.ok());
    EXPECT_NE(single.status().message().find("serves shard 1 of region a, not shard 0"),
              std::string::npos)
        << single.status();
  }
  // A second straitd of this node for shard 1 of region b (its own socket and port).
  ports_.push_back(FreePorts(1)[0]);
  WriteConfig("b", "shard_index = 1", 5, {{"a", {0, 1}}, {"c", {3, 4}}}, "b1");
  const std::string why = "shard 1 of region b is already served by another straitd on this node";
  // `timeout`: a straitd that wrongly starts must not hang the test.
  const auto run = [](const std::vector<std::string>& args) {
    std::vector<std::string> argv = {"timeout", "20", STRAITD_PATH};
    argv.insert(argv.end(), args.begin(), args.end());
    return strait::test::RunCaptured(argv);
  };
  {
    const strait::test::CapturedRun check = run({"--check-config", Path("b1.toml")});
    EXPECT_EQ(check.code, 2) << check.out << check.err;
    EXPECT_NE(check.err.find(why), std::string::npos) << check.err;
  }
  {
    const strait::test::CapturedRun second = run({"--config", Path("b1.toml")});
    EXPECT_NE(second.code, 0) << second.err;
    EXPECT_NE(second.code, 124) << "the second straitd of shard 1 started";
    EXPECT_NE(second.err.find(why), std::string::npos) << second.err;
    EXPECT_NE(second.err.find("(pid " + std::to_string(pids_[0])), std::string::npos)
        << second.err;
  }
  // The two configs checked together: shard 1 of region b in both.
  {
    const strait::test::CapturedRun both =
        run({"--syntax-only", "--check-config", Path("b.toml"), Path("b1.toml")});
    EXPECT_EQ(both.code, 2) << both.out << both.err;
    EXPECT_NE(both.err.find("shards: shard 1 of region b is also served by " + Path("b.toml")),
              std::string::npos)
        << both.err;
  }
  // The running config's own check passes: the lock's holder is that very straitd.
  {
    const strait::test::CapturedRun own = run({"--check-config", Path("b.toml")});
    EXPECT_EQ(own.code, 0) << own.out << own.err;
  }
}

// Two regions over strait-wanem with mutual TLS, one straitd per region for four shards.
TEST(StraitdMultiShardWan, FourShardsOfOneStraitdShareOneLinkPerRegionPair) {
  if (Status s = wanem::CheckPrivileges(); !s.ok()) GTEST_SKIP() << s;
  WanClusterOptions o;
  o.straitd = STRAITD_PATH;
  o.name = "ms" + std::to_string(::getpid() % 10000);
  o.regions = 2;
  o.ranks_per_region = 4;
  o.shards_per_gateway = 4;
  o.link = "rate=100mbit,delay=5ms";
  auto cluster = WanCluster::Start(o);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  std::vector<std::vector<std::unique_ptr<Client>>> clients(2);
  for (int r = 0; r < 2; ++r) {
    for (uint32_t s = 0; s < 4; ++s) {
      auto c = ConnectRank((*cluster)->Socket(r, static_cast<int>(s)), s);
      ASSERT_TRUE(c.ok()) << c.status() << "\n" << (*cluster)->Logs(r, 0);
      clients[static_cast<size_t>(r)].push_back(std::move(c).value());
    }
  }
  EXPECT_EQ((*cluster)->Socket(0, 0), (*cluster)->Socket(0, 3));  // one socket for the node
  RunAndCheck(clients, 3);
  if (HasFatalFailure()) {
    ADD_FAILURE() << (*cluster)->Logs(0, 0) << (*cluster)->Logs(1, 0);
    return;
  }
  // r0 dials r1: r1's one straitd accepted one link for all four shards.
  EXPECT_EQ(Occurrences((*cluster)->Logs(1, 0), "accepted link from r0"), 1u)
      << (*cluster)->Logs(1, 0);
}

}  // namespace
}  // namespace strait::gateway

// straitd's local socket under many connections: two straitd processes (regions "a" and "b") on
// 127.0.0.1 over plain TCP. Idle clients cost a descriptor and a little memory, not a thread:
// 2,000 of them leave straitd with a small, fixed number of threads while an all-reduce and a
// hello from other clients still go through, and 50 idle clients cost no more threads than one.
// (An attack campaign measured 2,000 local connections -> 501 threads with a thread per
// connection.)
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "localproto/client.h"
#include "localproto/frame_io.h"
#include "tests/common/free_ports.h"
#include "tests/common/straitd_process.h"

namespace strait::gateway {

using namespace strait::localproto;  // NOLINT(build/namespaces)
namespace {

const char* const kNames[2] = {"a", "b"};

using strait::test::FreePorts;
using strait::test::KillProcesses;
using strait::test::SpawnProcess;
using strait::test::StopProcesses;
using strait::test::WaitForSocket;

// Threads of process `pid` now (its /proc/<pid>/task entries); -1 when it is gone.
int ThreadCount(pid_t pid) {
  std::error_code ec;
  int n = 0;
  for (std::filesystem::directory_iterator it("/proc/" + std::to_string(pid) + "/task", ec), end;
       !ec && it != end; it.increment(ec)) {
    ++n;
  }
  return ec ? -1 : n;
}

class StraitdLocal : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_EQ(::access(STRAITD_PATH, X_OK), 0) << STRAITD_PATH << " is not built";
    char tmpl[] = "/tmp/straitd-local-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    const std::vector<uint16_t> ports = FreePorts(2);
    for (int r = 0; r < 2; ++r) {
      std::string c = "region = \"" + std::string(kNames[r]) + "\"\nshard_index = 0\n";
      c += "[local]\nsocket = \"" + Socket(r) + "\"\nallowed_uids = [" +
           std::to_string(::getuid()) + "]\n";
      c +=
          "[wan]\nlisten = \"127.0.0.1:" + std::to_string(ports[r]) + "\"\ntransport = \"plain\"\n";
      const int p = 1 - r;
      c += "[peers." + std::string(kNames[p]) +
           "]\nshard_0 = \"127.0.0.1:" + std::to_string(ports[p]) + "\"\n";
      c += "[link]\nstreams = 2\nadapt_streams = false\n";
      c += "[allreduce]\nshutdown_grace = \"2s\"\n";
      const std::string file = dir_ + "/" + kNames[r] + ".toml";
      std::ofstream(file) << c;
      files_.push_back(file);
    }
  }

  void TearDown() override {
    for (int fd : idle_) ::close(fd);
    // SIGTERM: the daemons must still exit cleanly after holding thousands of connections.
    for (int code : StopProcesses(&pids_, 20)) {
      if (code != -1) {
        EXPECT_EQ(code, 0) << "a straitd did not exit cleanly on SIGTERM";
      }
    }
    KillProcesses(&pids_);
    for (const auto& f : files_) ::unlink(f.c_str());
    for (int r = 0; r < 2; ++r) ::unlink(Socket(r).c_str());
    ::rmdir(dir_.c_str());
  }

  void StartBoth() {
    for (int r = 0; r < 2; ++r) {
      pids_.push_back(SpawnProcess({STRAITD_PATH, "--config", files_[static_cast<size_t>(r)]}));
      ASSERT_GT(pids_.back(), 0);
    }
    for (int r = 0; r < 2; ++r) {
      ASSERT_TRUE(WaitForSocket(Socket(r), pids_[static_cast<size_t>(r)], 20));
    }
  }

  std::string Socket(int r) const { return dir_ + "/" + kNames[r] + ".sock"; }

  // Opens `n` more connections to region a's straitd, each greeted (its hello answered), and
  // keeps them open and silent.
  void OpenIdle(int n) {
    for (int i = 0; i < n; ++i) {
      auto fd = Dial(Socket(0), Deadline::AfterSeconds(20), "idle", false);
      ASSERT_TRUE(fd.ok()) << "idle connection " << idle_.size() << ": " << fd.status();
      idle_.push_back(*fd);
    }
  }

  // One all-reduce of a client of each region; returns the first failure.
  Status AllReduceBoth(const std::string& key) {
    Status status[2];
    std::vector<std::thread> threads;
    for (int r = 0; r < 2; ++r) {
      threads.emplace_back([&, r] {
        auto client = Client::Connect(Socket(r), Deadline::AfterSeconds(10), "busy");
        if (!client.ok()) {
          status[r] = client.status();
          return;
        }
        status[r] = (*client)->RegisterJob("job", "none", Deadline::AfterSeconds(10)).status();
        if (!status[r].ok()) return;
        std::vector<float> data(1024, static_cast<float>(r + 1));
        status[r] = (*client)->AllReduce("job", key, DataType::kFloat32, ReduceOp::kSum,
                                         data.data(), data.size(), Deadline::AfterSeconds(20));
        if (status[r].ok() && data[0] != 3.0f) status[r] = InternalError("wrong sum");
      });
    }
    for (auto& t : threads) t.join();
    return status[0].ok() ? status[1] : status[0];
  }

  std::string dir_;
  std::vector<std::string> files_;
  std::vector<pid_t> pids_;
  std::vector<int> idle_;
};

TEST_F(StraitdLocal, TwoThousandIdleConnectionsKeepTheThreadCountSmall) {
  constexpr int kIdle = 2000;
  // Both ends of every idle connection are in this process or its child straitd, which inherits
  // the limit: raise the soft limit towards the hard one.
  rlimit limit{};
  ASSERT_EQ(::getrlimit(RLIMIT_NOFILE, &limit), 0);
  if (limit.rlim_cur < 2 * kIdle + 500) {
    limit.rlim_cur = std::min<rlim_t>(limit.rlim_max, 2 * kIdle + 500);
    ASSERT_EQ(::setrlimit(RLIMIT_NOFILE, &limit), 0);
  }
  if (limit.rlim_cur < 2 * kIdle + 500) {
    GTEST_SKIP() << "the descriptor limit (ulimit -Hn " << limit.rlim_max
                 << ") is too low for 2,000 connections";
  }
  StartBoth();
  ASSERT_TRUE(AllReduceBoth("warm-up").ok());  // links up, workers started
  const int before = ThreadCount(pids_[0]);
  OpenIdle(kIdle);
  const int during = ThreadCount(pids_[0]);
  std::printf("straitd threads: %d before, %d with %d idle local connections\n", before, during,
              kIdle);
  EXPECT_GT(during, 0);
  EXPECT_LT(during, 64) << "idle connections cost threads";

  // Other clients are served beside them: a hello, and an all-reduce across both regions.
  const auto t0 = std::chrono::steady_clock::now();
  auto hello = Dial(Socket(0), Deadline::AfterSeconds(5), "probe", false);
  ASSERT_TRUE(hello.ok()) << hello.status();
  ::close(*hello);
  Status s = AllReduceBoth("beside-idle");
  EXPECT_TRUE(s.ok()) << s;
  std::printf("hello and all-reduce beside %d idle connections: %.1f ms\n", kIdle,
              std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0)
                  .count());
  auto client = Client::Connect(Socket(0), Deadline::AfterSeconds(5), "stats");
  ASSERT_TRUE(client.ok()) << client.status();
  auto stats = (*client)->Stats(Deadline::AfterSeconds(5));
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_EQ(stats->find("refused_connections 0\n") != std::string::npos, true) << *stats;
}

TEST_F(StraitdLocal, FiftyIdleConnectionsCostNoMoreThreadsThanOne) {
  StartBoth();
  ASSERT_TRUE(AllReduceBoth("warm-up").ok());  // links up, workers started
  OpenIdle(1);
  const int one = ThreadCount(pids_[0]);
  OpenIdle(49);
  // A thread of the warm-up's all-reduce may still be ending when `one` was read; never one per
  // connection.
  int fifty = ThreadCount(pids_[0]);
  const Deadline until = Deadline::AfterSeconds(5);
  while (fifty > one && !until.Expired()) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    fifty = ThreadCount(pids_[0]);
  }
  std::printf("straitd threads: %d with 1 idle connection, %d with 50\n", one, fifty);
  EXPECT_GT(one, 0);
  EXPECT_LE(fifty, one);
  // And they are all being served: each answers a stats request.
  for (size_t i = 0; i < idle_.size(); i += 7) {
    Message m;
    m.type = MessageType::kStats;
    ASSERT_TRUE(WriteMessage(idle_[i], m, Deadline::AfterSeconds(5)).ok());
    auto reply = ReadReply(idle_[i], MessageType::kStats, Deadline::AfterSeconds(5));
    ASSERT_TRUE(reply.ok()) << reply.status();
    EXPECT_EQ(reply->code, StatusCode::kOk);
  }
}

}  // namespace
}  // namespace strait::gateway

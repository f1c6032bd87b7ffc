// Tests for the child-process helpers the integration tests start straitd with: exit codes,
// output files, waiting for a socket (and giving up at once when the process died), stopping
// with SIGTERM and killing what is left. Children are /bin/sh one-liners.
#include "tests/common/straitd_process.h"

#include <gtest/gtest-spi.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace strait::test {
namespace {

class ProcessHelpers : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/strait-process-test-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override {
    KillProcesses(&pids_);
    const std::string cmd = "rm -rf '" + dir_ + "'";
    EXPECT_EQ(std::system(cmd.c_str()), 0);
  }
  static std::string Read(const std::string& path) {
    std::ifstream in(path);
    std::stringstream s;
    s << in.rdbuf();
    return s.str();
  }

  std::string dir_;
  std::vector<pid_t> pids_;
};

TEST_F(ProcessHelpers, RunProcessReturnsTheExitCode) {
  EXPECT_EQ(RunProcess({"sh", "-c", "exit 0"}), 0);
  EXPECT_EQ(RunProcess({"sh", "-c", "exit 3"}), 3);
  EXPECT_EQ(RunProcess({"sh", "-c", "kill -KILL $$"}), 128 + SIGKILL);
}

TEST_F(ProcessHelpers, AProgramThatDoesNotExistIsATestFailure) {
  // posix_spawnp reports a missing program either from the call or as exit code 127 of the
  // child, depending on the C library; both are failures the caller sees.
  int code = 0;
  bool failed = false;
  {
    ::testing::TestPartResultArray failures;
    ::testing::ScopedFakeTestPartResultReporter reporter(
        ::testing::ScopedFakeTestPartResultReporter::INTERCEPT_ONLY_CURRENT_THREAD, &failures);
    code = RunProcess({dir_ + "/no-such-program"});
    failed = failures.size() > 0;
  }
  EXPECT_TRUE(failed || code == 127) << "code " << code;
  EXPECT_NE(code, 0);
}

TEST_F(ProcessHelpers, OutputGoesToTheNamedFiles) {
  SpawnOptions both;
  both.stdout_path = dir_ + "/both.log";
  both.stderr_path = both.stdout_path;
  ASSERT_EQ(RunProcess({"sh", "-c", "echo out; echo err >&2"}, both), 0);
  ASSERT_EQ(RunProcess({"sh", "-c", "echo again"}, both), 0);  // appended
  EXPECT_EQ(Read(both.stdout_path), "out\nerr\nagain\n");

  SpawnOptions split;
  split.stdout_path = dir_ + "/out.log";
  split.stderr_path = dir_ + "/err.log";
  split.truncate = true;
  ASSERT_EQ(RunProcess({"sh", "-c", "echo first; echo e1 >&2"}, split), 0);
  ASSERT_EQ(RunProcess({"sh", "-c", "echo second; echo e2 >&2"}, split), 0);
  EXPECT_EQ(Read(split.stdout_path), "second\n");
  EXPECT_EQ(Read(split.stderr_path), "e2\n");
}

TEST_F(ProcessHelpers, WaitForSocketSeesTheFileAppear) {
  const std::string path = dir_ + "/daemon.sock";
  pids_.push_back(SpawnProcess({"sh", "-c", "sleep 0.2; : > " + path + "; exec sleep 30"}));
  ASSERT_GT(pids_[0], 0);
  EXPECT_TRUE(WaitForSocket(path, pids_[0], 20));
  EXPECT_FALSE(ProcessEnded(pids_[0]));
}

TEST_F(ProcessHelpers, WaitForSocketGivesUpWhenTheProcessExits) {
  pids_.push_back(SpawnProcess({"sh", "-c", "exit 5"}));
  ASSERT_GT(pids_[0], 0);
  // Far less than the 60 s allowed: the exit ends the wait, and the message says so.
  const ::testing::AssertionResult r = WaitForSocket(dir_ + "/never.sock", pids_[0], 60);
  ASSERT_FALSE(r);
  EXPECT_NE(std::string(r.message()).find("exited (code 5)"), std::string::npos) << r.message();
  // The process was not reaped by the check: its owner still collects the exit code.
  int code = -1;
  EXPECT_TRUE(ProcessEnded(pids_[0], &code));
  EXPECT_EQ(code, 5);
}

TEST_F(ProcessHelpers, WaitForSocketTimesOutWhileTheProcessRuns) {
  pids_.push_back(SpawnProcess({"sleep", "30"}));
  ASSERT_GT(pids_[0], 0);
  const ::testing::AssertionResult r = WaitForSocket(dir_ + "/never.sock", pids_[0], 0.1);
  ASSERT_FALSE(r);
  EXPECT_NE(std::string(r.message()).find("did not appear"), std::string::npos) << r.message();
}

TEST_F(ProcessHelpers, StopProcessesReportsHowEachEnded) {
  const std::string ready = dir_ + "/trap-set";
  // 0: exits 0 on SIGTERM, as straitd does; 1: the default action (ended by the signal).
  pids_.push_back(SpawnProcess(
      {"sh", "-c", "trap 'exit 0' TERM; : > " + ready + "; while :; do sleep 0.05; done"}));
  pids_.push_back(SpawnProcess({"sleep", "30"}));
  pids_.push_back(-1);  // an entry already stopped is skipped
  // The trap is set before the signal comes.
  ASSERT_TRUE(WaitForSocket(ready, pids_[0], 20));
  // Returns as soon as both ended; 20 s only bounds a machine under load.
  const std::vector<int> codes = StopProcesses(&pids_, 20);
  EXPECT_EQ(codes, (std::vector<int>{0, 128 + SIGTERM, -1}));
  for (pid_t pid : pids_) EXPECT_EQ(pid, -1);
}

TEST_F(ProcessHelpers, StopProcessesKillsWhatIgnoresSigterm) {
  const std::string ready = dir_ + "/trap-set";
  pids_.push_back(
      SpawnProcess({"sh", "-c", "trap '' TERM; : > " + ready + "; while :; do sleep 0.05; done"}));
  ASSERT_TRUE(WaitForSocket(ready, pids_[0], 20));
  const pid_t pid = pids_[0];
  EXPECT_EQ(StopProcesses(&pids_, 0.3), (std::vector<int>{-1}));  // still running: SIGKILLed
  EXPECT_EQ(pids_[0], -1);
  EXPECT_LT(::waitpid(pid, nullptr, WNOHANG), 0) << "pid " << pid << " was not reaped";
}

TEST_F(ProcessHelpers, KillProcessesReapsEveryChild) {
  pids_.push_back(SpawnProcess({"sleep", "30"}));
  pids_.push_back(SpawnProcess({"sleep", "30"}));
  const std::vector<pid_t> started = pids_;
  KillProcesses(&pids_);
  for (pid_t pid : pids_) EXPECT_EQ(pid, -1);
  for (pid_t pid : started) {
    EXPECT_LT(::waitpid(pid, nullptr, WNOHANG), 0) << "pid " << pid << " was not reaped";
  }
}

}  // namespace
}  // namespace strait::test

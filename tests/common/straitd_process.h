// Test helper: starting, waiting for and stopping child processes -- straitd daemons above all,
// also scripts and `ip netns exec` wrappers -- for integration tests that run real processes.
// One copy of what the gateway, plugin and deploy tests each used to spell out with posix_spawn:
//
//   std::vector<pid_t> pids;
//   pids.push_back(SpawnProcess({STRAITD_PATH, "--config", file}));
//   ASSERT_TRUE(WaitForSocket(socket_path, pids.back(), 20));   // it serves once its socket exists
//   ...
//   for (int code : StopProcesses(&pids, 10)) EXPECT_EQ(code, 0);  // SIGTERM: a clean exit
//   KillProcesses(&pids);                                          // TearDown: whatever is left
//
// Header-only, with nothing but POSIX, the C++ library and gtest, so that any test target can use
// it (like free_ports.h). Not thread-safe: call it from the test's main thread, which owns the
// children (a pid is reaped exactly once, by KillProcesses, StopProcesses or RunProcess).
#ifndef STRAIT_TESTS_COMMON_STRAITD_PROCESS_H_
#define STRAIT_TESTS_COMMON_STRAITD_PROCESS_H_

#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

extern char** environ;

namespace strait::test {

// Where a child's stdout and stderr go. An empty path keeps the test's own; stderr_path equal to
// stdout_path sends both into one file (opened once, so their lines interleave in order).
struct SpawnOptions {
  std::string stdout_path;
  std::string stderr_path;
  bool truncate = false;  // start the files empty; else append (a restarted daemon's log grows)
};

// Starts argv[0] (a path, or a name looked up in PATH such as "bash" or "ip") with `argv` and the
// test's environment; does not wait. Returns the pid, or -1 after recording a test failure that
// names the program and the reason.
inline pid_t SpawnProcess(const std::vector<std::string>& argv, const SpawnOptions& options = {}) {
  if (argv.empty()) {
    ADD_FAILURE() << "SpawnProcess: no program given";
    return -1;
  }
  std::vector<std::string> copy = argv;  // posix_spawn takes char* const[]
  std::vector<char*> args;
  for (std::string& a : copy) args.push_back(a.data());
  args.push_back(nullptr);
  const int flags = O_WRONLY | O_CREAT | (options.truncate ? O_TRUNC : O_APPEND);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  if (!options.stdout_path.empty()) {
    posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, options.stdout_path.c_str(), flags,
                                     0644);
  }
  if (!options.stderr_path.empty()) {
    if (options.stderr_path == options.stdout_path) {
      posix_spawn_file_actions_adddup2(&actions, STDOUT_FILENO, STDERR_FILENO);
    } else {
      posix_spawn_file_actions_addopen(&actions, STDERR_FILENO, options.stderr_path.c_str(), flags,
                                       0644);
    }
  }
  // Nothing of the test's but the three standard streams: a daemon must not start with (and
  // count against its descriptor limit) whatever the test process and ctest hold open.
  posix_spawn_file_actions_addclosefrom_np(&actions, STDERR_FILENO + 1);
  pid_t pid = -1;
  const int rc = ::posix_spawnp(&pid, args[0], &actions, nullptr, args.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  if (rc != 0) {
    ADD_FAILURE() << "cannot start " << argv[0] << ": " << std::strerror(rc);
    return -1;
  }
  return pid;
}

// The exit code of a wait status: the program's own, 128 + N when signal N ended it.
inline int ExitCodeOf(int wait_status) {
  if (WIFEXITED(wait_status)) return WEXITSTATUS(wait_status);
  if (WIFSIGNALED(wait_status)) return 128 + WTERMSIG(wait_status);
  return -1;
}

// Runs `argv` to completion (e.g. `straitd --check-config`); returns its exit code (128 + N for
// signal N), or -1 when it could not be started (a test failure is recorded then).
inline int RunProcess(const std::vector<std::string>& argv, const SpawnOptions& options = {}) {
  const pid_t pid = SpawnProcess(argv, options);
  if (pid < 0) return -1;
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  return ExitCodeOf(status);
}

// What a finished tool printed: its exit code (as RunProcess's) and its stdout and stderr.
struct CapturedRun {
  int code = -1;
  std::string out;
  std::string err;
};

// Runs `argv` to completion with its stdout (and stderr, unless `capture_stderr` is false: it then
// goes to the test's own log) captured through files in a scratch directory, removed afterwards.
// Files, not pipes: a tool that writes more than a pipe holds to both streams cannot block.
// Unlike the rest of this header it may run on several threads at once (each waits for its own
// child only), as tests that start one tool per region do.
inline CapturedRun RunCaptured(const std::vector<std::string>& argv, bool capture_stderr = true) {
  CapturedRun r;
  char tmpl[] = "/tmp/strait-run-XXXXXX";
  if (::mkdtemp(tmpl) == nullptr) {
    ADD_FAILURE() << "RunCaptured: mkdtemp: " << std::strerror(errno);
    return r;
  }
  const std::string dir = tmpl;
  SpawnOptions options;
  options.stdout_path = dir + "/out";
  if (capture_stderr) options.stderr_path = dir + "/err";
  options.truncate = true;
  r.code = RunProcess(argv, options);
  auto slurp = [](const std::string& path) {
    std::ifstream in(path);
    std::ostringstream ss;
    ss << in.rdbuf();
    ::unlink(path.c_str());
    return ss.str();
  };
  r.out = slurp(options.stdout_path);
  if (capture_stderr) r.err = slurp(options.stderr_path);
  ::rmdir(dir.c_str());
  return r;
}

// Whether `pid` has ended, without reaping it (its owner still waits for it as usual).
inline bool ProcessEnded(pid_t pid, int* exit_code = nullptr) {
  siginfo_t info{};
  if (::waitid(P_PID, static_cast<id_t>(pid), &info, WEXITED | WNOHANG | WNOWAIT) != 0) {
    return true;  // not our child (any more): nothing to wait for
  }
  if (info.si_pid == 0) return false;
  if (exit_code != nullptr) {
    *exit_code = info.si_code == CLD_EXITED ? info.si_status : 128 + info.si_status;
  }
  return true;
}

// Waits up to `seconds` for `path` to exist: straitd creates its Unix socket once it serves, and
// clients that do not retry (the NCCL plugin's listen) need it there. Fails at once, saying so,
// when process `pid` ends first (a bad config, a port in use), instead of waiting out the time.
inline ::testing::AssertionResult WaitForSocket(const std::string& path, pid_t pid,
                                                double seconds) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  for (;;) {
    struct stat st {};
    if (::stat(path.c_str(), &st) == 0) return ::testing::AssertionSuccess();
    int code = -1;
    if (pid > 0 && ProcessEnded(pid, &code)) {
      return ::testing::AssertionFailure()
             << "process " << pid << " exited (code " << code << ") before creating " << path;
    }
    if (std::chrono::steady_clock::now() >= deadline) {
      return ::testing::AssertionFailure() << path << " did not appear within " << seconds
                                           << " s (process " << pid << " still running)";
    }
    // Polling a file the daemon creates: it has no other way to say it is up.
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

// SIGTERMs every process in `pids` (entries <= 0 are skipped) and waits up to `seconds` in all
// for them to exit; one still running then is SIGKILLed. Returns one exit code per entry: the
// program's own, 128 + N for signal N, -1 for one that did not exit in time or was not running.
// Every entry becomes -1 (reaped).
inline std::vector<int> StopProcesses(std::vector<pid_t>* pids, double seconds) {
  std::vector<int> codes(pids->size(), -1);
  for (pid_t pid : *pids) {
    if (pid > 0) ::kill(pid, SIGTERM);
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  for (size_t i = 0; i < pids->size(); ++i) {
    pid_t& pid = (*pids)[i];
    if (pid <= 0) continue;
    int status = 0;
    pid_t got = 0;
    while ((got = ::waitpid(pid, &status, WNOHANG)) == 0 &&
           std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    if (got == pid) {
      codes[i] = ExitCodeOf(status);
    } else if (got == 0) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, nullptr, 0);
    }
    pid = -1;
  }
  return codes;
}

// SIGKILLs every process in `pids` (entries <= 0 are skipped), then reaps them all; every entry
// becomes -1. For TearDown: whatever a test left running ends here.
inline void KillProcesses(std::vector<pid_t>* pids) {
  for (pid_t pid : *pids) {
    if (pid > 0) ::kill(pid, SIGKILL);
  }
  for (pid_t& pid : *pids) {
    if (pid > 0) ::waitpid(pid, nullptr, 0);
    pid = -1;
  }
}

}  // namespace strait::test

#endif  // STRAIT_TESTS_COMMON_STRAITD_PROCESS_H_

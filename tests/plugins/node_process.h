// Test helper: child processes that talk to the test over pipes -- the plugin_node and
// collnet_node programs, started directly or through `ip netns exec`. Each prints lines such as
// "HANDLE <hex>" on its stdout and reads lines such as "PEER <hex>" from its stdin:
//
//   std::vector<NodeProcess> nodes;
//   nodes.push_back(SpawnNode({STRAIT_PLUGIN_NODE, ...}, {{"STRAIT_REGION", "a"}}));
//   ASSERT_TRUE(ReadUntil(nodes, {"HANDLE "}, 30));
//   WriteLine(nodes[0], "PEER " + LineAfter(nodes[1].output, "HANDLE") + "\n");
//   for (int code : Reap(nodes, 60)) EXPECT_EQ(code, 0);
//
// One copy of what tunnel_test, multiprocess_test, collnet_test and wan_test each used to spell
// out. Daemons whose output goes to files (straitd) are tests/common/straitd_process.h's job.
// Header-only, POSIX and the C++ library only. Not thread-safe: the test's main thread owns the
// children (each is reaped exactly once, by Reap).
#ifndef STRAIT_TESTS_PLUGINS_NODE_PROCESS_H_
#define STRAIT_TESTS_PLUGINS_NODE_PROCESS_H_

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <map>
#include <string>
#include <vector>

extern char** environ;

namespace strait::test {

// A child with its stdin and stdout piped to the test. A type that adds fields of its own (a
// result file) may derive from it and still use ReadUntil and Reap.
struct NodeProcess {
  pid_t pid = -1;      // -1: it could not be started
  int in = -1;         // our end of its stdin; Reap closes it
  int out = -1;        // our end of its stdout (and stderr, with stderr_to_stdout)
  std::string output;  // everything read from `out` so far; "\n<EOF>" once it closed
  int exit_code = -1;  // set by Reap: its own, 128 + N for signal N, -1 when killed by Reap
};

// Marks in NodeProcess::output that the helpers append.
inline constexpr char kNodeEof[] = "\n<EOF>";
inline constexpr char kNodeKilled[] = "\n<killed after the deadline>";

// Starts argv[0] (a path) with `argv`. Its environment is the test's without any STRAIT_*
// variable (a developer's shell settings must not reach the plugin under test) plus `env`, where
// an empty value leaves the variable unset. Everything is built before fork(): the child only
// redirects and execs. Returns a NodeProcess with pid -1 when pipes or fork fail.
inline NodeProcess SpawnNode(const std::vector<std::string>& argv,
                             const std::map<std::string, std::string>& env,
                             bool stderr_to_stdout = false) {
  NodeProcess p;
  if (argv.empty()) return p;
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
  for (const auto& [k, v] : env) {
    if (!v.empty()) envs.push_back(k + "=" + v);
  }
  std::vector<char*> envp;
  for (std::string& e : envs) envp.push_back(e.data());
  envp.push_back(nullptr);
  std::vector<std::string> args = argv;
  std::vector<char*> argp;
  for (std::string& a : args) argp.push_back(a.data());
  argp.push_back(nullptr);
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::dup2(to_child[0], STDIN_FILENO);
    ::dup2(from_child[1], STDOUT_FILENO);
    if (stderr_to_stdout) ::dup2(from_child[1], STDERR_FILENO);
    ::execve(argp[0], argp.data(), envp.data());
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

// Reads every process's output until each has printed one of `marks` or closed its output
// (which appends kNodeEof: a process that exited prints nothing more), within `seconds`. With no
// marks it waits for every output to close. False on timeout. `procs` is a vector of NodeProcess
// or of a type derived from it.
template <typename Procs>
bool ReadUntil(Procs& procs, const std::vector<std::string>& marks, double seconds) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  auto done = [&](const NodeProcess& p) {
    if (p.out < 0 || p.output.find(kNodeEof) != std::string::npos) return true;
    for (const std::string& m : marks) {
      if (p.output.find(m) != std::string::npos) return true;
    }
    return false;
  };
  while (true) {
    std::vector<pollfd> fds;
    for (const NodeProcess& p : procs) {
      if (!done(p)) fds.push_back({p.out, POLLIN, 0});
    }
    if (fds.empty()) return true;
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) return false;
    if (::poll(fds.data(), fds.size(), static_cast<int>(left.count())) <= 0) continue;
    for (const pollfd& f : fds) {
      if ((f.revents & (POLLIN | POLLHUP | POLLERR)) == 0) continue;
      for (NodeProcess& p : procs) {
        if (p.out != f.fd) continue;
        char buf[4096];
        const ssize_t got = ::read(p.out, buf, sizeof(buf));
        if (got > 0) {
          p.output.append(buf, static_cast<size_t>(got));
        } else {
          p.output += kNodeEof;  // closed (or broken): stop waiting for this one
        }
      }
    }
  }
}

// Closes every process's stdin (one still waiting for a line then gives up), waits up to
// `seconds` for every output to close and reaps them. A process whose output closed is exiting
// (the nodes close stdout only by exiting), so it gets until the deadline, and at least 5 s, to
// finish; one still running after that -- or at the deadline with its output open -- is
// SIGKILLed, gets kNodeKilled in its output and exit code -1. Sets each exit_code and returns
// them in order. Processes that never started are skipped (-1).
template <typename Procs>
std::vector<int> Reap(Procs& procs, double seconds) {
  using Clock = std::chrono::steady_clock;
  const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                           std::chrono::duration<double>(seconds));
  for (NodeProcess& p : procs) {
    if (p.in >= 0) ::close(p.in);
    p.in = -1;
  }
  ReadUntil(procs, {}, seconds);
  std::vector<int> codes;
  for (NodeProcess& p : procs) {
    if (p.pid > 0) {
      const bool closed = p.output.find(kNodeEof) != std::string::npos;
      const auto until =
          closed ? std::max(deadline, Clock::now() + std::chrono::seconds(5)) : Clock::now();
      int status = 0;
      bool exited = false;
      bool gone = false;  // not our child (any more): nothing to wait for or to kill
      for (;;) {
        const pid_t r = ::waitpid(p.pid, &status, WNOHANG);
        if (r == p.pid) {
          exited = true;
          break;
        }
        if (r < 0 && errno != EINTR) {
          gone = true;
          break;
        }
        if (Clock::now() >= until) break;
        // Polling for an exit that is under way: there is nothing to block on with a limit.
        ::usleep(1000);
      }
      if (exited) {
        p.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      } else if (!gone) {
        ::kill(p.pid, SIGKILL);
        ::waitpid(p.pid, &status, 0);
        p.exit_code = -1;
        p.output += kNodeKilled;
      }
      p.pid = -1;
    }
    if (p.out >= 0) ::close(p.out);
    p.out = -1;
    codes.push_back(p.exit_code);
  }
  return codes;
}

// Writes `line` (with its newline) to the process's stdin; false when it did not all go.
inline bool WriteLine(const NodeProcess& p, const std::string& line) {
  return ::write(p.in, line.data(), line.size()) == static_cast<ssize_t>(line.size());
}

// The rest of the line after the first "WORD " in `output` ("" when there is none): the hex of
// "HANDLE <hex>", the count of "CONNECTED <n>".
inline std::string LineAfter(const std::string& output, const std::string& word) {
  const size_t at = output.find(word + " ");
  if (at == std::string::npos) return "";
  const size_t start = at + word.size() + 1;
  const size_t end = output.find('\n', start);
  return output.substr(start, end == std::string::npos ? std::string::npos : end - start);
}

}  // namespace strait::test

#endif  // STRAIT_TESTS_PLUGINS_NODE_PROCESS_H_

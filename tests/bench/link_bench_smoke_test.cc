// Smoke test of `strait-bench link`: a real server and client process on 127.0.0.1, over plain
// TCP and over TLS (throwaway certificates made with the openssl CLI), with short windows. Checks
// that the client's --json output parses and carries every field with nonzero goodput, and that
// the server (--one-off) exits by itself once the client is done. Speeds are never asserted.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/clock.h"
#include "tests/net/test_certs.h"

namespace {

// A child process with its stdout (and stderr, for diagnostics) captured through pipes.
class Child {
 public:
  explicit Child(const std::vector<std::string>& argv) {
    int out[2];
    int err[2];
    if (pipe2(out, O_CLOEXEC) != 0 || pipe2(err, O_CLOEXEC) != 0) return;
    pid_ = fork();
    if (pid_ == 0) {
      dup2(out[1], STDOUT_FILENO);
      dup2(err[1], STDERR_FILENO);
      std::vector<char*> args;
      for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
      args.push_back(nullptr);
      execv(args[0], args.data());
      _exit(127);
    }
    close(out[1]);
    close(err[1]);
    out_ = out[0];
    err_ = err[0];
  }
  ~Child() {
    if (pid_ > 0 && !exited_) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
    if (out_ >= 0) close(out_);
    if (err_ >= 0) close(err_);
  }

  bool started() const { return pid_ > 0; }

  // Reads stdout until it contains `needle` or the deadline passes.
  bool WaitForOutput(const std::string& needle, strait::Deadline deadline) {
    while (stdout_.find(needle) == std::string::npos) {
      if (deadline.Expired() || !Pump(deadline)) return false;
    }
    return true;
  }

  // Reads both pipes to their end and reaps the process; -1 if it did not exit in time.
  int Wait(strait::Deadline deadline) {
    while (Pump(deadline)) {
    }
    while (!deadline.Expired()) {
      int status = 0;
      const pid_t r = waitpid(pid_, &status, WNOHANG);
      if (r == pid_) {
        exited_ = true;
        return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      }
      usleep(10'000);
    }
    return -1;
  }

  const std::string& out() const { return stdout_; }
  const std::string& err() const { return stderr_; }

 private:
  // One poll round over the open pipes; false once both are closed or the deadline passed.
  bool Pump(strait::Deadline deadline) {
    pollfd fds[2] = {{out_, POLLIN, 0}, {err_, POLLIN, 0}};
    if (out_ < 0 && err_ < 0) return false;
    const int ms = static_cast<int>(std::min<int64_t>(deadline.RemainingNanos() / 1'000'000, 200));
    if (ms <= 0) return false;
    if (poll(fds, 2, ms) < 0 && errno != EINTR) return false;
    for (int i = 0; i < 2; ++i) {
      if ((fds[i].revents & (POLLIN | POLLHUP)) == 0) continue;
      char buf[4096];
      const ssize_t n = read(fds[i].fd, buf, sizeof(buf));
      std::string& sink = i == 0 ? stdout_ : stderr_;
      int& fd = i == 0 ? out_ : err_;
      if (n > 0) {
        sink.append(buf, static_cast<size_t>(n));
      } else {
        close(fd);
        fd = -1;
      }
    }
    return true;
  }

  pid_t pid_ = -1;
  int out_ = -1;
  int err_ = -1;
  bool exited_ = false;
  std::string stdout_;
  std::string stderr_;
};

// The port from the server's "listening on 127.0.0.1:PORT" line.
std::string PortOf(const std::string& server_out) {
  const std::string marker = "listening on 127.0.0.1:";
  const size_t at = server_out.find(marker);
  if (at == std::string::npos) return "";
  size_t end = at + marker.size();
  while (end < server_out.size() && isdigit(static_cast<unsigned char>(server_out[end]))) ++end;
  return server_out.substr(at + marker.size(), end - at - marker.size());
}

// Runs a --one-off server and a client with the given flags; checks the client's report.
void RunPair(const std::vector<std::string>& server_flags,
             const std::vector<std::string>& client_flags, const std::string& transport) {
  std::vector<std::string> server_argv = {STRAIT_BENCH_BINARY, "link",       "--serve",
                                          "--listen",          "127.0.0.1:0", "--one-off"};
  server_argv.insert(server_argv.end(), server_flags.begin(), server_flags.end());
  Child server(server_argv);
  ASSERT_TRUE(server.started());
  ASSERT_TRUE(server.WaitForOutput("\n", strait::Deadline::AfterSeconds(20)))
      << "server did not start: " << server.err();
  const std::string port = PortOf(server.out());
  ASSERT_FALSE(port.empty()) << server.out();

  std::vector<std::string> client_argv = {STRAIT_BENCH_BINARY, "link", "--connect",
                                          "127.0.0.1:" + port, "--json"};
  client_argv.insert(client_argv.end(), client_flags.begin(), client_flags.end());
  Child client(client_argv);
  ASSERT_TRUE(client.started());
  const int client_rc = client.Wait(strait::Deadline::AfterSeconds(60));
  ASSERT_EQ(client_rc, 0) << "client stderr:\n" << client.err();
  // --one-off: the server ends by itself once the client said "done".
  EXPECT_EQ(server.Wait(strait::Deadline::AfterSeconds(20)), 0) << server.err();
  EXPECT_NE(server.out().find("test streams=1"), std::string::npos) << server.out();

  const nlohmann::json j = nlohmann::json::parse(client.out(), nullptr, /*allow_exceptions=*/false);
  ASSERT_FALSE(j.is_discarded()) << "not JSON:\n" << client.out();
  // The fields every tool's --json report shares (tools/cli/cli.h).
  EXPECT_EQ(j.value("tool", ""), "strait-bench");
  EXPECT_EQ(j.value("command", ""), "link");
  EXPECT_FALSE(j.value("version", "").empty());
  EXPECT_FALSE(j.value("timestamp", "").empty());
  EXPECT_EQ(j.value("transport", ""), transport);
  EXPECT_FALSE(j.value("congestion_control", "").empty());
  ASSERT_TRUE(j.contains("tests") && j["tests"].is_array());
  ASSERT_EQ(j["tests"].size(), 3u);
  const char* labels[] = {"1", "2", "adaptive"};
  for (size_t i = 0; i < 3; ++i) {
    const nlohmann::json& t = j["tests"][i];
    EXPECT_EQ(t.value("streams", ""), labels[i]);
    EXPECT_GT(t.value("goodput_bps", 0.0), 0.0) << t.dump();
    EXPECT_GT(t.value("bytes_acked", uint64_t{0}), 0u) << t.dump();
    EXPECT_GT(t.value("seconds", 0.0), 0.25) << t.dump();
    EXPECT_GE(t.value("streams_end", 0), 1) << t.dump();
    for (const char* key : {"rtt_min_ms", "rtt_smoothed_ms", "tcp_rtt_ms", "retransmissions",
                            "chunk_bytes", "client_cpu_fraction"}) {
      EXPECT_TRUE(t.contains(key) && t[key].is_number()) << key << " in " << t.dump();
    }
  }
  EXPECT_EQ(j["tests"][1].value("streams_end", 0), 2);
  ASSERT_TRUE(j.contains("codecs") && j["codecs"].is_array());
  ASSERT_EQ(j["codecs"].size(), 2u);
  for (const nlohmann::json& c : j["codecs"]) {
    EXPECT_GT(c.value("effective_bps", 0.0), 0.0) << c.dump();
    EXPECT_GT(c.value("ratio", 0.0), 0.0) << c.dump();
  }
  ASSERT_TRUE(j.contains("recommended") && j["recommended"].is_object());
  const nlohmann::json& rec = j["recommended"];
  EXPECT_FALSE(rec.value("streams", "").empty()) << rec.dump();
  EXPECT_GT(rec.value("chunk_bytes", 0), 0) << rec.dump();
  EXPECT_FALSE(rec.value("codec", "").empty()) << rec.dump();
  EXPECT_GT(rec.value("goodput_bps", 0.0), 0.0) << rec.dump();
}

const std::vector<std::string> kShortRun = {"--duration", "300ms",     "--warmup",
                                            "100ms",      "--streams", "1,2,adaptive",
                                            "--codecs",   "none,int8", "--codec-size",
                                            "1MiB",       "--message", "1MiB",
                                            "--inflight", "8MiB"};

TEST(LinkBenchSmoke, PlainTcpReportsGoodputPerTest) {
  std::vector<std::string> client = kShortRun;
  client.push_back("--plain");
  RunPair({"--plain"}, client, "plain");
}

TEST(LinkBenchSmoke, TlsReportsGoodputPerTest) {
  auto pki = strait::net::testing::TestPki::Create();
  ASSERT_TRUE(pki.ok()) << pki.status();
  ASSERT_TRUE(pki->MakeCa("ca").ok());
  auto server = pki->MakeGateway("ca", "bench-east", "server");
  ASSERT_TRUE(server.ok()) << server.status();
  auto client = pki->MakeGateway("ca", "bench-west", "client");
  ASSERT_TRUE(client.ok()) << client.status();
  std::vector<std::string> client_flags = kShortRun;
  // Regions come from the certificates; only the peer's must be named.
  client_flags.insert(client_flags.end(), {"--ca", client->ca, "--cert", client->cert, "--key",
                                           client->key, "--peer-region", "bench-east"});
  RunPair({"--ca", server->ca, "--cert", server->cert, "--key", server->key, "--peer-region",
           "bench-west"},
          client_flags, "tls");
}

TEST(LinkBenchSmoke, RefusesTlsWithoutCertificates) {
  Child client({STRAIT_BENCH_BINARY, "link", "--connect", "127.0.0.1:1"});
  ASSERT_TRUE(client.started());
  EXPECT_EQ(client.Wait(strait::Deadline::AfterSeconds(20)), 2);
  EXPECT_NE(client.err().find("--plain"), std::string::npos) << client.err();
}

// A codec the link bench does not rate is named with the link bench's list, not the codec
// bench's rows (reduce, decode-acc, +ef), which this command refuses.
TEST(LinkBenchSmoke, AnUnknownCodecIsNamedWithTheCodecsThisBenchRates) {
  for (const char* codec : {"int9", "reduce", "int8+ef"}) {
    Child client({STRAIT_BENCH_BINARY, "link", "--connect", "127.0.0.1:1", "--plain", "--codecs",
                  codec});
    ASSERT_TRUE(client.started());
    EXPECT_EQ(client.Wait(strait::Deadline::AfterSeconds(20)), 2) << codec;
    EXPECT_NE(client.err().find("is not a codec this bench rates; accepted: none, zstd, int8"),
              std::string::npos)
        << client.err();
    EXPECT_EQ(client.err().find("decode-acc"), std::string::npos) << client.err();
  }
}

}  // namespace

// Operating straitd, end to end with two daemons on 127.0.0.1 over TLS: /healthz, /readyz (503
// naming the missing peer until it runs, then 200), /metrics after an all-reduce (series present
// with sane values; `promtool check metrics` when the prometheus package is installed), 404 for
// other paths, JSON logs, and SIGHUP reloading the certificates without dropping the link (a bad
// key file is logged and the old identity kept).
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <optional>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "localproto/client.h"
#include "tests/net/test_certs.h"
#include "tests/common/free_ports.h"
#include "tests/common/http_get.h"
#include "tests/common/straitd_process.h"

namespace strait::gateway {

// The local protocol and its client (strait::localproto), which these tests drive.
using namespace strait::localproto;  // NOLINT(build/namespaces)
namespace {

using strait::test::FreePorts;
using strait::test::KillProcesses;
using strait::test::ProcessEnded;
using strait::test::SpawnOptions;
using strait::test::SpawnProcess;

using strait::test::HttpResult;

// Dials the loopback port; -1 when refused.
int Dial(uint16_t port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

// One GET over a fresh connection; every wait bounded.
HttpResult Get(uint16_t port, const std::string& path) {
  return strait::test::HttpGetOn(Dial(port), path, 10);
}

// The value of the sample `series` (name and labels exactly as printed), or nullopt.
std::optional<double> Sample(const std::string& text, const std::string& series) {
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(series + " ", 0) == 0) return std::strtod(line.c_str() + series.size(), nullptr);
  }
  return std::nullopt;
}

template <typename Pred>
bool Eventually(Pred pred, double seconds) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  while (std::chrono::steady_clock::now() < until) {
    if (pred()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return pred();
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

class StraitdMetrics : public ::testing::Test {
 protected:
  static constexpr int kRegions = 2;
  const char* const kNames[kRegions] = {"eu", "us"};

  void SetUp() override {
    char tmpl[] = "/tmp/straitd-metrics-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    auto pki = net::testing::TestPki::Create();
    ASSERT_TRUE(pki.ok()) << pki.status();
    pki_.emplace(std::move(pki).value());
    ASSERT_TRUE(pki_->MakeCa("cluster-ca").ok());
    const std::vector<uint16_t> ports = FreePorts(2 * kRegions);
    for (int r = 0; r < kRegions; ++r) {
      metrics_ports_[r] = ports[static_cast<size_t>(kRegions + r)];
      wan_ports_[r] = ports[static_cast<size_t>(r)];
      auto files = pki_->MakeGateway("cluster-ca", kNames[r], kNames[r]);
      ASSERT_TRUE(files.ok()) << files.status();
      files_[r] = *files;
      std::string c = "region = \"" + std::string(kNames[r]) + "\"\nshard_index = 0\n";
      c += "[local]\nsocket = \"" + Socket(r) + "\"\nallowed_uids = [" +
           std::to_string(::getuid()) + "]\n";
      c += "[wan]\nlisten = \"127.0.0.1:" + std::to_string(ports[static_cast<size_t>(r)]) + "\"\n";
      c += "[tls]\nca = \"" + files->ca + "\"\ncert = \"" + files->cert + "\"\nkey = \"" +
           files->key + "\"\n";
      const int p = 1 - r;
      c += "[peers." + std::string(kNames[p]) +
           "]\nshard_0 = \"127.0.0.1:" + std::to_string(ports[static_cast<size_t>(p)]) + "\"\n";
      c += "[link]\nstreams = 2\nadapt_streams = false\nunreachable_after = \"20s\"\n";
      // eu paces its link (config -> link -> metric, checked below); us does not.
      if (r == 0) c += "max_rate = \"400mbit\"\n";
      c += "[allreduce]\ndeadline = \"20s\"\nshutdown_grace = \"5s\"\n";
      c += "[metrics]\nlisten = \"127.0.0.1:" + std::to_string(metrics_ports_[r]) + "\"\n";
      configs_[r] = dir_ + "/" + kNames[r] + ".toml";
      std::ofstream(configs_[r]) << c;
    }
  }

  void TearDown() override {
    KillProcesses(&pids_);
    pki_.reset();
    std::string cmd = "rm -rf '" + dir_ + "'";
    (void)!std::system(cmd.c_str());
  }

  std::string Socket(int r) const { return dir_ + "/" + kNames[r] + ".sock"; }
  std::string Log(int r) const { return dir_ + "/" + kNames[r] + ".log"; }

  // Starts straitd for region r with JSON logs on stderr into Log(r); with a descriptor limit
  // (prlimit's) when max_fds > 0.
  void Start(int r, int max_fds = 0) {
    SpawnOptions log;
    log.stderr_path = Log(r);
    log.truncate = true;
    std::vector<std::string> argv = {STRAITD_PATH, "--config", configs_[r], "--log-format", "json"};
    if (max_fds > 0) {
      const std::string n = std::to_string(max_fds);
      argv.insert(argv.begin(), {"/usr/bin/prlimit", "--nofile=" + n + ":" + n, "--"});
    }
    const pid_t pid = SpawnProcess(argv, log);
    ASSERT_GT(pid, 0);
    pids_.push_back(pid);
  }

  bool Alive(size_t i) { return !ProcessEnded(pids_[i]); }

  std::string dir_;
  std::optional<net::testing::TestPki> pki_;
  net::testing::CertFiles files_[kRegions];
  std::string configs_[kRegions];
  uint16_t metrics_ports_[kRegions] = {};
  uint16_t wan_ports_[kRegions] = {};
  std::vector<pid_t> pids_;
};


// The liveness probe against a straitd whose metrics port 500 idle clients and 50 slow senders
// hold (one idle client used to delay /healthz by 4.8 s, twenty by 85 s: kubelet would have
// restarted a healthy gateway). Prints the worst probe beside the 50 ms the architecture issue
// asks; fails only far above it (not a speed test: a server that waits on any client takes
// seconds).
TEST_F(StraitdMetrics, HealthzAnswersAtOnceWhileIdleAndSlowClientsHoldThePort) {
  Start(0);
  ASSERT_TRUE(Eventually([&] { return Get(metrics_ports_[0], "/healthz").status == 200; }, 20));
  std::vector<int> held;
  for (int i = 0; i < 550; ++i) {
    const int fd = Dial(metrics_ports_[0]);
    ASSERT_GE(fd, 0) << "connection " << i;
    held.push_back(fd);
  }
  const std::string head = "GET /metrics HTTP/1.1\r\n\r\n";
  double worst_ms = 0;
  for (int round = 0; round < 20; ++round) {
    for (size_t k = 500; k < held.size(); ++k) {  // the slow senders: a byte each per round
      (void)!::send(held[k], head.data() + round % head.size(), 1, MSG_NOSIGNAL);
    }
    const auto t0 = std::chrono::steady_clock::now();
    const HttpResult r = Get(metrics_ports_[0], "/healthz");
    const double ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    ASSERT_EQ(r.status, 200) << "round " << round;
    worst_ms = std::max(worst_ms, ms);
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  std::printf("straitd /healthz beside 500 idle + 50 slow clients: worst of 20 probes %.1f ms "
              "(goal < 50 ms)\n", worst_ms);
  EXPECT_LT(worst_ms, 1000) << "a probe waited for other clients";
  for (int fd : held) ::close(fd);
  EXPECT_TRUE(Alive(0));
}

// CPU seconds (user + system) process `pid` has used.
double CpuSeconds(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string stat((std::istreambuf_iterator<char>(in)), {});
  const size_t close = stat.rfind(')');
  if (close == std::string::npos) return -1;
  std::istringstream fields(stat.substr(close + 2));
  std::string f;
  unsigned long long utime = 0, stime = 0;
  for (int i = 3; i <= 15 && fields >> f; ++i) {
    if (i == 14) utime = std::stoull(f);
    if (i == 15) stime = std::stoull(f);
  }
  return static_cast<double>(utime + stime) / static_cast<double>(::sysconf(_SC_CLK_TCK));
}

// A flood of WAN connections past straitd's descriptor limit: accept fails with EMFILE while
// the connections wait in the backlog. It used to retry at once -- 84% of a core and 800,000
// log lines in 8 s; now it pauses 100 ms per failure and logs one line per 100 failures.
// The limit is 24: straitd keeps at most half its limit for streams still setting up (at 64 a
// flood no longer reaches the limit at all, see straitd_flood_test.cc), so only a limit its ~17
// idle descriptors plus those 12 exceed still makes accept fail -- as links, local clients and
// HTTP probes holding descriptors would.
TEST_F(StraitdMetrics, AcceptAtTheDescriptorLimitNeitherSpinsNorFloodsTheLog) {
  Start(0, 24);
  ASSERT_TRUE(Eventually([&] { return Get(metrics_ports_[0], "/healthz").status == 200; }, 20));
  std::vector<int> flood;
  for (int i = 0; i < 120; ++i) {
    const int fd = Dial(wan_ports_[0]);
    if (fd >= 0) flood.push_back(fd);
  }
  ASSERT_GT(flood.size(), 24u) << "the backlog should take more than the limit";
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  const double before = CpuSeconds(pids_[0]);
  std::this_thread::sleep_for(std::chrono::seconds(2));
  const double used = CpuSeconds(pids_[0]) - before;
  const std::string log = ReadFile(Log(0));
  size_t lines = 0;
  for (size_t at = 0; (at = log.find("accepting a WAN connection failed", at)) != std::string::npos;
       ++at) {
    ++lines;
  }
  std::printf("straitd at its descriptor limit: %.2f CPU s in 2 s, %zu accept-failure lines\n",
              used, lines);
  EXPECT_GE(lines, 1u) << "the limit was not reached; the test did not test it";
  EXPECT_LE(lines, 3u);
  EXPECT_LT(used, 0.5) << "the accept loop spins";
  for (int fd : flood) ::close(fd);
  EXPECT_TRUE(Alive(0));
  // /healthz during a flood past the limit: straitd_flood_test.cc.
}

TEST_F(StraitdMetrics, HealthReadinessMetricsLogsAndCertificateReload) {
  // Only "eu" runs: alive, serving, but not ready, and /readyz says what is missing.
  Start(0);
  ASSERT_TRUE(Eventually([&] { return Get(metrics_ports_[0], "/healthz").status == 200; }, 20));
  const HttpResult not_ready = Get(metrics_ports_[0], "/readyz");
  EXPECT_EQ(not_ready.status, 503);
  EXPECT_NE(not_ready.body.find("no link to the gateway of region us"), std::string::npos)
      << not_ready.body;
  EXPECT_EQ(Get(metrics_ports_[0], "/nope").status, 404);

  Start(1);
  for (int r = 0; r < kRegions; ++r) {
    EXPECT_TRUE(Eventually([&] { return Get(metrics_ports_[r], "/readyz").status == 200; }, 20))
        << kNames[r] << ": " << Get(metrics_ports_[r], "/readyz").body;
  }

  // One zstd all-reduce of a very compressible tensor from a client of each region.
  constexpr size_t kCount = 64 * 1024;
  std::vector<Status> status(kRegions);
  std::vector<std::thread> threads;
  for (int r = 0; r < kRegions; ++r) {
    threads.emplace_back([&, r] {
      const size_t i = static_cast<size_t>(r);
      auto client = Client::Connect(Socket(r), Deadline::AfterSeconds(20), kNames[r]);
      if (!client.ok()) {
        status[i] = client.status();
        return;
      }
      if (auto p = (*client)->RegisterJob("jm", "zstd:3", Deadline::AfterSeconds(5)); !p.ok()) {
        status[i] = p.status();
        return;
      }
      std::vector<float> data(kCount, 1.0f);
      status[i] = (*client)->AllReduce("jm", "grad", DataType::kFloat32, ReduceOp::kSum,
                                       data.data(), kCount, Deadline::AfterSeconds(20));
      if (status[i].ok() && data[kCount - 1] != 2.0f) status[i] = InternalError("wrong sum");
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < kRegions; ++r) ASSERT_TRUE(status[r].ok()) << kNames[r] << ": " << status[r];

  // RTT samples come with the pings (every 200 ms), and readiness needs one stream, not both;
  // wait for an RTT and both streams.
  std::string text;
  EXPECT_TRUE(Eventually(
      [&] {
        text = Get(metrics_ports_[0], "/metrics").body;
        return Sample(text, "strait_peer_rtt_min_seconds{peer=\"us\"}").value_or(0) > 0 &&
               Sample(text, "strait_peer_streams{peer=\"us\"}").value_or(0) == 2;
      },
      10))
      << text;
  EXPECT_EQ(Sample(text, "strait_peer_up{peer=\"us\"}"), 1.0);
  EXPECT_EQ(Sample(text, "strait_peer_streams{peer=\"us\"}"), 2.0);
  EXPECT_TRUE(Eventually(
      [&] {
        text = Get(metrics_ports_[0], "/metrics").body;
        return Sample(text, "strait_peer_pacing_bytes_per_second{peer=\"us\"}") == 50'000'000;
      },
      5))
      << "link.max_rate 400mbit: two streams of 25 MB/s\n"
      << text;
  EXPECT_EQ(Sample(Get(metrics_ports_[1], "/metrics").body,
                   "strait_peer_pacing_bytes_per_second{peer=\"eu\"}"),
            0.0);
  // Tunnels (the NCCL plugin's point-to-point path; issue #17: no metrics): one from us to eu,
  // one 100,000-byte message.
  {
    auto listener = TunnelListener::Listen(Socket(0), Deadline::AfterSeconds(10));
    ASSERT_TRUE(listener.ok()) << listener.status();
    // Connect returns once the listening side accepted: from another thread.
    StatusOr<std::unique_ptr<TunnelConnection>> b = UnavailableError("not connected");
    std::thread connect([&] {
      b = TunnelConnection::Connect(Socket(1), "eu", 0, (*listener)->listen_id(),
                                    Deadline::AfterSeconds(10));
    });
    auto a = (*listener)->Accept(Deadline::AfterSeconds(10));
    connect.join();
    ASSERT_TRUE(a.ok()) << a.status();
    ASSERT_TRUE(b.ok()) << b.status();
    const std::vector<uint8_t> payload(100'000, 7);
    ASSERT_TRUE((*b)->Send(payload, 1, Deadline::AfterSeconds(10)).ok());
    auto m = (*a)->Receive(Deadline::AfterSeconds(10));
    ASSERT_TRUE(m.ok()) << m.status();
    EXPECT_EQ(m->data, payload);
    const std::string us = Get(metrics_ports_[1], "/metrics").body;
    EXPECT_EQ(Sample(us, "strait_tunnels_open"), 1.0) << us;
    EXPECT_EQ(Sample(us, "strait_tunnels_opened_total"), 1.0);
    EXPECT_EQ(Sample(us, "strait_tunnel_messages_sent_total"), 1.0);
    EXPECT_EQ(Sample(us, "strait_tunnel_raw_bytes_sent_total"), 100'000.0);
    EXPECT_LT(Sample(us, "strait_tunnel_wire_bytes_sent_total").value_or(1e9), 100'000.0)
        << "100,000 equal bytes: zstd pays";
    const std::string eu = Get(metrics_ports_[0], "/metrics").body;
    EXPECT_EQ(Sample(eu, "strait_tunnel_messages_received_total"), 1.0) << eu;
    EXPECT_EQ(Sample(eu, "strait_tunnel_raw_bytes_received_total"), 100'000.0);
    EXPECT_EQ(Sample(eu, "strait_tunnels_failed_total"), 0.0);
  }
  // The process's own series (issue #17: there were none), as /proc says; started before now.
  EXPECT_GT(Sample(text, "process_resident_memory_bytes").value_or(0), 4 << 20);
  EXPECT_LT(Sample(text, "process_resident_memory_bytes").value_or(1e18), 1 << 30);
  EXPECT_GT(Sample(text, "process_open_fds").value_or(0), 5);
  EXPECT_GT(Sample(text, "process_max_fds").value_or(0), 0);
  EXPECT_GT(Sample(text, "process_cpu_seconds_total").value_or(-1), 0);
  EXPECT_GT(Sample(text, "process_threads").value_or(0), 1);
  // The start time is /proc/stat's btime (whole seconds) plus the start in clock ticks, so it
  // can read up to a second off the wall clock; it failed once against time(nullptr), which
  // drops the fraction of the current second. This straitd started during this test.
  const double now = std::chrono::duration<double>(
                         std::chrono::system_clock::now().time_since_epoch())
                         .count();
  EXPECT_LE(Sample(text, "process_start_time_seconds").value_or(1e18), now + 1.0);
  EXPECT_GE(Sample(text, "process_start_time_seconds").value_or(0), now - 120.0);
  EXPECT_LT(Sample(text, "strait_peer_rtt_min_seconds{peer=\"us\"}").value_or(9), 1.0);
  EXPECT_GE(Sample(text, "strait_peer_rtt_smoothed_seconds{peer=\"us\"}").value_or(0),
            Sample(text, "strait_peer_rtt_min_seconds{peer=\"us\"}").value_or(1));
  EXPECT_GT(Sample(text, "strait_peer_sent_bytes_total{peer=\"us\"}").value_or(0), 0);
  EXPECT_EQ(Sample(text, "strait_allreduces_total{strait_job=\"jm\"}"), 1.0);
  EXPECT_EQ(Sample(text, "strait_allreduce_duration_seconds_count{strait_job=\"jm\"}"), 1.0);
  EXPECT_EQ(
      Sample(text, "strait_allreduce_duration_seconds_bucket{strait_job=\"jm\",le=\"+Inf\"}"),
      1.0);
  EXPECT_EQ(Sample(text, "strait_allreduce_raw_bytes_total{strait_job=\"jm\"}"), kCount * 4.0);
  const double sent =
      Sample(text, "strait_allreduce_wan_sent_bytes_total{strait_job=\"jm\"}").value_or(0);
  EXPECT_GT(sent, 0);
  EXPECT_LT(sent, kCount * 4.0 / 10);  // constant data: zstd shrinks it by far more than 10x
  EXPECT_GT(Sample(text, "strait_compression_ratio{strait_job=\"jm\"}").value_or(0), 10);
  EXPECT_EQ(Sample(text, "strait_errors_total{kind=\"bad_request\"}"), 0.0);
  EXPECT_NE(text.find("strait_build_info{version=\""), std::string::npos);
  // No series carries Prometheus' own target labels (scraped as exported_job otherwise).
  EXPECT_EQ(text.find("{job="), std::string::npos) << text;
  EXPECT_EQ(text.find(",job="), std::string::npos) << text;

  // SIGHUP with unchanged files reloads; with a bad key the old identity stays. Neither drops
  // the link: same streams, no stream failure, still ready, and all-reduces still work.
  // (Failures counted so far are the dials before "us" ran.)
  const double failures =
      Sample(text, "strait_peer_stream_failures_total{peer=\"us\"}").value_or(-1);
  ASSERT_EQ(::kill(pids_[0], SIGHUP), 0);
  EXPECT_TRUE(Eventually(
      [&] { return ReadFile(Log(0)).find("TLS identity reloaded") != std::string::npos; }, 10));
  std::ofstream(files_[0].key, std::ios::trunc) << "garbage\n";
  ASSERT_EQ(::kill(pids_[0], SIGHUP), 0);
  EXPECT_TRUE(Eventually(
      [&] { return ReadFile(Log(0)).find("old one stays in use") != std::string::npos; }, 10));
  EXPECT_TRUE(Alive(0));
  const std::string after = Get(metrics_ports_[0], "/metrics").body;
  EXPECT_EQ(Sample(after, "strait_peer_stream_failures_total{peer=\"us\"}"), failures);
  EXPECT_EQ(Sample(after, "strait_peer_streams{peer=\"us\"}"), 2.0);
  EXPECT_EQ(Get(metrics_ports_[0], "/readyz").status, 200);

  // Every log line of "eu" is one JSON object with ts, level, subsystem and msg.
  std::istringstream log(ReadFile(Log(0)));
  std::string line;
  int lines = 0;
  const std::regex json(R"re(^\{"ts":"[0-9T:.\-]+Z","level":"(error|warn|info|debug|trace)",)re"
                        R"re("subsystem":"[^"]*","msg":".*"\}$)re");
  while (std::getline(log, line)) {
    ++lines;
    EXPECT_TRUE(std::regex_match(line, json)) << line;
  }
  EXPECT_GT(lines, 2);

  // promtool's own parser and lint rules on the live scrape.
  const std::string scrape = dir_ + "/scrape.txt";
  std::ofstream(scrape) << after;
  if (std::system("command -v promtool >/dev/null 2>&1") != 0) {
    GTEST_SKIP() << "promtool not found (Debian package 'prometheus'; scripts/setup.sh installs "
                    "it): the exposition was checked by this test only, not by promtool";
  }
  const std::string check =
      "promtool check metrics < '" + scrape + "' > '" + dir_ + "/promtool.txt' 2>&1";
  EXPECT_EQ(std::system(check.c_str()), 0) << ReadFile(dir_ + "/promtool.txt") << "\n" << after;
}

}  // namespace
}  // namespace strait::gateway

// straitd's WAN port under floods of connections, end to end with a real daemon on 127.0.0.1
// over TLS (issue #17's attack, rerun): three floods of 3,000 connections -- complete TLS
// handshakes with a certificate of a foreign CA, garbage, and silent half-open connections --
// after each of which RSS and open descriptors come back to the idle figures; and a flood well
// past a low descriptor limit. /healthz is probed throughout and must answer within 100 ms.
//
// Before the fix these floods left RSS at 13 -> 102 -> 126 -> 135 MB (freed TLS buffers kept by
// glibc's arena of the WAN thread; 3,000 connections all at once took it to 371 MB) and /healthz
// took up to 5 s at the descriptor limit (the WAN port held every descriptor, so the HTTP port
// could not accept the probe).
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <poll.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "tests/common/free_ports.h"
#include "tests/common/http_get.h"
#include "tests/common/straitd_process.h"
#include "tests/net/test_certs.h"

namespace strait::gateway {
namespace {

using strait::test::FreePorts;
using strait::test::KillProcesses;
using strait::test::ProcessEnded;
using strait::test::SpawnOptions;
using strait::test::SpawnProcess;

// RSS behaves differently under a sanitizer (its allocator keeps freed memory in quarantine and
// never uses glibc's arenas), so the RSS figure is only checked in plain builds; descriptors and
// /healthz are checked in every build.
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
constexpr bool kSanitizer = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
constexpr bool kSanitizer = true;
#else
constexpr bool kSanitizer = false;
#endif
#else
constexpr bool kSanitizer = false;
#endif

// Dials the loopback port; -1 when refused. Blocking: a connection the server has not accepted
// yet still completes (it waits in the listen backlog).
int Dial(uint16_t port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
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

// GET /healthz over a fresh connection: true for a 200 within 5 s.
bool Healthy(uint16_t port) {
  return strait::test::HttpGetOn(Dial(port), "/healthz", 5).status == 200;
}

// Resident set of `pid` in KiB (VmRSS), or -1.
long RssKib(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("VmRSS:", 0) == 0) return std::atol(line.c_str() + 6);
  }
  return -1;
}

// Descriptors `pid` has open.
long OpenFds(pid_t pid) {
  std::error_code ec;
  long n = 0;
  for (auto it = std::filesystem::directory_iterator("/proc/" + std::to_string(pid) + "/fd", ec);
       !ec && it != std::filesystem::directory_iterator(); it.increment(ec)) {
    ++n;
  }
  return n;
}

// Probes /healthz every 20 ms on its own thread from construction to Stop(); records the worst
// answer time and the probes that got no 200.
class HealthProber {
 public:
  explicit HealthProber(uint16_t port) : thread_([this, port] {
      while (!stop_.load()) {
        const auto t0 = std::chrono::steady_clock::now();
        const bool ok = Healthy(port);
        const double ms = std::chrono::duration<double, std::milli>(
                              std::chrono::steady_clock::now() - t0)
                              .count();
        worst_ms_ = std::max(worst_ms_, ms);
        ++probes_;
        if (ms >= 100) ++slow_;
        if (!ok) ++failures_;
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      }
    }) {}
  ~HealthProber() { Stop(); }
  void Stop() {
    stop_.store(true);
    if (thread_.joinable()) thread_.join();
  }
  // Valid after Stop().
  double worst_ms() const { return worst_ms_; }
  int probes() const { return probes_; }
  int failures() const { return failures_; }
  int slow() const { return slow_; }  // 100 ms or more

 private:
  std::atomic<bool> stop_{false};
  double worst_ms_ = 0;
  int probes_ = 0;
  int failures_ = 0;
  int slow_ = 0;
  std::thread thread_;
};

// One flood's mix, all at the same time: `raw` plain connections (every other one sends a burst
// of random bytes, the rest stay silent) held for `hold`, and `tls` complete TLS 1.3 handshakes
// from `threads` threads with the client certificate of `client` (another CA's: straitd refuses
// it once it has seen it). Returns the handshakes the client saw complete.
int Flood(uint16_t port, int raw, int tls, int threads, const net::testing::CertFiles& client,
          std::chrono::milliseconds hold) {
  SSL_CTX* ctx = SSL_CTX_new(TLS_client_method());
  SSL_CTX_set_min_proto_version(ctx, TLS1_3_VERSION);
  SSL_CTX_set_verify(ctx, SSL_VERIFY_NONE, nullptr);  // the attacker does not care who answers
  if (SSL_CTX_use_certificate_chain_file(ctx, client.cert.c_str()) != 1 ||
      SSL_CTX_use_PrivateKey_file(ctx, client.key.c_str(), SSL_FILETYPE_PEM) != 1) {
    ADD_FAILURE() << "cannot load the flood's client certificate";
    SSL_CTX_free(ctx);
    return 0;
  }
  std::atomic<int> completed{0};
  std::vector<std::thread> workers;
  for (int t = 0; t < threads; ++t) {
    workers.emplace_back([&, t] {
      // The attacker's own CPU (the handshakes' signatures) yields to the daemon and the probe:
      // on a loaded 2-core CI machine the test measures straitd, not the scheduler.
      (void)!::setpriority(PRIO_PROCESS, static_cast<id_t>(::gettid()), 10);
      for (int i = t; i < tls; i += threads) {
        const int fd = Dial(port);
        if (fd < 0) continue;
        timeval tv{2, 0};  // an evicted or refused handshake fails; none may hang the test
        ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
        ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
        SSL* ssl = SSL_new(ctx);
        SSL_set_fd(ssl, fd);
        if (SSL_connect(ssl) == 1) {
          ++completed;
          char byte = 0;
          (void)SSL_write(ssl, "x", 1);
          (void)SSL_read(ssl, &byte, 1);  // the server's alert: it refused the certificate
        }
        SSL_free(ssl);
        ERR_clear_error();
        ::close(fd);
      }
    });
  }
  std::vector<int> held;
  std::mt19937 rng(42);
  std::vector<char> garbage(1500);
  for (int i = 0; i < raw; ++i) {
    const int fd = Dial(port);
    if (fd < 0) continue;
    if (i % 2 == 0) {
      for (char& c : garbage) c = static_cast<char>(rng());
      (void)!::send(fd, garbage.data(), 1 + rng() % garbage.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
    }
    held.push_back(fd);
  }
  for (auto& w : workers) w.join();
  std::this_thread::sleep_for(hold);
  for (int fd : held) ::close(fd);
  SSL_CTX_free(ctx);
  return completed.load();
}

template <typename Pred>
bool Eventually(Pred pred, double seconds) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  while (std::chrono::steady_clock::now() < until) {
    if (pred()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  return pred();
}

class StraitdFlood : public ::testing::Test {
 protected:
  void SetUp() override {
    // SSL_write to a connection straitd already closed (it refused the certificate, or evicted
    // the stream) must fail, not kill the test.
    ::signal(SIGPIPE, SIG_IGN);
    // The floods hold ~2,000 sockets of this process at once: take the hard limit.
    rlimit files{};
    ASSERT_EQ(::getrlimit(RLIMIT_NOFILE, &files), 0);
    files.rlim_cur = files.rlim_max;
    ASSERT_EQ(::setrlimit(RLIMIT_NOFILE, &files), 0);
    max_raw_ = files.rlim_cur == RLIM_INFINITY
                   ? 100000
                   : static_cast<int>(std::min<rlim_t>(files.rlim_cur, 100000)) - 200;
    char tmpl[] = "/tmp/straitd-flood-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    auto pki = net::testing::TestPki::Create();
    ASSERT_TRUE(pki.ok()) << pki.status();
    pki_.emplace(std::move(pki).value());
    ASSERT_TRUE(pki_->MakeCa("cluster-ca").ok());
    ASSERT_TRUE(pki_->MakeCa("foreign-ca").ok());
    auto files_eu = pki_->MakeGateway("cluster-ca", "eu", "eu");
    ASSERT_TRUE(files_eu.ok()) << files_eu.status();
    // A region straitd does expect, from a CA it does not trust.
    auto foreign = pki_->MakeGateway("foreign-ca", "us", "foreign-us");
    ASSERT_TRUE(foreign.ok()) << foreign.status();
    foreign_ = *foreign;
    eu_ = *files_eu;
    WriteConfig();
  }

  // The config, on ports fresh from the kernel (again after a port turned out to be taken).
  void WriteConfig() {
    const std::vector<uint16_t> ports = FreePorts(3);
    wan_port_ = ports[0];
    metrics_port_ = ports[2];
    std::string c = "region = \"eu\"\nshard_index = 0\n";
    c += "[local]\nsocket = \"" + dir_ + "/eu.sock\"\nallowed_uids = [" +
         std::to_string(::getuid()) + "]\n";
    c += "[wan]\nlisten = \"127.0.0.1:" + std::to_string(wan_port_) + "\"\n";
    c += "[tls]\nca = \"" + eu_.ca + "\"\ncert = \"" + eu_.cert + "\"\nkey = \"" + eu_.key +
         "\"\n";
    // A peer that does not run: its dials fail at once and do not count as held descriptors.
    c += "[peers.us]\nshard_0 = \"127.0.0.1:" + std::to_string(ports[1]) + "\"\n";
    c += "[metrics]\nlisten = \"127.0.0.1:" + std::to_string(metrics_port_) + "\"\n";
    config_ = dir_ + "/eu.toml";
    std::ofstream(config_) << c;
  }

  void TearDown() override {
    KillProcesses(&pids_);
    pki_.reset();
    std::string cmd = "rm -rf '" + dir_ + "'";
    (void)!std::system(cmd.c_str());
  }

  // Starts straitd, with a descriptor limit (prlimit's) when max_fds > 0, and waits until it
  // serves /healthz.
  void Start(int max_fds = 0) {
    SpawnOptions log;
    log.stderr_path = dir_ + "/eu.log";
    log.truncate = true;
    std::vector<std::string> argv = {STRAITD_PATH, "--config", config_};
    if (max_fds > 0) {
      const std::string n = std::to_string(max_fds);
      argv.insert(argv.begin(), {"/usr/bin/prlimit", "--nofile=" + n + ":" + n, "--"});
    }
    // FreePorts releases its ports before straitd binds them: a test running in parallel may take
    // one in between. Then straitd exits naming the address, and it starts again on new ports.
    for (int attempt = 0;; ++attempt) {
      const pid_t pid = SpawnProcess(argv, log);
      ASSERT_GT(pid, 0);
      pids_.push_back(pid);
      bool ended = false;
      const bool up = Eventually(
          [&] { return Healthy(metrics_port_) || (ended = ProcessEnded(pid)); }, 20) && !ended;
      if (up) break;
      std::ifstream in(log.stderr_path);
      const std::string text((std::istreambuf_iterator<char>(in)),
                             std::istreambuf_iterator<char>());
      ASSERT_TRUE(ended && attempt < 2 && text.find("in use") != std::string::npos)
          << "straitd did not serve /healthz within 20 s (" << (ended ? "it exited" : "running")
          << "); its log:\n" << text;
      pids_.pop_back();
      WriteConfig();
    }
    // Idle: the first dials to the absent peer and the probe's connection are over.
    std::this_thread::sleep_for(std::chrono::seconds(1));
  }

  std::string dir_;
  std::optional<net::testing::TestPki> pki_;
  net::testing::CertFiles foreign_;
  net::testing::CertFiles eu_;
  std::string config_;
  uint16_t wan_port_ = 0;
  uint16_t metrics_port_ = 0;
  int max_raw_ = 0;
  std::vector<pid_t> pids_;
};

// Three floods of 3,000 connections (2,000 garbage or silent held for a second, 1,000 complete
// handshakes with a foreign certificate). After each, once it settled, RSS and open descriptors
// are back to the idle figures; /healthz answers within 100 ms throughout.
//
// RSS within 10% of idle, the goal, with no further slack: what the first floods leave
// for good is small -- OpenSSL's lazily filled algorithm caches, a few KiB -- now that Asio's
// descriptor states are reserved at start (net/endpoint.cc) instead of being strewn through the
// flood's heap, where each kept a freed page resident. Measured (Release, 2026-12-03): idle
// 14.0-14.1 MB, settled 13.7-14.4 MB after each flood; with the states grown by the flood,
// 14.4-15.3 MB (+2-10%); before any fix 102, 126, 135 MB.
TEST_F(StraitdFlood, RssAndDescriptorsComeBackAfterEachFloodOfHandshakes) {
  Start();
  const pid_t pid = pids_[0];
  const long idle_rss = RssKib(pid);
  const long idle_fds = OpenFds(pid);
  ASSERT_GT(idle_rss, 0);
  const long rss_limit = idle_rss + idle_rss / 10;
  const long fds_limit = idle_fds + std::max(1L, idle_fds / 10);
  std::printf("straitd idle: RSS %ld KiB, %ld descriptors\n", idle_rss, idle_fds);
  HealthProber prober(metrics_port_);
  const int raw = std::min(2000, max_raw_);
  for (int flood = 1; flood <= 3; ++flood) {
    const int handshakes = Flood(wan_port_, raw, 1000, 4, foreign_, std::chrono::seconds(1));
    const long peak = RssKib(pid);
    long rss = 0, fds = 0;
    // Settled: the silent connections closed, then a second with nothing setting up.
    Eventually(
        [&] {
          rss = RssKib(pid);
          fds = OpenFds(pid);
          return (kSanitizer || rss <= rss_limit) && fds <= fds_limit;
        },
        8);
    std::printf("flood %d: %d raw + 1000 TLS (%d handshakes done); RSS %ld KiB at its end, "
                "%ld KiB settled (limit %ld), %ld descriptors (limit %ld)\n",
                flood, raw, handshakes, peak, rss, rss_limit, fds, fds_limit);
    if (!kSanitizer) {
      EXPECT_LE(rss, rss_limit) << "flood " << flood;
    }
    EXPECT_LE(fds, fds_limit) << "flood " << flood;
  }
  prober.Stop();
  std::printf("/healthz during the floods: worst of %d probes %.1f ms, %d over 100 ms, %d failed\n",
              prober.probes(), prober.worst_ms(), prober.slow(), prober.failures());
  EXPECT_EQ(prober.failures(), 0);
  EXPECT_LT(prober.worst_ms(), 100);
  EXPECT_FALSE(ProcessEnded(pid));
}

// A flood far past straitd's descriptor limit (64): 600 held connections and 200 handshakes.
// /healthz keeps answering within 100 ms (the WAN port keeps at most half the limit for
// connections still setting up), and the descriptors come back afterwards.
TEST_F(StraitdFlood, HealthzAnswersWhileAFloodPassesTheDescriptorLimit) {
  const int limit = 64;
  Start(limit);
  const pid_t pid = pids_[0];
  const long idle_fds = OpenFds(pid);
  HealthProber prober(metrics_port_);
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  const int handshakes = Flood(wan_port_, std::min(600, max_raw_), 200, 4, foreign_,
                               std::chrono::seconds(2));
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  prober.Stop();
  long fds = 0;
  Eventually([&] { return (fds = OpenFds(pid)) <= idle_fds + 1; }, 8);
  std::printf("straitd at a %d-descriptor limit, 600 held + 200 TLS (%d done): /healthz worst of "
              "%d probes %.1f ms (%d over 100 ms), %d failed; descriptors %ld idle, %ld after\n",
              limit, handshakes, prober.probes(), prober.worst_ms(), prober.slow(),
              prober.failures(), idle_fds, fds);
  EXPECT_GT(prober.probes(), 20);
  EXPECT_EQ(prober.failures(), 0);
  EXPECT_LT(prober.worst_ms(), 100);
  EXPECT_LE(fds, idle_fds + 1);
  EXPECT_FALSE(ProcessEnded(pid));
}

// Started under a descriptor limit too small to start at all (an operator's `ulimit -n`, a
// container's nofile), straitd exits 1 with one line that says which descriptor it could not
// get and what to raise -- wherever in the start-up it ran out. It used to die of an uncaught
// std::system_error from Asio ("terminate called ... epoll: Too many open files").
// Under the sanitizers (CI's build) UBSan's own type checks misreport ("invalid vptr" in
// std::ifstream and the like) once the process has no descriptor left for the runtime: there
// every run must not end in `terminate`, and those the runtime left alone must show the error
// as above; the plain build (build/release) holds every limit to the clear error.
TEST_F(StraitdFlood, TooFewDescriptorsToStartIsOneClearErrorNotACrash) {
  int refused = 0;
  for (int n = 4; n <= 16; ++n) {
    const std::string limit = std::to_string(n);
    const strait::test::CapturedRun run = strait::test::RunCaptured(
        {"/usr/bin/timeout", "10", "/usr/bin/prlimit", "--nofile=" + limit + ":" + limit, "--",
         STRAITD_PATH, "--config", config_});
    EXPECT_EQ(run.err.find("terminate called"), std::string::npos) << n << ":\n" << run.err;
    if (run.code == 124) continue;  // it started with this many: nothing to check
    if (run.err.find("Sanitizer") != std::string::npos) continue;
    ++refused;
    EXPECT_EQ(run.code, 1) << n << " descriptors:\n" << run.err;
    EXPECT_EQ(run.err.find("terminate called"), std::string::npos) << run.err;
    EXPECT_NE(run.err.find("Too many open files"), std::string::npos) << n << ":\n" << run.err;
    EXPECT_NE(run.err.find("raise the process's open-file limit"), std::string::npos)
        << n << ":\n" << run.err;
    // The TLS files are fine: no setting is blamed for the limit.
    EXPECT_EQ(run.err.find("; fix: point tls."), std::string::npos) << n << ":\n" << run.err;
  }
  EXPECT_GE(refused, kSanitizer ? 0 : 5);
}

}  // namespace
}  // namespace strait::gateway

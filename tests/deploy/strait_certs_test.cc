// deploy/certs/strait-certs.sh end to end: the script makes a cluster CA and the certificates of
// two regions; two real straitd processes (TLS, loopback) configured with exactly those files
// run an all-reduce for a client in each region; a gateway whose certificate comes from another
// CA (made by the same script) is refused, and the all-reduce fails instead of running with it.
// Also the script's contract: re-running keeps the CA and valid certificates byte for byte,
// --force replaces the CA, bad regions and a missing CA are errors.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "localproto/client.h"
#include "tests/common/free_ports.h"
#include "tests/common/straitd_process.h"

namespace strait::gateway {

// The local protocol and its client (strait::localproto), which these tests drive.
using namespace strait::localproto;  // NOLINT(build/namespaces)
namespace {

namespace fs = std::filesystem;

constexpr size_t kCount = 4096;

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

using strait::test::SpawnOptions;

// Output of a command: stdout and stderr appended to `log`.
SpawnOptions LogTo(const std::string& log) {
  SpawnOptions o;
  o.stdout_path = log;
  o.stderr_path = log;
  return o;
}

using strait::test::FreePorts;
using strait::test::KillProcesses;
using strait::test::RunProcess;
using strait::test::SpawnProcess;
using strait::test::StopProcesses;

std::vector<float> Input(int r) {
  std::vector<float> v(kCount);
  for (size_t i = 0; i < kCount; ++i) v[i] = static_cast<float>((i % 97) * (r + 1)) - 3.0f * r;
  return v;
}

class StraitCerts : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/strait-certs-test-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    log_ = dir_ + "/script.log";
  }
  void TearDown() override {
    KillProcesses(&pids_);
    if (HasFailure()) {
      std::cerr << "script log:\n" << ReadFile(log_);
      for (const auto& l : daemon_logs_) std::cerr << l << ":\n" << ReadFile(l);
    }
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }

  int Script(std::vector<std::string> args) {
    args.insert(args.begin(), {"bash", STRAIT_CERTS_SCRIPT});
    return RunProcess(args, LogTo(log_));
  }

  // Writes the config of region `region` (TLS with `stem`.pem/.key from `pki`, trusting
  // `ca_dir`/ca.pem) and starts straitd with it, after --check-config accepted it.
  void StartGateway(const std::string& region, const std::string& pki, const std::string& stem,
                    const std::string& ca_dir, uint16_t port, const std::string& peer,
                    uint16_t peer_port) {
    std::string c = "region = \"" + region + "\"\nshard_index = 0\n";
    c += "[local]\nsocket = \"" + Socket(region) + "\"\nallowed_uids = [" +
         std::to_string(::getuid()) + "]\n";
    c += "[wan]\nlisten = \"127.0.0.1:" + std::to_string(port) + "\"\ntransport = \"tls\"\n";
    c += "[tls]\nca = \"" + ca_dir + "/ca.pem\"\ncert = \"" + pki + "/" + stem +
         ".pem\"\nkey = \"" + pki + "/" + stem + ".key\"\n";
    c += "[peers." + peer + "]\nshard_0 = \"127.0.0.1:" + std::to_string(peer_port) + "\"\n";
    c += "[link]\nstreams = 2\nadapt_streams = false\nunreachable_after = \"3s\"\n"
         "handshake_timeout = \"2s\"\n";
    c += "[allreduce]\ndeadline = \"20s\"\nshutdown_grace = \"2s\"\n";
    const std::string file = dir_ + "/" + region + ".toml";
    std::ofstream(file) << c;
    const std::string log = dir_ + "/" + region + ".log";
    daemon_logs_.push_back(log);
    ASSERT_EQ(RunProcess({STRAITD_PATH, "--check-config", file}, LogTo(log)), 0) << ReadFile(log);
    pids_.push_back(SpawnProcess({STRAITD_PATH, "--config", file}, LogTo(log)));
  }

  std::string Socket(const std::string& region) const { return dir_ + "/" + region + ".sock"; }

  // One client per region all-reduces Input(r) (job "j", lossless) through its gateway.
  std::vector<Status> AllReduce(const std::vector<std::string>& regions, int64_t seconds,
                                std::vector<std::vector<float>>* out) {
    std::vector<Status> status(regions.size());
    out->assign(regions.size(), {});
    std::vector<std::thread> threads;
    for (size_t r = 0; r < regions.size(); ++r) {
      threads.emplace_back([&, r] {
        auto client = Client::Connect(Socket(regions[r]), Deadline::AfterSeconds(20), regions[r]);
        if (!client.ok()) {
          status[r] = client.status();
          return;
        }
        auto job = (*client)->RegisterJob("j", "zstd", Deadline::AfterSeconds(5));
        if (!job.ok()) {
          status[r] = job.status();
          return;
        }
        std::vector<float> data = Input(static_cast<int>(r));
        status[r] = (*client)->AllReduce("j", "grad", DataType::kFloat32, ReduceOp::kSum,
                                         data.data(), kCount, Deadline::AfterSeconds(seconds));
        if (status[r].ok()) (*out)[r] = std::move(data);
      });
    }
    for (auto& t : threads) t.join();
    return status;
  }

  std::string dir_, log_;
  std::vector<std::string> daemon_logs_;
  std::vector<pid_t> pids_;
};

TEST_F(StraitCerts, ScriptIsIdempotentAndKeepsTheCaUnlessForced) {
  const std::string pki = dir_ + "/pki";
  ASSERT_EQ(Script({"ca", "--dir", pki}), 0);
  ASSERT_EQ(Script({"gateway", "--dir", pki, "--region", "us-east"}), 0);
  const std::string ca = ReadFile(pki + "/ca.pem"), ca_key = ReadFile(pki + "/ca.key");
  const std::string cert = ReadFile(pki + "/us-east.pem");
  ASSERT_NE(ca.find("BEGIN CERTIFICATE"), std::string::npos);
  struct stat st {};
  ASSERT_EQ(::stat((pki + "/ca.key").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u) << "the CA key must not be readable by others";
  ASSERT_EQ(::stat((pki + "/us-east.key").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);

  // Again: nothing changes.
  ASSERT_EQ(Script({"ca", "--dir", pki}), 0);
  ASSERT_EQ(Script({"gateway", "--dir", pki, "--region", "us-east"}), 0);
  EXPECT_EQ(ReadFile(pki + "/ca.pem"), ca);
  EXPECT_EQ(ReadFile(pki + "/ca.key"), ca_key);
  EXPECT_EQ(ReadFile(pki + "/us-east.pem"), cert);

  // Errors: an invalid region, a gateway without a CA, an unknown option.
  EXPECT_EQ(Script({"gateway", "--dir", pki, "--region", "US_East!"}), 2);
  EXPECT_EQ(Script({"gateway", "--dir", dir_ + "/empty", "--region", "us-east"}), 2);
  EXPECT_EQ(Script({"ca", "--dir", pki, "--bogus"}), 2);
  EXPECT_FALSE(fs::exists(pki + "/US_East!.pem"));

  // --force replaces the CA; the old certificate then no longer chains and is reissued.
  ASSERT_EQ(Script({"ca", "--dir", pki, "--force"}), 0);
  EXPECT_NE(ReadFile(pki + "/ca.pem"), ca);
  ASSERT_EQ(Script({"gateway", "--dir", pki, "--region", "us-east"}), 0);
  EXPECT_NE(ReadFile(pki + "/us-east.pem"), cert);
  const std::string log = ReadFile(log_);
  EXPECT_NE(log.find("CA exists, kept"), std::string::npos) << log;
  EXPECT_NE(log.find("does not chain"), std::string::npos) << log;
}

TEST_F(StraitCerts, GatewaysWithScriptCertificatesAllReduceAndRefuseAnotherCa) {
  const std::string pki = dir_ + "/pki", other = dir_ + "/other-pki";
  ASSERT_EQ(Script({"ca", "--dir", pki}), 0);
  ASSERT_EQ(Script({"gateway", "--dir", pki, "--region", "us-east"}), 0);
  ASSERT_EQ(Script({"gateway", "--dir", pki, "--region", "eu-west", "--san", "IP:127.0.0.1"}), 0);
  ASSERT_EQ(Script({"ca", "--dir", other, "--name", "rogue-ca"}), 0);
  ASSERT_EQ(Script({"gateway", "--dir", other, "--region", "eu-west"}), 0);

  // 1. The cluster's own certificates: the all-reduce runs, exact and identical in both regions.
  std::vector<uint16_t> ports = FreePorts(2);
  StartGateway("us-east", pki, "us-east", pki, ports[0], "eu-west", ports[1]);
  StartGateway("eu-west", pki, "eu-west", pki, ports[1], "us-east", ports[0]);
  ASSERT_FALSE(HasFatalFailure());
  std::vector<std::vector<float>> out;
  std::vector<Status> status = AllReduce({"us-east", "eu-west"}, 20, &out);
  ASSERT_TRUE(status[0].ok()) << status[0];
  ASSERT_TRUE(status[1].ok()) << status[1];
  const std::vector<float> a = Input(0), b = Input(1);
  for (size_t i = 0; i < kCount; ++i) {
    ASSERT_EQ(out[0][i], a[i] + b[i]) << i;  // small integers: exact in any order
    ASSERT_EQ(out[1][i], out[0][i]) << i;
  }
  for (int code : StopProcesses(&pids_, 10)) {
    EXPECT_EQ(code, 0) << "straitd exit code (128 + N: signal N; -1: still running after 10 s)";
  }
  pids_.clear();

  // 2. eu-west's certificate from another CA (it still trusts the cluster CA, so only us-east's
  // check can stop it): us-east refuses it, and no all-reduce runs across the pair.
  ports = FreePorts(2);
  const std::string us_log = dir_ + "/us-east.log";
  std::ofstream(us_log, std::ios::trunc).close();
  StartGateway("us-east", pki, "us-east", pki, ports[0], "eu-west", ports[1]);
  StartGateway("eu-west", other, "eu-west", pki, ports[1], "us-east", ports[0]);
  ASSERT_FALSE(HasFatalFailure());
  status = AllReduce({"us-east", "eu-west"}, 6, &out);
  EXPECT_FALSE(status[0].ok()) << "us-east all-reduced with a gateway certified by another CA";
  EXPECT_FALSE(status[1].ok()) << "eu-west (another CA's certificate) completed an all-reduce";
  // The refusal is us-east's certificate check, logged as such (not a timeout for another reason).
  std::string log;
  for (int i = 0; i < 100; ++i) {
    log = ReadFile(us_log);
    if (log.find("certificate verify failed") != std::string::npos) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_NE(log.find("certificate verify failed"), std::string::npos) << log;
}

}  // namespace
}  // namespace strait::gateway

// deploy/certs/strait-certs.sh end to end: the script makes a cluster CA and the certificates of
// two regions; two real straitd processes (TLS, loopback) configured with exactly those files
// run an all-reduce for a client in each region; a gateway whose certificate comes from another
// CA (made by the same script) is refused, and the all-reduce fails instead of running with it.
// Also the script's contract: re-running keeps the CA and valid certificates byte for byte,
// --force replaces the CA, bad regions and a missing CA are errors; every error is one line on
// stderr and exit 2 (show of a missing file or a non-certificate, a directory that cannot be
// made), and a gateway certificate is never issued to outlive its CA.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
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

using strait::test::CapturedRun;
using strait::test::FreePorts;
using strait::test::KillProcesses;
using strait::test::RunCaptured;
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

  // The script with its stdout and stderr apart (errors and warnings must go to stderr).
  CapturedRun ScriptCaptured(std::vector<std::string> args) {
    args.insert(args.begin(), {"bash", STRAIT_CERTS_SCRIPT});
    return RunCaptured(args);
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

size_t Lines(const std::string& s) { return std::count(s.begin(), s.end(), '\n'); }

// show: a FILE that is missing, not a certificate (a key, garbage) or a directory is one error
// line each on stderr and exit 2; the good files among them are still shown.
TEST_F(StraitCerts, ShowReportsMissingAndNonCertificateFilesAndFails) {
  const std::string pki = dir_ + "/pki";
  ASSERT_EQ(Script({"ca", "--dir", pki}), 0);
  ASSERT_EQ(Script({"gateway", "--dir", pki, "--region", "us-east"}), 0);
  std::ofstream(dir_ + "/garbage.pem") << "not a certificate\n";

  CapturedRun r = ScriptCaptured({"show", "--dir", pki, pki + "/us-east.pem"});
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("regions: us-east"), std::string::npos) << r.out;
  EXPECT_EQ(r.err, "");

  r = ScriptCaptured({"show", "--dir", pki, dir_ + "/nonexist.pem"});
  EXPECT_EQ(r.code, 2);
  EXPECT_EQ(Lines(r.err), 1u) << r.err;
  EXPECT_NE(r.err.find("nonexist.pem: no such file"), std::string::npos) << r.err;
  EXPECT_EQ(r.out.find("not a PEM certificate"), std::string::npos) << r.out;

  // A bare name is a path, not looked up in --dir; the error says where the file is.
  r = ScriptCaptured({"show", "--dir", pki, "us-east.pem"});
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("did you mean " + pki + "/us-east.pem"), std::string::npos) << r.err;

  r = ScriptCaptured({"show", "--dir", pki, pki + "/us-east.key"});
  EXPECT_EQ(r.code, 2);
  EXPECT_EQ(Lines(r.err), 1u) << r.err;
  EXPECT_NE(r.err.find("not a PEM certificate (it holds a private key"), std::string::npos)
      << r.err;

  // Several files: each reported, the good one shown, and the run still fails.
  r = ScriptCaptured({"show", "--dir", pki, dir_ + "/garbage.pem", pki + "/us-east.pem",
                      dir_ + "/nonexist.pem", pki});
  EXPECT_EQ(r.code, 2);
  EXPECT_EQ(Lines(r.err), 3u) << r.err;
  EXPECT_NE(r.err.find("garbage.pem: not a PEM certificate"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("nonexist.pem: no such file"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find(pki + ": is a directory"), std::string::npos) << r.err;
  EXPECT_NE(r.out.find("regions: us-east"), std::string::npos) << r.out;

  // Every *.pem in DIR: one bad file fails the run after the others are shown.
  std::ofstream(pki + "/junk.pem") << "junk\n";
  r = ScriptCaptured({"show", "--dir", pki});
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("junk.pem: not a PEM certificate"), std::string::npos) << r.err;
  EXPECT_NE(r.out.find("regions: us-east"), std::string::npos) << r.out;
  r = ScriptCaptured({"show", "--dir", dir_ + "/no-such-dir"});
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("no such directory"), std::string::npos) << r.err;
}

// A --dir that cannot be made is the script's one error line (exit 2), not mkdir's own message.
// (A path under a regular file: refused even for root, unlike a permission.)
TEST_F(StraitCerts, AnUncreatableDirectoryIsOneErrorLine) {
  std::ofstream(dir_ + "/file") << "x\n";
  const std::string bad = dir_ + "/file/pki";
  const CapturedRun r = ScriptCaptured({"ca", "--dir", bad});
  EXPECT_EQ(r.code, 2);
  EXPECT_EQ(Lines(r.err), 1u) << r.err;
  EXPECT_NE(r.err.find("error: cannot create directory " + bad + ": Not a directory"),
            std::string::npos)
      << r.err;
  EXPECT_EQ(r.err.find("mkdir:"), std::string::npos) << r.err;
}

// A gateway certificate never ends after its CA: longer --days are cut to the CA's remaining
// whole days with one warning line on stderr; a CA with less than a day left is an error.
TEST_F(StraitCerts, GatewayValidityIsCappedToTheCa) {
  const std::string pki = dir_ + "/pki";
  ASSERT_EQ(Script({"ca", "--dir", pki, "--days", "10"}), 0);
  // Within the CA's validity: issued as asked, no warning.
  CapturedRun r = ScriptCaptured({"gateway", "--dir", pki, "--region", "eu-west", "--days", "5"});
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.err, "");
  EXPECT_NE(r.out.find("5 days"), std::string::npos) << r.out;

  r = ScriptCaptured({"gateway", "--dir", pki, "--region", "us-east", "--days", "365"});
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(Lines(r.err), 1u) << r.err;
  EXPECT_NE(r.err.find("warning: 365 days would outlive the CA"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("capped to 9 days, ending"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("renew the CA"), std::string::npos) << r.err;
  // The certificate ends within the CA's 10 days (openssl -checkend N: 0 while still valid
  // N seconds from now), after 8 of them.
  const std::string cert = pki + "/us-east.pem";
  EXPECT_NE(RunProcess({"openssl", "x509", "-in", cert, "-noout", "-checkend", "864000"},
                       LogTo(log_)),
            0);
  EXPECT_EQ(RunProcess({"openssl", "x509", "-in", cert, "-noout", "-checkend", "691200"},
                       LogTo(log_)),
            0);

  // Run again (a provisioning loop): the certificate ends with its CA, so a new one would last
  // no longer; it is kept, with a warning that only a renewed CA helps (it was reissued on
  // every run).
  const std::string before = ReadFile(cert);
  r = ScriptCaptured({"gateway", "--dir", pki, "--region", "us-east", "--days", "365"});
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("kept"), std::string::npos) << r.out;
  EXPECT_EQ(Lines(r.err), 1u) << r.err;
  EXPECT_NE(r.err.find("expires within 30 days and less than a day before its CA"),
            std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find("renew the CA"), std::string::npos) << r.err;
  EXPECT_EQ(ReadFile(cert), before) << "reissued although a new one could not last longer";
  // One issued shorter than the CA allows is still renewed to the CA's end.
  r = ScriptCaptured({"gateway", "--dir", pki, "--region", "eu-west"});
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("reissuing"), std::string::npos) << r.out;

  const std::string short_pki = dir_ + "/short-pki";
  ASSERT_EQ(Script({"ca", "--dir", short_pki, "--days", "1"}), 0);
  r = ScriptCaptured({"gateway", "--dir", short_pki, "--region", "us-east"});
  EXPECT_EQ(r.code, 2);
  EXPECT_EQ(Lines(r.err), 1u) << r.err;
  EXPECT_NE(r.err.find("expires within a day"), std::string::npos) << r.err;
  EXPECT_FALSE(fs::exists(short_pki + "/us-east.pem"));
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

  // 2. A gateway certified by another CA (a rogue one, trusting its own CA: straitd's config
  // check refuses a certificate that does not verify against the configured CA, see 3.):
  // us-east refuses it, and no all-reduce runs across the pair.
  ports = FreePorts(2);
  const std::string us_log = dir_ + "/us-east.log";
  std::ofstream(us_log, std::ios::trunc).close();
  StartGateway("us-east", pki, "us-east", pki, ports[0], "eu-west", ports[1]);
  StartGateway("eu-west", other, "eu-west", other, ports[1], "us-east", ports[0]);
  ASSERT_FALSE(HasFatalFailure());
  status = AllReduce({"us-east", "eu-west"}, 6, &out);
  EXPECT_FALSE(status[0].ok()) << "us-east all-reduced with a gateway certified by another CA";
  EXPECT_FALSE(status[1].ok()) << "eu-west (another CA's certificate) completed an all-reduce";
  // The refusal is a certificate check, logged as such by us-east (not a timeout for another
  // reason): us-east's own ("certificate verify failed"), or the rogue's refusal of us-east's
  // certificate, whichever handshake came first ("unknown ca").
  const auto refused = [](const std::string& text) {
    return text.find("certificate verify failed") != std::string::npos ||
           text.find("alert unknown ca") != std::string::npos;
  };
  std::string log;
  for (int i = 0; i < 100; ++i) {
    log = ReadFile(us_log);
    if (refused(log)) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_TRUE(refused(log)) << log;
  for (int code : StopProcesses(&pids_, 10)) EXPECT_EQ(code, 0);
  pids_.clear();

  // 3. A gateway whose own certificate is not from the CA it is configured to trust (a CA
  // replaced without reissuing): the check and the start refuse it, naming tls.cert, instead of
  // a gateway that says OK and that every peer refuses.
  const std::string file = dir_ + "/mixed.toml";
  std::ofstream(file) << "region = \"eu-west\"\nshard_index = 0\n[local]\nsocket = \""
                      << dir_ << "/mixed.sock\"\nallowed_uids = [" << ::getuid() << "]\n[wan]\nlisten = \"127.0.0.1:"
                      << FreePorts(1)[0] << "\"\n[tls]\nca = \"" << pki
                      << "/ca.pem\"\ncert = \"" << other << "/eu-west.pem\"\nkey = \"" << other
                      << "/eu-west.key\"\n[peers.us-east]\nshard_0 = \"127.0.0.1:1\"\n";
  const std::string mixed_log = dir_ + "/mixed.log";
  for (const char* mode : {"--check-config", "--config"}) {
    std::ofstream(mixed_log, std::ios::trunc).close();
    EXPECT_EQ(RunProcess({STRAITD_PATH, mode, file}, LogTo(mixed_log)), 2) << mode;
    const std::string said = ReadFile(mixed_log);
    EXPECT_NE(said.find("tls.cert: certificate '" + other + "/eu-west.pem' does not verify "
                        "against the cluster CA"),
              std::string::npos)
        << mode << ": " << said;
  }
}

}  // namespace
}  // namespace strait::gateway

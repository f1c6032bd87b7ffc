// Issue 17 (operator findings): `straitd --check-config` passed configs that then failed at
// start. It must catch a missing CA file, a certificate naming another region, a private key
// that is not the certificate's and a congestion control the kernel lacks -- each error naming
// the config key and the fix -- and warn about a private key others may read. Real straitd
// processes on configs with throwaway certificates (openssl).
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "tests/common/free_ports.h"
#include "tests/common/straitd_process.h"
#include "tests/net/test_certs.h"

namespace {

using strait::net::testing::CertFiles;
using strait::net::testing::TestPki;
using Result = strait::test::CapturedRun;

class StraitdCheckConfig : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/straitd-check-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    auto pki = TestPki::Create();
    ASSERT_TRUE(pki.ok()) << pki.status();
    pki_.emplace(std::move(pki).value());
    ASSERT_TRUE(pki_->MakeCa("cluster").ok());
    auto us = pki_->MakeGateway("cluster", "us", "us");
    auto eu = pki_->MakeGateway("cluster", "eu", "eu");
    ASSERT_TRUE(us.ok() && eu.ok());
    us_ = *us;
    eu_ = *eu;
    ASSERT_EQ(::chmod(us_.key.c_str(), 0600), 0);
    ASSERT_EQ(::chmod(eu_.key.c_str(), 0600), 0);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  // A config for region "us" with the given TLS files and extra [link] lines.
  std::string WriteConfig(const std::string& ca, const std::string& cert, const std::string& key,
                          const std::string& link = "") {
    const std::vector<uint16_t> ports = strait::test::FreePorts(2);
    std::string c = "region = \"us\"\nshard_index = 0\n";
    c += "[local]\nsocket = \"" + dir_ + "/s.sock\"\n";
    c += "allowed_uids = [" + std::to_string(::getuid()) + "]\n";
    c += "[wan]\nlisten = \"127.0.0.1:" + std::to_string(ports[0]) + "\"\n";
    c += "[tls]\nca = \"" + ca + "\"\ncert = \"" + cert + "\"\nkey = \"" + key + "\"\n";
    c += "[peers.eu]\nshard_0 = \"127.0.0.1:" + std::to_string(ports[1]) + "\"\n";
    if (!link.empty()) c += "[link]\n" + link + "\n";
    const std::string file = dir_ + "/straitd-" + std::to_string(++configs_) + ".toml";
    std::ofstream(file) << c;
    return file;
  }

  Result RunStraitd(const std::vector<std::string>& args) {
    std::vector<std::string> argv = {STRAITD_BINARY};
    argv.insert(argv.end(), args.begin(), args.end());
    return strait::test::RunCaptured(argv);
  }
  Result Check(const std::string& file) { return RunStraitd({"--check-config", file}); }

  static void ExpectNames(const Result& r, const std::vector<std::string>& fragments) {
    for (const std::string& f : fragments) {
      EXPECT_NE(r.err.find(f), std::string::npos) << "missing '" << f << "' in:\n" << r.err;
    }
  }

  std::string dir_;
  std::optional<TestPki> pki_;
  CertFiles us_, eu_;
  int configs_ = 0;
};

TEST_F(StraitdCheckConfig, AGoodConfigPassesWithoutWarnings) {
  const Result r = Check(WriteConfig(us_.ca, us_.cert, us_.key));
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("config OK"), std::string::npos) << r.out;
  EXPECT_EQ(r.err, "");
}

TEST_F(StraitdCheckConfig, MissingCaFileNamesTlsCa) {
  const Result r = Check(WriteConfig(dir_ + "/no-such-ca.pem", us_.cert, us_.key));
  EXPECT_EQ(r.code, 2);
  ExpectNames(r, {"config error:", "tls.ca:", "no-such-ca.pem", "fix:"});
}

TEST_F(StraitdCheckConfig, CertificateOfAnotherRegionNamesTlsCert) {
  const Result r = Check(WriteConfig(us_.ca, eu_.cert, eu_.key));
  EXPECT_EQ(r.code, 2);
  ExpectNames(r, {"config error:", "tls.cert:", "names region 'eu'", "fix:",
                  "strait-certs gateway --region us"});
}

TEST_F(StraitdCheckConfig, KeyOfAnotherCertificateNamesTlsKey) {
  const Result r = Check(WriteConfig(us_.ca, us_.cert, eu_.key));
  EXPECT_EQ(r.code, 2);
  ExpectNames(r, {"config error:", "tls.key:", "does not match certificate", "fix:"});
}

TEST_F(StraitdCheckConfig, UnknownCongestionControlNamesTheKey) {
  const Result r =
      Check(WriteConfig(us_.ca, us_.cert, us_.key, "congestion_control = \"nosuchcc\""));
  EXPECT_EQ(r.code, 2);
  ExpectNames(r, {"config error:", "link.congestion_control:", "nosuchcc",
                  "is not available in this kernel", "fix:"});
}

TEST_F(StraitdCheckConfig, AKeyOthersMayReadIsAWarningNotAnError) {
  ASSERT_EQ(::chmod(us_.key.c_str(), 0644), 0);
  Result r = Check(WriteConfig(us_.ca, us_.cert, us_.key));
  EXPECT_EQ(r.code, 0) << r.err;
  ExpectNames(r, {"config warning:", "tls.key:", "mode 0644", "chmod 600"});
  // Group read is the documented setup (0640 root:strait; Kubernetes' 0440): no warning.
  ASSERT_EQ(::chmod(us_.key.c_str(), 0640), 0);
  r = Check(WriteConfig(us_.ca, us_.cert, us_.key));
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.err, "");
}

// --syntax-only: the text alone, for CI and init containers that do not mount the TLS files.
TEST_F(StraitdCheckConfig, SyntaxOnlySkipsTheFiles) {
  const std::string file = WriteConfig(dir_ + "/no-such-ca.pem", us_.cert, us_.key);
  const Result r = RunStraitd({"--syntax-only", "--check-config", file});
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("config OK"), std::string::npos) << r.out;
  EXPECT_EQ(RunStraitd({"--syntax-only"}).code, 2);  // only with --check-config
}

// A certificate from another CA than tls.ca (a CA replaced without reissuing): every peer would
// refuse it at each handshake, so the check says so instead of "config OK".
TEST_F(StraitdCheckConfig, ACertificateTheCaDidNotSignNamesTlsCert) {
  ASSERT_TRUE(pki_->MakeCa("other").ok());
  auto foreign = pki_->MakeGateway("other", "us", "us-foreign");
  ASSERT_TRUE(foreign.ok()) << foreign.status();
  ASSERT_EQ(::chmod(foreign->key.c_str(), 0600), 0);
  const Result r = Check(WriteConfig(us_.ca, foreign->cert, foreign->key));
  EXPECT_EQ(r.code, 2) << r.out;
  ExpectNames(r, {"config error:", "tls.cert:", "does not verify against the cluster CA",
                  "every peer would refuse it", "fix:"});
}

// Flags after --check-config were read as file names ("cannot read config --syntax-only"), so
// the order of the words changed what was checked; log settings that stop a start passed.
TEST_F(StraitdCheckConfig, FlagsAfterCheckConfigAndBadLogSettingsAreRefused) {
  const std::string file = WriteConfig(us_.ca, us_.cert, us_.key);
  Result r = RunStraitd({"--check-config", "--syntax-only", file});
  EXPECT_EQ(r.code, 2);
  ExpectNames(r, {"'--syntax-only' is not a config file", "straitd --syntax-only --check-config"});
  r = RunStraitd({"--log-level", "loud", "--check-config", file});
  EXPECT_EQ(r.code, 2);
  ExpectNames(r, {"--log-level", "loud"});
  ::setenv("STRAIT_LOG_FORMAT", "xml", 1);
  r = RunStraitd({"--check-config", file});
  ::unsetenv("STRAIT_LOG_FORMAT");
  EXPECT_EQ(r.code, 2);
  ExpectNames(r, {"STRAIT_LOG_FORMAT", "xml"});
}

// A directory, a device or a huge file is not read as a config (/dev/zero grew without bound).
TEST_F(StraitdCheckConfig, OnlyARegularFileOfAConfigsSizeIsRead) {
  for (const std::string& path : {dir_, std::string("/dev/zero")}) {
    const Result r = Check(path);
    EXPECT_EQ(r.code, 2) << path;
    ExpectNames(r, {"not a regular file"});
  }
  const std::string big = dir_ + "/big.toml";
  std::ofstream(big) << std::string((size_t{1} << 20) + 1, '#');
  const Result r = Check(big);
  EXPECT_EQ(r.code, 2);
  ExpectNames(r, {"is 1048577 bytes, more than a config's limit"});
}

// A start runs the same checks: the same error, the same usage exit code, before anything binds.
TEST_F(StraitdCheckConfig, AStartFailsWithTheSameError) {
  const Result r = RunStraitd({"--config", WriteConfig(us_.ca, eu_.cert, eu_.key)});
  EXPECT_EQ(r.code, 2);
  ExpectNames(r, {"config error:", "tls.cert:", "fix:"});
  EXPECT_FALSE(std::filesystem::exists(dir_ + "/s.sock"));
}

// With --log-format json every line a running straitd writes is a JSON object: the ready line
// on stdout and a failed start's config error used to be plain text among the JSON log lines,
// which a collector parsing the container's output as JSON could not read.
TEST_F(StraitdCheckConfig, WithJsonLogsTheReadyLineAndAStartErrorAreJson) {
  // Every non-empty line of `text` parsed; a line that is not JSON fails the test.
  const auto lines_of = [](const std::string& text) {
    std::vector<nlohmann::json> objects;
    std::istringstream in(text);
    for (std::string line; std::getline(in, line);) {
      if (line.empty()) continue;
      nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
      EXPECT_TRUE(j.is_object()) << "not a JSON object: " << line;
      if (j.is_object()) objects.push_back(std::move(j));
    }
    return objects;
  };
  const Result failed = RunStraitd(
      {"--log-format", "json", "--config", WriteConfig(us_.ca, eu_.cert, eu_.key)});
  EXPECT_EQ(failed.code, 2);
  const std::vector<nlohmann::json> errors = lines_of(failed.err);
  ASSERT_EQ(errors.size(), 1u) << failed.err;
  EXPECT_EQ(errors[0].value("level", ""), "error");
  EXPECT_NE(errors[0].value("msg", "").find("tls.cert: certificate"), std::string::npos)
      << failed.err;

  const std::string out = dir_ + "/straitd.out", err = dir_ + "/straitd.err";
  std::vector<pid_t> pids = {strait::test::SpawnProcess(
      {STRAITD_BINARY, "--log-format", "json", "--config", WriteConfig(us_.ca, us_.cert, us_.key)},
      {.stdout_path = out, .stderr_path = err, .truncate = true})};
  const auto read = [](const std::string& path) {
    std::ostringstream text;
    text << std::ifstream(path).rdbuf();
    return text.str();
  };
  for (int i = 0; i < 200 && read(out).find("straitd ready") == std::string::npos; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_EQ(strait::test::StopProcesses(&pids, 10)[0], 0);
  const std::vector<nlohmann::json> ready = lines_of(read(out));
  ASSERT_EQ(ready.size(), 1u) << read(out);
  EXPECT_EQ(ready[0].value("level", ""), "info");
  EXPECT_EQ(ready[0].value("msg", "").rfind("straitd ready: ", 0), 0u) << read(out);
  EXPECT_FALSE(lines_of(read(err)).empty()) << "no log lines on stderr";
}

}  // namespace

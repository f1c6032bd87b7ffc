// straitd end to end: three daemons (regions) on 127.0.0.1, one client per region running an
// int8 and a zstd all-reduce through its local gateway; results checked against the reference
// and bit for bit across regions; a bad request answered with an error while the daemon keeps
// serving; SIGTERM ends every daemon with exit status 0. Runs over plain TCP and over TLS.
// Then policies: daemons whose [policy] sections differ agree on one policy per job (the merged,
// most conservative one) and `auto` runs end to end; [policy] sections with no lossless codec
// in common fail the job's all-reduce with one error naming both sides.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <functional>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "localproto/client.h"
#include "tests/net/test_certs.h"
#include "tests/common/free_ports.h"
#include "tests/common/straitd_process.h"

namespace strait::gateway {

// The local protocol and its client (strait::localproto), which these tests drive.
using namespace strait::localproto;  // NOLINT(build/namespaces)
namespace {

constexpr int kRegions = 3;
const char* const kNames[kRegions] = {"us", "eu", "ap"};
constexpr size_t kCount = 5000;

using strait::test::FreePorts;
using strait::test::KillProcesses;
using strait::test::RunProcess;
using strait::test::SpawnProcess;
using strait::test::StopProcesses;

class StraitdBase : public ::testing::Test {
 protected:
  // Writes one config per region (`policy[r]`: the lines of its [policy] section) and starts
  // the daemons.
  void StartDaemons(bool tls, const std::vector<std::string>& policy) {
    char tmpl[] = "/tmp/straitd-test-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    if (tls) {
      auto pki = net::testing::TestPki::Create();
      ASSERT_TRUE(pki.ok()) << pki.status();
      pki_.emplace(std::move(pki).value());
      ASSERT_TRUE(pki_->MakeCa("cluster-ca").ok());
    }
    const std::vector<uint16_t> ports = FreePorts(kRegions);
    for (int r = 0; r < kRegions; ++r) {
      std::string c = "region = \"" + std::string(kNames[r]) + "\"\nshard_index = 0\n";
      c += "[local]\nsocket = \"" + Socket(r) + "\"\nallowed_uids = [" +
           std::to_string(::getuid()) + "]\n";
      c += "[wan]\nlisten = \"127.0.0.1:" + std::to_string(ports[r]) + "\"\n";
      if (tls) {
        auto files = pki_->MakeGateway("cluster-ca", kNames[r], kNames[r]);
        ASSERT_TRUE(files.ok()) << files.status();
        c += "[tls]\nca = \"" + files->ca + "\"\ncert = \"" + files->cert + "\"\nkey = \"" +
             files->key + "\"\n";
      } else {
        c += "transport = \"plain\"\n";
      }
      for (int p = 0; p < kRegions; ++p) {
        if (p == r) continue;
        c += "[peers." + std::string(kNames[p]) + "]\nshard_0 = \"127.0.0.1:" +
             std::to_string(ports[p]) + "\"\n";
      }
      c += "[link]\nstreams = 2\nadapt_streams = false\nunreachable_after = \"10s\"\n";
      c += "[policy]\n" + policy[static_cast<size_t>(r)];
      c += "[allreduce]\ndeadline = \"30s\"\nshutdown_grace = \"5s\"\n";
      const std::string file = dir_ + "/" + kNames[r] + ".toml";
      std::ofstream(file) << c;
      files_.push_back(file);
    }
    for (int r = 0; r < kRegions; ++r) {
      // --check-config first: the file the test wrote must pass.
      ASSERT_EQ(RunProcess({STRAITD_PATH, "--check-config", files_[static_cast<size_t>(r)]}), 0);
    }
    for (int r = 0; r < kRegions; ++r) {
      pids_.push_back(SpawnProcess({STRAITD_PATH, "--config", files_[static_cast<size_t>(r)]}));
    }
  }

  void TearDown() override {
    KillProcesses(&pids_);
    for (const auto& f : files_) ::unlink(f.c_str());
    pki_.reset();
    ::rmdir(dir_.c_str());
  }

  std::string Socket(int r) const { return dir_ + "/" + kNames[r] + ".sock"; }

  // SIGTERM every daemon; each must exit 0 in time.
  void StopAll() {
    for (int code : StopProcesses(&pids_, 10)) {
      EXPECT_EQ(code, 0) << "straitd exit code (128 + N: signal N; -1: still running after 10 s)";
    }
  }

  std::string dir_;
  std::optional<net::testing::TestPki> pki_;
  std::vector<std::string> files_;
  std::vector<pid_t> pids_;
};

class Straitd : public StraitdBase, public ::testing::WithParamInterface<bool> {
 protected:
  void SetUp() override {
    StartDaemons(GetParam(), std::vector<std::string>(kRegions, "min_lossy_bytes = \"4KiB\"\n"));
  }
};

std::vector<float> Input(int r) {
  std::vector<float> v(kCount);
  for (size_t i = 0; i < kCount; ++i) {
    v[i] = std::sin(0.001f * static_cast<float>(i * (r + 1))) * static_cast<float>(r + 1) +
           0.01f * static_cast<float>(r);
  }
  return v;
}

TEST_P(Straitd, ThreeRegionsAllReduceThroughTheirGateways) {
  std::vector<std::vector<float>> int8(kRegions), zstd(kRegions);
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
      auto q = (*client)->RegisterJob("jq", "int8", Deadline::AfterSeconds(5));
      auto z = (*client)->RegisterJob("jz", "zstd:3", Deadline::AfterSeconds(5));
      if (!q.ok() || !z.ok()) {
        status[i] = q.ok() ? z.status() : q.status();
        return;
      }
      int8[i] = Input(r);
      status[i] = (*client)->AllReduce("jq", "grad", DataType::kFloat32, ReduceOp::kSum,
                                       int8[i].data(), kCount, Deadline::AfterSeconds(30));
      if (!status[i].ok()) return;
      zstd[i] = Input(r);
      status[i] = (*client)->AllReduce("jz", "grad", DataType::kFloat32, ReduceOp::kSum,
                                       zstd[i].data(), kCount, Deadline::AfterSeconds(30));
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < kRegions; ++r) ASSERT_TRUE(status[r].ok()) << kNames[r] << ": " << status[r];

  size_t lossy_differs = 0;
  const auto a = Input(0), b = Input(1), c = Input(2);
  for (size_t i = 0; i < kCount; ++i) {
    // The mesh sums in fixed rank order (regions sorted: ap, eu, us) in fp32.
    const float want = (c[i] + b[i]) + a[i];
    ASSERT_EQ(zstd[0][i], want) << i;
    // int8: each of the 3 inputs and the result is within half a step of its block (absmax of
    // the inputs <= 3.02 and of the sum <= 6.1 here, 127 steps each side).
    ASSERT_NEAR(int8[0][i], want, 3 * 0.5 * 3.02 / 127 + 0.5 * 6.1 / 127 + 1e-4) << i;
    lossy_differs += int8[0][i] != want;
  }
  EXPECT_GT(lossy_differs, kCount / 2) << "the int8 run looks lossless: was int8 used?";
  for (int r = 1; r < kRegions; ++r) {
    EXPECT_EQ(std::memcmp(int8[r].data(), int8[0].data(), kCount * 4), 0) << kNames[r];
    EXPECT_EQ(std::memcmp(zstd[r].data(), zstd[0].data(), kCount * 4), 0) << kNames[r];
  }

  // A bad request gets an error, and the daemon keeps serving.
  auto client = Client::Connect(Socket(0), Deadline::AfterSeconds(5));
  ASSERT_TRUE(client.ok()) << client.status();
  float x[2] = {1, 2};
  Status bad = (*client)->AllReduce("unknown-job", "grad", DataType::kFloat32, ReduceOp::kSum,
                                    x, 2, Deadline::AfterSeconds(5));
  EXPECT_EQ(bad.code(), StatusCode::kFailedPrecondition) << bad;
  auto garbage = (*client)->SendRawForTest({3, 0, 0, 0, 3, 0xff, 0xff}, Deadline::AfterSeconds(5));
  ASSERT_TRUE(garbage.ok()) << garbage.status();
  EXPECT_NE(garbage->code, StatusCode::kOk);
  auto stats = (*client)->Stats(Deadline::AfterSeconds(5));
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_NE(stats->find("allreduce_ok 2\n"), std::string::npos) << *stats;
  EXPECT_NE(stats->find("bad_requests 2\n"), std::string::npos) << *stats;

  StopAll();
}

// Each region's client registers `requests[r]` as `job` and all-reduces Input(r) through its
// gateway; returns the results (empty where a call failed) and the statuses.
std::vector<Status> RunJob(const std::function<std::string(int)>& socket, const std::string& job,
                           const std::vector<std::string>& requests,
                           std::vector<std::vector<float>>* out) {
  std::vector<Status> status(kRegions);
  out->assign(kRegions, {});
  std::vector<std::thread> threads;
  for (int r = 0; r < kRegions; ++r) {
    threads.emplace_back([&, r] {
      const size_t i = static_cast<size_t>(r);
      auto client = Client::Connect(socket(r), Deadline::AfterSeconds(20), kNames[r]);
      if (!client.ok()) {
        status[i] = client.status();
        return;
      }
      auto registered = (*client)->RegisterJob(job, requests[i], Deadline::AfterSeconds(5));
      if (!registered.ok()) {
        status[i] = registered.status();
        return;
      }
      std::vector<float> data = Input(r);
      status[i] = (*client)->AllReduce(job, "grad", DataType::kFloat32, ReduceOp::kSum, data.data(),
                                       kCount, Deadline::AfterSeconds(30));
      if (status[i].ok()) (*out)[i] = std::move(data);
    });
  }
  for (auto& t : threads) t.join();
  return status;
}

// The exact sum in the mesh's fixed rank order (regions sorted: ap, eu, us) in fp32.
float Exact(size_t i) {
  static const std::vector<float> a = Input(0), b = Input(1), c = Input(2);
  return (c[i] + b[i]) + a[i];
}

// The int8 bound of the first test: 3 quantized inputs and a quantized result.
constexpr double kInt8Bound = 3 * 0.5 * 3.02 / 127 + 0.5 * 6.1 / 127 + 1e-4;

class StraitdPolicy : public StraitdBase {};

TEST_F(StraitdPolicy, RegionsWithDifferentPoliciesAgreeOnTheMergedOne) {
  // us takes the defaults (every codec, max error 0.1, default "auto"); eu allows no lossy codec
  // but int8 and a smaller error; ap defaults jobs to "auto:int8".
  StartDaemons(false, {"min_lossy_bytes = \"4KiB\"\n",
                       "min_lossy_bytes = \"16KiB\"\nmax_relative_error = 0.01\n"
                       "allowed_codecs = [\"none\", \"zstd\", \"int8\"]\n",
                       "min_lossy_bytes = \"4KiB\"\ncodec = \"auto:int8\"\n"});
  ASSERT_FALSE(HasFatalFailure());
  auto socket = [this](int r) { return Socket(r); };
  std::vector<std::vector<float>> out;

  // fp8 everywhere: eu clamps it to zstd, so the job runs lossless in every region (without
  // the agreement us and ap would send fp8 frames that eu refuses).
  auto status = RunJob(socket, "fp8-job", {"fp8", "fp8", "fp8"}, &out);
  for (int r = 0; r < kRegions; ++r) ASSERT_TRUE(status[r].ok()) << kNames[r] << ": " << status[r];
  for (size_t i = 0; i < kCount; ++i) ASSERT_EQ(out[0][i], Exact(i)) << i;
  for (int r = 1; r < kRegions; ++r) {
    EXPECT_EQ(std::memcmp(out[r].data(), out[0].data(), kCount * 4), 0) << kNames[r];
  }

  // int8 in us and eu, fp8 in ap: the most accurate lossy codec every region allows, int8 (fp8's
  // error, up to 1/16 of a block's absmax, would break the int8 bound).
  status = RunJob(socket, "mixed-job", {"int8", "int8", "fp8"}, &out);
  for (int r = 0; r < kRegions; ++r) ASSERT_TRUE(status[r].ok()) << kNames[r] << ": " << status[r];
  size_t inexact = 0;
  for (size_t i = 0; i < kCount; ++i) {
    ASSERT_NEAR(out[0][i], Exact(i), kInt8Bound) << i;
    inexact += out[0][i] != Exact(i);
  }
  EXPECT_GT(inexact, kCount / 2) << "the run looks lossless: was int8 used?";
  for (int r = 1; r < kRegions; ++r) {
    EXPECT_EQ(std::memcmp(out[r].data(), out[0].data(), kCount * 4), 0) << kNames[r];
  }

  // The gateways' defaults: auto in us and eu, auto:int8 in ap -> auto, lossless per link.
  status = RunJob(socket, "default-job", {"", "", ""}, &out);
  for (int r = 0; r < kRegions; ++r) ASSERT_TRUE(status[r].ok()) << kNames[r] << ": " << status[r];
  for (size_t i = 0; i < kCount; ++i) ASSERT_EQ(out[0][i], Exact(i)) << i;
  for (int r = 1; r < kRegions; ++r) {
    EXPECT_EQ(std::memcmp(out[r].data(), out[0].data(), kCount * 4), 0) << kNames[r];
  }

  // auto:int8 everywhere: per link, int8 or lossless as the loopback's estimates say; either way
  // within the int8 bound and bit-identical.
  status = RunJob(socket, "auto-job", {"auto:int8", "auto:int8", "auto:int8"}, &out);
  for (int r = 0; r < kRegions; ++r) ASSERT_TRUE(status[r].ok()) << kNames[r] << ": " << status[r];
  for (size_t i = 0; i < kCount; ++i) ASSERT_NEAR(out[0][i], Exact(i), kInt8Bound) << i;
  for (int r = 1; r < kRegions; ++r) {
    EXPECT_EQ(std::memcmp(out[r].data(), out[0].data(), kCount * 4), 0) << kNames[r];
  }

  auto client = Client::Connect(Socket(0), Deadline::AfterSeconds(5));
  ASSERT_TRUE(client.ok()) << client.status();
  auto stats = (*client)->Stats(Deadline::AfterSeconds(5));
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_NE(stats->find("allreduce_ok 4\n"), std::string::npos) << *stats;
  StopAll();
}

TEST_F(StraitdPolicy, NoCommonLosslessCodecIsOneClearError) {
  StartDaemons(false, {"allowed_codecs = [\"none\", \"int8\"]\n",
                       "allowed_codecs = [\"zstd\", \"int8\"]\n", ""});
  ASSERT_FALSE(HasFatalFailure());
  std::vector<std::vector<float>> out;
  auto status = RunJob([this](int r) { return Socket(r); }, "job", {"int8", "int8", "int8"}, &out);
  for (int r = 0; r < kRegions; ++r) {
    EXPECT_EQ(status[r].code(), StatusCode::kFailedPrecondition) << kNames[r] << ": " << status[r];
    EXPECT_NE(status[r].message().find("the regions share no lossless codec: eu allows [zstd, "
                                       "int8], us allows [none, int8]"),
              std::string::npos)
        << status[r];
  }
  StopAll();
}

INSTANTIATE_TEST_SUITE_P(Transport, Straitd, ::testing::Values(false, true),
                         [](const ::testing::TestParamInfo<bool>& param_info) {
                           return std::string(param_info.param ? "Tls" : "Plain");
                         });

}  // namespace
}  // namespace strait::gateway

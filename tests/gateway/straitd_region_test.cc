// Region all-reduce end to end: two regions ("us", "eu") of two straitd processes each on
// 127.0.0.1, every gateway with the same [peers] section (its own region's table included), and
// one client per gateway (a node head) running kRegionAllReduce: a lossless fp32 sum equal to
// the documented order (regional sums in shard order, then the regions in rank order), an int8
// sum within its step, an int32 max exact, every result bit-identical on all four nodes; a node
// that asks for a different count makes every node fail, its region with a clear error; SIGTERM
// ends every daemon with exit status 0. Plain TCP, TLS (where same-region gateways
// authenticate each other with certificates naming their own region), and TLS between regions
// with plain region links ([region_links] transport = "plain" on ports of their own).
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
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

constexpr int kRegions = 2;
constexpr int kGateways = 2;  // per region
constexpr int kNodes = kRegions * kGateways;
const char* const kRegionNames[kRegions] = {"us", "eu"};
constexpr size_t kCount = 5001;  // odd: the region's shards are 2501 and 2500 elements

int RegionOf(int node) {
  return node / kGateways;
}
int ShardOf(int node) {
  return node % kGateways;
}
std::string NodeName(int node) {
  return std::string(kRegionNames[RegionOf(node)]) + std::to_string(ShardOf(node));
}

using strait::test::FreePorts;
using strait::test::KillProcesses;
using strait::test::RunProcess;
using strait::test::SpawnProcess;
using strait::test::StopProcesses;

enum class Mode { kPlain, kTls, kTlsPlainRegionLinks };

class StraitdRegion : public ::testing::TestWithParam<Mode> {
 protected:
  void SetUp() override {
    const bool tls = GetParam() != Mode::kPlain;
    const bool plain_region = GetParam() == Mode::kTlsPlainRegionLinks;
    char tmpl[] = "/tmp/straitd-region-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    if (tls) {
      auto pki = net::testing::TestPki::Create();
      ASSERT_TRUE(pki.ok()) << pki.status();
      pki_.emplace(std::move(pki).value());
      ASSERT_TRUE(pki_->MakeCa("cluster-ca").ok());
    }
    // WAN ports, then (plain region links) each gateway's in-region port.
    const std::vector<uint16_t> ports = FreePorts(2 * kNodes);
    // The cluster's [peers]: every gateway of every region by shard index; with plain region
    // links, a region's own table names its gateways' region_links.listen ports.
    auto peers_of = [&](int region) {
      std::string peers;
      for (int r = 0; r < kRegions; ++r) {
        peers += "[peers." + std::string(kRegionNames[r]) + "]\n";
        const size_t base = plain_region && r == region ? kNodes : 0;
        for (int i = 0; i < kGateways; ++i) {
          peers += "shard_" + std::to_string(i) + " = \"127.0.0.1:" +
                   std::to_string(ports[base + size_t(r * kGateways + i)]) + "\"\n";
        }
      }
      return peers;
    };
    for (int node = 0; node < kNodes; ++node) {
      std::string c = "region = \"" + std::string(kRegionNames[RegionOf(node)]) +
                      "\"\nshard_index = " + std::to_string(ShardOf(node)) + "\n";
      c += "[local]\nsocket = \"" + Socket(node) + "\"\nallowed_uids = [" +
           std::to_string(::getuid()) + "]\n";
      c += "[wan]\nlisten = \"127.0.0.1:" + std::to_string(ports[size_t(node)]) + "\"\n";
      if (tls) {
        auto files = pki_->MakeGateway("cluster-ca", kRegionNames[RegionOf(node)], NodeName(node));
        ASSERT_TRUE(files.ok()) << files.status();
        c += "[tls]\nca = \"" + files->ca + "\"\ncert = \"" + files->cert + "\"\nkey = \"" +
             files->key + "\"\n";
      } else {
        c += "transport = \"plain\"\n";
      }
      c += peers_of(RegionOf(node));
      if (plain_region) {
        c += "[region_links]\ntransport = \"plain\"\nlisten = \"127.0.0.1:" +
             std::to_string(ports[size_t(kNodes + node)]) + "\"\n";
      }
      c += "[link]\nstreams = 2\nadapt_streams = false\nunreachable_after = \"10s\"\n";
      c += "[policy]\nmin_lossy_bytes = \"4KiB\"\n";
      c += "[allreduce]\ndeadline = \"30s\"\nshutdown_grace = \"5s\"\n";
      const std::string file = dir_ + "/" + NodeName(node) + ".toml";
      std::ofstream(file) << c;
      files_.push_back(file);
    }
    for (const std::string& file : files_) {
      // --check-config first: the file the test wrote must pass.
      ASSERT_EQ(RunProcess({STRAITD_PATH, "--check-config", file}), 0) << file;
    }
    for (const std::string& file : files_) {
      pids_.push_back(SpawnProcess({STRAITD_PATH, "--config", file}));
    }
  }

  void TearDown() override {
    KillProcesses(&pids_);
    for (const auto& f : files_) ::unlink(f.c_str());
    pki_.reset();
    ::rmdir(dir_.c_str());
  }

  std::string Socket(int node) const { return dir_ + "/" + NodeName(node) + ".sock"; }

  // SIGTERM every daemon; each must exit 0 in time.
  void StopAll() {
    for (int code : StopProcesses(&pids_, 10)) {
      EXPECT_EQ(code, 0) << "straitd exit code (128 + N: signal N; -1: still running after 10 s)";
    }
  }

  // Runs `body(node, client)` for every node at once, each with its own connected client.
  std::vector<Status> OnEveryNode(const std::function<Status(int, Client&)>& body) {
    std::vector<Status> status(kNodes);
    std::vector<std::thread> threads;
    for (int node = 0; node < kNodes; ++node) {
      threads.emplace_back([&, node] {
        auto client = Client::Connect(Socket(node), Deadline::AfterSeconds(20), NodeName(node));
        if (!client.ok()) {
          status[size_t(node)] = client.status();
          return;
        }
        status[size_t(node)] = body(node, **client);
      });
    }
    for (auto& t : threads) t.join();
    return status;
  }

  std::string dir_;
  std::optional<net::testing::TestPki> pki_;
  std::vector<std::string> files_;
  std::vector<pid_t> pids_;
};

std::vector<float> Input(int node) {
  std::vector<float> v(kCount);
  for (size_t i = 0; i < kCount; ++i) {
    v[i] =
        std::sin(0.001f * static_cast<float>(i * size_t(node + 1))) * static_cast<float>(node + 1) +
        0.01f * static_cast<float>(node);
  }
  return v;
}

std::vector<int32_t> IntInput(int node) {
  std::vector<int32_t> v(kCount);
  for (size_t i = 0; i < kCount; ++i) {
    v[i] = static_cast<int32_t>((i * 7919u + size_t(node) * 104729u) % 20011u) - 10000;
  }
  return v;
}

void ExpectSameOnEveryNode(const std::vector<std::vector<uint8_t>>& bytes, const char* what) {
  for (int node = 1; node < kNodes; ++node) {
    EXPECT_TRUE(bytes[size_t(node)] == bytes[0]) << what << ": " << NodeName(node) << " differs";
  }
}

template <typename T>
std::vector<uint8_t> AsBytes(const std::vector<T>& v) {
  std::vector<uint8_t> b(v.size() * sizeof(T));
  std::memcpy(b.data(), v.data(), b.size());
  return b;
}

TEST_P(StraitdRegion, FourNodeHeadsInTwoRegionsGetTheSameResult) {
  std::vector<std::vector<float>> zstd(kNodes), int8(kNodes);
  std::vector<std::vector<int32_t>> imax(kNodes);
  std::vector<Status> status = OnEveryNode([&](int node, Client& client) {
    const size_t n = size_t(node);
    auto z = client.RegisterJob("jz", "zstd:3", Deadline::AfterSeconds(10));
    if (!z.ok()) return z.status();
    auto q = client.RegisterJob("jq", "int8", Deadline::AfterSeconds(10));
    if (!q.ok()) return q.status();
    zstd[n] = Input(node);
    Status s = client.RegionAllReduce("jz", "grad", DataType::kFloat32, ReduceOp::kSum,
                                      zstd[n].data(), kCount, Deadline::AfterSeconds(30));
    if (!s.ok()) return s;
    int8[n] = Input(node);
    s = client.RegionAllReduce("jq", "grad", DataType::kFloat32, ReduceOp::kSum, int8[n].data(),
                               kCount, Deadline::AfterSeconds(30));
    if (!s.ok()) return s;
    imax[n] = IntInput(node);
    return client.RegionAllReduce("jz", "counts", DataType::kInt32, ReduceOp::kMax, imax[n].data(),
                                  kCount, Deadline::AfterSeconds(30));
  });
  for (int node = 0; node < kNodes; ++node) {
    ASSERT_TRUE(status[size_t(node)].ok()) << NodeName(node) << ": " << status[size_t(node)];
  }

  std::vector<std::vector<float>> in(kNodes);
  for (int node = 0; node < kNodes; ++node) in[size_t(node)] = Input(node);
  // Regions in rank order (sorted: eu = nodes 2, 3; us = nodes 0, 1), each region's sum in
  // shard order, all in fp32.
  size_t lossy_differs = 0;
  double absmax_eu = 0, absmax_us = 0;
  for (size_t i = 0; i < kCount; ++i) {
    absmax_eu = std::max(absmax_eu, std::fabs(double(in[2][i] + in[3][i])));
    absmax_us = std::max(absmax_us, std::fabs(double(in[0][i] + in[1][i])));
  }
  const double e = 0.5 / 127;  // int8: half a step of a block's absmax
  const double bound = e * (absmax_eu + absmax_us) * (1 + (1 + e) * (1 + e)) + 1e-4;
  for (size_t i = 0; i < kCount; ++i) {
    const float eu = in[2][i] + in[3][i];
    const float us = in[0][i] + in[1][i];
    const float want = eu + us;
    ASSERT_EQ(zstd[0][i], want) << i;
    ASSERT_NEAR(int8[0][i], want, bound) << i;
    lossy_differs += int8[0][i] != want;
    int32_t m = IntInput(0)[i];
    for (int node = 1; node < kNodes; ++node) m = std::max(m, IntInput(node)[i]);
    ASSERT_EQ(imax[0][i], m) << i;
  }
  EXPECT_GT(lossy_differs, kCount / 2) << "the int8 run looks lossless: was int8 used?";
  std::vector<std::vector<uint8_t>> zb, qb, mb;
  for (int node = 0; node < kNodes; ++node) {
    zb.push_back(AsBytes(zstd[size_t(node)]));
    qb.push_back(AsBytes(int8[size_t(node)]));
    mb.push_back(AsBytes(imax[size_t(node)]));
  }
  ExpectSameOnEveryNode(zb, "zstd");
  ExpectSameOnEveryNode(qb, "int8");
  ExpectSameOnEveryNode(mb, "int32 max");

  // A node head of region us asks for another count than the others: no node gets a result, and
  // both of region us say what is wrong without waiting for the deadline (each exchanged parts
  // with the other before either could fail). Region eu fails through the aborts; a gateway there
  // whose client had not yet sent the request when the abort came may instead wait for its
  // deadline (it joined a new generation meanwhile; gateway.h "Operations"), so only "not OK" is
  // checked there, with a short deadline. This is the last all-reduce of the test for the same
  // reason: right after a failure the generations may still be settling.
  std::vector<Status> bad = OnEveryNode([&](int node, Client& client) {
    std::vector<float> x = Input(node);
    const size_t count = node == 1 ? kCount - 1 : kCount;
    return client.RegionAllReduce("jz", "grad", DataType::kFloat32, ReduceOp::kSum, x.data(), count,
                                  Deadline::AfterSeconds(5));
  });
  for (int node = 0; node < kNodes; ++node) {
    const Status& b = bad[size_t(node)];
    EXPECT_FALSE(b.ok()) << NodeName(node) << ": a mismatched region all-reduce succeeded";
    if (RegionOf(node) == 0) {
      EXPECT_NE(b.code(), StatusCode::kDeadlineExceeded) << NodeName(node) << ": " << b;
      // Named by the region phase ("every node head of the region must issue the same ...") or
      // by the regions' identity check ("every rank of every region must issue the same ..."),
      // whichever sees the mismatch first.
      EXPECT_NE(b.message().find("must issue the same"), std::string::npos)
          << NodeName(node) << ": " << b;
    }
  }

  // An unregistered job is refused with the region all-reduce's own reply; the daemon serves on.
  auto client = Client::Connect(Socket(0), Deadline::AfterSeconds(5));
  ASSERT_TRUE(client.ok()) << client.status();
  float x[2] = {1, 2};
  Status unknown = (*client)->RegionAllReduce("unknown-job", "grad", DataType::kFloat32,
                                              ReduceOp::kSum, x, 2, Deadline::AfterSeconds(5));
  EXPECT_EQ(unknown.code(), StatusCode::kFailedPrecondition) << unknown;
  auto stats = (*client)->Stats(Deadline::AfterSeconds(5));
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_NE(stats->find("region_allreduce_ok 3\n"), std::string::npos) << *stats;
  // Every operation that began ended, under the op id it began with (a region all-reduce once
  // ended under another, leaving one entry behind per step).
  EXPECT_NE(stats->find("numbered_ops_in_flight 0\n"), std::string::npos) << *stats;

  StopAll();
}

INSTANTIATE_TEST_SUITE_P(Transport, StraitdRegion,
                         ::testing::Values(Mode::kPlain, Mode::kTls, Mode::kTlsPlainRegionLinks),
                         [](const ::testing::TestParamInfo<Mode>& param_info) {
                           switch (param_info.param) {
                             case Mode::kPlain: return std::string("Plain");
                             case Mode::kTls: return std::string("Tls");
                             case Mode::kTlsPlainRegionLinks: break;
                           }
                           return std::string("TlsWithPlainRegionLinks");
                         });

}  // namespace
}  // namespace strait::gateway

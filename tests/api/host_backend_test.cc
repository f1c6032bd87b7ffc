// Library mode's host backend end to end: 3 regions on strait-wanem x 2 rank processes each
// (host_backend_rank, which uses strait.hpp over libstrait.so), one straitd per rank with
// shard_index = rank (tests/gateway/wan_cluster.h). Each rank process creates a comm (the
// region rendezvous on rank 0's address, region links, the job registered at its straitd) and
// runs the cases of host_backend_cases.h: fp32 and bf16, sum and max, odd counts, in place and
// not, derived and explicit tensor keys, count 0.
//
// Checked: every rank of every region ends bit-identical; with compression "none" the results
// equal the documented reduction order exactly (fp32: the two ranks' sum rounded to fp32 per
// region, then the regions' sum in fp32 in region order; bf16: each level rounded once to bf16;
// max exact); with "int8,noef" sums lie within the codec's bound of the fp64 sum and differ from
// the lossless result (so the lossy codec did run), and max (which the gateway keeps lossless)
// is exact. A region whose ranks disagree on nranks fails the rendezvous with a clear error.
//
// Root only (namespaces, TUN devices): skips with the reason otherwise.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "bench/wanem/netns.h"
#include "common/clock.h"
#include "strait/codec.h"
#include "strait/types.h"
#include "tests/api/host_backend_cases.h"
#include "tests/gateway/wan_cluster.h"

extern char** environ;

namespace strait::api {
namespace {

using testing::Case;
using testing::Cases;

constexpr int kRegions = 3;
constexpr int kRanks = 2;
constexpr int kRootPort = 29400;

std::string ReadText(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::vector<uint8_t> ReadBytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(in), {});
}

class HostBackend : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (Status p = wanem::CheckPrivileges(); !p.ok()) {
      skip_ = new std::string("needs strait-wanem (root): " + std::string(p.message()));
      return;
    }
    gateway::testing::WanClusterOptions o;
    o.straitd = STRAITD_PATH;
    o.name = "apihost";
    o.regions = kRegions;
    o.ranks_per_region = kRanks;
    o.link = "100mbit,5ms";
    auto c = gateway::testing::WanCluster::Start(o);
    if (!c.ok()) {
      error_ = new std::string(c.status().ToString());
      return;
    }
    cluster_ = std::move(c).value().release();
  }
  static void TearDownTestSuite() {
    delete cluster_;
    cluster_ = nullptr;
  }
  void SetUp() override {
    if (skip_ != nullptr) GTEST_SKIP() << *skip_;
    ASSERT_EQ(error_, nullptr) << *error_;
  }

  struct Proc {
    pid_t pid = -1;
    std::string log;
  };

  // Starts rank `rank` of region `region` in its namespace with the given arguments.
  static Proc Spawn(int region, int rank, const std::vector<std::string>& rank_args,
                    const std::string& tag) {
    Proc p;
    p.log = cluster_->dir() + "/" + tag + "_r" + std::to_string(region) + "_" +
            std::to_string(rank) + ".log";
    std::vector<std::string> argv = {"ip", "netns", "exec",
                                     wanem::NamespaceName(cluster_->options().name, region),
                                     HOST_BACKEND_RANK_PATH};
    argv.insert(argv.end(), rank_args.begin(), rank_args.end());
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, p.log.c_str(),
                                     O_WRONLY | O_CREAT | O_TRUNC, 0644);
    posix_spawn_file_actions_adddup2(&actions, STDOUT_FILENO, STDERR_FILENO);
    std::vector<char*> args;
    for (std::string& a : argv) args.push_back(a.data());
    args.push_back(nullptr);
    if (::posix_spawnp(&p.pid, args[0], &actions, nullptr, args.data(), environ) != 0) p.pid = -1;
    posix_spawn_file_actions_destroy(&actions);
    return p;
  }

  // Waits for every process (killing the rest at the deadline); returns their exit codes.
  static std::vector<int> WaitAll(std::vector<Proc>& procs, Deadline deadline) {
    std::vector<int> codes(procs.size(), -1);
    size_t left = 0;
    for (const Proc& p : procs) left += p.pid > 0 ? 1 : 0;
    while (left > 0 && !deadline.Expired()) {
      for (size_t i = 0; i < procs.size(); ++i) {
        int status = 0;
        if (procs[i].pid > 0 && ::waitpid(procs[i].pid, &status, WNOHANG) == procs[i].pid) {
          codes[i] = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
          procs[i].pid = -1;
          --left;
        }
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    for (Proc& p : procs) {
      if (p.pid > 0) {
        ::kill(p.pid, SIGKILL);
        ::waitpid(p.pid, nullptr, 0);
        p.pid = -1;
      }
    }
    return codes;
  }

  // Runs one job's rank processes (3 regions x 2 ranks) to completion; true when all exit 0.
  static ::testing::AssertionResult RunJob(const std::string& job, const std::string& compression,
                                           int root_port) {
    std::vector<Proc> procs;
    for (int r = 0; r < kRegions; ++r) {
      for (int i = 0; i < kRanks; ++i) {
        const std::vector<std::string> args = {
            std::to_string(r),
            std::to_string(i),
            std::to_string(kRanks),
            wanem::RegionAddress(r) + ":" + std::to_string(root_port),
            cluster_->Socket(r, i),
            job,
            compression,
            cluster_->dir()};
        procs.push_back(Spawn(r, i, args, job));
      }
    }
    const std::vector<int> codes = WaitAll(procs, Deadline::AfterSeconds(60));
    std::string failures;
    for (size_t k = 0; k < procs.size(); ++k) {
      if (codes[k] != 0) {
        failures += "rank process " + std::to_string(k) + " exited " + std::to_string(codes[k]) +
                    ":\n" + ReadText(procs[k].log) + "\n";
      }
    }
    if (failures.empty()) return ::testing::AssertionSuccess();
    return ::testing::AssertionFailure() << failures;
  }

  static std::vector<uint8_t> Result(const std::string& job, size_t c, int region, int rank) {
    return ReadBytes(cluster_->dir() + "/" + job + "_c" + std::to_string(c) + "_r" +
                     std::to_string(region) + "_" + std::to_string(rank) + ".bin");
  }

  static std::vector<float> ToFloat(const std::vector<uint8_t>& bytes, strait_datatype_t dtype) {
    const DataType t = static_cast<DataType>(dtype);
    std::vector<float> out(bytes.size() / DataTypeSize(t));
    EXPECT_TRUE(ConvertToFloat(bytes.data(), t, out.data(), out.size()).ok());
    return out;
  }

  // Rounds to the case's type (fp32: as is; bf16: to nearest even, as the library does).
  static float Round(float v, strait_datatype_t dtype) {
    if (dtype != STRAIT_BFLOAT16) return v;
    uint16_t b = 0;
    EXPECT_TRUE(ConvertFromFloat(&v, &b, DataType::kBfloat16, 1).ok());
    float back = 0;
    EXPECT_TRUE(ConvertToFloat(&b, DataType::kBfloat16, &back, 1).ok());
    return back;
  }

  static std::string* skip_;
  static std::string* error_;
  static gateway::testing::WanCluster* cluster_;
};

std::string* HostBackend::skip_ = nullptr;
std::string* HostBackend::error_ = nullptr;
gateway::testing::WanCluster* HostBackend::cluster_ = nullptr;

// Every result file of `job` equals region 0 rank 0's, byte for byte.
void ExpectBitIdentical(const std::string& job, size_t c, const std::vector<uint8_t>& first,
                        const std::vector<std::vector<uint8_t>>& all) {
  for (size_t k = 0; k < all.size(); ++k) {
    EXPECT_EQ(all[k], first) << job << " case " << c << ": rank process " << k
                             << " differs from region 0 rank 0";
  }
}

TEST_F(HostBackend, LosslessResultsFollowTheDocumentedOrderAndAreBitIdentical) {
  const std::string job = "api-none";
  ASSERT_TRUE(RunJob(job, "none", kRootPort));
  for (size_t c = 0; c < Cases().size(); ++c) {
    const Case& k = Cases()[c];
    std::vector<std::vector<uint8_t>> all;
    for (int r = 0; r < kRegions; ++r) {
      for (int i = 0; i < kRanks; ++i) all.push_back(Result(job, c, r, i));
    }
    const size_t elem = k.dtype == STRAIT_BFLOAT16 ? 2 : 4;
    ASSERT_EQ(all[0].size(), k.count * elem) << "case " << c;
    ExpectBitIdentical(job, c, all[0], all);
    const std::vector<float> got = ToFloat(all[0], k.dtype);
    size_t wrong = 0;
    for (size_t e = 0; e < k.count; ++e) {
      float expect = 0;
      if (k.op == STRAIT_MAX) {
        expect = -INFINITY;
        for (int r = 0; r < kRegions; ++r) {
          for (int i = 0; i < kRanks; ++i) {
            expect = std::max(expect, testing::InputValue(r, i, c, e, k.dtype));
          }
        }
      } else {
        // Region level: rank 0 + rank 1 in fp32, rounded once; then the regions in order.
        float acc = 0;
        for (int r = 0; r < kRegions; ++r) {
          const float region_sum = Round(
              testing::InputValue(r, 0, c, e, k.dtype) + testing::InputValue(r, 1, c, e, k.dtype),
              k.dtype);
          acc = r == 0 ? region_sum : acc + region_sum;
        }
        expect = Round(acc, k.dtype);
      }
      if (std::memcmp(&got[e], &expect, 4) != 0 && wrong++ < 5) {
        ADD_FAILURE() << "case " << c << " element " << e << ": got " << got[e] << ", expected "
                      << expect;
      }
    }
    EXPECT_EQ(wrong, 0u) << "case " << c;
  }
}

TEST_F(HostBackend, Int8SumsStayWithinTheCodecBoundAndAreBitIdentical) {
  const std::string job = "api-int8";
  ASSERT_TRUE(RunJob(job, "int8,noef", kRootPort + 1));
  for (size_t c = 0; c < Cases().size(); ++c) {
    const Case& k = Cases()[c];
    std::vector<std::vector<uint8_t>> all;
    for (int r = 0; r < kRegions; ++r) {
      for (int i = 0; i < kRanks; ++i) all.push_back(Result(job, c, r, i));
    }
    const size_t elem = k.dtype == STRAIT_BFLOAT16 ? 2 : 4;
    ASSERT_EQ(all[0].size(), k.count * elem) << "case " << c;
    ExpectBitIdentical(job, c, all[0], all);
    const std::vector<float> got = ToFloat(all[0], k.dtype);
    if (k.op == STRAIT_MAX) {
      // max is never lossy: the gateway sends it lossless under any policy.
      for (size_t e = 0; e < k.count; ++e) {
        float expect = -INFINITY;
        for (int r = 0; r < kRegions; ++r) {
          for (int i = 0; i < kRanks; ++i) {
            expect = std::max(expect, testing::InputValue(r, i, c, e, k.dtype));
          }
        }
        ASSERT_EQ(got[e], expect) << "case " << c << " element " << e;
      }
      continue;
    }
    // The int8 bound: each region's shard is quantized once (error <= its block absmax / 254)
    // and the owner's result once more (<= the result's absmax / 254); bf16 adds its rounding.
    std::vector<double> exact(k.count, 0.0);
    double region_absmax_sum = 0, total_absmax = 0;
    for (int r = 0; r < kRegions; ++r) {
      double absmax = 0;
      for (size_t e = 0; e < k.count; ++e) {
        const double s = double(testing::InputValue(r, 0, c, e, k.dtype)) +
                         double(testing::InputValue(r, 1, c, e, k.dtype));
        exact[e] += s;
        absmax = std::max(absmax, std::fabs(s));
      }
      region_absmax_sum += absmax;
    }
    for (double v : exact) total_absmax = std::max(total_absmax, std::fabs(v));
    double bound = (region_absmax_sum + total_absmax + region_absmax_sum / 254) / 254 * 1.01;
    if (k.dtype == STRAIT_BFLOAT16) bound += (total_absmax + region_absmax_sum) / 128;
    double worst = 0;
    size_t differs = 0;
    for (size_t e = 0; e < k.count; ++e) {
      const double err = std::fabs(double(got[e]) - exact[e]);
      worst = std::max(worst, err);
      // The lossless value in fp32 (what "none" gives, up to rounding): int8 must move some.
      differs += err > 1e-4 ? 1 : 0;
    }
    EXPECT_LE(worst, bound) << "case " << c << ": worst error " << worst << " beyond the bound";
    if (k.count >= 100) {
      EXPECT_GT(differs, k.count / 10) << "case " << c << ": the int8 codec did not run";
    }
  }
}

TEST_F(HostBackend, RanksThatDisagreeOnNranksFailTheRendezvousClearly) {
  // Region 0 only: rank 0 says 2 ranks, rank 1 says 3 (rank 1 of 3 is valid on its own).
  std::vector<Proc> procs;
  const std::string root = wanem::RegionAddress(0) + ":" + std::to_string(kRootPort + 2);
  procs.push_back(
      Spawn(0, 0, {"0", "0", "2", root, cluster_->Socket(0, 0), "api-bad", "none", cluster_->dir()},
            "api-bad"));
  procs.push_back(
      Spawn(0, 1, {"0", "1", "3", root, cluster_->Socket(0, 1), "api-bad", "none", cluster_->dir()},
            "api-bad"));
  const std::vector<int> codes = WaitAll(procs, Deadline::AfterSeconds(40));
  for (size_t k = 0; k < procs.size(); ++k) {
    const std::string log = ReadText(procs[k].log);
    EXPECT_EQ(codes[k], 1) << log;
    EXPECT_NE(log.find("has nranks 3, rank 0 has 2"), std::string::npos) << log;
  }
}

}  // namespace
}  // namespace strait::api

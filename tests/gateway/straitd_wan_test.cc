// straitd over an emulated WAN: 3 regions (strait-wanem namespaces) x 2 ranks, one straitd per
// (region, rank) with shard_index = rank, so each rank index forms its own cross-region mesh.
// Region r's two ranks hold the same tensor, so all 6 results must be bit-identical (two meshes,
// three regions each). The links are unequal (region egress 200 / 100 / 50 Mbit/s, 5 ms one way)
// and the gateways are given matching shard weights.
//
// Covered: every codec x fp32/bf16/fp16 x sum/max/min (lossy codecs: sum only) for counts 1, 7
// and 4099, against an fp64 reference with a per-codec bound, bit-identical on all 6 ranks;
// error feedback converging over 50 steps (a check that fails without it); the shard split
// following the weights; two jobs with the same tensor key at once, each correct; a job of
// another uid refused; bad requests (wrong sizes, unknown job, garbage, no hello, oversized
// frame) answered with errors while the daemons go on serving.
//
// Root only (namespaces, TUN devices): every test skips with the reason otherwise. One emulator
// and one daemon set serve the whole file (SetUpTestSuite).
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "bench/wanem/netns.h"
#include "localproto/client.h"
#include "gateway/gateway.h"
#include "localproto/frame_io.h"
#include "localproto/protocol.h"
#include "gateway/policy.h"
#include "strait/codec.h"
#include "tests/common/stats_text.h"
#include "tests/gateway/wan_cluster.h"

namespace strait::gateway {

// The local protocol and its client (strait::localproto), which these tests drive.
using namespace strait::localproto;  // NOLINT(build/namespaces)
namespace {

constexpr int kRegions = 3;
constexpr int kRanks = 2;
constexpr int kSlots = kRegions * kRanks;
constexpr uint32_t kOtherUid = 65534;  // "nobody": a second user for the isolation checks
const uint64_t kRegionMbit[kRegions] = {200, 100, 50};

// One rank's view of an all-reduce: the gateway's status, reply text and result bytes.
struct RankResult {
  StatusCode code = StatusCode::kUnknown;
  std::string text;
  std::vector<uint8_t> data;
};

std::string Describe(const RankResult& r) {
  return std::string(StatusCodeName(r.code)) + ": " + r.text;
}

// An all-reduce request frame (EncodeMessage refuses bad ones; tests patch bytes for those).
std::vector<uint8_t> AllReduceFrame(const std::string& job, const std::string& key, DataType dtype,
                                    ReduceOp op, size_t count, const std::vector<uint8_t>& data,
                                    uint64_t generation = 1, uint64_t sequence = 0) {
  Message m;
  m.generation = generation;
  m.sequence = sequence;
  m.type = MessageType::kAllReduce;
  m.job = job;
  m.tensor_key = key;
  m.dtype = dtype;
  m.op = op;
  m.count = count;
  m.timeout_ms = 20'000;
  m.data = data;
  auto frame = EncodeMessage(m);
  EXPECT_TRUE(frame.ok()) << frame.status();
  return frame.ok() ? *frame : std::vector<uint8_t>{};
}

// Connects to `path` and, for each frame, writes it and reads one reply frame; returns the reply
// frames (length prefix included) back to back. Only system calls and fixed buffers, so that a
// forked child of this multi-threaded process may run it. Stops at the first failure.
size_t RawExchange(const char* path, const std::vector<std::vector<uint8_t>>& frames, uint8_t* out,
                   size_t out_size) {
  const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return 0;
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, path, sizeof(addr.sun_path) - 1);
  if (::connect(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)) != 0) {
    ::close(fd);
    return 0;
  }
  size_t used = 0;
  const auto read_exact = [&](uint8_t* p, size_t n) {
    while (n > 0) {
      const ssize_t got = ::read(fd, p, n);
      if (got <= 0) return false;
      p += got;
      n -= static_cast<size_t>(got);
    }
    return true;
  };
  for (const auto& frame : frames) {
    size_t off = 0;
    while (off < frame.size()) {
      const ssize_t put = ::write(fd, frame.data() + off, frame.size() - off);
      if (put <= 0) break;
      off += static_cast<size_t>(put);
    }
    if (used + 4 > out_size || !read_exact(out + used, 4)) break;
    const uint32_t len = static_cast<uint32_t>(out[used]) | (uint32_t{out[used + 1]} << 8) |
                         (uint32_t{out[used + 2]} << 16) | (uint32_t{out[used + 3]} << 24);
    if (used + 4 + len > out_size || !read_exact(out + used + 4, len)) break;
    used += 4 + len;
  }
  ::close(fd);
  return used;
}

// Splits RawExchange's output into decoded replies.
std::vector<Message> DecodeReplies(const uint8_t* p, size_t n) {
  std::vector<Message> replies;
  size_t at = 0;
  while (at + 4 <= n) {
    const uint32_t len = static_cast<uint32_t>(p[at]) | (uint32_t{p[at + 1]} << 8) |
                         (uint32_t{p[at + 2]} << 16) | (uint32_t{p[at + 3]} << 24);
    if (at + 4 + len > n) break;
    auto m = DecodeMessage(std::span<const uint8_t>(p + at + 4, len));
    EXPECT_TRUE(m.ok()) << m.status();
    if (m.ok()) replies.push_back(std::move(m).value());
    at += 4 + len;
  }
  return replies;
}

std::vector<uint8_t> HelloFrame(const std::string& name) {
  Message m;
  m.type = MessageType::kHello;
  m.client_name = name;
  return EncodeMessage(m).value();
}

// Region r's tensor: `count` values of `dtype` (uniform in [-1, 1], a few larger ones so that
// blocks differ in scale), reproducible from `seed`.
std::vector<uint8_t> MakeTensor(DataType dtype, size_t count, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> uni(-1.0f, 1.0f);
  std::vector<float> f(count);
  for (size_t i = 0; i < count; ++i) f[i] = uni(rng) * ((i % 97) == 5 ? 8.0f : 1.0f);
  std::vector<uint8_t> bytes(count * DataTypeSize(dtype));
  EXPECT_TRUE(ConvertFromFloat(f.data(), bytes.data(), dtype, count).ok());
  return bytes;
}

std::vector<double> ToDouble(const std::vector<uint8_t>& bytes, DataType dtype) {
  const size_t count = bytes.size() / DataTypeSize(dtype);
  std::vector<float> f(count);
  EXPECT_TRUE(ConvertToFloat(bytes.data(), dtype, f.data(), count).ok());
  return std::vector<double>(f.begin(), f.end());
}

// Half an ulp relative, for the final conversion of the fp32 result to `dtype`.
double RoundingOf(DataType dtype) {
  switch (dtype) {
    case DataType::kBfloat16: return std::ldexp(1.0, -8);
    case DataType::kFloat16: return std::ldexp(1.0, -11);
    default: return std::ldexp(1.0, -24);
  }
}

// Checks `result` against the fp64 reduction of `inputs` (one per region). Max and min must be
// exact; a lossless sum is within fp32 accumulation plus the final rounding to dtype; a lossy sum
// adds the codec's bound relative to the largest magnitude for each of the n + 1 quantizations
// (every region's input, then the owner's result). Returns the number of elements out of bounds
// (and reports the first few).
size_t CheckResult(const std::vector<uint8_t>& result,
                   const std::vector<std::vector<uint8_t>>& inputs, DataType dtype, ReduceOp op,
                   CodecId codec, const std::string& what) {
  const std::vector<double> got = ToDouble(result, dtype);
  std::vector<std::vector<double>> in;
  for (const auto& bytes : inputs) in.push_back(ToDouble(bytes, dtype));
  const size_t count = got.size();
  double lossy_scale = 0;  // sum over quantizations of the largest magnitude quantized
  for (const auto& v : in) {
    double m = 0;
    for (double x : v) m = std::max(m, std::fabs(x));
    lossy_scale += m;
  }
  double result_max = 0;
  for (double x : got) result_max = std::max(result_max, std::fabs(x));
  lossy_scale += result_max;
  const double bound = CodecRelativeErrorBound(codec);
  size_t wrong = 0;
  for (size_t e = 0; e < count; ++e) {
    double want = in[0][e], sum_abs = 0;
    for (const auto& v : in) {
      if (op == ReduceOp::kSum) {
        if (&v != &in[0]) want += v[e];
      } else if (op == ReduceOp::kMax) {
        want = std::max(want, v[e]);
      } else {
        want = std::min(want, v[e]);
      }
      sum_abs += std::fabs(v[e]);
    }
    double tol = 0;
    if (op == ReduceOp::kSum) {
      tol = RoundingOf(dtype) * std::fabs(want) + 4 * 1.2e-7 * sum_abs + 1e-7 +
            1.05 * bound * lossy_scale;
    }
    if (!(std::fabs(got[e] - want) <= tol)) {
      if (++wrong <= 3) {
        ADD_FAILURE() << what << ": element " << e << " is " << got[e] << ", want " << want
                      << " +- " << tol;
      }
    }
  }
  return wrong;
}

class StraitdWan : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (Status p = wanem::CheckPrivileges(); !p.ok()) {
      skip_ = new std::string("needs strait-wanem (root): " + std::string(p.message()));
      return;
    }
    testing::WanClusterOptions o;
    o.straitd = STRAITD_PATH;
    o.name = "gwwantest";
    o.link = "100mbit,5ms";
    for (int s = 0; s < kRegions; ++s) {
      for (int d = 0; d < kRegions; ++d) {
        if (s == d) continue;
        o.pair_overrides.push_back(std::to_string(s) + ">" + std::to_string(d) +
                                   "=rate=" + std::to_string(kRegionMbit[s]) + "mbit");
      }
      o.shard_weights.push_back(kRegionMbit[s]);
    }
    o.allowed_uids = {kOtherUid};
    auto cluster = testing::WanCluster::Start(o);
    if (!cluster.ok()) {
      error_ = new std::string(cluster.status().ToString());
      return;
    }
    cluster_ = std::move(cluster).value().release();
  }

  static void TearDownTestSuite() {
    delete cluster_;
    cluster_ = nullptr;
    delete skip_;
    skip_ = nullptr;
    delete error_;
    error_ = nullptr;
  }

  void SetUp() override {
    if (skip_ != nullptr) GTEST_SKIP() << *skip_;
    ASSERT_EQ(error_, nullptr) << *error_;
    for (int s = 0; s < kSlots; ++s) {
      auto c = Client::Connect(cluster_->Socket(s / kRanks, s % kRanks), Deadline::AfterSeconds(10),
                               "rank" + std::to_string(s));
      ASSERT_TRUE(c.ok()) << c.status();
      clients_.push_back(std::move(c).value());
    }
  }

  void TearDown() override {
    if (cluster_ == nullptr) return;
    for (int r = 0; r < kRegions; ++r) {
      for (int i = 0; i < kRanks; ++i) {
        EXPECT_TRUE(cluster_->Running(r, i)) << "straitd r" << r << "." << i << " died:\n"
                                             << cluster_->Logs(r, i);
      }
    }
    if (HasFailure()) {
      std::cerr << "straitd r0.0 log:\n" << cluster_->Logs(0, 0) << '\n';
    }
  }

  // Registers `job` with `policy` on every gateway; returns r0.0's resolved policy text.
  std::string RegisterEverywhere(const std::string& job, const std::string& policy) {
    std::string text;
    for (int s = 0; s < kSlots; ++s) {
      auto p =
          clients_[static_cast<size_t>(s)]->RegisterJob(job, policy, Deadline::AfterSeconds(10));
      EXPECT_TRUE(p.ok()) << job << " on slot " << s << ": " << p.status();
      if (s == 0 && p.ok()) text = *p;
    }
    return text;
  }

  // One all-reduce on all 6 ranks at once (rank (r, i) contributes inputs[r]) through
  // `clients` (default: this test's).
  std::vector<RankResult> AllReduceAll(const std::string& job, const std::string& key,
                                       DataType dtype, ReduceOp op, size_t count,
                                       const std::vector<std::vector<uint8_t>>& inputs,
                                       std::vector<std::unique_ptr<Client>>* clients = nullptr) {
    if (clients == nullptr) clients = &clients_;
    std::vector<RankResult> results(kSlots);
    std::vector<std::thread> threads;
    for (int s = 0; s < kSlots; ++s) {
      threads.emplace_back([&, s] {
        Client& client = *(*clients)[static_cast<size_t>(s)];
        RankResult& r = results[static_cast<size_t>(s)];
        // The rank's comm: it joins the job once (and again after a failed step), then numbers
        // its steps (localproto/protocol.h, "Operation identity"), as localproto::Client does.
        const auto session_key = std::make_pair(static_cast<const void*>(&client), job);
        std::pair<uint64_t, uint64_t> session{0, 0};
        {
          std::lock_guard<std::mutex> lock(sessions_mu_);
          if (auto it = sessions_.find(session_key); it != sessions_.end()) session = it->second;
        }
        if (session.first == 0) {
          auto g = client.JoinJob(job, Deadline::AfterSeconds(20));
          if (!g.ok()) {
            r.code = g.status().code();
            r.text = g.status().ToString();
            return;
          }
          session = {*g, 0};
        }
        const auto frame = AllReduceFrame(job, key, dtype, op, count,
                                          inputs[static_cast<size_t>(s / kRanks)], session.first,
                                          session.second);
        auto reply = client.SendRawForTest(frame, Deadline::AfterSeconds(30));
        const bool ok = reply.ok() && reply->code == StatusCode::kOk;
        {
          std::lock_guard<std::mutex> lock(sessions_mu_);
          if (ok) {
            sessions_[session_key] = {session.first, session.second + 1};
          } else {
            sessions_.erase(session_key);
          }
        }
        if (!reply.ok()) {
          r.code = reply.status().code();
          r.text = reply.status().ToString();
          return;
        }
        r.code = reply->code;
        r.text = reply->text;
        r.data = std::move(reply->data);
      });
    }
    for (auto& t : threads) t.join();
    return results;
  }

  // Every rank succeeded and all results are the same bytes.
  static void ExpectOkAndIdentical(const std::vector<RankResult>& results,
                                   const std::string& what) {
    for (int s = 0; s < kSlots; ++s) {
      ASSERT_EQ(results[static_cast<size_t>(s)].code, StatusCode::kOk)
          << what << " slot " << s << ": " << Describe(results[static_cast<size_t>(s)]);
    }
    for (int s = 1; s < kSlots; ++s) {
      EXPECT_TRUE(results[static_cast<size_t>(s)].data == results[0].data)
          << what << ": rank r" << s / kRanks << "." << s % kRanks
          << " differs from r0.0 (not bit-identical)";
    }
  }

  static testing::WanCluster* cluster_;
  static std::string* skip_;
  static std::string* error_;
  std::mutex sessions_mu_;
  std::map<std::pair<const void*, std::string>, std::pair<uint64_t, uint64_t>> sessions_;
  std::vector<std::unique_ptr<Client>> clients_;
};

testing::WanCluster* StraitdWan::cluster_ = nullptr;
std::string* StraitdWan::skip_ = nullptr;
std::string* StraitdWan::error_ = nullptr;

TEST_F(StraitdWan, EveryCodecTypeAndOpIsCorrectAndBitIdenticalOnAllRanks) {
  const std::vector<std::pair<CodecId, std::string>> codecs = {{CodecId::kNone, "none"},
                                                               {CodecId::kZstd, "zstd"},
                                                               {CodecId::kInt8, "int8,noef"},
                                                               {CodecId::kInt4, "int4,noef"},
                                                               {CodecId::kFp8E4M3, "fp8,noef"}};
  for (const auto& [codec, policy] : codecs) {
    RegisterEverywhere(std::string("m-") + CodecName(codec), policy);
  }
  const DataType dtypes[] = {DataType::kFloat32, DataType::kBfloat16, DataType::kFloat16};
  const ReduceOp ops[] = {ReduceOp::kSum, ReduceOp::kMax, ReduceOp::kMin};
  const size_t counts[] = {1, 7, 4099};
  uint64_t seed = 1;
  int cases = 0;
  for (const auto& [codec, policy] : codecs) {
    const bool lossy = CodecRelativeErrorBound(codec) > 0;
    const std::string job = std::string("m-") + CodecName(codec);
    for (DataType dtype : dtypes) {
      for (ReduceOp op : ops) {
        if (lossy && op != ReduceOp::kSum) continue;  // lossy codecs only sum
        for (size_t count : counts) {
          std::vector<std::vector<uint8_t>> inputs;
          for (int r = 0; r < kRegions; ++r) inputs.push_back(MakeTensor(dtype, count, seed++));
          std::ostringstream what;
          what << job << " " << DataTypeName(dtype) << " " << static_cast<int>(op) << " x" << count;
          // A key per case: no error-feedback state carries over between cases.
          const auto results = AllReduceAll(job, what.str(), dtype, op, count, inputs);
          ExpectOkAndIdentical(results, what.str());
          if (HasFatalFailure()) return;
          // The reply names the codec the gateway used: the case really ran it.
          EXPECT_EQ(results[0].text.substr(0, results[0].text.find(' ')), CodecName(codec))
              << what.str() << ": " << results[0].text;
          EXPECT_EQ(CheckResult(results[0].data, inputs, dtype, op, codec, what.str()), 0u);
          ++cases;
        }
      }
    }
  }
  EXPECT_EQ(cases, (2 * 3 * 3 + 3 * 3) * 3);
}

TEST_F(StraitdWan, ErrorFeedbackMakesTheMeanOverStepsConverge) {
  // The same gradient every step, int4 (coarse): without error feedback every step makes the
  // same rounding error, so the mean over steps keeps it; with it the residuals carry the error
  // into the next step and the mean approaches the true sum.
  RegisterEverywhere("ef-on", "int4,ef");
  RegisterEverywhere("ef-off", "int4,noef");
  constexpr size_t kCount = 2053;
  constexpr int kSteps = 50;
  std::vector<std::vector<uint8_t>> inputs;
  for (int r = 0; r < kRegions; ++r)
    inputs.push_back(MakeTensor(DataType::kFloat32, kCount, 900 + r));
  std::vector<double> truth(kCount, 0.0);
  for (const auto& in : inputs) {
    const std::vector<double> v = ToDouble(in, DataType::kFloat32);
    for (size_t e = 0; e < kCount; ++e) truth[e] += v[e];
  }
  double error_of_mean[2] = {0, 0};
  const char* jobs[2] = {"ef-on", "ef-off"};
  for (int j = 0; j < 2; ++j) {
    std::vector<double> mean(kCount, 0.0);
    for (int step = 0; step < kSteps; ++step) {
      const auto results =
          AllReduceAll(jobs[j], "layer.grad", DataType::kFloat32, ReduceOp::kSum, kCount, inputs);
      ExpectOkAndIdentical(results, std::string(jobs[j]) + " step " + std::to_string(step));
      if (HasFatalFailure()) return;
      const std::vector<double> got = ToDouble(results[0].data, DataType::kFloat32);
      for (size_t e = 0; e < kCount; ++e) mean[e] += got[e] / kSteps;
    }
    for (size_t e = 0; e < kCount; ++e) error_of_mean[j] += std::fabs(mean[e] - truth[e]) / kCount;
  }
  // Without error feedback the error stays at int4's rounding (a few percent of the scale).
  EXPECT_GT(error_of_mean[1], 1e-2) << "int4 without error feedback should be visibly lossy";
  // With it, the error of the mean falls roughly as 1/steps.
  EXPECT_LT(error_of_mean[0], error_of_mean[1] / 10)
      << "mean abs error of the 50-step mean: with EF " << error_of_mean[0] << ", without "
      << error_of_mean[1];
}

TEST_F(StraitdWan, ShardsFollowTheLinksWeights) {
  RegisterEverywhere("shards", "none");
  constexpr size_t kCount = 7001;
  std::vector<std::vector<uint8_t>> inputs;
  for (int r = 0; r < kRegions; ++r)
    inputs.push_back(MakeTensor(DataType::kFloat32, kCount, 70 + r));
  const auto results =
      AllReduceAll("shards", "w", DataType::kFloat32, ReduceOp::kSum, kCount, inputs);
  ExpectOkAndIdentical(results, "shards");
  if (HasFatalFailure()) return;
  EXPECT_EQ(CheckResult(results[0].data, inputs, DataType::kFloat32, ReduceOp::kSum, CodecId::kNone,
                        "shards"),
            0u);
  // "none shards=a,b,c": elements per owner in region order; the same on every rank.
  const std::string& text = results[0].text;
  const size_t at = text.find("shards=");
  ASSERT_NE(at, std::string::npos) << text;
  std::vector<double> shards;
  std::stringstream ss(text.substr(at + 7));
  std::string item;
  while (std::getline(ss, item, ',')) shards.push_back(std::stod(item));
  ASSERT_EQ(shards.size(), static_cast<size_t>(kRegions)) << text;
  EXPECT_EQ(shards[0] + shards[1] + shards[2], static_cast<double>(kCount)) << text;
  // 200 : 100 : 50 Mbit/s -> 4 : 2 : 1, within rounding.
  EXPECT_NEAR(shards[0] / shards[2], 4.0, 0.05) << text;
  EXPECT_NEAR(shards[1] / shards[2], 2.0, 0.05) << text;
  for (const auto& r : results) EXPECT_EQ(r.text, text);
}

TEST_F(StraitdWan, TwoJobsWithTheSameTensorKeyStayApartAndOtherUidsAreRefused) {
  // Two jobs on different link lanes (so their chunks interleave on the links).
  const std::string a = "iso-a";
  std::string b = "iso-b";
  for (int k = 0; JobLane(b) == JobLane(a); ++k) b = "iso-b" + std::to_string(k);
  RegisterEverywhere(a, "zstd");
  RegisterEverywhere(b, "zstd");
  std::vector<std::unique_ptr<Client>> second;
  for (int s = 0; s < kSlots; ++s) {
    auto c = Client::Connect(cluster_->Socket(s / kRanks, s % kRanks), Deadline::AfterSeconds(10));
    ASSERT_TRUE(c.ok()) << c.status();
    second.push_back(std::move(c).value());
  }
  constexpr size_t kCount = 60013;  // 240 KB per rank: long enough for the jobs to overlap
  for (int round = 0; round < 3; ++round) {
    std::vector<std::vector<uint8_t>> in_a, in_b;
    for (int r = 0; r < kRegions; ++r) {
      in_a.push_back(MakeTensor(DataType::kFloat32, kCount, 5000 + 10 * round + r));
      in_b.push_back(MakeTensor(DataType::kFloat32, kCount, 6000 + 10 * round + r));
    }
    std::vector<RankResult> res_a, res_b;
    std::thread ta([&] {
      res_a = AllReduceAll(a, "shared.grad", DataType::kFloat32, ReduceOp::kSum, kCount, in_a);
    });
    std::thread tb([&] {
      res_b =
          AllReduceAll(b, "shared.grad", DataType::kFloat32, ReduceOp::kSum, kCount, in_b, &second);
    });
    ta.join();
    tb.join();
    ExpectOkAndIdentical(res_a, a);
    ExpectOkAndIdentical(res_b, b);
    if (HasFatalFailure()) return;
    EXPECT_EQ(
        CheckResult(res_a[0].data, in_a, DataType::kFloat32, ReduceOp::kSum, CodecId::kZstd, a),
        0u);
    EXPECT_EQ(
        CheckResult(res_b[0].data, in_b, DataType::kFloat32, ReduceOp::kSum, CodecId::kZstd, b),
        0u);
  }

  // Another user (uid 65534, allowed on the socket) tries job a: refused, and says whose it is.
  // The child only makes system calls (fork in a threaded process); frames are built here.
  const std::string socket = cluster_->Socket(0, 0);
  const std::vector<std::vector<uint8_t>> frames = {
      HelloFrame("other-user"),
      AllReduceFrame(a, "shared.grad", DataType::kFloat32, ReduceOp::kSum, 4,
                     std::vector<uint8_t>(16, 0)),
      [&] {
        Message m;
        m.type = MessageType::kRegisterJob;
        m.job = a;
        m.policy = "none";
        return EncodeMessage(m).value();
      }(),
      [&] {
        Message m;
        m.type = MessageType::kStats;
        return EncodeMessage(m).value();
      }()};
  int pipe_fds[2];
  ASSERT_EQ(::pipe(pipe_fds), 0);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    ::close(pipe_fds[0]);
    static uint8_t buf[1 << 16];
    size_t n = 0;
    if (::setuid(kOtherUid) == 0) n = RawExchange(socket.c_str(), frames, buf, sizeof(buf));
    size_t off = 0;
    while (off < n) {
      const ssize_t put = ::write(pipe_fds[1], buf + off, n - off);
      if (put <= 0) break;
      off += static_cast<size_t>(put);
    }
    ::_exit(0);
  }
  ::close(pipe_fds[1]);
  std::vector<uint8_t> bytes;
  uint8_t chunk[4096];
  ssize_t got;
  while ((got = ::read(pipe_fds[0], chunk, sizeof(chunk))) > 0)
    bytes.insert(bytes.end(), chunk, chunk + got);
  ::close(pipe_fds[0]);
  int status = 0;
  ::waitpid(child, &status, 0);
  const std::vector<Message> replies = DecodeReplies(bytes.data(), bytes.size());
  ASSERT_EQ(replies.size(), 4u) << "the other uid's client got " << replies.size() << " replies";
  EXPECT_EQ(replies[0].code, StatusCode::kOk) << replies[0].text;
  EXPECT_EQ(replies[1].code, StatusCode::kPermissionDenied) << replies[1].text;
  EXPECT_NE(replies[1].text.find("belongs to uid " + std::to_string(::getuid())), std::string::npos)
      << replies[1].text;
  // No data of the job, only the marker of a request refused before its step was used.
  EXPECT_EQ(replies[1].data, std::vector<uint8_t>{0});
  EXPECT_EQ(replies[2].code, StatusCode::kPermissionDenied) << replies[2].text;
  EXPECT_EQ(replies[3].code, StatusCode::kOk) << "stats hold no job data: " << replies[3].text;
  // The owner's job is untouched (its policy was not replaced): it still runs with zstd.
  std::vector<std::vector<uint8_t>> in;
  for (int r = 0; r < kRegions; ++r) in.push_back(MakeTensor(DataType::kFloat32, 100, 77 + r));
  const auto after = AllReduceAll(a, "shared.grad", DataType::kFloat32, ReduceOp::kSum, 100, in);
  ExpectOkAndIdentical(after, "job a after the refusals");
  EXPECT_EQ(after[0].text.substr(0, 4), "zstd") << after[0].text;
}

TEST_F(StraitdWan, BadRequestsGetErrorsAndTheDaemonsKeepServing) {
  RegisterEverywhere("good", "zstd");
  Client& c = *clients_[0];
  const auto before = c.Stats(Deadline::AfterSeconds(5));
  ASSERT_TRUE(before.ok()) << before.status();

  // Data shorter than count says: the count field patched from 4 to 8 after encoding.
  std::vector<uint8_t> frame = AllReduceFrame("good", "k", DataType::kFloat32, ReduceOp::kSum, 4,
                                              std::vector<uint8_t>(16, 1));
  const size_t count_at = 4 + 1 + 2 + 4 + 2 + 1 + 2;  // prefix, type, "good", "k", dtype, op
  ASSERT_EQ(frame[count_at], 4);
  frame[count_at] = 8;
  auto reply = c.SendRawForTest(frame, Deadline::AfterSeconds(5));
  ASSERT_TRUE(reply.ok()) << reply.status();
  EXPECT_EQ(reply->code, StatusCode::kInvalidArgument) << reply->text;

  // An unknown job.
  reply = c.SendRawForTest(AllReduceFrame("no-such-job", "k", DataType::kFloat32, ReduceOp::kSum, 1,
                                          std::vector<uint8_t>(4, 0)),
                           Deadline::AfterSeconds(5));
  ASSERT_TRUE(reply.ok()) << reply.status();
  EXPECT_EQ(reply->code, StatusCode::kFailedPrecondition) << reply->text;
  EXPECT_NE(reply->text.find("not registered"), std::string::npos) << reply->text;

  // Garbage: an unknown message type, then random bytes, each a well-framed body.
  reply = c.SendRawForTest({5, 0, 0, 0, 0xee, 1, 2, 3, 4}, Deadline::AfterSeconds(5));
  ASSERT_TRUE(reply.ok()) << reply.status();
  EXPECT_NE(reply->code, StatusCode::kOk);
  std::mt19937 rng(7);
  std::vector<uint8_t> junk = {64, 0, 0, 0};
  for (int i = 0; i < 64; ++i) junk.push_back(static_cast<uint8_t>(rng()));
  junk[4] = 3;  // claims to be an all-reduce
  reply = c.SendRawForTest(junk, Deadline::AfterSeconds(5));
  ASSERT_TRUE(reply.ok()) << reply.status();
  EXPECT_NE(reply->code, StatusCode::kOk) << reply->text;

  // The same connection still works after those.
  const auto stats = c.Stats(Deadline::AfterSeconds(5));
  ASSERT_TRUE(stats.ok()) << stats.status();

  // No hello first; then an oversized frame, which ends that connection.
  uint8_t buf[1 << 14];
  Message stats_request;
  stats_request.type = MessageType::kStats;
  size_t n = RawExchange(cluster_->Socket(0, 0).c_str(), {EncodeMessage(stats_request).value()},
                         buf, sizeof(buf));
  std::vector<Message> raw = DecodeReplies(buf, n);
  ASSERT_EQ(raw.size(), 1u);
  EXPECT_EQ(raw[0].code, StatusCode::kFailedPrecondition) << raw[0].text;
  n = RawExchange(cluster_->Socket(0, 0).c_str(), {HelloFrame("big"), {0xff, 0xff, 0xff, 0x7f}},
                  buf, sizeof(buf));
  raw = DecodeReplies(buf, n);
  ASSERT_EQ(raw.size(), 2u);
  EXPECT_EQ(raw[1].code, StatusCode::kResourceExhausted) << raw[1].text;

  // Counted, and everyone is still served: a full all-reduce on all 6 ranks.
  const auto after = c.Stats(Deadline::AfterSeconds(5));
  ASSERT_TRUE(after.ok()) << after.status();
  EXPECT_GE(test::StatValue(*before, "bad_requests"), 0) << *before;
  EXPECT_GE(test::StatValue(*after, "bad_requests") - test::StatValue(*before, "bad_requests"), 5)
      << *after;
  std::vector<std::vector<uint8_t>> in;
  for (int r = 0; r < kRegions; ++r) in.push_back(MakeTensor(DataType::kFloat32, 999, 31 + r));
  const auto results = AllReduceAll("good", "k", DataType::kFloat32, ReduceOp::kSum, 999, in);
  ExpectOkAndIdentical(results, "after bad requests");
  if (HasFatalFailure()) return;
  EXPECT_EQ(CheckResult(results[0].data, in, DataType::kFloat32, ReduceOp::kSum, CodecId::kZstd,
                        "after bad requests"),
            0u);
}

}  // namespace
}  // namespace strait::gateway

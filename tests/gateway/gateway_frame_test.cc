// The all-reduce of pre-quantized frames (kAllReduceFrame, library mode) through two gateways in
// one process on loopback: each "rank" quantizes with error feedback on the CPU, the gateways
// return one result frame, identical on both sides and close to the fp64 sum; tensors with fewer
// blocks than regions take the exact path and are still identical; and bad frames (corrupt,
// lossless, zstd-chained, wrong op, a codec the job's policy does not give) get one clear error
// each while the gateway keeps serving.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmath>
#include <random>
#include <string>
#include <thread>

#include "localproto/client.h"
#include "gateway/gateway.h"
#include "strait/codec.h"

namespace strait::gateway {

// The local protocol and its client (strait::localproto), which these tests drive.
using namespace strait::localproto;  // NOLINT(build/namespaces)
namespace {

class FrameGateways : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/strait-gwf-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    GatewayConfig us;
    us.file = "test";
    us.region = "us";  // ranks above "eu": it waits for eu to dial
    us.local_socket = dir_ + "/us.sock";
    us.allowed_uids = {::getuid()};
    us.wan_listen = {"127.0.0.1", 0};
    us.transport = net::Transport::kPlainTcp;
    us.peers["eu"][0] = {"127.0.0.1", 1};
    us.policy.min_lossy_bytes = 16;
    us.shutdown_grace_ns = 1'000'000'000;
    auto g = Gateway::Start(us);
    ASSERT_TRUE(g.ok()) << g.status();
    gateways_.push_back(std::move(g).value());
    GatewayConfig eu = us;
    eu.region = "eu";
    eu.local_socket = dir_ + "/eu.sock";
    eu.peers.clear();
    eu.peers["us"][0] = {"127.0.0.1", gateways_[0]->wan_port()};
    g = Gateway::Start(eu);
    ASSERT_TRUE(g.ok()) << g.status();
    gateways_.push_back(std::move(g).value());
    for (const std::string& path : {us.local_socket, eu.local_socket}) {
      auto c = Client::Connect(path, Deadline::AfterSeconds(5), "frame-test");
      ASSERT_TRUE(c.ok()) << c.status();
      clients_.push_back(std::move(c).value());
    }
  }
  void TearDown() override {
    clients_.clear();
    gateways_.clear();
    ::rmdir(dir_.c_str());
  }
  // Registers `job` on both gateways, then both clients join it (at once: a join waits for the
  // other region), as a comm does when it is created.
  void RegisterBoth(const std::string& job, const std::string& policy) {
    for (auto& c : clients_) {
      auto p = c->RegisterJob(job, policy, Deadline::AfterSeconds(5));
      ASSERT_TRUE(p.ok()) << p.status();
    }
    std::vector<std::thread> joins;
    std::vector<Status> joined(clients_.size());
    for (size_t i = 0; i < clients_.size(); ++i) {
      joins.emplace_back([&, i] {
        joined[i] = clients_[i]->JoinJob(job, Deadline::AfterSeconds(10)).status();
      });
    }
    for (auto& t : joins) t.join();
    for (const Status& j : joined) ASSERT_TRUE(j.ok()) << j;
  }

  std::string dir_;
  std::vector<std::unique_ptr<Gateway>> gateways_;
  std::vector<std::unique_ptr<Client>> clients_;
};

std::vector<float> Input(int rank, size_t count, int step) {
  std::mt19937 gen(static_cast<uint32_t>(1000 * rank + step));
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> v(count);
  for (auto& x : v) x = dist(gen) * static_cast<float>(1 + rank);
  return v;
}

// Both ranks quantize their input (error feedback on the CPU) and all-reduce the frames;
// returns the two result frames.
void RunStep(std::vector<std::unique_ptr<Client>>& clients, const std::string& job,
             const std::string& key, CodecId codec, uint32_t block, ReduceOp op, size_t count,
             int step, std::vector<std::vector<float>>& residuals,
             std::vector<std::vector<uint8_t>>* results, std::vector<double>* reference) {
  results->assign(2, {});
  reference->assign(count, 0.0);
  std::vector<std::vector<uint8_t>> frames(2);
  for (int r = 0; r < 2; ++r) {
    const std::vector<float> in = Input(r, count, step);
    for (size_t i = 0; i < count; ++i) (*reference)[i] += in[i];
    CodecOptions o;
    o.codec = codec;
    o.block_size = block;
    Encoder enc;
    ASSERT_TRUE(enc.EncodeWithFeedback(in.data(), count, DataType::kFloat32, o,
                                       residuals[static_cast<size_t>(r)].data(),
                                       &frames[static_cast<size_t>(r)])
                    .ok());
  }
  if (op == ReduceOp::kAvg) {
    for (auto& x : *reference) x /= 2;
  }
  Status status[2];
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      status[r] = clients[static_cast<size_t>(r)]->AllReduceFrame(
          job, key, op, frames[static_cast<size_t>(r)], &(*results)[static_cast<size_t>(r)],
          Deadline::AfterSeconds(20));
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < 2; ++r) ASSERT_TRUE(status[r].ok()) << "rank " << r << ": " << status[r];
}

TEST_F(FrameGateways, RanksGetOneIdenticalResultFrameCloseToTheSum) {
  RegisterBoth("job", "int8,ef");
  struct Shape {
    size_t count;
    uint32_t block;
    ReduceOp op;
  };
  // 100 elements in blocks of 64: 2 blocks, one per owner. 50: one block for two owners, the
  // exact path. 70001: many chunks, a partial last block.
  for (const Shape& shape : {Shape{100, 64, ReduceOp::kSum}, Shape{50, 64, ReduceOp::kAvg},
                             Shape{70001, 256, ReduceOp::kAvg}}) {
    SCOPED_TRACE("count " + std::to_string(shape.count));
    std::vector<std::vector<float>> residuals(2, std::vector<float>(shape.count, 0.0f));
    for (int step = 0; step < 3; ++step) {
      std::vector<std::vector<uint8_t>> results;
      std::vector<double> ref;
      RunStep(clients_, "job", "w" + std::to_string(shape.count), CodecId::kInt8, shape.block,
              shape.op, shape.count, step, residuals, &results, &ref);
      if (HasFatalFailure()) return;
      EXPECT_TRUE(results[0] == results[1]) << "the regions' result frames differ";
      auto info = InspectFrame(results[0]);
      ASSERT_TRUE(info.ok()) << info.status();
      EXPECT_EQ(info->codec, CodecId::kInt8);
      EXPECT_EQ(info->dtype, DataType::kFloat32);
      EXPECT_EQ(info->block_size, shape.block);
      EXPECT_EQ(info->element_count, shape.count);
      std::vector<float> out(shape.count);
      Decoder dec;
      ASSERT_TRUE(dec.Decode(results[0], out.data(), shape.count, DataType::kFloat32).ok());
      // Two int8 quantizations of the inputs (one step each, error feedback aside) and one of
      // the result: within 3 steps of the largest magnitude, |x| <= 3 per element here.
      const double bound = 3.0 * 3.0 / 127.0 + 1e-6;
      double worst = 0;
      for (size_t i = 0; i < shape.count; ++i) worst = std::max(worst, std::abs(out[i] - ref[i]));
      EXPECT_LE(worst, bound);
    }
  }
  // 3 sizes x 3 steps, counted as all-reduces on both sides.
  EXPECT_NE(gateways_[0]->StatsText().find("allreduce_ok 9\n"), std::string::npos)
      << gateways_[0]->StatsText();
}

TEST_F(FrameGateways, BadFramesGetOneClearErrorEachAndTheGatewayKeepsServing) {
  RegisterBoth("job", "int8");
  Client& us = *clients_[0];
  std::vector<float> in(512, 0.5f);
  CodecOptions o;
  o.codec = CodecId::kInt8;
  Encoder enc;
  std::vector<uint8_t> good;
  ASSERT_TRUE(enc.Encode(in.data(), in.size(), DataType::kFloat32, o, &good).ok());
  std::vector<uint8_t> out = {42};
  auto call = [&](const std::vector<uint8_t>& frame, ReduceOp op = ReduceOp::kSum,
                  const std::string& job = "job") {
    return us.AllReduceFrame(job, "w", op, frame, &out, Deadline::AfterSeconds(5));
  };

  std::vector<uint8_t> corrupt = good;
  corrupt[kFrameHeaderSize + 100] ^= 0x10;
  Status s = call(corrupt);
  EXPECT_EQ(s.code(), StatusCode::kDataLoss) << s;
  EXPECT_NE(s.message().find("corrupted frame payload"), std::string::npos) << s;

  std::vector<uint8_t> lossless;
  o.codec = CodecId::kZstd;
  ASSERT_TRUE(enc.Encode(in.data(), in.size(), DataType::kFloat32, o, &lossless).ok());
  s = call(lossless);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("zstd, not a lossy codec"), std::string::npos) << s;

  std::vector<uint8_t> chained;
  o.codec = CodecId::kInt8;
  o.chain_zstd = true;
  ASSERT_TRUE(enc.Encode(in.data(), in.size(), DataType::kFloat32, o, &chained).ok());
  s = call(chained);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("zstd-chained"), std::string::npos) << s;

  // The client refuses op max itself; on the wire the gateway refuses it too.
  s = call(good, ReduceOp::kMax);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s;
  Message m;
  m.type = MessageType::kAllReduceFrame;
  m.job = "job";
  m.tensor_key = "w";
  m.data = good;
  auto bytes = EncodeMessage(m);
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  // The op byte: length(4), type(1), job(2+3), key(2+1).
  (*bytes)[4 + 1 + 5 + 3] = static_cast<uint8_t>(ReduceOp::kMax);
  auto raw = us.SendRawForTest(*bytes, Deadline::AfterSeconds(5));
  ASSERT_TRUE(raw.ok()) << raw.status();
  EXPECT_EQ(raw->code, StatusCode::kInvalidArgument) << raw->text;
  EXPECT_NE(raw->text.find("op max is not supported"), std::string::npos) << raw->text;

  std::vector<uint8_t> int4;
  o.codec = CodecId::kInt4;
  o.chain_zstd = false;
  ASSERT_TRUE(enc.Encode(in.data(), in.size(), DataType::kFloat32, o, &int4).ok());
  s = call(int4);
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition) << s;
  EXPECT_NE(s.message().find("gives int8 for this tensor, but the frame is int4"),
            std::string::npos)
      << s;

  RegisterBoth("autojob", "auto");
  s = call(good, ReduceOp::kSum, "autojob");
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition) << s;
  EXPECT_NE(s.message().find("auto chooses codecs per link"), std::string::npos) << s;
  EXPECT_EQ(out, std::vector<uint8_t>{42});  // untouched on error

  // Still serving: both ranks' good frames all-reduce.
  std::vector<std::vector<float>> residuals(2, std::vector<float>(512, 0.0f));
  std::vector<std::vector<uint8_t>> results;
  std::vector<double> ref;
  RunStep(clients_, "job", "after", CodecId::kInt8, 256, ReduceOp::kSum, 512, 0, residuals,
          &results, &ref);
  EXPECT_TRUE(results[0] == results[1]);
  const std::string stats = gateways_[0]->StatsText();
  EXPECT_NE(stats.find("bad_requests 6\n"), std::string::npos) << stats;
  EXPECT_NE(stats.find("allreduce_ok 1\n"), std::string::npos) << stats;
}

}  // namespace
}  // namespace strait::gateway

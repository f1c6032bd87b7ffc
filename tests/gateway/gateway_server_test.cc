// The gateway's local server in one process (its only peer never comes up): the hello, job
// registration, stats, credential checks, socket mode, and bad requests that get an error while
// the gateway keeps serving.
#include "gateway/gateway.h"

#include <gtest/gtest.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <set>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "collective/net_transport.h"
#include "common/clock.h"
#include "net/link.h"
#include "localproto/client.h"
#include "gateway_fixtures.h"

namespace strait::gateway {

// The local protocol and its client (strait::localproto), which these tests drive.
using namespace strait::localproto;  // NOLINT(build/namespaces)
namespace {

TEST_F(GatewayServer, ServesHelloRegisterAndStats) {
  StartGateway();
  struct stat st {};
  ASSERT_EQ(::stat(config_.local_socket.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0660u);

  auto client = Client::Connect(config_.local_socket, Deadline::AfterSeconds(5), "test");
  ASSERT_TRUE(client.ok()) << client.status();
  auto policy = (*client)->RegisterJob("job", "int8,ef", Deadline::AfterSeconds(5));
  ASSERT_TRUE(policy.ok()) << policy.status();
  EXPECT_EQ(policy->rfind("int8+ef", 0), 0u) << *policy;

  auto clamped = (*client)->RegisterJob("job2", "int4", Deadline::AfterSeconds(5));
  ASSERT_TRUE(clamped.ok());
  EXPECT_EQ(clamped->rfind("int4", 0), 0u) << *clamped;

  auto stats = (*client)->Stats(Deadline::AfterSeconds(5));
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_NE(stats->find("connections 1\n"), std::string::npos) << *stats;
}

TEST_F(GatewayServer, BadRequestsGetErrorsAndTheGatewayKeepsServing) {
  StartGateway();
  auto client = Client::Connect(config_.local_socket, Deadline::AfterSeconds(5));
  ASSERT_TRUE(client.ok()) << client.status();

  auto bad_policy = (*client)->RegisterJob("job", "int3", Deadline::AfterSeconds(5));
  EXPECT_EQ(bad_policy.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bad_policy.status().message().find("unknown codec \"int3\""), std::string::npos);

  float data[4] = {1, 2, 3, 4};
  Status s = (*client)->AllReduce("nojob", "w", DataType::kFloat32, ReduceOp::kSum, data, 4,
                                  Deadline::AfterSeconds(5));
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition) << s;
  EXPECT_NE(s.message().find("not registered"), std::string::npos) << s;

  // A well-framed body with an unknown type: an error reply, and the connection survives.
  auto raw = (*client)->SendRawForTest({1, 0, 0, 0, 99}, Deadline::AfterSeconds(5));
  ASSERT_TRUE(raw.ok()) << raw.status();
  EXPECT_EQ(raw->code, StatusCode::kInvalidArgument);
  EXPECT_NE(raw->text.find("unknown local message type 99"), std::string::npos) << raw->text;

  // The peer region never comes up: the all-reduce fails by its deadline, clearly (in the join
  // that the client makes before the job's first all-reduce).
  ASSERT_TRUE((*client)->RegisterJob("job", "zstd", Deadline::AfterSeconds(5)).ok());
  s = (*client)->AllReduce("job", "w", DataType::kFloat32, ReduceOp::kSum, data, 4,
                           Deadline::After(300'000'000));
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("eu"), std::string::npos) << s;
  EXPECT_EQ(data[0], 1.0f);  // untouched on error

  auto stats = (*client)->Stats(Deadline::AfterSeconds(5));
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_NE(stats->find("bad_requests 3\n"), std::string::npos) << *stats;
  EXPECT_NE(stats->find("join_failed 1\n"), std::string::npos) << *stats;

  // A frame length above the limit breaks the framing: an error reply, then the connection
  // closes; a new client is served as before.
  raw = (*client)->SendRawForTest({0xff, 0xff, 0xff, 0x7f}, Deadline::AfterSeconds(5));
  ASSERT_TRUE(raw.ok()) << raw.status();
  EXPECT_EQ(raw->code, StatusCode::kResourceExhausted);
  auto again = Client::Connect(config_.local_socket, Deadline::AfterSeconds(5));
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_TRUE((*again)->Stats(Deadline::AfterSeconds(5)).ok());
}

TEST_F(GatewayServer, RefusesCredentialsNotConfigured) {
  config_.allowed_uids = {::getuid() + 1};
  config_.allowed_gids = {::getgid() + 1};
  StartGateway();
  auto client = Client::Connect(config_.local_socket, Deadline::AfterSeconds(5));
  ASSERT_FALSE(client.ok());
  EXPECT_EQ(client.status().code(), StatusCode::kPermissionDenied) << client.status();
  EXPECT_NE(client.status().message().find("local.allowed_uids"), std::string::npos);
  EXPECT_NE(gateway_->StatsText().find("refused_connections 1\n"), std::string::npos);
}

// Dials the gateway's Unix socket without speaking; -1 on failure.
int DialUnix(const std::string& path) {
  const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  std::strncpy(a.sun_path, path.c_str(), sizeof(a.sun_path) - 1);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

// Silent connections of a refused uid used to hold the accept loop for a second each (it waited
// for their hello before refusing): 20 of them delayed the next client by 19 s.
TEST_F(GatewayServer, SilentRefusedConnectionsDoNotDelayTheNextClient) {
  config_.allowed_uids = {::getuid() + 1};
  config_.allowed_gids = {::getgid() + 1};
  StartGateway();
  std::vector<int> silent;
  for (int i = 0; i < 20; ++i) silent.push_back(DialUnix(config_.local_socket));
  const auto t0 = std::chrono::steady_clock::now();
  auto client = Client::Connect(config_.local_socket, Deadline::AfterSeconds(30));
  const double s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ASSERT_FALSE(client.ok());
  EXPECT_EQ(client.status().code(), StatusCode::kPermissionDenied) << client.status();
  EXPECT_LT(s, 5.0) << "the refusal waited for the silent connections";
  for (int fd : silent) ::close(fd);
}

// Before its hello, a client may not make the gateway reserve a large frame: a bare 256 MiB
// length prefix is refused at once (it used to be allocated, then waited on for 30 s).
TEST_F(GatewayServer, ALargeLengthPrefixBeforeTheHelloIsRefusedAtOnce) {
  StartGateway();
  const int fd = DialUnix(config_.local_socket);
  ASSERT_GE(fd, 0);
  const uint32_t len = 256u << 20;
  uint8_t prefix[4];
  std::memcpy(prefix, &len, 4);  // little-endian, as the protocol's length prefix
  ASSERT_EQ(::send(fd, prefix, 4, MSG_NOSIGNAL), 4);
  const auto t0 = std::chrono::steady_clock::now();
  std::string answer;
  char buf[512];
  for (;;) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, 10'000) <= 0) break;
    const ssize_t n = ::recv(fd, buf, sizeof(buf), 0);
    if (n <= 0) break;
    answer.append(buf, static_cast<size_t>(n));
  }
  const double s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ::close(fd);
  EXPECT_NE(answer.find("65536"), std::string::npos) << "no error naming the limit: " << answer;
  EXPECT_LT(s, 5.0);
  auto again = Client::Connect(config_.local_socket, Deadline::AfterSeconds(5));
  ASSERT_TRUE(again.ok()) << again.status();
}

TEST_F(GatewayServer, ShutdownRemovesTheSocket) {
  StartGateway();
  gateway_->Shutdown(Deadline::AfterSeconds(1));
  EXPECT_NE(::access(config_.local_socket.c_str(), F_OK), 0);
  auto client = Client::Connect(config_.local_socket, Deadline::After(100'000'000));
  EXPECT_EQ(client.status().code(), StatusCode::kUnavailable);
}

TEST(OperationId, StableAndDistinct) {
  EXPECT_EQ(OperationId("job", "w", 0), OperationId("job", "w", 0));
  EXPECT_NE(OperationId("job", "w", 0), OperationId("job", "w", 1));
  EXPECT_NE(OperationId("ab", "c", 0), OperationId("a", "bc", 0));
  EXPECT_LT(OperationId("job", "w", 7), uint64_t{1} << 38);
}

// A job's op ids carry its lane (NetTransport sends each job on its own link channel, so jobs
// share links round-robin); the lanes spread over the channels.
TEST(OperationId, CarriesTheJobsLane) {
  std::set<uint32_t> lanes;
  for (int j = 0; j < 64; ++j) {
    const std::string job = "job-" + std::to_string(j);
    const uint32_t lane = JobLane(job);
    ASSERT_LT(lane, collective::kCollectiveChannelCount);
    lanes.insert(lane);
    for (uint64_t seq = 0; seq < 5; ++seq) {
      const uint64_t id = OperationId(job, "layer" + std::to_string(seq), seq);
      EXPECT_EQ(id % collective::kCollectiveChannelCount, lane) << job;
      EXPECT_LT(id, uint64_t{1} << 38);
    }
  }
  EXPECT_GE(lanes.size(), collective::kCollectiveChannelCount / 2);
}

}  // namespace
}  // namespace strait::gateway

namespace strait::gateway {
namespace {

TEST_F(GatewayServer, ShutdownLetsAnInFlightAllReduceAnswer) {
  StartGateway();
  auto client = Client::Connect(config_.local_socket, Deadline::AfterSeconds(5));
  ASSERT_TRUE(client.ok()) << client.status();
  ASSERT_TRUE((*client)->RegisterJob("job", "none", Deadline::AfterSeconds(5)).ok());
  Status result;
  std::thread op([&] {
    float data[2] = {1, 2};
    result = (*client)->AllReduce("job", "w", DataType::kFloat32, ReduceOp::kSum, data, 2,
                                  Deadline::AfterSeconds(20));
  });
  // Wait until the gateway counts it in flight, then stop.
  const Deadline until = Deadline::AfterSeconds(5);
  while (gateway_->StatsText().find("in_flight 1\n") == std::string::npos && !until.Expired()) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  ASSERT_NE(gateway_->StatsText().find("in_flight 1\n"), std::string::npos);
  gateway_->Shutdown(Deadline::AfterSeconds(5));
  op.join();
  // The operation got the gateway's own answer (its peer never came), not a dropped connection.
  EXPECT_EQ(result.code(), StatusCode::kUnavailable) << result;
  EXPECT_NE(result.message().find("no link yet"), std::string::npos) << result;
}

}  // namespace
}  // namespace strait::gateway

namespace strait::gateway {
namespace {

// A peer that the endpoint admits (right region) but whose fresh links die before they carry
// anything -- a broken or hostile gateway of that region reconnecting again and again -- must
// not replace the link that works: the next all-reduce goes through at once.
TEST_F(GatewayPair, LinksThatDieBeforeTheirFirstMessageDoNotReplaceTheWorkingOne) {
  StartBoth();
  ASSERT_EQ(AllReduceBoth("before", 1000), 0u);
  for (int i = 0; i < 5; ++i) {
    net::EndpointOptions o;
    o.region = "eu";
    o.transport = net::Transport::kPlainTcp;
    o.peer_regions = {"us"};
    auto impostor = net::Endpoint::Create(o, [](std::shared_ptr<net::Link>) {
      return net::MessageCallback([](uint32_t, std::vector<uint8_t>) {});
    });
    ASSERT_TRUE(impostor.ok()) << impostor.status();
    auto link = (*impostor)->Connect("us", "127.0.0.1", gateway_->wan_port(),
                                     [](uint32_t, std::vector<uint8_t>) {});
    ASSERT_TRUE(link.ok()) << link.status();
    ASSERT_TRUE((*link)->WaitForStreams(1, Deadline::AfterSeconds(5)).ok());
    link->reset();
    impostor->reset();  // the link ends without a message
  }
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(AllReduceBoth("after", 1000), 0u);
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 10.0);
}

TEST_F(GatewayPair, ManySizesOnOneConnection) {
  StartBoth();
  // Up, down, up again past the first peak, and the odd sizes in between.
  const std::vector<size_t> counts = {1, 3, 200000, 7, 1000, 1 << 20, 12345, 0, 1 << 20, 5};
  for (size_t k = 0; k < counts.size(); ++k) {
    EXPECT_EQ(AllReduceBoth("t" + std::to_string(k), counts[k]), 0u) << "step " << k;
  }
  EXPECT_NE(gateway_->StatsText().find("allreduce_ok " + std::to_string(counts.size()) + "\n"),
            std::string::npos)
      << gateway_->StatsText();
}

TEST_F(GatewayPair, ErrorsBetweenRequestsLeaveTheConnectionWorking) {
  StartBoth();
  Client& us = *clients_[0];
  EXPECT_EQ(AllReduceBoth("big", 300000), 0u);

  // A gateway error after a large request: no data comes back, the caller's buffer is untouched.
  std::vector<float> data(1000, 1.0f);
  Status s = us.AllReduce("nojob", "w", DataType::kFloat32, ReduceOp::kSum, data.data(),
                          data.size(), Deadline::AfterSeconds(5));
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition) << s;
  EXPECT_EQ(data[999], 1.0f);

  // A well-framed all-reduce whose data does not match its count: an error reply, and the
  // connection goes on.
  Message bad;
  bad.type = MessageType::kAllReduce;
  bad.job = "job";
  bad.tensor_key = "w";
  bad.count = 2;
  auto head = EncodeMessageHead(bad, 8);
  ASSERT_TRUE(head.ok());
  std::vector<uint8_t> frame = *head;
  frame.insert(frame.end(), 12, 0);  // 12 data bytes; the length prefix says 8
  frame[0] = static_cast<uint8_t>(frame.size() - 4);
  auto raw = us.SendRawForTest(frame, Deadline::AfterSeconds(5));
  ASSERT_TRUE(raw.ok()) << raw.status();
  EXPECT_EQ(raw->code, StatusCode::kInvalidArgument) << raw->text;
  EXPECT_TRUE(raw->data.empty());

  // A client that dies in the middle of a large frame costs only its own connection.
  {
    auto dying = Client::Connect(config_.local_socket, Deadline::AfterSeconds(5));
    ASSERT_TRUE(dying.ok());
    // Declares a 1 MiB body, sends 1000 bytes of it and goes away (the read fails).
    std::vector<uint8_t> cut = {0, 0, 0x10, 0};
    cut.resize(4 + 1000, 0xee);
    auto answer = (*dying)->SendRawForTest(cut, Deadline::After(200'000'000));
    EXPECT_FALSE(answer.ok());
  }

  // Both connections still serve, larger and smaller than before, with right answers.
  EXPECT_EQ(AllReduceBoth("after1", 1 << 20), 0u);
  EXPECT_EQ(AllReduceBoth("after2", 33), 0u);
  const std::string stats = gateway_->StatsText();
  EXPECT_NE(stats.find("allreduce_ok 3\n"), std::string::npos) << stats;
}

// Regions whose gateways cut chunks differently (another allreduce.chunk_elements, or a straitd
// of another default) would pair chunks that do not line up: every step fails instead, on both
// sides, with an error naming the chunk sizes and what to change, long before the deadline.
TEST_F(GatewayPair, GatewaysThatCutChunksDifferentlyFailEveryStepSayingSo) {
  config_.chunk_elements = collective::kDefaultChunkElements;
  eu_chunk_elements_ = config_.chunk_elements / 2;
  StartBoth();
  for (size_t count : {size_t{1} << 20, size_t{1000}}) {
    std::vector<float> data[2];
    Status status[2];
    std::vector<std::thread> threads;
    const int64_t start = MonotonicNanos();
    for (int c = 0; c < 2; ++c) {
      data[c].assign(count, 1.0f);
      threads.emplace_back([&, c] {
        status[c] = clients_[static_cast<size_t>(c)]->AllReduce(
            "job", "w" + std::to_string(count), DataType::kFloat32, ReduceOp::kSum,
            data[c].data(), count, Deadline::AfterSeconds(20));
      });
    }
    for (auto& t : threads) t.join();
    EXPECT_LT(MonotonicNanos() - start, int64_t{10'000'000'000}) << count;
    for (int c = 0; c < 2; ++c) {
      const Status& s = status[c];
      EXPECT_FALSE(s.ok()) << count;
      EXPECT_NE(s.message().find("chunk=" + std::to_string(config_.chunk_elements)),
                std::string::npos)
          << s;
      EXPECT_NE(s.message().find("chunk=" + std::to_string(eu_chunk_elements_)),
                std::string::npos)
          << s;
      EXPECT_NE(s.message().find("allreduce.chunk_elements"), std::string::npos) << s;
      EXPECT_EQ(data[c][count - 1], 1.0f) << "a failed step leaves the tensor as it was";
    }
  }
}

// Result recovery (kFetchResult): a rank whose gateway was killed after the step committed, and
// before the rank read its reply, gets the result from the restarted gateway, which asks the
// other region; a step that no region committed is kNotFound.
TEST_F(GatewayPair, ARestartedGatewayRecoversACommittedStepFromItsPeer) {
  StartBoth();
  ASSERT_EQ(AllReduceBoth("w", 1000), 0u);
  const auto [generation, sequence] = clients_[1]->LastIdentity("job");
  ASSERT_EQ(generation, 1u);
  ASSERT_EQ(sequence, 0u);
  auto own = clients_[0]->FetchResult("job", generation, sequence, Deadline::AfterSeconds(5));
  ASSERT_TRUE(own.ok()) << own.status();
  ASSERT_EQ(own->size(), 1000 * sizeof(float));
  for (size_t i = 0; i < 1000; ++i) {
    float v;
    std::memcpy(&v, own->data() + i * sizeof(float), sizeof(v));
    ASSERT_EQ(v, float(3 + 2 * static_cast<int>(i % 5))) << i;
  }
  // "eu" restarts: nothing of the job is left there.
  clients_.pop_back();
  eu_.reset();
  auto g = Gateway::Start(eu_config_);
  ASSERT_TRUE(g.ok()) << g.status();
  eu_ = std::move(g).value();
  auto c = Client::Connect(eu_config_.local_socket, Deadline::AfterSeconds(5), "recovering");
  ASSERT_TRUE(c.ok()) << c.status();
  ASSERT_TRUE((*c)->RegisterJob("job", "none", Deadline::AfterSeconds(5)).ok());
  auto got = (*c)->FetchResult("job", generation, sequence, Deadline::AfterSeconds(10));
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_TRUE(*got == *own) << "the recovered result differs from the committed one";
  auto none = (*c)->FetchResult("job", generation, sequence + 1, Deadline::AfterSeconds(10));
  EXPECT_EQ(none.status().code(), StatusCode::kNotFound) << none.status();
  EXPECT_NE(none.status().message().find("failed in every region"), std::string::npos)
      << none.status();
}

TEST_F(GatewayPair, OversizedFrameIsRefusedAndOthersGoOn) {
  StartBoth();
  EXPECT_EQ(AllReduceBoth("before", 4096), 0u);
  auto other = Client::Connect(config_.local_socket, Deadline::AfterSeconds(5));
  ASSERT_TRUE(other.ok());
  // One byte over the gateway's limit: refused from the length alone, then the connection closes.
  const uint32_t len = kDefaultMaxMessageBytes + 1;
  const std::vector<uint8_t> over = {uint8_t(len), uint8_t(len >> 8), uint8_t(len >> 16),
                                     uint8_t(len >> 24)};
  auto raw = (*other)->SendRawForTest(over, Deadline::AfterSeconds(5));
  ASSERT_TRUE(raw.ok()) << raw.status();
  EXPECT_EQ(raw->code, StatusCode::kResourceExhausted) << raw->text;
  // The client refuses to send over the limit itself, before it reads the data (the buffer is
  // one byte: a read of the claimed count would be out of bounds, which ASan reports): on the
  // socket over the frame limit, through shared memory over the largest region.
  uint8_t huge[1] = {0};
  clients_[0]->UseSharedMemory(false);
  Status s = clients_[0]->AllReduce("job", "huge", DataType::kUint8, ReduceOp::kSum, huge,
                                    kDefaultMaxMessageBytes, Deadline::AfterSeconds(5));
  EXPECT_EQ(s.code(), StatusCode::kResourceExhausted) << s;
  clients_[0]->UseSharedMemory(true);
  s = clients_[0]->AllReduce("job", "huge", DataType::kUint8, ReduceOp::kSum, huge,
                             kMaxShmBytes + 1, Deadline::AfterSeconds(5));
  EXPECT_EQ(s.code(), StatusCode::kResourceExhausted) << s;
  EXPECT_EQ(AllReduceBoth("after", 4096), 0u);
}

}  // namespace
}  // namespace strait::gateway

// The C API's boundary (libstrait.so, linked as a user would): every bad argument gets its code
// and a last error that names the argument, before any work starts; the version; the exported
// symbols; and, with gateways running in this process (single-region, plain TCP on loopback, no
// root needed), live comms: a 1-rank comm and a region of 2 ranks as threads, results exact,
// disagreeing ranks failing the comm with clear errors.
#include <arpa/inet.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "gateway/gateway.h"
#include "strait/strait.h"
#include "strait/strait.hpp"

namespace strait::api {
namespace {

using ::testing::HasSubstr;

std::string LastError() {
  return strait_last_error();
}

#define EXPECT_BAD_ARG(call, name)                             \
  do {                                                         \
    EXPECT_EQ((call), STRAIT_ERROR_INVALID_ARGUMENT) << #call; \
    EXPECT_THAT(LastError(), HasSubstr(name)) << #call;        \
  } while (false)

TEST(StraitApi, VersionIsTheProjectVersion) {
  int major = -1, minor = -1, patch = -1;
  ASSERT_EQ(strait_version(&major, &minor, &patch), STRAIT_SUCCESS);
  EXPECT_EQ(major, STRAIT_TEST_VERSION_MAJOR);
  EXPECT_EQ(minor, STRAIT_TEST_VERSION_MINOR);
  EXPECT_EQ(patch, STRAIT_TEST_VERSION_PATCH);
  int only_minor = -1;
  ASSERT_EQ(strait_version(nullptr, &only_minor, nullptr), STRAIT_SUCCESS);
  EXPECT_EQ(only_minor, STRAIT_TEST_VERSION_MINOR);
  EXPECT_BAD_ARG(strait_version(nullptr, nullptr, nullptr), "major, minor and patch");
}

TEST(StraitApi, ResultStringsAndLastErrorPerThread) {
  EXPECT_STREQ(strait_result_string(STRAIT_SUCCESS), "STRAIT_SUCCESS");
  EXPECT_STREQ(strait_result_string(STRAIT_ERROR_UNSUPPORTED), "STRAIT_ERROR_UNSUPPORTED");
  EXPECT_STREQ(strait_result_string(STRAIT_ERROR_COMM_FAILED), "STRAIT_ERROR_COMM_FAILED");
  EXPECT_STREQ(strait_result_string(static_cast<strait_result_t>(99)), "unknown");
  EXPECT_BAD_ARG(strait_host_config_init(nullptr), "config is NULL");
  // Another thread has its own (empty) last error.
  std::string other = "unset";
  std::thread([&] { other = strait_last_error(); }).join();
  EXPECT_EQ(other, "");
  EXPECT_THAT(LastError(), HasSubstr("config is NULL"));
}

TEST(StraitApi, OnlyTheCFunctionsAreExported) {
  const std::string cmd = std::string("nm -D --defined-only ") + STRAIT_API_LIB_PATH;
  FILE* pipe = popen(cmd.c_str(), "r");
  ASSERT_NE(pipe, nullptr);
  std::set<std::string> names;
  char line[1024];
  while (fgets(line, sizeof(line), pipe) != nullptr) {
    std::string s(line);
    while (!s.empty() && (s.back() == '\n' || s.back() == '\r')) s.pop_back();
    names.insert(s.substr(s.rfind(' ') + 1));
  }
  ASSERT_EQ(pclose(pipe), 0) << cmd;
  const std::set<std::string> expected = {"strait_host_config_init", "strait_comm_init_host",
                                          "strait_comm_init_nccl",   "strait_allreduce",
                                          "strait_allreduce_keyed",  "strait_comm_rank",
                                          "strait_comm_destroy",     "strait_version",
                                          "strait_last_error",       "strait_result_string"};
  EXPECT_EQ(names, expected);
}

// A config that passes validation; its gateway socket does not exist.
struct ValidConfig : HostConfig {
  ValidConfig() {
    region = "us-east";
    rank = 0;
    nranks = 1;
    root_address = "127.0.0.1:1";
    gateway = "/nonexistent/strait-api-test.sock";
    job_id = "job-1";
    compression = "int8,ef";
    timeout_ms = 2000;
  }
};

// Calls strait_comm_init_host with `cfg` and checks that *comm is reset to NULL.
strait_result_t Init(const strait_host_config_t& cfg) {
  strait_comm_t comm = reinterpret_cast<strait_comm_t>(uintptr_t{0x1234});
  const strait_result_t r = strait_comm_init_host(&comm, &cfg);
  EXPECT_EQ(comm, nullptr);
  return r;
}

TEST(StraitApi, InitHostRejectsEveryBadArgument) {
  ::unsetenv("STRAIT_REGION");
  ::unsetenv("STRAIT_GATEWAY");
  ::unsetenv("STRAIT_JOB_ID");
  ::unsetenv("STRAIT_COMPRESSION");
  ValidConfig ok;
  EXPECT_BAD_ARG(strait_comm_init_host(nullptr, &ok), "comm is NULL");
  strait_comm_t comm = nullptr;
  EXPECT_BAD_ARG(strait_comm_init_host(&comm, nullptr), "config is NULL");

  struct Mutation {
    const char* name;  // what the error must name
    void (*apply)(strait_host_config_t*);
  };
  const Mutation mutations[] = {
      {"struct_size", [](strait_host_config_t* c) { c->struct_size = 8; }},
      {"config->region is NULL", [](strait_host_config_t* c) { c->region = nullptr; }},
      {"config->region 'US East'", [](strait_host_config_t* c) { c->region = "US East"; }},
      {"config->nranks", [](strait_host_config_t* c) { c->nranks = 0; }},
      {"config->rank -1", [](strait_host_config_t* c) { c->rank = -1; }},
      {"config->rank 2",
       [](strait_host_config_t* c) {
         c->nranks = 2;
         c->rank = 2;
       }},
      {"config->root_address is NULL",
       [](strait_host_config_t* c) {
         c->nranks = 2;
         c->root_address = nullptr;
       }},
      {"config->root_address 'rank0'",
       [](strait_host_config_t* c) {
         c->nranks = 2;
         c->root_address = "rank0";
       }},
      {"config->root_address '10.0.0.1'",
       [](strait_host_config_t* c) {
         c->nranks = 2;
         c->root_address = "10.0.0.1";
       }},
      {"config->root_address '10.0.0.1:0'",
       [](strait_host_config_t* c) {
         c->nranks = 2;
         c->root_address = "10.0.0.1:0";
       }},
      {"config->gateway is NULL", [](strait_host_config_t* c) { c->gateway = nullptr; }},
      {"config->gateway 'straitd.sock'",
       [](strait_host_config_t* c) { c->gateway = "straitd.sock"; }},
      {"config->job_id is NULL", [](strait_host_config_t* c) { c->job_id = nullptr; }},
      {"config->job_id 'job 1'", [](strait_host_config_t* c) { c->job_id = "job 1"; }},
      // A control character is shown escaped, a long value cut with its length.
      {"config->job_id 'job\\x1b[2J'", [](strait_host_config_t* c) { c->job_id = "job\x1b[2J"; }},
      {"(5000 bytes; the first 80 shown) is not a region name",
       [](strait_host_config_t* c) {
         static const std::string kLong(5000, 'a');
         c->region = kLong.c_str();
       }},
      {"config->compression 'int9'", [](strait_host_config_t* c) { c->compression = "int9"; }},
      {"config->timeout_ms", [](strait_host_config_t* c) { c->timeout_ms = 0; }},
      {"config->shard is -2", [](strait_host_config_t* c) { c->shard = -2; }},
      {"config->shard is 4096", [](strait_host_config_t* c) { c->shard = 4096; }},
  };
  for (const Mutation& m : mutations) {
    ValidConfig cfg;
    m.apply(&cfg);
    EXPECT_EQ(Init(cfg), STRAIT_ERROR_INVALID_ARGUMENT) << m.name;
    EXPECT_THAT(LastError(), HasSubstr(m.name));
    EXPECT_THAT(LastError(), HasSubstr("strait_comm_init_host"));
  }
}

TEST(StraitApi, InitHostTakesUnsetFieldsFromTheEnvironment) {
  ValidConfig cfg;
  cfg.region = nullptr;
  cfg.job_id = nullptr;
  cfg.compression = nullptr;
  ::setenv("STRAIT_REGION", "eu-west", 1);
  ::setenv("STRAIT_JOB_ID", "job-env", 1);
  ::setenv("STRAIT_COMPRESSION", "zstd:3", 1);
  // Valid arguments: the failure is the missing gateway, naming its socket and the region.
  EXPECT_EQ(Init(cfg), STRAIT_ERROR_UNAVAILABLE) << LastError();
  EXPECT_THAT(LastError(), HasSubstr("/nonexistent/strait-api-test.sock"));
  EXPECT_THAT(LastError(), HasSubstr("eu-west"));
  ::setenv("STRAIT_COMPRESSION", "lz4", 1);
  EXPECT_EQ(Init(cfg), STRAIT_ERROR_INVALID_ARGUMENT);
  EXPECT_THAT(LastError(), HasSubstr("config->compression 'lz4'"));
  ::unsetenv("STRAIT_REGION");
  ::unsetenv("STRAIT_JOB_ID");
  ::unsetenv("STRAIT_COMPRESSION");
  // STRAIT_SHARD (read by a 1-rank comm that names no shard) must be a shard index.
  ValidConfig one;
  EXPECT_EQ(one.shard, -1);  // strait_host_config_init's default
  ::setenv("STRAIT_SHARD", "three", 1);
  EXPECT_EQ(Init(one), STRAIT_ERROR_INVALID_ARGUMENT);
  EXPECT_THAT(LastError(), HasSubstr("STRAIT_SHARD is 'three'"));
  ::setenv("STRAIT_SHARD", "3", 1);
  EXPECT_EQ(Init(one), STRAIT_ERROR_UNAVAILABLE) << LastError();  // valid: the gateway is missing
  ::unsetenv("STRAIT_SHARD");
  // STRAIT_LOCAL_SHM is 0 or 1.
  ::setenv("STRAIT_LOCAL_SHM", "yes", 1);
  EXPECT_EQ(Init(one), STRAIT_ERROR_INVALID_ARGUMENT);
  EXPECT_THAT(LastError(), HasSubstr("STRAIT_LOCAL_SHM='yes'"));
  ::setenv("STRAIT_LOCAL_SHM", "0", 1);
  EXPECT_EQ(Init(one), STRAIT_ERROR_UNAVAILABLE) << LastError();
  ::unsetenv("STRAIT_LOCAL_SHM");
}

// strait_comm_init_nccl checks its arguments before it touches the NCCL communicator, in every
// build (the handle below is never dereferenced: each call has one bad argument).
TEST(StraitApi, NcclInitRejectsBadArgumentsFirst) {
  ::unsetenv("STRAIT_REGION");
  ::unsetenv("STRAIT_GATEWAY");
  ::unsetenv("STRAIT_JOB_ID");
  ::unsetenv("STRAIT_COMPRESSION");
  strait_comm_t comm = reinterpret_cast<strait_comm_t>(uintptr_t{0x1234});
  auto* fake = reinterpret_cast<struct ncclComm*>(uintptr_t{0x5678});
  EXPECT_BAD_ARG(strait_comm_init_nccl(nullptr, fake, nullptr, nullptr, nullptr, nullptr),
                 "comm is NULL");
  EXPECT_BAD_ARG(strait_comm_init_nccl(&comm, nullptr, nullptr, nullptr, nullptr, nullptr),
                 "nccl_comm is NULL");
  EXPECT_EQ(comm, nullptr);
  comm = reinterpret_cast<strait_comm_t>(uintptr_t{0x1234});
  EXPECT_BAD_ARG(strait_comm_init_nccl(&comm, fake, nullptr, "/run/s.sock", "job", "none"),
                 "region is NULL and STRAIT_REGION is unset");
  EXPECT_EQ(comm, nullptr);
  EXPECT_BAD_ARG(strait_comm_init_nccl(&comm, fake, "US East", "/run/s.sock", "job", "none"),
                 "region 'US East'");
  EXPECT_BAD_ARG(strait_comm_init_nccl(&comm, fake, "us-east", nullptr, "job", "none"),
                 "gateway is NULL and STRAIT_GATEWAY is unset");
  EXPECT_BAD_ARG(strait_comm_init_nccl(&comm, fake, "us-east", "run/s.sock", "job", "none"),
                 "gateway 'run/s.sock'");
  EXPECT_BAD_ARG(strait_comm_init_nccl(&comm, fake, "us-east", "/run/s.sock", nullptr, "none"),
                 "job_id is NULL and STRAIT_JOB_ID is unset");
  EXPECT_BAD_ARG(strait_comm_init_nccl(&comm, fake, "us-east", "/run/s.sock", "job 1", "none"),
                 "job_id 'job 1'");
  EXPECT_BAD_ARG(strait_comm_init_nccl(&comm, fake, "us-east", "/run/s.sock", "job", "lz4"),
                 "compression 'lz4'");
  // NULL strings come from the environment, as for the host backend.
  ::setenv("STRAIT_REGION", "Bad Region", 1);
  EXPECT_BAD_ARG(strait_comm_init_nccl(&comm, fake, nullptr, "/run/s.sock", "job", nullptr),
                 "region 'Bad Region'");
  ::setenv("STRAIT_REGION", "us-east", 1);
  ::setenv("STRAIT_COMPRESSION", "lz4", 1);
  EXPECT_BAD_ARG(strait_comm_init_nccl(&comm, fake, nullptr, "/run/s.sock", "job", nullptr),
                 "compression 'lz4'");
  EXPECT_EQ(comm, nullptr);
  ::unsetenv("STRAIT_REGION");
  ::unsetenv("STRAIT_COMPRESSION");
}

// A library built without CUDA/NCCL says so for a valid call and leaves *comm NULL; one built
// with them runs the backend (tests/api/nccl_backend_test.cc, on a GPU).
TEST(StraitApi, NcclInitWithoutTheGpuBackendIsUnsupported) {
#if STRAIT_TEST_NCCL_BACKEND
  GTEST_SKIP() << "libstrait was built with the GPU backend (CUDA and NCCL found); "
                  "nccl_backend_test (label gpu) covers strait_comm_init_nccl there";
#else
  strait_comm_t comm = reinterpret_cast<strait_comm_t>(uintptr_t{0x1234});
  auto* fake = reinterpret_cast<struct ncclComm*>(uintptr_t{0x5678});
  EXPECT_EQ(strait_comm_init_nccl(&comm, fake, "us-east", "/run/s.sock", "job", "none"),
            STRAIT_ERROR_UNSUPPORTED);
  EXPECT_EQ(comm, nullptr);
  EXPECT_THAT(LastError(), HasSubstr("built without CUDA/NCCL"));
  // The C++ wrapper returns the same as a Status.
  auto wrapped = strait::Comm::InitNccl(fake, "us-east", "/run/s.sock", "job", "none");
  ASSERT_FALSE(wrapped.ok());
  EXPECT_EQ(wrapped.status().code(), strait::StatusCode::kUnimplemented);
  EXPECT_THAT(std::string(wrapped.status().message()), HasSubstr("built without CUDA/NCCL"));
#endif
}

TEST(StraitApi, CallsOnAMissingOrForeignCommAreRejected) {
  float x[4] = {};
  EXPECT_BAD_ARG(strait_allreduce(x, x, 4, STRAIT_FLOAT32, STRAIT_SUM, nullptr, nullptr),
                 "comm is NULL");
  // A pointer that is not a comm is never dereferenced.
  auto* garbage = reinterpret_cast<strait_comm_t>(&x[0]);
  EXPECT_BAD_ARG(strait_allreduce(x, x, 4, STRAIT_FLOAT32, STRAIT_SUM, garbage, nullptr),
                 "not a live Strait comm");
  EXPECT_BAD_ARG(strait_comm_destroy(garbage), "not a live Strait comm");
  EXPECT_BAD_ARG(strait_comm_destroy(nullptr), "comm is NULL");
  int r = 0;
  EXPECT_BAD_ARG(strait_comm_rank(garbage, &r, nullptr), "not a live Strait comm");
}

// ---- Live comms against gateways in this process ----------------------------------------------

int FreePort() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(a);
  if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
    ::close(fd);
    return 0;
  }
  ::close(fd);
  return ntohs(a.sin_port);
}

// Gateways of one region with no peer region (the cross-region phase is then the identity), one
// per shard index.
class LiveComm : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/strait-api-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override {
    gateways_.clear();
    ::rmdir(dir_.c_str());
  }
  void StartGateways(int n) {
    for (int i = 0; i < n; ++i) {
      gateway::GatewayConfig c;
      c.file = "test";
      c.region = "solo";
      c.shard_index = i;
      c.local_socket = Socket(i);
      c.allowed_uids = {::getuid()};
      c.wan_listen = {"127.0.0.1", 0};
      c.transport = net::Transport::kPlainTcp;
      c.shutdown_grace_ns = 1'000'000'000;
      auto g = gateway::Gateway::Start(c);
      ASSERT_TRUE(g.ok()) << g.status();
      gateways_.push_back(std::move(g).value());
    }
  }
  std::string Socket(int i) const { return dir_ + "/gw" + std::to_string(i) + ".sock"; }
  HostConfig Config(int rank, int nranks, const std::string& root) {
    HostConfig cfg;
    cfg.region = "solo";
    cfg.rank = rank;
    cfg.nranks = nranks;
    roots_.push_back(root);
    cfg.root_address = roots_.back().c_str();
    sockets_.push_back(Socket(rank));
    cfg.gateway = sockets_.back().c_str();
    cfg.job_id = "job-live";
    cfg.compression = "none";
    cfg.timeout_ms = 10000;
    return cfg;
  }

  std::string dir_;
  std::vector<std::unique_ptr<gateway::Gateway>> gateways_;
  std::vector<std::string> roots_, sockets_;  // keep the configs' strings alive
};

TEST_F(LiveComm, OneRankChecksItsArgumentsAndAllReduces) {
  StartGateways(1);
  roots_.reserve(4);
  sockets_.reserve(4);
  strait_comm_t comm = nullptr;
  HostConfig cfg = Config(0, 1, "");
  cfg.root_address = nullptr;  // one rank: no rendezvous
  ASSERT_EQ(strait_comm_init_host(&comm, &cfg), STRAIT_SUCCESS) << LastError();
  ASSERT_NE(comm, nullptr);
  int rank = -1, nranks = -1;
  ASSERT_EQ(strait_comm_rank(comm, &rank, &nranks), STRAIT_SUCCESS);
  EXPECT_EQ(rank, 0);
  EXPECT_EQ(nranks, 1);
  EXPECT_BAD_ARG(strait_comm_rank(comm, nullptr, nullptr), "rank and nranks");

  std::vector<float> x = {1.5f, -2.25f, 3.0f, 7.0f, 0.125f};
  std::vector<float> y(x.size(), 0.0f);
  auto* stream = reinterpret_cast<CUstream_st*>(uintptr_t{0x10});
  EXPECT_BAD_ARG(strait_allreduce(x.data(), y.data(), 5, STRAIT_FLOAT32, STRAIT_SUM, comm, stream),
                 "stream must be NULL");
  EXPECT_BAD_ARG(strait_allreduce(x.data(), y.data(), 5, static_cast<strait_datatype_t>(99),
                                  STRAIT_SUM, comm, nullptr),
                 "dtype 99");
  EXPECT_BAD_ARG(strait_allreduce(x.data(), y.data(), 5, static_cast<strait_datatype_t>(-1),
                                  STRAIT_SUM, comm, nullptr),
                 "dtype -1");
  EXPECT_BAD_ARG(strait_allreduce(x.data(), y.data(), 5, STRAIT_FLOAT32,
                                  static_cast<strait_redop_t>(42), comm, nullptr),
                 "op 42");
  // 263 = 256 + STRAIT_FLOAT32: must not pass as its low byte.
  EXPECT_BAD_ARG(strait_allreduce(x.data(), y.data(), 5, static_cast<strait_datatype_t>(263),
                                  STRAIT_SUM, comm, nullptr),
                 "dtype 263");
  EXPECT_BAD_ARG(strait_allreduce(x.data(), y.data(), 5, STRAIT_FLOAT32,
                                  static_cast<strait_redop_t>(-3), comm, nullptr),
                 "op -3");
  EXPECT_BAD_ARG(strait_allreduce(nullptr, y.data(), 5, STRAIT_FLOAT32, STRAIT_SUM, comm, nullptr),
                 "sendbuf is NULL");
  EXPECT_BAD_ARG(strait_allreduce(x.data(), nullptr, 5, STRAIT_FLOAT32, STRAIT_SUM, comm, nullptr),
                 "recvbuf is NULL");
  EXPECT_BAD_ARG(
      strait_allreduce(x.data(), x.data() + 1, 4, STRAIT_FLOAT32, STRAIT_SUM, comm, nullptr),
      "overlap");
  EXPECT_BAD_ARG(
      strait_allreduce(x.data(), y.data(), SIZE_MAX / 2, STRAIT_FLOAT32, STRAIT_SUM, comm, nullptr),
      "overflows");
  EXPECT_BAD_ARG(strait_allreduce_keyed(x.data(), y.data(), 5, STRAIT_FLOAT32, STRAIT_SUM, nullptr,
                                        comm, nullptr),
                 "tensor_key is NULL");
  EXPECT_BAD_ARG(
      strait_allreduce_keyed(x.data(), y.data(), 5, STRAIT_FLOAT32, STRAIT_SUM, "", comm, nullptr),
      "tensor_key must be 1-200 bytes");
  const std::string long_key(201, 'k');
  EXPECT_BAD_ARG(strait_allreduce_keyed(x.data(), y.data(), 5, STRAIT_FLOAT32, STRAIT_SUM,
                                        long_key.c_str(), comm, nullptr),
                 "not 201");
  // Rejected calls did nothing: the comm still works, and y is untouched.
  EXPECT_EQ(y, std::vector<float>(5, 0.0f));

  // One region of one rank: the all-reduce is the identity, in place and not.
  ASSERT_EQ(strait_allreduce(x.data(), y.data(), 5, STRAIT_FLOAT32, STRAIT_SUM, comm, nullptr),
            STRAIT_SUCCESS)
      << LastError();
  EXPECT_EQ(y, x);
  std::vector<int32_t> v = {7, -3, 11};
  ASSERT_EQ(strait_allreduce_keyed(v.data(), v.data(), 3, STRAIT_INT32, STRAIT_MAX, "ints", comm,
                                   nullptr),
            STRAIT_SUCCESS)
      << LastError();
  EXPECT_EQ(v, (std::vector<int32_t>{7, -3, 11}));
  EXPECT_EQ(strait_allreduce(nullptr, nullptr, 0, STRAIT_FLOAT32, STRAIT_SUM, comm, nullptr),
            STRAIT_SUCCESS);

  ASSERT_EQ(strait_comm_destroy(comm), STRAIT_SUCCESS);
  EXPECT_BAD_ARG(strait_comm_destroy(comm), "not a live Strait comm");
  EXPECT_BAD_ARG(strait_allreduce(x.data(), y.data(), 5, STRAIT_FLOAT32, STRAIT_SUM, comm, nullptr),
                 "not a live Strait comm");
}

TEST_F(LiveComm, TwoRanksOfARegionReduceInFixedOrderAndFailTogether) {
  StartGateways(2);
  roots_.reserve(4);
  sockets_.reserve(4);
  const std::string root = "127.0.0.1:" + std::to_string(FreePort());
  const HostConfig cfg0 = Config(0, 2, root);
  const HostConfig cfg1 = Config(1, 2, root);
  // The C++ wrapper, one thread per rank (the rendezvous blocks until both joined).
  StatusOr<Comm> c0 = Status(StatusCode::kUnknown, "not run");
  StatusOr<Comm> c1 = Status(StatusCode::kUnknown, "not run");
  std::thread t1([&] { c1 = Comm::InitHost(cfg1); });
  c0 = Comm::InitHost(cfg0);
  t1.join();
  ASSERT_TRUE(c0.ok()) << c0.status();
  ASSERT_TRUE(c1.ok()) << c1.status();
  EXPECT_EQ(c1->rank(), 1);
  EXPECT_EQ(c1->nranks(), 2);

  // fp32 sum of 7 elements (shards of 4 and 3): rank 0's value + rank 1's, rounded once.
  const size_t n = 7;
  std::vector<float> a(n), b(n), ra(n), rb(n);
  for (size_t i = 0; i < n; ++i) {
    a[i] = 1.0f + static_cast<float>(i) * 1e-7f;
    b[i] = 3.0e-8f * static_cast<float>(i + 1);
  }
  Status s1;
  std::thread u1([&] { s1 = c1->AllReduce(b.data(), rb.data(), n, STRAIT_FLOAT32, STRAIT_SUM); });
  Status s0 = c0->AllReduce(a.data(), ra.data(), n, STRAIT_FLOAT32, STRAIT_SUM);
  u1.join();
  ASSERT_TRUE(s0.ok()) << s0;
  ASSERT_TRUE(s1.ok()) << s1;
  for (size_t i = 0; i < n; ++i) {
    EXPECT_EQ(ra[i], a[i] + b[i]) << i;
    EXPECT_EQ(rb[i], ra[i]) << i;
  }

  // int32 avg in place: the sum divided by 2, truncating.
  std::vector<int32_t> ia = {5, -7, 100}, ib = {2, 2, 1};
  std::thread u2([&] { s1 = c1->AllReduce(ib.data(), ib.data(), 3, STRAIT_INT32, STRAIT_AVG); });
  s0 = c0->AllReduce(ia.data(), ia.data(), 3, STRAIT_INT32, STRAIT_AVG);
  u2.join();
  ASSERT_TRUE(s0.ok()) << s0;
  ASSERT_TRUE(s1.ok()) << s1;
  EXPECT_EQ(ia, (std::vector<int32_t>{3, -2, 50}));
  EXPECT_EQ(ib, ia);

  // The ranks disagree on the count: both fail, naming the disagreement or the aborting rank,
  // and the comms refuse further calls.
  std::vector<float> big(9, 1.0f);
  std::thread u3(
      [&] { s1 = c1->AllReduce(big.data(), big.data(), 9, STRAIT_FLOAT32, STRAIT_SUM); });
  s0 = c0->AllReduce(big.data(), big.data(), 8, STRAIT_FLOAT32, STRAIT_SUM);
  u3.join();
  EXPECT_FALSE(s0.ok());
  EXPECT_FALSE(s1.ok());
  const std::string both = s0.ToString() + "\n" + s1.ToString();
  EXPECT_THAT(both, HasSubstr("every rank must issue the same all-reduces")) << both;
  EXPECT_THAT(both, HasSubstr("STRAIT_ERROR_MISMATCH")) << both;
  Status after = c0->AllReduce(a.data(), ra.data(), n, STRAIT_FLOAT32, STRAIT_SUM);
  EXPECT_THAT(after.ToString(), HasSubstr("STRAIT_ERROR_COMM_FAILED")) << after;
  EXPECT_THAT(after.ToString(), HasSubstr("destroy the comm")) << after;
}

TEST_F(LiveComm, ARankThatNeverJoinsFailsTheRendezvousByTheDeadlineNamingIt) {
  StartGateways(1);
  roots_.reserve(2);
  sockets_.reserve(2);
  HostConfig cfg = Config(0, 3, "127.0.0.1:" + std::to_string(FreePort()));
  cfg.timeout_ms = 500;
  strait_comm_t comm = nullptr;
  const auto start = std::chrono::steady_clock::now();
  EXPECT_EQ(strait_comm_init_host(&comm, &cfg), STRAIT_ERROR_TIMEOUT) << LastError();
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(20));
  EXPECT_EQ(comm, nullptr);
  EXPECT_THAT(LastError(), HasSubstr("for rank(s) 1, 2 to join")) << LastError();
  EXPECT_THAT(LastError(), HasSubstr("root_address")) << LastError();
}

}  // namespace
}  // namespace strait::api

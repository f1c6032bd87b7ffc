// CollNet (plugins/nccl/collnet.h): the ABI layout of the CollNet tables, the listen handle and
// the group plan as unit tests; then end to end: two regions ("us", "eu") of two straitd
// processes each on 127.0.0.1 (configs as in tests/gateway/straitd_region_test.cc) and four node
// heads, each a collnet_node process that dlopens libnccl-net-strait.so with STRAIT_GATEWAY
// pointing at its own straitd and drives a CollNet table as NCCL does: connect, every claimed
// type x op with odd counts, many in flight, checked against a reference and bit-identical on
// all four heads; a lossy policy; the v10 and v8 tables; and bad environments, which make listen
// or connect fail cleanly on every head. Last, a stand-in straitd (the test's own local-protocol
// server) that echoes (a tensor over 16 MiB goes as two region all-reduces) or drops the
// connection in the middle of an operation (the request fails, no hang).
#include "plugins/nccl/collnet.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <atomic>
#include <cstddef>
#include <cstring>
#include <fstream>
#include <iterator>
#include <map>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "localproto/frame_io.h"
#include "localproto/protocol.h"
#include "localproto/shm.h"
#include "plugins/nccl/nccl_net.h"
#include "tests/common/free_ports.h"
#include "tests/common/straitd_process.h"
#include "tests/plugins/node_process.h"

namespace strait::nccl {
namespace {

// ---- ABI and unit tests ---------------------------------------------------------------------

#define SLOT(table, field, index) \
  static_assert(offsetof(table, field) == (index) * sizeof(void*), #table "." #field)
SLOT(ncclCollNet_v11_t, init, 1);
SLOT(ncclCollNet_v11_t, getProperties, 3);
SLOT(ncclCollNet_v11_t, connect, 5);
SLOT(ncclCollNet_v11_t, reduceSupport, 6);
SLOT(ncclCollNet_v11_t, iallreduce, 10);
SLOT(ncclCollNet_v11_t, iallgather, 11);
SLOT(ncclCollNet_v11_t, ireducescatter, 12);
SLOT(ncclCollNet_v11_t, iflush, 13);
SLOT(ncclCollNet_v11_t, test, 14);
SLOT(ncclCollNet_v11_t, closeColl, 15);
SLOT(ncclCollNet_v11_t, closeListen, 16);
SLOT(ncclCollNet_v11_t, makeVDevice, 17);
SLOT(ncclCollNet_v11_t, finalize, 18);
SLOT(ncclCollNet_v10_t, iallreduce, 10);
SLOT(ncclCollNet_v10_t, makeVDevice, 17);
SLOT(ncclCollNet_v8_t, iallreduce, 10);
SLOT(ncclCollNet_v8_t, closeListen, 16);
#undef SLOT
static_assert(offsetof(ncclNetSGE_v11_t, size) == 16 && offsetof(ncclNetSGE_v8_t, size) == 16);

CollNetHandle MakeHandle(const std::string& region, uint32_t shard, uint64_t nonce) {
  CollNetHandle h;
  h.region = region;
  h.shard = shard;
  h.nonce = nonce;
  h.job_hash = CollNetJobHash("job");
  h.policy = "zstd";
  return h;
}

TEST(CollNetHandle, RoundTripsAndRejectsEveryCorruptedByte) {
  unsigned char buf[kNcclNetHandleMaxSize];
  EncodeCollNetHandle(MakeHandle("eu-west.1", 3, 0x1122334455667788ull), buf);
  auto h = DecodeCollNetHandle(buf);
  ASSERT_TRUE(h.ok()) << h.status();
  EXPECT_EQ(h->region, "eu-west.1");
  EXPECT_EQ(h->shard, 3u);
  EXPECT_EQ(h->nonce, 0x1122334455667788ull);
  EXPECT_EQ(h->job_hash, CollNetJobHash("job"));
  EXPECT_EQ(h->policy, "zstd");
  for (size_t i = 0; i < kNcclNetHandleMaxSize; ++i) {
    unsigned char bad[kNcclNetHandleMaxSize];
    std::memcpy(bad, buf, sizeof(bad));
    bad[i] ^= 0x40;
    EXPECT_FALSE(DecodeCollNetHandle(bad).ok()) << "byte " << i;
  }
  unsigned char zero[kNcclNetHandleMaxSize] = {};
  EXPECT_NE(DecodeCollNetHandle(zero).status().message().find("magic"), std::string::npos);
}

TEST(CollNetHandle, PoliciesAreTheGrammarsCanonicalTextWithoutErrorFeedbackWhenLossy) {
  EXPECT_EQ(*CollNetPolicy("auto"), "auto");
  EXPECT_EQ(*CollNetPolicy("zstd:3"), "zstd:3");
  EXPECT_EQ(*CollNetPolicy("fp8"), "fp8,noef");
  EXPECT_EQ(*CollNetPolicy("INT8,ef"), "int8,noef");
  EXPECT_EQ(*CollNetPolicy("auto:int8"), "auto:int8,noef");
  EXPECT_EQ(*CollNetPolicy("auto,ef"), "auto,ef");  // never lossy: error feedback is moot
  EXPECT_FALSE(CollNetPolicy("int7").ok());
  EXPECT_FALSE(CollNetPolicy("").ok());
  // The longest canonical policy fits the handle and comes back as it went in.
  CollNetHandle h = MakeHandle("us", 0, 1);
  h.policy = *CollNetPolicy("auto:int8");
  unsigned char buf[kNcclNetHandleMaxSize];
  EncodeCollNetHandle(h, buf);
  auto d = DecodeCollNetHandle(buf);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->policy, "auto:int8,noef");
  // Text that is not canonical (so that equal policies might compare unequal) is refused.
  h.policy = "INT8";
  EncodeCollNetHandle(h, buf);
  EXPECT_FALSE(DecodeCollNetHandle(buf).ok());
}

TEST(CollNetHandle, VersionOneIsRefusedNamingBothVersions) {
  unsigned char buf[kNcclNetHandleMaxSize];
  EncodeCollNetHandle(MakeHandle("us", 0, 1), buf);
  buf[4] = 1;
  auto d = DecodeCollNetHandle(buf);
  ASSERT_FALSE(d.ok());
  EXPECT_NE(d.status().message().find("version 1"), std::string::npos) << d.status();
  EXPECT_NE(d.status().message().find("speaks 2"), std::string::npos) << d.status();
}

TEST(CollNetGroupPlan, AcceptsFullRegionsAndDerivesOneCommId) {
  std::vector<CollNetHandle> hs = {MakeHandle("us", 1, 11), MakeHandle("eu", 0, 12),
                                   MakeHandle("us", 0, 13), MakeHandle("eu", 1, 14)};
  auto g = PlanCollNetGroup(hs);
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_EQ(g->regions, 2);
  EXPECT_EQ(g->heads_per_region, 2);
  // Another group (other nonces, or another order) gets another id.
  std::swap(hs[0], hs[2]);
  auto g2 = PlanCollNetGroup(hs);
  ASSERT_TRUE(g2.ok());
  EXPECT_NE(g2->comm_id, g->comm_id);
}

TEST(CollNetGroupPlan, RejectsInconsistentGroupsNamingTheCause) {
  auto msg = [](std::vector<CollNetHandle> hs) {
    auto g = PlanCollNetGroup(hs);
    EXPECT_FALSE(g.ok());
    return g.ok() ? std::string() : g.status().message();
  };
  std::vector<CollNetHandle> job = {MakeHandle("us", 0, 1), MakeHandle("eu", 0, 2)};
  job[1].job_hash = CollNetJobHash("other");
  EXPECT_NE(msg(job).find("STRAIT_JOB_ID"), std::string::npos);
  std::vector<CollNetHandle> comp = {MakeHandle("us", 0, 1), MakeHandle("eu", 0, 2)};
  comp[1].policy = "int8,noef";
  EXPECT_NE(msg(comp).find("STRAIT_COMPRESSION"), std::string::npos);
  EXPECT_NE(msg({MakeHandle("us", 0, 1), MakeHandle("us", 0, 2)}).find("own straitd"),
            std::string::npos);
  EXPECT_NE(msg({MakeHandle("us", 1, 1), MakeHandle("eu", 0, 2)}).find("shard"), std::string::npos);
  EXPECT_NE(msg({MakeHandle("us", 0, 1), MakeHandle("us", 1, 2), MakeHandle("eu", 0, 3)})
                .find("same number of node heads"),
            std::string::npos);
  EXPECT_NE(msg({MakeHandle("us", 0, 1), MakeHandle("eu", 0, 1)}).find("share"), std::string::npos);
}

TEST(CollNetReduceSupport, EveryTypeWithSumProdMaxMinAndNothingElse) {
  for (int t = 0; t < 12; ++t) {
    for (int op = 0; op < 4; ++op) EXPECT_TRUE(CollNetReduceSupported(t, op)) << t << " " << op;
    EXPECT_FALSE(CollNetReduceSupported(t, 4)) << "avg would divide by the heads, not the ranks";
  }
  EXPECT_FALSE(CollNetReduceSupported(12, 0));
  EXPECT_FALSE(CollNetReduceSupported(-1, 0));
  EXPECT_FALSE(CollNetReduceSupported(0, 5));
}

// ---- end to end -----------------------------------------------------------------------------

constexpr int kRegions = 2;
constexpr int kGateways = 2;  // per region
constexpr int kHeads = kRegions * kGateways;
const char* const kRegionNames[kRegions] = {"us", "eu"};

std::string NodeName(int node) {
  return std::string(kRegionNames[node / kGateways]) + std::to_string(node % kGateways);
}

using strait::test::FreePorts;
using strait::test::KillProcesses;
using strait::test::SpawnProcess;
using strait::test::WaitForSocket;

// What one node head runs with.
struct HeadSpec {
  int version = 11;
  std::string mode = "all";
  std::map<std::string, std::string> env;  // STRAIT_* overrides ("" value: unset)
};

// A collnet_node process and the file it writes its results to.
struct Head : test::NodeProcess {
  std::string result_file;
};

class CollNetEndToEnd : public ::testing::Test {
 protected:
  // Defined with FakeGateway below.
  int RunPieces(const std::string& local_shm);
  static void SetUpTestSuite() {
    char tmpl[] = "/tmp/strait-collnet-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = new std::string(tmpl);
    pids_ = new std::vector<pid_t>();
    const std::vector<uint16_t> ports = FreePorts(kHeads);
    std::string peers;
    for (int r = 0; r < kRegions; ++r) {
      peers += "[peers." + std::string(kRegionNames[r]) + "]\n";
      for (int i = 0; i < kGateways; ++i) {
        peers += "shard_" + std::to_string(i) +
                 " = \"127.0.0.1:" + std::to_string(ports[size_t(r * kGateways + i)]) + "\"\n";
      }
    }
    for (int node = 0; node < kHeads; ++node) {
      std::string c = "region = \"" + std::string(kRegionNames[node / kGateways]) +
                      "\"\nshard_index = " + std::to_string(node % kGateways) + "\n";
      c += "[local]\nsocket = \"" + Socket(node) + "\"\nallowed_uids = [" +
           std::to_string(::getuid()) + "]\n";
      c += "[wan]\nlisten = \"127.0.0.1:" + std::to_string(ports[size_t(node)]) +
           "\"\ntransport = \"plain\"\n";
      c += peers;
      c += "[link]\nstreams = 2\nadapt_streams = false\nunreachable_after = \"10s\"\n";
      c += "[policy]\nmin_lossy_bytes = \"4KiB\"\n";
      c += "[allreduce]\ndeadline = \"20s\"\nshutdown_grace = \"2s\"\n";
      const std::string file = *dir_ + "/" + NodeName(node) + ".toml";
      std::ofstream(file) << c;
      const pid_t pid = SpawnProcess({STRAITD_PATH, "--config", file});
      ASSERT_GT(pid, 0);
      pids_->push_back(pid);
    }
    // Each daemon is serving once its socket exists.
    for (int node = 0; node < kHeads; ++node) {
      ASSERT_TRUE(WaitForSocket(Socket(node), (*pids_)[size_t(node)], 10))
          << "straitd " << NodeName(node) << " did not create its socket";
    }
  }

  static void TearDownTestSuite() {
    KillProcesses(pids_);
    std::string cmd = "rm -rf '" + *dir_ + "'";
    EXPECT_EQ(std::system(cmd.c_str()), 0);
    delete pids_;
    delete dir_;
  }

  static std::string Socket(int node) { return *dir_ + "/" + NodeName(node) + ".sock"; }

  // Starts one head per spec (head i on straitd i unless its env says otherwise), answers their
  // handles with the whole group and waits for them all to exit.
  std::vector<Head> RunHeads(const std::vector<HeadSpec>& specs, const std::string& job) {
    std::vector<Head> heads;
    for (size_t i = 0; i < specs.size(); ++i) {
      std::map<std::string, std::string> env = {
          {"STRAIT_GATEWAY", Socket(int(i))}, {"STRAIT_JOB_ID", job},
          {"STRAIT_COMPRESSION", "zstd"},     {"STRAIT_REGION", kRegionNames[i / kGateways]},
          {"STRAIT_SOCKET_IFNAME", "lo"},     {"STRAIT_CONNECT_TIMEOUT", "20s"},
      };
      for (const auto& [k, v] : specs[i].env) env[k] = v;
      Head h;
      h.result_file = *dir_ + "/" + job + "-" + std::to_string(i) + ".bin";
      static_cast<test::NodeProcess&>(h) =
          test::SpawnNode({STRAIT_COLLNET_NODE, STRAIT_NCCL_PLUGIN_PATH,
                           std::to_string(specs[i].version), specs[i].mode, h.result_file},
                          env);
      EXPECT_GT(h.pid, 0) << "cannot start " << STRAIT_COLLNET_NODE;
      heads.push_back(std::move(h));
    }
    test::ReadUntil(heads, {"HANDLE ", "LISTEN-FAILED"}, 30);
    std::string group = "GROUP";
    bool all_listened = true;
    for (const Head& h : heads) {
      const size_t at = h.output.find("HANDLE ");
      if (at == std::string::npos) {
        all_listened = false;
        continue;
      }
      group += " " + h.output.substr(at + 7, 2 * kNcclNetHandleMaxSize);
    }
    for (size_t r = 0; r < heads.size(); ++r) {
      if (!all_listened) break;  // nodes whose listen failed have exited; close the others
      const std::string line = "GROUP " + std::to_string(r) + " " + std::to_string(heads.size()) +
                               group.substr(5) + "\n";
      EXPECT_TRUE(test::WriteLine(heads[r], line));
    }
    test::Reap(heads, 60);
    return heads;
  }

  static std::string ReadFile(const std::string& path) {
    std::ifstream f(path, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
  }

  static void ExpectAllOk(const std::vector<Head>& heads) {
    for (size_t i = 0; i < heads.size(); ++i) {
      EXPECT_EQ(heads[i].exit_code, 0) << "head " << i << " output:\n" << heads[i].output;
      EXPECT_NE(heads[i].output.find("\nOK"), std::string::npos) << heads[i].output;
    }
    const std::string first = ReadFile(heads[0].result_file);
    EXPECT_FALSE(first.empty());
    for (size_t i = 1; i < heads.size(); ++i) {
      EXPECT_TRUE(ReadFile(heads[i].result_file) == first)
          << "head " << i << "'s results differ from head 0's";
    }
  }

  static std::string* dir_;
  static std::vector<pid_t>* pids_;
};

std::string* CollNetEndToEnd::dir_ = nullptr;
std::vector<pid_t>* CollNetEndToEnd::pids_ = nullptr;

TEST_F(CollNetEndToEnd, EveryTypeAndOpMatchesTheReferenceBitIdenticallyOnFourHeads) {
  std::vector<HeadSpec> specs(kHeads);
  ExpectAllOk(RunHeads(specs, "all"));
}

TEST_F(CollNetEndToEnd, LossyPolicyGivesEveryHeadTheSameBytes) {
  std::vector<HeadSpec> specs(kHeads);
  for (HeadSpec& s : specs) {
    s.mode = "lossy";
    s.env["STRAIT_COMPRESSION"] = "int8";
  }
  ExpectAllOk(RunHeads(specs, "lossy"));
}

TEST_F(CollNetEndToEnd, V10AndV8TablesWorkTogether) {
  std::vector<HeadSpec> specs(kHeads);
  for (int i = 0; i < kHeads; ++i) {
    specs[size_t(i)].mode = "small";
    specs[size_t(i)].version = i % 2 == 0 ? 10 : 8;
  }
  ExpectAllOk(RunHeads(specs, "older"));
}

// Every head of the group must fail connect (no comm: NCCL falls back) with a WARN naming what.
void ExpectConnectFailsEverywhere(const std::vector<Head>& heads, const std::string& why) {
  for (size_t i = 0; i < heads.size(); ++i) {
    EXPECT_EQ(heads[i].exit_code, 0) << heads[i].output;
    EXPECT_NE(heads[i].output.find("CONNECT-FAILED 4"), std::string::npos) << "head " << i << ":\n"
                                                                           << heads[i].output;
    EXPECT_NE(heads[i].output.find(why), std::string::npos) << heads[i].output;
  }
}

TEST_F(CollNetEndToEnd, MismatchedJobIdsFailConnectOnEveryHead) {
  std::vector<HeadSpec> specs(kHeads);
  for (HeadSpec& s : specs) s.mode = "small";
  specs[3].env["STRAIT_JOB_ID"] = "another-job";
  ExpectConnectFailsEverywhere(RunHeads(specs, "mismatch"), "STRAIT_JOB_ID");
}

TEST_F(CollNetEndToEnd, TwoHeadsOnOneStraitdFailConnectOnEveryHead) {
  std::vector<HeadSpec> specs(kHeads);
  for (HeadSpec& s : specs) s.mode = "small";
  specs[1].env["STRAIT_GATEWAY"] = Socket(0);  // us0 twice, us1 unused
  ExpectConnectFailsEverywhere(RunHeads(specs, "shared"), "own straitd");
}

// A stand-in for straitd on a Unix socket, in this process: it answers hello, register-job and
// tunnel-listen (region "us", shard 0) like straitd, maps the shared regions the plugin attaches,
// answers the first `answered` region all-reduces (on the socket or in the region) with their
// own data (a group of one head: the sum is the input), and closes the connection on the next
// one, as a gateway that dies mid-operation would.
class FakeGateway {
 public:
  FakeGateway(std::string path, int answered) : path_(std::move(path)), answered_(answered) {
    fd_ = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_un a{};
    a.sun_family = AF_UNIX;
    std::strncpy(a.sun_path, path_.c_str(), sizeof(a.sun_path) - 1);
    ::unlink(path_.c_str());
    EXPECT_EQ(::bind(fd_, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
    EXPECT_EQ(::listen(fd_, 16), 0);
    accept_ = std::thread([this] { AcceptLoop(); });
  }
  ~FakeGateway() {
    stop_ = true;
    accept_.join();
    for (auto& t : serving_) t.join();
    ::close(fd_);
    ::unlink(path_.c_str());
  }
  int region_allreduces() const { return region_allreduces_.load(); }
  int shm_allreduces() {
    std::lock_guard<std::mutex> lock(mu_);
    return shm_allreduces_;
  }
  // The element count of every answered region all-reduce, in arrival order.
  std::vector<uint64_t> counts() {
    std::lock_guard<std::mutex> lock(mu_);
    return counts_;
  }

 private:
  void AcceptLoop() {
    while (!stop_) {
      pollfd p{fd_, POLLIN, 0};
      if (::poll(&p, 1, 50) <= 0) continue;
      const int c = ::accept4(fd_, nullptr, nullptr, SOCK_CLOEXEC);
      if (c >= 0) serving_.emplace_back([this, c] { Serve(c); });
    }
  }
  void Serve(int c) {
    using localproto::Message;
    using localproto::MessageType;
    std::unique_ptr<localproto::ShmRegion> region;
    while (!stop_) {
      pollfd p{c, POLLIN, 0};
      if (::poll(&p, 1, 50) <= 0) continue;
      auto body =
          localproto::ReadFrame(c, localproto::kDefaultMaxMessageBytes, Deadline::AfterSeconds(5));
      if (!body.ok()) break;
      auto m = localproto::DecodeMessage(*body);
      if (!m.ok()) break;
      Message reply;
      reply.type = MessageType::kReply;
      reply.reply_to = m->type;
      if (m->type == MessageType::kTunnelListen) {
        reply.data = localproto::EncodeTunnelEvent({localproto::TunnelEventKind::kListening, 1, 0, "us"});
      } else if (m->type == MessageType::kJoinJob) {
        reply.data.assign(8, 0);  // generation 1 (a region of one: nobody to agree with)
        reply.data[0] = 1;
      } else if (m->type == MessageType::kAttachShm) {
        pollfd q{c, POLLIN, 0};
        if (::poll(&q, 1, 5000) <= 0) break;
        auto fd = localproto::ReceiveFd(c);
        if (!fd.ok() || *fd < 0) break;
        auto adopted = localproto::ShmRegion::Adopt(*fd, m->shm_bytes);
        if (!adopted.ok()) break;
        region = std::move(adopted).value();
      } else if (m->type == MessageType::kRegionAllReduce ||
                 m->type == MessageType::kRegionAllReduceShm) {
        if (++region_allreduces_ > answered_) break;  // "dies" mid-operation
        if (m->type == MessageType::kRegionAllReduceShm &&
            (region == nullptr || !region->Slice(m->shm_offset, m->count * DataTypeSize(m->dtype)).ok())) {
          break;
        }
        std::lock_guard<std::mutex> lock(mu_);
        counts_.push_back(m->count);
        if (m->type == MessageType::kRegionAllReduce) {
          reply.data = m->data;
        } else {
          ++shm_allreduces_;  // the sum of one head is its input, already in the region
        }
      }
      auto frame = localproto::EncodeMessage(reply);
      if (!frame.ok() || !localproto::WriteAll(c, *frame, Deadline::AfterSeconds(5)).ok()) break;
    }
    ::close(c);
  }

  const std::string path_;
  const int answered_;
  int fd_ = -1;
  std::atomic<bool> stop_{false};
  std::atomic<int> region_allreduces_{0};
  std::mutex mu_;
  std::vector<uint64_t> counts_;
  int shm_allreduces_ = 0;
  std::thread accept_;
  std::vector<std::thread> serving_;  // touched by the accept thread only, until the join
};

TEST_F(CollNetEndToEnd, GatewayLostMidOperationFailsTheRequestNotAHang) {
  FakeGateway fake(*dir_ + "/fake.sock", /*answered=*/1);  // the connect barrier only
  std::vector<HeadSpec> specs(1);
  specs[0].mode = "fail";
  specs[0].env["STRAIT_GATEWAY"] = *dir_ + "/fake.sock";
  std::vector<Head> heads = RunHeads(specs, "lost");
  EXPECT_EQ(heads[0].exit_code, 0) << heads[0].output;
  EXPECT_NE(heads[0].output.find("\nOK"), std::string::npos) << heads[0].output;
  EXPECT_NE(heads[0].output.find("connection to straitd at"), std::string::npos)
      << heads[0].output;
  EXPECT_NE(heads[0].output.find("connection closed by the peer"), std::string::npos)
      << heads[0].output;
  EXPECT_EQ(fake.region_allreduces(), 2);
}

// One head runs mode "pieces" (16 MiB + 3 float32, checked against its input) against a
// FakeGateway; returns how many of its pieces came as shared-region descriptors.
int CollNetEndToEnd::RunPieces(const std::string& local_shm) {
  FakeGateway fake(*dir_ + "/echo.sock", /*answered=*/1000);
  std::vector<HeadSpec> specs(1);
  specs[0].mode = "pieces";
  specs[0].env["STRAIT_GATEWAY"] = *dir_ + "/echo.sock";
  if (!local_shm.empty()) specs[0].env["STRAIT_LOCAL_SHM"] = local_shm;
  std::vector<Head> heads = RunHeads(specs, "pieces");
  EXPECT_EQ(heads[0].exit_code, 0) << heads[0].output;
  EXPECT_NE(heads[0].output.find("\nOK"), std::string::npos) << heads[0].output;
  // The connect barrier (2 x int64), then the tensor: 16 MiB of float32, then the last 3.
  const std::vector<uint64_t> want = {2, kCollNetPieceBytes / 4, 3};
  EXPECT_EQ(fake.counts(), want);
  return fake.shm_allreduces();
}

// The two pieces after the barrier go as descriptors of the slot's shared region (the head
// checks the result it read back).
TEST_F(CollNetEndToEnd, TensorsOverSixteenMiBGoAsSeveralRegionAllReduces) {
  EXPECT_EQ(RunPieces(""), 2);
}

TEST_F(CollNetEndToEnd, WithoutSharedMemoryThePiecesGoThroughTheSocket) {
  EXPECT_EQ(RunPieces("0"), 0);
}

// Every CollNet connection lives on the plugin's one libuv loop: four comms with 64 requests in
// flight add no thread to the process (a thread per slot would add 8 per comm).
TEST_F(CollNetEndToEnd, CommsAndRequestsInFlightAddNoThreads) {
  FakeGateway fake(*dir_ + "/threads.sock", /*answered=*/100000);
  std::vector<HeadSpec> specs(1);
  specs[0].mode = "threads";
  specs[0].env["STRAIT_GATEWAY"] = *dir_ + "/threads.sock";
  std::vector<Head> heads = RunHeads(specs, "threads");
  EXPECT_EQ(heads[0].exit_code, 0) << heads[0].output;
  EXPECT_NE(heads[0].output.find("\nOK"), std::string::npos) << heads[0].output;
  std::istringstream counts(test::LineAfter(heads[0].output, "THREADS"));
  int after_init = -1;
  int busy = -1;
  ASSERT_TRUE(counts >> after_init >> busy) << heads[0].output;
  EXPECT_GT(after_init, 0);
  EXPECT_EQ(busy, after_init) << "threads after init: " << after_init
                              << ", with 4 comms and 64 requests in flight: " << busy;
  // 4 barriers, then 64 requests of 4096 floats, each a region all-reduce of its own.
  EXPECT_EQ(fake.region_allreduces(), 4 + 64);
}

// A straitd killed while a head's region all-reduce waits in it (the other region's head never
// posts its part): test() reports the lost gateway within seconds, long before any deadline of
// the operation (the gateways' 20 s, the plugin's watchdog), and never hangs.
TEST_F(CollNetEndToEnd, StraitdKilledMidRequestFailsTestPromptly) {
  const std::vector<uint16_t> ports = FreePorts(2);
  const char* const regions[2] = {"ka", "kb"};
  std::vector<pid_t> daemons;
  std::vector<std::string> sockets;
  std::vector<Head> heads;
  struct Cleanup {  // also when an assertion ends the test early
    std::vector<pid_t>* daemons;
    std::vector<Head>* heads;
    ~Cleanup() {
      test::Reap(*heads, 30);
      KillProcesses(daemons);
    }
  } cleanup{&daemons, &heads};
  for (int i = 0; i < 2; ++i) {
    std::string c = "region = \"" + std::string(regions[i]) + "\"\nshard_index = 0\n";
    sockets.push_back(*dir_ + "/" + regions[i] + ".sock");
    c += "[local]\nsocket = \"" + sockets.back() + "\"\nallowed_uids = [" +
         std::to_string(::getuid()) + "]\n";
    c += "[wan]\nlisten = \"127.0.0.1:" + std::to_string(ports[size_t(i)]) +
         "\"\ntransport = \"plain\"\n";
    for (int r = 0; r < 2; ++r) {
      if (r == i) continue;  // a region of one gateway lists no peers of its own
      c += "[peers." + std::string(regions[r]) + "]\nshard_0 = \"127.0.0.1:" +
           std::to_string(ports[size_t(r)]) + "\"\n";
    }
    c += "[link]\nstreams = 2\nadapt_streams = false\nunreachable_after = \"10s\"\n";
    c += "[allreduce]\ndeadline = \"20s\"\nshutdown_grace = \"2s\"\n";
    const std::string file = *dir_ + "/" + regions[i] + ".toml";
    std::ofstream(file) << c;
    daemons.push_back(SpawnProcess({STRAITD_PATH, "--config", file}));
    ASSERT_GT(daemons.back(), 0);
  }
  for (int i = 0; i < 2; ++i) {
    ASSERT_TRUE(WaitForSocket(sockets[size_t(i)], daemons[size_t(i)], 10)) << regions[i];
  }
  for (int i = 0; i < 2; ++i) {
    Head h;
    h.result_file = *dir_ + "/killed-" + std::to_string(i) + ".bin";
    static_cast<test::NodeProcess&>(h) = test::SpawnNode(
        {STRAIT_COLLNET_NODE, STRAIT_NCCL_PLUGIN_PATH, "11", i == 0 ? "killed" : "stall",
         h.result_file},
        {{"STRAIT_GATEWAY", sockets[size_t(i)]}, {"STRAIT_JOB_ID", "killed"},
         {"STRAIT_COMPRESSION", "zstd"}, {"STRAIT_REGION", regions[i]},
         {"STRAIT_SOCKET_IFNAME", "lo"}, {"STRAIT_CONNECT_TIMEOUT", "20s"}});
    ASSERT_GT(h.pid, 0);
    heads.push_back(std::move(h));
  }
  ASSERT_TRUE(test::ReadUntil(heads, {"HANDLE "}, 30));
  const std::string group = " " + test::LineAfter(heads[0].output, "HANDLE") + " " +
                            test::LineAfter(heads[1].output, "HANDLE");
  for (int r = 0; r < 2; ++r) {
    ASSERT_TRUE(test::WriteLine(heads[size_t(r)], "GROUP " + std::to_string(r) + " 2" + group + "\n"));
  }
  ASSERT_TRUE(test::ReadUntil(heads, {"POSTED", "STALLING"}, 60)) << heads[0].output;
  ASSERT_NE(heads[0].output.find("POSTED"), std::string::npos) << heads[0].output;
  // The head's request now waits in straitd ka for region kb's part, which never comes.
  ASSERT_EQ(::kill(daemons[0], SIGKILL), 0);
  ASSERT_TRUE(test::ReadUntil(heads, {"TEST-FAILED", "STALLING"}, 30)) << heads[0].output;
  test::Reap(heads, 30);
  const std::string failed = test::LineAfter(heads[0].output, "TEST-FAILED");
  std::istringstream fields(failed);
  int result = -1;
  long long ms = -1;
  ASSERT_TRUE(fields >> result >> ms) << heads[0].output;
  EXPECT_EQ(result, ncclRemoteError) << heads[0].output;
  EXPECT_LT(ms, 10000) << "test() reported the lost straitd only after " << ms << " ms";
  EXPECT_NE(heads[0].output.find("connection to straitd at"), std::string::npos)
      << heads[0].output;
  EXPECT_EQ(heads[0].exit_code, 0) << heads[0].output;
  EXPECT_EQ(heads[1].exit_code, 0) << heads[1].output;
}

TEST_F(CollNetEndToEnd, BadEnvironmentFailsListenWithAClearWarning) {
  struct Case {
    std::map<std::string, std::string> env;
    int result;
    std::string warning;
  };
  const std::vector<Case> cases = {
      {{{"STRAIT_GATEWAY", ""}}, ncclInvalidUsage, "CollNet needs STRAIT_GATEWAY"},
      {{{"STRAIT_JOB_ID", ""}}, ncclInvalidUsage, "CollNet needs STRAIT_JOB_ID"},
      {{{"STRAIT_GATEWAY", "/nonexistent/straitd.sock"}}, ncclRemoteError, "cannot reach straitd"},
      {{{"STRAIT_REGION", "eu"}}, ncclInvalidArgument, "serves region \"us\""},
  };
  for (const Case& c : cases) {
    std::vector<HeadSpec> specs(1);
    specs[0].mode = "small";
    specs[0].env = c.env;
    std::vector<Head> heads = RunHeads(specs, "badenv");
    EXPECT_EQ(heads[0].exit_code, 0) << heads[0].output;
    EXPECT_NE(heads[0].output.find("LISTEN-FAILED " + std::to_string(c.result)), std::string::npos)
        << heads[0].output;
    EXPECT_NE(heads[0].output.find(c.warning), std::string::npos) << heads[0].output;
  }
}

}  // namespace
}  // namespace strait::nccl

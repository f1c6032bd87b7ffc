// Drives libnccl-net-strait.so through dlopen exactly as NCCL would, inside one process on
// loopback: exported symbols, properties, configuration errors, connect/accept retries, data
// integrity from 0 bytes to 64 MiB, 32 requests in flight, grouped receives, receives larger than
// the send, NULL sizes, the 0x1 request preset, closes with requests in flight, a lost peer,
// garbage and foreign handles, the cross-region refusal, all through the v11 table.
// net_plugin_versions_test.cc holds the configuration errors and the other table versions.
#include <dlfcn.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "plugins/nccl/handle.h"
#include "plugins/nccl/nccl_net.h"
#include "tests/plugins/net_plugin_env.h"
#include "tests/plugins/plugin_harness.h"

namespace strait::nccl::testing {
namespace {

// One v11 "communicator": init on SetUp, finalize on TearDown.
class NetV11 : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_NE(Plugin().dl, nullptr) << Plugin().error;
    ASSERT_NE(Plugin().v11, nullptr);
    net_ = Plugin().v11;
    SetTestEnvironment();
    ClearLog();
    ASSERT_EQ(net_->init(&ctx_, 1, nullptr, CaptureLogger, nullptr), ncclSuccess);
  }
  void TearDown() override {
    if (ctx_ != nullptr) {
      EXPECT_EQ(net_->finalize(ctx_), ncclSuccess);
    }
  }

  // listen + connect/accept; closes the listen comm (NCCL does so right after accept).
  Pair Connect() {
    char handle[kNcclNetHandleMaxSize] = {};
    void* listen = nullptr;
    EXPECT_EQ(net_->listen(ctx_, 0, handle, &listen), ncclSuccess);
    Pair p;
    const std::string err = ConnectAccept(net_, ctx_, handle, listen, &p);
    EXPECT_EQ(err, "");
    EXPECT_EQ(net_->closeListen(listen), ncclSuccess);
    return p;
  }
  void Close(const Pair& p) {
    if (p.send != nullptr) {
      EXPECT_EQ(net_->closeSend(p.send), ncclSuccess);
    }
    if (p.recv != nullptr) {
      EXPECT_EQ(net_->closeRecv(p.recv), ncclSuccess);
    }
  }

  void* PostSend(void* comm, const void* data, size_t size, int tag) {
    void* req = nullptr;
    for (int i = 0; i < 1000000 && req == nullptr; ++i) {
      if (net_->isend(comm, const_cast<void*>(data), size, tag, nullptr, nullptr, &req) !=
          ncclSuccess) {
        ADD_FAILURE() << "isend failed";
        return nullptr;
      }
    }
    return req;
  }
  void* PostRecv(void* comm, int n, void** data, size_t* sizes, int* tags) {
    void* req = nullptr;
    void* mh[kMaxRecvsForTest] = {};
    if (net_->irecv(comm, n, data, sizes, tags, mh, nullptr, &req) != ncclSuccess) {
      ADD_FAILURE() << "irecv failed";
    }
    return req;
  }

  static constexpr int kMaxRecvsForTest = 8;
  ncclNet_v11_t* net_ = nullptr;
  void* ctx_ = nullptr;
};

// ---------------------------------------------------------------------------------------------

TEST(NetPluginExports, OnlyThePluginTablesAreExported) {
  ASSERT_NE(Plugin().dl, nullptr) << Plugin().error;
  const std::string cmd = std::string("nm -D --defined-only ") + STRAIT_NCCL_PLUGIN_PATH;
  FILE* pipe = popen(cmd.c_str(), "r");
  ASSERT_NE(pipe, nullptr);
  std::set<std::string> names;
  char line[1024];
  while (fgets(line, sizeof(line), pipe) != nullptr) {
    std::string s(line);
    while (!s.empty() && (s.back() == '\n' || s.back() == '\r')) s.pop_back();
    const size_t sp = s.rfind(' ');
    names.insert(s.substr(sp + 1));
  }
  ASSERT_EQ(pclose(pipe), 0) << cmd;
  const std::set<std::string> expected = {
      "ncclNetPlugin_v12",     "ncclNetPlugin_v11",    "ncclNetPlugin_v10",
      "ncclNetPlugin_v9",      "ncclNetPlugin_v8",     "ncclCollNetPlugin_v11",
      "ncclCollNetPlugin_v10", "ncclCollNetPlugin_v8", "ncclTunerPlugin_v5"};
  EXPECT_EQ(names, expected);
  // The library does contain the internal API; dlsym must not find it (hidden visibility).
  EXPECT_EQ(dlsym(Plugin().dl, "_ZN6strait14StatusCodeNameENS_10StatusCodeE"), nullptr);
  EXPECT_NE(dlsym(Plugin().dl, "ncclCollNetPlugin_v11"), nullptr);
  EXPECT_NE(Plugin().v12, nullptr);
  EXPECT_NE(Plugin().v11, nullptr);
  EXPECT_NE(Plugin().v10, nullptr);
  EXPECT_NE(Plugin().v9, nullptr);
  EXPECT_NE(Plugin().v8, nullptr);
  EXPECT_STREQ(Plugin().v11->name, "Strait");
  ASSERT_NE(Plugin().v12, nullptr);
  EXPECT_STREQ(Plugin().v12->name, "Strait");
}

TEST_F(NetV11, PropertiesDescribeOneHostOnlyIntraRegionDevice) {
  int ndev = 0;
  ASSERT_EQ(net_->devices(&ndev), ncclSuccess);
  EXPECT_EQ(ndev, 1);
  ncclNetProperties_v11_t p;
  std::memset(&p, 0xab, sizeof(p));
  ASSERT_EQ(net_->getProperties(0, &p), ncclSuccess);
  EXPECT_STREQ(p.name, "strait-lo");
  EXPECT_EQ(p.pciPath, nullptr);
  EXPECT_EQ(p.ptrSupport, kNcclPtrHost);
  EXPECT_EQ(p.regIsGlobal, 0);
  EXPECT_EQ(p.forceFlush, 0);
  EXPECT_GT(p.speed, 0);
  EXPECT_EQ(p.latency, 0.0f);
  EXPECT_GT(p.maxComms, 0);
  EXPECT_EQ(p.maxRecvs, 8);
  EXPECT_EQ(p.netDeviceType, NCCL_NET_DEVICE_HOST);
  EXPECT_EQ(p.netDeviceVersion, 0);
  EXPECT_EQ(p.vProps.ndevs, 1);
  EXPECT_EQ(p.vProps.devs[0], 0);
  EXPECT_GT(p.maxP2pBytes, 0u);
  EXPECT_LE(p.maxP2pBytes, size_t{1} << 40);
  EXPECT_GT(p.maxCollBytes, 0u);
  EXPECT_LE(p.maxCollBytes, size_t{1} << 40);
  EXPECT_EQ(p.maxMultiRequestSize, 1);
  EXPECT_EQ(net_->getProperties(1, &p), ncclInvalidArgument);
  EXPECT_TRUE(WarnedWith({"NET/Strait", "device 1"}));
  EXPECT_EQ(net_->makeVDevice, nullptr);
}

TEST_F(NetV11, ConnectAndAcceptNeverBlockAndAreRetried) {
  char handle[kNcclNetHandleMaxSize] = {};
  void* listen = nullptr;
  ASSERT_EQ(net_->listen(ctx_, 0, handle, &listen), ncclSuccess);
  ASSERT_NE(listen, nullptr);
  // Nothing has connected yet: accept says "call again".
  void* recv = reinterpret_cast<void*>(0x1234);
  ncclNetDeviceHandle_t* dev = nullptr;
  ASSERT_EQ(net_->accept(listen, &recv, &dev), ncclSuccess);
  EXPECT_EQ(recv, nullptr);
  // The first connect only starts the sockets: it must return at once with NULL.
  void* send = nullptr;
  ASSERT_EQ(net_->connect(ctx_, 0, handle, &send, &dev), ncclSuccess);
  EXPECT_EQ(send, nullptr);
  Pair p;
  ASSERT_EQ(ConnectAccept(net_, ctx_, handle, listen, &p), "");
  EXPECT_NE(p.send, nullptr);
  EXPECT_NE(p.recv, nullptr);
  EXPECT_EQ(net_->closeListen(listen), ncclSuccess);
  Close(p);
}

class NetV11Sizes : public NetV11, public ::testing::WithParamInterface<size_t> {};

TEST_P(NetV11Sizes, BytesArriveIntactWithTheirSize) {
  const size_t size = GetParam();
  Pair p = Connect();
  ASSERT_NE(p.send, nullptr);
  std::vector<char> out(size);
  // A receive buffer larger than the send: NCCL allows it, test() reports the real size.
  std::vector<char> in(size + 17, 0);
  FillPattern(out.data(), size, size);
  void* recv_data[1] = {in.data()};
  size_t recv_size[1] = {in.size()};
  int tags[1] = {5};
  void* rreq = PostRecv(p.recv, 1, recv_data, recv_size, tags);
  ASSERT_NE(rreq, nullptr);
  void* sreq = PostSend(p.send, out.data(), size, 5);
  ASSERT_NE(sreq, nullptr);
  int sent = -1;
  int got = -1;
  ASSERT_EQ(WaitRequest(net_, sreq, &sent), ncclSuccess);
  ASSERT_EQ(WaitRequest(net_, rreq, &got), ncclSuccess);
  EXPECT_EQ(sent, static_cast<int>(size));
  EXPECT_EQ(got, static_cast<int>(size));
  EXPECT_EQ(FirstMismatch(in.data(), size, size), -1);
  Close(p);
}

INSTANTIATE_TEST_SUITE_P(Sparse, NetV11Sizes,
                         ::testing::Values(0, 1, 7, 4095, 4096, 65537, 512 * 1024, 512 * 1024 + 1,
                                           3 * 1024 * 1024 + 5, size_t{64} << 20));

TEST_F(NetV11, ThirtyTwoRequestsInFlightAndTheNextOneIsRetry) {
  Pair p = Connect();
  ASSERT_NE(p.send, nullptr);
  constexpr int kN = 32;
  constexpr size_t kSize = 100 * 1024 + 3;
  std::vector<std::vector<char>> out(kN, std::vector<char>(kSize));
  std::vector<std::vector<char>> in(kN, std::vector<char>(kSize));
  std::vector<void*> rreq(kN), sreq(kN);
  for (int i = 0; i < kN; ++i) {
    void* data[1] = {in[i].data()};
    size_t sizes[1] = {kSize};
    int tags[1] = {0};
    rreq[i] = PostRecv(p.recv, 1, data, sizes, tags);
    ASSERT_NE(rreq[i], nullptr) << i;
  }
  // The 33rd receive has no slot: NULL request, success (NCCL retries later).
  {
    char extra[8];
    void* data[1] = {extra};
    size_t sizes[1] = {sizeof(extra)};
    int tags[1] = {0};
    void* req = reinterpret_cast<void*>(0x1);
    void* mh[1] = {};
    ASSERT_EQ(net_->irecv(p.recv, 1, data, sizes, tags, mh, nullptr, &req), ncclSuccess);
    EXPECT_EQ(req, nullptr);
  }
  for (int i = 0; i < kN; ++i) {
    FillPattern(out[i].data(), kSize, 1000 + i);
    sreq[i] = PostSend(p.send, out[i].data(), kSize, 0);
    ASSERT_NE(sreq[i], nullptr);
  }
  // Complete them in reverse order: requests are independent.
  for (int i = kN - 1; i >= 0; --i) {
    int got = -1;
    ASSERT_EQ(WaitRequest(net_, rreq[i], &got), ncclSuccess);
    EXPECT_EQ(got, static_cast<int>(kSize));
    EXPECT_EQ(FirstMismatch(in[i].data(), kSize, 1000 + i), -1) << "message " << i;
    ASSERT_EQ(WaitRequest(net_, sreq[i], nullptr), ncclSuccess);
  }
  Close(p);
}

TEST_F(NetV11, SendSideAcceptsThirtyTwoTimesMaxRecvsThenAsksForRetry) {
  Pair p = Connect();
  ASSERT_NE(p.send, nullptr);
  constexpr int kCap = 32 * 8;
  std::vector<void*> sreq;
  char byte = 0;
  for (int i = 0; i < kCap; ++i) {
    void* req = nullptr;
    ASSERT_EQ(net_->isend(p.send, &byte, 0, 0, nullptr, nullptr, &req), ncclSuccess);
    ASSERT_NE(req, nullptr) << i;
    sreq.push_back(req);
  }
  void* req = nullptr;
  ASSERT_EQ(net_->isend(p.send, &byte, 0, 0, nullptr, nullptr, &req), ncclSuccess);
  EXPECT_EQ(req, nullptr);
  // Receive them all (32 at a time) and check every send completes.
  for (int base = 0; base < kCap; base += 32) {
    std::vector<void*> rreq;
    for (int i = 0; i < 32; ++i) {
      void* data[1] = {&byte};
      size_t sizes[1] = {1};
      int tags[1] = {0};
      rreq.push_back(PostRecv(p.recv, 1, data, sizes, tags));
      ASSERT_NE(rreq.back(), nullptr);
    }
    for (void* r : rreq) {
      int got = -1;
      ASSERT_EQ(WaitRequest(net_, r, &got), ncclSuccess);
      EXPECT_EQ(got, 0);
    }
  }
  for (void* r : sreq) ASSERT_EQ(WaitRequest(net_, r, nullptr), ncclSuccess);
  Close(p);
}

TEST_F(NetV11, GroupedReceivePlacesEachMessageByTag) {
  Pair p = Connect();
  ASSERT_NE(p.send, nullptr);
  // Two groups back to back, so message sequence numbers must carry across groups.
  for (int round = 0; round < 2; ++round) {
    constexpr int kN = 4;
    int recv_tags[kN] = {30, 10, 20, 0};
    const int send_tags[kN] = {0, 10, 20, 30};
    const size_t send_sizes[kN] = {100, 70000, 0, 600000};
    std::vector<std::vector<char>> in(kN, std::vector<char>(600000));
    std::vector<std::vector<char>> out(kN);
    void* data[kN];
    size_t caps[kN];
    for (int i = 0; i < kN; ++i) {
      data[i] = in[i].data();
      caps[i] = in[i].size();
    }
    void* rreq = PostRecv(p.recv, kN, data, caps, recv_tags);
    ASSERT_NE(rreq, nullptr);
    std::vector<void*> sreq;
    for (int i = 0; i < kN; ++i) {
      out[i].resize(send_sizes[i]);
      FillPattern(out[i].data(), send_sizes[i], 77 + send_tags[i] + round);
      sreq.push_back(PostSend(p.send, out[i].data(), send_sizes[i], send_tags[i]));
    }
    int got[kN] = {-1, -1, -1, -1};
    ASSERT_EQ(WaitRequest(net_, rreq, got), ncclSuccess);
    for (int b = 0; b < kN; ++b) {
      const int tag = recv_tags[b];
      int s = 0;
      while (send_tags[s] != tag) ++s;
      EXPECT_EQ(got[b], static_cast<int>(send_sizes[s])) << "buffer " << b << " tag " << tag;
      EXPECT_EQ(FirstMismatch(in[b].data(), send_sizes[s], 77 + tag + round), -1) << "buffer " << b;
    }
    for (void* r : sreq) ASSERT_EQ(WaitRequest(net_, r, nullptr), ncclSuccess);
  }
  Close(p);
}

// The sender runs ahead of the receiver with interleaved tags, then closes: every message is
// held, matched per tag to grouped receives posted later in a different order, and a receive
// with nothing left to match fails instead of hanging.
TEST_F(NetV11, EarlySendsOfInterleavedTagsMatchReceivesPostedLater) {
  Pair p = Connect();
  ASSERT_NE(p.send, nullptr);
  const int send_tags[5] = {1, 2, 1, 2, 1};
  const size_t send_sizes[5] = {3000, 0, 700000, 1, 65536};
  std::vector<std::vector<char>> out(5);
  for (int i = 0; i < 5; ++i) {
    out[i].resize(send_sizes[i]);
    FillPattern(out[i].data(), send_sizes[i], 500 + i);
    void* req = PostSend(p.send, out[i].data(), send_sizes[i], send_tags[i]);
    ASSERT_EQ(WaitRequest(net_, req, nullptr), ncclSuccess);
  }
  EXPECT_EQ(net_->closeSend(p.send), ncclSuccess);
  // Tag 1 carries messages 0, 2, 4; tag 2 carries 1, 3.
  struct Expect {
    int tag;
    int message;
  };
  const std::vector<std::vector<Expect>> groups = {{{2, 1}, {1, 0}}, {{1, 2}, {2, 3}}, {{1, 4}}};
  for (const auto& group : groups) {
    const int n = static_cast<int>(group.size());
    std::vector<std::vector<char>> in(group.size(), std::vector<char>(800000));
    void* data[8];
    size_t caps[8];
    int tags[8];
    for (int b = 0; b < n; ++b) {
      data[b] = in[b].data();
      caps[b] = in[b].size();
      tags[b] = group[b].tag;
    }
    void* req = PostRecv(p.recv, n, data, caps, tags);
    ASSERT_NE(req, nullptr);
    int got[8];
    ASSERT_EQ(WaitRequest(net_, req, got), ncclSuccess);
    for (int b = 0; b < n; ++b) {
      const int m = group[b].message;
      EXPECT_EQ(got[b], static_cast<int>(send_sizes[m])) << "message " << m;
      EXPECT_EQ(FirstMismatch(in[b].data(), send_sizes[m], 500 + m), -1) << "message " << m;
    }
  }
  char extra[16];
  void* data[1] = {extra};
  size_t caps[1] = {sizeof(extra)};
  int tags[1] = {1};
  void* mh[1] = {};
  void* req = nullptr;
  ncclResult_t r = net_->irecv(p.recv, 1, data, caps, tags, mh, nullptr, &req);
  if (r == ncclSuccess && req != nullptr) r = WaitRequest(net_, req, nullptr);
  EXPECT_EQ(r, ncclRemoteError);
  EXPECT_EQ(net_->closeRecv(p.recv), ncclSuccess);
}

TEST_F(NetV11, SizesMayBeNullAndThePresetRequestIsReplaced) {
  Pair p = Connect();
  ASSERT_NE(p.send, nullptr);
  std::vector<char> out(1000), in(1 << 20);
  FillPattern(out.data(), out.size(), 9);
  void* data[1] = {in.data()};
  size_t sizes[1] = {in.size()};
  int tags[1] = {1};
  void* mh[1] = {};
  // NCCL presets 0x1 for LL/LL128 receives; the plugin must still hand back a real request.
  void* rreq = reinterpret_cast<void*>(0x1);
  ASSERT_EQ(net_->irecv(p.recv, 1, data, sizes, tags, mh, nullptr, &rreq), ncclSuccess);
  ASSERT_NE(rreq, nullptr);
  ASSERT_NE(rreq, reinterpret_cast<void*>(0x1));
  void* sreq = PostSend(p.send, out.data(), out.size(), 1);
  EXPECT_EQ(WaitRequest(net_, rreq, nullptr), ncclSuccess);
  EXPECT_EQ(WaitRequest(net_, sreq, nullptr), ncclSuccess);
  EXPECT_EQ(FirstMismatch(in.data(), out.size(), 9), -1);
  // A finished request is gone: testing it again is an error, not a crash.
  int done = 0;
  EXPECT_EQ(net_->test(rreq, &done, nullptr), ncclInvalidArgument);
  Close(p);
}

TEST_F(NetV11, CloseWithRequestsInFlightThenReconnect) {
  Pair p = Connect();
  ASSERT_NE(p.send, nullptr);
  constexpr size_t kSize = 4 << 20;
  std::vector<std::vector<char>> in(4, std::vector<char>(kSize));
  std::vector<std::vector<char>> out(8, std::vector<char>(kSize, 'x'));
  for (auto& b : in) {
    void* data[1] = {b.data()};
    size_t sizes[1] = {kSize};
    int tags[1] = {0};
    ASSERT_NE(PostRecv(p.recv, 1, data, sizes, tags), nullptr);
  }
  // Twice as many sends as receives: half of them can never be delivered.
  for (auto& b : out) ASSERT_NE(PostSend(p.send, b.data(), kSize, 0), nullptr);
  Close(p);
  // The buffers die right after close: a loop still writing into them would be caught by ASan.
  in.clear();
  out.clear();
  Pair q = Connect();
  ASSERT_NE(q.send, nullptr);
  char msg[5] = "ping";
  char got[5] = {};
  void* data[1] = {got};
  size_t sizes[1] = {sizeof(got)};
  int tags[1] = {0};
  void* rreq = PostRecv(q.recv, 1, data, sizes, tags);
  void* sreq = PostSend(q.send, msg, sizeof(msg), 0);
  EXPECT_EQ(WaitRequest(net_, rreq, nullptr), ncclSuccess);
  EXPECT_EQ(WaitRequest(net_, sreq, nullptr), ncclSuccess);
  EXPECT_STREQ(got, "ping");
  Close(q);
}

TEST_F(NetV11, LostPeerFailsTheSenderWithARemoteError) {
  Pair p = Connect();
  ASSERT_NE(p.send, nullptr);
  ASSERT_EQ(net_->closeRecv(p.recv), ncclSuccess);
  std::vector<char> out(8 << 20, 'y');
  // Either isend itself or test() of its request reports the broken connection; never a hang.
  ncclResult_t result = ncclSuccess;
  for (int i = 0; i < 100 && result == ncclSuccess; ++i) {
    void* req = nullptr;
    result = net_->isend(p.send, out.data(), out.size(), 0, nullptr, nullptr, &req);
    if (result == ncclSuccess && req != nullptr) result = WaitRequest(net_, req, nullptr);
  }
  EXPECT_EQ(result, ncclRemoteError);
  EXPECT_TRUE(WarnedWith({"NET/Strait", "lost"}));
  EXPECT_EQ(net_->closeSend(p.send), ncclSuccess);
}

TEST_F(NetV11, GarbageAndForeignHandlesAreErrorsNotCrashes) {
  char good[kNcclNetHandleMaxSize] = {};
  void* listen = nullptr;
  ASSERT_EQ(net_->listen(ctx_, 0, good, &listen), ncclSuccess);
  std::mt19937 rng(42);
  std::vector<std::vector<char>> bad;
  bad.emplace_back(kNcclNetHandleMaxSize, 0);  // all zeros
  std::vector<char> random(kNcclNetHandleMaxSize);
  for (char& c : random) c = static_cast<char>(rng());
  std::memset(random.data() + 104, 0, 8);  // scratch clear: exercise the handle checks
  bad.push_back(random);
  std::vector<char> flipped(good, good + kNcclNetHandleMaxSize);
  flipped[40] ^= 0x20;  // inside the region name: checksum must catch it
  bad.push_back(flipped);
  std::vector<char> future(good, good + kNcclNetHandleMaxSize);
  future[4] = 9;  // version 9
  bad.push_back(future);
  for (size_t i = 0; i < bad.size(); ++i) {
    ClearLog();
    void* send = reinterpret_cast<void*>(0x1);
    ncclNetDeviceHandle_t* dev = nullptr;
    EXPECT_EQ(net_->connect(ctx_, 0, bad[i].data(), &send, &dev), ncclInvalidArgument) << i;
    EXPECT_EQ(send, nullptr) << i;
    EXPECT_TRUE(WarnedWith({"NET/Strait", "connect", "handle"})) << i;
  }
  EXPECT_TRUE(WarnedWith({"version 9"}));
  // A scratch value this process never wrote.
  std::vector<char> scratch(good, good + kNcclNetHandleMaxSize);
  scratch[105] = 0x5a;
  void* send = nullptr;
  EXPECT_EQ(net_->connect(ctx_, 0, scratch.data(), &send, nullptr), ncclInvalidArgument);
  // Wrong device, NULL arguments.
  EXPECT_EQ(net_->connect(ctx_, 3, good, &send, nullptr), ncclInvalidArgument);
  EXPECT_EQ(net_->connect(ctx_, 0, nullptr, &send, nullptr), ncclInvalidArgument);
  EXPECT_EQ(net_->listen(ctx_, 0, nullptr, &listen), ncclInvalidArgument);
  // Comms and requests that are not ours.
  std::vector<char> junk(256, 0);
  void* req = nullptr;
  int done = 0;
  EXPECT_EQ(net_->isend(junk.data(), junk.data(), 1, 0, nullptr, nullptr, &req),
            ncclInvalidArgument);
  EXPECT_EQ(net_->isend(listen, junk.data(), 1, 0, nullptr, nullptr, &req), ncclInvalidArgument);
  EXPECT_EQ(net_->test(junk.data(), &done, nullptr), ncclInvalidArgument);
  EXPECT_EQ(net_->test(nullptr, &done, nullptr), ncclInvalidArgument);
  EXPECT_EQ(net_->closeSend(nullptr), ncclInvalidArgument);
  EXPECT_EQ(net_->closeRecv(junk.data()), ncclInvalidArgument);
  EXPECT_EQ(net_->accept(junk.data(), &req, nullptr), ncclInvalidArgument);
  EXPECT_EQ(net_->closeListen(listen), ncclSuccess);
  EXPECT_EQ(net_->closeListen(listen), ncclInvalidArgument) << "double close";
  // A handle whose listener is gone (stale): the connection attempt fails, it does not hang.
  void* stale = nullptr;
  ncclResult_t r = ncclSuccess;
  for (long i = 0; i < 100000000 && r == ncclSuccess && stale == nullptr; ++i) {
    r = net_->connect(ctx_, 0, good, &stale, nullptr);
  }
  EXPECT_EQ(r, ncclRemoteError);
  EXPECT_EQ(stale, nullptr);
  EXPECT_TRUE(WarnedWith({"NET/Strait", "cannot connect"}));
}

TEST_F(NetV11, CrossRegionPeerIsRefusedWithAClearWarning) {
  ListenHandle h;
  h.nonce = 1;
  auto* a = reinterpret_cast<sockaddr_in*>(&h.addr);
  a->sin_family = AF_INET;
  a->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a->sin_port = htons(9);
  h.region = "eu-west";
  char handle[kNcclNetHandleMaxSize];
  ASSERT_TRUE(EncodeHandle(h, handle).ok());
  void* send = nullptr;
  EXPECT_EQ(net_->connect(ctx_, 0, handle, &send, nullptr), ncclInvalidUsage);
  EXPECT_EQ(send, nullptr);
  EXPECT_TRUE(WarnedWith({"NET/Strait", "eu-west", "us-east",
                          "cross-region connections need straitd's tunnel",
                          "set STRAIT_GATEWAY"}));
}

// A listener that accepts TCP connections but never answers the hello (a stuck or foreign
// process): connect keeps returning "call again" only until STRAIT_CONNECT_TIMEOUT (3 s here).
TEST_F(NetV11, ConnectToAListenerThatNeverAnswersTimesOut) {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  ASSERT_GE(fd, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  ASSERT_EQ(::listen(fd, 16), 0);  // the kernel completes handshakes; nobody ever reads
  socklen_t len = sizeof(addr);
  ASSERT_EQ(getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len), 0);
  ListenHandle h;
  h.nonce = 5;
  std::memcpy(&h.addr, &addr, sizeof(addr));
  h.region = "us-east";
  char handle[kNcclNetHandleMaxSize];
  ASSERT_TRUE(EncodeHandle(h, handle).ok());
  const auto start = std::chrono::steady_clock::now();
  void* send = nullptr;
  ncclResult_t r = ncclSuccess;
  while (r == ncclSuccess && send == nullptr &&
         std::chrono::steady_clock::now() - start < std::chrono::seconds(60)) {
    r = net_->connect(ctx_, 0, handle, &send, nullptr);
    std::this_thread::yield();
  }
  EXPECT_EQ(r, ncclSystemError);
  EXPECT_EQ(send, nullptr);
  EXPECT_TRUE(WarnedWith({"NET/Strait", "no answer from 127.0.0.1", "STRAIT_CONNECT_TIMEOUT"}));
  close(fd);
}

TEST_F(NetV11, MemoryRegistrationFlushAndOffloadCalls) {
  Pair p = Connect();
  ASSERT_NE(p.send, nullptr);
  std::vector<char> buf(4096);
  void* mh = nullptr;
  EXPECT_EQ(net_->regMr(p.send, buf.data(), buf.size(), kNcclPtrHost, &mh), ncclSuccess);
  EXPECT_NE(mh, nullptr);
  void* cuda_mh = nullptr;
  EXPECT_EQ(net_->regMr(p.recv, buf.data(), buf.size(), kNcclPtrCuda, &cuda_mh),
            ncclInvalidArgument);
  EXPECT_TRUE(WarnedWith({"NET/Strait", "host memory only"}));
  void* dmabuf_mh = nullptr;
  EXPECT_EQ(net_->regMrDmaBuf(p.recv, buf.data(), buf.size(), kNcclPtrHost, 0, -1, &dmabuf_mh),
            ncclSuccess);
  EXPECT_EQ(net_->deregMr(p.recv, dmabuf_mh), ncclSuccess);
  EXPECT_EQ(net_->deregMr(p.send, mh), ncclSuccess);
  EXPECT_EQ(net_->deregMr(p.send, mh), ncclInvalidArgument) << "double deregMr";
  void* dptr = nullptr;
  EXPECT_EQ(net_->getDeviceMr(p.send, mh, &dptr), ncclInvalidUsage);
  void* freq = nullptr;
  void* data[1] = {buf.data()};
  int sizes[1] = {4096};
  void* mhs[1] = {};
  ASSERT_EQ(net_->iflush(p.recv, 1, data, sizes, mhs, &freq), ncclSuccess);
  ASSERT_NE(freq, nullptr);
  EXPECT_EQ(WaitRequest(net_, freq, nullptr), ncclSuccess);
  ncclNetAttr_v11_t attr{};
  EXPECT_EQ(net_->setNetAttr(ctx_, &attr), ncclSuccess);
  Close(p);
}

}  // namespace
}  // namespace strait::nccl::testing

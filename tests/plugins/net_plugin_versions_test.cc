// Drives libnccl-net-strait.so through dlopen as NCCL would, beside net_plugin_test.cc (the v11
// table): configuration errors (init fails with a WARN that names the variable and what is
// allowed), the region map, and every other exported table end to end -- v10, v9 and v8, and
// v12 (NCCL 2.30's, which it probes first).
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

// ---------------------------------------------------------------------------------------------
// Configuration errors: init fails and the WARN names the variable and what is allowed.

struct BadEnv {
  const char* var;
  const char* value;
  const char* allowed;  // a fragment of the "allowed" text
};

class NetPluginBadEnv : public ::testing::TestWithParam<BadEnv> {};

TEST_P(NetPluginBadEnv, InitFailsWithAWarningNamingTheVariable) {
  ASSERT_NE(Plugin().dl, nullptr) << Plugin().error;
  const BadEnv& b = GetParam();
  SetTestEnvironment();
  setenv(b.var, b.value, 1);
  ClearLog();
  void* ctx = nullptr;
  EXPECT_EQ(Plugin().v11->init(&ctx, 1, nullptr, CaptureLogger, nullptr), ncclInvalidArgument);
  EXPECT_EQ(ctx, nullptr);
  EXPECT_TRUE(WarnedWith({"NET/Strait", b.var, b.allowed})) << b.var << "=" << b.value;
  // The older tables share the check.
  EXPECT_EQ(Plugin().v8->init(CaptureLogger), ncclInvalidArgument);
  SetTestEnvironment();
  ASSERT_EQ(Plugin().v11->init(&ctx, 1, nullptr, CaptureLogger, nullptr), ncclSuccess);
  EXPECT_EQ(Plugin().v11->finalize(ctx), ncclSuccess);
}

INSTANTIATE_TEST_SUITE_P(
    Variables, NetPluginBadEnv,
    ::testing::Values(BadEnv{"STRAIT_NSOCKS", "0", "1 to 16"},
                      BadEnv{"STRAIT_NSOCKS", "four", "1 to 16"},
                      BadEnv{"STRAIT_NSOCKS", "17", "1 to 16"},
                      BadEnv{"STRAIT_REGION", "us east", "letters, digits"},
                      BadEnv{"STRAIT_REGION_MAP", "10.1.0.0/16", "ADDRESS[/PREFIX]=REGION"},
                      BadEnv{"STRAIT_REGION_MAP", "10.1.0.0/33=us-east", "0-32"},
                      BadEnv{"STRAIT_REGION_MAP", "10.1.x.0/16=us-east", "not an IP address"},
                      BadEnv{"STRAIT_COMPRESSION", "lzma", "zstd:<level -5..19>"},
                      BadEnv{"STRAIT_COMPRESSION", "zstd:42", "auto:<int8|int4|fp8>"},
                      BadEnv{"STRAIT_GATEWAY", "straitd.sock", "absolute path"},
                      BadEnv{"STRAIT_JOB_ID", "job/1", "1-64 characters"},
                      BadEnv{"STRAIT_SOCKET_IFNAME", "nosuchif", "lo"},
                      BadEnv{"STRAIT_CONNECT_TIMEOUT", "60", "1ms to 1h"},
                      BadEnv{"STRAIT_CONNECT_TIMEOUT", "0s", "1ms to 1h"}),
    [](const ::testing::TestParamInfo<BadEnv>& param_info) {
      return std::string(param_info.param.var).substr(7) + "_" + std::to_string(param_info.index);
    });

TEST(NetPluginRegionMap, RegionComesFromTheMapWhenUnset) {
  ASSERT_NE(Plugin().dl, nullptr) << Plugin().error;
  SetTestEnvironment();
  unsetenv("STRAIT_REGION");
  setenv("STRAIT_REGION_MAP", "10.0.0.0/8=elsewhere", 1);
  ClearLog();
  void* ctx = nullptr;
  // Loopback is not in the map: init refuses rather than guessing a region.
  EXPECT_EQ(Plugin().v11->init(&ctx, 1, nullptr, CaptureLogger, nullptr), ncclInvalidArgument);
  EXPECT_TRUE(WarnedWith({"STRAIT_REGION_MAP", "127.0.0.1"}));
  SetTestEnvironment();
}

// ---------------------------------------------------------------------------------------------
// The older tables: each one is driven end to end once.

template <typename Net, typename Props>
void CheckCommonProperties(const Props& p) {
  EXPECT_STREQ(p.name, "strait-lo");
  EXPECT_EQ(p.ptrSupport, kNcclPtrHost);
  EXPECT_EQ(p.maxRecvs, 8);
  EXPECT_EQ(p.netDeviceType, NCCL_NET_DEVICE_HOST);
  EXPECT_GT(p.speed, 0);
}

// Connect, send `size` bytes, receive them into a larger buffer, close; for any table version.
template <typename Net, typename ListenFn, typename ConnectFn, typename SendFn, typename RecvFn>
void RoundTrip(const Net* net, ListenFn listen, ConnectFn connect, SendFn send, RecvFn recv,
               size_t size) {
  char handle[kNcclNetHandleMaxSize] = {};
  void* lcomm = nullptr;
  ASSERT_EQ(listen(handle, &lcomm), ncclSuccess);
  void* scomm = nullptr;
  void* rcomm = nullptr;
  for (int i = 0; i < 10000000 && (scomm == nullptr || rcomm == nullptr); ++i) {
    if (scomm == nullptr) {
      ASSERT_EQ(connect(handle, &scomm), ncclSuccess);
    }
    if (rcomm == nullptr) {
      ncclNetDeviceHandle_t* dev = nullptr;
      ASSERT_EQ(net->accept(lcomm, &rcomm, &dev), ncclSuccess);
    }
  }
  ASSERT_NE(scomm, nullptr);
  ASSERT_NE(rcomm, nullptr);
  ASSERT_EQ(net->closeListen(lcomm), ncclSuccess);
  std::vector<char> out(size), in(size + 100);
  FillPattern(out.data(), size, 31 + size);
  void* rreq = recv(rcomm, in.data(), in.size());
  ASSERT_NE(rreq, nullptr);
  void* sreq = nullptr;
  while (sreq == nullptr) sreq = send(scomm, out.data(), size);
  int got = -1;
  ASSERT_EQ(WaitRequest(net, rreq, &got), ncclSuccess);
  ASSERT_EQ(WaitRequest(net, sreq, nullptr), ncclSuccess);
  EXPECT_EQ(got, static_cast<int>(size));
  EXPECT_EQ(FirstMismatch(in.data(), size, 31 + size), -1);
  EXPECT_EQ(net->closeSend(scomm), ncclSuccess);
  EXPECT_EQ(net->closeRecv(rcomm), ncclSuccess);
}

TEST(NetPluginVersions, V10TableWorksEndToEnd) {
  ASSERT_NE(Plugin().dl, nullptr) << Plugin().error;
  SetTestEnvironment();
  const ncclNet_v10_t* net = Plugin().v10;
  ASSERT_EQ(net->init(CaptureLogger, nullptr), ncclSuccess);
  int ndev = 0;
  ASSERT_EQ(net->devices(&ndev), ncclSuccess);
  EXPECT_EQ(ndev, 1);
  ncclNetProperties_v10_t p;
  ASSERT_EQ(net->getProperties(0, &p), ncclSuccess);
  CheckCommonProperties<ncclNet_v10_t>(p);
  EXPECT_EQ(p.vProps.ndevs, 1);
  EXPECT_EQ(p.maxP2pBytes, size_t{1} << 30);
  for (size_t size : {size_t{0}, size_t{1} << 20}) {
    RoundTrip(
        net, [&](void* h, void** l) { return net->listen(0, h, l); },
        [&](void* h, void** s) {
          ncclNetCommConfig_t config{-1};
          ncclNetDeviceHandle_t* dev = nullptr;
          return net->connect(0, &config, h, s, &dev);
        },
        [&](void* c, void* d, size_t n) {
          void* r = nullptr;
          EXPECT_EQ(net->isend(c, d, n, 2, nullptr, nullptr, &r), ncclSuccess);
          return r;
        },
        [&](void* c, void* d, size_t n) {
          void* data[1] = {d};
          size_t sizes[1] = {n};
          int tags[1] = {2};
          void* mh[1] = {};
          void* r = nullptr;
          EXPECT_EQ(net->irecv(c, 1, data, sizes, tags, mh, nullptr, &r), ncclSuccess);
          return r;
        },
        size);
  }
}

TEST(NetPluginVersions, V9TableWorksEndToEnd) {
  ASSERT_NE(Plugin().dl, nullptr) << Plugin().error;
  SetTestEnvironment();
  const ncclNet_v9_t* net = Plugin().v9;
  ASSERT_EQ(net->init(CaptureLogger), ncclSuccess);
  ncclNetProperties_v9_t p;
  ASSERT_EQ(net->getProperties(0, &p), ncclSuccess);
  CheckCommonProperties<ncclNet_v9_t>(p);
  EXPECT_EQ(p.maxCollBytes, size_t{1} << 30);
  EXPECT_EQ(net->makeVDevice, nullptr);
  for (size_t size : {size_t{0}, size_t{3} << 20}) {
    RoundTrip(
        net, [&](void* h, void** l) { return net->listen(0, h, l); },
        [&](void* h, void** s) {
          ncclNetDeviceHandle_t* dev = nullptr;
          return net->connect(0, h, s, &dev);
        },
        [&](void* c, void* d, size_t n) {
          void* r = nullptr;
          EXPECT_EQ(net->isend(c, d, n, 2, nullptr, &r), ncclSuccess);
          return r;
        },
        [&](void* c, void* d, size_t n) {
          void* data[1] = {d};
          size_t sizes[1] = {n};
          int tags[1] = {2};
          void* mh[1] = {};
          void* r = nullptr;
          EXPECT_EQ(net->irecv(c, 1, data, sizes, tags, mh, &r), ncclSuccess);
          return r;
        },
        size);
  }
}

TEST(NetPluginVersions, V8TableWorksEndToEndWithIntSizes) {
  ASSERT_NE(Plugin().dl, nullptr) << Plugin().error;
  SetTestEnvironment();
  const ncclNet_v8_t* net = Plugin().v8;
  ASSERT_EQ(net->init(CaptureLogger), ncclSuccess);
  ncclNetProperties_v8_t p;
  std::memset(&p, 0xab, sizeof(p));
  ASSERT_EQ(net->getProperties(0, &p), ncclSuccess);
  CheckCommonProperties<ncclNet_v8_t>(p);
  EXPECT_EQ(p.netDeviceVersion, 0);
  for (size_t size : {size_t{0}, size_t{5} << 20}) {
    RoundTrip(
        net, [&](void* h, void** l) { return net->listen(0, h, l); },
        [&](void* h, void** s) {
          ncclNetDeviceHandle_t* dev = nullptr;
          return net->connect(0, h, s, &dev);
        },
        [&](void* c, void* d, size_t n) {
          void* r = nullptr;
          EXPECT_EQ(net->isend(c, d, static_cast<int>(n), 2, nullptr, &r), ncclSuccess);
          return r;
        },
        [&](void* c, void* d, size_t n) {
          void* data[1] = {d};
          int sizes[1] = {static_cast<int>(n)};
          int tags[1] = {2};
          void* mh[1] = {};
          void* r = nullptr;
          EXPECT_EQ(net->irecv(c, 1, data, sizes, tags, mh, &r), ncclSuccess);
          return r;
        },
        size);
  }
  // v8 sizes are ints: a negative one is an argument error.
  void* r = nullptr;
  int neg[1] = {-5};
  void* data[1] = {nullptr};
  EXPECT_NE(net->irecv(nullptr, 1, data, neg, nullptr, nullptr, &r), ncclSuccess);
}

// ---------------------------------------------------------------------------------------------
// v12 (NCCL 2.30, which probes it first): v11's calls with a 128-byte properties struct that ends
// in a rail and a plane id (docs/nccl-net-v12.md).

TEST(NetPluginV12, PropertiesAreV11sPlusUndefinedRailAndPlane) {
  ASSERT_NE(Plugin().dl, nullptr) << Plugin().error;
  ASSERT_NE(Plugin().v12, nullptr);
  SetTestEnvironment();
  ClearLog();
  const ncclNet_v12_t* net = Plugin().v12;
  void* ctx = nullptr;
  ASSERT_EQ(net->init(&ctx, 1, nullptr, CaptureLogger, nullptr), ncclSuccess);
  ASSERT_NE(ctx, nullptr);
  int ndev = 0;
  ASSERT_EQ(net->devices(&ndev), ncclSuccess);
  EXPECT_EQ(ndev, 1);
  // Canary bytes right after the struct: getProperties writes NCCL 2.30's 128 bytes, no more.
  struct Probe {
    ncclNetProperties_v12_t props;
    unsigned char after[32];
  } probe;
  static_assert(offsetof(Probe, after) == 128);
  std::memset(&probe, 0xab, sizeof(probe));
  ASSERT_EQ(net->getProperties(0, &probe.props), ncclSuccess);
  const ncclNetProperties_v12_t& p = probe.props;
  EXPECT_STREQ(p.name, "strait-lo");
  EXPECT_EQ(p.pciPath, nullptr);
  EXPECT_EQ(p.ptrSupport, kNcclPtrHost);
  EXPECT_EQ(p.regIsGlobal, 0);
  EXPECT_EQ(p.forceFlush, 0);
  EXPECT_GT(p.speed, 0);
  EXPECT_EQ(p.port, 0);
  EXPECT_EQ(p.latency, 0.0f);
  EXPECT_GT(p.maxComms, 0);
  EXPECT_EQ(p.maxRecvs, 8);
  EXPECT_EQ(p.netDeviceType, NCCL_NET_DEVICE_HOST);
  EXPECT_EQ(p.netDeviceVersion, 0);
  // One physical device, itself; the four slots v12 added are cleared, not left as garbage.
  EXPECT_EQ(p.vProps.ndevs, 1);
  EXPECT_EQ(p.vProps.devs[0], 0);
  for (int i = 1; i < kNcclNetMaxDevsPerNicV12; ++i) EXPECT_EQ(p.vProps.devs[i], 0) << i;
  EXPECT_GT(p.maxP2pBytes, 0u);
  EXPECT_LE(p.maxP2pBytes, size_t{1} << 40);
  EXPECT_GT(p.maxCollBytes, 0u);
  EXPECT_LE(p.maxCollBytes, size_t{1} << 40);
  EXPECT_EQ(p.maxMultiRequestSize, 1);
  // No rail or plane: NCCL_NET_ID_UNDEF, so NCCL pairs NICs by guid and port as for v11.
  EXPECT_EQ(p.railId, -1);
  EXPECT_EQ(p.planeId, -1);
  // The same read off the raw bytes at NCCL 2.30's offsets (124 and 126, int16 -1 = ff ff),
  // independently of our declaration, and the canary untouched.
  const auto* bytes = reinterpret_cast<const unsigned char*>(&probe);
  for (size_t i = 124; i < 128; ++i) EXPECT_EQ(bytes[i], 0xff) << "byte " << i;
  for (size_t i = 128; i < sizeof(probe); ++i) EXPECT_EQ(bytes[i], 0xab) << "byte " << i;
  // Every field v11 also has reads the same through both tables.
  ncclNetProperties_v11_t q;
  ASSERT_EQ(Plugin().v11->getProperties(0, &q), ncclSuccess);
  EXPECT_STREQ(p.name, q.name);
  EXPECT_EQ(p.guid, q.guid);
  EXPECT_EQ(p.speed, q.speed);
  EXPECT_EQ(p.latency, q.latency);
  EXPECT_EQ(p.maxComms, q.maxComms);
  EXPECT_EQ(p.maxP2pBytes, q.maxP2pBytes);
  EXPECT_EQ(p.maxCollBytes, q.maxCollBytes);
  EXPECT_EQ(net->getProperties(1, &probe.props), ncclInvalidArgument);
  EXPECT_TRUE(WarnedWith({"NET/Strait", "device 1"}));
  EXPECT_NE(net->getProperties(0, nullptr), ncclSuccess);
  EXPECT_EQ(net->makeVDevice, nullptr);
  EXPECT_EQ(net->finalize(ctx), ncclSuccess);
}

TEST(NetPluginV12, TableWorksEndToEnd) {
  ASSERT_NE(Plugin().dl, nullptr) << Plugin().error;
  ASSERT_NE(Plugin().v12, nullptr);
  SetTestEnvironment();
  const ncclNet_v12_t* net = Plugin().v12;
  void* ctx = nullptr;
  ncclNetCommConfig_t config{-1};
  ASSERT_EQ(net->init(&ctx, 12, &config, CaptureLogger, nullptr), ncclSuccess);
  char handle[kNcclNetHandleMaxSize] = {};
  void* listen = nullptr;
  ASSERT_EQ(net->listen(ctx, 0, handle, &listen), ncclSuccess);
  ASSERT_NE(listen, nullptr);
  // Neither side blocks: accept before any connect and the first connect both say "call again".
  void* recv = reinterpret_cast<void*>(0x1234);
  ncclNetDeviceHandle_t* dev = nullptr;
  ASSERT_EQ(net->accept(listen, &recv, &dev), ncclSuccess);
  EXPECT_EQ(recv, nullptr);
  void* send = nullptr;
  ASSERT_EQ(net->connect(ctx, 0, handle, &send, &dev), ncclSuccess);
  EXPECT_EQ(send, nullptr);
  Pair pair;
  ASSERT_EQ(ConnectAccept(net, ctx, handle, listen, &pair), "");
  ASSERT_EQ(net->closeListen(listen), ncclSuccess);
  void* mh = nullptr;
  std::vector<char> reg(4096);
  ASSERT_EQ(net->regMr(pair.send, reg.data(), reg.size(), kNcclPtrHost, &mh), ncclSuccess);
  // Single receives into larger buffers, then one grouped receive of two tags.
  for (size_t size : {size_t{0}, size_t{4097}, (size_t{3} << 20) + 5}) {
    std::vector<char> out(size), in(size + 100);
    FillPattern(out.data(), size, 1200 + size);
    void* data[1] = {in.data()};
    size_t sizes[1] = {in.size()};
    int tags[1] = {3};
    void* mhs[1] = {};
    void* rreq = nullptr;
    ASSERT_EQ(net->irecv(pair.recv, 1, data, sizes, tags, mhs, nullptr, &rreq), ncclSuccess);
    ASSERT_NE(rreq, nullptr);
    void* sreq = nullptr;
    while (sreq == nullptr) {
      ASSERT_EQ(net->isend(pair.send, out.data(), size, 3, mh, nullptr, &sreq), ncclSuccess);
    }
    int got = -1;
    int sent = -1;
    ASSERT_EQ(WaitRequest(net, rreq, &got), ncclSuccess);
    ASSERT_EQ(WaitRequest(net, sreq, &sent), ncclSuccess);
    EXPECT_EQ(got, static_cast<int>(size));
    EXPECT_EQ(sent, static_cast<int>(size));
    EXPECT_EQ(FirstMismatch(in.data(), size, 1200 + size), -1) << size;
  }
  {
    std::vector<char> a(5000), b(70000);
    std::vector<char> in_a(a.size()), in_b(b.size());
    FillPattern(a.data(), a.size(), 1);
    FillPattern(b.data(), b.size(), 2);
    void* data[2] = {in_b.data(), in_a.data()};
    size_t sizes[2] = {in_b.size(), in_a.size()};
    int tags[2] = {20, 10};
    void* mhs[2] = {};
    void* rreq = nullptr;
    ASSERT_EQ(net->irecv(pair.recv, 2, data, sizes, tags, mhs, nullptr, &rreq), ncclSuccess);
    ASSERT_NE(rreq, nullptr);
    void* sa = nullptr;
    void* sb = nullptr;
    while (sa == nullptr) {
      ASSERT_EQ(net->isend(pair.send, a.data(), a.size(), 10, nullptr, nullptr, &sa), ncclSuccess);
    }
    while (sb == nullptr) {
      ASSERT_EQ(net->isend(pair.send, b.data(), b.size(), 20, nullptr, nullptr, &sb), ncclSuccess);
    }
    int got[2] = {-1, -1};
    ASSERT_EQ(WaitRequest(net, rreq, got), ncclSuccess);
    ASSERT_EQ(WaitRequest(net, sa, nullptr), ncclSuccess);
    ASSERT_EQ(WaitRequest(net, sb, nullptr), ncclSuccess);
    EXPECT_EQ(got[0], static_cast<int>(b.size()));
    EXPECT_EQ(got[1], static_cast<int>(a.size()));
    EXPECT_EQ(FirstMismatch(in_b.data(), b.size(), 2), -1);
    EXPECT_EQ(FirstMismatch(in_a.data(), a.size(), 1), -1);
  }
  ncclNetAttr_v12_t attr{};
  EXPECT_EQ(net->setNetAttr(ctx, &attr), ncclSuccess);
  EXPECT_EQ(net->deregMr(pair.send, mh), ncclSuccess);
  EXPECT_EQ(net->closeSend(pair.send), ncclSuccess);
  EXPECT_EQ(net->closeRecv(pair.recv), ncclSuccess);
  EXPECT_EQ(net->finalize(ctx), ncclSuccess);
}

// Every slot but getProperties is v11's own adapter, so everything this file, the multi-process
// and the tunnel tests check through v11 (retries, 32 in flight, closes in flight, lost peers,
// bad handles, tunnels) holds for v12 too. Should v12 ever get its own adapter for one of them,
// this fails and that slot needs its own tests.
TEST(NetPluginV12, SharesEveryCallButGetPropertiesWithV11) {
  ASSERT_NE(Plugin().dl, nullptr) << Plugin().error;
  const ncclNet_v12_t* a = Plugin().v12;
  const ncclNet_v11_t* b = Plugin().v11;
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(a->name, b->name);
  EXPECT_EQ(a->init, b->init);
  EXPECT_EQ(a->devices, b->devices);
  EXPECT_NE(reinterpret_cast<std::uintptr_t>(a->getProperties),
            reinterpret_cast<std::uintptr_t>(b->getProperties));
  EXPECT_EQ(a->listen, b->listen);
  EXPECT_EQ(a->connect, b->connect);
  EXPECT_EQ(a->accept, b->accept);
  EXPECT_EQ(a->regMr, b->regMr);
  EXPECT_EQ(a->regMrDmaBuf, b->regMrDmaBuf);
  EXPECT_EQ(a->deregMr, b->deregMr);
  EXPECT_EQ(a->isend, b->isend);
  EXPECT_EQ(a->irecv, b->irecv);
  EXPECT_EQ(a->iflush, b->iflush);
  EXPECT_EQ(a->test, b->test);
  EXPECT_EQ(a->closeSend, b->closeSend);
  EXPECT_EQ(a->closeRecv, b->closeRecv);
  EXPECT_EQ(a->closeListen, b->closeListen);
  EXPECT_EQ(a->getDeviceMr, b->getDeviceMr);
  EXPECT_EQ(a->irecvConsumed, b->irecvConsumed);
  EXPECT_EQ(a->makeVDevice, nullptr);
  EXPECT_EQ(a->finalize, b->finalize);
  EXPECT_EQ(a->setNetAttr, b->setNetAttr);
}

}  // namespace
}  // namespace strait::nccl::testing

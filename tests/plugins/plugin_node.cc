// One "node" of the multi-process plugin tests: loads libnccl-net-strait.so with dlopen and drives
// its v11 table the way NCCL's proxy thread would, in a ring (send to rank+1, receive from
// rank-1).
//
//   plugin_node PLUGIN.so RANK NRANKS MODE
// Protocol with the parent on stdin/stdout: the node prints "HANDLE <hex>" (its listen handle),
// then reads "PEER <hex>" (the handle of rank+1). MODE:
//   ring         exchange messages of several sizes, 32 in flight, a grouped receive; verify all
//   ring-big     ring, with 4 KiB and 64 MiB messages too (the cross-region tests)
//   close-inflight  start 8 MiB sends and receives, wait for one receive, then close both comms
//                with the rest in flight (must neither crash nor hang)
//   crash        connect, then exit at once without closing anything (a rank that dies)
//   expect-loss  connect, then keep sending until the plugin reports the lost peer
// After connecting every node prints "CONNECTED <n>", n = connect() calls that said "call again".
// Exit status 0 means every check passed; failures are explained on stderr.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <string>
#include <vector>

#include "tests/plugins/plugin_harness.h"

using namespace strait::nccl::testing;  // NOLINT: a small test program

namespace {

const ncclNet_v11_t* g_net = nullptr;
int g_rank = 0;

[[noreturn]] void Die(const std::string& why) {
  std::fprintf(stderr, "node %d: FAIL %s\n", g_rank, why.c_str());
  std::exit(1);
}

std::string Hex(const char* data, size_t n) {
  static const char* kDigits = "0123456789abcdef";
  std::string s;
  for (size_t i = 0; i < n; ++i) {
    s += kDigits[(data[i] >> 4) & 0xf];
    s += kDigits[data[i] & 0xf];
  }
  return s;
}

void Unhex(const std::string& s, char* out, size_t n) {
  if (s.size() != 2 * n) Die("bad handle line from the parent");
  for (size_t i = 0; i < n; ++i)
    out[i] = static_cast<char>(std::stoi(s.substr(2 * i, 2), nullptr, 16));
}

void* Send(void* comm, const void* data, size_t size, int tag) {
  void* req = nullptr;
  for (long i = 0; req == nullptr; ++i) {
    if (g_net->isend(comm, const_cast<void*>(data), size, tag, nullptr, nullptr, &req) !=
        ncclSuccess) {
      Die("isend failed");
    }
    if (i > 100000000) Die("isend never found a free request");
  }
  return req;
}

void* Recv(void* comm, int n, void** data, size_t* sizes, int* tags) {
  void* req = nullptr;
  void* mh[8] = {};
  if (g_net->irecv(comm, n, data, sizes, tags, mh, nullptr, &req) != ncclSuccess) {
    Die("irecv failed");
  }
  if (req == nullptr) Die("irecv had no free request");
  return req;
}

void Wait(void* req, int* sizes, const std::string& what) {
  const ncclResult_t r = WaitRequest(g_net, req, sizes);
  if (r != ncclSuccess) Die(what + ": test() returned " + std::to_string(r));
}

void Ring(void* send, void* recv, int prev, bool big) {
  std::vector<size_t> sizes = {0,        1, 4097, (size_t{1} << 20) + 13, size_t{8} << 20,
                               size_t{16} << 20};
  if (big) {
    sizes.push_back(4096);
    sizes.push_back(size_t{64} << 20);
  }
  for (size_t i = 0; i < sizes.size(); ++i) {
    const size_t size = sizes[i];
    std::vector<char> out(size), in(size + 64);
    FillPattern(out.data(), size, static_cast<uint64_t>(g_rank) * 1000 + i);
    void* data[1] = {in.data()};
    size_t cap[1] = {in.size()};
    int tags[1] = {prev};
    void* rreq = Recv(recv, 1, data, cap, tags);
    void* sreq = Send(send, out.data(), size, g_rank);
    int got = -1;
    Wait(rreq, &got, "receive of " + std::to_string(size));
    Wait(sreq, nullptr, "send of " + std::to_string(size));
    if (got != static_cast<int>(size))
      Die("size " + std::to_string(size) + " arrived as " + std::to_string(got));
    const long long bad = FirstMismatch(in.data(), size, static_cast<uint64_t>(prev) * 1000 + i);
    if (bad >= 0)
      Die("message of " + std::to_string(size) + " bytes differs at " + std::to_string(bad));
  }
  // 32 receives and 32 sends in flight at once.
  constexpr int kN = 32;
  constexpr size_t kSize = 64 * 1024 + 1;
  std::vector<std::vector<char>> in(kN, std::vector<char>(kSize)), out(kN);
  std::vector<void*> rreq, sreq;
  for (int i = 0; i < kN; ++i) {
    void* data[1] = {in[i].data()};
    size_t cap[1] = {kSize};
    int tags[1] = {prev};
    rreq.push_back(Recv(recv, 1, data, cap, tags));
  }
  for (int i = 0; i < kN; ++i) {
    out[i].resize(kSize);
    FillPattern(out[i].data(), kSize, static_cast<uint64_t>(g_rank) * 7777 + i);
    sreq.push_back(Send(send, out[i].data(), kSize, g_rank));
  }
  for (int i = 0; i < kN; ++i) {
    Wait(rreq[i], nullptr, "in-flight receive");
    Wait(sreq[i], nullptr, "in-flight send");
    if (FirstMismatch(in[i].data(), kSize, static_cast<uint64_t>(prev) * 7777 + i) >= 0) {
      Die("in-flight message " + std::to_string(i) + " corrupted");
    }
  }
  // A grouped receive of two, matched by tag (posted in the opposite order of the sends).
  std::vector<char> a(5000), b(3000), ga(5000), gb(5000);
  FillPattern(a.data(), a.size(), 11 + static_cast<uint64_t>(g_rank));
  FillPattern(b.data(), b.size(), 22 + static_cast<uint64_t>(g_rank));
  void* gdata[2] = {gb.data(), ga.data()};
  size_t gcap[2] = {gb.size(), ga.size()};
  int gtags[2] = {1, 0};
  void* greq = Recv(recv, 2, gdata, gcap, gtags);
  void* s0 = Send(send, a.data(), a.size(), 0);
  void* s1 = Send(send, b.data(), b.size(), 1);
  int gsizes[2] = {-1, -1};
  Wait(greq, gsizes, "grouped receive");
  Wait(s0, nullptr, "grouped send 0");
  Wait(s1, nullptr, "grouped send 1");
  if (gsizes[0] != 3000 || gsizes[1] != 5000) Die("grouped receive sizes wrong");
  if (FirstMismatch(ga.data(), 5000, 11 + static_cast<uint64_t>(prev)) >= 0 ||
      FirstMismatch(gb.data(), 3000, 22 + static_cast<uint64_t>(prev)) >= 0) {
    Die("grouped receive put a message in the wrong buffer");
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 5) {
    std::fprintf(stderr, "usage: %s PLUGIN.so RANK NRANKS ring|crash|expect-loss\n", argv[0]);
    return 2;
  }
  g_rank = std::atoi(argv[2]);
  const int nranks = std::atoi(argv[3]);
  const std::string mode = argv[4];
  const LoadedPlugin& plugin = LoadPlugin(argv[1]);
  if (plugin.dl == nullptr || plugin.v11 == nullptr) Die("cannot load plugin: " + plugin.error);
  g_net = plugin.v11;
  void* ctx = nullptr;
  if (g_net->init(&ctx, 7, nullptr, CaptureLogger, nullptr) != ncclSuccess) Die("init failed");
  char handle[kNcclNetHandleMaxSize] = {};
  void* listen = nullptr;
  if (g_net->listen(ctx, 0, handle, &listen) != ncclSuccess) Die("listen failed");
  std::cout << "HANDLE " << Hex(handle, sizeof(handle)) << std::endl;
  std::string word, hex;
  if (!(std::cin >> word >> hex) || word != "PEER") Die("no PEER line from the parent");
  char peer[kNcclNetHandleMaxSize];
  Unhex(hex, peer, sizeof(peer));
  Pair pair;
  const std::string err = ConnectAccept(g_net, ctx, peer, listen, &pair);
  if (!err.empty() && mode == "expect-loss" && err == "connect returned 6") {
    // The peer died before the connection was complete: also a correct report.
    if (pair.recv != nullptr) (void)g_net->closeRecv(pair.recv);
    (void)g_net->closeListen(listen);
    (void)g_net->finalize(ctx);
    std::printf("LOSS-REPORTED\n");
    return 0;
  }
  if (!err.empty()) Die(err);
  std::cout << "CONNECTED " << pair.connect_nulls << std::endl;
  if (g_net->closeListen(listen) != ncclSuccess) Die("closeListen failed");
  const int prev = (g_rank + nranks - 1) % nranks;

  if (mode == "close-inflight") {
    constexpr int kN = 8;
    const size_t size = size_t{8} << 20;
    std::vector<std::vector<char>> in(kN, std::vector<char>(size)), out(kN);
    std::vector<void*> rreq;
    for (int i = 0; i < kN; ++i) {
      void* data[1] = {in[i].data()};
      size_t cap[1] = {size};
      int tags[1] = {prev};
      rreq.push_back(Recv(pair.recv, 1, data, cap, tags));
    }
    for (int i = 0; i < kN; ++i) {
      out[i].assign(size, static_cast<char>(i));
      void* req = nullptr;
      // The peer may close first (it saw its first message): a remote error ends the sending.
      const ncclResult_t r =
          g_net->isend(pair.send, out[i].data(), size, g_rank, nullptr, nullptr, &req);
      if (r == ncclRemoteError) break;
      if (r != ncclSuccess || req == nullptr) Die("isend with requests in flight failed");
    }
    // Traffic flows both ways; then both comms close under the remaining requests.
    // The peer may already be closing its side: a remote error is as fine as data here.
    const ncclResult_t first = WaitRequest(g_net, rreq[0], nullptr);
    if (first != ncclSuccess && first != ncclRemoteError) {
      Die("first in-flight receive: test() returned " + std::to_string(first));
    }
    if (g_net->closeSend(pair.send) != ncclSuccess) Die("closeSend with requests in flight failed");
    if (g_net->closeRecv(pair.recv) != ncclSuccess) Die("closeRecv with requests in flight failed");
    if (g_net->finalize(ctx) != ncclSuccess) Die("finalize failed");
    std::printf("OK\n");
    return 0;
  }

  if (mode == "crash") std::_Exit(0);  // a rank that dies: no close, no finalize
  if (mode == "expect-loss") {
    std::vector<char> out(4 << 20, 'z');
    for (int i = 0; i < 100000; ++i) {
      void* req = nullptr;
      ncclResult_t r = g_net->isend(pair.send, out.data(), out.size(), 0, nullptr, nullptr, &req);
      if (r == ncclSuccess && req != nullptr) r = WaitRequest(g_net, req, nullptr);
      if (r == ncclRemoteError) {
        // Broken comms still close cleanly.
        if (g_net->closeSend(pair.send) != ncclSuccess) Die("closeSend of a broken comm failed");
        if (g_net->closeRecv(pair.recv) != ncclSuccess) Die("closeRecv of a broken comm failed");
        if (g_net->finalize(ctx) != ncclSuccess) Die("finalize failed");
        std::printf("LOSS-REPORTED\n");
        return 0;
      }
      if (r != ncclSuccess) Die("expected ncclRemoteError, got " + std::to_string(r));
    }
    Die("the lost peer was never reported");
  }
  Ring(pair.send, pair.recv, prev, mode == "ring-big");
  if (g_net->closeSend(pair.send) != ncclSuccess) Die("closeSend failed");
  if (g_net->closeRecv(pair.recv) != ncclSuccess) Die("closeRecv failed");
  if (g_net->finalize(ctx) != ncclSuccess) Die("finalize failed");
  std::printf("OK\n");
  return 0;
}

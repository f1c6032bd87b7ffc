// One "node" of the multi-process plugin tests: loads libnccl-net-strait.so with dlopen and drives
// its v11 table the way NCCL's proxy thread would, in a ring (send to rank+1, receive from
// rank-1).
//
//   plugin_node PLUGIN.so RANK NRANKS MODE [BYTES SECONDS WARMUP DEPTH]
// Protocol with the parent on stdin/stdout: the node prints "HANDLE <hex>" (its listen handle),
// then reads "PEER <hex>" (the handle of rank+1). MODE:
//   ring         exchange messages of several sizes, 32 in flight, a grouped receive; verify all
//   ring-big     ring, with 4 KiB and 64 MiB messages too (the cross-region tests)
//   ring-wan     ring with sizes for a slow emulated WAN (0, 1, 4097 B, 1 MiB + 13, 3 MiB + 5),
//                then 32 in flight and the grouped receive as in ring
//   bench        throughput (bench/plugin_throughput.sh): rank 0 keeps DEPTH (default 4) sends
//                of BYTES in flight for SECONDS, then sends DEPTH empty messages as the end mark;
//                rank 1 keeps DEPTH receives posted and prints "GOODPUT <Mbit/s> BYTES <n>
//                SECONDS <s> MESSAGES <n>" over the messages completed between WARMUP seconds
//                after its first completion and WARMUP seconds before the sender stops (SECONDS
//                after that first completion, give or take the first message's time): the
//                pipeline is full at both ends of that window, so bytes buffered in gateways and
//                sockets at its start do not count as if they crossed inside it. Both ranks print
//                "CPU <user+system seconds of the process during the transfer>". The payload is
//                incompressible (a gateway must not make it look faster by compressing it). With
//                PLUGIN_NODE_TRACE set, rank 1 also logs "DONE <seconds>" per message on stderr.
//   close-inflight  start 8 MiB sends and receives, wait for one receive, then close both comms
//                with the rest in flight (must neither crash nor hang)
//   crash        connect, then exit at once without closing anything (a rank that dies)
//   expect-loss  connect, then keep sending until the plugin reports the lost peer
// After connecting every node prints "CONNECTED <n>", n = connect() calls that said "call again".
// Exit status 0 means every check passed; failures are explained on stderr.
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
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

void Ring(void* send, void* recv, int prev, const std::vector<size_t>& sizes) {
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

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

double CpuSeconds() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
         1e-6 * static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec);
}

// One test() of `req`: true when done; dies on an error. The bench loops sleep 100 us between
// rounds instead of spinning: on a small machine the node's poll loop must not take the CPU the
// plugin's I/O thread needs (NCCL's proxy spins, but on machines with cores to spare), and
// 100 us is far below one message's time at any rate measured.
bool Poll(void* req, int* size, const std::string& what) {
  int done = 0;
  const ncclResult_t r = g_net->test(req, &done, size);
  if (r != ncclSuccess) Die(what + ": test() returned " + std::to_string(r));
  return done != 0;
}

// Rank 0 streams messages to rank 1 (see the file comment); rank 1 measures.
void Bench(void* send, void* recv, size_t bytes, double seconds, double warmup, int depth) {
  // CPU seconds of the transfer only: filling and checking the buffers is the bench's own work.
  double cpu0 = 0, cpu = 0;
  const double deadline_slack = kDeadlineSeconds;  // no progress for this long: fail, not hang
  if (g_rank == 0) {
    std::vector<std::vector<char>> bufs(static_cast<size_t>(depth), std::vector<char>(bytes));
    std::vector<void*> reqs(bufs.size(), nullptr);
    for (size_t i = 0; i < bufs.size(); ++i) FillPattern(bufs[i].data(), bytes, 99 + i);
    cpu0 = CpuSeconds();
    const double end = Now() + seconds;
    for (size_t i = 0; i < bufs.size(); ++i) reqs[i] = Send(send, bufs[i].data(), bytes, 0);
    size_t sent = bufs.size();
    double last_progress = Now();
    while (true) {
      bool any = false;
      for (size_t i = 0; i < reqs.size(); ++i) {
        if (reqs[i] == nullptr || !Poll(reqs[i], nullptr, "bench send")) continue;
        any = true;
        reqs[i] = Now() < end ? Send(send, bufs[i].data(), bytes, 0) : nullptr;
        if (reqs[i] != nullptr) ++sent;
      }
      if (std::all_of(reqs.begin(), reqs.end(), [](void* r) { return r == nullptr; })) break;
      if (any) last_progress = Now();
      if (Now() - last_progress > deadline_slack) Die("bench send made no progress");
      usleep(100);
    }
    // The end mark: one empty message per receive the peer keeps posted.
    std::vector<void*> ends;
    for (int i = 0; i < depth; ++i) ends.push_back(Send(send, nullptr, 0, 0));
    for (void* r : ends) Wait(r, nullptr, "bench end mark");
    cpu = CpuSeconds() - cpu0;
    std::printf("SENT %zu\n", sent);
  } else if (g_rank == 1) {
    std::vector<std::vector<char>> bufs(static_cast<size_t>(depth), std::vector<char>(bytes));
    std::vector<void*> reqs(static_cast<size_t>(depth), nullptr);
    auto post = [&](size_t i) {
      void* data[1] = {bufs[i].data()};
      size_t cap[1] = {bytes};
      int tags[1] = {0};
      reqs[i] = Recv(recv, 1, data, cap, tags);
    };
    cpu0 = CpuSeconds();
    for (size_t i = 0; i < reqs.size(); ++i) post(i);
    // Completions in posting order (the plugin matches per tag in FIFO order).
    std::vector<double> done;  // completion time of every data message
    size_t next = 0;
    int ends = 0;
    double last_progress = Now();
    while (ends < depth) {
      int size = -1;
      if (!Poll(reqs[next], &size, "bench receive")) {
        if (Now() - last_progress > deadline_slack) Die("bench receive made no progress");
        usleep(100);
        continue;
      }
      last_progress = Now();
      reqs[next] = nullptr;
      if (size == 0) {
        ++ends;
      } else {
        if (static_cast<size_t>(size) != bytes) Die("bench message of " + std::to_string(size));
        done.push_back(Now());
        if (ends == 0) post(next);
      }
      next = (next + 1) % reqs.size();
    }
    cpu = CpuSeconds() - cpu0;
    if (done.empty()) Die("bench: no message arrived");
    if (std::getenv("PLUGIN_NODE_TRACE") != nullptr) {  // completion times, for a rate plot
      for (double t : done) std::fprintf(stderr, "DONE %.3f\n", t - done.front());
    }
    // The last message in buffer 0 came from one of the sender's buffers: find which by its
    // first bytes, then check it whole (the tests check every byte; this catches a bench that
    // measures garbage).
    std::vector<char> head(std::min<size_t>(bytes, 4096));
    int from = -1;
    for (int i = 0; i < depth && from < 0; ++i) {
      FillPattern(head.data(), head.size(), 99 + static_cast<uint64_t>(i));
      if (std::memcmp(head.data(), bufs[0].data(), head.size()) == 0) from = i;
    }
    if (from < 0 || FirstMismatch(bufs[0].data(), bytes, 99 + static_cast<uint64_t>(from)) >= 0) {
      Die("bench payload corrupted");
    }
    // The window: from WARMUP seconds after the first completion to WARMUP seconds before the
    // sender stopped, fixed times (a window bounded by completions would blow up when two
    // messages complete together after a stall); the bytes of the messages completed inside it.
    // Its error is at most a message's bytes at each end, and averages out.
    const double begin = done.front() + warmup;
    const double end = done.front() + seconds - warmup;
    uint64_t in_window = 0;
    for (double t : done) in_window += (t > begin && t <= end) ? 1 : 0;
    if (end <= begin || in_window < 2) {
      Die("bench: " + std::to_string(in_window) + " of " + std::to_string(done.size()) +
          " messages completed inside the measuring window: run longer or with smaller messages");
    }
    const uint64_t window_bytes = in_window * bytes;
    std::printf("GOODPUT %.1f BYTES %llu SECONDS %.3f MESSAGES %llu\n",
                8e-6 * static_cast<double>(window_bytes) / (end - begin),
                static_cast<unsigned long long>(window_bytes), end - begin,
                static_cast<unsigned long long>(in_window));
  }
  std::printf("CPU %.3f\n", cpu);
  std::fflush(stdout);
}
}  // namespace

int main(int argc, char** argv) {
  if (argc < 5 || argc > 9) {
    std::fprintf(stderr,
                 "usage: %s PLUGIN.so RANK NRANKS "
                 "ring|ring-big|ring-wan|close-inflight|crash|expect-loss|bench "
                 "[BYTES SECONDS WARMUP DEPTH]\n",
                 argv[0]);
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
  if (mode == "bench") {
    const size_t bytes = argc > 5 ? std::strtoull(argv[5], nullptr, 10) : size_t{64} << 20;
    const double seconds = argc > 6 ? std::atof(argv[6]) : 5;
    const double warmup = argc > 7 ? std::atof(argv[7]) : 1;
    const int depth = argc > 8 ? std::atoi(argv[8]) : 4;
    if (bytes == 0 || seconds <= 0 || warmup < 0 || depth < 1 || depth > 32) {
      Die("bench needs BYTES > 0, SECONDS > 0, WARMUP >= 0 and DEPTH 1-32");
    }
    Bench(pair.send, pair.recv, bytes, seconds, warmup, depth);
  } else {
    std::vector<size_t> sizes = {
        0, 1, 4097, (size_t{1} << 20) + 13, size_t{8} << 20, size_t{16} << 20};
    if (mode == "ring-big") {
      sizes.push_back(4096);
      sizes.push_back(size_t{64} << 20);
    } else if (mode == "ring-wan") {
      sizes = {0, 1, 4097, (size_t{1} << 20) + 13, (size_t{3} << 20) + 5};
    } else if (mode != "ring") {
      Die("unknown mode " + mode);
    }
    Ring(pair.send, pair.recv, prev, sizes);
  }
  if (g_net->closeSend(pair.send) != ncclSuccess) Die("closeSend failed");
  if (g_net->closeRecv(pair.recv) != ncclSuccess) Die("closeRecv failed");
  if (g_net->finalize(ctx) != ncclSuccess) Die("finalize failed");
  std::printf("OK\n");
  return 0;
}

// The local path between a rank and its straitd, alone: a one-region gateway in this process
// (no WAN, so an all-reduce is the hand-over to the gateway and back) driven by a Client, the
// tensor through the socket (the frame carries it both ways) against through a shared region
// (only descriptors cross the socket; localproto/shm.h). Beside them, in the same run, the bound:
// memcpy of the tensor twice (into the region and back, what the shared path costs the rank at
// the least). Every benchmark reports bytes/s of tensor.
//
//   local_path_micro                                  # 1, 16 and 64 MiB, both paths
//   local_path_micro --benchmark_format=json          # for scripts
#include <benchmark/benchmark.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "gateway/gateway.h"
#include "localproto/client.h"

namespace strait::bench {
namespace {

// One solo gateway for the whole run: its socket lives in a fresh temporary directory.
class SoloGateway {
 public:
  static SoloGateway& Get() {
    static SoloGateway* g = new SoloGateway();  // lives until exit: benchmarks share it
    return *g;
  }
  const std::string& socket() const { return socket_; }
  bool ok() const { return gateway_ != nullptr; }

 private:
  SoloGateway() {
    char tmpl[] = "/tmp/strait-local-bench-XXXXXX";
    if (::mkdtemp(tmpl) == nullptr) return;
    socket_ = std::string(tmpl) + "/gw.sock";
    gateway::GatewayConfig c;
    c.file = "local_path_micro";
    c.region = "solo";
    c.local_socket = socket_;
    c.allowed_uids = {::getuid()};
    c.wan_listen = {"127.0.0.1", 0};
    c.transport = net::Transport::kPlainTcp;
    auto g = gateway::Gateway::Start(c);
    if (!g.ok()) {
      std::fprintf(stderr, "local_path_micro: %s\n", g.status().ToString().c_str());
      return;
    }
    gateway_ = std::move(g).value();
  }
  std::string socket_;
  std::unique_ptr<gateway::Gateway> gateway_;
};

void AllReduce(benchmark::State& state, bool shared) {
  SoloGateway& g = SoloGateway::Get();
  if (!g.ok()) return state.SkipWithError("no gateway");
  auto client = localproto::Client::Connect(g.socket(), Deadline::AfterSeconds(5), "bench");
  if (!client.ok()) return state.SkipWithError(client.status().ToString().c_str());
  (*client)->UseSharedMemory(shared);
  if (!(*client)->RegisterJob("bench", "none", Deadline::AfterSeconds(5)).ok()) {
    return state.SkipWithError("register");
  }
  const size_t count = static_cast<size_t>(state.range(0)) / sizeof(float);
  std::vector<float> data(count, 1.0f);
  for (auto _ : state) {
    Status s = (*client)->AllReduce("bench", "t", DataType::kFloat32, ReduceOp::kSum, data.data(),
                                    count, Deadline::AfterSeconds(60));
    if (!s.ok()) return state.SkipWithError(s.ToString().c_str());
  }
  if (data[0] != 1.0f) return state.SkipWithError("a one-region sum changed the tensor");
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * state.range(0));
  state.counters["region_bytes"] = static_cast<double>((*client)->shared_region_bytes());
}

void BM_Socket(benchmark::State& state) { AllReduce(state, false); }
void BM_SharedRegion(benchmark::State& state) { AllReduce(state, true); }

// The bound of the shared path on the rank's side: the tensor copied in and out once each.
void BM_MemcpyTwice(benchmark::State& state) {
  const size_t bytes = static_cast<size_t>(state.range(0));
  std::vector<uint8_t> a(bytes, 1), b(bytes, 2);
  for (auto _ : state) {
    std::memcpy(b.data(), a.data(), bytes);
    std::memcpy(a.data(), b.data(), bytes);
    benchmark::DoNotOptimize(a.data());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * state.range(0));
}

constexpr int64_t kMiB = 1 << 20;
BENCHMARK(BM_MemcpyTwice)->Arg(kMiB)->Arg(16 * kMiB)->Arg(64 * kMiB)->UseRealTime();
BENCHMARK(BM_Socket)->Arg(kMiB)->Arg(16 * kMiB)->Arg(64 * kMiB)->UseRealTime();
BENCHMARK(BM_SharedRegion)->Arg(kMiB)->Arg(16 * kMiB)->Arg(64 * kMiB)->UseRealTime();

}  // namespace
}  // namespace strait::bench

BENCHMARK_MAIN();

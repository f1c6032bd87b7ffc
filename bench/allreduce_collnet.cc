// `strait-bench allreduce --collnet PLUGIN`'s hidden rank mode: one node head that loads
// libnccl-net-strait.so with dlopen and drives its CollNet table (v11) the way NCCL's proxy
// thread does in CollNet mode -- the tensor cut into chunks, up to kInFlight iallreduce requests
// outstanding, test() polled -- against the straitd of its (region, index). Each chunk is then a
// region all-reduce in straitd (reduce-scatter over the region's LAN, the cross-region mesh on
// the shard, all-gather), so the row measures the plugin's CollNet path beside library mode on
// the same gateways and links.
//
// The heads exchange their listen handles through files in the run's barrier directory (as NCCL
// exchanges them through its bootstrap). Head i of region r holds region r's tensor divided by
// the region's head count, so the region all-reduce's result is the same sum over regions that
// library mode's rows are checked against.
#include <dlfcn.h>
#include <fcntl.h>
#include <unistd.h>

#include <chrono>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <sstream>
#include <thread>

#include "bench/allreduce_internal.h"
#include "bench/gradient.h"
#include "common/hash.h"
#include "localproto/client.h"
#include "plugins/nccl/nccl_net.h"

namespace strait::bench::allreduce {

namespace {

// NCCL keeps up to NCCL_STEPS (8) CollNet operations of a channel group in flight; the plugin
// runs 8 worker connections to straitd.
constexpr int kInFlight = 8;

ncclDataType_t NcclType(DataType t) {
  switch (t) {
    case DataType::kBfloat16: return ncclBfloat16;
    case DataType::kFloat16: return ncclFloat16;
    default: return ncclFloat32;
  }
}

void Logger(ncclDebugLogLevel level, unsigned long, const char*, int, const char* fmt, ...) {
  if (level != NCCL_LOG_WARN) return;
  char buf[2048];
  va_list ap;
  va_start(ap, fmt);
  std::vsnprintf(buf, sizeof(buf), fmt, ap);
  va_end(ap);
  std::cerr << "plugin WARN: " << buf << '\n';
}

std::string ToHex(const unsigned char* p, size_t n) {
  static const char* kDigits = "0123456789abcdef";
  std::string s;
  for (size_t i = 0; i < n; ++i) {
    s += kDigits[p[i] >> 4];
    s += kDigits[p[i] & 0xf];
  }
  return s;
}

// Publishes this head's handle as <dir>/handle.<rank> (written whole, then renamed) and reads
// every head's, waiting for the late ones until `deadline`.
StatusOr<std::vector<std::vector<unsigned char>>> ExchangeHandles(const std::string& dir, int rank,
                                                                  int nranks,
                                                                  const unsigned char* mine,
                                                                  Deadline deadline) {
  const std::string path = dir + "/handle." + std::to_string(rank);
  std::ofstream(path + ".tmp") << ToHex(mine, kNcclNetHandleMaxSize);
  if (::rename((path + ".tmp").c_str(), path.c_str()) != 0) {
    return UnavailableError("cannot publish " + path + ": " + std::strerror(errno));
  }
  std::vector<std::vector<unsigned char>> all;
  for (int r = 0; r < nranks; ++r) {
    const std::string theirs = dir + "/handle." + std::to_string(r);
    std::string hex;
    while ((hex = ReadFile(theirs)).size() != 2 * kNcclNetHandleMaxSize) {
      if (deadline.Expired()) {
        return DeadlineExceededError("head " + std::to_string(r) + " published no handle");
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    std::vector<unsigned char> h(kNcclNetHandleMaxSize);
    for (size_t i = 0; i < h.size(); ++i) {
      h[i] = static_cast<unsigned char>(std::stoi(hex.substr(2 * i, 2), nullptr, 16));
    }
    all.push_back(std::move(h));
  }
  return all;
}

class Head {
 public:
  explicit Head(const Flags& f) : f_(f) {}
  ~Head() {
    if (comm_ != nullptr) t_->closeColl(comm_);
    if (ctx_ != nullptr) t_->finalize(ctx_);
    // The plugin stays loaded: its loop thread may outlive finalize by a moment.
  }

  Status Open() {
    // The plugin reads its settings from the environment, as in a training job.
    ::setenv("STRAIT_GATEWAY", f_.socket.c_str(), 1);
    ::setenv("STRAIT_JOB_ID", f_.job.c_str(), 1);
    ::setenv("STRAIT_COMPRESSION", f_.codec.c_str(), 1);
    void* lib = ::dlopen(f_.collnet.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (lib == nullptr) return UnavailableError(std::string("dlopen: ") + ::dlerror());
    t_ = static_cast<const ncclCollNet_v11_t*>(::dlsym(lib, "ncclCollNetPlugin_v11"));
    if (t_ == nullptr) return UnavailableError(f_.collnet + " has no ncclCollNetPlugin_v11");
    if (t_->init(&ctx_, 1, Logger) != ncclSuccess) return UnavailableError("collnet init failed");
    unsigned char handle[kNcclNetHandleMaxSize] = {};
    void* listen_comm = nullptr;
    if (ncclResult_t r = t_->listen(ctx_, 0, handle, &listen_comm); r != ncclSuccess) {
      return UnavailableError("collnet listen failed (" + std::to_string(r) + ")");
    }
    const int rank = f_.rank_region * f_.ranks_per_region + f_.rank_index;
    const int nranks = f_.regions * f_.ranks_per_region;
    StatusOr<std::vector<std::vector<unsigned char>>> handles =
        ExchangeHandles(f_.barrier, rank, nranks, handle, Deadline::AfterSeconds(120));
    if (!handles.ok()) {
      t_->closeListen(listen_comm);
      return std::move(handles).status();
    }
    std::vector<void*> ptrs;
    for (auto& h : *handles) ptrs.push_back(h.data());
    const ncclResult_t cr = t_->connect(ptrs.data(), nranks, rank, listen_comm, &comm_);
    t_->closeListen(listen_comm);
    if (cr != ncclSuccess || comm_ == nullptr) {
      return UnavailableError("collnet connect failed (" + std::to_string(cr) +
                              "); the plugin's WARN above says why");
    }
    return Status::Ok();
  }

  // One all-reduce of `count` elements from `send` into `recv` (out of place, as nccl-tests
  // runs first): chunks of --collnet-chunk bytes, kInFlight outstanding; a NULL request (the
  // plugin's cap) is retried after the next test.
  Status AllReduce(const uint8_t* send, uint8_t* recv, size_t count, Deadline deadline) {
    const size_t elem = DataTypeSize(f_.dtype);
    const size_t per = std::max<size_t>(1, f_.collnet_chunk / elem);
    std::vector<void*> window;  // requests in flight
    size_t next = 0;
    while (next < count || !window.empty()) {
      while (next < count && window.size() < kInFlight) {
        const size_t n = std::min(per, count - next);
        void* req = nullptr;
        // NCCL's table takes a non-const send buffer; the plugin only reads it.
        void* in = const_cast<uint8_t*>(send + next * elem);
        if (ncclResult_t r = t_->iallreduce(comm_, in, recv + next * elem, n, NcclType(f_.dtype),
                                            ncclSum, nullptr, nullptr, &req);
            r != ncclSuccess) {
          return UnknownError("iallreduce failed (" + std::to_string(r) + ")");
        }
        if (req == nullptr) break;  // the plugin's request cap: test first
        window.push_back(req);
        next += n;
      }
      // Requests complete in any order; poll them all.
      for (size_t k = 0; k < window.size();) {
        int done = 0, size = 0;
        if (ncclResult_t r = t_->test(window[k], &done, &size); r != ncclSuccess) {
          return UnknownError("test failed (" + std::to_string(r) +
                              "); the plugin's WARN above says why");
        }
        if (done) {
          window.erase(window.begin() + static_cast<std::ptrdiff_t>(k));
        } else {
          ++k;
        }
      }
      if (deadline.Expired()) return DeadlineExceededError("collnet all-reduce took too long");
      // Six heads share two cores here, where NCCL's proxy would poll on a node of its own: a
      // tight poll takes the time straitd needs. Each request is a 4 MiB region all-reduce of
      // 60 ms or more, so 2 ms between polls delays little; against 0.5 ms it gave CollNet
      // 1372-1795 ms (median 1398) against 1424-1630 (median 1510) in alternating runs
      // (bench/README.md, "2026-12-07 (later)").
      if (!window.empty()) std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    return Status::Ok();
  }

 private:
  const Flags& f_;
  const ncclCollNet_v11_t* t_ = nullptr;
  void* ctx_ = nullptr;
  void* comm_ = nullptr;
};

int Fail(const Flags& f, const std::string& what, const Status& s) {
  std::cerr << "collnet head r" << f.rank_region << "." << f.rank_index << ": " << what << ": " << s
            << '\n';
  return kExitFailure;
}

}  // namespace

int RunCollNetRank(const Flags& f) {
  const size_t elem = DataTypeSize(f.dtype);
  const size_t count = f.size / elem;
  // Region r's tensor over its heads: the region all-reduce sums them back (exactly when the
  // head count is a power of two).
  std::vector<uint8_t> input(count * elem), data(input.size());
  {
    std::vector<float> full(count);
    FillGradient(RegionSeed(f.rank_region), full);
    const float share = 1.0f / static_cast<float>(f.ranks_per_region);
    for (float& x : full) x *= share;
    if (Status s = ConvertGradient(full, f.dtype, input.data()); !s.ok()) {
      return Fail(f, "input", s);
    }
  }
  Head head(f);
  if (Status s = head.Open(); !s.ok()) return Fail(f, "open", s);
  // A connection of its own for straitd's counters (the plugin's are its workers').
  StatusOr<std::unique_ptr<localproto::Client>> stats_client = localproto::Client::Connect(
      f.socket, Deadline::AfterSeconds(10), "bench-collnet", static_cast<uint32_t>(f.rank_index));
  if (!stats_client.ok()) return Fail(f, "stats connection", stats_client.status());
  Json times = Json::array(), starts = Json::array();
  std::string stats_before;
  const int rank = f.rank_region * f.ranks_per_region + f.rank_index;
  for (int it = 0; it < f.warmup + f.iters; ++it) {
    if (it == f.warmup) {
      StatusOr<std::string> stats = (*stats_client)->Stats(Deadline::AfterSeconds(10));
      if (stats.ok()) stats_before = *stats;
    }
    // Out of place: `input` stays as it is, so no 64 MiB copy per iteration competes for the
    // CPU with the heads still running the previous iteration (six heads on two cores here).
    if (Status b = IterationBarrier(f.barrier, rank, f.regions * f.ranks_per_region, it,
                                    Deadline::AfterSeconds(f.timeout_s));
        !b.ok()) {
      return Fail(f, "barrier", b);
    }
    const int64_t t0 = MonotonicNanos();
    if (Status s = head.AllReduce(input.data(), data.data(), count,
                                  Deadline::AfterSeconds(f.timeout_s));
        !s.ok()) {
      return Fail(f, "all-reduce " + std::to_string(it), s);
    }
    const int64_t t1 = MonotonicNanos();
    if (it >= f.warmup) {
      times.push_back(t1 - t0);
      starts.push_back(t0);
    }
    Emit("progress " + std::to_string(it + 1));
  }
  StatusOr<std::string> stats = (*stats_client)->Stats(Deadline::AfterSeconds(10));
  std::vector<float> result(count);
  if (Status s = ConvertToFloat(data.data(), f.dtype, result.data(), count); !s.ok()) {
    return Fail(f, "result", s);
  }
  // CollNet registers lossy policies without error feedback (plugins/README.md).
  const Check c = CheckAgainstReference(result.data(), count, 0, count, f.regions,
                                        LossyLevels(f.codec), f.dtype);
  const Json out = RankResult(f, f.codec, times, starts, stats_before, stats, c, data);
  Emit("result " + out.dump());
  return kExitOk;
}

}  // namespace strait::bench::allreduce

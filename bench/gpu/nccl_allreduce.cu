// strait_nccl_allreduce: one rank of a small NCCL all-reduce benchmark, for the GPU end-to-end
// script (bench/nccl_gpu_e2e.sh). Each process is one rank on the GPU it is given; the script
// runs several on GPU 0 with distinct NCCL_HOSTID values, so each counts as its own node and all
// traffic crosses the net plugin (a test setup: NVIDIA does not support several ranks per GPU in
// production).
//
// Rendezvous of the ncclUniqueId: rank 0 writes it to --uid-file (written to a temporary name and
// renamed, so a reader never sees half of it); the others poll for the file (--timeout).
//
// For every size: a float32 sum all-reduce whose inputs are small integers, so the exact result is
// known ((i % 13 + 1) * nranks * (nranks + 1) / 2 at element i) and any wrong byte is caught; then
// --warmup untimed and --iters timed runs on one stream (CUDA events). Output, one line per size:
//   RESULT bytes=<n> time_us=<mean per all-reduce> algbw_GBps=<bytes/time> busbw_GBps=<algbw *
//   2(n-1)/n>
// and "CHECK ok" at the end. Exit status: 0 when every result was exact, 1 when one was wrong,
// 2 on a usage, CUDA or NCCL error (the message says which call failed).
#include <cuda_runtime.h>
#include <nccl.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

namespace {

#define CUDA_OR_DIE(call)                                                                      \
  do {                                                                                         \
    cudaError_t e_ = (call);                                                                   \
    if (e_ != cudaSuccess) {                                                                   \
      std::fprintf(stderr, "rank %d: %s failed: %s\n", g_rank, #call, cudaGetErrorString(e_)); \
      std::exit(2);                                                                            \
    }                                                                                          \
  } while (0)

#define NCCL_OR_DIE(call)                                                                          \
  do {                                                                                             \
    ncclResult_t r_ = (call);                                                                      \
    if (r_ != ncclSuccess) {                                                                       \
      std::fprintf(stderr, "rank %d: %s failed: %s (%s)\n", g_rank, #call, ncclGetErrorString(r_), \
                   ncclGetLastError(nullptr));                                                     \
      std::exit(2);                                                                                \
    }                                                                                              \
  } while (0)

int g_rank = -1;

struct Options {
  int rank = -1;
  int nranks = 0;
  int device = 0;
  std::string uid_file;
  std::vector<size_t> sizes = {size_t{1} << 20, size_t{16} << 20};
  int iters = 5;
  int warmup = 2;
  int timeout_s = 120;
};

[[noreturn]] void Usage(const char* why) {
  std::fprintf(stderr,
               "strait_nccl_allreduce: %s\n"
               "usage: strait_nccl_allreduce --rank R --nranks N --uid-file PATH\n"
               "         [--device D] [--sizes 1M,16M] [--iters 5] [--warmup 2] [--timeout 120]\n",
               why);
  std::exit(2);
}

// "4096", "64K", "16M", "1G" (binary units).
size_t ParseSize(const std::string& s) {
  char* end = nullptr;
  const unsigned long long v = std::strtoull(s.c_str(), &end, 10);
  size_t mult = 1;
  if (*end == 'K' || *end == 'k') mult = size_t{1} << 10;
  if (*end == 'M' || *end == 'm') mult = size_t{1} << 20;
  if (*end == 'G' || *end == 'g') mult = size_t{1} << 30;
  if (end == s.c_str() || (mult != 1 && end[1] != '\0') || (mult == 1 && *end != '\0') || v == 0) {
    Usage(("bad size \"" + s + "\"").c_str());
  }
  return static_cast<size_t>(v) * mult;
}

Options Parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) Usage((a + " needs a value").c_str());
      return argv[++i];
    };
    if (a == "--rank") {
      o.rank = std::atoi(value().c_str());
    } else if (a == "--nranks") {
      o.nranks = std::atoi(value().c_str());
    } else if (a == "--device") {
      o.device = std::atoi(value().c_str());
    } else if (a == "--uid-file") {
      o.uid_file = value();
    } else if (a == "--iters") {
      o.iters = std::atoi(value().c_str());
    } else if (a == "--warmup") {
      o.warmup = std::atoi(value().c_str());
    } else if (a == "--timeout") {
      o.timeout_s = std::atoi(value().c_str());
    } else if (a == "--sizes") {
      o.sizes.clear();
      std::string list = value();
      size_t start = 0;
      while (start <= list.size()) {
        const size_t comma = list.find(',', start);
        const std::string item =
            list.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
        o.sizes.push_back(ParseSize(item));
        if (comma == std::string::npos) break;
        start = comma + 1;
      }
    } else {
      Usage(("unknown argument " + a).c_str());
    }
  }
  if (o.nranks < 1 || o.rank < 0 || o.rank >= o.nranks) Usage("need 0 <= --rank < --nranks");
  if (o.uid_file.empty()) Usage("need --uid-file");
  if (o.iters < 1 || o.warmup < 0 || o.timeout_s < 1) Usage("bad --iters/--warmup/--timeout");
  return o;
}

ncclUniqueId ShareUniqueId(const Options& o) {
  ncclUniqueId id;
  if (o.rank == 0) {
    NCCL_OR_DIE(ncclGetUniqueId(&id));
    const std::string tmp = o.uid_file + ".tmp";
    FILE* f = std::fopen(tmp.c_str(), "wb");
    if (f == nullptr || std::fwrite(&id, sizeof(id), 1, f) != 1 || std::fclose(f) != 0 ||
        std::rename(tmp.c_str(), o.uid_file.c_str()) != 0) {
      std::fprintf(stderr, "rank 0: cannot write the unique id to %s\n", o.uid_file.c_str());
      std::exit(2);
    }
    return id;
  }
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(o.timeout_s);
  while (std::chrono::steady_clock::now() < end) {
    FILE* f = std::fopen(o.uid_file.c_str(), "rb");
    if (f != nullptr) {
      const size_t n = std::fread(&id, sizeof(id), 1, f);
      std::fclose(f);
      if (n == 1) return id;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  std::fprintf(stderr, "rank %d: rank 0 wrote no unique id to %s within %d s\n", o.rank,
               o.uid_file.c_str(), o.timeout_s);
  std::exit(2);
}

__global__ void FillKernel(float* x, size_t n, int rank) {
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < n;
       i += size_t{gridDim.x} * blockDim.x) {
    x[i] = static_cast<float>((i % 13 + 1) * static_cast<size_t>(rank + 1));
  }
}

}  // namespace

int main(int argc, char** argv) {
  const Options o = Parse(argc, argv);
  g_rank = o.rank;
  CUDA_OR_DIE(cudaSetDevice(o.device));
  const ncclUniqueId id = ShareUniqueId(o);
  ncclComm_t comm;
  NCCL_OR_DIE(ncclCommInitRank(&comm, o.nranks, id, o.rank));
  cudaStream_t stream;
  CUDA_OR_DIE(cudaStreamCreate(&stream));
  cudaEvent_t start, stop;
  CUDA_OR_DIE(cudaEventCreate(&start));
  CUDA_OR_DIE(cudaEventCreate(&stop));

  bool all_ok = true;
  for (size_t bytes : o.sizes) {
    const size_t count = bytes / sizeof(float);
    if (count == 0) continue;
    float* send = nullptr;
    float* recv = nullptr;
    CUDA_OR_DIE(cudaMalloc(&send, count * sizeof(float)));
    CUDA_OR_DIE(cudaMalloc(&recv, count * sizeof(float)));
    FillKernel<<<256, 256, 0, stream>>>(send, count, o.rank);
    CUDA_OR_DIE(cudaGetLastError());
    CUDA_OR_DIE(cudaMemsetAsync(recv, 0xff, count * sizeof(float), stream));  // NaN if unwritten

    // Correctness first: one all-reduce, checked element by element.
    NCCL_OR_DIE(ncclAllReduce(send, recv, count, ncclFloat32, ncclSum, comm, stream));
    CUDA_OR_DIE(cudaStreamSynchronize(stream));
    std::vector<float> host(count);
    CUDA_OR_DIE(cudaMemcpy(host.data(), recv, count * sizeof(float), cudaMemcpyDeviceToHost));
    const size_t tri = static_cast<size_t>(o.nranks) * (o.nranks + 1) / 2;
    size_t bad = 0;
    size_t first_bad = 0;
    for (size_t i = 0; i < count; ++i) {
      const float want = static_cast<float>((i % 13 + 1) * tri);
      if (host[i] != want) {
        if (bad++ == 0) first_bad = i;
      }
    }
    if (bad != 0) {
      std::printf("CHECK FAILED bytes=%zu wrong=%zu first=%zu got=%g want=%g\n", bytes, bad,
                  first_bad, host[first_bad], static_cast<double>((first_bad % 13 + 1) * tri));
      all_ok = false;
    }

    for (int i = 0; i < o.warmup; ++i) {
      NCCL_OR_DIE(ncclAllReduce(send, recv, count, ncclFloat32, ncclSum, comm, stream));
    }
    CUDA_OR_DIE(cudaEventRecord(start, stream));
    for (int i = 0; i < o.iters; ++i) {
      NCCL_OR_DIE(ncclAllReduce(send, recv, count, ncclFloat32, ncclSum, comm, stream));
    }
    CUDA_OR_DIE(cudaEventRecord(stop, stream));
    CUDA_OR_DIE(cudaEventSynchronize(stop));
    float ms = 0;
    CUDA_OR_DIE(cudaEventElapsedTime(&ms, start, stop));
    const double us = 1000.0 * ms / o.iters;
    const double algbw = static_cast<double>(count * sizeof(float)) / (us * 1e3);  // GB/s
    const double busbw = algbw * 2.0 * (o.nranks - 1) / o.nranks;
    if (o.rank == 0) {
      std::printf("RESULT bytes=%zu time_us=%.1f algbw_GBps=%.3f busbw_GBps=%.3f\n",
                  count * sizeof(float), us, algbw, busbw);
      std::fflush(stdout);
    }
    CUDA_OR_DIE(cudaFree(send));
    CUDA_OR_DIE(cudaFree(recv));
  }
  NCCL_OR_DIE(ncclCommDestroy(comm));
  CUDA_OR_DIE(cudaStreamDestroy(stream));
  if (o.rank == 0 && all_ok) std::printf("CHECK ok\n");
  return all_ok ? 0 : 1;
}

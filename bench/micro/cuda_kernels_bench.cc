// cuda_kernels_bench: throughput of the GPU quantization kernels (lib/cuda) against the device's
// own copy bandwidth, measured in the same run.
//
// For each codec x input type x rounding it times QuantizeAsync with error feedback and reports
// GB/s of bytes moved (input read + residual read + residual written + stage written), beside a
// device-to-device cudaMemcpyAsync moving the same number of bytes (half read, half written),
// and the fraction quantize / copy (goal: >= 0.8). Dequantize-accumulate rows count stage read +
// accumulator read and written. Times are CUDA events around each launch; the median of --iters
// runs after --warmup runs. Exits 77 (the ctest/automake "skipped" code) without a CUDA device.
//
//   cuda_kernels_bench [--size-mib N] [--iters N] [--warmup N] [--block N]
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "common/version.h"
#include "cuda/quantize.h"
#include "strait/codec.h"
#include "strait/types.h"

namespace {

using strait::CodecId;
using strait::CodecOptions;
using strait::DataType;
using strait::Rounding;
using strait::Status;

constexpr double kGoal = 0.8;

#define CHECK_CUDA(expr)                                                        \
  do {                                                                          \
    const cudaError_t err_ = (expr);                                            \
    if (err_ != cudaSuccess) {                                                  \
      std::fprintf(stderr, "%s failed: %s\n", #expr, cudaGetErrorString(err_)); \
      std::exit(1);                                                             \
    }                                                                           \
  } while (0)

void CheckStatus(const Status& s) {
  if (!s.ok()) {
    std::fprintf(stderr, "error: %s\n", s.ToString().c_str());
    std::exit(1);
  }
}

struct Args {
  size_t size_mib = 256;  // fp32 input size; bf16 rows use the same element count
  int iters = 20;
  int warmup = 3;
  uint32_t block = strait::kDefaultBlockSize;
};

bool ParseArgs(int argc, char** argv, Args* args) {
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&](long min) -> long {
      if (i + 1 >= argc) return -1;
      const long v = std::strtol(argv[++i], nullptr, 10);
      return v >= min ? v : -1;
    };
    long v = 0;
    if (a == "--size-mib" && (v = value(1)) > 0) {
      args->size_mib = static_cast<size_t>(v);
    } else if (a == "--iters" && (v = value(1)) > 0) {
      args->iters = static_cast<int>(v);
    } else if (a == "--warmup" && (v = value(0)) >= 0) {
      args->warmup = static_cast<int>(v);
    } else if (a == "--block" && (v = value(32)) > 0) {
      args->block = static_cast<uint32_t>(v);
    } else {
      std::fprintf(
          stderr,
          "usage: %s [--size-mib N>=1] [--iters N>=1] [--warmup N>=0] [--block 32..65536]\n",
          argv[0]);
      return false;
    }
  }
  return true;
}

// Median milliseconds of `iters` timed runs of `launch` on `stream`, after `warmup` untimed ones.
double MedianMs(const std::function<void()>& launch, cudaStream_t stream, int warmup, int iters) {
  for (int i = 0; i < warmup; ++i) launch();
  std::vector<cudaEvent_t> events(2 * static_cast<size_t>(iters));
  for (auto& e : events) CHECK_CUDA(cudaEventCreate(&e));
  for (int i = 0; i < iters; ++i) {
    CHECK_CUDA(cudaEventRecord(events[2 * i], stream));
    launch();
    CHECK_CUDA(cudaEventRecord(events[2 * i + 1], stream));
  }
  CHECK_CUDA(cudaStreamSynchronize(stream));
  std::vector<float> ms(static_cast<size_t>(iters));
  for (int i = 0; i < iters; ++i) {
    CHECK_CUDA(cudaEventElapsedTime(&ms[i], events[2 * i], events[2 * i + 1]));
  }
  for (auto& e : events) cudaEventDestroy(e);
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

double GBps(double bytes, double ms) {
  return bytes / (ms * 1e-3) / 1e9;
}

}  // namespace

int main(int argc, char** argv) {
  // --version and exit 2 on a bad flag, as on every Strait tool (tools/cli/cli.h).
  if (argc == 2 && std::strcmp(argv[1], "--version") == 0) {
    std::printf("%s\n", strait::VersionLine("cuda_kernels_bench").c_str());
    return 0;
  }
  Args args;
  if (!ParseArgs(argc, argv, &args)) return strait::kExitUsage;
  std::string why;
  if (!strait::cuda::HaveCudaDevice(&why)) {
    std::printf("cuda_kernels_bench: skipped: %s\n", why.c_str());
    return 77;
  }
  int device = 0;
  CHECK_CUDA(cudaGetDevice(&device));
  cudaDeviceProp prop{};
  CHECK_CUDA(cudaGetDeviceProperties(&prop, device));
  const size_t count = args.size_mib * (size_t{1} << 20) / sizeof(float);
  std::printf("device: %s (%d SMs), %zu elements (%zu MiB fp32), block %u, median of %d runs\n",
              prop.name, prop.multiProcessorCount, count, args.size_mib, args.block, args.iters);

  cudaStream_t stream = nullptr;
  CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  // Input, residual and stage, plus two copy buffers as large as the largest byte count moved.
  CodecOptions probe;
  probe.codec = CodecId::kInt8;
  probe.block_size = args.block;
  const size_t max_stage = strait::cuda::LossyStageBytes(count, probe);
  if (max_stage == 0) {
    std::fprintf(stderr, "error: --block %u is not a power of two in 32..65536\n", args.block);
    return 2;
  }
  const size_t max_moved = count * 12 + max_stage;
  void* src = nullptr;
  float* residual = nullptr;
  uint8_t* stage = nullptr;
  void* copy_a = nullptr;
  void* copy_b = nullptr;
  CHECK_CUDA(cudaMalloc(&src, count * sizeof(float)));
  CHECK_CUDA(cudaMalloc(reinterpret_cast<void**>(&residual), count * sizeof(float)));
  CHECK_CUDA(cudaMalloc(reinterpret_cast<void**>(&stage), max_stage));
  CHECK_CUDA(cudaMalloc(&copy_a, max_moved / 2 + 64));
  CHECK_CUDA(cudaMalloc(&copy_b, max_moved / 2 + 64));
  // Gradient-like input: small normal values (generated once on the host).
  {
    std::vector<float> host(count);
    uint32_t x = 12345;
    for (size_t i = 0; i < count; ++i) {
      x = x * 1664525u + 1013904223u;
      host[i] = (static_cast<float>(x >> 8) * 0x1p-24f - 0.5f) * 1e-3f;
    }
    CHECK_CUDA(cudaMemcpy(src, host.data(), count * sizeof(float), cudaMemcpyHostToDevice));
  }
  CHECK_CUDA(cudaMemset(residual, 0, count * sizeof(float)));
  CHECK_CUDA(cudaMemset(copy_a, 1, max_moved / 2 + 64));

  std::printf("%-28s %12s %10s %10s %9s %s\n", "kernel", "bytes", "GB/s", "copy GB/s", "fraction",
              "goal");
  bool all_met = true;
  auto row = [&](const std::string& name, double bytes, double ms) {
    const size_t half = static_cast<size_t>(bytes / 2);
    const double copy_ms = MedianMs(
        [&] {
          CHECK_CUDA(cudaMemcpyAsync(copy_b, copy_a, half, cudaMemcpyDeviceToDevice, stream));
        },
        stream, args.warmup, args.iters);
    const double gbps = GBps(bytes, ms);
    const double copy = GBps(2.0 * static_cast<double>(half), copy_ms);
    const double fraction = gbps / copy;
    all_met = all_met && fraction >= kGoal;
    std::printf("%-28s %12.0f %10.1f %10.1f %9.2f %s\n", name.c_str(), bytes, gbps, copy, fraction,
                fraction >= kGoal ? ">= 0.8 met" : "< 0.8 MISSED");
  };

  const CodecId codecs[] = {CodecId::kInt8, CodecId::kInt4, CodecId::kFp8E4M3};
  const DataType types[] = {DataType::kFloat32, DataType::kBfloat16};
  for (const CodecId codec : codecs) {
    for (const DataType type : types) {
      for (const Rounding rounding : {Rounding::kNearest, Rounding::kStochastic}) {
        CodecOptions options;
        options.codec = codec;
        options.block_size = args.block;
        options.rounding = rounding;
        options.seed = 42;
        const size_t stage_bytes = strait::cuda::LossyStageBytes(count, options);
        const double ms = MedianMs(
            [&] {
              CheckStatus(strait::cuda::QuantizeAsync(src, type, count, options, residual, stage,
                                                      stage_bytes, stream));
            },
            stream, args.warmup, args.iters);
        const double bytes = static_cast<double>(count * strait::DataTypeSize(type) +
                                                 2 * count * sizeof(float) + stage_bytes);
        row(std::string("quantize+ef ") + strait::CodecName(codec) + " " +
                strait::DataTypeName(type) + (rounding == Rounding::kStochastic ? " sr" : " rn"),
            bytes, ms);
      }
    }
  }
  for (const CodecId codec : codecs) {
    CodecOptions options;
    options.codec = codec;
    options.block_size = args.block;
    const size_t stage_bytes = strait::cuda::LossyStageBytes(count, options);
    const double ms = MedianMs(
        [&] {
          CheckStatus(strait::cuda::DequantizeAccumulateAsync(stage, codec, args.block, count,
                                                              residual, stream));
        },
        stream, args.warmup, args.iters);
    row(std::string("dequantize-acc ") + strait::CodecName(codec),
        static_cast<double>(stage_bytes + 2 * count * sizeof(float)), ms);
  }
  CHECK_CUDA(cudaStreamSynchronize(stream));
  cudaFree(src);
  cudaFree(residual);
  cudaFree(stage);
  cudaFree(copy_a);
  cudaFree(copy_b);
  cudaStreamDestroy(stream);
  std::printf("%s\n", all_met ? "all rows >= 0.8 of copy bandwidth"
                              : "some rows below 0.8 of copy bandwidth (see above)");
  return 0;
}

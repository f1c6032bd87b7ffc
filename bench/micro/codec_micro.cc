// Google Benchmark micro-benchmarks of the codec's inner loops, one instruction set at a time:
// the quantize and dequantize kernels (each ISA this CPU has, so the vector speed-up is visible),
// CRC-32C, the byte-plane shuffle and zstd level 1 apart, the fp32 sum reduction, and memcpy as
// the bound. Every benchmark reports bytes/s of
// fp32 input (SetBytesProcessed), at 1 MiB (in cache) and 64 MiB (memory-bound).
//
//   codec_micro --benchmark_filter='Int8'       # one family
//   codec_micro --benchmark_format=json         # for scripts
#include <benchmark/benchmark.h>
#include <zstd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <map>
#include <memory>
#include <new>
#include <string>
#include <string_view>
#include <vector>

#include "bench/gradient.h"
#include "codec/crc32c.h"
#include "codec/kernels.h"
#include "codec/shuffle.h"
#include "common/version.h"
#include "strait/codec.h"
#include "strait/reduce.h"

namespace strait::bench {
namespace {

using codec_internal::Isa;
using codec_internal::KernelTable;
using codec_internal::LossyKind;

constexpr size_t kSizes[] = {size_t{1} << 20, size_t{64} << 20};

// 64-byte aligned, zeroed, pages touched: what a real tensor buffer looks like to a kernel.
struct FreeDeleter {
  void operator()(void* p) const { std::free(p); }
};
template <typename T>
std::unique_ptr<T[], FreeDeleter> AlignedArray(size_t count) {
  const size_t bytes = (count * sizeof(T) + 63) / 64 * 64 + 64;
  void* p = std::aligned_alloc(64, bytes);
  if (p == nullptr) throw std::bad_alloc();
  std::memset(p, 0, bytes);
  return std::unique_ptr<T[], FreeDeleter>(static_cast<T*>(p));
}

// Generated once per size: Google Benchmark calls a benchmark function several times while it
// sizes the iteration count, and 64 MiB of data need not be made each time.
const std::vector<float>& Gradient(size_t count) {
  static std::map<size_t, std::vector<float>> cache;
  auto it = cache.find(count);
  if (it == cache.end()) it = cache.emplace(count, MakeGradient(count, 1)).first;
  return it->second;
}

std::string SizeName(size_t bytes) {
  std::string out = std::to_string(bytes >= (size_t{1} << 20) ? bytes >> 20 : bytes >> 10);
  out.append(bytes >= (size_t{1} << 20) ? "MiB" : "KiB");
  return out;
}

void SetBytes(benchmark::State& state, size_t bytes) {
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * static_cast<int64_t>(bytes));
}

// Quantizes fp32 gradients; with `feedback` the residual is carried from step to step as
// EncodeWithFeedback does.
void Quantize(benchmark::State& state, const KernelTable* kernels, LossyKind kind, bool feedback,
              size_t bytes) {
  const size_t count = bytes / sizeof(float);
  const std::vector<float>& src = Gradient(count);
  codec_internal::QuantParams params;
  auto scales = AlignedArray<float>(codec_internal::ScaleCount(count, params.block_size));
  auto codes = AlignedArray<uint8_t>(codec_internal::CodeBytes(kind, count));
  auto residual = AlignedArray<float>(feedback ? count : 1);
  const auto quantize = kernels->quantize[static_cast<int>(kind)];
  for (auto _ : state) {
    quantize(src.data(), DataType::kFloat32, feedback ? residual.get() : nullptr, count, params,
             scales.get(), codes.get());
    benchmark::DoNotOptimize(codes.get());
    benchmark::ClobberMemory();
  }
  SetBytes(state, bytes);
}

// acc += dequantize(int8 frame payload): the owner's inner loop in the cross-region reduction.
void DequantizeAccumulate(benchmark::State& state, const KernelTable* kernels, size_t bytes) {
  const size_t count = bytes / sizeof(float);
  const std::vector<float>& src = Gradient(count);
  codec_internal::QuantParams params;
  auto scales = AlignedArray<float>(codec_internal::ScaleCount(count, params.block_size));
  auto codes = AlignedArray<uint8_t>(count);
  auto acc = AlignedArray<float>(count);
  const int k = static_cast<int>(LossyKind::kInt8);
  kernels->quantize[k](src.data(), DataType::kFloat32, nullptr, count, params, scales.get(),
                       codes.get());
  for (auto _ : state) {
    kernels->dequantize[k](scales.get(), codes.get(), count, params.block_size, acc.get(), true);
    benchmark::DoNotOptimize(acc.get());
    benchmark::ClobberMemory();
  }
  SetBytes(state, bytes);
}

void Crc(benchmark::State& state, bool software, size_t bytes) {
  const std::vector<float>& src = Gradient(bytes / sizeof(float));
  for (auto _ : state) {
    uint32_t crc =
        software ? codec_internal::Crc32cSoftware(src.data(), bytes, 0) : Crc32c(src.data(), bytes);
    benchmark::DoNotOptimize(crc);
  }
  SetBytes(state, bytes);
}

// The two halves of the zstd codec's encode, apart: the byte-plane shuffle, and zstd itself on
// shuffled or raw fp32 gradients, so that a miss of the zstd goal can be pinned on one of them.
void Shuffle(benchmark::State& state, bool vector, size_t bytes) {
  const std::vector<float>& src = Gradient(bytes / sizeof(float));
  auto dst = AlignedArray<uint8_t>(bytes);
  for (auto _ : state) {
    if (vector) {
      codec_internal::ByteShuffleVector(src.data(), dst.get(), bytes, sizeof(float));
    } else {
      codec_internal::ByteShuffleScalar(src.data(), dst.get(), bytes, sizeof(float));
    }
    benchmark::DoNotOptimize(dst.get());
    benchmark::ClobberMemory();
  }
  SetBytes(state, bytes);
}

void Zstd(benchmark::State& state, bool shuffled, int level, size_t bytes) {
  const std::vector<float>& grad = Gradient(bytes / sizeof(float));
  auto src = AlignedArray<uint8_t>(bytes);
  if (shuffled) {
    codec_internal::ByteShuffle(grad.data(), src.get(), bytes, sizeof(float));
  } else {
    std::memcpy(src.get(), grad.data(), bytes);
  }
  const size_t capacity = ZSTD_compressBound(bytes);
  auto dst = AlignedArray<uint8_t>(capacity);
  std::unique_ptr<ZSTD_CCtx, size_t (*)(ZSTD_CCtx*)> cctx(ZSTD_createCCtx(), ZSTD_freeCCtx);
  size_t r = ZSTD_CCtx_setParameter(cctx.get(), ZSTD_c_compressionLevel, level);
  size_t out = 0;
  for (auto _ : state) {
    r = ZSTD_compress2(cctx.get(), dst.get(), capacity, src.get(), bytes);
    if (ZSTD_isError(r)) {
      state.SkipWithError(ZSTD_getErrorName(r));
      break;
    }
    out = r;
    benchmark::ClobberMemory();
  }
  state.counters["ratio"] = out > 0 ? static_cast<double>(bytes) / static_cast<double>(out) : 0;
  SetBytes(state, bytes);
}

void ReduceSum(benchmark::State& state, size_t bytes) {
  const size_t count = bytes / sizeof(float);
  const std::vector<float>& src = Gradient(count);
  auto inout = AlignedArray<float>(count);
  std::memcpy(inout.get(), src.data(), bytes);
  for (auto _ : state) {
    Status s = ReduceInPlace(DataType::kFloat32, ReduceOp::kSum, src.data(), inout.get(), count);
    if (!s.ok()) {
      state.SkipWithError(s.ToString().c_str());
      break;
    }
    benchmark::ClobberMemory();
  }
  SetBytes(state, bytes);
}

void Memcpy(benchmark::State& state, size_t bytes) {
  const std::vector<float>& src = Gradient(bytes / sizeof(float));
  auto dst = AlignedArray<uint8_t>(bytes);
  for (auto _ : state) {
    std::memcpy(dst.get(), src.data(), bytes);
    benchmark::DoNotOptimize(dst.get());
    benchmark::ClobberMemory();
  }
  SetBytes(state, bytes);
}

// Names are built by appending: GCC 12 at -O3 gives a false -Wrestrict on
// `const char* + std::string` (GCC bug 105329).
std::string Name(std::initializer_list<std::string_view> parts) {
  std::string out;
  for (std::string_view p : parts) {
    if (!out.empty()) out.push_back('/');
    out.append(p);
  }
  return out;
}

void RegisterAll() {
  const Isa best = codec_internal::DetectIsa();
  for (size_t bytes : kSizes) {
    const std::string size = SizeName(bytes);
    for (int i = 0; i <= static_cast<int>(best); ++i) {
      const Isa isa = static_cast<Isa>(i);
      const KernelTable* k = &codec_internal::KernelsFor(isa);
      const std::string_view isa_name = codec_internal::IsaName(isa);
      benchmark::RegisterBenchmark(Name({"QuantizeInt8EF", isa_name, size}).c_str(), Quantize, k,
                                   LossyKind::kInt8, true, bytes);
      benchmark::RegisterBenchmark(Name({"DequantizeAccumulateInt8", isa_name, size}).c_str(),
                                   DequantizeAccumulate, k, bytes);
      benchmark::RegisterBenchmark(Name({"QuantizeFp8", isa_name, size}).c_str(), Quantize, k,
                                   LossyKind::kFp8, false, bytes);
      benchmark::RegisterBenchmark(Name({"QuantizeInt4", isa_name, size}).c_str(), Quantize, k,
                                   LossyKind::kInt4, false, bytes);
    }
    benchmark::RegisterBenchmark(
        Name({"Crc32c", codec_internal::Crc32cImplementationName(), size}).c_str(), Crc, false,
        bytes);
    benchmark::RegisterBenchmark(Name({"Crc32c", "software", size}).c_str(), Crc, true, bytes);
    benchmark::RegisterBenchmark(Name({"ByteShuffle4", "scalar", size}).c_str(), Shuffle, false,
                                 bytes);
    if (codec_internal::ShuffleVectorAvailable()) {
      benchmark::RegisterBenchmark(Name({"ByteShuffle4", "vector", size}).c_str(), Shuffle, true,
                                   bytes);
    }
    benchmark::RegisterBenchmark(Name({"ZstdL1", "shuffled", size}).c_str(), Zstd, true, 1, bytes);
    benchmark::RegisterBenchmark(Name({"ZstdL1", "raw", size}).c_str(), Zstd, false, 1, bytes);
    benchmark::RegisterBenchmark(Name({"ReduceSumFp32", size}).c_str(), ReduceSum, bytes);
    benchmark::RegisterBenchmark(Name({"Memcpy", size}).c_str(), Memcpy, bytes);
  }
}

}  // namespace
}  // namespace strait::bench

int main(int argc, char** argv) {
  // The conventions of every Strait tool (tools/cli/cli.h) around Google Benchmark's own flags:
  // --version, and exit 2 for a flag it does not know.
  for (int i = 1; i < argc; ++i) {
    if (std::string_view(argv[i]) == "--version") {
      std::printf("%s\n", strait::VersionLine("codec_micro").c_str());
      return 0;
    }
  }
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return strait::kExitUsage;
  strait::bench::RegisterAll();
  benchmark::AddCustomContext("codec_isa", strait::CodecIsaName());
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}

// The GPU quantize / dequantize kernels and their argument checks (see quantize.h).
//
// Quantize: one warp per quantization block (one CTA of 8 warps for blocks of 2048 elements and
// more), grid-wide. A thread holds the block's elements t, t + 32, ... (coalesced loads) in
// registers, 8 of them, so a block of up to 256 elements (the default) is read from memory once:
// pass 1 computes the compensated inputs and the block's max |c| bits (a max-reduction of
// integers, exact in any order), pass 2 turns the registers into codes and residuals. Larger
// blocks go through in chunks and reload each chunk for pass 2 (from L1/L2), recomputing exactly
// the same compensated values. int4 packs element pairs (2k, 2k+1), which sit in neighbouring
// lanes, with one warp shuffle.
//
// Dequantize: one thread per element, grid-stride. Both are memory-bound; all arithmetic is
// quant_math.h's, compiled with -fmad=false (CMakeLists.txt).
#include <cuda_runtime.h>

#include <algorithm>
#include <string>

#include "codec/kernels.h"
#include "codec/rng.h"
#include "cuda/quant_math.h"
#include "cuda/quantize.h"

namespace strait::cuda {
namespace {

namespace ci = codec_internal;
namespace qm = quant_math;
using ci::LossyKind;

constexpr unsigned kFullMask = 0xffffffffu;
constexpr int kWarp = 32;
constexpr int kThreads = 256;  // per CTA
constexpr int kWarpsPerCta = kThreads / kWarp;
constexpr size_t kMaxCtas = size_t{1} << 20;  // grid cap; kernels loop past it
using qm::kCtaBlockSize;
using qm::kRegs;
using qm::QuantizeArgs;
static_assert(qm::kWarpSize == kWarp && qm::kCtaThreads == kThreads);

// Codes (and residuals) of one chunk whose compensated values are in c[].
template <LossyKind kKind, bool kResidual, int kGroup>
__device__ __forceinline__ void EmitChunk(const QuantizeArgs& a, const float (&c)[kRegs],
                                          const qm::BlockScale& bs, size_t begin, uint32_t chunk,
                                          uint32_t n, uint32_t regs, unsigned t) {
#pragma unroll
  for (int k = 0; k < kRegs; ++k) {
    const bool valid = qm::ChunkElementValid<kGroup>(chunk, n, regs, t, k);
    const uint8_t code =
        qm::ChunkCode<kKind, kResidual, kGroup>(a, bs, begin, chunk, valid, t, k, c[k]);
    uint8_t next = 0;
    if constexpr (kKind == LossyKind::kInt4) {
      // Every lane takes part (the loop bounds are uniform); the last lane gets its own code,
      // which only odd threads, who store nothing, would read.
      next = static_cast<uint8_t>(__shfl_down_sync(kFullMask, static_cast<unsigned>(code), 1));
    }
    qm::StoreChunkCode<kKind, kGroup>(a, begin, chunk, valid, t, k, code, next);
  }
}

// kGroupWarps warps quantize one block together: 1 for blocks below kCtaBlockSize, else the
// whole CTA. Every loop bound is uniform across the group, so the shuffles and barriers are
// reached by all of its threads.
template <LossyKind kKind, DataType kType, bool kResidual, int kGroupWarps>
__global__ void __launch_bounds__(kThreads) QuantizeKernel(QuantizeArgs a) {
  constexpr int kGroup = kWarp * kGroupWarps;  // threads per quantization block
  constexpr uint32_t kChunk = static_cast<uint32_t>(kGroup) * kRegs;  // elements held at once
  constexpr int kGroupsPerCta = kThreads / kGroup;
  static_assert(kGroupWarps == 1 || kGroupWarps == kWarpsPerCta);
  __shared__ uint32_t warp_max[kWarpsPerCta];
  const unsigned t = threadIdx.x % kGroup;
  const unsigned lane = threadIdx.x % kWarp;
  const size_t first_group = static_cast<size_t>(blockIdx.x) * kGroupsPerCta + threadIdx.x / kGroup;
  const size_t groups = static_cast<size_t>(gridDim.x) * kGroupsPerCta;
  const uint32_t regs = qm::FirstChunkRegs<kGroup>(a.block_size);
  for (size_t qb = first_group; qb < a.num_blocks; qb += groups) {
    const size_t begin = qb * a.block_size;
    const size_t left = a.count - begin;
    const auto n = static_cast<uint32_t>(left < a.block_size ? left : a.block_size);
    float c[kRegs];
    uint32_t absmax = qm::LoadChunk<kType, kResidual, kGroup>(a, begin, 0, n, regs, t, c);
    for (uint32_t chunk = kChunk; chunk < n; chunk += kChunk) {
      float more[kRegs];
      absmax = qm::MaxBits(
          absmax, qm::LoadChunk<kType, kResidual, kGroup>(a, begin, chunk, n, kRegs, t, more));
    }
    absmax = __reduce_max_sync(kFullMask, absmax);
    if constexpr (kGroupWarps > 1) {
      if (lane == 0) warp_max[threadIdx.x / kWarp] = absmax;
      __syncthreads();
#pragma unroll
      for (int w = 0; w < kGroupWarps; ++w) absmax = qm::MaxBits(absmax, warp_max[w]);
      __syncthreads();  // warp_max is rewritten for the next block
    }
    const qm::BlockScale bs = qm::ComputeBlockScale<kKind>(absmax);
    if (t == 0) a.scales[qb] = bs.scale;

    EmitChunk<kKind, kResidual, kGroup>(a, c, bs, begin, 0, n, regs, t);
    for (uint32_t chunk = kChunk; chunk < n; chunk += kChunk) {
      qm::LoadChunk<kType, kResidual, kGroup>(a, begin, chunk, n, kRegs, t, c);
      EmitChunk<kKind, kResidual, kGroup>(a, c, bs, begin, chunk, n, kRegs, t);
    }
  }
}

struct DequantizeArgs {
  const float* scales;
  const uint8_t* codes;
  size_t count;
  uint32_t block_shift;  // log2(block_size)
  void* out;
};

template <LossyKind kKind>
__device__ __forceinline__ float DequantizeAt(const DequantizeArgs& a, size_t i) {
  uint8_t code;
  if constexpr (kKind == LossyKind::kInt4) {
    code = static_cast<uint8_t>((__ldg(a.codes + i / 2) >> (4 * (i & 1))) & 0xfu);
  } else {
    code = __ldg(a.codes + i);
  }
  return qm::Dequantize<kKind>(code, __ldg(a.scales + (i >> a.block_shift)));
}

template <LossyKind kKind, DataType kOut, bool kAccumulate>
__global__ void __launch_bounds__(kThreads) DequantizeKernel(DequantizeArgs a) {
  using S = typename qm::Storage<kOut>::Type;
  S* out = static_cast<S*>(a.out);
  const size_t stride = static_cast<size_t>(gridDim.x) * kThreads;
  for (size_t i = static_cast<size_t>(blockIdx.x) * kThreads + threadIdx.x; i < a.count;
       i += stride) {
    const float x = DequantizeAt<kKind>(a, i);
    if constexpr (kAccumulate) {
      out[i] = qm::Accumulate(out[i], x);
    } else {
      out[i] = qm::FromFloat<kOut>(x);
    }
  }
}

// ---- host side ---------------------------------------------------------------------------------

std::string Num(uint64_t v) {
  return std::to_string(v);
}

LossyKind KindOf(CodecId codec) {
  switch (codec) {
    case CodecId::kInt4: return LossyKind::kInt4;
    case CodecId::kFp8E4M3: return LossyKind::kFp8;
    default: return LossyKind::kInt8;
  }
}

bool Aligned(const void* p, size_t alignment) {
  return reinterpret_cast<uintptr_t>(p) % alignment == 0;
}

bool Overlap(const void* a, size_t a_bytes, const void* b, size_t b_bytes) {
  const auto pa = reinterpret_cast<uintptr_t>(a), pb = reinterpret_cast<uintptr_t>(b);
  return pa < pb + b_bytes && pb < pa + a_bytes;
}

size_t CtasFor(size_t threads) {
  return std::clamp<size_t>((threads + kThreads - 1) / kThreads, 1, kMaxCtas);
}

// Clears a stale, non-sticky error that an earlier runtime call of this thread left behind, so
// that LaunchStatus reports this launch's own.
void ClearStaleError() {
  cudaGetLastError();
}

// The launch's own error (a bad configuration, no device); asynchronous faults of earlier work
// on the device also surface here, since they poison the context for every later launch.
Status LaunchStatus(const char* what) {
  const cudaError_t err = cudaGetLastError();
  if (err == cudaSuccess) return Status::Ok();
  return InternalError(std::string(what) + ": kernel launch failed: " + cudaGetErrorName(err) +
                       ": " + cudaGetErrorString(err));
}

template <LossyKind kKind, DataType kType, int kGroupWarps>
void LaunchQuantizeGroup(const QuantizeArgs& a, cudaStream_t stream) {
  const auto ctas = static_cast<unsigned>(CtasFor(a.num_blocks * kWarp * kGroupWarps));
  if (a.residual != nullptr) {
    QuantizeKernel<kKind, kType, true, kGroupWarps><<<ctas, kThreads, 0, stream>>>(a);
  } else {
    QuantizeKernel<kKind, kType, false, kGroupWarps><<<ctas, kThreads, 0, stream>>>(a);
  }
}

template <LossyKind kKind, DataType kType>
void LaunchQuantize(const QuantizeArgs& a, cudaStream_t stream) {
  if (a.block_size >= kCtaBlockSize) {
    LaunchQuantizeGroup<kKind, kType, kWarpsPerCta>(a, stream);
  } else {
    LaunchQuantizeGroup<kKind, kType, 1>(a, stream);
  }
}

template <LossyKind kKind>
void LaunchQuantizeForType(DataType dtype, const QuantizeArgs& a, cudaStream_t stream) {
  switch (dtype) {
    case DataType::kBfloat16: LaunchQuantize<kKind, DataType::kBfloat16>(a, stream); break;
    case DataType::kFloat16: LaunchQuantize<kKind, DataType::kFloat16>(a, stream); break;
    default: LaunchQuantize<kKind, DataType::kFloat32>(a, stream); break;
  }
}

template <LossyKind kKind>
void LaunchDequantize(DataType out_dtype, bool accumulate, const DequantizeArgs& a,
                      cudaStream_t stream) {
  const auto ctas = static_cast<unsigned>(CtasFor(a.count));
  if (accumulate) {
    DequantizeKernel<kKind, DataType::kFloat32, true><<<ctas, kThreads, 0, stream>>>(a);
    return;
  }
  switch (out_dtype) {
    case DataType::kBfloat16:
      DequantizeKernel<kKind, DataType::kBfloat16, false><<<ctas, kThreads, 0, stream>>>(a);
      break;
    case DataType::kFloat16:
      DequantizeKernel<kKind, DataType::kFloat16, false><<<ctas, kThreads, 0, stream>>>(a);
      break;
    default:
      DequantizeKernel<kKind, DataType::kFloat32, false><<<ctas, kThreads, 0, stream>>>(a);
      break;
  }
}

Status CheckStage(const char* what, const uint8_t* stage, CodecId codec, uint32_t block_size,
                  size_t count) {
  if (!IsLossyCodec(codec)) {
    return InvalidArgumentError(std::string(what) + ": codec " + CodecName(codec) +
                                " is not lossy; the GPU kernels handle int8, int4 and fp8");
  }
  CodecOptions options;
  options.codec = codec;
  options.block_size = block_size;
  STRAIT_RETURN_IF_ERROR(ValidateCodecOptions(options, DataType::kFloat32));
  if (count > kMaxFrameElements) {
    return InvalidArgumentError(std::string(what) + ": count " + Num(count) +
                                " exceeds the frame limit of " + Num(kMaxFrameElements));
  }
  if (stage == nullptr) return InvalidArgumentError(std::string(what) + ": stage is null");
  if (!Aligned(stage, alignof(float))) {
    return InvalidArgumentError(std::string(what) +
                                ": stage is not 4-byte aligned (its scales are fp32)");
  }
  return Status::Ok();
}

Status DequantizeImpl(const char* what, const uint8_t* stage, CodecId codec, uint32_t block_size,
                      size_t count, void* out, DataType out_dtype, bool accumulate,
                      cudaStream_t stream) {
  if (count == 0) return Status::Ok();
  STRAIT_RETURN_IF_ERROR(CheckStage(what, stage, codec, block_size, count));
  if (!IsLossyCodableType(out_dtype)) {
    return InvalidArgumentError(std::string(what) + ": out_dtype " + DataTypeName(out_dtype) +
                                " is not float32, bfloat16 or float16");
  }
  if (out == nullptr) return InvalidArgumentError(std::string(what) + ": out is null");
  const size_t out_size = DataTypeSize(out_dtype);
  if (!Aligned(out, out_size)) {
    return InvalidArgumentError(std::string(what) + ": out is not " + Num(out_size) +
                                "-byte aligned for " + DataTypeName(out_dtype));
  }
  const LossyKind kind = KindOf(codec);
  const size_t stage_bytes = ci::LossyStageSize(kind, count, block_size);
  if (Overlap(out, count * out_size, stage, stage_bytes)) {
    return InvalidArgumentError(std::string(what) + ": out overlaps the stage");
  }
  DequantizeArgs a;
  a.scales = reinterpret_cast<const float*>(stage);
  a.codes = stage + ci::ScaleCount(count, block_size) * sizeof(float);
  a.count = count;
  a.block_shift = static_cast<uint32_t>(__builtin_ctz(block_size));
  a.out = out;
  ClearStaleError();
  switch (kind) {
    case LossyKind::kInt8:
      LaunchDequantize<LossyKind::kInt8>(out_dtype, accumulate, a, stream);
      break;
    case LossyKind::kInt4:
      LaunchDequantize<LossyKind::kInt4>(out_dtype, accumulate, a, stream);
      break;
    case LossyKind::kFp8:
      LaunchDequantize<LossyKind::kFp8>(out_dtype, accumulate, a, stream);
      break;
  }
  return LaunchStatus(what);
}

}  // namespace

Status QuantizeAsync(const void* src, DataType dtype, size_t count, const CodecOptions& options,
                     float* residual, uint8_t* stage, size_t stage_capacity, cudaStream_t stream) {
  constexpr const char* kWhat = "gpu quantize";
  STRAIT_RETURN_IF_ERROR(ValidateCodecOptions(options, dtype));
  if (!IsLossyCodec(options.codec)) {
    return InvalidArgumentError(std::string(kWhat) + ": codec " + CodecName(options.codec) +
                                " is not lossy; the GPU kernels handle int8, int4 and fp8");
  }
  if (count > kMaxFrameElements) {
    return InvalidArgumentError(std::string(kWhat) + ": count " + Num(count) +
                                " exceeds the frame limit of " + Num(kMaxFrameElements) +
                                " elements; send the tensor in chunks");
  }
  if (count == 0) return Status::Ok();
  const LossyKind kind = KindOf(options.codec);
  const size_t need = ci::LossyStageSize(kind, count, options.block_size);
  if (src == nullptr) return InvalidArgumentError(std::string(kWhat) + ": src is null");
  if (stage == nullptr) return InvalidArgumentError(std::string(kWhat) + ": stage is null");
  if (stage_capacity < need) {
    return InvalidArgumentError(std::string(kWhat) + ": the stage buffer holds " +
                                Num(stage_capacity) + " bytes, " + Num(count) + " elements of " +
                                CodecName(options.codec) + " need " + Num(need) +
                                " (LossyStageBytes)");
  }
  const size_t src_size = DataTypeSize(dtype);
  if (!Aligned(src, src_size)) {
    return InvalidArgumentError(std::string(kWhat) + ": src is not " + Num(src_size) +
                                "-byte aligned for " + DataTypeName(dtype));
  }
  if (!Aligned(stage, alignof(float))) {
    return InvalidArgumentError(std::string(kWhat) +
                                ": stage is not 4-byte aligned (its scales are fp32)");
  }
  if (Overlap(src, count * src_size, stage, need)) {
    return InvalidArgumentError(std::string(kWhat) + ": src overlaps the stage");
  }
  if (residual != nullptr) {
    if (!Aligned(residual, alignof(float))) {
      return InvalidArgumentError(std::string(kWhat) + ": residual is not 4-byte aligned");
    }
    if (Overlap(residual, count * sizeof(float), src, count * src_size) ||
        Overlap(residual, count * sizeof(float), stage, need)) {
      return InvalidArgumentError(std::string(kWhat) + ": residual overlaps src or the stage");
    }
  }
  QuantizeArgs a;
  a.src = src;
  a.residual = residual;
  a.count = count;
  a.num_blocks = ci::ScaleCount(count, options.block_size);
  a.block_size = options.block_size;
  a.stochastic = options.rounding == Rounding::kStochastic;
  a.key = rng::KeyFromSeed(options.seed);
  a.index_offset = options.index_offset;
  a.scales = reinterpret_cast<float*>(stage);
  a.codes = stage + a.num_blocks * sizeof(float);
  ClearStaleError();
  switch (kind) {
    case LossyKind::kInt8: LaunchQuantizeForType<LossyKind::kInt8>(dtype, a, stream); break;
    case LossyKind::kInt4: LaunchQuantizeForType<LossyKind::kInt4>(dtype, a, stream); break;
    case LossyKind::kFp8: LaunchQuantizeForType<LossyKind::kFp8>(dtype, a, stream); break;
  }
  return LaunchStatus(kWhat);
}

Status DequantizeAsync(const uint8_t* stage, CodecId codec, uint32_t block_size, size_t count,
                       void* out, DataType out_dtype, cudaStream_t stream) {
  return DequantizeImpl("gpu dequantize", stage, codec, block_size, count, out, out_dtype, false,
                        stream);
}

Status DequantizeAccumulateAsync(const uint8_t* stage, CodecId codec, uint32_t block_size,
                                 size_t count, float* acc, cudaStream_t stream) {
  return DequantizeImpl("gpu dequantize-accumulate", stage, codec, block_size, count, acc,
                        DataType::kFloat32, true, stream);
}

bool HaveCudaDevice(std::string* why) {
  int n = 0;
  const cudaError_t err = cudaGetDeviceCount(&n);
  if (err != cudaSuccess) {
    cudaGetLastError();  // clear it, so that it does not surface as a later launch's error
    if (why != nullptr) {
      *why = std::string("no CUDA device: cudaGetDeviceCount failed: ") + cudaGetErrorName(err) +
             ": " + cudaGetErrorString(err);
    }
    return false;
  }
  if (n == 0) {
    if (why != nullptr) *why = "no CUDA device: cudaGetDeviceCount found 0 devices";
    return false;
  }
  return true;
}

}  // namespace strait::cuda

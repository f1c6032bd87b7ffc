// Internal: the per-instruction-set kernel table behind the codec (quantize, dequantize,
// element conversion). Three implementations exist: scalar (the reference), AVX2 and AVX-512.
// Every implementation produces byte-identical output for the same input; the tests hold them to
// that. The active table is chosen once from the CPU (or STRAIT_CODEC_ISA).
//
// Pointers given to kernels may be unaligned; kernels never allocate, never block, and read and
// write exactly the ranges described.
#ifndef STRAIT_LIB_CODEC_KERNELS_H_
#define STRAIT_LIB_CODEC_KERNELS_H_

#include <cstddef>
#include <cstdint>

#include "strait/codec.h"
#include "strait/types.h"

namespace strait::codec_internal {

enum class Isa : int { kScalar = 0, kAvx2 = 1, kAvx512 = 2 };
const char* IsaName(Isa isa) noexcept;
// The best level this CPU and OS support.
Isa DetectIsa() noexcept;
// DetectIsa(), lowered by STRAIT_CODEC_ISA when set (read once).
Isa ActiveIsa() noexcept;

// The three lossy formats, in the order the kernel table stores them.
enum class LossyKind : int { kInt8 = 0, kInt4 = 1, kFp8 = 2 };
inline constexpr int kNumLossyKinds = 3;

struct QuantParams {
  uint32_t block_size = kDefaultBlockSize;  // power of two, kMinBlockSize..kMaxBlockSize
  Rounding rounding = Rounding::kNearest;
  uint64_t seed = 0;
  uint64_t index_offset = 0;
};

// Quantizes `count` elements of `src` (float32, bfloat16 or float16) into
// ScaleCount(count, block) fp32 scales and CodeBytes(kind, count) code bytes.
// If `residual` is non-null, the input is compensated = src + residual, and on return
// residual = compensated - dequantized, where dequantized is bit-identical to what the
// dequantize kernel will produce for the frame.
using QuantizeFn = void (*)(const void* src, DataType src_type, float* residual, size_t count,
                            const QuantParams& params, float* scales, uint8_t* codes);

// Writes (accumulate ? out[i] + x[i] : x[i]) for the dequantized x of `count` elements.
using DequantizeFn = void (*)(const float* scales, const uint8_t* codes, size_t count,
                              uint32_t block_size, float* out, bool accumulate);

// dst[i] = float(src[i]) (accumulate: dst[i] += float(src[i])) for float32/bfloat16/float16.
using ToFloatFn = void (*)(const void* src, DataType src_type, float* dst, size_t count,
                           bool accumulate);
// dst[i] = round_to_nearest_even(src[i]) in float32/bfloat16/float16.
using FromFloatFn = void (*)(const float* src, void* dst, DataType dst_type, size_t count);

struct KernelTable {
  QuantizeFn quantize[kNumLossyKinds];
  DequantizeFn dequantize[kNumLossyKinds];
  ToFloatFn to_float;
  FromFloatFn from_float;
};

const KernelTable& ScalarKernels() noexcept;
const KernelTable& Avx2Kernels() noexcept;    // valid only where DetectIsa() >= kAvx2
const KernelTable& Avx512Kernels() noexcept;  // valid only where DetectIsa() >= kAvx512
const KernelTable& KernelsFor(Isa isa) noexcept;
const KernelTable& ActiveKernels() noexcept;

inline constexpr size_t ScaleCount(size_t count, uint32_t block_size) {
  return (count + block_size - 1) / block_size;
}
inline constexpr size_t CodeBytes(LossyKind kind, size_t count) {
  return kind == LossyKind::kInt4 ? (count + 1) / 2 : count;
}
// Stage (pre-zstd payload) size of a lossy frame.
inline constexpr size_t LossyStageSize(LossyKind kind, size_t count, uint32_t block_size) {
  return ScaleCount(count, block_size) * sizeof(float) + CodeBytes(kind, count);
}

}  // namespace strait::codec_internal

#endif  // STRAIT_LIB_CODEC_KERNELS_H_

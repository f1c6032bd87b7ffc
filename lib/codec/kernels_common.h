// Internal: what the scalar, AVX2 and AVX-512 quantization kernels share: the format constants
// and the scalar reference pieces (one block at a time) that the vector kernels call for the last,
// partial block. The arithmetic itself is specified in kernels_scalar.cc's header comment.
//
// The functions declared here are defined once, in kernels_scalar.cc, which is compiled without
// vector flags. The vector files call them instead of inlining numeric.h / rng.h themselves on
// purpose: an inline function odr-used from a file compiled with -mavx512f may be emitted there
// with AVX-512 instructions, and the linker may then pick that copy for every caller, including
// the scalar fallback on a CPU without AVX-512.
#ifndef STRAIT_LIB_CODEC_KERNELS_COMMON_H_
#define STRAIT_LIB_CODEC_KERNELS_COMMON_H_

#include <cstddef>
#include <cstdint>

#include "codec/kernels.h"
#include "codec/rng.h"
#include "strait/types.h"

namespace strait::codec_internal {

// The largest code magnitude of each format: int8 127, int4 7, e4m3 448.
template <LossyKind kKind>
inline constexpr float kQmax = kKind == LossyKind::kInt8   ? 127.0f
                               : kKind == LossyKind::kInt4 ? 7.0f
                                                           : 448.0f;

inline constexpr uint32_t kAbsMaskBits = 0x7fffffffu;
// |c| bits at or above this are inf or NaN (as integers, |float| bits order like the values).
inline constexpr uint32_t kNonFiniteBits = 0x7f800000u;
// The scale of a block that held inf or NaN: a quiet NaN, so the whole block decodes to NaN.
inline constexpr uint32_t kNanScaleBits = 0x7fc00000u;
// Blocks whose absmax is below 2^-96 are encoded as zeros (scale 0): below this qmax / absmax
// can overflow to inf and absmax / qmax can go subnormal, and such values are noise anyway (with
// error feedback they stay in the residual).
inline constexpr uint32_t kMinAbsmaxBits = 0x0f800000u;  // 2^-96

// `detected` lowered by the value of STRAIT_CODEC_ISA (null or empty: no override). An invalid
// value logs one warning and is ignored. ActiveIsa() is this, applied once to the environment.
Isa ApplyIsaOverride(Isa detected, const char* value) noexcept;

// The scale of one block, from the bits of its absmax (max of |c| & 0x7fffffff as integers).
struct BlockScale {
  float scale;      // written to the frame
  float inv;        // qmax / absmax; unused when zero_codes
  bool zero_codes;  // absmax tiny or not finite: every code is 0
};
BlockScale ComputeBlockScale(LossyKind kind, uint32_t absmax_bits) noexcept;

rng::Key RngKeyFor(uint64_t seed) noexcept;

// Quantizes elements [begin, begin + n) of a call (one block; begin is a multiple of the block
// size, so int4 codes start on a byte boundary) and writes scales[begin / block_size]. `scales`,
// `codes` and `residual` are the call's base pointers.
void QuantizeBlockRef(LossyKind kind, const void* src, DataType src_type, float* residual,
                      size_t begin, size_t n, const QuantParams& params, float* scales,
                      uint8_t* codes) noexcept;

// Dequantizes elements [begin, begin + n) (one block, begin a multiple of block_size).
void DequantizeBlockRef(LossyKind kind, const float* scales, const uint8_t* codes, size_t begin,
                        size_t n, uint32_t block_size, float* out, bool accumulate) noexcept;

}  // namespace strait::codec_internal

#endif  // STRAIT_LIB_CODEC_KERNELS_COMMON_H_

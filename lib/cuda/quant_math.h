// Internal: the per-element and per-block arithmetic of the GPU quantization kernels, in one header
// that compiles both as CUDA device code (lib/cuda/quantize.cu) and as plain host C++ (the CPU
// emulation in tests/cuda/quant_math_test.cc, which holds it to the CPU codec's scalar kernels
// byte for byte and runs in CPU-only builds). So the kernels and the test share the exact code.
//
// It restates kernels_scalar.cc's specification (read its header comment first) with every fp32
// operation spelled as an explicit round-to-nearest operation: on the device __fmul_rn, __fadd_rn,
// __fsub_rn and __fdiv_rn, which nvcc never contracts into an FMA (lib/cuda is also compiled with
// -fmad=false, so numeric.h's own operations are not contracted either); on the host plain
// operators under the project-wide -ffp-contract=off. The block max-abs reduction is a max of
// integers (bits & 0x7fffffff), which is exact in any order, so a warp may reduce it in any shape.
// NaN payloads are the one thing not reproduced (CUDA arithmetic returns the canonical NaN, x86
// an operand's payload): residuals and decoded values of a non-finite block are NaN on both sides,
// and the stage bytes, which hold a constant NaN scale and zero codes for such a block, agree.
//
// Needs no CUDA header: without __CUDACC__ the functions are ordinary static inline host code.
#ifndef STRAIT_LIB_CUDA_QUANT_MATH_H_
#define STRAIT_LIB_CUDA_QUANT_MATH_H_

#include <cmath>
#include <cstddef>
#include <cstdint>

#include "codec/kernels.h"  // LossyKind, QuantParams, ScaleCount, CodeBytes
#include "codec/numeric.h"  // STRAIT_HD and the bit-exact narrow-float conversions
#include "codec/rng.h"
#include "strait/types.h"

namespace strait::quant_math {

using codec_internal::LossyKind;

// ---- single IEEE fp32 operations, never fused ------------------------------------------------

STRAIT_HD float Mul(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}

STRAIT_HD float Add(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}

STRAIT_HD float Sub(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fsub_rn(a, b);
#else
  return a - b;
#endif
}

STRAIT_HD float Div(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fdiv_rn(a, b);
#else
  return a / b;
#endif
}

STRAIT_HD float Floor(float v) {
#if defined(__CUDA_ARCH__)
  return floorf(v);
#else
  return std::floor(v);
#endif
}

STRAIT_HD float Min(float a, float b) {
  return b < a ? b : a;  // std::min's choice: a unless b is smaller
}

STRAIT_HD float Max(float a, float b) {
  return a < b ? b : a;  // std::max's choice: a unless a is smaller
}

// ---- format constants (kernels_common.h holds the same values for the CPU kernels) ------------

inline constexpr uint32_t kAbsMaskBits = 0x7fffffffu;
inline constexpr uint32_t kNonFiniteBits = 0x7f800000u;  // |c| bits at or above: inf or NaN
inline constexpr uint32_t kNanScaleBits = 0x7fc00000u;   // the scale of a non-finite block
inline constexpr uint32_t kMinAbsmaxBits = 0x0f800000u;  // 2^-96: smaller blocks encode as zeros

template <LossyKind kKind>
inline constexpr float kQmax = kKind == LossyKind::kInt8   ? 127.0f
                               : kKind == LossyKind::kInt4 ? 7.0f
                                                           : 448.0f;

// ---- element loads -----------------------------------------------------------------------------

// The storage type of one element of `kType` (float32: float; bfloat16, float16: their bits).
template <DataType kType>
struct Storage {
  using Type = uint16_t;
};
template <>
struct Storage<DataType::kFloat32> {
  using Type = float;
};

// Element value as fp32 (exact for all three types).
template <DataType kType>
STRAIT_HD float ToFloat(typename Storage<kType>::Type raw) {
  if constexpr (kType == DataType::kBfloat16) {
    return numeric::Bf16ToFloat(raw);
  } else if constexpr (kType == DataType::kFloat16) {
    return numeric::HalfToFloat(raw);
  } else {
    return raw;
  }
}

// Error feedback's compensated input c = x + residual: one fp32 add.
STRAIT_HD float Compensate(float x, float residual) {
  return Add(x, residual);
}

// The integer key of |c| for the block max (integer order is value order; inf/NaN largest).
STRAIT_HD uint32_t AbsBits(float c) {
  return numeric::FloatBits(c) & kAbsMaskBits;
}

STRAIT_HD uint32_t MaxBits(uint32_t a, uint32_t b) {
  return a < b ? b : a;
}

// ---- the block scale ---------------------------------------------------------------------------

struct BlockScale {
  float scale;      // written to the frame
  float inv;        // qmax / absmax; unused when zero_codes
  bool zero_codes;  // absmax tiny or not finite: every code is 0
};

template <LossyKind kKind>
STRAIT_HD BlockScale ComputeBlockScale(uint32_t absmax_bits) {
  if (absmax_bits >= kNonFiniteBits) return {numeric::BitsFloat(kNanScaleBits), 0.0f, true};
  if (absmax_bits < kMinAbsmaxBits) return {0.0f, 0.0f, true};
  const float absmax = numeric::BitsFloat(absmax_bits);
  return {Div(absmax, kQmax<kKind>), Div(kQmax<kKind>, absmax), false};
}

// ---- codes -------------------------------------------------------------------------------------

// nearbyint(v) for |v| < 2^22 (|v| <= qmax here): adding and subtracting 1.5 * 2^23 rounds to an
// integer, ties to even, exactly as kernels_scalar.cc does it.
STRAIT_HD float NearbyintSmall(float v) {
  constexpr float kMagic = 0x1.8p23f;
  return Sub(Add(v, kMagic), kMagic);
}

// The code (int8 byte, int4 nibble in the low 4 bits, or e4m3 byte) of v = c * inv.
template <LossyKind kKind>
STRAIT_HD uint8_t EncodeValue(float v, bool stochastic, uint32_t bits) {
  if constexpr (kKind == LossyKind::kFp8) {
    return numeric::FloatToE4m3Impl(v, stochastic, bits & 0xfffffu, rng::Unit(bits));
  } else {
    constexpr float kQ = kQmax<kKind>;
    float q = stochastic ? Floor(Add(v, rng::Unit(bits))) : NearbyintSmall(v);
    q = Min(Max(q, -kQ), kQ);
    // q is an integer in [-qmax, qmax]; through int so that a -0.0 gives code 0.
    const auto code = static_cast<uint8_t>(static_cast<int>(q));
    return kKind == LossyKind::kInt4 ? static_cast<uint8_t>(code & 0xfu) : code;
  }
}

// decode(code): the value before the multiply by the scale.
template <LossyKind kKind>
STRAIT_HD float DecodeValue(uint8_t code) {
  if constexpr (kKind == LossyKind::kInt8) {
    return static_cast<float>(static_cast<int8_t>(code));
  } else if constexpr (kKind == LossyKind::kInt4) {
    return static_cast<float>(static_cast<int>((code & 0xfu) ^ 0x8u) - 8);  // sign-extend
  } else {
    return numeric::E4m3ToFloat(code);
  }
}

// The code of compensated element c at the call's element index `index` (params.index_offset +
// the element's position in the call: the stochastic draw depends on it, nothing else does).
template <LossyKind kKind>
STRAIT_HD uint8_t QuantizeElement(float c, const BlockScale& bs, bool stochastic, rng::Key key,
                                  uint64_t index) {
  if (bs.zero_codes) return 0;
  const uint32_t bits = stochastic ? rng::Bits(key, index) : 0u;
  return EncodeValue<kKind>(Mul(c, bs.inv), stochastic, bits);
}

// x = decode(code) * scale: what every receiver decodes. One fp32 multiply.
template <LossyKind kKind>
STRAIT_HD float Dequantize(uint8_t code, float scale) {
  return Mul(DecodeValue<kKind>(code), scale);
}

// The new error-feedback residual: c - x, one fp32 subtract, x exactly the dequantized value.
template <LossyKind kKind>
STRAIT_HD float NewResidual(float c, uint8_t code, float scale) {
  return Sub(c, Dequantize<kKind>(code, scale));
}

// Accumulation into fp32: out + x, one fp32 add.
STRAIT_HD float Accumulate(float out, float x) {
  return Add(out, x);
}

// Narrow outputs of a dequantize: round to nearest even (numeric.h).
template <DataType kType>
STRAIT_HD typename Storage<kType>::Type FromFloat(float x) {
  if constexpr (kType == DataType::kBfloat16) {
    return numeric::FloatToBf16(x);
  } else if constexpr (kType == DataType::kFloat16) {
    return numeric::FloatToHalf(x);
  } else {
    return x;
  }
}

// ---- the quantize kernel's per-thread steps ---------------------------------------------------
// quantize.cu's QuantizeKernel is these steps plus what only a GPU has (the warp and CTA max
// reductions, one warp shuffle, barriers); the CPU test runs the same steps for every thread of a
// group in turn, so that the kernel's indexing is checked too, not only its arithmetic.
//
// A group of kGroup threads (one warp, or a CTA for large blocks) quantizes one block. Thread t
// holds elements chunk + t + kGroup * k (k < kRegs) of it: coalesced loads, and the int4 partner
// of an even element is the next lane's.

// `#pragma unroll` for nvcc (the held elements must stay in registers); host compilers warn
// about pragmas they do not know.
#if defined(__CUDACC__)
#define STRAIT_UNROLL _Pragma("unroll")
#else
#define STRAIT_UNROLL
#endif

inline constexpr int kWarpSize = 32;
inline constexpr int kCtaThreads = 256;
inline constexpr int kRegs = 8;  // elements a thread holds
// Blocks of at least this many elements go to a whole CTA rather than one warp.
inline constexpr uint32_t kCtaBlockSize = kCtaThreads * kRegs;

struct QuantizeArgs {
  const void* src;  // `count` elements of the input type
  float* residual;  // null: no error feedback
  size_t count;
  size_t num_blocks;
  uint32_t block_size;
  bool stochastic;
  rng::Key key;
  uint64_t index_offset;
  float* scales;   // num_blocks
  uint8_t* codes;  // CodeBytes(kind, count)
};

template <typename T>
STRAIT_HD T LoadReadOnly(const T* p) {
#if defined(__CUDA_ARCH__)
  return __ldg(p);
#else
  return *p;
#endif
}

template <DataType kType, bool kResidual>
STRAIT_HD float LoadCompensated(const QuantizeArgs& a, size_t i) {
  using S = typename Storage<kType>::Type;
  const float x = ToFloat<kType>(LoadReadOnly(static_cast<const S*>(a.src) + i));
  if constexpr (kResidual) return Compensate(x, a.residual[i]);
  return x;
}

// Elements a thread holds in a block's first chunk: all kRegs, or fewer for small blocks.
template <int kGroup>
STRAIT_HD uint32_t FirstChunkRegs(uint32_t block_size) {
  return block_size >= static_cast<uint32_t>(kGroup) * kRegs ? kRegs : block_size / kGroup;
}

// Loads thread t's elements of the chunk at `chunk` (k < regs, below n) of the block at `begin`
// into c (0 elsewhere); returns the max of their |c| bits.
template <DataType kType, bool kResidual, int kGroup>
STRAIT_HD uint32_t LoadChunk(const QuantizeArgs& a, size_t begin, uint32_t chunk, uint32_t n,
                             uint32_t regs, unsigned t, float (&c)[kRegs]) {
  uint32_t absmax = 0;
  STRAIT_UNROLL
  for (int k = 0; k < kRegs; ++k) {
    const uint32_t j = chunk + t + static_cast<uint32_t>(kGroup * k);
    c[k] = 0.0f;
    if (static_cast<uint32_t>(k) < regs && j < n) {
      c[k] = LoadCompensated<kType, kResidual>(a, begin + j);
      absmax = MaxBits(absmax, AbsBits(c[k]));
    }
  }
  return absmax;
}

// Whether thread t's element k of the chunk exists.
template <int kGroup>
STRAIT_HD bool ChunkElementValid(uint32_t chunk, uint32_t n, uint32_t regs, unsigned t, int k) {
  const uint32_t j = chunk + t + static_cast<uint32_t>(kGroup * k);
  return static_cast<uint32_t>(k) < regs && j < n;
}

// The code of thread t's element k (0 when it does not exist); writes its new residual.
template <LossyKind kKind, bool kResidual, int kGroup>
STRAIT_HD uint8_t ChunkCode(const QuantizeArgs& a, const BlockScale& bs, size_t begin,
                            uint32_t chunk, bool valid, unsigned t, int k, float c) {
  if (!valid) return 0;
  const size_t i = begin + chunk + t + static_cast<uint32_t>(kGroup * k);
  const uint8_t code = QuantizeElement<kKind>(c, bs, a.stochastic, a.key, a.index_offset + i);
  if constexpr (kResidual) a.residual[i] = NewResidual<kKind>(c, code, bs.scale);
  return code;
}

// Stores thread t's code of element k; for int4, `next_code` is the next lane's (element i + 1,
// 0 when that does not exist) and even threads write the byte of the pair.
template <LossyKind kKind, int kGroup>
STRAIT_HD void StoreChunkCode(const QuantizeArgs& a, size_t begin, uint32_t chunk, bool valid,
                              unsigned t, int k, uint8_t code, uint8_t next_code) {
  if (!valid) return;
  const size_t i = begin + chunk + t + static_cast<uint32_t>(kGroup * k);
  if constexpr (kKind == LossyKind::kInt4) {
    if ((t & 1u) == 0) a.codes[i / 2] = static_cast<uint8_t>(code | (next_code << 4));
  } else {
    a.codes[i] = code;
  }
}

}  // namespace strait::quant_math

#endif  // STRAIT_LIB_CUDA_QUANT_MATH_H_

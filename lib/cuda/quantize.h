// strait::cuda: the GPU quantization kernels (built only where nvcc is found: STRAIT_HAVE_CUDA).
//
// They produce exactly the bytes of the CPU codec (lib/codec, kernels_scalar.cc) for the lossy
// codecs int8, int4 and fp8 e4m3: the same fp32 scales and codes (the frame's "stage", see
// LossyStageSize), the same counter-based stochastic rounding, and an error-feedback residual
// bit-identical to the CPU's. The arithmetic lives in quant_math.h, which the CPU tests run on the
// host against the CPU codec. One exception, outside the frame: where a residual or a decoded
// value is NaN (a block that held inf or NaN), it is NaN on both sides but its payload may
// differ (CUDA gives the canonical NaN, x86 propagates an operand's). Frames never differ: such a
// block's scale is the constant quiet NaN 0x7fc00000 and its codes are 0.
//
// Typical use (library mode): QuantizeAsync into a device stage buffer, cudaMemcpyAsync the
// LossyStageBytes() bytes to pinned host memory, and once they arrive WrapStage() them into a
// frame that is byte-identical to Encoder::EncodeWithFeedback's for the same input and options.
// The receiver copies a frame's stage (StageOf) to the device and calls DequantizeAsync.
//
// Every *Async function: enqueues work on the caller's `stream` and returns; it never
// synchronises and never allocates (an error message is its only allocation), and it is
// thread-safe (no state; but one residual buffer must not be used by two calls at once).
// Arguments are checked before anything is launched: a null or misaligned pointer, a too-small
// buffer, overlapping buffers or bad options give kInvalidArgument and launch nothing. A failed
// launch gives kInternal with CUDA's message (an earlier, unchecked non-sticky error of the
// calling thread is cleared first, so that it is not reported as this launch's).
// Device pointers must be device-accessible memory of the current device; float buffers must be
// 4-byte aligned and 16-bit inputs 2-byte aligned (codes need no alignment).
#ifndef STRAIT_LIB_CUDA_QUANTIZE_H_
#define STRAIT_LIB_CUDA_QUANTIZE_H_

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

#include "cuda/stage_frame.h"
#include "strait/codec.h"
#include "strait/status.h"
#include "strait/types.h"

namespace strait::cuda {

// Quantizes `count` elements of `dtype` (float32, bfloat16, float16) at device pointer `src`
// into `stage` (device memory of `stage_capacity` bytes, at least LossyStageBytes(count, options)):
// ScaleCount fp32 scales at stage[0..], then the codes. options.codec must be lossy
// (int8, int4, fp8); chain_zstd is ignored here (it applies in WrapStage); block_size, rounding,
// seed and index_offset mean what they mean for the CPU codec.
//
// Error feedback: with `residual` non-null (count fp32 values on the device, zero the first
// time), the input is compensated = src + residual and on return residual = compensated -
// dequantized, exactly as Encoder::EncodeWithFeedback does; one pass reads src and residual and
// writes codes, scales and the new residual. `residual` may not overlap `src` or `stage`.
Status QuantizeAsync(const void* src, DataType dtype, size_t count, const CodecOptions& options,
                     float* residual, uint8_t* stage, size_t stage_capacity, cudaStream_t stream);

// Dequantizes a device `stage` (LossyStageBytes(count, ...) bytes of a `codec` stage with
// `block_size`) into `out`: `count` elements of `out_dtype` (float32, bfloat16 or float16;
// narrow outputs rounded to nearest even), the values Decoder::Decode gives.
Status DequantizeAsync(const uint8_t* stage, CodecId codec, uint32_t block_size, size_t count,
                       void* out, DataType out_dtype, cudaStream_t stream);

// acc[i] += dequantized[i] in fp32 (one fp32 add each), as Decoder::DecodeAccumulate.
Status DequantizeAccumulateAsync(const uint8_t* stage, CodecId codec, uint32_t block_size,
                                 size_t count, float* acc, cudaStream_t stream);

// True when the CUDA runtime sees at least one device (the runtime's own answer; no context is
// created beyond what cudaGetDeviceCount does). `why` says why not, when false.
bool HaveCudaDevice(std::string* why = nullptr);

}  // namespace strait::cuda

#endif  // STRAIT_LIB_CUDA_QUANTIZE_H_

// Internal, host only (no CUDA header): the frames around the stage bytes the GPU kernels write.
//
// The GPU quantizer (quantize.h) writes a lossy frame's stage -- ScaleCount fp32 scales, then the
// codes -- into device memory; after the device-to-host copy, WrapStage adds what the CPU
// Encoder adds (the 48-byte header with its two crc32c checksums, and zstd when chained) so that
// the frame is byte-identical to Encoder::EncodeWithFeedback's for the same input and options.
// StageOf goes the other way for the receiver. This file is compiled into strait::cuda and, in
// CPU-only builds, into the CPU test that checks it against the codec (tests/cuda).
#ifndef STRAIT_LIB_CUDA_STAGE_FRAME_H_
#define STRAIT_LIB_CUDA_STAGE_FRAME_H_

#include <cstddef>
#include <cstdint>
#include <span>

#include "strait/codec.h"
#include "strait/status.h"
#include "strait/types.h"

namespace strait::cuda {

// Stage bytes for `count` elements under a lossy `options` (scales then codes), or 0 when
// options.codec is not lossy or options.block_size is invalid.
size_t LossyStageBytes(size_t count, const CodecOptions& options) noexcept;

// The largest frame WrapStage may write for `count` elements (the CPU codec's MaxFrameSize).
size_t MaxWrappedFrameSize(size_t count, DataType dtype, const CodecOptions& options) noexcept;

// Wraps host `stage` bytes (what QuantizeAsync wrote for `count` elements of `dtype` under
// `options`, copied to the host; exactly LossyStageBytes(count, options) of them) into a frame
// in `out` (at least MaxWrappedFrameSize bytes): the header with both checksums and the payload
// (the stage, or zstd of it when options.chain_zstd), byte-identical to the frame the CPU
// Encoder writes for the same input and options. Returns the frame size. Runs on the calling
// thread (crc32c, and zstd when chained, with a per-thread zstd context); thread-safe.
StatusOr<size_t> WrapStage(std::span<const uint8_t> stage, size_t count, DataType dtype,
                           const CodecOptions& options, std::span<uint8_t> out);

// The stage bytes inside a lossy `frame` without zstd, after validating the frame as
// InspectFrame does; `info` (optional) receives its header. A zstd-chained frame gives
// kInvalidArgument (decode it with the CPU Decoder, or send frames unchained to GPU receivers);
// a lossless frame too.
StatusOr<std::span<const uint8_t>> StageOf(std::span<const uint8_t> frame,
                                           FrameInfo* info = nullptr);

}  // namespace strait::cuda

#endif  // STRAIT_LIB_CUDA_STAGE_FRAME_H_

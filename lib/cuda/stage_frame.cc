// Frames around GPU-made stage bytes: what codec.cc's Encoder does after its quantize kernel,
// repeated here step for step (flags, sizes, zstd parameters, checksums) so that the frames are
// byte-identical. tests/cuda/quant_math_test.cc compares them with Encoder's frames.
#include "cuda/stage_frame.h"

#include <zstd.h>

#include <algorithm>
#include <memory>
#include <string>

#include "codec/crc32c.h"
#include "codec/frame.h"
#include "codec/kernels.h"

namespace strait::cuda {
namespace {

namespace ci = codec_internal;

ci::LossyKind KindOf(CodecId codec) {
  switch (codec) {
    case CodecId::kInt4: return ci::LossyKind::kInt4;
    case CodecId::kFp8E4M3: return ci::LossyKind::kFp8;
    default: return ci::LossyKind::kInt8;
  }
}

bool ValidBlockSize(uint32_t b) {
  return b >= kMinBlockSize && b <= kMaxBlockSize && (b & (b - 1)) == 0;
}

std::string Num(uint64_t v) {
  return std::to_string(v);
}

struct CCtxDeleter {
  void operator()(ZSTD_CCtx* c) const { ZSTD_freeCCtx(c); }
};

// zstd of a lossy stage exactly as Encoder::Impl::Compress does it for unshuffled data: the
// default parameters of the level, nothing else.
StatusOr<size_t> CompressStage(const uint8_t* src, size_t size, int level, uint8_t* dst,
                               size_t capacity) {
  thread_local std::unique_ptr<ZSTD_CCtx, CCtxDeleter> cctx;
  if (!cctx) {
    cctx.reset(ZSTD_createCCtx());
    if (!cctx) return ResourceExhaustedError("wrap stage: cannot allocate a zstd context");
  }
  size_t r = ZSTD_CCtx_reset(cctx.get(), ZSTD_reset_parameters);
  if (!ZSTD_isError(r)) r = ZSTD_CCtx_setParameter(cctx.get(), ZSTD_c_compressionLevel, level);
  if (ZSTD_isError(r)) {
    return InternalError("wrap stage: zstd rejected level " + std::to_string(level) + ": " +
                         ZSTD_getErrorName(r));
  }
  static const uint8_t kEmpty = 0;
  r = ZSTD_compress2(cctx.get(), dst, capacity, size == 0 ? &kEmpty : src, size);
  if (ZSTD_isError(r)) {
    return InternalError(std::string("wrap stage: zstd failed: ") + ZSTD_getErrorName(r));
  }
  return r;
}

}  // namespace

size_t LossyStageBytes(size_t count, const CodecOptions& options) noexcept {
  if (!IsLossyCodec(options.codec) || !ValidBlockSize(options.block_size)) return 0;
  if (count > kMaxFrameElements) return 0;
  return ci::LossyStageSize(KindOf(options.codec), count, options.block_size);
}

size_t MaxWrappedFrameSize(size_t count, DataType dtype, const CodecOptions& options) noexcept {
  return MaxFrameSize(count, dtype, options);
}

StatusOr<size_t> WrapStage(std::span<const uint8_t> stage, size_t count, DataType dtype,
                           const CodecOptions& options, std::span<uint8_t> out) {
  STRAIT_RETURN_IF_ERROR(ValidateCodecOptions(options, dtype));
  if (!IsLossyCodec(options.codec)) {
    return InvalidArgumentError(std::string("wrap stage: codec ") + CodecName(options.codec) +
                                " is lossless; only int8, int4 and fp8 stages come from the GPU");
  }
  if (count > kMaxFrameElements) {
    return InvalidArgumentError("wrap stage: count " + Num(count) + " exceeds the frame limit of " +
                                Num(kMaxFrameElements) + " elements; send the tensor in chunks");
  }
  const size_t stage_size = LossyStageBytes(count, options);
  if (stage.size() != stage_size) {
    return InvalidArgumentError("wrap stage: the stage holds " + Num(stage.size()) + " bytes, " +
                                Num(count) + " elements of " + CodecName(options.codec) +
                                " with block size " + Num(options.block_size) + " need " +
                                Num(stage_size));
  }
  const size_t need = MaxFrameSize(count, dtype, options);
  if (out.size() < need) {
    return InvalidArgumentError("wrap stage: the output buffer holds " + Num(out.size()) +
                                " bytes, MaxWrappedFrameSize() for this tensor is " + Num(need));
  }
  FrameInfo info;
  info.codec = options.codec;
  info.dtype = dtype;
  info.element_count = count;
  info.block_size = options.block_size;
  info.stage_size = stage_size;
  if (options.rounding == Rounding::kStochastic) info.flags |= kFrameFlagStochastic;
  uint8_t* payload = out.data() + kFrameHeaderSize;
  if (options.chain_zstd) {
    info.flags |= kFrameFlagZstd;
    STRAIT_ASSIGN_OR_RETURN(info.payload_size,
                            CompressStage(stage.data(), stage_size, options.zstd_level, payload,
                                          out.size() - kFrameHeaderSize));
  } else {
    if (stage_size > 0) std::copy(stage.begin(), stage.end(), payload);
    info.payload_size = stage_size;
  }
  const uint32_t crc = Crc32c(payload, info.payload_size);
  ci::WriteFrameHeader(info, crc, out.data());
  return kFrameHeaderSize + info.payload_size;
}

StatusOr<std::span<const uint8_t>> StageOf(std::span<const uint8_t> frame, FrameInfo* info) {
  STRAIT_ASSIGN_OR_RETURN(FrameInfo header, InspectFrame(frame));
  if (!IsLossyCodec(header.codec)) {
    return InvalidArgumentError(std::string("stage of frame: a ") + CodecName(header.codec) +
                                " frame has no quantized stage; decode it with the CPU Decoder");
  }
  if ((header.flags & kFrameFlagZstd) != 0) {
    return InvalidArgumentError(
        "stage of frame: the stage is zstd-compressed (chain_zstd); decode it with the CPU "
        "Decoder, or send unchained frames to GPU receivers");
  }
  if (info != nullptr) *info = header;
  return frame.subspan(kFrameHeaderSize, static_cast<size_t>(header.stage_size));
}

}  // namespace strait::cuda

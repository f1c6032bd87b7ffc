// Encoder and Decoder: the glue between frames, zstd, the byte shuffle and the quantizer kernels.
//
// Both keep their zstd context and scratch buffers across calls, so steady-state encoding and
// decoding allocate nothing. Decoding validates the whole frame (header, payload checksum and,
// for zstd, the exact decompressed size) before it writes anything the caller accumulates into.
#include "strait/codec.h"

// For ZSTD_c_literalCompressionMode (see Compress); the value has been stable since zstd 1.4.
#define ZSTD_STATIC_LINKING_ONLY
#include <zstd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "codec/crc32c.h"
#include "codec/frame.h"
#include "codec/kernels.h"
#include "codec/shuffle.h"

namespace strait {
namespace {

namespace ci = codec_internal;

// Lossy frames decode to bfloat16/float16 (or an unaligned float32 buffer) through an fp32
// chunk of this many elements, which keeps the scratch small and in cache.
constexpr size_t kDecodeChunk = 16384;

ci::LossyKind KindOf(CodecId codec) {
  switch (codec) {
    case CodecId::kInt4: return ci::LossyKind::kInt4;
    case CodecId::kFp8E4M3: return ci::LossyKind::kFp8;
    default: return ci::LossyKind::kInt8;
  }
}

bool Shuffles(const CodecOptions& options, DataType dtype) {
  const size_t size = DataTypeSize(dtype);
  return options.codec == CodecId::kZstd && options.byte_shuffle &&
         (size == 2 || size == 4 || size == 8);
}

template <typename T>
T* Grow(std::vector<T>& v, size_t n) {
  if (v.size() < n) v.resize(n);
  return v.data();
}

std::string Num(uint64_t v) {
  return std::to_string(v);
}

struct CCtxDeleter {
  void operator()(ZSTD_CCtx* c) const { ZSTD_freeCCtx(c); }
};
struct DCtxDeleter {
  void operator()(ZSTD_DCtx* c) const { ZSTD_freeDCtx(c); }
};

// ---- byte planes --------------------------------------------------------------------------------
// A shuffled stage is compressed plane by plane, each plane as its own zstd frame; zstd
// decompresses concatenated frames into their concatenation, so the decoder (and the wire
// format) cannot tell. The point is the planes of mantissa bits: they are noise, zstd spends as
// long failing to compress them as compressing the rest, and here they are stored as a zstd frame
// of raw blocks written directly (RFC 8878, section 3.1.1), at memcpy speed.

// Planes below this size go through one zstd call: per-frame overhead would show, and
// compressBound's small-input margin is per call.
constexpr size_t kMinPlaneBytes = size_t{128} << 10;
constexpr size_t kZstdMaxBlock = size_t{128} << 10;
// Shannon entropy, in bits per byte, above which a plane is stored raw: even an ideal entropy
// coder would save under 2.5%.
constexpr double kRawEntropyBits = 7.8;

// Entropy of `n` bytes estimated from 64 runs of 256 bytes spread across them.
double SampledEntropyBits(const uint8_t* p, size_t n) {
  uint32_t hist[256] = {};
  constexpr size_t kRuns = 64, kRun = 256;
  const size_t stride = n / kRuns;
  size_t total = 0;
  for (size_t r = 0; r < kRuns; ++r) {
    const uint8_t* run = p + r * stride;
    const size_t len = std::min(kRun, n - r * stride);
    for (size_t i = 0; i < len; ++i) ++hist[run[i]];
    total += len;
  }
  double bits = 0;
  for (uint32_t h : hist) {
    if (h == 0) continue;
    const double q = static_cast<double>(h) / static_cast<double>(total);
    bits -= q * std::log2(q);
  }
  return bits;
}

// Writes `src` as a zstd frame of raw blocks; returns its size. The caller guarantees room:
// 14 header bytes + 3 per 128 KiB block + the data.
size_t WriteRawZstdFrame(const uint8_t* src, size_t n, uint8_t* dst) {
  uint8_t* out = dst;
  const uint32_t magic = 0xFD2FB528u;
  std::memcpy(out, &magic, 4);
  out[4] = 0xC0;                  // 8-byte content size, windowed, no checksum, no dictionary
  out[5] = (17 - 10) << 3;        // window 128 KiB: blocks may be as large as that
  const uint64_t content = n;
  std::memcpy(out + 6, &content, 8);
  out += 14;
  size_t left = n;
  do {
    const size_t block = std::min(left, kZstdMaxBlock);
    left -= block;
    const uint32_t header = (static_cast<uint32_t>(block) << 3) | (left == 0 ? 1u : 0u);
    out[0] = static_cast<uint8_t>(header);
    out[1] = static_cast<uint8_t>(header >> 8);
    out[2] = static_cast<uint8_t>(header >> 16);
    std::memcpy(out + 3, src, block);
    out += 3 + block;
    src += block;
  } while (left > 0);
  return static_cast<size_t>(out - dst);
}

// Checks the arguments common to every Encode* call.
Status CheckEncodeArgs(const void* data, size_t count, DataType dtype,
                       const CodecOptions& options) {
  if (data == nullptr && count > 0) {
    return InvalidArgumentError("encode: data is null but count is " + Num(count));
  }
  if (count > kMaxFrameElements) {
    return InvalidArgumentError("encode: count " + Num(count) + " exceeds the frame limit of " +
                                Num(kMaxFrameElements) + " elements; send the tensor in chunks");
  }
  return ValidateCodecOptions(options, dtype);
}

}  // namespace

size_t MaxFrameSize(size_t count, DataType dtype, const CodecOptions& options) noexcept {
  if (count > kMaxFrameElements || !IsValidDataType(static_cast<uint8_t>(dtype))) return 0;
  size_t stage = 0;
  bool zstd = false;
  if (IsLossyCodec(options.codec)) {
    const uint32_t b = options.block_size;
    const bool valid_block = b >= kMinBlockSize && b <= kMaxBlockSize && (b & (b - 1)) == 0;
    stage = ci::LossyStageSize(KindOf(options.codec), count, valid_block ? b : kMinBlockSize);
    zstd = options.chain_zstd;
  } else if (options.codec == CodecId::kNone || options.codec == CodecId::kZstd) {
    stage = count * DataTypeSize(dtype);
    zstd = options.codec == CodecId::kZstd;
  } else {
    return 0;
  }
  if (zstd) {
    const size_t bound = ZSTD_compressBound(stage);
    if (ZSTD_isError(bound)) return 0;
    stage = std::max(stage, bound);
  }
  return kFrameHeaderSize + stage;
}

// ---- Encoder ----------------------------------------------------------------------------------

struct Encoder::Impl {
  std::unique_ptr<ZSTD_CCtx, CCtxDeleter> cctx;
  std::vector<uint8_t> stage;  // the shuffled data, or a lossy stage that zstd compresses next
  std::vector<float> scales;   // aligned home for scales on their way to an unaligned frame

  // `shuffled`: src is byte-plane shuffled. On floating-point data zstd's fast match finder
  // spends most of its time in the exponent plane, whose redundancy is in its byte frequencies
  // (a few exponents), not in repeats; a larger search step with Huffman-coded literals forced
  // on is there both about twice as fast and slightly smaller (64 MiB of normal(0, 1e-3) fp32:
  // 1.0 GB/s and ratio 1.195 against 0.52 GB/s and 1.188 for plain level 1). Mantissa planes
  // are incompressible either way, and runs (zero planes of integer data) are still found.
  // Unshuffled data and the slower levels get zstd's own parameters for the level.
  StatusOr<size_t> Compress(const uint8_t* src, size_t size, int level, bool shuffled, uint8_t* dst,
                            size_t capacity) {
    if (!cctx) {
      cctx.reset(ZSTD_createCCtx());
      if (!cctx) return ResourceExhaustedError("encode: cannot allocate a zstd context");
    }
    // Parameters persist in a context: start from the defaults every call.
    size_t r = ZSTD_CCtx_reset(cctx.get(), ZSTD_reset_parameters);
    if (!ZSTD_isError(r)) r = ZSTD_CCtx_setParameter(cctx.get(), ZSTD_c_compressionLevel, level);
    if (ZSTD_isError(r)) {
      return InternalError(std::string("encode: zstd rejected level ") + std::to_string(level) +
                           ": " + ZSTD_getErrorName(r));
    }
    if (shuffled && level <= 1 && level != 0) {  // level 0 means zstd's default, level 3
      // Level 1 searches with step 64; the negative levels, meant to be faster, more so.
      ZSTD_CCtx_setParameter(cctx.get(), ZSTD_c_targetLength, 64 * (2 - level));
      // 1 = always Huffman-code literals (ZSTD_ps_enable; ZSTD_lcm_huffman before 1.5).
      // Failure only costs speed, so it is not an error.
      ZSTD_CCtx_setParameter(cctx.get(), ZSTD_c_literalCompressionMode, 1);
    }
    static const uint8_t kEmpty = 0;
    r = ZSTD_compress2(cctx.get(), dst, capacity, size == 0 ? &kEmpty : src, size);
    if (ZSTD_isError(r)) {
      return InternalError(std::string("encode: zstd failed: ") + ZSTD_getErrorName(r));
    }
    return r;
  }

  // Compresses a byte-plane shuffled stage of `planes` planes plane by plane (see "byte
  // planes" above). Each plane is at least kMinPlaneBytes, so the sum of the per-plane bounds
  // stays within ZSTD_compressBound(size), which MaxFrameSize reserved.
  StatusOr<size_t> CompressPlanes(const uint8_t* src, size_t size, size_t planes, int level,
                                  uint8_t* dst, size_t capacity) {
    const size_t plane = size / planes;
    size_t written = 0;
    for (size_t p = 0; p < planes; ++p) {
      // The bytes that form no whole element trail the last plane.
      const size_t n = p + 1 == planes ? size - p * plane : plane;
      const uint8_t* in = src + p * plane;
      if (SampledEntropyBits(in, n) >= kRawEntropyBits) {
        written += WriteRawZstdFrame(in, n, dst + written);
      } else {
        STRAIT_ASSIGN_OR_RETURN(size_t w,
                                Compress(in, n, level, true, dst + written, capacity - written));
        written += w;
      }
    }
    return written;
  }

  StatusOr<size_t> Encode(const void* data, size_t count, DataType dtype,
                          const CodecOptions& options, float* residual, bool feedback,
                          std::span<uint8_t> out) {
    STRAIT_RETURN_IF_ERROR(CheckEncodeArgs(data, count, dtype, options));
    const bool lossy = IsLossyCodec(options.codec);
    if (feedback && lossy && residual == nullptr && count > 0) {
      return InvalidArgumentError("encode: residual is null but count is " + Num(count));
    }
    const size_t need = MaxFrameSize(count, dtype, options);
    if (out.size() < need) {
      return InvalidArgumentError("encode: the output buffer holds " + Num(out.size()) +
                                  " bytes, MaxFrameSize() for this tensor is " + Num(need));
    }
    FrameInfo info;
    info.codec = options.codec;
    info.dtype = dtype;
    info.element_count = count;
    uint8_t* payload = out.data() + kFrameHeaderSize;
    const size_t capacity = out.size() - kFrameHeaderSize;
    const auto* src = static_cast<const uint8_t*>(data);

    if (!lossy) {
      const size_t bytes = count * DataTypeSize(dtype);
      info.stage_size = bytes;
      if (options.codec == CodecId::kNone) {
        if (bytes > 0) std::memcpy(payload, src, bytes);
        info.payload_size = bytes;
      } else {
        info.flags |= kFrameFlagZstd;
        if (Shuffles(options, dtype)) {
          info.flags |= kFrameFlagShuffled;
          if (bytes > 0) {
            uint8_t* shuffled = Grow(stage, bytes);
            ci::ByteShuffle(src, shuffled, bytes, DataTypeSize(dtype));
            src = shuffled;
          }
        }
        const bool shuffled = (info.flags & kFrameFlagShuffled) != 0;
        const size_t planes = DataTypeSize(dtype);
        if (shuffled && bytes / planes >= kMinPlaneBytes) {
          STRAIT_ASSIGN_OR_RETURN(info.payload_size, CompressPlanes(src, bytes, planes,
                                                                    options.zstd_level, payload,
                                                                    capacity));
        } else {
          STRAIT_ASSIGN_OR_RETURN(info.payload_size, Compress(src, bytes, options.zstd_level,
                                                              shuffled, payload, capacity));
        }
      }
    } else {
      const ci::LossyKind kind = KindOf(options.codec);
      const size_t scale_count = ci::ScaleCount(count, options.block_size);
      const size_t stage_size = ci::LossyStageSize(kind, count, options.block_size);
      info.block_size = options.block_size;
      info.stage_size = stage_size;
      if (options.rounding == Rounding::kStochastic) info.flags |= kFrameFlagStochastic;
      uint8_t* dst = options.chain_zstd ? Grow(stage, stage_size) : payload;
      if (count > 0) {
        ci::QuantParams params;
        params.block_size = options.block_size;
        params.rounding = options.rounding;
        params.seed = options.seed;
        params.index_offset = options.index_offset;
        float* sc = Grow(scales, scale_count);
        ci::ActiveKernels().quantize[static_cast<int>(kind)](
            data, dtype, feedback ? residual : nullptr, count, params, sc,
            dst + scale_count * sizeof(float));
        std::memcpy(dst, sc, scale_count * sizeof(float));
      }
      if (options.chain_zstd) {
        info.flags |= kFrameFlagZstd;
        STRAIT_ASSIGN_OR_RETURN(info.payload_size, Compress(dst, stage_size, options.zstd_level,
                                                            false, payload, capacity));
      } else {
        info.payload_size = stage_size;
      }
    }
    const uint32_t crc = Crc32c(payload, info.payload_size);
    ci::WriteFrameHeader(info, crc, out.data());
    return kFrameHeaderSize + info.payload_size;
  }

  Status EncodeVector(const void* data, size_t count, DataType dtype, const CodecOptions& options,
                      float* residual, bool feedback, std::vector<uint8_t>* out) {
    if (out == nullptr) return InvalidArgumentError("encode: the output vector is null");
    STRAIT_RETURN_IF_ERROR(CheckEncodeArgs(data, count, dtype, options));
    const size_t max = MaxFrameSize(count, dtype, options);
    out->reserve(max + kFrameSpareCapacity);
    out->resize(max);
    StatusOr<size_t> size = Encode(data, count, dtype, options, residual, feedback, *out);
    if (!size.ok()) {
      out->clear();
      return size.status();
    }
    out->resize(*size);
    return Status::Ok();
  }
};

Encoder::Encoder() : impl_(std::make_unique<Impl>()) {}
Encoder::~Encoder() = default;
Encoder::Encoder(Encoder&&) noexcept = default;
Encoder& Encoder::operator=(Encoder&&) noexcept = default;

Status Encoder::Encode(const void* data, size_t count, DataType dtype, const CodecOptions& options,
                       std::vector<uint8_t>* out) {
  if (!impl_) impl_ = std::make_unique<Impl>();  // a moved-from Encoder still works
  return impl_->EncodeVector(data, count, dtype, options, nullptr, false, out);
}

StatusOr<size_t> Encoder::EncodeInto(const void* data, size_t count, DataType dtype,
                                     const CodecOptions& options, std::span<uint8_t> out) {
  if (!impl_) impl_ = std::make_unique<Impl>();
  return impl_->Encode(data, count, dtype, options, nullptr, false, out);
}

Status Encoder::EncodeWithFeedback(const void* data, size_t count, DataType dtype,
                                   const CodecOptions& options, float* residual,
                                   std::vector<uint8_t>* out) {
  if (!impl_) impl_ = std::make_unique<Impl>();
  return impl_->EncodeVector(data, count, dtype, options, residual, true, out);
}

StatusOr<size_t> Encoder::EncodeWithFeedbackInto(const void* data, size_t count, DataType dtype,
                                                 const CodecOptions& options, float* residual,
                                                 std::span<uint8_t> out) {
  if (!impl_) impl_ = std::make_unique<Impl>();
  return impl_->Encode(data, count, dtype, options, residual, true, out);
}

// ---- Decoder ----------------------------------------------------------------------------------

struct Decoder::Impl {
  std::unique_ptr<ZSTD_DCtx, DCtxDeleter> dctx;
  std::vector<uint8_t> stage;       // decompressed payload
  std::vector<uint8_t> unshuffled;  // lossless data after the inverse shuffle
  std::vector<float> scales;        // aligned copy of a lossy frame's scales
  std::vector<float> chunk;         // fp32 staging for narrow or unaligned outputs

  Status Decompress(const uint8_t* src, size_t size, uint8_t* dst, size_t expected) {
    if (!dctx) {
      dctx.reset(ZSTD_createDCtx());
      if (!dctx) return ResourceExhaustedError("decode: cannot allocate a zstd context");
    }
    uint8_t empty = 0;
    const size_t r =
        ZSTD_decompressDCtx(dctx.get(), expected == 0 ? &empty : dst, expected, src, size);
    if (ZSTD_isError(r)) {
      return DataLossError(std::string("corrupted frame payload: zstd: ") + ZSTD_getErrorName(r));
    }
    if (r != expected) {
      return DataLossError("corrupted frame payload: zstd produced " + Num(r) +
                           " bytes, the header says " + Num(expected));
    }
    return Status::Ok();
  }

  // Validates `frame` against the caller's count and expectations.
  StatusOr<FrameInfo> Validate(std::span<const uint8_t> frame, size_t count,
                               const DecodeExpectations& expect) {
    STRAIT_ASSIGN_OR_RETURN(FrameInfo info, InspectFrame(frame, expect));
    if (info.element_count != count) {
      return InvalidArgumentError("count mismatch: the frame holds " + Num(info.element_count) +
                                  " elements, the caller's buffer " + Num(count));
    }
    return info;
  }

  // The stage bytes of a validated frame; decompresses into scratch for zstd frames.
  StatusOr<const uint8_t*> Stage(std::span<const uint8_t> frame, const FrameInfo& info) {
    const uint8_t* payload = frame.data() + kFrameHeaderSize;
    if ((info.flags & kFrameFlagZstd) == 0) return payload;
    uint8_t* dst = Grow(stage, info.stage_size);
    STRAIT_RETURN_IF_ERROR(Decompress(payload, info.payload_size, dst, info.stage_size));
    return static_cast<const uint8_t*>(dst);
  }

  // The lossless element bytes: unshuffled into scratch where the frame is shuffled.
  const uint8_t* Unshuffled(const FrameInfo& info, const uint8_t* stage_bytes) {
    if ((info.flags & kFrameFlagShuffled) == 0 || info.stage_size == 0) return stage_bytes;
    uint8_t* dst = Grow(unshuffled, info.stage_size);
    ci::ByteUnshuffle(stage_bytes, dst, info.stage_size, DataTypeSize(info.dtype));
    return dst;
  }

  const float* Scales(const FrameInfo& info, const uint8_t* stage_bytes) {
    const size_t n = ci::ScaleCount(info.element_count, info.block_size);
    float* dst = Grow(scales, n);
    if (n > 0) std::memcpy(dst, stage_bytes, n * sizeof(float));
    return dst;
  }

  Status Decode(std::span<const uint8_t> frame, void* out, size_t count, DataType out_dtype,
                const DecodeExpectations& expect) {
    if (out == nullptr && count > 0) {
      return InvalidArgumentError("decode: out is null but count is " + Num(count));
    }
    if (!IsValidDataType(static_cast<uint8_t>(out_dtype))) {
      return InvalidArgumentError("decode: out_dtype " + Num(static_cast<unsigned>(out_dtype)) +
                                  " is not a data type");
    }
    STRAIT_ASSIGN_OR_RETURN(FrameInfo info, Validate(frame, count, expect));
    const uint8_t* payload = frame.data() + kFrameHeaderSize;
    if (!IsLossyCodec(info.codec)) {
      if (out_dtype != info.dtype) {
        return InvalidArgumentError(std::string("dtype mismatch: a lossless frame of ") +
                                    DataTypeName(info.dtype) + " decodes only to " +
                                    DataTypeName(info.dtype) + ", not " + DataTypeName(out_dtype));
      }
      const size_t bytes = info.stage_size;
      if (bytes == 0) return Status::Ok();
      if ((info.flags & kFrameFlagZstd) == 0) {
        std::memcpy(out, payload, bytes);
      } else if ((info.flags & kFrameFlagShuffled) == 0) {
        return Decompress(payload, info.payload_size, static_cast<uint8_t*>(out), bytes);
      } else {
        STRAIT_ASSIGN_OR_RETURN(const uint8_t* st, Stage(frame, info));
        ci::ByteUnshuffle(st, out, bytes, DataTypeSize(info.dtype));
      }
      return Status::Ok();
    }
    if (!IsLossyCodableType(out_dtype)) {
      return InvalidArgumentError(std::string("dtype mismatch: a ") + CodecName(info.codec) +
                                  " frame decodes to float32, bfloat16 or float16, not " +
                                  DataTypeName(out_dtype));
    }
    STRAIT_ASSIGN_OR_RETURN(const uint8_t* st, Stage(frame, info));
    if (count == 0) return Status::Ok();
    const ci::KernelTable& k = ci::ActiveKernels();
    const int kind = static_cast<int>(KindOf(info.codec));
    const float* sc = Scales(info, st);
    const uint8_t* codes = st + ci::ScaleCount(count, info.block_size) * sizeof(float);
    const bool aligned_fp32 =
        out_dtype == DataType::kFloat32 && reinterpret_cast<uintptr_t>(out) % alignof(float) == 0;
    if (aligned_fp32) {
      k.dequantize[kind](sc, codes, count, info.block_size, static_cast<float*>(out), false);
      return Status::Ok();
    }
    // Chunks are whole blocks (block sizes and kDecodeChunk are powers of two), so each chunk
    // starts at a scale boundary and, for int4, at a byte boundary.
    const size_t step = std::max<size_t>(kDecodeChunk, info.block_size);
    float* tmp = Grow(chunk, std::min(step, count));
    const size_t out_size = DataTypeSize(out_dtype);
    for (size_t first = 0; first < count; first += step) {
      const size_t n = std::min(step, count - first);
      const uint8_t* c = codes + ci::CodeBytes(static_cast<ci::LossyKind>(kind), first);
      k.dequantize[kind](sc + first / info.block_size, c, n, info.block_size, tmp, false);
      uint8_t* dst = static_cast<uint8_t*>(out) + first * out_size;
      if (out_dtype == DataType::kFloat32) {
        std::memcpy(dst, tmp, n * sizeof(float));
      } else {
        k.from_float(tmp, dst, out_dtype, n);
      }
    }
    return Status::Ok();
  }

  Status DecodeAccumulate(std::span<const uint8_t> frame, float* acc, size_t count,
                          const DecodeExpectations& expect) {
    if (acc == nullptr && count > 0) {
      return InvalidArgumentError("decode: acc is null but count is " + Num(count));
    }
    STRAIT_ASSIGN_OR_RETURN(FrameInfo info, Validate(frame, count, expect));
    const bool lossy = IsLossyCodec(info.codec);
    if (!lossy && !IsLossyCodableType(info.dtype)) {
      return InvalidArgumentError(std::string("decode: cannot accumulate a frame of ") +
                                  DataTypeName(info.dtype) +
                                  " into float32; only float32, bfloat16 and float16 frames");
    }
    // Everything that can fail is above or in Stage(); acc is written only after it succeeds.
    STRAIT_ASSIGN_OR_RETURN(const uint8_t* st, Stage(frame, info));
    if (count == 0) return Status::Ok();
    const ci::KernelTable& k = ci::ActiveKernels();
    if (lossy) {
      const int kind = static_cast<int>(KindOf(info.codec));
      const float* sc = Scales(info, st);
      const uint8_t* codes = st + ci::ScaleCount(count, info.block_size) * sizeof(float);
      k.dequantize[kind](sc, codes, count, info.block_size, acc, true);
    } else {
      k.to_float(Unshuffled(info, st), info.dtype, acc, count, true);
    }
    return Status::Ok();
  }
};

Decoder::Decoder() : impl_(std::make_unique<Impl>()) {}
Decoder::~Decoder() = default;
Decoder::Decoder(Decoder&&) noexcept = default;
Decoder& Decoder::operator=(Decoder&&) noexcept = default;

Status Decoder::Decode(std::span<const uint8_t> frame, void* out, size_t count, DataType out_dtype,
                       const DecodeExpectations& expect) {
  if (!impl_) impl_ = std::make_unique<Impl>();  // a moved-from Decoder still works
  return impl_->Decode(frame, out, count, out_dtype, expect);
}

Status Decoder::DecodeAccumulate(std::span<const uint8_t> frame, float* acc, size_t count,
                                 const DecodeExpectations& expect) {
  if (!impl_) impl_ = std::make_unique<Impl>();
  return impl_->DecodeAccumulate(frame, acc, count, expect);
}

}  // namespace strait

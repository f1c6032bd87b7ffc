// The frame header: writing it, and validating untrusted frames field by field so that every
// kind of damage gets its own error and nothing is read outside the given bytes.
#include "codec/frame.h"

#include <zstd.h>

#include <cstdio>
#include <cstring>
#include <limits>
#include <string>

#include "codec/crc32c.h"
#include "codec/kernels.h"

namespace strait::codec_internal {
namespace {

template <typename T>
T Load(const uint8_t* p) {
  T v;
  std::memcpy(&v, p, sizeof(v));
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
  if constexpr (sizeof(T) == 2) v = __builtin_bswap16(v);
  if constexpr (sizeof(T) == 4) v = __builtin_bswap32(v);
  if constexpr (sizeof(T) == 8) v = __builtin_bswap64(v);
#endif
  return v;
}

template <typename T>
void Store(uint8_t* p, T v) {
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
  if constexpr (sizeof(T) == 2) v = __builtin_bswap16(v);
  if constexpr (sizeof(T) == 4) v = __builtin_bswap32(v);
  if constexpr (sizeof(T) == 8) v = __builtin_bswap64(v);
#endif
  std::memcpy(p, &v, sizeof(v));
}

bool ValidBlockSize(uint32_t b) {
  return b >= kMinBlockSize && b <= kMaxBlockSize && (b & (b - 1)) == 0;
}

LossyKind KindOf(CodecId codec) {
  switch (codec) {
    case CodecId::kInt4: return LossyKind::kInt4;
    case CodecId::kFp8E4M3: return LossyKind::kFp8;
    default: return LossyKind::kInt8;
  }
}

std::string Num(uint64_t v) {
  return std::to_string(v);
}

Status Invalid(const std::string& what) {
  return InvalidArgumentError("invalid frame: " + what);
}

}  // namespace

std::optional<uint64_t> ExpectedStageSize(CodecId codec, DataType dtype, uint64_t count,
                                          uint32_t block_size) noexcept {
  if (static_cast<unsigned>(codec) >= static_cast<unsigned>(kNumCodecs)) return std::nullopt;
  if (!IsValidDataType(static_cast<uint8_t>(dtype))) return std::nullopt;
  if (count > kMaxFrameElements) return std::nullopt;
  if (!IsLossyCodec(codec)) {
    const uint64_t size = DataTypeSize(dtype);
    if (count > std::numeric_limits<uint64_t>::max() / size) return std::nullopt;
    return count * size;
  }
  if (!IsLossyCodableType(dtype) || !ValidBlockSize(block_size)) return std::nullopt;
  // count <= 2^40, so neither the scale bytes nor the code bytes can overflow 64 bits.
  return LossyStageSize(KindOf(codec), count, block_size);
}

void WriteFrameHeader(const FrameInfo& info, uint32_t payload_crc, uint8_t* out) noexcept {
  Store<uint32_t>(out + kOffMagic, kFrameMagic);
  Store<uint16_t>(out + kOffVersion, kFrameVersion);
  Store<uint16_t>(out + kOffHeaderSize, static_cast<uint16_t>(kFrameHeaderSize));
  out[kOffCodec] = static_cast<uint8_t>(info.codec);
  out[kOffDtype] = static_cast<uint8_t>(info.dtype);
  Store<uint16_t>(out + kOffFlags, info.flags);
  Store<uint32_t>(out + kOffBlockSize, info.block_size);
  Store<uint64_t>(out + kOffCount, info.element_count);
  Store<uint64_t>(out + kOffPayloadSize, info.payload_size);
  Store<uint64_t>(out + kOffStageSize, info.stage_size);
  Store<uint32_t>(out + kOffPayloadCrc, payload_crc);
  Store<uint32_t>(out + kOffHeaderCrc, Crc32c(out, kOffHeaderCrc));
}

StatusOr<FrameInfo> ParseFrameHeader(std::span<const uint8_t> frame) {
  const uint8_t* p = frame.data();
  const size_t n = frame.size();
  // Magic and version come first: a later version may lay out (and checksum) its header
  // differently, so only they can be read before knowing the version.
  if (n >= 4 && Load<uint32_t>(p + kOffMagic) != kFrameMagic) {
    return DataLossError("not a Strait frame: the first 4 bytes are not the magic \"STRF\"");
  }
  if (n >= 6) {
    const uint16_t version = Load<uint16_t>(p + kOffVersion);
    if (version != kFrameVersion) {
      return UnimplementedError("unsupported frame version " + Num(version) +
                                ": this build reads version " + Num(kFrameVersion) +
                                "; upgrade the older side");
    }
  }
  if (n < kFrameHeaderSize) {
    return DataLossError("truncated frame: " + Num(n) + " bytes, the header alone needs " +
                         Num(kFrameHeaderSize));
  }
  if (Crc32c(p, kOffHeaderCrc) != Load<uint32_t>(p + kOffHeaderCrc)) {
    return DataLossError("corrupted frame header: header checksum mismatch");
  }

  FrameInfo info;
  info.version = kFrameVersion;
  const uint16_t header_size = Load<uint16_t>(p + kOffHeaderSize);
  const uint8_t raw_codec = p[kOffCodec];
  const uint8_t raw_dtype = p[kOffDtype];
  info.flags = Load<uint16_t>(p + kOffFlags);
  info.block_size = Load<uint32_t>(p + kOffBlockSize);
  info.element_count = Load<uint64_t>(p + kOffCount);
  info.payload_size = Load<uint64_t>(p + kOffPayloadSize);
  info.stage_size = Load<uint64_t>(p + kOffStageSize);

  if (header_size != kFrameHeaderSize) {
    return Invalid("header size " + Num(header_size) + ", version 1 headers are " +
                   Num(kFrameHeaderSize) + " bytes");
  }
  if (raw_codec >= kNumCodecs) {
    return Invalid("unknown codec " + Num(raw_codec) + " (known: 0.." + Num(kNumCodecs - 1) + ")");
  }
  info.codec = static_cast<CodecId>(raw_codec);
  if (!IsValidDataType(raw_dtype)) {
    return Invalid("unknown dtype " + Num(raw_dtype) + " (known: 0.." + Num(kNumDataTypes - 1) +
                   ")");
  }
  info.dtype = static_cast<DataType>(raw_dtype);
  if (info.element_count > kMaxFrameElements) {
    return ResourceExhaustedError("oversized frame: element count " + Num(info.element_count) +
                                  " exceeds the limit of " + Num(kMaxFrameElements) +
                                  "; large tensors must be sent in chunks");
  }
  if ((info.flags & ~kKnownFrameFlags) != 0) {
    char hex[8];
    std::snprintf(hex, sizeof(hex), "0x%04x", static_cast<unsigned>(info.flags));
    return Invalid(std::string("unknown flags in ") + hex + " (known: 0x0007)");
  }
  const bool lossy = IsLossyCodec(info.codec);
  const bool zstd = (info.flags & kFrameFlagZstd) != 0;
  if (lossy) {
    if (!IsLossyCodableType(info.dtype)) {
      return Invalid(std::string("codec ") + CodecName(info.codec) + " with dtype " +
                     DataTypeName(info.dtype) + "; lossy frames hold float32, bfloat16, float16");
    }
    if (!ValidBlockSize(info.block_size)) {
      return Invalid("block size " + Num(info.block_size) + " (allowed: a power of two in " +
                     Num(kMinBlockSize) + ".." + Num(kMaxBlockSize) + ")");
    }
    if ((info.flags & kFrameFlagShuffled) != 0) {
      return Invalid("the shuffled flag is set on a lossy frame");
    }
  } else {
    if (info.block_size != 0) {
      return Invalid("block size " + Num(info.block_size) + " on a " + CodecName(info.codec) +
                     " frame (must be 0)");
    }
    if ((info.flags & kFrameFlagStochastic) != 0) {
      return Invalid("the stochastic flag is set on a lossless frame");
    }
    if (zstd != (info.codec == CodecId::kZstd)) {
      return Invalid(std::string("the zstd flag is ") + (zstd ? "set" : "clear") + " on a " +
                     CodecName(info.codec) + " frame");
    }
    if ((info.flags & kFrameFlagShuffled) != 0 &&
        (info.codec != CodecId::kZstd || DataTypeSize(info.dtype) == 1)) {
      return Invalid(std::string("the shuffled flag is set on a ") + CodecName(info.codec) +
                     " frame of " + DataTypeName(info.dtype));
    }
  }
  const std::optional<uint64_t> stage =
      ExpectedStageSize(info.codec, info.dtype, info.element_count, info.block_size);
  if (!stage.has_value() || *stage != info.stage_size) {
    return Invalid("stage size " + Num(info.stage_size) + " does not match " +
                   Num(info.element_count) + " elements (expected " +
                   (stage ? Num(*stage) : std::string("none")) + ")");
  }
  if (!zstd && info.payload_size != info.stage_size) {
    return Invalid("payload size " + Num(info.payload_size) + " differs from stage size " +
                   Num(info.stage_size) + " without zstd");
  }
  if (zstd) {
    const size_t bound = ZSTD_compressBound(static_cast<size_t>(info.stage_size));
    if (ZSTD_isError(bound) || info.payload_size > bound) {
      return Invalid("zstd payload of " + Num(info.payload_size) + " bytes exceeds the bound for " +
                     Num(info.stage_size) + " stage bytes");
    }
  }
  const uint64_t available = n - kFrameHeaderSize;
  if (info.payload_size > available) {
    return DataLossError("truncated frame: " + Num(n) + " bytes, the header describes " +
                         Num(info.payload_size) + " payload bytes after " + Num(kFrameHeaderSize) +
                         " header bytes");
  }
  if (info.payload_size < available) {
    return ResourceExhaustedError("oversized frame: " + Num(n) + " bytes, the header describes " +
                                  Num(kFrameHeaderSize + info.payload_size));
  }
  return info;
}

uint32_t StoredPayloadCrc(std::span<const uint8_t> frame) noexcept {
  return frame.size() >= kFrameHeaderSize ? Load<uint32_t>(frame.data() + kOffPayloadCrc) : 0;
}

Status CheckExpectations(const FrameInfo& info, const DecodeExpectations& expect) {
  if (expect.codec.has_value() && *expect.codec != info.codec) {
    return InvalidArgumentError(std::string("codec mismatch: expected codec ") +
                                CodecName(*expect.codec) + ", the frame has " +
                                CodecName(info.codec));
  }
  if (expect.dtype.has_value() && *expect.dtype != info.dtype) {
    return InvalidArgumentError(std::string("codec mismatch: expected dtype ") +
                                DataTypeName(*expect.dtype) + ", the frame has " +
                                DataTypeName(info.dtype));
  }
  if (expect.element_count.has_value() && *expect.element_count != info.element_count) {
    return InvalidArgumentError("codec mismatch: expected " + Num(*expect.element_count) +
                                " elements, the frame has " + Num(info.element_count));
  }
  return Status::Ok();
}

}  // namespace strait::codec_internal

namespace strait {

StatusOr<FrameInfo> InspectFrame(std::span<const uint8_t> frame, const DecodeExpectations& expect) {
  STRAIT_ASSIGN_OR_RETURN(FrameInfo info, codec_internal::ParseFrameHeader(frame));
  STRAIT_RETURN_IF_ERROR(codec_internal::CheckExpectations(info, expect));
  const uint32_t crc =
      Crc32c(frame.data() + kFrameHeaderSize, static_cast<size_t>(info.payload_size));
  if (crc != codec_internal::StoredPayloadCrc(frame)) {
    return DataLossError("corrupted frame payload: payload checksum mismatch");
  }
  return info;
}

}  // namespace strait

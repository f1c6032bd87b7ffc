// Internal: reading and writing the 48-byte frame header described in strait/codec.h.
//
// WriteFrameHeader fills in both checksums (the payload's is passed in, since the caller has just
// produced the payload). ParseFrameHeader checks everything the header alone can tell, including
// that its sizes agree with the frame's length; InspectFrame (public) adds the payload checksum
// and the caller's expectations. Nothing here reads outside the span it is given.
#ifndef STRAIT_LIB_CODEC_FRAME_H_
#define STRAIT_LIB_CODEC_FRAME_H_

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>

#include "strait/codec.h"
#include "strait/status.h"

namespace strait::codec_internal {

// Byte offsets of the header fields.
inline constexpr size_t kOffMagic = 0;
inline constexpr size_t kOffVersion = 4;
inline constexpr size_t kOffHeaderSize = 6;
inline constexpr size_t kOffCodec = 8;
inline constexpr size_t kOffDtype = 9;
inline constexpr size_t kOffFlags = 10;
inline constexpr size_t kOffBlockSize = 12;
inline constexpr size_t kOffCount = 16;
inline constexpr size_t kOffPayloadSize = 24;
inline constexpr size_t kOffStageSize = 32;
inline constexpr size_t kOffPayloadCrc = 40;
inline constexpr size_t kOffHeaderCrc = 44;

// The stage size a frame with these fields must have, or nullopt where the fields are invalid
// (unknown codec or dtype, a lossy codec with a non-float dtype or a bad block size) or the size
// would overflow.
std::optional<uint64_t> ExpectedStageSize(CodecId codec, DataType dtype, uint64_t count,
                                          uint32_t block_size) noexcept;

// Writes the header for `info` (info.version is ignored: kFrameVersion is written) into the
// first kFrameHeaderSize bytes of `out`.
void WriteFrameHeader(const FrameInfo& info, uint32_t payload_crc, uint8_t* out) noexcept;

// Validates the header of `frame` and its sizes against frame.size(), but not the payload
// checksum. Errors are those of InspectFrame.
StatusOr<FrameInfo> ParseFrameHeader(std::span<const uint8_t> frame);

// The payload crc32c stored in a header that ParseFrameHeader accepted.
uint32_t StoredPayloadCrc(std::span<const uint8_t> frame) noexcept;

// Checks `info` against `expect`: kInvalidArgument "codec mismatch: ..." naming both values.
Status CheckExpectations(const FrameInfo& info, const DecodeExpectations& expect);

}  // namespace strait::codec_internal

#endif  // STRAIT_LIB_CODEC_FRAME_H_

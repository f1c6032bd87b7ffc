// The frame header: its byte layout, write/parse round trips, and one test per field rule of
// ParseFrameHeader (each forged with a valid header checksum so that the rule itself is reached).
#include "codec/frame.h"

#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "codec/crc32c.h"
#include "codec/kernels.h"
#include "codec_test_util.h"

namespace strait {
namespace {

using codec_internal::ExpectedStageSize;
using codec_internal::ParseFrameHeader;
using codec_internal::WriteFrameHeader;

// A frame of `info` whose payload is `payload_size` bytes of a pattern, both checksums valid.
std::vector<uint8_t> MakeFrame(FrameInfo info) {
  std::vector<uint8_t> frame(kFrameHeaderSize + info.payload_size);
  for (size_t i = kFrameHeaderSize; i < frame.size(); ++i) frame[i] = static_cast<uint8_t>(i * 7);
  const uint32_t crc = Crc32c(frame.data() + kFrameHeaderSize, info.payload_size);
  WriteFrameHeader(info, crc, frame.data());
  return frame;
}

// Recomputes the header checksum after a test has edited a field.
void Resign(std::vector<uint8_t>* frame) {
  const uint32_t crc = Crc32c(frame->data(), codec_internal::kOffHeaderCrc);
  std::memcpy(frame->data() + codec_internal::kOffHeaderCrc, &crc, 4);
}

FrameInfo Int8Info(uint64_t count) {
  FrameInfo info;
  info.codec = CodecId::kInt8;
  info.dtype = DataType::kFloat32;
  info.block_size = 256;
  info.element_count = count;
  info.stage_size = codec_internal::LossyStageSize(codec_internal::LossyKind::kInt8, count, 256);
  info.payload_size = info.stage_size;
  return info;
}

FrameInfo NoneInfo(DataType dtype, uint64_t count) {
  FrameInfo info;
  info.codec = CodecId::kNone;
  info.dtype = dtype;
  info.element_count = count;
  info.stage_size = count * DataTypeSize(dtype);
  info.payload_size = info.stage_size;
  return info;
}

void ExpectError(const std::vector<uint8_t>& frame, StatusCode code, const std::string& prefix) {
  StatusOr<FrameInfo> r = InspectFrame(frame);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), code) << r.status();
  EXPECT_EQ(r.status().message().rfind(prefix, 0), 0u) << r.status();
}

TEST(FrameHeader, LayoutIsLittleEndianAtTheDocumentedOffsets) {
  FrameInfo info = Int8Info(1000);
  info.flags = kFrameFlagStochastic;
  const std::vector<uint8_t> frame = MakeFrame(info);
  const uint8_t* h = frame.data();
  EXPECT_EQ(std::memcmp(h, "STRF", 4), 0);
  EXPECT_EQ(h[4], 1);  // version
  EXPECT_EQ(h[5], 0);
  EXPECT_EQ(h[6], 48);  // header size
  EXPECT_EQ(h[7], 0);
  EXPECT_EQ(h[8], 2);   // CodecId::kInt8
  EXPECT_EQ(h[9], 7);   // DataType::kFloat32
  EXPECT_EQ(h[10], 4);  // kFrameFlagStochastic
  EXPECT_EQ(h[11], 0);
  EXPECT_EQ(h[12] | (h[13] << 8), 256);
  EXPECT_EQ(testing_util::LoadU64(h + 16), 1000u);
  EXPECT_EQ(testing_util::LoadU64(h + 24), 4u * 4 + 1000);
  EXPECT_EQ(testing_util::LoadU64(h + 32), 4u * 4 + 1000);
  uint32_t payload_crc;
  uint32_t header_crc;
  std::memcpy(&payload_crc, h + 40, 4);
  std::memcpy(&header_crc, h + 44, 4);
  EXPECT_EQ(payload_crc, Crc32c(h + 48, frame.size() - 48));
  EXPECT_EQ(header_crc, Crc32c(h, 44));
}

TEST(FrameHeader, GoldenBytesOfAFloat32NoneFrame) {
  // Pins the version-1 wire format: two float32 elements, 1.0 and -2.0, codec none. If this
  // changes, frames from older builds no longer decode: bump kFrameVersion instead.
  Encoder encoder;
  const float data[2] = {1.0f, -2.0f};
  std::vector<uint8_t> frame;
  ASSERT_TRUE(encoder.Encode(data, 2, DataType::kFloat32, CodecOptions{}, &frame).ok());
  const std::vector<uint8_t> golden = {
      0x53, 0x54, 0x52, 0x46, 0x01, 0x00, 0x30, 0x00, 0x00, 0x07, 0x00, 0x00, 0x00, 0x00,
      0x00, 0x00, 0x02, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x08, 0x00, 0x00, 0x00,
      0x00, 0x00, 0x00, 0x00, 0x08, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0xc9, 0xf2,
      0x36, 0xaa, 0x68, 0x12, 0xd7, 0xf5, 0x00, 0x00, 0x80, 0x3f, 0x00, 0x00, 0x00, 0xc0};
  EXPECT_EQ(frame, golden);
}

TEST(FrameHeader, WriteThenParseRoundTrips) {
  std::vector<FrameInfo> infos;
  infos.push_back(NoneInfo(DataType::kFloat32, 0));
  infos.push_back(NoneInfo(DataType::kUint64, 3));
  infos.push_back(Int8Info(0));
  infos.push_back(Int8Info(257));
  FrameInfo int4 = Int8Info(33);
  int4.codec = CodecId::kInt4;
  int4.dtype = DataType::kBfloat16;
  int4.block_size = 32;
  int4.stage_size = codec_internal::LossyStageSize(codec_internal::LossyKind::kInt4, 33, 32);
  int4.payload_size = int4.stage_size;
  infos.push_back(int4);
  FrameInfo zstd = NoneInfo(DataType::kFloat16, 100);
  zstd.codec = CodecId::kZstd;
  zstd.flags = kFrameFlagZstd | kFrameFlagShuffled;
  zstd.payload_size = 57;
  infos.push_back(zstd);
  for (const FrameInfo& info : infos) {
    const std::vector<uint8_t> frame = MakeFrame(info);
    StatusOr<FrameInfo> parsed = ParseFrameHeader(frame);
    ASSERT_TRUE(parsed.ok()) << parsed.status();
    EXPECT_EQ(parsed->version, kFrameVersion);
    EXPECT_EQ(parsed->codec, info.codec);
    EXPECT_EQ(parsed->dtype, info.dtype);
    EXPECT_EQ(parsed->flags, info.flags);
    EXPECT_EQ(parsed->block_size, info.block_size);
    EXPECT_EQ(parsed->element_count, info.element_count);
    EXPECT_EQ(parsed->payload_size, info.payload_size);
    EXPECT_EQ(parsed->stage_size, info.stage_size);
    EXPECT_EQ(parsed->frame_size(), frame.size());
    EXPECT_TRUE(InspectFrame(frame).ok());
  }
}

TEST(FrameHeader, ExpectedStageSize) {
  EXPECT_EQ(ExpectedStageSize(CodecId::kNone, DataType::kFloat64, 10, 0), 80u);
  EXPECT_EQ(ExpectedStageSize(CodecId::kZstd, DataType::kBfloat16, 10, 0), 20u);
  EXPECT_EQ(ExpectedStageSize(CodecId::kInt8, DataType::kFloat32, 257, 256), 2 * 4 + 257u);
  EXPECT_EQ(ExpectedStageSize(CodecId::kInt4, DataType::kFloat16, 257, 256), 2 * 4 + 129u);
  EXPECT_EQ(ExpectedStageSize(CodecId::kFp8E4M3, DataType::kFloat32, 0, 64), 0u);
  EXPECT_EQ(ExpectedStageSize(CodecId::kNone, DataType::kUint64, kMaxFrameElements, 0),
            kMaxFrameElements * 8);
  EXPECT_FALSE(ExpectedStageSize(CodecId::kNone, DataType::kInt8, kMaxFrameElements + 1, 0));
  EXPECT_FALSE(ExpectedStageSize(CodecId::kInt8, DataType::kInt32, 10, 256));
  EXPECT_FALSE(ExpectedStageSize(CodecId::kInt8, DataType::kFloat32, 10, 100));
  EXPECT_FALSE(ExpectedStageSize(CodecId::kInt8, DataType::kFloat32, 10, 16));
  EXPECT_FALSE(ExpectedStageSize(static_cast<CodecId>(9), DataType::kFloat32, 10, 0));
  EXPECT_FALSE(ExpectedStageSize(CodecId::kNone, static_cast<DataType>(40), 10, 0));
}

// Each case edits one field of a valid frame and re-signs the header.
struct FieldCase {
  const char* name;
  FrameInfo (*base)();
  void (*edit)(std::vector<uint8_t>*);
  StatusCode code;
  const char* prefix;
};

FrameInfo BaseInt8() {
  return Int8Info(300);
}
FrameInfo BaseNone() {
  return NoneInfo(DataType::kFloat32, 10);
}
FrameInfo BaseZstd() {
  FrameInfo info = NoneInfo(DataType::kFloat32, 10);
  info.codec = CodecId::kZstd;
  info.flags = kFrameFlagZstd;
  info.payload_size = 20;
  return info;
}

template <size_t kOff, typename T, T kValue>
void Set(std::vector<uint8_t>* f) {
  const T v = kValue;
  std::memcpy(f->data() + kOff, &v, sizeof(T));
}

TEST(FrameHeader, EveryFieldRuleHasItsOwnError) {
  using codec_internal::kOffBlockSize;
  using codec_internal::kOffCodec;
  using codec_internal::kOffCount;
  using codec_internal::kOffDtype;
  using codec_internal::kOffFlags;
  using codec_internal::kOffHeaderSize;
  using codec_internal::kOffPayloadSize;
  using codec_internal::kOffStageSize;
  const StatusCode kInvalid = StatusCode::kInvalidArgument;
  const FieldCase cases[] = {
      {"header size", BaseInt8, Set<kOffHeaderSize, uint16_t, 64>, kInvalid, "invalid frame: "},
      {"unknown codec", BaseInt8, Set<kOffCodec, uint8_t, 5>, kInvalid, "invalid frame: "},
      {"unknown dtype", BaseInt8, Set<kOffDtype, uint8_t, 12>, kInvalid, "invalid frame: "},
      {"lossy int32", BaseInt8, Set<kOffDtype, uint8_t, 2>, kInvalid, "invalid frame: "},
      {"unknown flag", BaseInt8, Set<kOffFlags, uint16_t, 8>, kInvalid, "invalid frame: "},
      {"lossy shuffled", BaseInt8, Set<kOffFlags, uint16_t, 1>, kInvalid, "invalid frame: "},
      {"block not pow2", BaseInt8, Set<kOffBlockSize, uint32_t, 100>, kInvalid, "invalid frame: "},
      {"block too small", BaseInt8, Set<kOffBlockSize, uint32_t, 16>, kInvalid, "invalid frame: "},
      {"block too big", BaseInt8, Set<kOffBlockSize, uint32_t, 131072>, kInvalid,
       "invalid frame: "},
      {"block on none", BaseNone, Set<kOffBlockSize, uint32_t, 256>, kInvalid, "invalid frame: "},
      {"zstd flag on none", BaseNone, Set<kOffFlags, uint16_t, 2>, kInvalid, "invalid frame: "},
      {"shuffle on none", BaseNone, Set<kOffFlags, uint16_t, 1>, kInvalid, "invalid frame: "},
      {"stochastic on none", BaseNone, Set<kOffFlags, uint16_t, 4>, kInvalid, "invalid frame: "},
      {"zstd codec without flag", BaseZstd, Set<kOffFlags, uint16_t, 0>, kInvalid,
       "invalid frame: "},
      {"shuffle on 1-byte", BaseZstd,
       [](std::vector<uint8_t>* f) {
         Set<kOffDtype, uint8_t, 1>(f);
         Set<kOffFlags, uint16_t, 3>(f);
         Set<kOffStageSize, uint64_t, 10>(f);
       },
       kInvalid, "invalid frame: "},
      {"stage size", BaseNone, Set<kOffStageSize, uint64_t, 41>, kInvalid, "invalid frame: "},
      {"stage size for count", BaseInt8, Set<kOffCount, uint64_t, 299>, kInvalid,
       "invalid frame: "},
      {"payload differs from stage", BaseNone,
       [](std::vector<uint8_t>* f) {
         Set<kOffPayloadSize, uint64_t, 39>(f);
         f->pop_back();
       },
       kInvalid, "invalid frame: "},
      {"zstd payload above bound", BaseZstd, Set<kOffPayloadSize, uint64_t, 1000>, kInvalid,
       "invalid frame: "},
      {"count above limit", BaseNone, Set<kOffCount, uint64_t, (uint64_t{1} << 40) + 1>,
       StatusCode::kResourceExhausted, "oversized frame: "},
      {"payload beyond frame", BaseNone,
       [](std::vector<uint8_t>* f) {
         Set<kOffCount, uint64_t, 11>(f);
         Set<kOffStageSize, uint64_t, 44>(f);
         Set<kOffPayloadSize, uint64_t, 44>(f);
       },
       StatusCode::kDataLoss, "truncated frame: "},
      {"payload shorter than frame", BaseNone,
       [](std::vector<uint8_t>* f) {
         Set<kOffCount, uint64_t, 9>(f);
         Set<kOffStageSize, uint64_t, 36>(f);
         Set<kOffPayloadSize, uint64_t, 36>(f);
       },
       StatusCode::kResourceExhausted, "oversized frame: "},
  };
  for (const FieldCase& c : cases) {
    SCOPED_TRACE(c.name);
    std::vector<uint8_t> frame = MakeFrame(c.base());
    ASSERT_TRUE(InspectFrame(frame).ok());
    c.edit(&frame);
    Resign(&frame);
    ExpectError(frame, c.code, c.prefix);
  }
}

TEST(FrameHeader, ExpectationsNameBothValues) {
  const std::vector<uint8_t> frame = MakeFrame(Int8Info(300));
  DecodeExpectations e;
  e.codec = CodecId::kInt4;
  StatusOr<FrameInfo> r = InspectFrame(frame, e);
  ASSERT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(r.status().message(), "codec mismatch: expected codec int4, the frame has int8");
  e = {};
  e.dtype = DataType::kFloat16;
  r = InspectFrame(frame, e);
  EXPECT_EQ(r.status().message(), "codec mismatch: expected dtype float16, the frame has float32");
  e = {};
  e.element_count = 301;
  r = InspectFrame(frame, e);
  EXPECT_EQ(r.status().message(), "codec mismatch: expected 301 elements, the frame has 300");
  e.codec = CodecId::kInt8;
  e.dtype = DataType::kFloat32;
  e.element_count = 300;
  EXPECT_TRUE(InspectFrame(frame, e).ok());
}

}  // namespace
}  // namespace strait

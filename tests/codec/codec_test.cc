// Encoder/Decoder round trips for every codec x dtype x size x alignment, lossy error bounds read
// from the frame's own scales, the names and option checks, and the argument errors.
#include "strait/codec.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "codec/kernels.h"
#include "codec/numeric.h"
#include "codec_test_util.h"

namespace strait {
namespace {

using testing_util::AllDataTypes;
using testing_util::ElementAsFloat;
using testing_util::FloatDataTypes;
using testing_util::MakeInput;
using testing_util::Misaligned;

const std::vector<size_t> kSizes = {0, 1, 255, 256, 257, 100003};

bool HasPrefix(const Status& s, const std::string& prefix) {
  return s.message().rfind(prefix, 0) == 0;
}

// ---- names and options -------------------------------------------------------------------------

TEST(CodecNames, NamesParseBack) {
  for (int i = 0; i < kNumCodecs; ++i) {
    const auto codec = static_cast<CodecId>(i);
    EXPECT_EQ(ParseCodecId(CodecName(codec)), codec) << CodecName(codec);
  }
  EXPECT_STREQ(CodecName(CodecId::kFp8E4M3), "fp8");
  EXPECT_EQ(ParseCodecId("fp8e4m3"), CodecId::kFp8E4M3);
  EXPECT_EQ(ParseCodecId("e4m3"), CodecId::kFp8E4M3);
  EXPECT_EQ(ParseCodecId("ZSTD"), CodecId::kZstd);
  EXPECT_FALSE(ParseCodecId("int16").has_value());
  EXPECT_FALSE(ParseCodecId("").has_value());
  EXPECT_STREQ(CodecName(static_cast<CodecId>(77)), "invalid");
}

TEST(CodecNames, OnlyQuantizersAreLossy) {
  EXPECT_FALSE(IsLossyCodec(CodecId::kNone));
  EXPECT_FALSE(IsLossyCodec(CodecId::kZstd));
  EXPECT_TRUE(IsLossyCodec(CodecId::kInt8));
  EXPECT_TRUE(IsLossyCodec(CodecId::kInt4));
  EXPECT_TRUE(IsLossyCodec(CodecId::kFp8E4M3));
  EXPECT_FALSE(IsLossyCodec(static_cast<CodecId>(5)));
}

TEST(CodecOptions, ValidationNamesFieldValueAndRange) {
  CodecOptions o;
  EXPECT_TRUE(ValidateCodecOptions(o, DataType::kInt64).ok());
  o.codec = CodecId::kInt8;
  Status s = ValidateCodecOptions(o, DataType::kInt32);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("int32"), std::string::npos) << s;
  EXPECT_NE(s.message().find("float32, bfloat16 and float16"), std::string::npos) << s;
  for (DataType t : FloatDataTypes()) EXPECT_TRUE(ValidateCodecOptions(o, t).ok());
  o.block_size = 100;
  s = ValidateCodecOptions(o, DataType::kFloat32);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("block_size = 100"), std::string::npos) << s;
  EXPECT_NE(s.message().find("32..65536"), std::string::npos) << s;
  o.block_size = 16;
  EXPECT_FALSE(ValidateCodecOptions(o, DataType::kFloat32).ok());
  o.block_size = 131072;
  EXPECT_FALSE(ValidateCodecOptions(o, DataType::kFloat32).ok());
  o.block_size = 65536;
  EXPECT_TRUE(ValidateCodecOptions(o, DataType::kFloat32).ok());
  o.block_size = 32;
  EXPECT_TRUE(ValidateCodecOptions(o, DataType::kFloat32).ok());
  o.chain_zstd = true;
  o.zstd_level = 20;
  s = ValidateCodecOptions(o, DataType::kFloat32);
  EXPECT_NE(s.message().find("zstd_level = 20"), std::string::npos) << s;
  EXPECT_NE(s.message().find("-5..19"), std::string::npos) << s;
  o = {};
  o.codec = CodecId::kZstd;
  o.zstd_level = -6;
  EXPECT_FALSE(ValidateCodecOptions(o, DataType::kFloat32).ok());
  o.zstd_level = -5;
  EXPECT_TRUE(ValidateCodecOptions(o, DataType::kFloat32).ok());
  o.codec = static_cast<CodecId>(9);
  s = ValidateCodecOptions(o, DataType::kFloat32);
  EXPECT_NE(s.message().find("codec = 9"), std::string::npos) << s;
  o.codec = CodecId::kNone;
  EXPECT_FALSE(ValidateCodecOptions(o, static_cast<DataType>(12)).ok());
}

// ---- lossless ----------------------------------------------------------------------------------

struct LosslessCase {
  CodecId codec;
  bool shuffle;
  int level;
};

// The vector forms leave room behind the frame for a transport's framing (the collective
// appends a 24-byte trailer in place), for every codec, with and without error feedback.
TEST(Encoder, VectorFormsLeaveSpareCapacityBehindTheFrame) {
  Encoder encoder;
  const std::vector<uint8_t> input = MakeInput(DataType::kFloat32, 5000, 7);
  for (CodecId codec : {CodecId::kNone, CodecId::kZstd, CodecId::kInt8, CodecId::kInt4}) {
    CodecOptions o;
    o.codec = codec;
    std::vector<uint8_t> frame;
    ASSERT_TRUE(encoder.Encode(input.data(), 5000, DataType::kFloat32, o, &frame).ok());
    EXPECT_GE(frame.capacity() - frame.size(), kFrameSpareCapacity) << CodecName(codec);
    std::vector<float> residual(5000, 0.0f);
    ASSERT_TRUE(encoder
                    .EncodeWithFeedback(input.data(), 5000, DataType::kFloat32, o,
                                        residual.data(), &frame)
                    .ok());
    EXPECT_GE(frame.capacity() - frame.size(), kFrameSpareCapacity) << CodecName(codec);
  }
}

TEST(LosslessCodec, RoundTripsBitExactEveryDtypeSizeAndAlignment) {
  const LosslessCase cases[] = {
      {CodecId::kNone, false, 1},  {CodecId::kZstd, true, 1},   {CodecId::kZstd, false, 1},
      {CodecId::kZstd, true, -5},  {CodecId::kZstd, false, -5}, {CodecId::kZstd, true, 19},
      {CodecId::kZstd, false, 19},
  };
  Encoder encoder;
  Decoder decoder;
  for (const LosslessCase& c : cases) {
    for (DataType dtype : AllDataTypes()) {
      for (size_t n : kSizes) {
        if (c.level == 19 && n > 1000) continue;  // level 19 is slow; small inputs suffice
        for (size_t offset : {0, 1, 3}) {
          SCOPED_TRACE(std::string(CodecName(c.codec)) + " shuffle=" + std::to_string(c.shuffle) +
                       " level=" + std::to_string(c.level) + " " + DataTypeName(dtype) +
                       " n=" + std::to_string(n) + " offset=" + std::to_string(offset));
          const std::vector<uint8_t> input = MakeInput(dtype, n, n * 31 + offset);
          std::vector<uint8_t> in_storage;
          const std::span<uint8_t> in = Misaligned(input, offset, &in_storage);
          CodecOptions o;
          o.codec = c.codec;
          o.byte_shuffle = c.shuffle;
          o.zstd_level = c.level;
          std::vector<uint8_t> encoded;
          ASSERT_TRUE(encoder.Encode(in.data(), n, dtype, o, &encoded).ok());
          ASSERT_LE(encoded.size(), MaxFrameSize(n, dtype, o));
          std::vector<uint8_t> frame_storage;
          const std::span<uint8_t> frame = Misaligned(encoded, offset, &frame_storage);
          StatusOr<FrameInfo> info = InspectFrame(frame);
          ASSERT_TRUE(info.ok()) << info.status();
          EXPECT_EQ(info->codec, c.codec);
          EXPECT_EQ(info->dtype, dtype);
          EXPECT_EQ(info->element_count, n);
          EXPECT_EQ((info->flags & kFrameFlagShuffled) != 0,
                    c.codec == CodecId::kZstd && c.shuffle && DataTypeSize(dtype) > 1);
          std::vector<uint8_t> out_storage;
          std::vector<uint8_t> zeros(input.size(), 0);
          const std::span<uint8_t> out = Misaligned(zeros, offset, &out_storage);
          Status s = decoder.Decode(frame, out.data(), n, dtype);
          ASSERT_TRUE(s.ok()) << s;
          ASSERT_TRUE(std::equal(out.begin(), out.end(), input.begin()));
        }
      }
    }
  }
}

TEST(LosslessCodec, DecodeAccumulateAddsFloatFrames) {
  Encoder encoder;
  Decoder decoder;
  for (CodecId codec : {CodecId::kNone, CodecId::kZstd}) {
    for (DataType dtype : FloatDataTypes()) {
      for (size_t n : kSizes) {
        const std::vector<uint8_t> input = MakeInput(dtype, n, n + 5);
        CodecOptions o;
        o.codec = codec;
        std::vector<uint8_t> frame;
        ASSERT_TRUE(encoder.Encode(input.data(), n, dtype, o, &frame).ok());
        std::vector<float> acc(n);
        for (size_t i = 0; i < n; ++i) acc[i] = static_cast<float>(i % 13) * 0.25f;
        std::vector<float> expect(n);
        for (size_t i = 0; i < n; ++i) expect[i] = acc[i] + ElementAsFloat(input.data(), dtype, i);
        Status s = decoder.DecodeAccumulate(frame, acc.data(), n);
        ASSERT_TRUE(s.ok()) << s;
        for (size_t i = 0; i < n; ++i) {
          ASSERT_TRUE(testing_util::SameBits(acc[i], expect[i]))
              << CodecName(codec) << " " << DataTypeName(dtype) << " i=" << i;
        }
      }
    }
  }
}

TEST(LosslessCodec, ShuffleHelpsZstdOnFloat32Gradients) {
  const std::vector<uint8_t> input = MakeInput(DataType::kFloat32, 65536, 1);
  Encoder encoder;
  CodecOptions o;
  o.codec = CodecId::kZstd;
  std::vector<uint8_t> shuffled;
  std::vector<uint8_t> plain;
  ASSERT_TRUE(encoder.Encode(input.data(), 65536, DataType::kFloat32, o, &shuffled).ok());
  o.byte_shuffle = false;
  ASSERT_TRUE(encoder.Encode(input.data(), 65536, DataType::kFloat32, o, &plain).ok());
  EXPECT_LT(shuffled.size(), plain.size());
  EXPECT_LT(shuffled.size(), input.size());
}

// Large shuffled stages are compressed plane by plane, noise planes stored as raw zstd blocks:
// the payload must still be one standard zstd stream (several frames) that decodes bit-exact, fits
// MaxFrameSize, and keeps the exponent plane's gain.
TEST(LosslessCodec, PlaneWiseZstdIsStandardAndBitExact) {
  struct Case {
    DataType dtype;
    size_t count;
  };
  // 2-, 4- and 8-byte elements with planes of at least 128 KiB; odd counts leave no remainder
  // bytes (elements are whole), so the last plane's length equals the others.
  for (const Case c : {Case{DataType::kFloat32, 262147}, Case{DataType::kBfloat16, 300001},
                       Case{DataType::kUint64, 140000}, Case{DataType::kFloat64, 131072}}) {
    SCOPED_TRACE(DataTypeName(c.dtype));
    const std::vector<uint8_t> input = MakeInput(c.dtype, c.count, 11);
    CodecOptions o;
    o.codec = CodecId::kZstd;
    std::vector<uint8_t> exact(MaxFrameSize(c.count, c.dtype, o));
    Encoder encoder;
    StatusOr<size_t> size =
        encoder.EncodeInto(input.data(), c.count, c.dtype, o, std::span<uint8_t>(exact));
    ASSERT_TRUE(size.ok()) << size.status();
    EXPECT_LT(*size, input.size()) << "the low-entropy planes should still compress";
    // Several concatenated zstd frames (one per plane), each starting with zstd's magic.
    const uint8_t* payload = exact.data() + kFrameHeaderSize;
    const uint8_t magic[4] = {0x28, 0xB5, 0x2F, 0xFD};
    EXPECT_EQ(std::memcmp(payload, magic, 4), 0);
    size_t frames = 0;
    for (size_t i = 0; i + 4 <= *size - kFrameHeaderSize; ++i) {
      if (std::memcmp(payload + i, magic, 4) == 0) ++frames;
    }
    EXPECT_GE(frames, DataTypeSize(c.dtype));
    std::vector<uint8_t> back(input.size(), 0xAA);
    Decoder decoder;
    ASSERT_TRUE(decoder
                    .Decode(std::span<const uint8_t>(exact.data(), *size), back.data(), c.count,
                            c.dtype)
                    .ok());
    EXPECT_EQ(back, input);
  }
}

TEST(LosslessCodec, IncompressibleDataFitsMaxFrameSize) {
  std::mt19937_64 rng(3);
  for (size_t n : {size_t{1}, size_t{1000}, size_t{300000}}) {
    std::vector<uint64_t> input(n);
    for (auto& v : input) v = rng();
    CodecOptions o;
    o.codec = CodecId::kZstd;
    o.zstd_level = 3;
    std::vector<uint8_t> exact(MaxFrameSize(n, DataType::kUint64, o));
    Encoder encoder;
    StatusOr<size_t> size =
        encoder.EncodeInto(input.data(), n, DataType::kUint64, o, std::span<uint8_t>(exact));
    ASSERT_TRUE(size.ok()) << size.status();
    EXPECT_GT(*size, n * 8);  // random data grows a little
    std::vector<uint64_t> back(n);
    Decoder decoder;
    ASSERT_TRUE(decoder
                    .Decode(std::span<const uint8_t>(exact.data(), *size), back.data(), n,
                            DataType::kUint64)
                    .ok());
    EXPECT_EQ(back, input);
  }
}

TEST(LosslessCodec, ReusedEncoderGivesTheSameBytesAsAFreshOne) {
  Encoder reused;
  const std::vector<uint8_t> a = MakeInput(DataType::kFloat32, 5000, 1);
  const std::vector<uint8_t> b = MakeInput(DataType::kBfloat16, 7000, 2);
  for (int level : {19, -5, 1, 3}) {
    for (int round = 0; round < 2; ++round) {
      const std::vector<uint8_t>& input = round == 0 ? a : b;
      const DataType dtype = round == 0 ? DataType::kFloat32 : DataType::kBfloat16;
      const size_t n = input.size() / DataTypeSize(dtype);
      CodecOptions o;
      o.codec = CodecId::kZstd;
      o.zstd_level = level;
      std::vector<uint8_t> x;
      std::vector<uint8_t> y;
      ASSERT_TRUE(reused.Encode(input.data(), n, dtype, o, &x).ok());
      Encoder fresh;
      ASSERT_TRUE(fresh.Encode(input.data(), n, dtype, o, &y).ok());
      EXPECT_EQ(x, y) << "level " << level;
    }
  }
}

TEST(LosslessCodec, DecodeRejectsAnotherDtype) {
  const std::vector<uint8_t> input = MakeInput(DataType::kInt32, 10, 1);
  Encoder encoder;
  std::vector<uint8_t> frame;
  ASSERT_TRUE(encoder.Encode(input.data(), 10, DataType::kInt32, CodecOptions{}, &frame).ok());
  Decoder decoder;
  std::vector<float> out(10);
  Status s = decoder.Decode(frame, out.data(), 10, DataType::kFloat32);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(HasPrefix(s, "dtype mismatch: ")) << s;
  s = decoder.DecodeAccumulate(frame, out.data(), 10);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("int32"), std::string::npos) << s;
}

// ---- lossy -------------------------------------------------------------------------------------

// The largest error a correct encoder may make on element value c, given its block's scale.
double ErrorBound(CodecId codec, float scale, float c) {
  const double s = std::fabs(static_cast<double>(scale));
  const double slack = 1e-5 * std::fabs(static_cast<double>(c)) + 1e-30;
  if (codec == CodecId::kFp8E4M3) {
    // e4m3 keeps 3 mantissa bits: half a step is 2^-4 of the value, or 2^-10 (in units of the
    // scale) among the subnormals.
    const double v = std::fabs(static_cast<double>(c)) / (s > 0 ? s : 1);
    return s * std::max(v * 0x1p-4, 0x1p-10) + slack;
  }
  return 0.5 * s + slack;
}

void CheckLossyRoundTrip(CodecId codec, bool chain, DataType dtype, size_t n, size_t offset,
                         uint32_t block_size, Encoder* encoder, Decoder* decoder) {
  SCOPED_TRACE(std::string(CodecName(codec)) + " chain=" + std::to_string(chain) + " " +
               DataTypeName(dtype) + " n=" + std::to_string(n) +
               " offset=" + std::to_string(offset) + " block=" + std::to_string(block_size));
  const std::vector<uint8_t> input = MakeInput(dtype, n, n * 3 + offset);
  std::vector<uint8_t> in_storage;
  const std::span<uint8_t> in = Misaligned(input, offset, &in_storage);
  CodecOptions o;
  o.codec = codec;
  o.chain_zstd = chain;
  o.block_size = block_size;
  std::vector<uint8_t> frame;
  Status s = encoder->Encode(in.data(), n, dtype, o, &frame);
  ASSERT_TRUE(s.ok()) << s;
  ASSERT_LE(frame.size(), MaxFrameSize(n, dtype, o));
  StatusOr<FrameInfo> info = InspectFrame(frame);
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->block_size, block_size);
  EXPECT_EQ((info->flags & kFrameFlagZstd) != 0, chain);
  EXPECT_EQ(info->stage_size,
            codec_internal::LossyStageSize(testing_util::KindOf(codec), n, block_size));

  std::vector<float> decoded(n + 1);
  s = decoder->Decode(frame, decoded.data(), n, DataType::kFloat32);
  ASSERT_TRUE(s.ok()) << s;

  // Read the scales from an unchained twin of the frame (the stage is the same either way).
  std::vector<uint8_t> plain = frame;
  if (chain) {
    CodecOptions po = o;
    po.chain_zstd = false;
    ASSERT_TRUE(encoder->Encode(in.data(), n, dtype, po, &plain).ok());
    std::vector<float> plain_decoded(n + 1);
    ASSERT_TRUE(decoder->Decode(plain, plain_decoded.data(), n, DataType::kFloat32).ok());
    ASSERT_EQ(std::memcmp(plain_decoded.data(), decoded.data(), n * sizeof(float)), 0);
  }
  const std::vector<float> scales = testing_util::FrameScales(plain, n, block_size);
  for (size_t i = 0; i < n; ++i) {
    const float c = ElementAsFloat(input.data(), dtype, i);
    const double err = std::fabs(static_cast<double>(decoded[i]) - c);
    ASSERT_LE(err, ErrorBound(codec, scales[i / block_size], c))
        << "i=" << i << " c=" << c << " decoded=" << decoded[i];
  }

  // Other outputs: an unaligned fp32 buffer and the narrow types give the same values.
  std::vector<uint8_t> zeros(n * 4 + 1);
  std::vector<uint8_t> out_storage;
  const std::span<uint8_t> unaligned = Misaligned(zeros, 1, &out_storage);
  ASSERT_TRUE(decoder->Decode(frame, unaligned.data(), n, DataType::kFloat32).ok());
  ASSERT_EQ(std::memcmp(unaligned.data(), decoded.data(), n * sizeof(float)), 0);
  for (DataType narrow : {DataType::kBfloat16, DataType::kFloat16}) {
    std::vector<uint16_t> out(n);
    ASSERT_TRUE(decoder->Decode(frame, out.data(), n, narrow).ok());
    for (size_t i = 0; i < n; ++i) {
      const uint16_t want = narrow == DataType::kBfloat16 ? numeric::FloatToBf16(decoded[i])
                                                          : numeric::FloatToHalf(decoded[i]);
      ASSERT_EQ(out[i], want) << DataTypeName(narrow) << " i=" << i;
    }
  }
  std::vector<float> acc(n);
  for (size_t i = 0; i < n; ++i) acc[i] = static_cast<float>(i % 7) - 3.0f;
  ASSERT_TRUE(decoder->DecodeAccumulate(frame, acc.data(), n).ok());
  for (size_t i = 0; i < n; ++i) {
    const float want = (static_cast<float>(i % 7) - 3.0f) + decoded[i];
    ASSERT_TRUE(testing_util::SameBits(acc[i], want)) << "acc i=" << i;
  }
}

TEST(LossyCodec, RoundTripsWithinBoundEveryDtypeSizeAndAlignment) {
  Encoder encoder;
  Decoder decoder;
  for (CodecId codec : {CodecId::kInt8, CodecId::kInt4, CodecId::kFp8E4M3}) {
    for (bool chain : {false, true}) {
      for (DataType dtype : FloatDataTypes()) {
        for (size_t n : kSizes) {
          for (size_t offset : {0, 1}) {
            CheckLossyRoundTrip(codec, chain, dtype, n, offset, 256, &encoder, &decoder);
            if (::testing::Test::HasFatalFailure()) return;
          }
        }
      }
    }
  }
}

TEST(LossyCodec, OtherBlockSizes) {
  Encoder encoder;
  Decoder decoder;
  for (CodecId codec : {CodecId::kInt8, CodecId::kInt4, CodecId::kFp8E4M3}) {
    for (uint32_t block : {32u, 64u, 4096u, 65536u}) {
      for (size_t n : {size_t{block - 1}, size_t{block + 1}, size_t{3 * block + 5}}) {
        CheckLossyRoundTrip(codec, false, DataType::kFloat32, n, 0, block, &encoder, &decoder);
        if (::testing::Test::HasFatalFailure()) return;
      }
    }
  }
  // A chunked bfloat16 decode whose chunks span many blocks, and a block larger than a chunk.
  CheckLossyRoundTrip(CodecId::kInt4, true, DataType::kBfloat16, 70001, 0, 32, &encoder, &decoder);
  CheckLossyRoundTrip(CodecId::kInt8, false, DataType::kFloat16, 140001, 1, 65536, &encoder,
                      &decoder);
}

TEST(LossyCodec, StochasticRoundingIsReproducibleAndFlagged) {
  const std::vector<uint8_t> input = MakeInput(DataType::kFloat32, 10000, 9);
  CodecOptions o;
  o.codec = CodecId::kInt4;
  o.rounding = Rounding::kStochastic;
  o.seed = 1234;
  Encoder e1;
  Encoder e2;
  std::vector<uint8_t> a;
  std::vector<uint8_t> b;
  ASSERT_TRUE(e1.Encode(input.data(), 10000, DataType::kFloat32, o, &a).ok());
  ASSERT_TRUE(e2.Encode(input.data(), 10000, DataType::kFloat32, o, &b).ok());
  EXPECT_EQ(a, b);
  StatusOr<FrameInfo> info = InspectFrame(a);
  ASSERT_TRUE(info.ok());
  EXPECT_TRUE(info->flags & kFrameFlagStochastic);
  o.seed = 1235;
  ASSERT_TRUE(e2.Encode(input.data(), 10000, DataType::kFloat32, o, &b).ok());
  EXPECT_NE(a, b);
}

TEST(LossyCodec, EncodeIntoAndEncodeAgree) {
  const std::vector<uint8_t> input = MakeInput(DataType::kBfloat16, 3000, 4);
  for (bool chain : {false, true}) {
    CodecOptions o;
    o.codec = CodecId::kFp8E4M3;
    o.chain_zstd = chain;
    Encoder encoder;
    std::vector<uint8_t> a;
    ASSERT_TRUE(encoder.Encode(input.data(), 3000, DataType::kBfloat16, o, &a).ok());
    std::vector<uint8_t> buffer(MaxFrameSize(3000, DataType::kBfloat16, o) + 5, 0xEE);
    StatusOr<size_t> size =
        encoder.EncodeInto(input.data(), 3000, DataType::kBfloat16, o,
                           std::span<uint8_t>(buffer.data() + 1, buffer.size() - 1));
    ASSERT_TRUE(size.ok()) << size.status();
    ASSERT_EQ(*size, a.size());
    EXPECT_EQ(std::memcmp(buffer.data() + 1, a.data(), a.size()), 0);
  }
}

TEST(LossyCodec, DecodeRejectsIntegerOutput) {
  const std::vector<uint8_t> input = MakeInput(DataType::kFloat32, 10, 1);
  CodecOptions o;
  o.codec = CodecId::kInt8;
  Encoder encoder;
  std::vector<uint8_t> frame;
  ASSERT_TRUE(encoder.Encode(input.data(), 10, DataType::kFloat32, o, &frame).ok());
  Decoder decoder;
  std::vector<int32_t> out(10);
  Status s = decoder.Decode(frame, out.data(), 10, DataType::kInt32);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(HasPrefix(s, "dtype mismatch: ")) << s;
}

// ---- argument errors ---------------------------------------------------------------------------

TEST(Encoder, RejectsBadArguments) {
  Encoder encoder;
  std::vector<uint8_t> out;
  CodecOptions o;
  Status s = encoder.Encode(nullptr, 3, DataType::kFloat32, o, &out);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("null"), std::string::npos) << s;
  EXPECT_TRUE(out.empty());
  EXPECT_TRUE(encoder.Encode(nullptr, 0, DataType::kFloat32, o, &out).ok());
  EXPECT_EQ(out.size(), kFrameHeaderSize);
  const float x[4] = {1, 2, 3, 4};
  s = encoder.Encode(x, kMaxFrameElements + 1, DataType::kFloat32, o, &out);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  o.codec = CodecId::kInt8;
  s = encoder.Encode(x, 4, DataType::kUint8, o, &out);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  std::vector<uint8_t> small(MaxFrameSize(4, DataType::kFloat32, o) - 1);
  StatusOr<size_t> r = encoder.EncodeInto(x, 4, DataType::kFloat32, o, small);
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("MaxFrameSize"), std::string::npos) << r.status();
  s = encoder.EncodeWithFeedback(x, 4, DataType::kFloat32, o, nullptr, &out);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
}

TEST(Encoder, MovedFromEncoderAndDecoderStillWork) {
  const float x[4] = {1, 2, 3, 4};
  Encoder a;
  Encoder b(std::move(a));
  std::vector<uint8_t> frame;
  CodecOptions o;
  o.codec = CodecId::kZstd;
  ASSERT_TRUE(b.Encode(x, 4, DataType::kFloat32, o, &frame).ok());
  ASSERT_TRUE(
      a.Encode(x, 4, DataType::kFloat32, o, &frame).ok());  // NOLINT(bugprone-use-after-move)
  Decoder d1;
  Decoder d2 = std::move(d1);
  float y[4] = {};
  ASSERT_TRUE(d2.Decode(frame, y, 4, DataType::kFloat32).ok());
  ASSERT_TRUE(d1.Decode(frame, y, 4, DataType::kFloat32).ok());  // NOLINT(bugprone-use-after-move)
  EXPECT_EQ(std::memcmp(x, y, sizeof(x)), 0);
}

TEST(Decoder, RejectsBadArguments) {
  const float x[4] = {1, 2, 3, 4};
  Encoder encoder;
  std::vector<uint8_t> frame;
  ASSERT_TRUE(encoder.Encode(x, 4, DataType::kFloat32, CodecOptions{}, &frame).ok());
  Decoder decoder;
  Status s = decoder.Decode(frame, nullptr, 4, DataType::kFloat32);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  s = decoder.DecodeAccumulate(frame, nullptr, 4);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  float y[5] = {};
  s = decoder.Decode(frame, y, 5, DataType::kFloat32);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "count mismatch: the frame holds 4 elements, the caller's buffer 5");
  s = decoder.Decode(frame, y, 4, static_cast<DataType>(99));
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
}

TEST(Codec, HeaderOnlyFramesForEveryCodec) {
  Encoder encoder;
  Decoder decoder;
  for (int c = 0; c < kNumCodecs; ++c) {
    for (bool chain : {false, true}) {
      CodecOptions o;
      o.codec = static_cast<CodecId>(c);
      o.chain_zstd = chain;
      std::vector<uint8_t> frame;
      ASSERT_TRUE(encoder.Encode(nullptr, 0, DataType::kFloat16, o, &frame).ok());
      StatusOr<FrameInfo> info = InspectFrame(frame);
      ASSERT_TRUE(info.ok()) << info.status();
      EXPECT_EQ(info->element_count, 0u);
      EXPECT_TRUE(decoder.Decode(frame, nullptr, 0, DataType::kFloat16).ok());
      EXPECT_TRUE(decoder.DecodeAccumulate(frame, nullptr, 0).ok());
    }
  }
}

}  // namespace
}  // namespace strait

// Damaged frames: every truncation, every header bit flip, sampled payload bit flips, wrong
// versions and magic, trailing bytes, oversized counts, forged zstd payloads, mismatched
// expectations -- each must give its documented code and message prefix from InspectFrame,
// Decode and DecodeAccumulate alike, never crash, and leave the accumulator untouched. Also
// replays the checked-in corpus under tests/fuzz/corpus/frame.
#include <gtest/gtest.h>
#include <zstd.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "codec/crc32c.h"
#include "codec/frame.h"
#include "codec_test_util.h"
#include "strait/codec.h"

namespace strait {
namespace {

struct Sample {
  std::string name;
  std::vector<uint8_t> frame;
  size_t count;
  DataType dtype;
};

Sample MakeSample(const std::string& name, CodecId codec, DataType dtype, size_t count,
                  bool chain = false) {
  CodecOptions o;
  o.codec = codec;
  o.chain_zstd = chain;
  const std::vector<uint8_t> input = testing_util::MakeInput(dtype, count, count + 1);
  Encoder encoder;
  Sample s{name, {}, count, dtype};
  const Status st = encoder.Encode(input.data(), count, dtype, o, &s.frame);
  EXPECT_TRUE(st.ok()) << name << ": " << st;
  return s;
}

std::vector<Sample> Samples() {
  return {
      MakeSample("none_f32", CodecId::kNone, DataType::kFloat32, 100),
      MakeSample("none_empty", CodecId::kNone, DataType::kFloat32, 0),
      MakeSample("zstd_f32_shuffled", CodecId::kZstd, DataType::kFloat32, 1000),
      MakeSample("zstd_bf16", CodecId::kZstd, DataType::kBfloat16, 300),
      MakeSample("zstd_empty", CodecId::kZstd, DataType::kFloat16, 0),
      MakeSample("int8_f32", CodecId::kInt8, DataType::kFloat32, 600),
      MakeSample("int4_bf16_chained", CodecId::kInt4, DataType::kBfloat16, 513, true),
      MakeSample("int4_odd", CodecId::kInt4, DataType::kFloat32, 33),
      MakeSample("fp8_f16", CodecId::kFp8E4M3, DataType::kFloat16, 257),
      MakeSample("fp8_chained_empty", CodecId::kFp8E4M3, DataType::kFloat32, 0, true),
  };
}

bool StartsWith(const std::string& s, const std::string& prefix) {
  return s.rfind(prefix, 0) == 0;
}

// Runs InspectFrame, Decode (to the sample's dtype) and DecodeAccumulate on `bytes`, expecting
// every one to fail with `code` and `prefix`, and the accumulator to be left as it was. Where
// only decoding can find the fault (`header_ok`: a wrong caller count, a forged zstd payload),
// InspectFrame must accept the frame instead.
void ExpectAllFail(const Sample& s, std::span<const uint8_t> bytes, StatusCode code,
                   const std::string& prefix, const DecodeExpectations& expect = {},
                   size_t count_override = SIZE_MAX, bool header_ok = false) {
  const size_t count = count_override == SIZE_MAX ? s.count : count_override;
  StatusOr<FrameInfo> info = InspectFrame(bytes, expect);
  if (header_ok) {
    ASSERT_TRUE(info.ok()) << info.status();
  } else {
    ASSERT_FALSE(info.ok());
    ASSERT_EQ(info.status().code(), code) << info.status();
    ASSERT_TRUE(StartsWith(info.status().message(), prefix)) << info.status();
  }
  Decoder decoder;
  std::vector<uint8_t> out(count * DataTypeSize(s.dtype) + 1);
  Status st = decoder.Decode(bytes, out.data(), count, s.dtype, expect);
  ASSERT_EQ(st.code(), code) << st;
  ASSERT_TRUE(StartsWith(st.message(), prefix)) << st;
  std::vector<float> acc(count + 1);
  for (size_t i = 0; i < acc.size(); ++i) acc[i] = static_cast<float>(i) * 0.5f - 7.0f;
  const std::vector<float> before = acc;
  st = decoder.DecodeAccumulate(bytes, acc.data(), count, expect);
  ASSERT_EQ(st.code(), code) << st;
  ASSERT_TRUE(StartsWith(st.message(), prefix)) << st;
  ASSERT_EQ(std::memcmp(acc.data(), before.data(), acc.size() * sizeof(float)), 0)
      << "DecodeAccumulate wrote into acc on a bad frame";
}

void Resign(std::vector<uint8_t>* frame) {
  const uint32_t crc = Crc32c(frame->data(), codec_internal::kOffHeaderCrc);
  std::memcpy(frame->data() + codec_internal::kOffHeaderCrc, &crc, 4);
}

TEST(CorruptFrame, SamplesAreValid) {
  for (const Sample& s : Samples()) {
    StatusOr<FrameInfo> info = InspectFrame(s.frame);
    ASSERT_TRUE(info.ok()) << s.name << ": " << info.status();
    Decoder decoder;
    std::vector<uint8_t> out(s.count * DataTypeSize(s.dtype) + 1);
    EXPECT_TRUE(decoder.Decode(s.frame, out.data(), s.count, s.dtype).ok()) << s.name;
  }
}

TEST(CorruptFrame, EveryTruncationIsReportedAsTruncated) {
  for (const Sample& s : Samples()) {
    SCOPED_TRACE(s.name);
    const size_t size = s.frame.size();
    for (size_t len = 0; len < size; ++len) {
      // Every length through the header and the first 256 payload bytes, then a dense sample.
      if (len > kFrameHeaderSize + 256 && len % 13 != 0 && len + 16 < size) continue;
      // A copy of exactly `len` bytes, so that ASan sees any read past the end.
      const std::vector<uint8_t> cut(s.frame.begin(), s.frame.begin() + len);
      ExpectAllFail(s, cut, StatusCode::kDataLoss, "truncated frame: ");
      if (::testing::Test::HasFatalFailure()) return;
    }
  }
}

TEST(CorruptFrame, EveryHeaderBitFlipIsCaught) {
  for (const Sample& s : Samples()) {
    SCOPED_TRACE(s.name);
    for (size_t bit = 0; bit < kFrameHeaderSize * 8; ++bit) {
      std::vector<uint8_t> bad = s.frame;
      bad[bit / 8] ^= static_cast<uint8_t>(1u << (bit % 8));
      SCOPED_TRACE("bit " + std::to_string(bit));
      if (bit < 32) {
        ExpectAllFail(s, bad, StatusCode::kDataLoss, "not a Strait frame");
      } else if (bit < 48) {
        ExpectAllFail(s, bad, StatusCode::kUnimplemented, "unsupported frame version");
      } else {
        ExpectAllFail(s, bad, StatusCode::kDataLoss, "corrupted frame header");
      }
      if (::testing::Test::HasFatalFailure()) return;
    }
  }
}

TEST(CorruptFrame, PayloadBitFlipsAreCaught) {
  std::mt19937 rng(17);
  for (const Sample& s : Samples()) {
    SCOPED_TRACE(s.name);
    const size_t payload_bits = (s.frame.size() - kFrameHeaderSize) * 8;
    if (payload_bits == 0) continue;
    std::vector<size_t> bits = {0, payload_bits - 1};
    for (int i = 0; i < 64; ++i) bits.push_back(rng() % payload_bits);
    for (size_t bit : bits) {
      std::vector<uint8_t> bad = s.frame;
      bad[kFrameHeaderSize + bit / 8] ^= static_cast<uint8_t>(1u << (bit % 8));
      SCOPED_TRACE("payload bit " + std::to_string(bit));
      ExpectAllFail(s, bad, StatusCode::kDataLoss, "corrupted frame payload");
      if (::testing::Test::HasFatalFailure()) return;
    }
  }
}

TEST(CorruptFrame, WrongVersionsAreUnsupported) {
  for (const Sample& s : Samples()) {
    for (uint16_t version : {0, 2, 3, 0x100, 0xffff}) {
      std::vector<uint8_t> bad = s.frame;
      std::memcpy(bad.data() + 4, &version, 2);
      Resign(&bad);  // as a newer build would have written it
      ExpectAllFail(s, bad, StatusCode::kUnimplemented, "unsupported frame version");
      // A version-2 header might be shorter than ours: still unsupported, not truncated.
      const std::vector<uint8_t> shorter(bad.begin(), bad.begin() + 8);
      ExpectAllFail(s, shorter, StatusCode::kUnimplemented, "unsupported frame version");
    }
  }
}

TEST(CorruptFrame, WrongMagicIsNotAStraitFrame) {
  const Sample s = Samples()[0];
  const uint8_t zstd_magic[4] = {0x28, 0xb5, 0x2f, 0xfd};
  for (const uint8_t* magic :
       {reinterpret_cast<const uint8_t*>("STRG"), reinterpret_cast<const uint8_t*>("FRTS"),
        reinterpret_cast<const uint8_t*>("\0\0\0\0"), zstd_magic}) {
    std::vector<uint8_t> bad = s.frame;
    std::memcpy(bad.data(), magic, 4);
    Resign(&bad);
    ExpectAllFail(s, bad, StatusCode::kDataLoss, "not a Strait frame");
  }
  const std::vector<uint8_t> text = {'h', 'e', 'l', 'l', 'o', ' ', 'w', 'o', 'r', 'l', 'd'};
  ExpectAllFail(s, text, StatusCode::kDataLoss, "not a Strait frame");
}

TEST(CorruptFrame, TrailingBytesAndHugeCountsAreOversized) {
  for (const Sample& s : Samples()) {
    SCOPED_TRACE(s.name);
    for (size_t extra : {1, 7, 100}) {
      std::vector<uint8_t> bad = s.frame;
      bad.resize(bad.size() + extra, 0);
      ExpectAllFail(s, bad, StatusCode::kResourceExhausted, "oversized frame: ");
    }
    for (uint64_t count : {kMaxFrameElements + 1, uint64_t{1} << 62, ~uint64_t{0}}) {
      std::vector<uint8_t> bad = s.frame;
      std::memcpy(bad.data() + codec_internal::kOffCount, &count, 8);
      Resign(&bad);
      ExpectAllFail(s, bad, StatusCode::kResourceExhausted, "oversized frame: ");
    }
  }
}

TEST(CorruptFrame, ExpectationMismatchesAreCodecMismatches) {
  for (const Sample& s : Samples()) {
    SCOPED_TRACE(s.name);
    StatusOr<FrameInfo> info = InspectFrame(s.frame);
    ASSERT_TRUE(info.ok());
    DecodeExpectations e;
    e.codec = static_cast<CodecId>((static_cast<int>(info->codec) + 1) % kNumCodecs);
    ExpectAllFail(s, s.frame, StatusCode::kInvalidArgument, "codec mismatch: ", e);
    e = {};
    e.dtype = info->dtype == DataType::kFloat32 ? DataType::kFloat16 : DataType::kFloat32;
    ExpectAllFail(s, s.frame, StatusCode::kInvalidArgument, "codec mismatch: ", e);
    e = {};
    e.element_count = s.count + 1;
    ExpectAllFail(s, s.frame, StatusCode::kInvalidArgument, "codec mismatch: ", e);
  }
}

TEST(CorruptFrame, CountMismatchNamesBothNumbers) {
  for (const Sample& s : Samples()) {
    SCOPED_TRACE(s.name);
    ExpectAllFail(s, s.frame, StatusCode::kInvalidArgument, "count mismatch: ", {}, s.count + 1,
                  true);
    if (s.count > 0) {
      ExpectAllFail(s, s.frame, StatusCode::kInvalidArgument, "count mismatch: ", {}, s.count - 1,
                    true);
    }
  }
}

// A zstd frame whose checksums are right but whose payload lies about its size: the crc only
// guards against accidents, so the decoder must still check what zstd produces.
std::vector<uint8_t> ForgeZstdFrame(std::span<const uint8_t> stage, uint64_t claimed_count,
                                    std::span<const uint8_t> payload_override = {}) {
  std::vector<uint8_t> payload(ZSTD_compressBound(stage.size()));
  payload.resize(ZSTD_compress(payload.data(), payload.size(), stage.data(), stage.size(), 1));
  if (!payload_override.empty()) payload.assign(payload_override.begin(), payload_override.end());
  FrameInfo info;
  info.codec = CodecId::kZstd;
  info.dtype = DataType::kFloat32;
  info.flags = kFrameFlagZstd;
  info.element_count = claimed_count;
  info.stage_size = claimed_count * 4;
  info.payload_size = payload.size();
  std::vector<uint8_t> frame(kFrameHeaderSize + payload.size());
  std::memcpy(frame.data() + kFrameHeaderSize, payload.data(), payload.size());
  codec_internal::WriteFrameHeader(info, Crc32c(payload.data(), payload.size()), frame.data());
  return frame;
}

TEST(CorruptFrame, ForgedZstdPayloadsAreCorrupted) {
  std::vector<uint8_t> stage(400, 1);
  Sample s{"forged", {}, 100, DataType::kFloat32};
  // Decompresses to fewer bytes than claimed, to more, and not at all.
  ExpectAllFail(s, ForgeZstdFrame(std::span<const uint8_t>(stage).first(396), 100),
                StatusCode::kDataLoss, "corrupted frame payload", {}, 100, true);
  ExpectAllFail(s, ForgeZstdFrame(stage, 99), StatusCode::kDataLoss, "corrupted frame payload", {},
                99, true);
  const std::vector<uint8_t> garbage = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12};
  ExpectAllFail(s, ForgeZstdFrame(stage, 100, garbage), StatusCode::kDataLoss,
                "corrupted frame payload", {}, 100, true);
  // The unforged frame decodes, so the failures above are the forgeries'.
  const std::vector<uint8_t> good = ForgeZstdFrame(stage, 100);
  std::vector<float> out(100);
  Decoder decoder;
  EXPECT_TRUE(decoder.Decode(good, out.data(), 100, DataType::kFloat32).ok());
  EXPECT_EQ(std::memcmp(out.data(), stage.data(), 400), 0);
}

// ---- corpus ------------------------------------------------------------------------------------

std::filesystem::path CorpusDir() {
  // ctest sets STRAIT_TEST_DATA (to tests/codec, the directory of the strait_test() call, or to
  // tests/); a binary run by hand falls back to this source file's own location.
  std::vector<std::filesystem::path> candidates;
  if (const char* root = std::getenv("STRAIT_TEST_DATA"); root != nullptr) {
    candidates.push_back(std::filesystem::path(root) / "fuzz/corpus/frame");
    candidates.push_back(std::filesystem::path(root) / "../fuzz/corpus/frame");
  }
  candidates.push_back(std::filesystem::path(__FILE__).parent_path() / "../fuzz/corpus/frame");
  for (const auto& candidate : candidates) {
    if (std::filesystem::is_directory(candidate)) return candidate;
  }
  return candidates.front();
}

// Corpus files are named <expected status>__<what>, e.g. data_loss__truncated_header.
const std::map<std::string, StatusCode>& CodeByPrefix() {
  static const auto* m = new std::map<std::string, StatusCode>{
      {"ok", StatusCode::kOk},
      {"data_loss", StatusCode::kDataLoss},
      {"resource_exhausted", StatusCode::kResourceExhausted},
      {"unimplemented", StatusCode::kUnimplemented},
      {"invalid_argument", StatusCode::kInvalidArgument},
  };
  return *m;
}

TEST(CorruptFrame, CheckedInCorpusGivesTheNamedStatus) {
  const std::filesystem::path dir = CorpusDir();
  ASSERT_TRUE(std::filesystem::is_directory(dir))
      << dir << " is missing; set STRAIT_TEST_DATA to the tests/ source directory";
  size_t named = 0;
  size_t ok_frames = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    if (!entry.is_regular_file()) continue;
    const std::string name = entry.path().filename().string();
    std::ifstream in(entry.path(), std::ios::binary);
    const std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(in)),
                                     std::istreambuf_iterator<char>());
    SCOPED_TRACE(name);
    const StatusOr<FrameInfo> info = InspectFrame(bytes);
    const size_t sep = name.find("__");
    if (sep == std::string::npos) continue;  // e.g. an input a fuzzer found: must just not crash
    const auto it = CodeByPrefix().find(name.substr(0, sep));
    ASSERT_NE(it, CodeByPrefix().end()) << "unknown expectation prefix";
    ++named;
    const uint64_t count = info.ok() ? info->element_count : 16;
    Decoder decoder;
    std::vector<float> acc(count + 1, 3.0f);
    const Status accumulated = decoder.DecodeAccumulate(bytes, acc.data(), count);
    if (it->second == StatusCode::kOk) {
      ++ok_frames;
      ASSERT_TRUE(info.ok()) << info.status();
      std::vector<uint8_t> out(count * DataTypeSize(info->dtype));
      EXPECT_TRUE(decoder.Decode(bytes, out.data(), count, info->dtype).ok());
      if (info->dtype == DataType::kFloat32 || info->dtype == DataType::kBfloat16 ||
          info->dtype == DataType::kFloat16) {
        EXPECT_TRUE(accumulated.ok()) << accumulated;
      }
    } else {
      const Status st = info.ok() ? accumulated : info.status();
      EXPECT_EQ(st.code(), it->second) << st;
      if (!accumulated.ok()) {
        EXPECT_TRUE(std::all_of(acc.begin(), acc.end(), [](float v) { return v == 3.0f; }));
      }
    }
  }
  EXPECT_GE(named, 20u) << "the corpus in " << dir << " looks incomplete";
  EXPECT_GE(ok_frames, 5u);
}

}  // namespace
}  // namespace strait

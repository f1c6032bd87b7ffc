// Writes the seed corpus of tests/fuzz/corpus/frame: valid frames of every codec and damaged
// ones of every kind InspectFrame and the decoder distinguish. Not run by ctest; see README.md.
//
// Each file is named <expected status>__<what>.frame; corrupt_frame_test checks that status, and
// the fuzz targets start from these inputs. Everything is deterministic, so rerunning the program
// rewrites the same bytes.
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "codec/crc32c.h"
#include "codec/frame.h"
#include "codec/kernels.h"
#include "codec/numeric.h"
#include "strait/codec.h"

namespace {

using strait::CodecId;
using strait::CodecOptions;
using strait::DataType;
using strait::kFrameHeaderSize;
namespace ci = strait::codec_internal;

std::filesystem::path g_dir;
int g_written = 0;

void Write(const std::string& name, const std::vector<uint8_t>& bytes) {
  const std::filesystem::path path = g_dir / (name + ".frame");
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(bytes.data()),
            static_cast<std::streamsize>(bytes.size()));
  if (!out) {
    std::fprintf(stderr, "cannot write %s\n", path.c_str());
    std::exit(1);
  }
  ++g_written;
}

std::vector<uint8_t> Input(DataType dtype, size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1e-3f);
  std::vector<uint8_t> bytes(n * strait::DataTypeSize(dtype));
  for (size_t i = 0; i < n; ++i) {
    const float v = normal(rng);
    if (dtype == DataType::kFloat32) {
      std::memcpy(&bytes[4 * i], &v, 4);
    } else if (dtype == DataType::kBfloat16 || dtype == DataType::kFloat16) {
      const uint16_t h = dtype == DataType::kBfloat16 ? strait::numeric::FloatToBf16(v)
                                                      : strait::numeric::FloatToHalf(v);
      std::memcpy(&bytes[2 * i], &h, 2);
    }
  }
  if (dtype != DataType::kFloat32 && dtype != DataType::kBfloat16 && dtype != DataType::kFloat16) {
    for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<uint8_t>(rng() % 7);
  }
  return bytes;
}

std::vector<uint8_t> Encode(CodecId codec, DataType dtype, size_t n, bool chain = false,
                            bool shuffle = true, strait::Rounding rounding = {},
                            uint32_t block = strait::kDefaultBlockSize) {
  CodecOptions o;
  o.codec = codec;
  o.chain_zstd = chain;
  o.byte_shuffle = shuffle;
  o.rounding = rounding;
  o.block_size = block;
  o.seed = 42;
  const std::vector<uint8_t> input = Input(dtype, n, static_cast<uint32_t>(n) + 3);
  strait::Encoder encoder;
  std::vector<uint8_t> frame;
  const strait::Status s = encoder.Encode(input.data(), n, dtype, o, &frame);
  if (!s.ok()) {
    std::fprintf(stderr, "encode failed: %s\n", s.ToString().c_str());
    std::exit(1);
  }
  return frame;
}

template <typename T>
void Put(std::vector<uint8_t>* f, size_t offset, T value) {
  std::memcpy(f->data() + offset, &value, sizeof(T));
}

// Recomputes both checksums, as a well-behaved but wrong (or newer) writer would.
std::vector<uint8_t> Resign(std::vector<uint8_t> f) {
  const uint32_t payload_crc =
      strait::Crc32c(f.data() + kFrameHeaderSize, f.size() - kFrameHeaderSize);
  Put<uint32_t>(&f, ci::kOffPayloadCrc, payload_crc);
  Put<uint32_t>(&f, ci::kOffHeaderCrc, strait::Crc32c(f.data(), ci::kOffHeaderCrc));
  return f;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s <output directory>\n", argv[0]);
    return 2;
  }
  g_dir = argv[1];
  std::filesystem::create_directories(g_dir);

  // ---- valid frames ----
  const std::vector<uint8_t> none_f32 = Encode(CodecId::kNone, DataType::kFloat32, 300);
  const std::vector<uint8_t> zstd_f32 = Encode(CodecId::kZstd, DataType::kFloat32, 1000);
  const std::vector<uint8_t> int8_f32 = Encode(CodecId::kInt8, DataType::kFloat32, 600);
  Write("ok__none_f32", none_f32);
  Write("ok__none_empty", Encode(CodecId::kNone, DataType::kFloat32, 0));
  Write("ok__none_u8", Encode(CodecId::kNone, DataType::kUint8, 33));
  Write("ok__zstd_f32_shuffled", zstd_f32);
  Write("ok__zstd_bf16_plain", Encode(CodecId::kZstd, DataType::kBfloat16, 700, false, false));
  Write("ok__zstd_i64_shuffled", Encode(CodecId::kZstd, DataType::kInt64, 200));
  Write("ok__zstd_e5m2", Encode(CodecId::kZstd, DataType::kFloat8E5M2, 150));
  Write("ok__zstd_empty", Encode(CodecId::kZstd, DataType::kFloat16, 0));
  Write("ok__int8_f32", int8_f32);
  Write("ok__int8_f32_stochastic", Encode(CodecId::kInt8, DataType::kFloat32, 257, false, true,
                                          strait::Rounding::kStochastic));
  Write("ok__int8_empty_chained", Encode(CodecId::kInt8, DataType::kFloat32, 0, true));
  Write("ok__int4_bf16_chained", Encode(CodecId::kInt4, DataType::kBfloat16, 513, true));
  Write("ok__int4_f16_odd_block32", Encode(CodecId::kInt4, DataType::kFloat16, 99, false, true,
                                           strait::Rounding::kNearest, 32));
  Write("ok__fp8_f32", Encode(CodecId::kFp8E4M3, DataType::kFloat32, 300));
  Write("ok__fp8_f16_chained", Encode(CodecId::kFp8E4M3, DataType::kFloat16, 1000, true));

  // ---- truncated and unreadable ----
  Write("data_loss__empty", {});
  Write("data_loss__truncated_3_bytes", {none_f32.begin(), none_f32.begin() + 3});
  Write("data_loss__truncated_in_header", {int8_f32.begin(), int8_f32.begin() + 30});
  Write("data_loss__truncated_after_header", {int8_f32.begin(), int8_f32.begin() + 48});
  Write("data_loss__truncated_payload", {zstd_f32.begin(), zstd_f32.end() - 1});
  std::vector<uint8_t> f = none_f32;
  std::memcpy(f.data(), "STRG", 4);
  Write("data_loss__bad_magic", Resign(f));
  const std::string text = "GET / HTTP/1.1\r\nHost: example\r\n\r\n";
  Write("data_loss__http_request", {text.begin(), text.end()});
  f = int8_f32;
  f[20] ^= 0x10;
  Write("data_loss__header_bit_flip", f);
  f = zstd_f32;
  f[kFrameHeaderSize + 5] ^= 0x01;
  Write("data_loss__payload_bit_flip", f);
  // zstd payloads with valid checksums that decompress to the wrong size, or not at all.
  f = Encode(CodecId::kZstd, DataType::kFloat32, 100, false, false);
  Put<uint64_t>(&f, ci::kOffCount, 99);
  Put<uint64_t>(&f, ci::kOffStageSize, 396);
  Write("data_loss__zstd_longer_than_stage", Resign(f));
  Put<uint64_t>(&f, ci::kOffCount, 101);
  Put<uint64_t>(&f, ci::kOffStageSize, 404);
  Write("data_loss__zstd_shorter_than_stage", Resign(f));
  for (size_t i = kFrameHeaderSize; i < f.size(); ++i) f[i] = static_cast<uint8_t>(i * 37);
  Write("data_loss__zstd_garbage", Resign(f));
  f = Encode(CodecId::kInt4, DataType::kFloat32, 400, true);
  Put<uint64_t>(&f, ci::kOffCount, 300);
  Put<uint64_t>(&f, ci::kOffStageSize, ci::LossyStageSize(ci::LossyKind::kInt4, 300, 256));
  Write("data_loss__chained_int4_wrong_stage", Resign(f));

  // ---- versions ----
  f = int8_f32;
  Put<uint16_t>(&f, ci::kOffVersion, 2);
  Write("unimplemented__version_2", Resign(f));
  Write("unimplemented__version_2_short_header", {f.begin(), f.begin() + 16});
  Put<uint16_t>(&f, ci::kOffVersion, 0);
  Write("unimplemented__version_0", Resign(f));

  // ---- sizes ----
  f = none_f32;
  f.insert(f.end(), {0, 0, 0, 0});
  Write("resource_exhausted__trailing_bytes", f);
  f = none_f32;
  Put<uint64_t>(&f, ci::kOffCount, (uint64_t{1} << 40) + 1);
  Write("resource_exhausted__count_above_limit", Resign(f));
  Put<uint64_t>(&f, ci::kOffCount, ~uint64_t{0});
  Put<uint64_t>(&f, ci::kOffStageSize, ~uint64_t{0});
  Put<uint64_t>(&f, ci::kOffPayloadSize, ~uint64_t{0});
  Write("resource_exhausted__all_sizes_max", Resign(f));

  // ---- fields ----
  auto field = [](std::vector<uint8_t> base, size_t offset, auto value) {
    Put(&base, offset, value);
    return Resign(base);
  };
  Write("invalid_argument__unknown_codec", field(int8_f32, ci::kOffCodec, uint8_t{5}));
  Write("invalid_argument__unknown_dtype", field(none_f32, ci::kOffDtype, uint8_t{200}));
  Write("invalid_argument__lossy_int32", field(int8_f32, ci::kOffDtype, uint8_t{2}));
  Write("invalid_argument__block_not_power_of_two",
        field(int8_f32, ci::kOffBlockSize, uint32_t{300}));
  Write("invalid_argument__block_zero_on_lossy", field(int8_f32, ci::kOffBlockSize, uint32_t{0}));
  Write("invalid_argument__block_on_none", field(none_f32, ci::kOffBlockSize, uint32_t{256}));
  Write("invalid_argument__unknown_flag", field(none_f32, ci::kOffFlags, uint16_t{0x80}));
  Write("invalid_argument__zstd_flag_missing", field(zstd_f32, ci::kOffFlags, uint16_t{1}));
  Write("invalid_argument__shuffle_on_none", field(none_f32, ci::kOffFlags, uint16_t{1}));
  Write("invalid_argument__header_size_64", field(none_f32, ci::kOffHeaderSize, uint16_t{64}));
  Write("invalid_argument__stage_size_wrong", field(none_f32, ci::kOffStageSize, uint64_t{1196}));
  f = none_f32;
  f.resize(f.size() - 4);
  Put<uint64_t>(&f, ci::kOffPayloadSize, f.size() - kFrameHeaderSize);
  Write("invalid_argument__payload_not_stage", Resign(f));
  f = Encode(CodecId::kZstd, DataType::kUint8, 100);
  Write("invalid_argument__shuffle_on_bytes", field(f, ci::kOffFlags, uint16_t{3}));

  std::printf("wrote %d frames to %s\n", g_written, g_dir.c_str());
  return 0;
}

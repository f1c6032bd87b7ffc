// `strait-bench codec`'s command line: the flags and their checks, the parsing of codec row
// specs (also used by `strait-bench link`), and what runs. Apart from the measurement
// (codec_bench.cc) because it is about the user's input rather than about codecs.
#include <CLI/CLI.hpp>
#include <charconv>
#include <iostream>
#include <memory>
#include <string>
#include <string_view>

#include "bench/bench_common.h"
#include "bench/codec_bench.h"
#include "common/units.h"
#include "tools/cli/cli.h"

namespace strait::bench {
namespace {

constexpr const char* kRowForms =
    "none, zstd[+noshuffle], int8|int4|fp8[+zstd][+ef], decode-acc[+none|zstd|int8|int4|fp8], "
    "reduce";
constexpr uint64_t kMinSizeBytes = 64;
// About a dozen buffers of up to twice this size are live at once (fp32 copies of 16-bit data).
constexpr uint64_t kMaxSizeBytes = uint64_t{512} << 20;

CLI::Validator BlockSizeValidator() {
  return CLI::Validator(
      [](std::string& text) -> std::string {
        uint64_t v = 0;
        const char* end = text.data() + text.size();
        auto [ptr, ec] = std::from_chars(text.data(), end, v);
        if (ec != std::errc() || ptr != end || v < kMinBlockSize || v > kMaxBlockSize ||
            (v & (v - 1)) != 0) {
          return "expected a power of two from " + std::to_string(kMinBlockSize) + " to " +
                 std::to_string(kMaxBlockSize) + ", got '" + text + "'";
        }
        return std::string();
      },
      "");
}

CLI::Validator RoundingValidator() {
  return CLI::Validator(
      [](std::string& text) -> std::string {
        if (text == "nearest" || text == "stochastic") return std::string();
        return "expected nearest or stochastic, got '" + text + "'";
      },
      "");
}

}  // namespace

StatusOr<CodecRowSpec> ParseCodecRowSpec(std::string_view text) {
  auto bad = [&](std::string why) {
    return InvalidArgumentError("'" + std::string(text) + "': " + why + "; accepted: " + kRowForms);
  };
  std::vector<std::string> parts;
  for (size_t pos = 0; pos <= text.size();) {
    size_t plus = text.find('+', pos);
    if (plus == std::string_view::npos) plus = text.size();
    parts.emplace_back(text.substr(pos, plus - pos));
    pos = plus + 1;
  }
  CodecRowSpec spec;
  if (parts[0] == "reduce") {
    if (parts.size() > 1) return bad("reduce takes no modifiers");
    spec.kind = CodecRowSpec::Kind::kReduce;
    spec.name = "reduce";
    return spec;
  }
  if (parts[0] == "decode-acc") {
    spec.kind = CodecRowSpec::Kind::kDecodeAccumulate;
    if (parts.size() > 2) return bad("decode-acc takes at most one codec");
    spec.codec.codec = CodecId::kInt8;
    if (parts.size() == 2) {
      std::optional<CodecId> codec = ParseCodecId(parts[1]);
      if (!codec) return bad("unknown codec '" + parts[1] + "'");
      spec.codec.codec = *codec;
    }
    spec.name = spec.codec.codec == CodecId::kInt8
                    ? "decode-acc"
                    : std::string("decode-acc+") + CodecName(spec.codec.codec);
    return spec;
  }
  std::optional<CodecId> codec = ParseCodecId(parts[0]);
  if (!codec) return bad("unknown codec '" + parts[0] + "'");
  spec.codec.codec = *codec;
  const bool lossy = IsLossyCodec(*codec);
  bool noshuffle = false;
  for (size_t i = 1; i < parts.size(); ++i) {
    const std::string& m = parts[i];
    if (m == "noshuffle" && *codec == CodecId::kZstd) {
      noshuffle = true;
    } else if (m == "zstd" && lossy) {
      spec.codec.chain_zstd = true;
    } else if (m == "ef" && lossy) {
      spec.feedback = true;
    } else {
      return bad("modifier '" + m + "' does not apply to " + parts[0]);
    }
  }
  spec.codec.byte_shuffle = *codec == CodecId::kZstd && !noshuffle;
  spec.name = std::string(CodecName(*codec)) + (noshuffle ? "+noshuffle" : "") +
              (spec.codec.chain_zstd ? "+zstd" : "") + (spec.feedback ? "+ef" : "");
  return spec;
}

CommandMain SetupCodecCommand(CLI::App& cmd) {
  struct Flags {
    uint64_t size = uint64_t{64} << 20;
    std::string codecs = kDefaultCodecRows;
    std::string dtypes = "fp32,bf16,fp16";
    int iters = 5;
    int zstd_level = 1;
    uint32_t block = kDefaultBlockSize;
    std::string rounding = "nearest";
    uint64_t seed = 1;
  };
  auto flags = std::make_shared<Flags>();
  cmd.add_option("--size", flags->size, "Bytes of input tensor per row (e.g. 16MiB, 1M, 4096)")
      ->transform(SizeValidator(kMinSizeBytes, kMaxSizeBytes))
      ->type_name("SIZE")
      ->default_str("64MiB");
  cmd.add_option("--codecs", flags->codecs, std::string("Comma-separated rows: ") + kRowForms)
      ->type_name("LIST")
      ->default_str(kDefaultCodecRows);
  cmd.add_option("--dtypes", flags->dtypes, "Comma-separated input types: fp32, bf16, fp16")
      ->type_name("LIST")
      ->default_str("fp32,bf16,fp16");
  cmd.add_option("--iters", flags->iters, "Timed iterations per figure, after one warm-up")
      ->check(IntValidator(1, 1000))
      ->type_name("N")
      ->default_str("5");
  cmd.add_option("--zstd-level", flags->zstd_level, "zstd level for zstd rows and +zstd chains")
      ->check(IntValidator(kMinZstdLevel, kMaxZstdLevel))
      ->type_name("LEVEL")
      ->default_str("1");
  cmd.add_option("--block", flags->block, "Elements per scale for the lossy codecs")
      ->check(BlockSizeValidator())
      ->type_name("N")
      ->default_str(std::to_string(kDefaultBlockSize));
  cmd.add_option("--rounding", flags->rounding, "Lossy rounding: nearest or stochastic")
      ->check(RoundingValidator())
      ->type_name("MODE")
      ->default_str("nearest");
  cmd.add_option("--seed", flags->seed, "Seed of the data and of stochastic rounding")
      ->check(UintValidator(0, UINT64_MAX))
      ->type_name("S")
      ->default_str("1");

  return [flags](const GlobalFlags& globals) -> int {
    CodecBenchOptions o;
    o.size_bytes = flags->size;
    o.iters = flags->iters;
    o.zstd_level = flags->zstd_level;
    o.block_size = flags->block;
    o.rounding = flags->rounding == "stochastic" ? Rounding::kStochastic : Rounding::kNearest;
    o.seed = flags->seed;
    for (const std::string& item : SplitList(flags->codecs)) {
      StatusOr<CodecRowSpec> spec = ParseCodecRowSpec(item);
      if (!spec.ok()) return UsageError("codec", "--codecs", spec.status().message());
      const bool seen = std::any_of(o.rows.begin(), o.rows.end(),
                                    [&](const CodecRowSpec& s) { return s.name == spec->name; });
      if (!seen) o.rows.push_back(*std::move(spec));
    }
    if (o.rows.empty())
      return UsageError("codec", "--codecs", std::string("empty; accepted: ") + kRowForms);
    for (const std::string& item : SplitList(flags->dtypes)) {
      std::optional<DataType> t = ParseDataType(item);
      if (!t || !IsLossyCodableType(*t)) {
        return UsageError("codec", "--dtypes",
                          "expected a list of fp32, bf16, fp16, got '" + item + "'");
      }
      if (std::find(o.dtypes.begin(), o.dtypes.end(), *t) == o.dtypes.end()) {
        o.dtypes.push_back(*t);
      }
    }
    if (o.dtypes.empty()) {
      return UsageError("codec", "--dtypes", "empty; expected a list of fp32, bf16, fp16");
    }
    // Option combinations the codec refuses are flag errors too, reported before any work.
    for (const CodecRowSpec& spec : o.rows) {
      if (spec.kind == CodecRowSpec::Kind::kReduce) continue;
      CodecOptions co = spec.codec;
      co.zstd_level = o.zstd_level;
      co.block_size = o.block_size;
      co.rounding = o.rounding;
      co.seed = o.seed;
      for (DataType t : o.dtypes) {
        if (Status s = ValidateCodecOptions(co, t); !s.ok()) {
          return UsageError("codec", "--codecs " + spec.name + " with " + DataTypeName(t),
                            s.message());
        }
      }
    }

    ProgressLine progress;
    StatusOr<CodecBenchReport> report = RunCodecBench(o, &progress);
    progress.Clear();
    if (!report.ok()) {
      std::cerr << "strait-bench codec: FAILED: " << report.status().ToString() << '\n';
      return kExitFailure;
    }
    std::cout << (globals.json ? FormatCodecReportJson(*report) : FormatCodecReportTable(*report));
    std::cout.flush();
    return kExitOk;
  };
}

}  // namespace strait::bench

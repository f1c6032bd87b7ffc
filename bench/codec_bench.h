// `strait-bench codec`: single-thread speed, compression ratio and error of every codec on
// gradient-like data, with memcpy on the same buffer as the bound and the codec goals beside
// the figures.
//
// Rows are named by specs: a codec (none, zstd, int8, int4, fp8) with modifiers joined by '+':
//   zstd+noshuffle   zstd without the byte-plane shuffle
//   int8+zstd        a lossy payload chained with zstd
//   int8+ef          encoded with error feedback (EncodeWithFeedback and a residual buffer)
// plus two rows that are not codecs:
//   decode-acc[+codec]  Decoder::DecodeAccumulate of a frame (int8 by default) into fp32
//   reduce              ReduceInPlace sum of two tensors of the row's dtype
// Every speed is input-tensor bytes per second. Every decode is checked (element count; lossless
// rows bit-exact; lossy rows finite); a wrong result stops the run with exit code 1.
#ifndef STRAIT_BENCH_CODEC_BENCH_H_
#define STRAIT_BENCH_CODEC_BENCH_H_

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "bench/bench_common.h"
#include "strait/codec.h"
#include "strait/status.h"
#include "strait/types.h"
#include "tools/cli/cli_fwd.h"

namespace strait::bench {

// The rows `strait-bench codec` runs when --codecs is not given.
inline constexpr const char* kDefaultCodecRows =
    "none,zstd,zstd+noshuffle,int8,int8+ef,int8+zstd,int4,fp8,decode-acc,reduce";

struct CodecRowSpec {
  enum class Kind { kCodec, kDecodeAccumulate, kReduce };
  Kind kind = Kind::kCodec;
  std::string name;    // canonical spec, e.g. "int8+zstd+ef"
  CodecOptions codec;  // kCodec and kDecodeAccumulate: the codec, shuffle and chain fields
  bool feedback = false;
};

// Parses one row spec; the error lists the accepted forms.
StatusOr<CodecRowSpec> ParseCodecRowSpec(std::string_view text);

struct CodecBenchOptions {
  uint64_t size_bytes = uint64_t{64} << 20;  // bytes of input tensor per row
  std::vector<CodecRowSpec> rows;
  std::vector<DataType> dtypes;
  int iters = 5;  // timed iterations after one warm-up; the best is reported
  int zstd_level = 1;
  uint32_t block_size = kDefaultBlockSize;
  Rounding rounding = Rounding::kNearest;
  uint64_t seed = 1;  // the data, and the stochastic rounding stream
};

// Bytes per second over the timed iterations.
struct Speed {
  double best = 0;
  double median = 0;
};

struct CodecBenchRow {
  std::string name;
  DataType dtype = DataType::kFloat32;
  size_t elements = 0;
  size_t input_bytes = 0;
  std::optional<size_t> frame_bytes;  // codec rows
  std::optional<Speed> encode;        // codec rows
  std::optional<Speed> decode;        // codec rows: Decode; decode-acc; reduce: the operation
  bool lossless = false;              // checked bit-exact
  // Against the fp32 source (so bf16/fp16 rows include the conversion to that type).
  std::optional<double> max_abs_error;
  std::optional<double> mean_abs_error;
  std::optional<double> max_error_vs_absmax;
};

struct CodecGoal {
  std::string row;  // the row and dtype the goal is judged on
  DataType dtype = DataType::kFloat32;
  std::string name;      // "int8+ef encode"
  std::string target;    // ">= 0.40 x memcpy"
  std::string measured;  // "5.12 GB/s = 0.61 x memcpy", or "not measured: ..."
  std::optional<bool> pass;
};

struct CodecBenchReport {
  CodecBenchOptions options;
  std::string cpu;
  std::string isa;
  std::string date;
  // memcpy of size_bytes, sampled before each dtype and at the end: the best of memcpy_runs.
  Speed memcpy_speed;
  int memcpy_runs = 0;
  // Thread CPU time / wall-clock time over the timed iterations; well below 1 means other
  // processes took the CPU and the figures understate.
  double on_cpu = 1;
  std::vector<CodecBenchRow> rows;
  std::vector<CodecGoal> goals;
};

// Runs every row x dtype. Fails (kDataLoss / kInternal / the codec's error) when a codec returns
// an error or a wrong result. `progress` may be null.
StatusOr<CodecBenchReport> RunCodecBench(const CodecBenchOptions& options, ProgressLine* progress);

std::string FormatCodecReportTable(const CodecBenchReport& report);
std::string FormatCodecReportJson(const CodecBenchReport& report);

// Registers `strait-bench codec`'s flags on `cmd`.
CommandMain SetupCodecCommand(CLI::App& cmd);

}  // namespace strait::bench

#endif  // STRAIT_BENCH_CODEC_BENCH_H_

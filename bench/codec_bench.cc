// `strait-bench codec`: measures every codec row on gradient-like data against memcpy, checks
// that every decode is right, and prints a table or JSON. See codec_bench.h for the rows.
#include "bench/codec_bench.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>

#include "bench/gradient.h"
#include "common/clock.h"
#include "common/units.h"
#include "strait/reduce.h"
#include "tools/cli/cli.h"

namespace strait::bench {
namespace {

constexpr const char* kRowForms =
    "none, zstd[+noshuffle], int8|int4|fp8[+zstd][+ef], decode-acc[+none|zstd|int8|int4|fp8], "
    "reduce";
constexpr uint64_t kMinSizeBytes = 64;
// About a dozen buffers of up to twice this size are live at once (fp32 copies of 16-bit data).
constexpr uint64_t kMaxSizeBytes = uint64_t{512} << 20;
// The memcpy baseline is cheap, and every ratio divides by it, so it gets more tries than a row.
constexpr int kMinMemcpyIters = 10;
// Below this share of wall-clock time on the CPU the report warns that the machine was busy.
constexpr double kBusyOnCpu = 0.9;

// Goals from the codec issue, judged on float32 rows at the default settings.
constexpr double kEfEncodeGoal = 0.4;        // x memcpy
constexpr double kDecodeAccGoal = 0.4;       // x memcpy
constexpr double kZstdShuffledGoal = 800e6;  // bytes per second, level 1

// Keeps the compiler from treating a buffer's contents as dead (a memcpy whose destination is
// never read could otherwise be dropped).
inline void Clobber(const void* p) {
  asm volatile("" : : "r"(p) : "memory");
}

std::string Sci(double v) {
  if (v == 0) return "0";
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.2e", v);
  return buf;
}

std::string GBps(double bytes_per_second) {
  return Fixed(bytes_per_second / 1e9, 2);
}

// Wall and thread CPU time spent in timed iterations: when they differ, other processes took
// the CPU and every figure understates the codec.
struct TimeShare {
  double wall = 0;
  double cpu = 0;
};

double ThreadCpuSeconds() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

// Runs `fn` once to warm caches, branch predictors and lazily allocated contexts, then `iters`
// timed times (wall clock).
template <typename Fn>
StatusOr<Speed> Measure(int iters, size_t bytes, TimeShare* share, Fn&& fn) {
  STRAIT_RETURN_IF_ERROR(fn());
  std::vector<double> seconds;
  seconds.reserve(static_cast<size_t>(iters));
  for (int i = 0; i < iters; ++i) {
    const double cpu0 = ThreadCpuSeconds();
    Stopwatch watch;
    STRAIT_RETURN_IF_ERROR(fn());
    const double wall = watch.ElapsedSeconds();
    share->cpu += ThreadCpuSeconds() - cpu0;
    share->wall += wall;
    seconds.push_back(std::max(wall, 1e-9));
  }
  std::sort(seconds.begin(), seconds.end());
  const size_t n = seconds.size();
  const double median = n % 2 == 1 ? seconds[n / 2] : (seconds[n / 2 - 1] + seconds[n / 2]) / 2;
  const auto b = static_cast<double>(bytes);
  return Speed{b / seconds.front(), b / median};
}

struct ErrorStats {
  double max_abs = 0;
  double mean_abs = 0;
  double max_vs_absmax = 0;
  std::optional<size_t> first_non_finite;
};

ErrorStats CompareToSource(const float* source, const float* got, size_t count, float absmax) {
  ErrorStats s;
  double sum = 0;
  for (size_t i = 0; i < count; ++i) {
    if (!std::isfinite(got[i])) {
      s.first_non_finite = i;
      return s;
    }
    const double e = std::fabs(static_cast<double>(got[i]) - static_cast<double>(source[i]));
    sum += e;
    s.max_abs = std::max(s.max_abs, e);
  }
  s.mean_abs = count == 0 ? 0 : sum / static_cast<double>(count);
  s.max_vs_absmax = absmax > 0 ? s.max_abs / static_cast<double>(absmax) : 0;
  return s;
}

// Index of the first element whose bytes differ, if any.
std::optional<size_t> FirstDifference(const uint8_t* a, const uint8_t* b, size_t count,
                                      size_t element_size) {
  if (std::memcmp(a, b, count * element_size) == 0) return std::nullopt;
  for (size_t i = 0; i < count; ++i) {
    if (std::memcmp(a + i * element_size, b + i * element_size, element_size) != 0) return i;
  }
  return std::nullopt;
}

std::string RowLabel(const CodecRowSpec& spec, DataType dtype) {
  return "row '" + spec.name + "' (" + DataTypeName(dtype) + ")";
}

// Runs the rows of one dtype; owns the buffers they share.
class DtypeRunner {
 public:
  DtypeRunner(const CodecBenchOptions& options, DataType dtype, TimeShare* share)
      : options_(options),
        share_(share),
        dtype_(dtype),
        element_size_(DataTypeSize(dtype)),
        count_(options.size_bytes / element_size_),
        bytes_(count_ * element_size_),
        source_(MakeGradient(count_, options.seed)),
        input_(bytes_),
        output_(bytes_),
        output_f32_(count_ * sizeof(float)),
        aux_f32_(count_ * sizeof(float)) {
    for (float v : source_) absmax_ = std::max(absmax_, std::fabs(v));
  }

  Status Init() { return ConvertGradient(source_, dtype_, input_.data()); }

  StatusOr<CodecBenchRow> Run(const CodecRowSpec& spec, ProgressLine* progress,
                              const std::string& prefix) {
    progress_ = progress;
    prefix_ = prefix;
    CodecBenchRow row;
    row.name = spec.name;
    row.dtype = dtype_;
    row.elements = count_;
    row.input_bytes = bytes_;
    Status s;
    switch (spec.kind) {
      case CodecRowSpec::Kind::kCodec: s = RunCodec(spec, &row); break;
      case CodecRowSpec::Kind::kDecodeAccumulate: s = RunDecodeAccumulate(spec, &row); break;
      case CodecRowSpec::Kind::kReduce: s = RunReduce(&row); break;
    }
    if (!s.ok()) return s.WithContext(RowLabel(spec, dtype_));
    return row;
  }

 private:
  void Say(std::string_view what) {
    if (progress_ != nullptr) progress_->Update(prefix_ + std::string(what));
  }

  CodecOptions OptionsFor(const CodecRowSpec& spec) const {
    CodecOptions o = spec.codec;
    o.zstd_level = options_.zstd_level;
    o.block_size = options_.block_size;
    o.rounding = options_.rounding;
    o.seed = options_.seed;
    return o;
  }

  DecodeExpectations Expect(CodecId codec) const {
    DecodeExpectations e;
    e.codec = codec;
    e.dtype = dtype_;
    e.element_count = count_;
    return e;
  }

  // A frame must describe what was encoded, whatever the codec did inside.
  Status CheckFrame(std::span<const uint8_t> frame, CodecId codec) const {
    StatusOr<FrameInfo> info = InspectFrame(frame, Expect(codec));
    if (!info.ok()) return info.status().WithContext("the encoder's own frame is invalid");
    if (info->element_count != count_ || info->codec != codec || info->dtype != dtype_ ||
        info->frame_size() != frame.size()) {
      return DataLossError("frame header says " + std::to_string(info->element_count) + " " +
                           DataTypeName(info->dtype) + " elements of codec " +
                           CodecName(info->codec) + " in " + std::to_string(info->frame_size()) +
                           " bytes; encoded " + std::to_string(count_) + " elements, got " +
                           std::to_string(frame.size()) + " bytes");
    }
    return Status::Ok();
  }

  // Decodes `frame` into output_ (its dtype), checks it and fills output_f32_ with the values.
  Status DecodeAndCheck(std::span<const uint8_t> frame, CodecId codec, bool lossless,
                        ErrorStats* stats) {
    // A sentinel that is NaN in every float format, so that an element the decoder skipped
    // shows up below instead of passing with stale data.
    std::memset(output_.data(), 0xFF, bytes_);
    STRAIT_RETURN_IF_ERROR(Decoder()
                               .Decode(frame, output_.data(), count_, dtype_, Expect(codec))
                               .WithContext("decode"));
    if (lossless) {
      if (auto i = FirstDifference(input_.data(), output_.data(), count_, element_size_)) {
        return DataLossError("lossless decode is not bit-exact: element " + std::to_string(*i) +
                             " of " + std::to_string(count_) + " differs from the input");
      }
    }
    STRAIT_RETURN_IF_ERROR(ConvertToFloat(output_.data(), dtype_, output_f32_.as<float>(), count_));
    *stats = CompareToSource(source_.data(), output_f32_.as<float>(), count_, absmax_);
    if (stats->first_non_finite) {
      return DataLossError("decoded element " + std::to_string(*stats->first_non_finite) +
                           " is not finite (the decoder did not write it, or the codec is "
                           "broken); the input has no NaN or infinity");
    }
    return Status::Ok();
  }

  static void SetErrors(const ErrorStats& s, CodecBenchRow* row) {
    row->max_abs_error = s.max_abs;
    row->mean_abs_error = s.mean_abs;
    row->max_error_vs_absmax = s.max_vs_absmax;
  }

  Status RunCodec(const CodecRowSpec& spec, CodecBenchRow* row) {
    const CodecOptions opts = OptionsFor(spec);
    row->lossless = !IsLossyCodec(opts.codec);
    AlignedBuffer frame(MaxFrameSize(count_, dtype_, opts));
    AlignedBuffer residual(spec.feedback ? count_ * sizeof(float) : 0);
    Encoder encoder;
    Decoder decoder;
    size_t frame_size = 0;
    auto encode = [&]() -> Status {
      const std::span<uint8_t> out(frame.data(), frame.size());
      StatusOr<size_t> n = spec.feedback
                               ? encoder.EncodeWithFeedbackInto(input_.data(), count_, dtype_, opts,
                                                                residual.as<float>(), out)
                               : encoder.EncodeInto(input_.data(), count_, dtype_, opts, out);
      if (!n.ok()) return n.status().WithContext("encode");
      frame_size = *n;
      return Status::Ok();
    };

    // The first encode (from a zero residual) is the one whose result is checked.
    Say("checking");
    STRAIT_RETURN_IF_ERROR(encode());
    const size_t first_size = frame_size;
    STRAIT_RETURN_IF_ERROR(CheckFrame({frame.data(), frame_size}, opts.codec));
    ErrorStats stats;
    STRAIT_RETURN_IF_ERROR(
        DecodeAndCheck({frame.data(), frame_size}, opts.codec, row->lossless, &stats));
    SetErrors(stats, row);
    row->frame_bytes = first_size;
    const std::vector<uint8_t> first_frame(frame.data(), frame.data() + first_size);

    Say("encode");
    STRAIT_ASSIGN_OR_RETURN(row->encode, Measure(options_.iters, bytes_, share_, encode));
    // Reused contexts must not leak state between calls: without feedback, the same input gives
    // the same bytes every time; with it, the later frames must still decode.
    if (!spec.feedback && (frame_size != first_size ||
                           std::memcmp(frame.data(), first_frame.data(), first_size) != 0)) {
      return DataLossError("encoding the same input again gave a different frame (" +
                           std::to_string(frame_size) + " bytes, first " +
                           std::to_string(first_size) + ")");
    }
    if (spec.feedback) {
      ErrorStats later;
      STRAIT_RETURN_IF_ERROR(
          DecodeAndCheck({frame.data(), frame_size}, opts.codec, false, &later)
              .WithContext("after " + std::to_string(options_.iters + 2) + " feedback steps"));
    }
    // Error feedback changes the input of every step, and with it (under zstd) the frame size;
    // the decode timing uses the last frame, which is as valid as the first.
    Say("decode");
    const DecodeExpectations expect = Expect(opts.codec);
    STRAIT_ASSIGN_OR_RETURN(
        row->decode, Measure(options_.iters, bytes_, share_, [&]() -> Status {
          return decoder.Decode({frame.data(), frame_size}, output_.data(), count_, dtype_, expect);
        }));
    return Status::Ok();
  }

  Status RunDecodeAccumulate(const CodecRowSpec& spec, CodecBenchRow* row) {
    const CodecOptions opts = OptionsFor(spec);
    AlignedBuffer frame(MaxFrameSize(count_, dtype_, opts));
    Encoder encoder;
    Decoder decoder;
    Say("checking");
    StatusOr<size_t> n =
        encoder.EncodeInto(input_.data(), count_, dtype_, opts, {frame.data(), frame.size()});
    if (!n.ok()) return n.status().WithContext("encode");
    const std::span<const uint8_t> f(frame.data(), *n);
    STRAIT_RETURN_IF_ERROR(CheckFrame(f, opts.codec));
    ErrorStats decode_stats;
    STRAIT_RETURN_IF_ERROR(DecodeAndCheck(f, opts.codec, !IsLossyCodec(opts.codec), &decode_stats));

    // From zero, one accumulation must give exactly what Decode gave. A lossy frame decodes to
    // fp32 directly (decoding to its own 16-bit dtype would round where the accumulator does not).
    if (IsLossyCodec(opts.codec)) {
      STRAIT_RETURN_IF_ERROR(
          decoder.Decode(f, output_f32_.data(), count_, DataType::kFloat32, Expect(opts.codec))
              .WithContext("decode to float32"));
    }
    float* acc = aux_f32_.as<float>();
    std::fill(acc, acc + count_, 0.0f);
    const DecodeExpectations expect = Expect(opts.codec);
    STRAIT_RETURN_IF_ERROR(
        decoder.DecodeAccumulate(f, acc, count_, expect).WithContext("decode-accumulate"));
    const float* decoded = output_f32_.as<float>();
    for (size_t i = 0; i < count_; ++i) {
      if (!(acc[i] == decoded[i])) {
        return DataLossError("decode-accumulate into zeros gave " + std::to_string(acc[i]) +
                             " at element " + std::to_string(i) + " where decode gave " +
                             std::to_string(decoded[i]));
      }
    }
    SetErrors(CompareToSource(source_.data(), acc, count_, absmax_), row);
    row->frame_bytes = *n;

    Say("decode-accumulate");
    STRAIT_ASSIGN_OR_RETURN(row->decode, Measure(options_.iters, bytes_, share_, [&]() -> Status {
                              Status s = decoder.DecodeAccumulate(f, acc, count_, expect);
                              Clobber(acc);
                              return s;
                            }));
    return Status::Ok();
  }

  Status RunReduce(CodecBenchRow* row) {
    // inout = a second gradient; the expected sum is computed here in fp32 and rounded back to
    // the dtype, which reduce.h promises to match exactly.
    Say("checking");
    const std::vector<float> other = MakeGradient(count_, options_.seed + 1);
    uint8_t* inout = output_.data();
    STRAIT_RETURN_IF_ERROR(ConvertGradient(other, dtype_, inout));
    float* a = output_f32_.as<float>();
    float* b = aux_f32_.as<float>();
    STRAIT_RETURN_IF_ERROR(ConvertToFloat(input_.data(), dtype_, a, count_));
    STRAIT_RETURN_IF_ERROR(ConvertToFloat(inout, dtype_, b, count_));
    for (size_t i = 0; i < count_; ++i) a[i] = a[i] + b[i];
    AlignedBuffer expected(bytes_);
    STRAIT_RETURN_IF_ERROR(ConvertGradient({a, count_}, dtype_, expected.data()));

    STRAIT_RETURN_IF_ERROR(
        ReduceInPlace(dtype_, ReduceOp::kSum, input_.data(), inout, count_).WithContext("reduce"));
    if (auto i = FirstDifference(expected.data(), inout, count_, element_size_)) {
      return DataLossError("ReduceInPlace sum differs from the fp32 reference at element " +
                           std::to_string(*i) + " of " + std::to_string(count_));
    }
    row->lossless = true;

    Say("reduce");
    STRAIT_ASSIGN_OR_RETURN(row->decode, Measure(options_.iters, bytes_, share_, [&]() -> Status {
                              Status s = ReduceInPlace(dtype_, ReduceOp::kSum, input_.data(), inout,
                                                       count_);
                              Clobber(inout);
                              return s;
                            }));
    return Status::Ok();
  }

  const CodecBenchOptions& options_;
  TimeShare* share_;
  DataType dtype_;
  size_t element_size_;
  size_t count_;
  size_t bytes_;
  std::vector<float> source_;
  float absmax_ = 0;
  AlignedBuffer input_;
  AlignedBuffer output_;
  AlignedBuffer output_f32_;
  AlignedBuffer aux_f32_;
  ProgressLine* progress_ = nullptr;
  std::string prefix_;
};

// memcpy of the row size, timed before every dtype's rows and once more at the end; the best of
// all is the bound, so that one unlucky moment does not inflate every ratio in the report.
class MemcpyBaseline {
 public:
  MemcpyBaseline(uint64_t bytes, int iters, uint64_t seed, TimeShare* share)
      : bytes_(bytes), iters_(iters), share_(share), src_(bytes), dst_(bytes) {
    FillGradient(seed, {src_.as<float>(), bytes / sizeof(float)});
  }

  void Sample() {
    StatusOr<Speed> speed = Measure(iters_, bytes_, share_, [&]() -> Status {
      std::memcpy(dst_.data(), src_.data(), bytes_);
      Clobber(dst_.data());
      return Status::Ok();
    });
    if (!speed.ok()) return;  // memcpy cannot fail
    best_ = std::max(best_, speed->best);
    medians_.push_back(speed->median);
    ++samples_;
  }

  Speed Result() const {
    std::vector<double> m = medians_;
    std::sort(m.begin(), m.end());
    return Speed{best_, m.empty() ? 0 : m[m.size() / 2]};
  }
  int runs() const { return samples_ * iters_; }

 private:
  uint64_t bytes_;
  int iters_;
  TimeShare* share_;
  AlignedBuffer src_;
  AlignedBuffer dst_;
  double best_ = 0;
  std::vector<double> medians_;
  int samples_ = 0;
};

const CodecBenchRow* FindRow(const CodecBenchReport& r, std::string_view name, DataType dtype) {
  for (const CodecBenchRow& row : r.rows) {
    if (row.name == name && row.dtype == dtype) return &row;
  }
  return nullptr;
}

void AddGoals(CodecBenchReport* r) {
  const double memcpy_bps = r->memcpy_speed.best;
  auto vs_memcpy = [&](std::string row_name, std::string name, const std::optional<Speed>& speed,
                       double goal) {
    CodecGoal g;
    g.row = std::move(row_name);
    g.name = std::move(name);
    g.target = ">= " + Fixed(goal, 2) + " x memcpy";
    if (speed && memcpy_bps > 0) {
      const double ratio = speed->best / memcpy_bps;
      g.measured = GBps(speed->best) + " GB/s = " + Fixed(ratio, 2) + " x memcpy";
      g.pass = ratio >= goal;
    }
    return g;
  };
  const DataType f32 = DataType::kFloat32;
  const CodecBenchRow* ef = FindRow(*r, "int8+ef", f32);
  CodecGoal g1 =
      vs_memcpy("int8+ef", "int8+ef encode", ef ? ef->encode : std::nullopt, kEfEncodeGoal);
  const CodecBenchRow* acc = FindRow(*r, "decode-acc", f32);
  CodecGoal g2 = vs_memcpy("decode-acc", "int8 decode-accumulate", acc ? acc->decode : std::nullopt,
                           kDecodeAccGoal);
  CodecGoal g3;
  g3.row = "zstd";
  g3.name = "zstd -1 shuffled encode";
  g3.target = ">= " + Fixed(kZstdShuffledGoal / 1e6, 0) + " MB/s";
  const CodecBenchRow* zstd = FindRow(*r, "zstd", f32);
  if (zstd != nullptr && r->options.zstd_level == 1) {
    g3.measured = Fixed(zstd->encode->best / 1e6, 0) + " MB/s";
    g3.pass = zstd->encode->best >= kZstdShuffledGoal;
  } else if (zstd != nullptr) {
    g3.measured = "not judged: --zstd-level is " + std::to_string(r->options.zstd_level);
  }
  for (CodecGoal* g : {&g1, &g2, &g3}) {
    if (!g->pass && g->measured.empty()) {
      g->measured = "not measured: needs row '" + g->row + "' with dtype float32";
    }
    r->goals.push_back(std::move(*g));
  }
}

const CodecGoal* GoalFor(const CodecBenchReport& r, const CodecBenchRow& row) {
  for (const CodecGoal& g : r.goals) {
    if (g.row == row.name && g.dtype == row.dtype && g.pass) return &g;
  }
  return nullptr;
}

const char* PassText(const std::optional<bool>& pass) {
  if (!pass) return "n/a";
  return *pass ? "PASS" : "MISS";
}

const char* RoundingName(Rounding r) {
  return r == Rounding::kNearest ? "nearest" : "stochastic";
}


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

StatusOr<CodecBenchReport> RunCodecBench(const CodecBenchOptions& options, ProgressLine* progress) {
  CodecBenchReport report;
  report.options = options;
  report.cpu = CpuModelName();
  report.isa = CodecIsaName();
  report.date = UtcTimestamp();
  TimeShare share;
  MemcpyBaseline baseline(options.size_bytes, std::max(options.iters, kMinMemcpyIters),
                          options.seed, &share);

  const size_t total = options.rows.size() * options.dtypes.size();
  size_t done = 0;
  for (DataType dtype : options.dtypes) {
    if (progress != nullptr) progress->Update("memcpy baseline");
    baseline.Sample();
    if (progress != nullptr) {
      progress->Update(std::string("generating ") + DataTypeName(dtype) + " gradients");
    }
    DtypeRunner runner(options, dtype, &share);
    STRAIT_RETURN_IF_ERROR(runner.Init());
    for (const CodecRowSpec& spec : options.rows) {
      const std::string prefix = "[" + std::to_string(++done) + "/" + std::to_string(total) + "] " +
                                 DataTypeName(dtype) + " " + spec.name + ": ";
      STRAIT_ASSIGN_OR_RETURN(CodecBenchRow row, runner.Run(spec, progress, prefix));
      report.rows.push_back(std::move(row));
    }
  }
  if (progress != nullptr) progress->Update("memcpy baseline");
  baseline.Sample();
  report.memcpy_speed = baseline.Result();
  report.memcpy_runs = baseline.runs();
  if (progress != nullptr) progress->Clear();
  report.on_cpu = share.wall > 0 ? std::min(1.0, share.cpu / share.wall) : 1.0;
  AddGoals(&report);
  return report;
}

std::string FormatCodecReportTable(const CodecBenchReport& r) {
  const CodecBenchOptions& o = r.options;
  const double memcpy_bps = r.memcpy_speed.best;
  std::ostringstream out;
  out << "strait-bench codec: " << FormatBytes(o.size_bytes) << " per row, single thread, best of "
      << o.iters << " after 1 warm-up\n";
  out << AlignColumns(
      {
          {"cpu", r.cpu},
          {"codec isa", r.isa},
          {"date", r.date},
          {"data", "gradient-like, seed " + std::to_string(o.seed) + "; block " +
                       std::to_string(o.block_size) + ", rounding " + RoundingName(o.rounding) +
                       ", zstd level " + std::to_string(o.zstd_level)},
          {"memcpy", GBps(memcpy_bps) + " GB/s (best of " + std::to_string(r.memcpy_runs) + ", " +
                         FormatBytes(o.size_bytes) +
                         "); speeds are GB/s (1e9 B/s) of input "
                         "and (x memcpy)"},
          {"on cpu", Fixed(100 * r.on_cpu, 0) + "% of timed wall-clock time" +
                         (r.on_cpu < kBusyOnCpu ? ": WARNING: the machine was busy, figures "
                                                  "understate the codec"
                                                : "")},
      },
      2);
  out << '\n';

  auto speed = [&](const std::optional<Speed>& s) -> std::string {
    if (!s) return "-";
    return GBps(s->best) + " (" + Fixed(memcpy_bps > 0 ? s->best / memcpy_bps : 0, 2) + "x)";
  };
  auto opt = [](const std::optional<double>& v) { return v ? Sci(*v) : std::string("-"); };
  std::vector<std::vector<std::string>> table = {{"row", "dtype", "ratio", "encode GB/s",
                                                  "decode GB/s", "max abs err", "mean abs err",
                                                  "max err/absmax", "goal"}};
  for (const CodecBenchRow& row : r.rows) {
    const CodecGoal* goal = GoalFor(r, row);
    table.push_back(
        {row.name, DataTypeName(row.dtype),
         row.frame_bytes
             ? Fixed(static_cast<double>(row.input_bytes) / static_cast<double>(*row.frame_bytes),
                     2)
             : "-",
         speed(row.encode), speed(row.decode), opt(row.max_abs_error), opt(row.mean_abs_error),
         opt(row.max_error_vs_absmax), goal ? PassText(goal->pass) : ""});
  }
  out << AlignColumns(table, 2);
  out << "decode column: Decode for codec rows, DecodeAccumulate into fp32 for decode-acc, "
         "ReduceInPlace sum for reduce.\nerrors: against the fp32 source, so bf16/fp16 rows "
         "include the conversion; lossless rows checked bit-exact.\n\n";

  out << "goals (single thread, float32):\n";
  std::vector<std::vector<std::string>> goals;
  for (const CodecGoal& g : r.goals) {
    goals.push_back({"  " + g.name, g.target, g.measured, PassText(g.pass)});
  }
  out << AlignColumns(goals, 4);
  return out.str();
}

std::string FormatCodecReportJson(const CodecBenchReport& r) {
  using Json = nlohmann::ordered_json;
  const double memcpy_bps = r.memcpy_speed.best;
  auto speed = [&](const std::optional<Speed>& s) -> Json {
    if (!s) return nullptr;
    return Json{{"best_gbps", s->best / 1e9},
                {"median_gbps", s->median / 1e9},
                {"best_vs_memcpy", memcpy_bps > 0 ? s->best / memcpy_bps : 0.0}};
  };
  auto opt = [](const auto& v) -> Json {
    if (!v) return nullptr;
    return *v;
  };
  const CodecBenchOptions& o = r.options;
  Json j;
  cli::SetReportHeader(j, kToolName, r.date);
  j["command"] = "codec";
  j["cpu"] = r.cpu;
  j["codec_isa"] = r.isa;
  j["size_bytes"] = o.size_bytes;
  j["iters"] = o.iters;
  j["seed"] = o.seed;
  j["zstd_level"] = o.zstd_level;
  j["block_size"] = o.block_size;
  j["rounding"] = RoundingName(o.rounding);
  j["threads"] = 1;
  j["on_cpu_fraction"] = r.on_cpu;
  j["memcpy"] = Json{{"best_gbps", r.memcpy_speed.best / 1e9},
                     {"median_gbps", r.memcpy_speed.median / 1e9},
                     {"runs", r.memcpy_runs}};
  Json rows = Json::array();
  for (const CodecBenchRow& row : r.rows) {
    Json jr;
    jr["row"] = row.name;
    jr["dtype"] = DataTypeName(row.dtype);
    jr["elements"] = row.elements;
    jr["input_bytes"] = row.input_bytes;
    jr["frame_bytes"] = opt(row.frame_bytes);
    jr["ratio"] =
        row.frame_bytes
            ? Json(static_cast<double>(row.input_bytes) / static_cast<double>(*row.frame_bytes))
            : Json(nullptr);
    jr["encode"] = speed(row.encode);
    jr["decode"] = speed(row.decode);
    jr["lossless"] = row.lossless;
    jr["max_abs_error"] = opt(row.max_abs_error);
    jr["mean_abs_error"] = opt(row.mean_abs_error);
    jr["max_error_vs_absmax"] = opt(row.max_error_vs_absmax);
    rows.push_back(std::move(jr));
  }
  j["rows"] = std::move(rows);
  Json goals = Json::array();
  for (const CodecGoal& g : r.goals) {
    goals.push_back(Json{{"name", g.name},
                         {"row", g.row},
                         {"dtype", DataTypeName(g.dtype)},
                         {"target", g.target},
                         {"measured", g.measured},
                         {"pass", opt(g.pass)}});
  }
  j["goals"] = std::move(goals);
  return j.dump(2) + "\n";
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

// `strait-bench codec`: measures every codec row on gradient-like data against memcpy and checks
// that every decode is right. See codec_bench.h for the rows; the goals and the report's table
// and JSON are in codec_bench_report.cc, the command line and row parsing in codec_bench_cli.cc.
#include "bench/codec_bench.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "bench/codec_bench_internal.h"
#include "bench/gradient.h"
#include "common/clock.h"
#include "common/units.h"
#include "strait/reduce.h"

namespace strait::bench {
namespace {

using codec_bench_internal::AddGoals;

// The memcpy baseline is cheap, and every ratio divides by it, so it gets more tries than a row.
constexpr int kMinMemcpyIters = 10;

// Keeps the compiler from treating a buffer's contents as dead (a memcpy whose destination is
// never read could otherwise be dropped).
inline void Clobber(const void* p) {
  asm volatile("" : : "r"(p) : "memory");
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

}  // namespace

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

}  // namespace strait::bench

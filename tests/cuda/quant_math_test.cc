// The GPU kernels' arithmetic (lib/cuda/quant_math.h) run on the host, in the kernels' own shape
// (a warp or a CTA per block, 8 registers a thread, chunks, int4 nibbles paired across lanes), held
// to the CPU codec's scalar kernels: byte-identical stages and bit-identical error-feedback
// residuals for every codec x dtype x rounding x odd size x block size, with and without
// feedback; dequantize and dequantize-accumulate identical; and frames wrapped around the stage
// (lib/cuda/stage_frame.cc) byte-identical to the CPU Encoder's. Needs no CUDA: it runs in CI.
#include "cuda/quant_math.h"

#include <gtest/gtest.h>

#include <array>
#include <cstring>
#include <string>
#include <vector>

#include "codec/kernels_common.h"
#include "cuda/stage_frame.h"
#include "cuda_test_util.h"
#include "strait/codec.h"

namespace strait::cuda_test {
namespace {

namespace qm = quant_math;
using ci::LossyKind;

// 32, 64: fewer than 8 elements a lane; 512: chunks of 256 per warp; 2048: one CTA's chunk;
// 8192: a CTA in chunks.
constexpr uint32_t kBlockSizes[] = {32, 64, 256, 512, 2048, 8192};

// ---- a host emulation of quantize.cu's QuantizeKernel ---------------------------------------
// The kernel's own per-thread steps (quant_math.h), run for every thread of a group in turn; only
// the GPU's cross-thread operations are emulated here: the max reduction (in another order,
// which an exact max does not notice) and the int4 neighbour shuffle.

using qm::kRegs;
using qm::kWarpSize;

template <LossyKind kKind, DataType kType, bool kResidual, int kGroup>
void EmulateGroups(const qm::QuantizeArgs& a) {
  constexpr uint32_t kChunk = static_cast<uint32_t>(kGroup) * kRegs;
  const uint32_t regs = qm::FirstChunkRegs<kGroup>(a.block_size);
  std::vector<std::array<float, kRegs>> held(kGroup);
  // Walk the blocks backwards: each group's work is independent of every other's.
  for (size_t qb = a.num_blocks; qb-- > 0;) {
    const size_t begin = qb * a.block_size;
    const auto n = static_cast<uint32_t>(std::min<size_t>(a.block_size, a.count - begin));
    std::vector<uint32_t> thread_max(kGroup);
    for (unsigned t = 0; t < kGroup; ++t) {
      float c[kRegs];
      thread_max[t] = qm::LoadChunk<kType, kResidual, kGroup>(a, begin, 0, n, regs, t, c);
      std::copy(std::begin(c), std::end(c), held[t].begin());
      for (uint32_t chunk = kChunk; chunk < n; chunk += kChunk) {
        float more[kRegs];
        thread_max[t] = qm::MaxBits(thread_max[t], qm::LoadChunk<kType, kResidual, kGroup>(
                                                       a, begin, chunk, n, kRegs, t, more));
      }
    }
    uint32_t absmax = 0;
    for (int t = kGroup - 1; t >= 0; --t) absmax = qm::MaxBits(thread_max[t], absmax);
    const qm::BlockScale bs = qm::ComputeBlockScale<kKind>(absmax);
    a.scales[qb] = bs.scale;  // thread 0 of the group does this

    for (uint32_t chunk = 0; chunk < n; chunk += kChunk) {
      const uint32_t chunk_regs = chunk == 0 ? regs : kRegs;
      if (chunk > 0) {
        for (unsigned t = 0; t < kGroup; ++t) {
          float c[kRegs];
          qm::LoadChunk<kType, kResidual, kGroup>(a, begin, chunk, n, kRegs, t, c);
          std::copy(std::begin(c), std::end(c), held[t].begin());
        }
      }
      for (int k = 0; k < kRegs; ++k) {
        std::vector<uint8_t> code(kGroup);
        std::vector<bool> valid(kGroup);
        for (unsigned t = 0; t < kGroup; ++t) {
          valid[t] = qm::ChunkElementValid<kGroup>(chunk, n, chunk_regs, t, k);
          code[t] = qm::ChunkCode<kKind, kResidual, kGroup>(a, bs, begin, chunk, valid[t], t, k,
                                                            held[t][k]);
        }
        for (unsigned t = 0; t < kGroup; ++t) {
          // __shfl_down_sync(.., 1): the next lane of the same warp; the last lane its own.
          const uint8_t next = code[t % kWarpSize < kWarpSize - 1 ? t + 1 : t];
          qm::StoreChunkCode<kKind, kGroup>(a, begin, chunk, valid[t], t, k, code[t], next);
        }
      }
    }
  }
}

template <LossyKind kKind, DataType kType, bool kResidual>
void EmulateQuantize(const uint8_t* src, float* residual, size_t count,
                     const ci::QuantParams& params, uint8_t* stage) {
  qm::QuantizeArgs a;
  a.src = src;
  a.residual = residual;
  a.count = count;
  a.num_blocks = ci::ScaleCount(count, params.block_size);
  a.block_size = params.block_size;
  a.stochastic = params.rounding == Rounding::kStochastic;
  a.key = rng::KeyFromSeed(params.seed);
  a.index_offset = params.index_offset;
  a.scales = reinterpret_cast<float*>(stage);  // a std::vector's data: aligned
  a.codes = stage + a.num_blocks * sizeof(float);
  if (params.block_size >= qm::kCtaBlockSize) {
    EmulateGroups<kKind, kType, kResidual, qm::kCtaThreads>(a);
  } else {
    EmulateGroups<kKind, kType, kResidual, kWarpSize>(a);
  }
}

template <LossyKind kKind, DataType kType>
void EmulateForResidual(const uint8_t* src, float* residual, size_t count,
                        const ci::QuantParams& params, uint8_t* stage) {
  if (residual != nullptr) {
    EmulateQuantize<kKind, kType, true>(src, residual, count, params, stage);
  } else {
    EmulateQuantize<kKind, kType, false>(src, nullptr, count, params, stage);
  }
}

template <LossyKind kKind>
void EmulateForType(DataType type, const uint8_t* src, float* residual, size_t count,
                    const ci::QuantParams& params, uint8_t* stage) {
  switch (type) {
    case DataType::kBfloat16:
      EmulateForResidual<kKind, DataType::kBfloat16>(src, residual, count, params, stage);
      break;
    case DataType::kFloat16:
      EmulateForResidual<kKind, DataType::kFloat16>(src, residual, count, params, stage);
      break;
    default:
      EmulateForResidual<kKind, DataType::kFloat32>(src, residual, count, params, stage);
      break;
  }
}

// The emulated stage (filled with 0xcd first, so that an unwritten byte shows).
std::vector<uint8_t> EmulatedStage(CodecId codec, DataType type, const std::vector<uint8_t>& src,
                                   float* residual, size_t count, const ci::QuantParams& params) {
  std::vector<uint8_t> stage(ci::LossyStageSize(KindOf(codec), count, params.block_size), 0xcd);
  switch (KindOf(codec)) {
    case LossyKind::kInt8:
      EmulateForType<LossyKind::kInt8>(type, src.data(), residual, count, params, stage.data());
      break;
    case LossyKind::kInt4:
      EmulateForType<LossyKind::kInt4>(type, src.data(), residual, count, params, stage.data());
      break;
    case LossyKind::kFp8:
      EmulateForType<LossyKind::kFp8>(type, src.data(), residual, count, params, stage.data());
      break;
  }
  return stage;
}

// ---- a host emulation of DequantizeKernel -----------------------------------------------------

template <LossyKind kKind>
float DequantizeAt(const std::vector<uint8_t>& stage, size_t count, uint32_t block_size, size_t i) {
  const size_t blocks = ci::ScaleCount(count, block_size);
  const uint8_t* codes = stage.data() + blocks * 4;
  const uint8_t code = kKind == LossyKind::kInt4
                           ? static_cast<uint8_t>((codes[i / 2] >> (4 * (i & 1))) & 0xfu)
                           : codes[i];
  float scale;
  std::memcpy(&scale, stage.data() + (i / block_size) * 4, 4);
  return qm::Dequantize<kKind>(code, scale);
}

float EmulatedDequantize(CodecId codec, const std::vector<uint8_t>& stage, size_t count,
                         uint32_t block_size, size_t i) {
  switch (KindOf(codec)) {
    case LossyKind::kInt4: return DequantizeAt<LossyKind::kInt4>(stage, count, block_size, i);
    case LossyKind::kFp8: return DequantizeAt<LossyKind::kFp8>(stage, count, block_size, i);
    default: return DequantizeAt<LossyKind::kInt8>(stage, count, block_size, i);
  }
}

// Index of the first differing byte, or -1.
long FirstDiff(const std::vector<uint8_t>& a, const std::vector<uint8_t>& b) {
  if (a.size() != b.size()) return static_cast<long>(std::min(a.size(), b.size()));
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i] != b[i]) return static_cast<long>(i);
  }
  return -1;
}

struct Case {
  CodecId codec;
  DataType type;
};

class QuantMathTest : public ::testing::TestWithParam<Case> {};

TEST_P(QuantMathTest, StageAndResidualMatchScalarCodec) {
  const auto [codec, type] = GetParam();
  int cases = 0;
  for (const uint32_t block : kBlockSizes) {
    for (const size_t count : kSizes) {
      for (const Rounding rounding : kRoundings) {
        for (const bool feedback : {false, true}) {
          SCOPED_TRACE(CaseName(codec, type, rounding, count, block, feedback));
          const std::vector<float> input = MakeInput(count, block, count * 31 + block, cases % 9);
          const std::vector<uint8_t> src = StoreAs(input, type);
          ci::QuantParams params;
          params.block_size = block;
          params.rounding = rounding;
          params.seed = 0x5eed0000u + static_cast<uint64_t>(cases);
          params.index_offset = (uint64_t{1} << 33) + 12345 * static_cast<uint64_t>(cases);
          std::vector<float> ref_res = MakeResidual(input, block, count + 7);
          std::vector<float> emu_res = ref_res;
          const std::vector<uint8_t> ref =
              ReferenceStage(codec, type, src, feedback ? ref_res.data() : nullptr, count, params);
          const std::vector<uint8_t> emu =
              EmulatedStage(codec, type, src, feedback ? emu_res.data() : nullptr, count, params);
          ASSERT_EQ(FirstDiff(ref, emu), -1)
              << "stage bytes differ (scales come first: " << ci::ScaleCount(count, block) * 4
              << " bytes)";
          ASSERT_EQ(FirstFloatDiff(ref_res, emu_res), -1) << "residuals differ";

          // Dequantize, dequantize-accumulate, and narrow outputs as the Decoder makes them.
          std::vector<float> ref_out(count), ref_acc = input;
          ReferenceDequantize(codec, ref, count, block, ref_out.data(), false);
          ReferenceDequantize(codec, ref, count, block, ref_acc.data(), true);
          std::vector<float> emu_out(count), emu_acc(count);
          for (size_t i = 0; i < count; ++i) {
            emu_out[i] = EmulatedDequantize(codec, emu, count, block, i);
            emu_acc[i] = qm::Accumulate(input[i], emu_out[i]);
            if (std::isnan(ref_out[i])) continue;  // NaN payloads: see FirstFloatDiff
            ASSERT_EQ(qm::FromFloat<DataType::kBfloat16>(emu_out[i]),
                      numeric::FloatToBf16(ref_out[i]));
            ASSERT_EQ(qm::FromFloat<DataType::kFloat16>(emu_out[i]),
                      numeric::FloatToHalf(ref_out[i]));
          }
          ASSERT_EQ(FirstFloatDiff(ref_out, emu_out), -1) << "dequantize differs";
          ASSERT_EQ(FirstFloatDiff(ref_acc, emu_acc), -1) << "accumulate differs";
          ++cases;
        }
      }
    }
  }
  EXPECT_EQ(cases, 6 * 10 * 2 * 2);
}

// Several steps of error feedback in a row: the residual each step leaves is the next step's
// input, so a one-ulp difference anywhere would grow into differing codes.
TEST_P(QuantMathTest, FeedbackStepsStayIdentical) {
  const auto [codec, type] = GetParam();
  const size_t count = 3001;
  const uint32_t block = 256;
  std::vector<float> ref_res(count, 0.0f), emu_res(count, 0.0f);
  for (int step = 0; step < 6; ++step) {
    SCOPED_TRACE("step " + std::to_string(step));
    const std::vector<uint8_t> src = StoreAs(MakeInput(count, block, 99 + step, 7), type);
    ci::QuantParams params;
    params.block_size = block;
    params.rounding = step % 2 ? Rounding::kStochastic : Rounding::kNearest;
    params.seed = 1000 + static_cast<uint64_t>(step);
    ASSERT_EQ(FirstDiff(ReferenceStage(codec, type, src, ref_res.data(), count, params),
                        EmulatedStage(codec, type, src, emu_res.data(), count, params)),
              -1);
    ASSERT_EQ(FirstFloatDiff(ref_res, emu_res), -1);
  }
  bool any_nonzero = false;
  for (float r : emu_res) any_nonzero = any_nonzero || (std::isfinite(r) && r != 0.0f);
  EXPECT_TRUE(any_nonzero) << "feedback left no residual: the test would not notice a bug";
}

// The frame around an emulated stage is the Encoder's frame, byte for byte: plain, chained with
// zstd, stochastic (flag), with and without feedback.
TEST_P(QuantMathTest, WrappedFrameMatchesEncoder) {
  const auto [codec, type] = GetParam();
  Encoder encoder;
  for (const size_t count : {size_t{1}, size_t{255}, size_t{4097}}) {
    for (const bool chain : {false, true}) {
      for (const Rounding rounding : kRoundings) {
        for (const bool feedback : {false, true}) {
          SCOPED_TRACE(CaseName(codec, type, rounding, count, 256, feedback) +
                       (chain ? "/zstd" : ""));
          const std::vector<float> input = MakeInput(count, 256, count, 5);
          const std::vector<uint8_t> src = StoreAs(input, type);
          CodecOptions options;
          options.codec = codec;
          options.chain_zstd = chain;
          options.zstd_level = chain ? 3 : 1;
          options.rounding = rounding;
          options.seed = 77;
          options.index_offset = 5;
          std::vector<float> cpu_res = MakeResidual(input, 256, 3), gpu_res = cpu_res;
          std::vector<uint8_t> frame;
          if (feedback) {
            ASSERT_TRUE(
                encoder.EncodeWithFeedback(src.data(), count, type, options, cpu_res.data(), &frame)
                    .ok());
          } else {
            ASSERT_TRUE(encoder.Encode(src.data(), count, type, options, &frame).ok());
          }
          ci::QuantParams params;
          params.block_size = options.block_size;
          params.rounding = rounding;
          params.seed = options.seed;
          params.index_offset = options.index_offset;
          const std::vector<uint8_t> stage =
              EmulatedStage(codec, type, src, feedback ? gpu_res.data() : nullptr, count, params);
          ASSERT_EQ(stage.size(), cuda::LossyStageBytes(count, options));
          std::vector<uint8_t> wrapped(cuda::MaxWrappedFrameSize(count, type, options));
          StatusOr<size_t> size = cuda::WrapStage(stage, count, type, options, wrapped);
          ASSERT_TRUE(size.ok()) << size.status().ToString();
          wrapped.resize(*size);
          ASSERT_EQ(FirstDiff(frame, wrapped), -1) << "frame bytes differ (header is 48)";
          ASSERT_EQ(FirstFloatDiff(cpu_res, gpu_res), -1);

          if (!chain) {
            FrameInfo info;
            StatusOr<std::span<const uint8_t>> back = cuda::StageOf(wrapped, &info);
            ASSERT_TRUE(back.ok()) << back.status().ToString();
            EXPECT_EQ(std::vector<uint8_t>(back->begin(), back->end()), stage);
            EXPECT_EQ(info.element_count, count);
          } else {
            StatusOr<std::span<const uint8_t>> back = cuda::StageOf(wrapped);
            ASSERT_FALSE(back.ok());
            EXPECT_NE(back.status().message().find("zstd"), std::string::npos);
          }
        }
      }
    }
  }
}

std::string CaseParamName(const ::testing::TestParamInfo<Case>& info) {
  return std::string(CodecName(info.param.codec)) + "_" + DataTypeName(info.param.type);
}

std::vector<Case> AllCases() {
  std::vector<Case> cases;
  for (CodecId codec : kLossyCodecs) {
    for (DataType type : kFloatTypes) cases.push_back({codec, type});
  }
  return cases;
}

INSTANTIATE_TEST_SUITE_P(AllCodecsAndTypes, QuantMathTest, ::testing::ValuesIn(AllCases()),
                         CaseParamName);

TEST(StageFrameTest, RejectsWhatItCannotWrap) {
  CodecOptions options;
  options.codec = CodecId::kInt8;
  const size_t count = 100;
  std::vector<uint8_t> stage(cuda::LossyStageBytes(count, options));
  std::vector<uint8_t> out(cuda::MaxWrappedFrameSize(count, DataType::kFloat32, options));

  std::vector<uint8_t> short_stage(stage.size() - 1);
  StatusOr<size_t> r = cuda::WrapStage(short_stage, count, DataType::kFloat32, options, out);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("need " + std::to_string(stage.size())), std::string::npos)
      << r.status().ToString();

  std::vector<uint8_t> small_out(out.size() - 1);
  r = cuda::WrapStage(stage, count, DataType::kFloat32, options, small_out);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("MaxWrappedFrameSize"), std::string::npos);

  CodecOptions lossless;
  lossless.codec = CodecId::kZstd;
  r = cuda::WrapStage(stage, count, DataType::kFloat32, lossless, out);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("lossless"), std::string::npos);
  EXPECT_EQ(cuda::LossyStageBytes(count, lossless), 0u);

  CodecOptions bad_block = options;
  bad_block.block_size = 48;
  EXPECT_EQ(cuda::LossyStageBytes(count, bad_block), 0u);
  EXPECT_FALSE(cuda::WrapStage(stage, count, DataType::kFloat32, bad_block, out).ok());

  r = cuda::WrapStage(stage, count, DataType::kInt32, options, out);
  EXPECT_FALSE(r.ok());

  // A good frame, then damaged: StageOf validates like InspectFrame.
  r = cuda::WrapStage(stage, count, DataType::kFloat32, options, out);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  out.resize(*r);
  ASSERT_TRUE(cuda::StageOf(out).ok());
  out.back() ^= 1;
  StatusOr<std::span<const uint8_t>> s = cuda::StageOf(out);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), StatusCode::kDataLoss);

  // A lossless frame has no stage.
  Encoder encoder;
  std::vector<uint8_t> raw;
  const std::vector<float> values(10, 1.0f);
  CodecOptions none;
  ASSERT_TRUE(encoder.Encode(values.data(), values.size(), DataType::kFloat32, none, &raw).ok());
  s = cuda::StageOf(raw);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), StatusCode::kInvalidArgument);
}

// quant_math.h restates constants that kernels_common.h keeps for the CPU kernels.
TEST(QuantMathConstantsTest, AgreeWithTheCpuKernels) {
  EXPECT_EQ(qm::kAbsMaskBits, ci::kAbsMaskBits);
  EXPECT_EQ(qm::kNonFiniteBits, ci::kNonFiniteBits);
  EXPECT_EQ(qm::kNanScaleBits, ci::kNanScaleBits);
  EXPECT_EQ(qm::kMinAbsmaxBits, ci::kMinAbsmaxBits);
  for (uint32_t bits : {0u, 1u, 0x0f7fffffu, 0x0f800000u, 0x3f800000u, 0x42fe0000u, 0x7f7fffffu,
                        0x7f800000u, 0x7fc00000u}) {
    for (LossyKind kind : {LossyKind::kInt8, LossyKind::kInt4, LossyKind::kFp8}) {
      const ci::BlockScale cpu = ci::ComputeBlockScale(kind, bits);
      const qm::BlockScale gpu =
          kind == LossyKind::kInt8   ? qm::ComputeBlockScale<LossyKind::kInt8>(bits)
          : kind == LossyKind::kInt4 ? qm::ComputeBlockScale<LossyKind::kInt4>(bits)
                                     : qm::ComputeBlockScale<LossyKind::kFp8>(bits);
      EXPECT_EQ(numeric::FloatBits(cpu.scale), numeric::FloatBits(gpu.scale)) << bits;
      EXPECT_EQ(cpu.zero_codes, gpu.zero_codes) << bits;
      if (!cpu.zero_codes) {
        EXPECT_EQ(numeric::FloatBits(cpu.inv), numeric::FloatBits(gpu.inv));
      }
    }
  }
}

}  // namespace
}  // namespace strait::cuda_test

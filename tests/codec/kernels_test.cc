// Tests for the quantization kernels (lib/codec/kernels_*.cc) and the stochastic-rounding
// generator (lib/codec/rng.h): every vector ISA this CPU has gives the scalar reference's bytes
// for every format, input type, rounding, size and block size, including NaN/inf blocks, tiny
// values and unaligned buffers; the reference itself meets its error bounds, rounds
// stochastically without bias, and is reproducible from (seed, index).
#include "codec/kernels.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "codec/kernels_common.h"
#include "codec/numeric.h"
#include "codec/rng.h"
#include "common/log.h"

namespace strait::codec_internal {
namespace {

constexpr LossyKind kKinds[] = {LossyKind::kInt8, LossyKind::kInt4, LossyKind::kFp8};
constexpr DataType kTypes[] = {DataType::kFloat32, DataType::kBfloat16, DataType::kFloat16};
constexpr uint32_t kBlockSizes[] = {32, 256, 4096};

const char* KindName(LossyKind kind) {
  switch (kind) {
    case LossyKind::kInt8: return "int8";
    case LossyKind::kInt4: return "int4";
    case LossyKind::kFp8: return "fp8";
  }
  return "?";
}

float Qmax(LossyKind kind) {
  return kind == LossyKind::kInt8 ? 127.0f : kind == LossyKind::kInt4 ? 7.0f : 448.0f;
}

// A byte buffer whose data starts one byte past the allocation (so never aligned for floats),
// followed by guard bytes that no kernel may touch.
class Buffer {
 public:
  static constexpr size_t kGuard = 64;
  static constexpr uint8_t kGuardByte = 0xa5;

  Buffer(size_t size, uint8_t fill) : size_(size), bytes_(1 + size + kGuard, kGuardByte) {
    std::fill_n(bytes_.begin() + 1, size, fill);
  }
  uint8_t* data() { return bytes_.data() + 1; }
  float* floats() { return reinterpret_cast<float*>(data()); }
  size_t size() const { return size_; }
  bool GuardsIntact() const {
    if (bytes_[0] != kGuardByte) return false;
    for (size_t i = 1 + size_; i < bytes_.size(); ++i) {
      if (bytes_[i] != kGuardByte) return false;
    }
    return true;
  }
  std::vector<uint8_t> Contents() const {
    return std::vector<uint8_t>(bytes_.begin() + 1, bytes_.begin() + 1 + size_);
  }

 private:
  size_t size_;
  std::vector<uint8_t> bytes_;
};

std::vector<uint8_t> FloatBytes(const std::vector<float>& v) {
  std::vector<uint8_t> out(v.size() * 4);
  if (!v.empty()) std::memcpy(out.data(), v.data(), out.size());
  return out;
}

// `values` stored as `type` (float16/bfloat16 rounded to nearest even by numeric.h).
std::vector<uint8_t> Encode(const std::vector<float>& values, DataType type) {
  if (type == DataType::kFloat32) return FloatBytes(values);
  std::vector<uint8_t> out(values.size() * 2);
  for (size_t i = 0; i < values.size(); ++i) {
    const uint16_t h = type == DataType::kBfloat16 ? numeric::FloatToBf16(values[i])
                                                   : numeric::FloatToHalf(values[i]);
    std::memcpy(out.data() + 2 * i, &h, 2);
  }
  return out;
}

float Decode(const std::vector<uint8_t>& bytes, DataType type, size_t i) {
  if (type == DataType::kFloat32) {
    float f;
    std::memcpy(&f, bytes.data() + 4 * i, 4);
    return f;
  }
  uint16_t h;
  std::memcpy(&h, bytes.data() + 2 * i, 2);
  return type == DataType::kBfloat16 ? numeric::Bf16ToFloat(h) : numeric::HalfToFloat(h);
}

float LoadFloat(const std::vector<uint8_t>& bytes, size_t i) {
  float f;
  std::memcpy(&f, bytes.data() + 4 * i, 4);
  return f;
}

// Test input: each block gets one of several patterns (chosen by block index + `pattern`), so
// that every size sees zeros, inf, NaN, subnormals, values near the 2^-96 cut-off, exact ties
// and ordinary data of varied magnitude.
std::vector<float> MakeInput(size_t count, uint32_t block_size, uint64_t seed, int pattern) {
  std::mt19937_64 gen(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_real_distribution<float> exponent(-3.0f, 3.0f);
  std::vector<float> v(count);
  for (size_t begin = 0; begin < count; begin += block_size) {
    const size_t end = std::min<size_t>(count, begin + block_size);
    const int kind = static_cast<int>((begin / block_size + static_cast<size_t>(pattern)) % 9);
    const float magnitude = std::pow(10.0f, exponent(gen));
    std::uniform_int_distribution<size_t> pos(begin, end - 1);
    for (size_t i = begin; i < end; ++i) {
      switch (kind) {
        case 0:  // zeros of both signs
          v[i] = (i & 1) ? -0.0f : 0.0f;
          break;
        case 3:  // fp32 subnormals
          v[i] = normal(gen) * 1e-39f;
          break;
        case 4:  // below the 2^-96 cut-off (1.26e-29)
          v[i] = normal(gen) * 1e-30f;
          break;
        case 5:  // just above it
          v[i] = normal(gen) * 1e-28f;
          break;
        case 6:  // multiples of 0.5 with absmax 127: exact ties for int8 (inv is exactly 1)
          v[i] = static_cast<float>(static_cast<int>(normal(gen) * 60.0f)) * 0.5f;
          break;
        default: v[i] = normal(gen) * magnitude; break;
      }
    }
    if (kind == 1)
      v[pos(gen)] = (gen() & 1) ? std::numeric_limits<float>::infinity()
                                : -std::numeric_limits<float>::infinity();
    if (kind == 2) v[pos(gen)] = (gen() & 1) ? std::nanf("") : -std::nanf("0x123");
    if (kind == 6) v[begin] = 127.0f;
  }
  return v;
}

std::vector<float> MakeResidual(const std::vector<float>& input, uint32_t block_size,
                                uint64_t seed) {
  std::mt19937_64 gen(seed);
  std::uniform_real_distribution<float> u(-0.05f, 0.05f);
  std::vector<float> r(input.size());
  for (size_t i = 0; i < input.size(); ++i) {
    // Keep some blocks exactly zero and every residual finite (see QuantizeMatchesScalar).
    const bool zero_block = (i / block_size) % 4 == 1;
    r[i] = zero_block || !std::isfinite(input[i]) ? 0.0f : u(gen) * std::fabs(input[i]);
  }
  return r;
}

struct QuantResult {
  std::vector<uint8_t> scales;
  std::vector<uint8_t> codes;
  std::vector<uint8_t> residual;
};

QuantResult Quantize(const KernelTable& kernels, LossyKind kind, DataType type,
                     const std::vector<uint8_t>& src_bytes, const std::vector<float>* residual,
                     size_t count, const QuantParams& params, uint8_t fill) {
  Buffer src(src_bytes.size(), 0);
  if (!src_bytes.empty()) std::memcpy(src.data(), src_bytes.data(), src_bytes.size());
  Buffer scales(ScaleCount(count, params.block_size) * 4, fill);
  Buffer codes(CodeBytes(kind, count), fill);
  Buffer res(residual != nullptr ? count * 4 : 0, fill);
  if (residual != nullptr && count != 0) std::memcpy(res.data(), residual->data(), count * 4);
  kernels.quantize[static_cast<int>(kind)](src.data(), type,
                                           residual != nullptr ? res.floats() : nullptr, count,
                                           params, scales.floats(), codes.data());
  EXPECT_TRUE(src.GuardsIntact() && scales.GuardsIntact() && codes.GuardsIntact() &&
              res.GuardsIntact())
      << "a kernel wrote outside its buffers";
  return {scales.Contents(), codes.Contents(), res.Contents()};
}

std::vector<uint8_t> Dequantize(const KernelTable& kernels, LossyKind kind,
                                const std::vector<uint8_t>& scale_bytes,
                                const std::vector<uint8_t>& code_bytes, size_t count,
                                uint32_t block_size, const std::vector<float>* accumulate_into) {
  Buffer scales(scale_bytes.size(), 0);
  Buffer codes(code_bytes.size(), 0);
  Buffer out(count * 4, 0x7f);
  if (!scale_bytes.empty()) std::memcpy(scales.data(), scale_bytes.data(), scale_bytes.size());
  if (!code_bytes.empty()) std::memcpy(codes.data(), code_bytes.data(), code_bytes.size());
  if (accumulate_into != nullptr && count != 0) {
    std::memcpy(out.data(), accumulate_into->data(), count * 4);
  }
  kernels.dequantize[static_cast<int>(kind)](scales.floats(), codes.data(), count, block_size,
                                             out.floats(), accumulate_into != nullptr);
  EXPECT_TRUE(scales.GuardsIntact() && codes.GuardsIntact() && out.GuardsIntact())
      << "a kernel wrote outside its buffers";
  return out.Contents();
}

// "" when equal, else where and how `got` first differs from `want`.
std::string FirstDifference(const std::vector<uint8_t>& want, const std::vector<uint8_t>& got,
                            size_t element_size) {
  if (want.size() != got.size()) return "sizes differ";
  for (size_t i = 0; i < want.size(); ++i) {
    if (want[i] != got[i]) {
      std::ostringstream os;
      os << "first difference at element " << i / element_size << " (byte " << i << "): want 0x"
         << std::hex << int{want[i]} << ", got 0x" << int{got[i]};
      return os.str();
    }
  }
  return "";
}

bool IsaSupported(Isa isa) {
  return static_cast<int>(isa) <= static_cast<int>(DetectIsa());
}

class KernelIsaTest : public ::testing::TestWithParam<Isa> {
 protected:
  void SetUp() override {
    if (!IsaSupported(GetParam())) {
      GTEST_SKIP() << "this CPU lacks " << IsaName(GetParam()) << "; only " << IsaName(DetectIsa())
                   << " and below are tested";
    }
  }
  const KernelTable& Kernels() const { return KernelsFor(GetParam()); }
};

std::string IsaParamName(const ::testing::TestParamInfo<Isa>& info) {
  return IsaName(info.param);
}

INSTANTIATE_TEST_SUITE_P(AllIsas, KernelIsaTest,
                         ::testing::Values(Isa::kScalar, Isa::kAvx2, Isa::kAvx512), IsaParamName);

// Compares one ISA with the scalar reference for every type, rounding, residual, size and block
// size of `kind`; also checks that dequantize matches and that the returned residual is exactly
// c - dequantize(frame).
void CheckKindMatchesScalar(const KernelTable& kernels, LossyKind kind) {
  const KernelTable& ref = ScalarKernels();
  int pattern = 0;
  for (DataType type : kTypes) {
    for (uint32_t block : kBlockSizes) {
      const size_t sizes[] = {0, 1, 31, block - 1, block, block + 1, 3 * block + 17, 100003};
      for (size_t count : sizes) {
        ++pattern;
        const std::vector<float> values = MakeInput(count, block, 1000 + pattern, pattern);
        const std::vector<uint8_t> src = Encode(values, type);
        const std::vector<float> residual_in = MakeResidual(values, block, 2000 + pattern);
        for (Rounding rounding : {Rounding::kNearest, Rounding::kStochastic}) {
          for (bool with_residual : {false, true}) {
            std::ostringstream trace;
            trace << KindName(kind) << " " << DataTypeName(type) << " block " << block << " count "
                  << count << (rounding == Rounding::kStochastic ? " stochastic" : " nearest")
                  << (with_residual ? " residual" : "");
            SCOPED_TRACE(trace.str());
            QuantParams params;
            params.block_size = block;
            params.rounding = rounding;
            params.seed = 0x5eed0000u + static_cast<uint64_t>(pattern);
            params.index_offset = static_cast<uint64_t>(pattern) * 7919;
            const std::vector<float>* res = with_residual ? &residual_in : nullptr;
            const QuantResult want = Quantize(ref, kind, type, src, res, count, params, 0x00);
            // A second reference run on differently pre-filled buffers shows that every output
            // byte is written (the small sizes cover every code path).
            if (count < 100000) {
              const QuantResult want2 = Quantize(ref, kind, type, src, res, count, params, 0xff);
              ASSERT_EQ(FirstDifference(want.codes, want2.codes, 1), "") << "unwritten codes";
              ASSERT_EQ(FirstDifference(want.scales, want2.scales, 4), "") << "unwritten scales";
              ASSERT_EQ(FirstDifference(want.residual, want2.residual, 4), "")
                  << "unwritten residuals";
            }
            const QuantResult got = Quantize(kernels, kind, type, src, res, count, params, 0x3c);
            ASSERT_EQ(FirstDifference(want.scales, got.scales, 4), "") << "scales";
            ASSERT_EQ(FirstDifference(want.codes, got.codes, 1), "") << "codes";
            ASSERT_EQ(FirstDifference(want.residual, got.residual, 4), "") << "residual";

            // Dequantize (plain and accumulating) matches the reference too.
            const std::vector<uint8_t> deq_want =
                Dequantize(ref, kind, want.scales, want.codes, count, block, nullptr);
            const std::vector<uint8_t> deq_got =
                Dequantize(kernels, kind, want.scales, want.codes, count, block, nullptr);
            ASSERT_EQ(FirstDifference(deq_want, deq_got, 4), "") << "dequantize";
            const std::vector<uint8_t> acc_want =
                Dequantize(ref, kind, want.scales, want.codes, count, block, &residual_in);
            const std::vector<uint8_t> acc_got =
                Dequantize(kernels, kind, want.scales, want.codes, count, block, &residual_in);
            ASSERT_EQ(FirstDifference(acc_want, acc_got, 4), "") << "dequantize-accumulate";

            // Error feedback: residual_out == c - x exactly, x being what the receiver decodes.
            if (with_residual) {
              for (size_t i = 0; i < count; ++i) {
                const float c = Decode(src, type, i) + residual_in[i];
                const float expect = c - LoadFloat(deq_got, i);
                const float r = LoadFloat(got.residual, i);
                if (std::isnan(expect)) {
                  ASSERT_TRUE(std::isnan(r)) << "element " << i;
                } else {
                  ASSERT_EQ(numeric::FloatBits(expect), numeric::FloatBits(r)) << "element " << i;
                }
              }
            }
          }
        }
      }
    }
  }
}

TEST_P(KernelIsaTest, Int8MatchesScalarByteForByte) {
  CheckKindMatchesScalar(Kernels(), LossyKind::kInt8);
}

TEST_P(KernelIsaTest, Int4MatchesScalarByteForByte) {
  CheckKindMatchesScalar(Kernels(), LossyKind::kInt4);
}

TEST_P(KernelIsaTest, Fp8MatchesScalarByteForByte) {
  CheckKindMatchesScalar(Kernels(), LossyKind::kFp8);
}

TEST_P(KernelIsaTest, StochasticIndicesCarryAcrossTheLow32Bits) {
  // The vector kernels split the element index into 32-bit halves per lane; a call whose indices
  // cross 2^32 mid-vector must still match the reference.
  for (LossyKind kind : kKinds) {
    SCOPED_TRACE(KindName(kind));
    const size_t count = 3 * 256 + 5;
    const std::vector<float> values = MakeInput(count, 256, 7, 7);
    const std::vector<uint8_t> src = Encode(values, DataType::kFloat32);
    QuantParams params;
    params.rounding = Rounding::kStochastic;
    params.seed = 42;
    for (uint64_t offset :
         {(uint64_t{1} << 32) - 37, ~uint64_t{0} - 300, uint64_t{0xdeadbeef12345678}}) {
      params.index_offset = offset;
      const QuantResult want =
          Quantize(ScalarKernels(), kind, DataType::kFloat32, src, nullptr, count, params, 0);
      const QuantResult got =
          Quantize(Kernels(), kind, DataType::kFloat32, src, nullptr, count, params, 0);
      EXPECT_EQ(FirstDifference(want.codes, got.codes, 1), "") << "offset " << offset;
    }
  }
}

TEST_P(KernelIsaTest, DequantizeOfArbitraryBytesMatchesScalar) {
  // A decoder sees whatever a (validated) frame carries: every code byte and odd scales.
  std::mt19937_64 gen(99);
  const uint32_t block = 32;
  const size_t count = 64 * block + 11;
  std::vector<float> scales(ScaleCount(count, block));
  for (size_t b = 0; b < scales.size(); ++b) {
    switch (b % 6) {
      case 0: scales[b] = 0.0f; break;
      case 1: scales[b] = std::numeric_limits<float>::infinity(); break;
      case 2: scales[b] = std::numeric_limits<float>::denorm_min(); break;
      default:
        scales[b] =
            std::ldexp(static_cast<float>(gen() % 1000) + 1.0f, -static_cast<int>(gen() % 40));
        break;
    }
  }
  std::vector<uint8_t> codes(count);
  for (auto& c : codes) c = static_cast<uint8_t>(gen());
  for (LossyKind kind : kKinds) {
    SCOPED_TRACE(KindName(kind));
    const std::vector<uint8_t> code_bytes(
        codes.begin(), codes.begin() + static_cast<ptrdiff_t>(CodeBytes(kind, count)));
    const std::vector<uint8_t> want =
        Dequantize(ScalarKernels(), kind, FloatBytes(scales), code_bytes, count, block, nullptr);
    const std::vector<uint8_t> got =
        Dequantize(Kernels(), kind, FloatBytes(scales), code_bytes, count, block, nullptr);
    EXPECT_EQ(FirstDifference(want, got, 4), "");
  }
}

// Error bounds of the reference arithmetic, checked through each ISA's kernels.
TEST_P(KernelIsaTest, ErrorWithinHalfStepForNearestAndOneStepForStochastic) {
  const uint32_t block = 256;
  const size_t count = 64 * block + 100;
  std::mt19937_64 gen(5);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_real_distribution<float> exponent(-30.0f, 30.0f);
  std::vector<float> values(count);
  float magnitude = 1.0f;
  for (size_t i = 0; i < count; ++i) {
    if (i % block == 0) magnitude = std::pow(2.0f, exponent(gen));
    values[i] = normal(gen) * magnitude;
  }
  const std::vector<uint8_t> src = FloatBytes(values);
  for (LossyKind kind : kKinds) {
    for (Rounding rounding : {Rounding::kNearest, Rounding::kStochastic}) {
      SCOPED_TRACE(std::string(KindName(kind)) +
                   (rounding == Rounding::kNearest ? " nearest" : " stochastic"));
      QuantParams params;
      params.block_size = block;
      params.rounding = rounding;
      params.seed = 11;
      const QuantResult q =
          Quantize(Kernels(), kind, DataType::kFloat32, src, nullptr, count, params, 0);
      const std::vector<uint8_t> deq =
          Dequantize(Kernels(), kind, q.scales, q.codes, count, block, nullptr);
      const bool stochastic = rounding == Rounding::kStochastic;
      for (size_t begin = 0; begin < count; begin += block) {
        const size_t end = std::min<size_t>(count, begin + block);
        float absmax = 0.0f;
        for (size_t i = begin; i < end; ++i) absmax = std::max(absmax, std::fabs(values[i]));
        const float scale = LoadFloat(q.scales, begin / block);
        ASSERT_EQ(scale, absmax / Qmax(kind)) << "block " << begin / block;
        // A few ulps of the block's largest value cover the roundings of inv, v and x.
        const float slack = absmax * 0x1p-20f;
        for (size_t i = begin; i < end; ++i) {
          const float c = values[i];
          const float err = std::fabs(LoadFloat(deq, i) - c);
          float bound;
          if (kind == LossyKind::kFp8) {
            // e4m3 keeps 3 mantissa bits: half an ulp is 2^-4 of the magnitude in the normal
            // range; the subnormal step is 2^-9 in units of the scale.
            bound = std::max(std::fabs(c) * 0x1p-4f, scale * 0x1p-10f);
          } else {
            bound = scale * 0.5f;
          }
          if (stochastic) bound *= 2.0f;
          ASSERT_LE(err, bound + slack) << "element " << i << " value " << c << " scale " << scale;
        }
      }
    }
  }
}

TEST_P(KernelIsaTest, NonFiniteBlockDecodesToNaNAndTinyBlockToZero) {
  const uint32_t block = 32;
  std::vector<float> values(4 * block, 1.5f);
  values[3] = std::numeric_limits<float>::infinity();                 // block 0: inf
  values[block + 7] = std::nanf("");                                  // block 1: NaN
  for (size_t i = 2 * block; i < 3 * block; ++i) values[i] = 1e-30f;  // block 2: below 2^-96
  for (LossyKind kind : kKinds) {
    SCOPED_TRACE(KindName(kind));
    QuantParams params;
    params.block_size = block;
    std::vector<float> residual(values.size(), 0.0f);
    const QuantResult q = Quantize(Kernels(), kind, DataType::kFloat32, FloatBytes(values),
                                   &residual, values.size(), params, 0x11);
    const std::vector<uint8_t> deq =
        Dequantize(Kernels(), kind, q.scales, q.codes, values.size(), block, nullptr);
    uint32_t scale_bits[4];
    std::memcpy(scale_bits, q.scales.data(), sizeof(scale_bits));
    EXPECT_EQ(scale_bits[0], kNanScaleBits);
    EXPECT_EQ(scale_bits[1], kNanScaleBits);
    EXPECT_EQ(scale_bits[2], 0u);
    EXPECT_EQ(numeric::BitsFloat(scale_bits[3]), 1.5f / Qmax(kind));
    const size_t code_bytes_per_block = CodeBytes(kind, block);
    for (size_t i = 0; i < 3 * code_bytes_per_block; ++i) ASSERT_EQ(q.codes[i], 0) << i;
    for (size_t i = 0; i < 2 * block; ++i) {
      EXPECT_TRUE(std::isnan(LoadFloat(deq, i))) << i;
      EXPECT_TRUE(std::isnan(LoadFloat(q.residual, i))) << i;
    }
    for (size_t i = 2 * block; i < 3 * block; ++i) {
      EXPECT_EQ(LoadFloat(deq, i), 0.0f) << i;
      EXPECT_EQ(LoadFloat(q.residual, i), 1e-30f) << i;  // nothing is lost with error feedback
    }
    for (size_t i = 3 * block; i < 4 * block; ++i) EXPECT_EQ(LoadFloat(deq, i), 1.5f) << i;
  }
}

TEST_P(KernelIsaTest, Int4PacksTwoPerByteLowNibbleFirst) {
  QuantParams params;
  params.block_size = 32;
  std::vector<float> values(33, 0.0f);
  values[0] = 7.0f;   // absmax 7: scale 1, codes are the values
  values[1] = -3.0f;  // 0xd
  values[2] = 2.0f;
  values[3] = -7.0f;   // 0x9
  values[32] = -1.0f;  // a lone last element in its own block: absmax 1, so its code is -7
  const QuantResult q = Quantize(Kernels(), LossyKind::kInt4, DataType::kFloat32,
                                 FloatBytes(values), nullptr, values.size(), params, 0xee);
  ASSERT_EQ(q.codes.size(), 17u);
  EXPECT_EQ(q.codes[0], 0xd7);
  EXPECT_EQ(q.codes[1], 0x92);
  EXPECT_EQ(q.codes[2], 0x00);
  EXPECT_EQ(q.codes[16], 0x09);  // -7 in the low nibble, high nibble 0
}

TEST_P(KernelIsaTest, NearestRoundsHalfToEven) {
  QuantParams params;
  params.block_size = 32;
  std::vector<float> values(32, 0.0f);
  values[0] = 127.0f;  // inv == 1 exactly
  values[1] = 2.5f;
  values[2] = 3.5f;
  values[3] = -2.5f;
  values[4] = 0.5f;
  const QuantResult q = Quantize(Kernels(), LossyKind::kInt8, DataType::kFloat32,
                                 FloatBytes(values), nullptr, values.size(), params, 0);
  EXPECT_EQ(static_cast<int8_t>(q.codes[1]), 2);
  EXPECT_EQ(static_cast<int8_t>(q.codes[2]), 4);
  EXPECT_EQ(static_cast<int8_t>(q.codes[3]), -2);
  EXPECT_EQ(static_cast<int8_t>(q.codes[4]), 0);
}

// The mean of stochastically rounded copies of one value, over many element indices.
double StochasticMean(const KernelTable& kernels, LossyKind kind, float absmax, float value,
                      size_t blocks, uint64_t seed) {
  const uint32_t block = 32;
  std::vector<float> values(blocks * block, value);
  for (size_t b = 0; b < blocks; ++b) values[b * block] = absmax;
  QuantParams params;
  params.block_size = block;
  params.rounding = Rounding::kStochastic;
  params.seed = seed;
  const QuantResult q = Quantize(kernels, kind, DataType::kFloat32, FloatBytes(values), nullptr,
                                 values.size(), params, 0);
  const std::vector<uint8_t> deq =
      Dequantize(kernels, kind, q.scales, q.codes, values.size(), block, nullptr);
  double sum = 0.0;
  size_t n = 0;
  for (size_t i = 0; i < values.size(); ++i) {
    if (i % block == 0) continue;
    sum += LoadFloat(deq, i);
    ++n;
  }
  return sum / static_cast<double>(n);
}

TEST_P(KernelIsaTest, StochasticRoundingIsUnbiased) {
  struct Case {
    LossyKind kind;
    float absmax;  // chosen so that the scale is exactly 1
    float value;
    double step;  // distance between the two neighbouring grid points
  };
  const Case cases[] = {
      {LossyKind::kInt8, 127.0f, 3.3f, 1.0},
      {LossyKind::kInt8, 127.0f, -100.75f, 1.0},
      {LossyKind::kInt4, 7.0f, 2.7f, 1.0},
      {LossyKind::kFp8, 448.0f, 13.7f, 1.0},          // e4m3 step in [8, 16) is 1
      {LossyKind::kFp8, 448.0f, -0.3f, 1.0 / 32},     // [0.25, 0.5): step 2^-5
      {LossyKind::kFp8, 448.0f, 0.0107f, 1.0 / 512},  // subnormal range: step 2^-9
  };
  const size_t blocks = 1024;  // 31 744 samples per case
  for (const Case& c : cases) {
    SCOPED_TRACE(std::string(KindName(c.kind)) + " value " + std::to_string(c.value));
    const double mean = StochasticMean(Kernels(), c.kind, c.absmax, c.value, blocks, 77);
    const double frac = std::fmod(std::fabs(static_cast<double>(c.value)), c.step) / c.step;
    const double sd = c.step * std::sqrt(frac * (1.0 - frac));
    const double se = sd / std::sqrt(static_cast<double>(blocks * 31));
    EXPECT_NEAR(mean, c.value, 5.0 * se) << "standard error " << se;
    // Nearest rounding would be off by at least this much, so the test can tell them apart.
    ASSERT_GT(std::min(frac, 1.0 - frac) * c.step, 20.0 * se);
  }
}

TEST_P(KernelIsaTest, SameSeedSameBytesDifferentSeedDifferentBytes) {
  const uint32_t block = 256;
  const size_t count = 10 * block + 3;
  const std::vector<float> values = MakeInput(count, block, 3, 7);
  for (LossyKind kind : kKinds) {
    SCOPED_TRACE(KindName(kind));
    QuantParams params;
    params.block_size = block;
    params.rounding = Rounding::kStochastic;
    params.seed = 1234;
    const std::vector<uint8_t> src = FloatBytes(values);
    const QuantResult a =
        Quantize(Kernels(), kind, DataType::kFloat32, src, nullptr, count, params, 0);
    const QuantResult b =
        Quantize(Kernels(), kind, DataType::kFloat32, src, nullptr, count, params, 0xff);
    EXPECT_EQ(a.codes, b.codes);
    params.seed = 1235;
    const QuantResult c =
        Quantize(Kernels(), kind, DataType::kFloat32, src, nullptr, count, params, 0);
    EXPECT_NE(a.codes, c.codes);
    EXPECT_EQ(a.scales, c.scales);  // scales never depend on the seed
    params.seed = 1234;
    params.index_offset = 1;
    const QuantResult d =
        Quantize(Kernels(), kind, DataType::kFloat32, src, nullptr, count, params, 0);
    EXPECT_NE(a.codes, d.codes);
  }
}

TEST_P(KernelIsaTest, ChunkedEncodingDrawsTheSameNumbersAsWhole) {
  const uint32_t block = 64;
  const size_t count = 10 * block + 9;
  const size_t split = 4 * block;  // whole blocks, an even count for int4
  const std::vector<float> values = MakeInput(count, block, 8, 7);
  for (LossyKind kind : kKinds) {
    SCOPED_TRACE(KindName(kind));
    QuantParams params;
    params.block_size = block;
    params.rounding = Rounding::kStochastic;
    params.seed = 99;
    params.index_offset = 1000;
    const QuantResult whole = Quantize(Kernels(), kind, DataType::kFloat32, FloatBytes(values),
                                       nullptr, count, params, 0);
    const std::vector<float> head(values.begin(), values.begin() + split);
    const std::vector<float> tail(values.begin() + split, values.end());
    const QuantResult first = Quantize(Kernels(), kind, DataType::kFloat32, FloatBytes(head),
                                       nullptr, head.size(), params, 0);
    params.index_offset += split;
    const QuantResult second = Quantize(Kernels(), kind, DataType::kFloat32, FloatBytes(tail),
                                        nullptr, tail.size(), params, 0);
    std::vector<uint8_t> joined = first.codes;
    joined.insert(joined.end(), second.codes.begin(), second.codes.end());
    EXPECT_EQ(whole.codes, joined);
  }
}

// ---- The generator ----------------------------------------------------------------------------

TEST(StochasticRng, MatchesThePublishedDefinition) {
  // Values from the definition in rng.h, computed independently (Python); the CUDA kernels must
  // give the same.
  struct Golden {
    uint64_t seed;
    uint64_t index;
    uint32_t bits;
  };
  const Golden golden[] = {
      {0x0ull, 0x0ull, 0x1e27460cu},
      {0x0ull, 0x1ull, 0x67bea44fu},
      {0x0ull, 0xffffffffull, 0x26c2da10u},
      {0x0ull, 0x100000000ull, 0x80b934f7u},
      {0x1ull, 0xffffffffull, 0x90a5784fu},
      {0x123456789abcdefull, 0xfedcba9876543210ull, 0x8d8223eeu},
  };
  for (const Golden& g : golden) {
    EXPECT_EQ(rng::Bits(rng::KeyFromSeed(g.seed), g.index), g.bits)
        << "seed " << g.seed << " index " << g.index;
  }
  EXPECT_EQ(rng::Unit(0xffffffffu), 1.0f - 0x1p-24f);
  EXPECT_EQ(rng::Unit(0xffu), 0.0f);
}

// Mean and a 16-bucket chi-square of Unit over `n` draws from `draw(i)`.
template <typename Draw>
void ExpectUniform(size_t n, Draw draw) {
  double sum = 0.0;
  size_t buckets[16] = {};
  for (size_t i = 0; i < n; ++i) {
    const float u = rng::Unit(draw(i));
    ASSERT_GE(u, 0.0f);
    ASSERT_LT(u, 1.0f);
    sum += u;
    ++buckets[static_cast<int>(u * 16.0f)];
  }
  const double mean = sum / static_cast<double>(n);
  EXPECT_NEAR(mean, 0.5, 5.0 * std::sqrt(1.0 / 12.0 / static_cast<double>(n)));
  const double expected = static_cast<double>(n) / 16.0;
  double chi2 = 0.0;
  for (size_t b : buckets) chi2 += (b - expected) * (b - expected) / expected;
  EXPECT_LT(chi2, 50.0);  // 15 degrees of freedom: P(chi2 > 50) < 1e-5
}

TEST(StochasticRng, UniformOverIndices) {
  const rng::Key key = rng::KeyFromSeed(2024);
  ExpectUniform(200000, [&](size_t i) { return rng::Bits(key, i); });
  // Indices that differ only in the high half.
  ExpectUniform(50000, [&](size_t i) { return rng::Bits(key, uint64_t{i} << 32); });
}

TEST(StochasticRng, UniformOverSeeds) {
  ExpectUniform(50000, [](size_t i) { return rng::Bits(rng::KeyFromSeed(i), 12345); });
  ExpectUniform(50000, [](size_t i) { return rng::Bits(rng::KeyFromSeed(uint64_t{i} << 32), 0); });
}

TEST(StochasticRng, NeighbouringStreamsAreUncorrelated) {
  // The low bit of draws of neighbouring seeds at the same index agrees about half the time.
  const rng::Key a = rng::KeyFromSeed(7);
  const rng::Key b = rng::KeyFromSeed(8);
  const int n = 100000;
  int agree = 0;
  for (int i = 0; i < n; ++i) {
    agree += ((rng::Bits(a, static_cast<uint64_t>(i)) ^ rng::Bits(b, static_cast<uint64_t>(i))) &
              1u) == 0;
  }
  EXPECT_NEAR(agree, n / 2, 5 * std::sqrt(n / 4.0));
}

// ---- ISA selection ---------------------------------------------------------------------------

TEST(CodecIsa, NamesAndSelection) {
  EXPECT_STREQ(IsaName(Isa::kScalar), "scalar");
  EXPECT_STREQ(IsaName(Isa::kAvx2), "avx2");
  EXPECT_STREQ(IsaName(Isa::kAvx512), "avx512");
  EXPECT_LE(static_cast<int>(ActiveIsa()), static_cast<int>(DetectIsa()));
  EXPECT_STREQ(CodecIsaName(), IsaName(ActiveIsa()));
  EXPECT_EQ(&KernelsFor(Isa::kScalar), &ScalarKernels());
  EXPECT_EQ(&ActiveKernels(), &KernelsFor(ActiveIsa()));
}

TEST(CodecIsa, OverrideLowersButNeverRaisesAndWarnsOnNonsense) {
  EXPECT_EQ(ApplyIsaOverride(Isa::kAvx512, nullptr), Isa::kAvx512);
  EXPECT_EQ(ApplyIsaOverride(Isa::kAvx512, ""), Isa::kAvx512);
  EXPECT_EQ(ApplyIsaOverride(Isa::kAvx512, "avx2"), Isa::kAvx2);
  EXPECT_EQ(ApplyIsaOverride(Isa::kAvx512, "scalar"), Isa::kScalar);
  EXPECT_EQ(ApplyIsaOverride(Isa::kAvx2, "avx512"), Isa::kAvx2);
  EXPECT_EQ(ApplyIsaOverride(Isa::kScalar, "avx2"), Isa::kScalar);

  std::vector<std::string> lines;
  const LogLevel saved_level = GetLogLevel();
  if (!LogEnabled(LogLevel::kWarn)) SetLogLevel(LogLevel::kWarn);
  SetLogSink([&](LogLevel level, std::string_view subsystem, std::string_view message) {
    if (level == LogLevel::kWarn && subsystem == "codec") lines.emplace_back(message);
  });
  const Isa got = ApplyIsaOverride(Isa::kAvx2, "sse9");
  SetLogSink(nullptr);
  SetLogLevel(saved_level);
  EXPECT_EQ(got, Isa::kAvx2);
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_NE(lines[0].find("sse9"), std::string::npos) << lines[0];
}

}  // namespace
}  // namespace strait::codec_internal

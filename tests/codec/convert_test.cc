// Tests for the element conversions: each ISA's to_float / from_float kernels against numeric.h
// (every float16 and bfloat16 value, random and special fp32 bit patterns, unaligned buffers),
// and the public ConvertToFloat / ConvertFromFloat, including their argument errors.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "codec/kernels.h"
#include "codec/numeric.h"
#include "strait/codec.h"

namespace strait::codec_internal {
namespace {

class ConvertIsaTest : public ::testing::TestWithParam<Isa> {
 protected:
  void SetUp() override {
    if (static_cast<int>(GetParam()) > static_cast<int>(DetectIsa())) {
      GTEST_SKIP() << "this CPU lacks " << IsaName(GetParam()) << "; only " << IsaName(DetectIsa())
                   << " and below are tested";
    }
  }
  const KernelTable& Kernels() const { return KernelsFor(GetParam()); }
};

std::string IsaParamName(const ::testing::TestParamInfo<Isa>& info) {
  return IsaName(info.param);
}

INSTANTIATE_TEST_SUITE_P(AllIsas, ConvertIsaTest,
                         ::testing::Values(Isa::kScalar, Isa::kAvx2, Isa::kAvx512), IsaParamName);

// Every 16-bit pattern (and a ragged count, so that vector tails run), decoded one byte past an
// aligned address.
void CheckAllHalves(const KernelTable& kernels, DataType type) {
  const size_t count = 65536 + 13;
  std::vector<uint8_t> src(1 + count * 2);
  for (size_t i = 0; i < count; ++i) {
    const auto h = static_cast<uint16_t>(i);
    std::memcpy(src.data() + 1 + 2 * i, &h, 2);
  }
  std::vector<uint8_t> dst(1 + count * 4 + 8, 0xa5);
  auto* out = reinterpret_cast<float*>(dst.data() + 1);
  kernels.to_float(src.data() + 1, type, out, count, /*accumulate=*/false);
  for (size_t i = 0; i < count; ++i) {
    const auto h = static_cast<uint16_t>(i);
    const float want =
        type == DataType::kFloat16 ? numeric::HalfToFloat(h) : numeric::Bf16ToFloat(h);
    uint32_t got;
    std::memcpy(&got, dst.data() + 1 + 4 * i, 4);
    ASSERT_EQ(got, numeric::FloatBits(want)) << "pattern 0x" << std::hex << h;
  }
  for (size_t i = 1 + count * 4; i < dst.size(); ++i) ASSERT_EQ(dst[i], 0xa5) << "overrun";

  // Accumulating: out = out + x, one fp32 add per element.
  std::vector<float> base(count);
  for (size_t i = 0; i < count; ++i) base[i] = static_cast<float>(i % 97) * 0.25f - 12.0f;
  std::memcpy(dst.data() + 1, base.data(), count * 4);
  kernels.to_float(src.data() + 1, type, out, count, /*accumulate=*/true);
  for (size_t i = 0; i < count; ++i) {
    const auto h = static_cast<uint16_t>(i);
    const float x = type == DataType::kFloat16 ? numeric::HalfToFloat(h) : numeric::Bf16ToFloat(h);
    const float want = base[i] + x;
    uint32_t got;
    std::memcpy(&got, dst.data() + 1 + 4 * i, 4);
    if (want != want) {
      ASSERT_EQ(got & 0x7f800000u, 0x7f800000u);
      ASSERT_NE(got & 0x7fffffu, 0u) << "NaN expected for 0x" << std::hex << h;
    } else {
      ASSERT_EQ(got, numeric::FloatBits(want)) << "pattern 0x" << std::hex << h;
    }
  }
}

TEST_P(ConvertIsaTest, EveryFloat16DecodesLikeNumeric) {
  CheckAllHalves(Kernels(), DataType::kFloat16);
}

TEST_P(ConvertIsaTest, EveryBfloat16DecodesLikeNumeric) {
  CheckAllHalves(Kernels(), DataType::kBfloat16);
}

TEST_P(ConvertIsaTest, Float32ToFloatIsACopy) {
  const std::vector<float> v = {1.0f, -0.0f, 3.5e-42f, 1e30f, -7.25f, 0.1f, 2.0f, 3.0f, 4.0f};
  std::vector<uint8_t> src(1 + v.size() * 4);
  std::memcpy(src.data() + 1, v.data(), v.size() * 4);
  std::vector<uint8_t> dst(1 + v.size() * 4);
  Kernels().to_float(src.data() + 1, DataType::kFloat32, reinterpret_cast<float*>(dst.data() + 1),
                     v.size(), false);
  EXPECT_EQ(0, std::memcmp(src.data() + 1, dst.data() + 1, v.size() * 4));
}

// fp32 bit patterns: random ones, and the edges of every rounding decision.
std::vector<uint32_t> InterestingFloatBits() {
  std::vector<uint32_t> bits = {
      0x00000000u, 0x80000000u, 0x7f800000u, 0xff800000u, 0x7fc00000u, 0xffc00000u, 0x7f800001u,
      0xff812345u, 0x7fbfffffu, 0x00000001u, 0x80000001u, 0x007fffffu, 0x00800000u, 0x7f7fffffu,
      0xff7fffffu, 0x477fefffu, 0x477ff000u, 0x477ff001u,  // float16 max and the ties to infinity
      0x33000000u, 0x33000001u, 0x337fffffu,  // float16 smallest subnormal halfway points
      0x38800000u, 0x387fffffu, 0x38801000u,  // float16 subnormal / normal boundary
      0x3f808000u, 0x3f818000u, 0x3f807fffu,  // bfloat16 ties (even and odd)
      0x7f7f8000u, 0x7f7fffffu,               // bfloat16 rounding to infinity
  };
  std::mt19937_64 gen(17);
  for (int i = 0; i < 300000; ++i) bits.push_back(static_cast<uint32_t>(gen()));
  // Neighbourhoods of halfway points, where rounding decides.
  for (int i = 0; i < 20000; ++i) {
    const uint32_t base = static_cast<uint32_t>(gen()) & ~0x1fffu;
    bits.push_back(base | 0x1000u);               // float16 tie
    bits.push_back((base & ~0xffffu) | 0x8000u);  // bfloat16 tie
  }
  return bits;
}

TEST_P(ConvertIsaTest, FromFloatRoundsLikeNumeric) {
  const std::vector<uint32_t> bits = InterestingFloatBits();
  const size_t count = bits.size();
  std::vector<uint8_t> src(1 + count * 4);
  std::memcpy(src.data() + 1, bits.data(), count * 4);
  const auto* in = reinterpret_cast<const float*>(src.data() + 1);
  for (DataType type : {DataType::kFloat16, DataType::kBfloat16, DataType::kFloat32}) {
    SCOPED_TRACE(DataTypeName(type));
    const size_t width = type == DataType::kFloat32 ? 4 : 2;
    std::vector<uint8_t> dst(1 + count * width + 8, 0xa5);
    Kernels().from_float(in, dst.data() + 1, type, count);
    for (size_t i = 0; i < count; ++i) {
      if (type == DataType::kFloat32) {
        uint32_t got;
        std::memcpy(&got, dst.data() + 1 + 4 * i, 4);
        ASSERT_EQ(got, bits[i]) << i;
        continue;
      }
      const float f = numeric::BitsFloat(bits[i]);
      const uint16_t want =
          type == DataType::kFloat16 ? numeric::FloatToHalf(f) : numeric::FloatToBf16(f);
      uint16_t got;
      std::memcpy(&got, dst.data() + 1 + 2 * i, 2);
      ASSERT_EQ(got, want) << "input 0x" << std::hex << bits[i];
    }
    for (size_t i = 1 + count * width; i < dst.size(); ++i) ASSERT_EQ(dst[i], 0xa5) << "overrun";
  }
}

TEST_P(ConvertIsaTest, ShortAndEmptyCallsTouchNothingElse) {
  for (size_t count : {0, 1, 7, 15, 17, 33}) {
    std::vector<float> in(count, 1.5f);
    std::vector<uint8_t> out(count * 2 + 4, 0xa5);
    Kernels().from_float(in.data(), out.data(), DataType::kBfloat16, count);
    for (size_t i = 0; i < count; ++i) {
      EXPECT_EQ(out[2 * i], 0xc0);
      EXPECT_EQ(out[2 * i + 1], 0x3f);
    }
    for (size_t i = count * 2; i < out.size(); ++i) EXPECT_EQ(out[i], 0xa5);
  }
}

}  // namespace
}  // namespace strait::codec_internal

namespace strait {
namespace {

TEST(ConvertApi, RoundTripsThroughEveryFloatType) {
  const std::vector<float> v = {0.0f, -1.0f, 0.5f, 65504.0f, 1e-3f, 3.0f, -2.25f, 100.0f};
  for (DataType type : {DataType::kFloat32, DataType::kBfloat16, DataType::kFloat16}) {
    SCOPED_TRACE(DataTypeName(type));
    std::vector<uint8_t> narrow(v.size() * 4);
    ASSERT_TRUE(ConvertFromFloat(v.data(), narrow.data(), type, v.size()).ok());
    std::vector<float> back(v.size());
    ASSERT_TRUE(ConvertToFloat(narrow.data(), type, back.data(), v.size()).ok());
    for (size_t i = 0; i < v.size(); ++i) {
      const float want = type == DataType::kFloat32 ? v[i]
                         : type == DataType::kFloat16
                             ? numeric::HalfToFloat(numeric::FloatToHalf(v[i]))
                             : numeric::Bf16ToFloat(numeric::FloatToBf16(v[i]));
      EXPECT_EQ(back[i], want) << i;
    }
  }
}

TEST(ConvertApi, RejectsNonFloatTypesByName) {
  float f = 1.0f;
  uint8_t b[8] = {};
  const Status to = ConvertToFloat(b, DataType::kInt32, &f, 1);
  EXPECT_EQ(to.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(to.message().find("int32"), std::string::npos) << to.message();
  const Status from = ConvertFromFloat(&f, b, DataType::kFloat8E4M3, 1);
  EXPECT_EQ(from.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(from.message().find(DataTypeName(DataType::kFloat8E4M3)), std::string::npos)
      << from.message();
  EXPECT_EQ(ConvertToFloat(b, DataType::kFloat64, &f, 1).code(), StatusCode::kInvalidArgument);
  // An empty conversion of a valid type needs no buffers.
  EXPECT_TRUE(ConvertToFloat(nullptr, DataType::kFloat16, nullptr, 0).ok());
  EXPECT_TRUE(ConvertFromFloat(nullptr, nullptr, DataType::kBfloat16, 0).ok());
}

}  // namespace
}  // namespace strait

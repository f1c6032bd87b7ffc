// Tests for strait::ReduceInPlace and DivideInPlace: every data type x op against a reference
// computed here element by element, hand-checked special values (NaN, infinities, signed zeros,
// integer wrap-around, saturation), sizes and unaligned or aliased buffers, byte identity of every
// instruction-set table with the scalar one, and argument errors.
#include "strait/reduce.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "codec/numeric.h"
#include "strait/status.h"
#include "strait/types.h"

// Instantiated here only to check the select-form conversions against numeric.h.
#define STRAIT_REDUCE_NS reduce_test
#include "codec/reduce_impl.h"

namespace strait {
namespace {

namespace ci = codec_internal;
namespace nm = numeric;

using Bytes = std::vector<uint8_t>;

constexpr ReduceOp kOps[] = {ReduceOp::kSum, ReduceOp::kProd, ReduceOp::kMax, ReduceOp::kMin};

std::vector<DataType> AllTypes() {
  std::vector<DataType> types;
  for (int i = 0; i < kNumDataTypes; ++i) types.push_back(static_cast<DataType>(i));
  return types;
}

template <typename T>
T Load(const uint8_t* p, size_t i) {
  T v;
  std::memcpy(&v, p + i * sizeof(T), sizeof(T));
  return v;
}

template <typename T>
void Store(uint8_t* p, size_t i, T v) {
  std::memcpy(p + i * sizeof(T), &v, sizeof(T));
}

template <typename To, typename From>
To BitCast(From f) {
  static_assert(sizeof(To) == sizeof(From));
  To t;
  std::memcpy(&t, &f, sizeof(t));
  return t;
}

// ---- Reference ----------------------------------------------------------------------------------

// Integers: the exact result reduced modulo 2^64 and then truncated, which is two's-complement
// wrap for every width (C++20 defines the narrowing conversion as modular).
template <typename T>
T RefInt(ReduceOp op, T a, T b) {
  using Wide = std::conditional_t<std::is_signed_v<T>, int64_t, uint64_t>;
  const auto ua = static_cast<uint64_t>(static_cast<Wide>(a));
  const auto ub = static_cast<uint64_t>(static_cast<Wide>(b));
  switch (op) {
    case ReduceOp::kSum: return static_cast<T>(ua + ub);
    case ReduceOp::kProd: return static_cast<T>(ua * ub);
    case ReduceOp::kMax: return std::max(a, b);
    default: return std::min(a, b);
  }
}

template <typename F>
F Quiet(F f) {
  using U = std::conditional_t<sizeof(F) == 4, uint32_t, uint64_t>;
  const U quiet = U{1} << (sizeof(F) == 4 ? 22 : 51);
  return BitCast<F>(static_cast<U>(BitCast<U>(f) | quiet));
}

// The documented float semantics, written the obvious way (a is the inout operand).
template <typename F>
F RefFloat(ReduceOp op, F a, F b) {
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kProd:
      if (std::isnan(a)) return Quiet(a);
      if (std::isnan(b)) return Quiet(b);
      return op == ReduceOp::kSum ? a + b : a * b;
    case ReduceOp::kMax:
      if (std::isnan(a)) return a;
      if (std::isnan(b)) return b;
      if (a == 0 && b == 0) return std::signbit(a) ? b : a;
      return a > b ? a : b;
    default:
      if (std::isnan(a)) return a;
      if (std::isnan(b)) return b;
      if (a == 0 && b == 0) return std::signbit(a) ? a : b;
      return a < b ? a : b;
  }
}

template <typename S, float (*kToFloat)(S), S (*kFromFloat)(float)>
S RefNarrow(ReduceOp op, S a, S b) {
  return kFromFloat(RefFloat<float>(op, kToFloat(a), kToFloat(b)));
}

template <typename T, typename Fn>
void RefLoop(const uint8_t* in, uint8_t* inout, size_t n, Fn fn) {
  for (size_t i = 0; i < n; ++i) Store<T>(inout, i, fn(Load<T>(inout, i), Load<T>(in, i)));
}

// inout after ReduceInPlace(type, op, in, inout, n), computed element by element.
Bytes Reference(DataType type, ReduceOp op, const uint8_t* in, const uint8_t* inout, size_t n) {
  Bytes out(inout, inout + n * DataTypeSize(type));
  uint8_t* o = out.data();
  auto ints = [&](auto tag) {
    using T = decltype(tag);
    RefLoop<T>(in, o, n, [op](T a, T b) { return RefInt<T>(op, a, b); });
  };
  auto floats = [&](auto tag) {
    using F = decltype(tag);
    RefLoop<F>(in, o, n, [op](F a, F b) { return RefFloat<F>(op, a, b); });
  };
  switch (type) {
    case DataType::kInt8: ints(int8_t{}); break;
    case DataType::kUint8: ints(uint8_t{}); break;
    case DataType::kInt32: ints(int32_t{}); break;
    case DataType::kUint32: ints(uint32_t{}); break;
    case DataType::kInt64: ints(int64_t{}); break;
    case DataType::kUint64: ints(uint64_t{}); break;
    case DataType::kFloat32: floats(float{}); break;
    case DataType::kFloat64: floats(double{}); break;
    case DataType::kFloat16:
      RefLoop<uint16_t>(in, o, n, [op](uint16_t a, uint16_t b) {
        return RefNarrow<uint16_t, nm::HalfToFloat, nm::FloatToHalf>(op, a, b);
      });
      break;
    case DataType::kBfloat16:
      RefLoop<uint16_t>(in, o, n, [op](uint16_t a, uint16_t b) {
        return RefNarrow<uint16_t, nm::Bf16ToFloat, nm::FloatToBf16>(op, a, b);
      });
      break;
    case DataType::kFloat8E4M3:
      RefLoop<uint8_t>(in, o, n, [op](uint8_t a, uint8_t b) {
        return RefNarrow<uint8_t, nm::E4m3ToFloat, nm::FloatToE4m3>(op, a, b);
      });
      break;
    case DataType::kFloat8E5M2:
      RefLoop<uint8_t>(in, o, n, [op](uint8_t a, uint8_t b) {
        return RefNarrow<uint8_t, nm::E5m2ToFloat, nm::FloatToE5m2>(op, a, b);
      });
      break;
  }
  return out;
}

// Divides the way DivideInPlace documents, element by element.
Bytes DivideReference(DataType type, const uint8_t* data, size_t n, uint64_t d) {
  Bytes out(data, data + n * DataTypeSize(type));
  uint8_t* o = out.data();
  auto ints = [&](auto tag) {
    using T = decltype(tag);
    for (size_t i = 0; i < n; ++i) {
      const T x = Load<T>(o, i);
      T q;
      if constexpr (std::is_signed_v<T>) {
        // Truncation toward zero; a divisor beyond the type's range gives 0 except for
        // INT64_MIN / 2^63 == -1.
        if (d > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
          q = (x == std::numeric_limits<int64_t>::min() && d == (uint64_t{1} << 63)) ? T(-1) : T(0);
        } else {
          q = static_cast<T>(static_cast<int64_t>(x) / static_cast<int64_t>(d));
        }
      } else {
        q = static_cast<T>(x / d);
      }
      Store<T>(o, i, q);
    }
  };
  auto narrow = [&](auto tag, auto to_float, auto from_float) {
    using S = decltype(tag);
    for (size_t i = 0; i < n; ++i) {
      Store<S>(o, i, from_float(to_float(Load<S>(o, i)) / static_cast<float>(d)));
    }
  };
  switch (type) {
    case DataType::kInt8: ints(int8_t{}); break;
    case DataType::kUint8: ints(uint8_t{}); break;
    case DataType::kInt32: ints(int32_t{}); break;
    case DataType::kUint32: ints(uint32_t{}); break;
    case DataType::kInt64: ints(int64_t{}); break;
    case DataType::kUint64: ints(uint64_t{}); break;
    case DataType::kFloat32:
      for (size_t i = 0; i < n; ++i) Store(o, i, Load<float>(o, i) / static_cast<float>(d));
      break;
    case DataType::kFloat64:
      for (size_t i = 0; i < n; ++i) Store(o, i, Load<double>(o, i) / static_cast<double>(d));
      break;
    case DataType::kFloat16: narrow(uint16_t{}, nm::HalfToFloat, nm::FloatToHalf); break;
    case DataType::kBfloat16: narrow(uint16_t{}, nm::Bf16ToFloat, nm::FloatToBf16); break;
    case DataType::kFloat8E4M3: narrow(uint8_t{}, nm::E4m3ToFloat, nm::FloatToE4m3); break;
    case DataType::kFloat8E5M2: narrow(uint8_t{}, nm::E5m2ToFloat, nm::FloatToE5m2); break;
  }
  return out;
}

// ---- Inputs -----------------------------------------------------------------------------------

// Values worth hitting on purpose: zeros of both signs, infinities, quiet and signalling NaNs of
// both signs, extremes, the smallest subnormal and normal, +-1.
Bytes Specials(DataType type) {
  Bytes out;
  auto add = [&out](auto v) {
    const auto* p = reinterpret_cast<const uint8_t*>(&v);
    out.insert(out.end(), p, p + sizeof(v));
  };
  switch (type) {
    case DataType::kInt8:
      for (int8_t v : {0, 1, -1, 2, 127, -128, -127}) add(v);
      break;
    case DataType::kUint8:
      for (uint8_t v : {0, 1, 2, 127, 128, 255}) add(v);
      break;
    case DataType::kInt32:
      for (int32_t v : {0, 1, -1, 2, INT32_MAX, INT32_MIN, 46341}) add(v);
      break;
    case DataType::kUint32:
      for (uint32_t v : {0u, 1u, 2u, 0x80000000u, 0xffffffffu, 65536u}) add(v);
      break;
    case DataType::kInt64:
      for (int64_t v :
           {int64_t{0}, int64_t{1}, int64_t{-1}, INT64_MAX, INT64_MIN, int64_t{1} << 32})
        add(v);
      break;
    case DataType::kUint64:
      for (uint64_t v :
           {uint64_t{0}, uint64_t{1}, UINT64_MAX, uint64_t{1} << 63, uint64_t{1} << 32})
        add(v);
      break;
    case DataType::kFloat32:
      for (uint32_t v : {0x00000000u, 0x80000000u, 0x7f800000u, 0xff800000u, 0x7fc00000u,
                         0xffc00001u, 0x7f800001u, 0xff812345u, 0x7f7fffffu, 0xff7fffffu,
                         0x00000001u, 0x80800000u, 0x3f800000u, 0xbf800000u})
        add(v);
      break;
    case DataType::kFloat64:
      for (uint64_t v : {0x0ull, 0x8000000000000000ull, 0x7ff0000000000000ull,
                         0xfff0000000000000ull, 0x7ff8000000000000ull, 0xfff8000000000001ull,
                         0x7ff0000000000001ull, 0x7fefffffffffffffull, 0x0000000000000001ull,
                         0x8010000000000000ull, 0x3ff0000000000000ull, 0xbff0000000000000ull})
        add(v);
      break;
    case DataType::kFloat16:
      for (uint16_t v : {0x0000, 0x8000, 0x7c00, 0xfc00, 0x7e00, 0xfe01, 0x7c01, 0xfd55, 0x7bff,
                         0xfbff, 0x0001, 0x8400, 0x3c00, 0xbc00})
        add(v);
      break;
    case DataType::kBfloat16:
      for (uint16_t v : {0x0000, 0x8000, 0x7f80, 0xff80, 0x7fc0, 0xffc1, 0x7f81, 0xff95, 0x7f7f,
                         0xff7f, 0x0001, 0x8080, 0x3f80, 0xbf80})
        add(v);
      break;
    case DataType::kFloat8E4M3:
      for (uint8_t v : {0x00, 0x80, 0x7f, 0xff, 0x7e, 0xfe, 0x01, 0x88, 0x38, 0xb8}) add(v);
      break;
    case DataType::kFloat8E5M2:
      for (uint8_t v :
           {0x00, 0x80, 0x7c, 0xfc, 0x7e, 0xff, 0x7d, 0xfd, 0x7b, 0xfb, 0x01, 0x84, 0x3c, 0xbc})
        add(v);
      break;
  }
  return out;
}

// One "ordinary" element: a small integer, or a float in [-8, 8] rounded to the type.
void AddOrdinary(DataType type, std::mt19937_64& rng, uint8_t* dst) {
  const int64_t small = static_cast<int64_t>(rng() % 41) - 20;
  const float f = static_cast<float>(static_cast<int64_t>(rng() % 2001) - 1000) / 125.0f;
  switch (type) {
    case DataType::kInt8: Store(dst, 0, static_cast<int8_t>(small)); break;
    case DataType::kUint8: Store(dst, 0, static_cast<uint8_t>(small + 20)); break;
    case DataType::kInt32: Store(dst, 0, static_cast<int32_t>(small)); break;
    case DataType::kUint32: Store(dst, 0, static_cast<uint32_t>(small + 20)); break;
    case DataType::kInt64: Store(dst, 0, small); break;
    case DataType::kUint64: Store(dst, 0, static_cast<uint64_t>(small + 20)); break;
    case DataType::kFloat32: Store(dst, 0, f); break;
    case DataType::kFloat64: Store(dst, 0, static_cast<double>(f) / 3.0); break;
    case DataType::kFloat16: Store(dst, 0, nm::FloatToHalf(f)); break;
    case DataType::kBfloat16: Store(dst, 0, nm::FloatToBf16(f)); break;
    case DataType::kFloat8E4M3: Store(dst, 0, nm::FloatToE4m3(f)); break;
    case DataType::kFloat8E5M2: Store(dst, 0, nm::FloatToE5m2(f)); break;
  }
}

// n elements: 40% random bit patterns (every NaN payload, subnormal, ...), 40% ordinary values,
// 20% specials.
Bytes MakeInput(DataType type, size_t n, uint64_t seed) {
  const size_t size = DataTypeSize(type);
  const Bytes specials = Specials(type);
  const size_t num_specials = specials.size() / size;
  std::mt19937_64 rng(seed);
  Bytes out(n * size);
  for (size_t i = 0; i < n; ++i) {
    uint8_t* dst = out.data() + i * size;
    const uint64_t pick = rng() % 10;
    if (pick < 4) {
      const uint64_t bits = rng();
      std::memcpy(dst, &bits, size);
    } else if (pick < 8) {
      AddOrdinary(type, rng, dst);
    } else {
      std::memcpy(dst, specials.data() + (rng() % num_specials) * size, size);
    }
  }
  return out;
}

// "" when equal, else where and how `got` first differs from `want`.
std::string FirstDifference(const Bytes& want, const uint8_t* got, size_t elem) {
  for (size_t i = 0; i < want.size(); ++i) {
    if (want[i] == got[i]) continue;
    const size_t e = i / elem;
    std::string msg =
        "element " + std::to_string(e) + " of " + std::to_string(want.size() / elem) + ": want 0x";
    char buf[8];
    for (size_t b = elem; b-- > 0;) {
      std::snprintf(buf, sizeof(buf), "%02x", want[e * elem + b]);
      msg += buf;
    }
    msg += " got 0x";
    for (size_t b = elem; b-- > 0;) {
      std::snprintf(buf, sizeof(buf), "%02x", got[e * elem + b]);
      msg += buf;
    }
    return msg;
  }
  return "";
}

// A byte buffer holding `data` at `offset` bytes past a 64-byte boundary, so that tests choose
// the misalignment.
class OffsetBuffer {
 public:
  OffsetBuffer(const Bytes& data, size_t offset)
      : storage_(data.size() + offset + 64), offset_(offset) {
    const auto addr = reinterpret_cast<uintptr_t>(storage_.data());
    start_ = ((64 - addr % 64) % 64) + offset_;
    if (!data.empty()) std::memcpy(get(), data.data(), data.size());
  }
  uint8_t* get() { return storage_.data() + start_; }

 private:
  Bytes storage_;
  size_t offset_;
  size_t start_ = 0;
};

std::string TypeName(const testing::TestParamInfo<DataType>& info) {
  return DataTypeName(info.param);
}

// ---- Public API against the reference ---------------------------------------------------------

class ReduceTypeTest : public testing::TestWithParam<DataType> {};

TEST_P(ReduceTypeTest, MatchesReferenceForEveryOpAndSize) {
  const DataType type = GetParam();
  const size_t elem = DataTypeSize(type);
  for (const ReduceOp op : kOps) {
    for (const size_t n : {size_t{0}, size_t{1}, size_t{7}, size_t{63}, size_t{64}, size_t{1000}}) {
      SCOPED_TRACE(std::string(ReduceOpName(op)) + " n=" + std::to_string(n));
      const Bytes in = MakeInput(type, n, 1000 + n);
      const Bytes inout = MakeInput(type, n, 2000 + n);
      const Bytes want = Reference(type, op, in.data(), inout.data(), n);
      // Misaligned for every element size; a different misalignment for each buffer.
      OffsetBuffer a(in, 1), b(inout, 3);
      ASSERT_TRUE(ReduceInPlace(type, op, a.get(), b.get(), n).ok());
      EXPECT_EQ(FirstDifference(want, b.get(), elem), "");
    }
  }
}

TEST_P(ReduceTypeTest, InPlaceWithItselfMatchesReference) {
  const DataType type = GetParam();
  const size_t elem = DataTypeSize(type);
  for (const ReduceOp op : kOps) {
    for (const size_t n : {size_t{1}, size_t{63}, size_t{1000}}) {
      SCOPED_TRACE(std::string(ReduceOpName(op)) + " n=" + std::to_string(n));
      const Bytes data = MakeInput(type, n, 3000 + n);
      const Bytes want = Reference(type, op, data.data(), data.data(), n);
      OffsetBuffer buf(data, 5);
      ASSERT_TRUE(ReduceInPlace(type, op, buf.get(), buf.get(), n).ok());
      EXPECT_EQ(FirstDifference(want, buf.get(), elem), "");
    }
  }
}

TEST_P(ReduceTypeTest, DivideMatchesReference) {
  const DataType type = GetParam();
  const size_t elem = DataTypeSize(type);
  for (const uint64_t d : {uint64_t{1}, uint64_t{2}, uint64_t{3}, uint64_t{7}, uint64_t{255},
                           uint64_t{1} << 40, uint64_t{1} << 63, UINT64_MAX}) {
    for (const size_t n : {size_t{0}, size_t{1}, size_t{63}, size_t{1000}}) {
      SCOPED_TRACE("divisor=" + std::to_string(d) + " n=" + std::to_string(n));
      const Bytes data = MakeInput(type, n, 4000 + n);
      const Bytes want = DivideReference(type, data.data(), n, d);
      OffsetBuffer buf(data, 1);
      ASSERT_TRUE(DivideInPlace(type, buf.get(), n, d).ok());
      EXPECT_EQ(FirstDifference(want, buf.get(), elem), "");
    }
  }
}

INSTANTIATE_TEST_SUITE_P(AllTypes, ReduceTypeTest, testing::ValuesIn(AllTypes()), TypeName);

TEST(Reduce, LargeFloat32SumMatchesReference) {
  constexpr size_t kN = 1000003;
  const Bytes in = MakeInput(DataType::kFloat32, kN, 11);
  const Bytes inout = MakeInput(DataType::kFloat32, kN, 12);
  const Bytes want = Reference(DataType::kFloat32, ReduceOp::kSum, in.data(), inout.data(), kN);
  OffsetBuffer a(in, 2), b(inout, 0);
  ASSERT_TRUE(ReduceInPlace(DataType::kFloat32, ReduceOp::kSum, a.get(), b.get(), kN).ok());
  EXPECT_EQ(FirstDifference(want, b.get(), 4), "");
}

// ---- Hand-checked values (independent of the reference above) ---------------------------------

template <typename T>
std::vector<T> Reduce(DataType type, ReduceOp op, std::vector<T> inout, const std::vector<T>& in) {
  EXPECT_EQ(in.size(), inout.size());
  const Status s = ReduceInPlace(type, op, in.data(), inout.data(), in.size());
  EXPECT_TRUE(s.ok()) << s;
  return inout;
}

TEST(Reduce, IntegersWrapAround) {
  using V8 = std::vector<int8_t>;
  EXPECT_EQ(Reduce<int8_t>(DataType::kInt8, ReduceOp::kSum, {127, -128, -1}, {1, -1, -128}),
            (V8{-128, 127, 127}));
  EXPECT_EQ(Reduce<int8_t>(DataType::kInt8, ReduceOp::kProd, {-128, 16, -1}, {-1, 16, -128}),
            (V8{-128, 0, -128}));
  EXPECT_EQ(Reduce<uint8_t>(DataType::kUint8, ReduceOp::kSum, {255, 200}, {1, 100}),
            (std::vector<uint8_t>{0, 44}));
  EXPECT_EQ(Reduce<uint8_t>(DataType::kUint8, ReduceOp::kProd, {255, 16}, {255, 16}),
            (std::vector<uint8_t>{1, 0}));
  EXPECT_EQ(Reduce<int32_t>(DataType::kInt32, ReduceOp::kSum, {INT32_MAX}, {1}),
            (std::vector<int32_t>{INT32_MIN}));
  EXPECT_EQ(Reduce<int32_t>(DataType::kInt32, ReduceOp::kProd, {46341, INT32_MIN}, {46341, -1}),
            (std::vector<int32_t>{-2147479015, INT32_MIN}));
  EXPECT_EQ(Reduce<uint32_t>(DataType::kUint32, ReduceOp::kProd, {65536u}, {65536u}),
            (std::vector<uint32_t>{0u}));
  EXPECT_EQ(Reduce<int64_t>(DataType::kInt64, ReduceOp::kProd, {INT64_MIN, INT64_MAX}, {-1, 2}),
            (std::vector<int64_t>{INT64_MIN, -2}));
  EXPECT_EQ(Reduce<int64_t>(DataType::kInt64, ReduceOp::kSum, {INT64_MIN}, {-1}),
            (std::vector<int64_t>{INT64_MAX}));
  EXPECT_EQ(Reduce<uint64_t>(DataType::kUint64, ReduceOp::kSum, {UINT64_MAX}, {2}),
            (std::vector<uint64_t>{1}));
  EXPECT_EQ(Reduce<uint64_t>(DataType::kUint64, ReduceOp::kProd, {UINT64_MAX}, {UINT64_MAX}),
            (std::vector<uint64_t>{1}));
}

TEST(Reduce, IntegerMaxMinUseTheElementsSignedness) {
  EXPECT_EQ(Reduce<int8_t>(DataType::kInt8, ReduceOp::kMax, {-1, -128}, {0, 127}),
            (std::vector<int8_t>{0, 127}));
  EXPECT_EQ(Reduce<uint8_t>(DataType::kUint8, ReduceOp::kMax, {255, 0}, {0, 128}),
            (std::vector<uint8_t>{255, 128}));
  EXPECT_EQ(Reduce<int32_t>(DataType::kInt32, ReduceOp::kMin, {-1, INT32_MAX}, {0, INT32_MIN}),
            (std::vector<int32_t>{-1, INT32_MIN}));
  EXPECT_EQ(Reduce<uint32_t>(DataType::kUint32, ReduceOp::kMin, {0xffffffffu}, {1u}),
            (std::vector<uint32_t>{1u}));
  EXPECT_EQ(Reduce<int64_t>(DataType::kInt64, ReduceOp::kMax, {INT64_MIN, -5}, {INT64_MAX, -6}),
            (std::vector<int64_t>{INT64_MAX, -5}));
  EXPECT_EQ(Reduce<uint64_t>(DataType::kUint64, ReduceOp::kMax, {UINT64_MAX}, {1}),
            (std::vector<uint64_t>{UINT64_MAX}));
}

template <typename F>
void CheckFloatSpecials(DataType type) {
  constexpr F kInf = std::numeric_limits<F>::infinity();
  constexpr F kNan = std::numeric_limits<F>::quiet_NaN();
  // max/min propagate NaN from either side (std::max would not).
  for (const ReduceOp op : {ReduceOp::kMax, ReduceOp::kMin, ReduceOp::kSum, ReduceOp::kProd}) {
    SCOPED_TRACE(ReduceOpName(op));
    const auto r = Reduce<F>(type, op, {kNan, F(1), kNan, -kInf}, {F(1), kNan, -kInf, kNan});
    for (const F v : r) EXPECT_TRUE(std::isnan(v));
  }
  // Signed zeros: max gives +0 and min gives -0, whichever operand holds which.
  const auto mx = Reduce<F>(type, ReduceOp::kMax, {F(-0.0), F(0.0)}, {F(0.0), F(-0.0)});
  const auto mn = Reduce<F>(type, ReduceOp::kMin, {F(-0.0), F(0.0)}, {F(0.0), F(-0.0)});
  for (int i = 0; i < 2; ++i) {
    EXPECT_FALSE(std::signbit(mx[i])) << i;
    EXPECT_TRUE(std::signbit(mn[i])) << i;
  }
  EXPECT_EQ(Reduce<F>(type, ReduceOp::kMax, {-kInf, F(3)}, {F(-5), kInf}),
            (std::vector<F>{F(-5), kInf}));
  EXPECT_EQ(Reduce<F>(type, ReduceOp::kMin, {-kInf, F(3)}, {F(-5), kInf}),
            (std::vector<F>{-kInf, F(3)}));
  const auto sum = Reduce<F>(type, ReduceOp::kSum, {kInf, std::numeric_limits<F>::max(), F(-0.0)},
                             {-kInf, std::numeric_limits<F>::max(), F(-0.0)});
  EXPECT_TRUE(std::isnan(sum[0]));
  EXPECT_EQ(sum[1], kInf);
  EXPECT_TRUE(sum[2] == 0 && std::signbit(sum[2]));
  const auto prod = Reduce<F>(type, ReduceOp::kProd, {F(0), F(-2), F(0.1)}, {kInf, F(0), F(3)});
  EXPECT_TRUE(std::isnan(prod[0]));
  EXPECT_TRUE(prod[1] == 0 && std::signbit(prod[1]));
  EXPECT_EQ(prod[2], F(0.1) * F(3));
  // NaN + NaN keeps inout's NaN (quieted): checks the documented, ISA-independent choice.
  F nan_a;  // signalling, with a payload
  if constexpr (sizeof(F) == 4) {
    nan_a = BitCast<F>(uint32_t{0x7fa00001});
  } else {
    nan_a = BitCast<F>(uint64_t{0x7ff4000000000001});
  }
  const F nan_b = -kNan;
  const F quiet_a = Quiet(nan_a);
  const auto nn = Reduce<F>(type, ReduceOp::kSum, {nan_a, nan_b}, {nan_b, nan_a});
  EXPECT_EQ(std::memcmp(&nn[0], &quiet_a, sizeof(F)), 0);
  EXPECT_EQ(std::memcmp(&nn[1], &nan_b, sizeof(F)), 0);
}

TEST(Reduce, Float32Specials) {
  CheckFloatSpecials<float>(DataType::kFloat32);
}
TEST(Reduce, Float64Specials) {
  CheckFloatSpecials<double>(DataType::kFloat64);
}

TEST(Reduce, Float16Values) {
  using V = std::vector<uint16_t>;
  const auto t = DataType::kFloat16;
  EXPECT_EQ(Reduce<uint16_t>(t, ReduceOp::kSum, {0x3c00, 0x7bff, 0x3c00, 0x3c01, 0x0001},
                             {0x3c00, 0x7bff, 0x1000, 0x1000, 0x8001}),
            // 1+1=2; 65504+65504 overflows; 1 + 2^-11 ties to even (1); 1.000977 + 2^-11 ties up;
            // 2^-24 - 2^-24 = +0.
            (V{0x4000, 0x7c00, 0x3c00, 0x3c02, 0x0000}));
  EXPECT_EQ(
      Reduce<uint16_t>(t, ReduceOp::kProd, {0x4000, 0x0001, 0xc000}, {0x3800, 0x3800, 0x8000}),
      // 2*0.5=1; 2^-24 * 0.5 ties to even (0); -2 * -0 = +0.
      (V{0x3c00, 0x0000, 0x0000}));
  EXPECT_EQ(Reduce<uint16_t>(t, ReduceOp::kMax, {0x8000, 0x0000, 0xfc00, 0x7e00},
                             {0x0000, 0x8000, 0x8001, 0x3c00}),
            (V{0x0000, 0x0000, 0x8001, 0x7e00}));
  EXPECT_EQ(Reduce<uint16_t>(t, ReduceOp::kMin, {0x8000, 0x0000, 0x3c00}, {0x0000, 0x8000, 0x7d00}),
            // A signalling NaN comes out quiet, payload kept.
            (V{0x8000, 0x8000, 0x7f00}));
}

TEST(Reduce, Bfloat16Values) {
  using V = std::vector<uint16_t>;
  const auto t = DataType::kBfloat16;
  EXPECT_EQ(Reduce<uint16_t>(t, ReduceOp::kSum, {0x3f80, 0x7f7f, 0x3f80, 0x3f81},
                             {0x3f80, 0x7f7f, 0x3b80, 0x3b80}),
            // 1+1=2; max+max overflows; 1 + 2^-8 ties to even; (1+2^-7) + 2^-8 ties up.
            (V{0x4000, 0x7f80, 0x3f80, 0x3f82}));
  EXPECT_EQ(Reduce<uint16_t>(t, ReduceOp::kMax, {0x8000, 0xff80, 0x7fc1}, {0x0000, 0x0001, 0x3f80}),
            (V{0x0000, 0x0001, 0x7fc1}));
}

TEST(Reduce, Fp8Values) {
  using V = std::vector<uint8_t>;
  // e4m3: 1+1=2; 448+448 saturates at 448; NaN stays NaN; -448 - 448 saturates at -448.
  EXPECT_EQ(Reduce<uint8_t>(DataType::kFloat8E4M3, ReduceOp::kSum, {0x38, 0x7e, 0x7f, 0xfe},
                            {0x38, 0x7e, 0x38, 0xfe}),
            (V{0x40, 0x7e, 0x7f, 0xfe}));
  EXPECT_EQ(Reduce<uint8_t>(DataType::kFloat8E4M3, ReduceOp::kMin, {0x80, 0x00, 0x01},
                            {0x00, 0x80, 0xff}),
            (V{0x80, 0x80, 0xff}));
  // e5m2: 1+1=2; 57344+57344 overflows to infinity; inf - inf is NaN; max(-0, +0) = +0.
  const auto r = Reduce<uint8_t>(DataType::kFloat8E5M2, ReduceOp::kSum, {0x3c, 0x7b, 0x7c},
                                 {0x3c, 0x7b, 0xfc});
  EXPECT_EQ(r[0], 0x40);
  EXPECT_EQ(r[1], 0x7c);
  EXPECT_TRUE((r[2] & 0x7c) == 0x7c && (r[2] & 0x03) != 0) << int{r[2]};
  EXPECT_EQ(Reduce<uint8_t>(DataType::kFloat8E5M2, ReduceOp::kMax, {0x80}, {0x00}), V{0x00});
}

TEST(Reduce, DivideValues) {
  std::vector<int32_t> i32 = {7, -7, INT32_MIN, 1};
  ASSERT_TRUE(DivideInPlace(DataType::kInt32, i32.data(), i32.size(), 2).ok());
  EXPECT_EQ(i32, (std::vector<int32_t>{3, -3, INT32_MIN / 2, 0}));
  std::vector<int8_t> i8 = {-128, 127};
  ASSERT_TRUE(DivideInPlace(DataType::kInt8, i8.data(), i8.size(), 3).ok());
  EXPECT_EQ(i8, (std::vector<int8_t>{-42, 42}));
  std::vector<int64_t> i64 = {INT64_MIN, INT64_MIN, INT64_MAX};
  ASSERT_TRUE(DivideInPlace(DataType::kInt64, i64.data(), 1, uint64_t{1} << 63).ok());
  ASSERT_TRUE(DivideInPlace(DataType::kInt64, i64.data() + 1, 2, UINT64_MAX).ok());
  EXPECT_EQ(i64, (std::vector<int64_t>{-1, 0, 0}));
  std::vector<uint64_t> u64 = {UINT64_MAX};
  ASSERT_TRUE(DivideInPlace(DataType::kUint64, u64.data(), 1, 2).ok());
  EXPECT_EQ(u64[0], UINT64_MAX / 2);
  std::vector<float> f32 = {1.0f, 3.0f, -0.0f};
  ASSERT_TRUE(DivideInPlace(DataType::kFloat32, f32.data(), f32.size(), 4).ok());
  EXPECT_EQ(f32, (std::vector<float>{0.25f, 0.75f, 0.0f}));
  EXPECT_TRUE(std::signbit(f32[2]));
  std::vector<uint16_t> bf = {0x4040};  // 3.0
  ASSERT_TRUE(DivideInPlace(DataType::kBfloat16, bf.data(), 1, 2).ok());
  EXPECT_EQ(bf[0], 0x3fc0);            // 1.5
  std::vector<uint16_t> h = {0x4200};  // 3.0
  ASSERT_TRUE(DivideInPlace(DataType::kFloat16, h.data(), 1, 3).ok());
  EXPECT_EQ(h[0], 0x3c00);
}

// ---- Argument errors ------------------------------------------------------------------------

TEST(Reduce, AvgIsRejectedWithAHint) {
  float a[2] = {1, 2}, b[2] = {3, 4};
  const Status s = ReduceInPlace(DataType::kFloat32, ReduceOp::kAvg, a, b, 2);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("sum"), std::string::npos) << s;
  EXPECT_NE(s.message().find("DivideInPlace"), std::string::npos) << s;
  EXPECT_EQ(b[0], 3.0f);
}

TEST(Reduce, InvalidEnumValuesAreRejected) {
  float a[1] = {1}, b[1] = {2};
  for (const unsigned raw : {12u, 200u, 255u}) {
    const Status s = ReduceInPlace(static_cast<DataType>(raw), ReduceOp::kSum, a, b, 1);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
    EXPECT_NE(s.message().find(std::to_string(raw)), std::string::npos) << s;
    const Status d = DivideInPlace(static_cast<DataType>(raw), b, 1, 2);
    EXPECT_EQ(d.code(), StatusCode::kInvalidArgument);
    EXPECT_NE(d.message().find(std::to_string(raw)), std::string::npos) << d;
  }
  for (const unsigned raw : {5u, 77u, 255u}) {
    const Status s = ReduceInPlace(DataType::kFloat32, static_cast<ReduceOp>(raw), a, b, 1);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
    EXPECT_NE(s.message().find(std::to_string(raw)), std::string::npos) << s;
  }
  EXPECT_EQ(b[0], 2.0f);
}

TEST(Reduce, NullBuffersAndZeroCounts) {
  float a[1] = {1}, b[1] = {2};
  EXPECT_EQ(ReduceInPlace(DataType::kFloat32, ReduceOp::kSum, nullptr, b, 1).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(ReduceInPlace(DataType::kFloat32, ReduceOp::kSum, a, nullptr, 1).code(),
            StatusCode::kInvalidArgument);
  EXPECT_TRUE(ReduceInPlace(DataType::kFloat32, ReduceOp::kSum, nullptr, nullptr, 0).ok());
  EXPECT_TRUE(ReduceInPlace(DataType::kFloat32, ReduceOp::kSum, a, b, 0).ok());
  EXPECT_EQ(b[0], 2.0f);
  EXPECT_EQ(DivideInPlace(DataType::kFloat32, nullptr, 1, 2).code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(DivideInPlace(DataType::kFloat32, nullptr, 0, 2).ok());
  const Status zero = DivideInPlace(DataType::kFloat32, b, 1, 0);
  EXPECT_EQ(zero.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(b[0], 2.0f);
  EXPECT_EQ(ReduceInPlace(DataType::kFloat64, ReduceOp::kSum, a, b, SIZE_MAX / 4).code(),
            StatusCode::kInvalidArgument);
}

// ---- Every instruction set against the scalar table ------------------------------------------

std::vector<const ci::ReduceTable*> VectorTables() {
  std::vector<const ci::ReduceTable*> tables;
  for (const ci::Isa isa : {ci::Isa::kAvx2, ci::Isa::kAvx512}) {
    if (const ci::ReduceTable* t = ci::ReduceTableFor(isa)) tables.push_back(t);
  }
  return tables;
}

TEST(ReduceIsa, ScalarTableAlwaysExists) {
  ASSERT_NE(ci::ReduceTableFor(ci::Isa::kScalar), nullptr);
  EXPECT_EQ(ci::ReduceTableFor(ci::Isa::kScalar), &ci::ScalarReduceTable());
}

TEST_P(ReduceTypeTest, EveryIsaIsByteIdenticalToScalar) {
  const auto tables = VectorTables();
  if (tables.empty()) GTEST_SKIP() << "this CPU or build has no vector reduction table";
  const DataType type = GetParam();
  const int row = static_cast<int>(type);
  const size_t elem = DataTypeSize(type);
  const ci::ReduceTable& scalar = ci::ScalarReduceTable();
  for (const ci::ReduceTable* table : tables) {
    for (int op = 0; op < ci::kNumExactReduceOps; ++op) {
      for (const size_t n : {1, 7, 15, 16, 17, 31, 33, 63, 64, 65, 127, 1000, 4099}) {
        SCOPED_TRACE("op=" + std::to_string(op) + " n=" + std::to_string(n) +
                     (table == ci::ReduceTableFor(ci::Isa::kAvx512) ? " avx512" : " avx2"));
        const Bytes in = MakeInput(type, n, 5000 + n);
        const Bytes inout = MakeInput(type, n, 6000 + n);
        OffsetBuffer sa(in, 1), sb(inout, 2), va(in, 3), vb(inout, 1);
        scalar.reduce[row][op](sa.get(), sb.get(), n);
        table->reduce[row][op](va.get(), vb.get(), n);
        const Bytes want(sb.get(), sb.get() + n * elem);
        EXPECT_EQ(FirstDifference(want, vb.get(), elem), "");
        // The same buffer on both sides takes a different loop.
        OffsetBuffer ss(inout, 0), vs(inout, 1);
        scalar.reduce[row][op](ss.get(), ss.get(), n);
        table->reduce[row][op](vs.get(), vs.get(), n);
        EXPECT_EQ(FirstDifference(Bytes(ss.get(), ss.get() + n * elem), vs.get(), elem), "");
      }
    }
    for (const uint64_t d : {uint64_t{3}, uint64_t{1} << 40}) {
      const Bytes data = MakeInput(type, 1000, 7000);
      OffsetBuffer s(data, 0), v(data, 1);
      scalar.divide[row](s.get(), 1000, d);
      table->divide[row](v.get(), 1000, d);
      EXPECT_EQ(FirstDifference(Bytes(s.get(), s.get() + 1000 * elem), v.get(), elem), "");
    }
  }
}

// Every value of each narrow type, as inout, against several partners (itself, its neighbours,
// random values): every widening and many roundings, through each table.
TEST(ReduceIsa, EveryNarrowValueRoundsLikeScalar) {
  const auto tables = VectorTables();
  if (tables.empty()) GTEST_SKIP() << "this CPU or build has no vector reduction table";
  std::mt19937_64 rng(17);
  for (const DataType type :
       {DataType::kFloat16, DataType::kBfloat16, DataType::kFloat8E4M3, DataType::kFloat8E5M2}) {
    const size_t elem = DataTypeSize(type);
    const size_t n = size_t{1} << (8 * elem);
    Bytes all(n * elem), partner(n * elem);
    for (size_t i = 0; i < n; ++i) std::memcpy(all.data() + i * elem, &i, elem);
    const int row = static_cast<int>(type);
    for (int op = 0; op < ci::kNumExactReduceOps; ++op) {
      for (int variant = 0; variant < 4; ++variant) {
        for (size_t i = 0; i < n; ++i) {
          const uint64_t v = variant == 0 ? i : variant == 1 ? i + 1 : variant == 2 ? i ^ 1 : rng();
          std::memcpy(partner.data() + i * elem, &v, elem);
        }
        Bytes want = all;
        ci::ScalarReduceTable().reduce[row][op](partner.data(), want.data(), n);
        for (const ci::ReduceTable* table : tables) {
          Bytes got = all;
          table->reduce[row][op](partner.data(), got.data(), n);
          EXPECT_EQ(FirstDifference(want, got.data(), elem), "")
              << DataTypeName(type) << " op=" << op << " variant=" << variant;
        }
      }
    }
  }
}

// ---- The select-form conversions against numeric.h ------------------------------------------

TEST(ReduceConversions, WideningMatchesNumericExhaustively) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const auto v = static_cast<uint16_t>(h);
    ASSERT_EQ(nm::FloatBits(ci::reduce_test::HalfToFloatSel(v)), nm::FloatBits(nm::HalfToFloat(v)))
        << std::hex << h;
  }
  for (uint32_t b = 0; b < 0x100; ++b) {
    const auto v = static_cast<uint8_t>(b);
    ASSERT_EQ(nm::FloatBits(ci::reduce_test::E4m3ToFloatSel(v)), nm::FloatBits(nm::E4m3ToFloat(v)))
        << std::hex << b;
    ASSERT_EQ(nm::FloatBits(ci::reduce_test::E5m2ToFloatSel(v)), nm::FloatBits(nm::E5m2ToFloat(v)))
        << std::hex << b;
  }
}

// Every sign/exponent/high-mantissa pattern with the low 16 bits set to values around each
// format's rounding point, plus random floats.
TEST(ReduceConversions, NarrowingMatchesNumeric) {
  std::mt19937_64 rng(99);
  std::vector<uint32_t> lows = {0x0000, 0x0001, 0x0fff, 0x1000, 0x1001, 0x1fff, 0x2000,
                                0x3000, 0x7fff, 0x8000, 0x8001, 0xefff, 0xf000, 0xffff};
  for (int i = 0; i < 6; ++i) lows.push_back(static_cast<uint32_t>(rng() & 0xffff));
  // Stops at the first mismatch instead of flooding the log.
  auto check = [](uint32_t x) {
    const float f = nm::BitsFloat(x);
    EXPECT_EQ(ci::reduce_test::FloatToHalfSel(f), nm::FloatToHalf(f)) << std::hex << x;
    EXPECT_EQ(ci::reduce_test::FloatToE4m3Sel(f), nm::FloatToE4m3(f)) << std::hex << x;
    EXPECT_EQ(ci::reduce_test::FloatToE5m2Sel(f), nm::FloatToE5m2(f)) << std::hex << x;
    return !testing::Test::HasFailure();
  };
  for (uint32_t hi = 0; hi < 0x10000; ++hi) {
    for (const uint32_t lo : lows) {
      if (!check((hi << 16) | lo)) return;
    }
  }
  for (int i = 0; i < 200000; ++i) {
    if (!check(static_cast<uint32_t>(rng()))) return;
  }
}

}  // namespace
}  // namespace strait

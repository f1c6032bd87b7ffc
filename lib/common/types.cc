// Names, sizes and parsing for DataType, ReduceOp and CodecId.
#include "strait/types.h"

#include <algorithm>
#include <cctype>
#include <string>

namespace strait {
namespace {

std::string Lower(std::string_view s) {
  std::string out(s);
  std::transform(out.begin(), out.end(), out.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return out;
}

bool EqualsIgnoreCase(std::string_view a, std::string_view b) {
  return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin(), [](char x, char y) {
           return std::tolower(static_cast<unsigned char>(x)) ==
                  std::tolower(static_cast<unsigned char>(y));
         });
}

}  // namespace

size_t DataTypeSize(DataType type) noexcept {
  switch (type) {
    case DataType::kInt8:
    case DataType::kUint8:
    case DataType::kFloat8E4M3:
    case DataType::kFloat8E5M2: return 1;
    case DataType::kFloat16:
    case DataType::kBfloat16: return 2;
    case DataType::kInt32:
    case DataType::kUint32:
    case DataType::kFloat32: return 4;
    case DataType::kInt64:
    case DataType::kUint64:
    case DataType::kFloat64: return 8;
  }
  return 0;
}

const char* DataTypeName(DataType type) noexcept {
  switch (type) {
    case DataType::kInt8: return "int8";
    case DataType::kUint8: return "uint8";
    case DataType::kInt32: return "int32";
    case DataType::kUint32: return "uint32";
    case DataType::kInt64: return "int64";
    case DataType::kUint64: return "uint64";
    case DataType::kFloat16: return "float16";
    case DataType::kFloat32: return "float32";
    case DataType::kFloat64: return "float64";
    case DataType::kBfloat16: return "bfloat16";
    case DataType::kFloat8E4M3: return "float8e4m3";
    case DataType::kFloat8E5M2: return "float8e5m2";
  }
  return "invalid";
}

std::optional<DataType> ParseDataType(std::string_view name) noexcept {
  const std::string n = Lower(name);
  for (int i = 0; i < kNumDataTypes; ++i) {
    const auto t = static_cast<DataType>(i);
    if (n == DataTypeName(t)) return t;
  }
  if (n == "fp32" || n == "f32" || n == "float") return DataType::kFloat32;
  if (n == "fp16" || n == "f16" || n == "half") return DataType::kFloat16;
  if (n == "bf16") return DataType::kBfloat16;
  if (n == "fp64" || n == "f64" || n == "double") return DataType::kFloat64;
  if (n == "int" || n == "i32") return DataType::kInt32;
  if (n == "char" || n == "i8") return DataType::kInt8;
  if (n == "u8") return DataType::kUint8;
  if (n == "u32") return DataType::kUint32;
  if (n == "i64") return DataType::kInt64;
  if (n == "u64") return DataType::kUint64;
  if (n == "fp8" || n == "e4m3" || n == "fp8e4m3") return DataType::kFloat8E4M3;
  if (n == "e5m2" || n == "fp8e5m2") return DataType::kFloat8E5M2;
  return std::nullopt;
}

bool IsValidDataType(uint8_t raw) noexcept { return raw < kNumDataTypes; }

bool IsLossyCodableType(DataType type) noexcept {
  return type == DataType::kFloat32 || type == DataType::kFloat16 || type == DataType::kBfloat16;
}

const char* ReduceOpName(ReduceOp op) noexcept {
  switch (op) {
    case ReduceOp::kSum: return "sum";
    case ReduceOp::kProd: return "prod";
    case ReduceOp::kMax: return "max";
    case ReduceOp::kMin: return "min";
    case ReduceOp::kAvg: return "avg";
  }
  return "invalid";
}

std::optional<ReduceOp> ParseReduceOp(std::string_view name) noexcept {
  const std::string n = Lower(name);
  for (uint8_t i = 0; i <= static_cast<uint8_t>(ReduceOp::kAvg); ++i) {
    const auto op = static_cast<ReduceOp>(i);
    if (n == ReduceOpName(op)) return op;
  }
  return std::nullopt;
}

bool IsValidReduceOp(uint8_t raw) noexcept { return raw <= static_cast<uint8_t>(ReduceOp::kAvg); }

const char* CodecName(CodecId codec) noexcept {
  switch (codec) {
    case CodecId::kNone: return "none";
    case CodecId::kZstd: return "zstd";
    case CodecId::kInt8: return "int8";
    case CodecId::kInt4: return "int4";
    case CodecId::kFp8E4M3: return "fp8";
  }
  return "invalid";
}

std::optional<CodecId> ParseCodecId(std::string_view name) noexcept {
  struct Entry {
    std::string_view name;
    CodecId id;
  };
  static constexpr Entry kEntries[] = {
      {"none", CodecId::kNone},    {"zstd", CodecId::kZstd},        {"int8", CodecId::kInt8},
      {"int4", CodecId::kInt4},    {"fp8", CodecId::kFp8E4M3},      {"fp8e4m3", CodecId::kFp8E4M3},
      {"e4m3", CodecId::kFp8E4M3}, {"fp8_e4m3", CodecId::kFp8E4M3},
  };
  for (const Entry& e : kEntries) {
    if (EqualsIgnoreCase(name, e.name)) return e.id;
  }
  return std::nullopt;
}

bool IsValidCodecId(uint8_t raw) noexcept { return raw < kNumCodecs; }

bool IsLossyCodec(CodecId codec) noexcept {
  return codec == CodecId::kInt8 || codec == CodecId::kInt4 || codec == CodecId::kFp8E4M3;
}

}  // namespace strait

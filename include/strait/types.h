// Element types and reduction operations shared by the codec, the gateway and the plugin.
//
// Values mirror NCCL 2.28's ncclDataType_t and ncclRedOp_t so that the plugin converts with a
// range check instead of a table, and they are wire values: explicit, never renumbered.
#ifndef STRAIT_TYPES_H_
#define STRAIT_TYPES_H_

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

namespace strait {

enum class DataType : uint8_t {
  kInt8 = 0,
  kUint8 = 1,
  kInt32 = 2,
  kUint32 = 3,
  kInt64 = 4,
  kUint64 = 5,
  kFloat16 = 6,
  kFloat32 = 7,
  kFloat64 = 8,
  kBfloat16 = 9,
  kFloat8E4M3 = 10,
  kFloat8E5M2 = 11,
};
inline constexpr int kNumDataTypes = 12;

enum class ReduceOp : uint8_t {
  kSum = 0,
  kProd = 1,
  kMax = 2,
  kMin = 3,
  kAvg = 4,
};

// Bytes per element; 0 for a value outside the enum.
size_t DataTypeSize(DataType type) noexcept;
// "float32", "bfloat16", ...; "invalid" for a value outside the enum.
const char* DataTypeName(DataType type) noexcept;
// Accepts the names above plus the usual aliases (fp32, f32, bf16, half, fp16, int, ...).
std::optional<DataType> ParseDataType(std::string_view name) noexcept;
bool IsValidDataType(uint8_t raw) noexcept;
// True for float16, float32 and bfloat16: the types the lossy codecs accept.
bool IsLossyCodableType(DataType type) noexcept;

const char* ReduceOpName(ReduceOp op) noexcept;  // "sum", "prod", "max", "min", "avg"
std::optional<ReduceOp> ParseReduceOp(std::string_view name) noexcept;
bool IsValidReduceOp(uint8_t raw) noexcept;

}  // namespace strait

#endif  // STRAIT_TYPES_H_

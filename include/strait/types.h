// Element types, reduction operations and codec ids shared by the codec, the gateway, the local
// protocol and the plugin.
//
// DataType and ReduceOp mirror NCCL 2.28's ncclDataType_t and ncclRedOp_t so that the plugin
// converts with a range check instead of a table. CodecId is the one numbering of codecs: frame
// headers, policy messages between gateways and the CollNet handle all carry it. All are wire
// values: explicit, never renumbered (regions run different versions during upgrades).
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

enum class CodecId : uint8_t {
  kNone = 0,
  kZstd = 1,
  kInt8 = 2,
  kInt4 = 3,
  kFp8E4M3 = 4,
};
inline constexpr int kNumCodecs = 5;
// The zstd levels a codec option or a policy ("zstd:<level>") may name.
inline constexpr int kMinZstdLevel = -5;
inline constexpr int kMaxZstdLevel = 19;

const char* CodecName(CodecId codec) noexcept;  // "none", "zstd", "int8", "int4", "fp8"
// Accepts the names above (any case) plus fp8e4m3, e4m3 and fp8_e4m3.
std::optional<CodecId> ParseCodecId(std::string_view name) noexcept;
bool IsValidCodecId(uint8_t raw) noexcept;
bool IsLossyCodec(CodecId codec) noexcept;

}  // namespace strait

#endif  // STRAIT_TYPES_H_

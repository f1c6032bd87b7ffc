// The validation of CodecOptions against the dtype being encoded (codec names: common/types.cc).
#include <algorithm>
#include <cctype>
#include <string>

#include "strait/codec.h"

namespace strait {
namespace {

bool IsPowerOfTwo(uint32_t v) {
  return v != 0 && (v & (v - 1)) == 0;
}

}  // namespace

Status ValidateCodecOptions(const CodecOptions& options, DataType dtype) {
  const auto raw_codec = static_cast<unsigned>(options.codec);
  if (raw_codec >= static_cast<unsigned>(kNumCodecs)) {
    return InvalidArgumentError("invalid codec options: codec = " + std::to_string(raw_codec) +
                                " is not a known codec; allowed: none, zstd, int8, int4, fp8");
  }
  if (!IsValidDataType(static_cast<uint8_t>(dtype))) {
    return InvalidArgumentError(
        "invalid codec options: dtype = " + std::to_string(static_cast<unsigned>(dtype)) +
        " is not a known data type; allowed: 0.." + std::to_string(kNumDataTypes - 1));
  }
  const bool lossy = IsLossyCodec(options.codec);
  if (lossy && !IsLossyCodableType(dtype)) {
    return InvalidArgumentError(std::string("invalid codec options: codec ") +
                                CodecName(options.codec) + " cannot encode dtype " +
                                DataTypeName(dtype) +
                                "; lossy codecs accept float32, bfloat16 and float16 only");
  }
  const bool uses_zstd = options.codec == CodecId::kZstd || (lossy && options.chain_zstd);
  if (uses_zstd && (options.zstd_level < kMinZstdLevel || options.zstd_level > kMaxZstdLevel)) {
    return InvalidArgumentError(
        "invalid codec options: zstd_level = " + std::to_string(options.zstd_level) +
        " is out of range; allowed: " + std::to_string(kMinZstdLevel) + ".." +
        std::to_string(kMaxZstdLevel));
  }
  if (lossy) {
    if (!IsPowerOfTwo(options.block_size) || options.block_size < kMinBlockSize ||
        options.block_size > kMaxBlockSize) {
      return InvalidArgumentError(
          "invalid codec options: block_size = " + std::to_string(options.block_size) +
          " is not allowed; allowed: a power of two in " + std::to_string(kMinBlockSize) + ".." +
          std::to_string(kMaxBlockSize));
    }
    const auto raw_rounding = static_cast<unsigned>(options.rounding);
    if (raw_rounding > static_cast<unsigned>(Rounding::kStochastic)) {
      return InvalidArgumentError(
          "invalid codec options: rounding = " + std::to_string(raw_rounding) +
          " is not known; allowed: 0 (nearest), 1 (stochastic)");
    }
  }
  return Status::Ok();
}

}  // namespace strait

// See allreduce_sweep.h.
#include "bench/allreduce_sweep.h"

#include <optional>
#include <string>

#include "common/units.h"

namespace strait::bench {

StatusOr<std::vector<uint64_t>> SweepSizes(uint64_t min_bytes, uint64_t max_bytes,
                                           uint64_t factor, size_t element_bytes) {
  if (factor < 2) {
    return InvalidArgumentError("--stepfactor: must be at least 2, got " +
                                std::to_string(factor));
  }
  if (min_bytes == 0) return InvalidArgumentError("--minbytes: must be above 0");
  if (min_bytes > max_bytes) {
    return InvalidArgumentError("--minbytes: " + FormatBytes(min_bytes) + " (" +
                                std::to_string(min_bytes) + " B) is above --maxbytes " +
                                FormatBytes(max_bytes) + " (" + std::to_string(max_bytes) +
                                " B)");
  }
  std::vector<uint64_t> sizes;
  for (uint64_t s = min_bytes; s <= max_bytes;) {
    if (element_bytes > 0 && s % element_bytes != 0) {
      return InvalidArgumentError("--minbytes: size " + std::to_string(s) + " B of the sweep is not a " +
                                  "multiple of the element size (" +
                                  std::to_string(element_bytes) + " B)");
    }
    sizes.push_back(s);
    if (s > max_bytes / factor) break;  // the next step would pass max_bytes (or overflow)
    s *= factor;
  }
  return sizes;
}

StatusOr<DataType> ParseSweepDtype(std::string_view name) {
  const std::optional<DataType> t = ParseDataType(name);
  if (!t.has_value() || (*t != DataType::kFloat32 && *t != DataType::kBfloat16 &&
                         *t != DataType::kFloat16)) {
    return InvalidArgumentError("float32, bfloat16 or float16, got '" + std::string(name) + "'");
  }
  return *t;
}

const char* NcclTestsTypeName(DataType type) {
  switch (type) {
    case DataType::kFloat32: return "float";
    case DataType::kBfloat16: return "bfloat16";
    case DataType::kFloat16: return "half";
    default: return DataTypeName(type);
  }
}

}  // namespace strait::bench

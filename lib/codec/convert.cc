// The public element conversions (ConvertToFloat / ConvertFromFloat) over the active kernel
// table, with the argument checks the kernels leave to their callers.
#include <string>

#include "codec/kernels.h"
#include "strait/codec.h"
#include "strait/status.h"
#include "strait/types.h"

namespace strait {
namespace {

Status CheckFloatType(DataType type, const char* what) {
  if (type == DataType::kFloat32 || type == DataType::kBfloat16 || type == DataType::kFloat16) {
    return Status::Ok();
  }
  return InvalidArgumentError(std::string(what) + ": unsupported data type " + DataTypeName(type) +
                              "; expected float32, bfloat16 or float16");
}

}  // namespace

Status ConvertToFloat(const void* src, DataType src_type, float* dst, size_t count) {
  if (Status s = CheckFloatType(src_type, "ConvertToFloat"); !s.ok()) return s;
  if (count == 0) return Status::Ok();
  codec_internal::ActiveKernels().to_float(src, src_type, dst, count, /*accumulate=*/false);
  return Status::Ok();
}

Status ConvertFromFloat(const float* src, void* dst, DataType dst_type, size_t count) {
  if (Status s = CheckFloatType(dst_type, "ConvertFromFloat"); !s.ok()) return s;
  if (count == 0) return Status::Ok();
  codec_internal::ActiveKernels().from_float(src, dst, dst_type, count);
  return Status::Ok();
}

}  // namespace strait

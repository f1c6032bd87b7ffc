// strait::ReduceInPlace and DivideInPlace: argument checks, the baseline (scalar) build of the
// kernels in reduce_impl.h, and the runtime choice between the scalar, AVX2 and AVX-512 tables.
#include "strait/reduce.h"

#include <cstdint>
#include <string>

#define STRAIT_REDUCE_NS reduce_scalar
#include "codec/reduce_impl.h"

namespace strait {
namespace codec_internal {
namespace {

// Whether this CPU (and OS) can run the table built for `isa`.
bool CpuSupports(Isa isa) noexcept {
  return static_cast<int>(isa) <= static_cast<int>(DetectIsa());
}

}  // namespace

const ReduceTable& ScalarReduceTable() noexcept {
  static constexpr ReduceTable kTable = reduce_scalar::MakeReduceTable();
  return kTable;
}

const ReduceTable* ReduceTableFor(Isa isa) noexcept {
  if (!CpuSupports(isa)) return nullptr;
  switch (isa) {
    case Isa::kScalar: return &ScalarReduceTable();
#if defined(STRAIT_CODEC_X86) && STRAIT_CODEC_X86
    case Isa::kAvx2: return &Avx2ReduceTable();
    case Isa::kAvx512: return &Avx512ReduceTable();
#endif
    default: return nullptr;
  }
}

const ReduceTable& ActiveReduceTable() noexcept {
  // ActiveIsa() never exceeds DetectIsa(), so the lookup cannot fail; scalar is the safe answer
  // should it ever do so.
  static const ReduceTable* const table = [] {
    const ReduceTable* t = ReduceTableFor(ActiveIsa());
    return t != nullptr ? t : &ScalarReduceTable();
  }();
  return *table;
}

}  // namespace codec_internal

namespace {

Status CheckType(const char* fn, DataType type) {
  if (IsValidDataType(static_cast<uint8_t>(type))) return Status::Ok();
  return InvalidArgumentError(std::string(fn) + ": invalid data type value " +
                              std::to_string(static_cast<unsigned>(type)) +
                              " (valid values are 0.." + std::to_string(kNumDataTypes - 1) + ")");
}

// Rejects null buffers and byte counts that do not fit in size_t. count == 0 is always fine.
Status CheckBuffer(const char* fn, const char* what, const void* p, size_t count, size_t elem) {
  if (count == 0) return Status::Ok();
  if (p == nullptr) {
    return InvalidArgumentError(std::string(fn) + ": " + what + " is null but count is " +
                                std::to_string(count));
  }
  if (count > SIZE_MAX / elem) {
    return InvalidArgumentError(std::string(fn) + ": count " + std::to_string(count) +
                                " is too large for any buffer");
  }
  return Status::Ok();
}

}  // namespace

Status ReduceInPlace(DataType type, ReduceOp op, const void* in, void* inout, size_t count) {
  constexpr const char* kFn = "ReduceInPlace";
  STRAIT_RETURN_IF_ERROR(CheckType(kFn, type));
  if (op == ReduceOp::kAvg) {
    return InvalidArgumentError(
        "ReduceInPlace: op avg is not an element-wise reduction; reduce with sum and call "
        "DivideInPlace(type, data, count, n) once on the result");
  }
  const auto raw_op = static_cast<unsigned>(op);
  if (raw_op >= static_cast<unsigned>(codec_internal::kNumExactReduceOps)) {
    return InvalidArgumentError("ReduceInPlace: invalid reduce op value " + std::to_string(raw_op) +
                                " (valid values are 0 sum, 1 prod, 2 max, 3 min)");
  }
  const size_t elem = DataTypeSize(type);
  STRAIT_RETURN_IF_ERROR(CheckBuffer(kFn, "in", in, count, elem));
  STRAIT_RETURN_IF_ERROR(CheckBuffer(kFn, "inout", inout, count, elem));
  if (count == 0) return Status::Ok();
  codec_internal::ActiveReduceTable().reduce[static_cast<int>(type)][raw_op](in, inout, count);
  return Status::Ok();
}

Status DivideInPlace(DataType type, void* data, size_t count, uint64_t divisor) {
  constexpr const char* kFn = "DivideInPlace";
  STRAIT_RETURN_IF_ERROR(CheckType(kFn, type));
  if (divisor == 0) return InvalidArgumentError("DivideInPlace: divisor is 0");
  STRAIT_RETURN_IF_ERROR(CheckBuffer(kFn, "data", data, count, DataTypeSize(type)));
  if (count == 0) return Status::Ok();
  codec_internal::ActiveReduceTable().divide[static_cast<int>(type)](data, count, divisor);
  return Status::Ok();
}

}  // namespace strait

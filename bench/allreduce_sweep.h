// `strait-bench allreduce`'s size sweep and element type, nccl-tests style: the sizes
// -b/--minbytes, x -f/--stepfactor, ... up to -e/--maxbytes, and the --dtype names. Pure
// functions (no I/O), so that tests/bench/allreduce_sweep_test.cc checks them directly.
#ifndef STRAIT_BENCH_ALLREDUCE_SWEEP_H_
#define STRAIT_BENCH_ALLREDUCE_SWEEP_H_

#include <cstddef>
#include <cstdint>
#include <string_view>
#include <vector>

#include "strait/status.h"
#include "strait/types.h"

namespace strait::bench {

// The sizes min_bytes, min_bytes x factor, ... while <= max_bytes (nccl-tests' -b/-e/-f), each
// a whole number of `element_bytes` elements. kInvalidArgument, with a message naming the flag,
// when min_bytes > max_bytes, factor < 2, a size is 0, or a size is not a multiple of
// element_bytes. Never more than 64 sizes (factor >= 2 keeps it so).
StatusOr<std::vector<uint64_t>> SweepSizes(uint64_t min_bytes, uint64_t max_bytes,
                                           uint64_t factor, size_t element_bytes);

// --dtype: float32, bfloat16 or float16 (and the aliases strait::ParseDataType knows: fp32,
// float, bf16, fp16, half); anything else is kInvalidArgument naming the three.
StatusOr<DataType> ParseSweepDtype(std::string_view name);

// The name nccl-tests prints in its "type" column: "float", "bfloat16", "half".
const char* NcclTestsTypeName(DataType type);

}  // namespace strait::bench

#endif  // STRAIT_BENCH_ALLREDUCE_SWEEP_H_

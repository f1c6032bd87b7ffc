// Exact element-wise reductions on raw buffers of every NCCL data type: the lossless path of
// the gateway's all-reduce, and the building block of its fp32 accumulation.
//
// Integers wrap (two's complement) as NCCL's do. float32/float64 use IEEE arithmetic in the
// element type. float16, bfloat16 and the fp8 types are widened to fp32, combined, and rounded
// back to nearest even, which is exact for max/min and deterministic for sum/prod. max/min
// propagate NaN. Thread-safe, never blocks.
#ifndef STRAIT_REDUCE_H_
#define STRAIT_REDUCE_H_

#include <cstddef>

#include "strait/status.h"
#include "strait/types.h"

namespace strait {

// inout[i] = op(inout[i], in[i]) for `count` elements of `type`. Buffers may be unaligned and
// may be the same buffer; they must not partially overlap. kAvg is rejected (kInvalidArgument):
// reduce with kSum and call DivideInPlace once at the end.
Status ReduceInPlace(DataType type, ReduceOp op, const void* in, void* inout, size_t count);

// data[i] /= divisor, in the element type (integers: truncating division). For kAvg.
Status DivideInPlace(DataType type, void* data, size_t count, uint64_t divisor);

}  // namespace strait

#endif  // STRAIT_REDUCE_H_

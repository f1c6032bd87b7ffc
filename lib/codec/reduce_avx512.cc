// The exact reduction kernels of reduce_impl.h compiled for AVX-512 F/BW/VL/DQ (this file gets
// those flags in lib/codec/CMakeLists.txt); reduce.cc calls them only after a runtime CPU check.
#define STRAIT_REDUCE_NS reduce_avx512
#include "codec/reduce_impl.h"

namespace strait::codec_internal {

const ReduceTable& Avx512ReduceTable() noexcept {
  static constexpr ReduceTable kTable = reduce_avx512::MakeReduceTable();
  return kTable;
}

}  // namespace strait::codec_internal

// The exact reduction kernels of reduce_impl.h compiled for AVX2 + F16C (this file gets those
// flags in lib/codec/CMakeLists.txt); reduce.cc calls them only after a runtime CPU check.
#define STRAIT_REDUCE_NS reduce_avx2
#include "codec/reduce_impl.h"

namespace strait::codec_internal {

const ReduceTable& Avx2ReduceTable() noexcept {
  static constexpr ReduceTable kTable = reduce_avx2::MakeReduceTable();
  return kTable;
}

}  // namespace strait::codec_internal

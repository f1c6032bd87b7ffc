// ReleaseFreeHeap and KeepLargeBuffersInHeap (see heap.h).
#include "common/heap.h"

#include <cstddef>  // any C library header defines __GLIBC__ (through features.h), tested below

#if defined(__GLIBC__)
#include <malloc.h>
#endif

namespace strait {

bool ReleaseFreeHeap() noexcept {
#if defined(__GLIBC__)
  return ::malloc_trim(0) != 0;
#else
  return false;
#endif
}

void KeepLargeBuffersInHeap() noexcept {
#if defined(__GLIBC__)
  ::mallopt(M_MMAP_THRESHOLD, 64 << 20);
  ::mallopt(M_TRIM_THRESHOLD, 512 << 20);
#endif
}

}  // namespace strait

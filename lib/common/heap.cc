// ReleaseFreeHeap (see heap.h).
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

}  // namespace strait

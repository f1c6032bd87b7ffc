// Random identifiers that must differ between processes and restarts (listener nonces,
// connection ids, CollNet handle nonces): read from the kernel (getrandom(2)), not from
// std::random_device, which GCC 12's libstdc++ implements with glibc 2.36's arc4random and so
// would tie the NCCL plugin (libstdc++ linked in) to glibc >= 2.36. Not for keys.
#ifndef STRAIT_LIB_COMMON_RANDOM_H_
#define STRAIT_LIB_COMMON_RANDOM_H_

#include <cstdint>

namespace strait {

// A random non-zero 64-bit value (zero stays free to mean "none"). Thread-safe; never blocks
// once the kernel's pool is initialised (early boot only).
uint64_t RandomNonzero64();

}  // namespace strait

#endif  // STRAIT_LIB_COMMON_RANDOM_H_

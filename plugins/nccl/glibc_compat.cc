// Keeps the plugin loadable on glibc 2.34/2.35 (Ubuntu 22.04, RHEL 9) although Debian 12, which
// builds it, has glibc 2.36. The plugin links libstdc++ in (plugins/nccl/CMakeLists.txt), and
// GCC 12's libstdc++.a drags std::random_device's code into every link (through its COW-string
// instances), which calls arc4random, new in glibc 2.36: the loader would refuse the plugin on
// older glibc although nothing in it ever draws from std::random_device. This definition, local
// to the plugin (the version script exports only NCCL's tables), satisfies that reference with
// getrandom(2) (glibc 2.25) instead. Compiled into libnccl-net-strait.so only.
#include <stdlib.h>  // arc4random's declaration, which this definition must match
#include <sys/random.h>

#include <cerrno>
#include <cstdint>

extern "C" uint32_t arc4random(void) noexcept {
  uint32_t v = 0;
  while (::getrandom(&v, sizeof(v), 0) != static_cast<ssize_t>(sizeof(v))) {
    if (errno != EINTR) break;  // no getrandom: a value, as arc4random never fails
  }
  return v;
}

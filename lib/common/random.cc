// RandomNonzero64: getrandom(2), with a clock-and-counter fallback for kernels without it.
#include "common/random.h"

#include <sys/random.h>

#include <atomic>
#include <cerrno>
#include <chrono>

#include "common/hash.h"

namespace strait {

uint64_t RandomNonzero64() {
  for (;;) {
    uint64_t v = 0;
    const ssize_t n = ::getrandom(&v, sizeof(v), 0);
    if (n == static_cast<ssize_t>(sizeof(v))) {
      if (v != 0) return v;
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    // No getrandom (ENOSYS: a kernel before 3.17): distinct enough for ids, which is all they
    // need to be. The counter separates calls within one clock tick.
    static std::atomic<uint64_t> counter{0};
    const auto now = std::chrono::steady_clock::now().time_since_epoch().count();
    v = Mix64(static_cast<uint64_t>(now) ^ Mix64(counter.fetch_add(1) + 1));
    if (v != 0) return v;
  }
}

}  // namespace strait

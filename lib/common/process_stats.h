// What the running process costs, read from /proc/self: the figures Prometheus' client
// libraries export as `process_*` (CPU time, resident and virtual memory, descriptors, start
// time, threads), for straitd's /metrics, so an operator sees a leak or a descriptor flood
// without a node exporter.
#ifndef STRAIT_LIB_COMMON_PROCESS_STATS_H_
#define STRAIT_LIB_COMMON_PROCESS_STATS_H_

#include <cstdint>

#include "strait/status.h"

namespace strait {

struct ProcessStats {
  double cpu_seconds = 0;          // user + system time
  uint64_t resident_bytes = 0;     // RSS
  uint64_t virtual_bytes = 0;      // address space
  uint64_t open_fds = 0;           // entries of /proc/self/fd
  uint64_t max_fds = 0;            // RLIMIT_NOFILE's soft limit (0 = unlimited)
  double start_time_seconds = 0;   // since the Unix epoch
  uint64_t threads = 0;
};

// Reads /proc/self/stat, /proc/self/fd and /proc/stat's boot time. Fails (kUnavailable) only
// where /proc is not mounted or not Linux's.
StatusOr<ProcessStats> ReadProcessStats();

}  // namespace strait

#endif  // STRAIT_LIB_COMMON_PROCESS_STATS_H_

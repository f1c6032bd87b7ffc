// Helpers shared by the files of `strait-bench link` (link_bench.cc, link_bench_report.cc);
// not for other files.
#ifndef STRAIT_BENCH_LINK_BENCH_INTERNAL_H_
#define STRAIT_BENCH_LINK_BENCH_INTERNAL_H_

#include <cstdint>
#include <string>

#include "bench/bench_common.h"
#include "bench/link_bench.h"

namespace strait::bench::link_bench_internal {

inline std::string Mbit(double bps) { return Fixed(bps / 1e6, 1); }
inline std::string Ms(int64_t ns) {
  return ns > 0 ? Fixed(static_cast<double>(ns) / 1e6, 1) : "-";
}
// The server's address as given: "HOST:PORT".
inline std::string Where(const LinkBenchOptions& o) {
  return o.host + ":" + std::to_string(o.port);
}

}  // namespace strait::bench::link_bench_internal

#endif  // STRAIT_BENCH_LINK_BENCH_INTERNAL_H_

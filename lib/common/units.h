// Parsing and printing of the sizes, rates and durations every tool and config file accepts.
//
//   sizes:     "64MiB", "1.5GB", "4096", "64M" (bare K/M/G/T mean powers of 1024, like dd and
//              nccl-tests; KB/MB/GB/TB are powers of 1000; KiB/MiB/GiB/TiB powers of 1024)
//   rates:     "100mbit", "1gbit", "2.5Gbit", "800kbit", "125MB/s", "1GiB/s" (tc's bit units, or
//              bytes per second written with "/s"); "100mbps" is refused as ambiguous, because
//              tc reads it as megabytes and most people as megabits
//   durations: "20ms", "1.5s", "250us", "100ns", "2m", "1h"; a bare number is refused
// Units are case-insensitive except where case decides (none does today). Every error names the
// text and lists what is accepted.
#ifndef STRAIT_LIB_COMMON_UNITS_H_
#define STRAIT_LIB_COMMON_UNITS_H_

#include <cstdint>
#include <string>
#include <string_view>

#include "strait/status.h"

namespace strait {

StatusOr<uint64_t> ParseSize(std::string_view text);         // bytes
StatusOr<uint64_t> ParseRate(std::string_view text);         // bits per second
StatusOr<int64_t> ParseDurationNanos(std::string_view text);  // nanoseconds

// "64 MiB", "1.50 GiB", "512 B": binary units, three significant digits.
std::string FormatBytes(uint64_t bytes);
// "100 Mbit/s", "1.25 Gbit/s": decimal bit units.
std::string FormatRate(double bits_per_second);
// "20 ms", "1.5 s", "250 us".
std::string FormatDuration(int64_t nanos);

}  // namespace strait

#endif  // STRAIT_LIB_COMMON_UNITS_H_

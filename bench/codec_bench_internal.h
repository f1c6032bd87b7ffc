// Helpers shared by the files of `strait-bench codec` (codec_bench.cc, codec_bench_report.cc);
// not for other files.
#ifndef STRAIT_BENCH_CODEC_BENCH_INTERNAL_H_
#define STRAIT_BENCH_CODEC_BENCH_INTERNAL_H_

#include "bench/codec_bench.h"

namespace strait::bench::codec_bench_internal {

// Judges the report's float32 rows against the codec issue's goals (codec_bench_report.cc):
// fills report->goals, one entry per goal, "not measured" where a row is missing.
void AddGoals(CodecBenchReport* report);

}  // namespace strait::bench::codec_bench_internal

#endif  // STRAIT_BENCH_CODEC_BENCH_INTERNAL_H_

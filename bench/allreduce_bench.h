// `strait-bench allreduce`: cross-region all-reduce through real straitd gateways, on links
// emulated by strait-wanem (root) or on 127.0.0.1 (no root, or --loopback), beside the link
// bound of DESIGN's performance model and, with --baseline ring, an uncompressed flat TCP ring.
//
// What runs (sidecar mode): one straitd per rank; rank r of region R talks to its own straitd
// (shard index r), and the straitds with the same shard index across regions form a mesh. With
// no NCCL here, the intra-region reduce-scatter / all-gather are not run: rank r of a region
// holds slice r of its region's tensor (as after a reduce-scatter) and all-reduces that slice
// across regions through its gateway. The ranks and the straitds are processes: the ranks are
// this binary re-executed in a hidden rank mode, each inside its region's network namespace
// (`ip netns exec`) when emulating.
//
// One run can hold several mesh rows: each --codec entry ('/'-separated) for each --shards mode
// (weighted: straitd's allreduce.shard_weights from each region's slowest emulated link; even:
// none; the gateways are restarted when the weights change), then the ring. Gateway links use
// TLS with a throwaway CA when emulating (--transport). Beside each row: the per-pair floor of
// its split on strait-wanem's per-pair links, how busy the emulated links were (router
// counters sampled through the run) and straitd's own time split (its stats counters).
//
// Sizes: one (--size) or nccl-tests' sweep (-b/-e/-f: b, b x f, ... up to e), every size on the
// same gateways, one row each. --dtype float32, bfloat16 or float16 is the tensor's type.
//
// Checked every run: each rank's result against an fp64 reference of the sum of the inputs as
// the ranks sent them (rounded to --dtype; lossless codecs: within that type's rounding; lossy:
// within the codec's per-block step bound, error feedback included, plus that rounding), and
// every region's copy of each slice bit for bit against the others.
#ifndef STRAIT_BENCH_ALLREDUCE_BENCH_H_
#define STRAIT_BENCH_ALLREDUCE_BENCH_H_

#include "bench/bench_common.h"
#include "tools/cli/cli_fwd.h"

namespace strait::bench {

// Adds `allreduce`'s flags (and its hidden rank-mode flags) to `cmd`.
CommandMain SetupAllReduceCommand(CLI::App& cmd);

}  // namespace strait::bench

#endif  // STRAIT_BENCH_ALLREDUCE_BENCH_H_

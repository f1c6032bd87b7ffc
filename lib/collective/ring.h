// The ring all-reduce: the fallback for topologies without a full mesh (see plan.h for when the
// plan picks it). Internal to strait::collective; AllReduce calls it.
//
// Segments are the plan's shards; segment k ends up reduced at rank k (its owner). Reduce-
// scatter: segment k's partial sum travels k+1 -> k+2 -> ... -> k, each rank adding its own
// input in fp32 (or exactly, on the exact path) and passing it on, encoded with the request's
// codec (lossy codecs with this rank's sender residual). The owner then encodes the segment once
// (owner residual) and all-gather forwards that same frame unchanged around the ring, each rank
// decoding it, so every rank ends bit-identical, lossy codecs included.
//
// Compared with the mesh: 2(n-1) steps of latency instead of 2; the same bytes per link. The
// fp32 sum of a segment is taken in ring order (starting after its owner), not in rank order,
// so a float sum can differ from the mesh's in the last bit; exact-path results (integers,
// max/min) and sums that are exact in fp32 are the same. A lossy partial sum is re-quantized at
// every hop, so the error bound grows with the number of ranks.
#ifndef STRAIT_LIB_COLLECTIVE_RING_H_
#define STRAIT_LIB_COLLECTIVE_RING_H_

#include "collective/engine.h"

namespace strait::collective::internal {

// Runs the ring on a context prepared by AllReduce (plan.algorithm == kRing, world >= 2).
// Blocks on the calling thread only.
Status RunRing(OpContext& ctx);

}  // namespace strait::collective::internal

#endif  // STRAIT_LIB_COLLECTIVE_RING_H_

// The plan of one all-reduce: which rank owns which shard of the tensor, how shards are cut into
// pipelined chunks, and whether the mesh or the ring algorithm runs.
//
// MakePlan is a pure function of its options, in integer arithmetic only, so that every rank
// given the same options computes the same plan without talking to the others. The caller must
// pass the same options on every rank (the gateway distributes the weights and the topology with
// the job).
//
// Shards are proportional to `weights` (each owner's measured link bandwidth; equal when empty):
// every owner first gets one unit, the remaining units are split by largest remainder (ties to
// the lower rank). A unit is `align` elements (the lossy codec's block size, so that no codec
// block straddles two owners); when there are fewer units than ranks the unit falls back to one
// element, so every shard is non-empty whenever count >= world. Chunks are multiples of `align`
// elements except the last of a shard.
//
// Algorithm choice (kAuto): the mesh whenever every ordered pair of ranks has a link (`links`
// empty means they all do): 2 latencies per step. Otherwise the ring 0 -> 1 -> ... -> n-1 -> 0
// when each of those links exists: 2(n-1) latencies, but it needs only the neighbours. Otherwise
// kFailedPrecondition naming a missing link.
#ifndef STRAIT_LIB_COLLECTIVE_PLAN_H_
#define STRAIT_LIB_COLLECTIVE_PLAN_H_

#include <cstddef>
#include <cstdint>
#include <vector>

#include "strait/status.h"

namespace strait::collective {

enum class Algorithm : uint8_t {
  kAuto = 0,  // mesh if the mesh is complete, else ring (see the file comment)
  kMesh = 1,  // owner-based reduce-scatter + all-gather over the full mesh
  kRing = 2,  // ring reduce-scatter + all-gather
};
const char* AlgorithmName(Algorithm algorithm) noexcept;  // "auto", "mesh", "ring"

// Elements per pipelined chunk unless the caller says otherwise. Smaller chunks shorten the
// pipeline's fill and drain (the first chunk must cross before its owner can reduce it, the last
// result must cross after it is reduced); larger ones cost fewer frames and compress better.
// 2^18 (1 MiB of fp32) on 100 Mbit/s, 20 ms links (bench/README.md, "2026-12-03 (chunks)" and
// "(CollNet and chunks)"): 2^17 gained unequal shards a few hundredths of their floor, within
// the spread between iterations, but NCCL's CollNet ops (4 MiB, eight at once) then ran 2.3-2.6x
// library mode's time instead of 1.2-1.6x; 2^16 cost zstd's ratio.
// Every gateway of a job must cut alike: the gateway's op identity names its chunk size.
inline constexpr size_t kDefaultChunkElements = size_t{1} << 18;
// A large op alone on the links pays one chunk of store-and-forward at its end: an owner sends a
// chunk's result only once every region's contribution to it arrived, so the last result leaves
// a chunk's time on the slowest link (42 ms for 256 KB of int8 at 50 Mbit/s) plus a one-way
// delay after the last contribution. On unequal links (200/100/50 Mbit/s, balanced shards,
// 64 MiB fp32 int8+ef) 2^16-element chunks ran 1.15-1.16x the per-pair floor against 1.22x at
// 2^18, and equal links and bf16 the same either way (bench/README.md, "2026-12-06 (evening)").
// Small ops keep 2^18: NCCL's CollNet ops (4 MiB, eight in flight) fill the links together and
// pay for every extra chunk; lossless codecs keep it too, zstd's ratio fell from 1.19 to 1.12.
inline constexpr size_t kLargeOpChunkElements = size_t{1} << 16;
inline constexpr size_t kLargeOpElements = size_t{1} << 22;
// The chunk size for an op of `count` elements when the configuration names none: the same
// numbers in every region (the op identity names the result), so gateways still cut alike.
inline size_t ChunkElementsFor(size_t count, bool lossy) {
  return lossy && count >= kLargeOpElements ? kLargeOpChunkElements : kDefaultChunkElements;
}

struct PlanOptions {
  size_t count = 0;                 // elements in the tensor
  int world = 1;                    // number of ranks
  std::vector<uint64_t> weights;    // per owner, > 0; empty = equal
  size_t align = 1;                 // shard and chunk alignment in elements, >= 1
  size_t chunk_elements = kDefaultChunkElements;  // rounded up to a multiple of align
  Algorithm algorithm = Algorithm::kAuto;
  // links[i * world + j] != 0 when rank i can send to rank j; empty = full mesh.
  std::vector<uint8_t> links;
};

struct Shard {
  size_t begin = 0;
  size_t count = 0;
};

struct Chunk {
  int owner = 0;     // the shard (owner rank) it belongs to
  uint32_t id = 0;   // index in Plan::chunks, the tag's chunk number
  size_t begin = 0;  // first element, in the whole tensor
  size_t count = 0;  // elements, > 0
};

struct Plan {
  Algorithm algorithm = Algorithm::kMesh;  // never kAuto
  int world = 1;
  size_t count = 0;
  size_t align = 1;           // the unit actually used (may have fallen back to 1)
  size_t chunk_elements = 0;  // after rounding
  std::vector<Shard> shards;  // one per owner rank; contiguous, in rank order, covering count
  std::vector<Chunk> chunks;  // owner-major, ascending begin
  std::vector<uint32_t> first_chunk;  // world + 1 entries: owner i's chunks are
                                      // chunks[first_chunk[i] .. first_chunk[i + 1])

  size_t ChunkCount(int owner) const {
    return first_chunk[static_cast<size_t>(owner) + 1] - first_chunk[static_cast<size_t>(owner)];
  }
  const Chunk& ChunkOf(int owner, size_t k) const {
    return chunks[first_chunk[static_cast<size_t>(owner)] + k];
  }
};

// ---- Shard weights from measured link rates --------------------------------------------------
//
// Link j -> i carries owner i's shard (phase 1) and owner j's result (phase 2), so with shares s
// the busiest link takes max over pairs {i, j} of (s_i + s_j) / c_ij, c_ij the slower direction
// of the pair. BalancedShardWeights picks the shares that minimise that: the linear program
// max sum(x) subject to x_i + x_j <= c_ij, x >= 0 (then s = x / sum(x)), solved by a dense
// simplex with Bland's rule. With 200/100/50 Mbit/s pairs 0-1/0-2/1-2 the optimum is
// (2/3, 1/3, ~0): half the even split's busiest-link time, where weighting each owner by its
// slowest link gains only 1.32x.
//
// The result must be the same on every gateway that computes it from the same matrix. The
// optimum of this program with integer capacities lies on a half-integral vertex, so the floating
// point solution is snapped to half-units and the weights are 2x in integers (>= 1: every owner
// keeps at least one unit): a last-bit difference between CPUs cannot change them. Equal weights
// (all 1) when:
//   - world <= 2 (every split loads the one pair equally),
//   - any off-diagonal rate is 0 (unknown: nothing to balance on),
//   - the optimum beats the even split's busiest link by less than kBalancedMinGainPercent
//     (measured rates are never exactly equal; small differences are noise, not a reason to move
//     shards and their error-feedback residuals around). Decided in integers.
// `rates` holds world * world entries, rates[i * world + j] = measured rate from i to j in any
// unit (bytes/s here); the diagonal is ignored. kInvalidArgument for a wrong length or world < 1.
inline constexpr uint64_t kBalancedMinGainPercent = 10;
StatusOr<std::vector<uint64_t>> BalancedShardWeights(const std::vector<uint64_t>& rates,
                                                     int world);

// Errors (kInvalidArgument unless said): world < 1; weights of the wrong length or containing 0;
// align or chunk_elements 0; more than kMaxTagChunks chunks ("raise chunk_elements"); links of
// the wrong length; kFailedPrecondition when the requested algorithm's links are missing.
StatusOr<Plan> MakePlan(const PlanOptions& options);

}  // namespace strait::collective

#endif  // STRAIT_LIB_COLLECTIVE_PLAN_H_

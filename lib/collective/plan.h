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

struct PlanOptions {
  size_t count = 0;                 // elements in the tensor
  int world = 1;                    // number of ranks
  std::vector<uint64_t> weights;    // per owner, > 0; empty = equal
  size_t align = 1;                 // shard and chunk alignment in elements, >= 1
  size_t chunk_elements = 1 << 18;  // target chunk size; rounded up to a multiple of align
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

// Errors (kInvalidArgument unless said): world < 1; weights of the wrong length or containing 0;
// align or chunk_elements 0; more than kMaxTagChunks chunks ("raise chunk_elements"); links of
// the wrong length; kFailedPrecondition when the requested algorithm's links are missing.
StatusOr<Plan> MakePlan(const PlanOptions& options);

}  // namespace strait::collective

#endif  // STRAIT_LIB_COLLECTIVE_PLAN_H_

// Internal to lib/gateway: how an all-reduce is numbered -- the keys and op ids that every
// region's gateway derives alike from a request (see "Operation identity" in
// localproto/protocol.h). Pure functions, stable across builds and machines: op ids travel
// between gateways in NetTransport tags, so changing any derivation here is a wire change.
//
// The public part (JobLane, OperationId) is declared in gateway.h; the all-reduce service
// (allreduce_service.h) uses the rest in its Number stage, peer control (peer_control.cc) uses
// GenerationKey for joins and result recovery.
#ifndef STRAIT_LIB_GATEWAY_NUMBERING_H_
#define STRAIT_LIB_GATEWAY_NUMBERING_H_

#include <cstddef>
#include <cstdint>
#include <string>

#include "localproto/protocol.h"
#include "strait/codec.h"

namespace strait::gateway {

// The key of a (job, scope) in Generations and in the committed results: a job's comms of
// different scopes have generations of their own. Scope 0 is the job id itself.
std::string GenerationKey(const std::string& job, uint64_t scope);

// (generation, sequence) folded into one word, OperationId's `sequence` argument.
uint64_t IdentityWord(uint64_t generation, uint64_t sequence);

// What every region's gateway must see alike for one step, as readable text: hashed into the
// cross-region op id and named in mismatch errors. `frame` is null unless the request is a
// kAllReduceFrame; a nonzero scope is appended ("scope=N").
std::string IdentityText(const localproto::Message& request, const FrameInfo* frame);

// What this gateway adds to IdentityText because it cuts the operation by its own config:
// " chunk=N" (allreduce.chunk_elements); the all-reduce service's Weigh appends " weights=..."
// (measured shard weights) after it. Regions whose identities differ only from the first of
// these markers on run different configs or straitd versions (an older one adds no chunk
// marker), not different steps: Generations says so.
inline constexpr const char* kChunkIdentityMarker = " chunk=";
inline constexpr const char* kWeightsIdentityMarker = " weights=";
std::string GatewayIdentityText(size_t chunk_elements);
// `identity` without what the gateway added: the part every rank's request determines.
std::string RanksIdentityPart(const std::string& identity);

// The op id pairing the gateways of one region for the region phase of a kRegionAllReduce:
// (job, scope, generation/sequence word, tensor key) alone, so that node heads that disagree on
// the count or dtype still meet and the region phase names the mismatch. Distinct from every
// OperationId of a plain all-reduce; carries JobLane(job).
uint64_t RegionSideOpId(const std::string& job, const std::string& tensor_key, uint64_t scope,
                        uint64_t word);

// The cross-region op id of a region all-reduce's shard, from the op id the Number stage gave
// it (`op_id`): it also hashes the region's gateway count, so that regions running different
// numbers of gateways (which would cut the tensor differently) never pair and fail by the
// deadline instead of mixing shards. Carries JobLane(job).
uint64_t RegionCrossOpId(const std::string& job, const std::string& tensor_key, int region_size,
                         uint64_t op_id);

}  // namespace strait::gateway

#endif  // STRAIT_LIB_GATEWAY_NUMBERING_H_

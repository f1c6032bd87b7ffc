// Hierarchical all-reduce: the region gateways' intra-region phase around the cross-region
// all-reduce (the NCCL plugin's CollNet mode; DESIGN.md "Cross-region all-reduce").
//
// A region runs m gateways, numbered 0..m-1 by their shard index; each serves one node head
// that holds the whole tensor. Gateway i of every region takes part in three phases:
//   1. Intra-region reduce-scatter over `region` (the LAN): the tensor is cut into m shards, as
//      evenly as possible (MakePlan with equal weights: the first count % m shards get one
//      element more), and every gateway sends its part of shard j to gateway j, raw and lossless.
//      Gateway i reduces its shard over the inputs of gateways 0..m-1 in that fixed order: in
//      fp32 for sum/avg of float32/bfloat16/float16 (rounded once to the element type; avg
//      divides the fp32 sum by m first), exactly in the element type for every other pair.
//   2. Cross-region: the existing AllReduce of shard i over `cross`, the world of the shard-i
//      gateways of every region, with the request's codec, error feedback and shard weights.
//      Its result is bit-identical on every region's gateway i.
//   3. Intra-region all-gather over `region`: gateway i sends its finished shard to every other
//      gateway of its region, so every node head of every region ends with the same bytes. Raw,
//      chunk by chunk; or, when phase 2 ran a lossy codec that can give its result as one frame
//      (AllReduceRequest::result_frame: one lossy codec for every result, unchained, whole blocks
//      per owner), as that frame, which the others decode exactly as phase 2 decoded it: the
//      same bits in a quarter (int8, fp8) or an eighth (int4) of the bytes.
// With m = 1 phases 1 and 3 move nothing and the result is exactly AllReduce's.
//
// Numerics: with a lossless codec, a sum is the fp32 sum over regions in rank order of the
// regional sums (each the fp32 sum over gateways 0..m-1, rounded to the element type once), i.e.
// exact for float32 in that order. bfloat16/float16 round twice (once per level): the price of
// sending the element type, not fp32, over the WAN; every node still gets the same bits. avg of
// a float type divides by m at the regional level and by n across regions (both in fp32); avg of
// the other types sums both levels and divides by m x n once at the end (integers truncate).
// Lossy codecs, as in AllReduce, only for sum/avg of float32/bfloat16/float16.
//
// Error feedback and stochastic rounding: the cross-region phase of shard i keeps its residuals
// under (job, tensor_key + ":region-shard<i>/<m>") when m > 1 (the plain key when m = 1), each
// the shard's length, and draws its random numbers at the shard's global element positions.
//
// Intra-region messages (tags from MakeTag(RegionSide::op_id, kMeshScatter / kMeshGather, chunk
// id) of the region plan) start with a 16-byte header:
//   off size field (little-endian)
//     0    1 version (kHierarchicalVersion = 2; 1 had no kind 2)
//     1    1 kind: 0 = reduce-scatter part, 1 = all-gather result, 2 = all-gather result frame
//              (explicit, never renumbered)
//     2    1 dtype
//     3    1 op
//     4    4 reserved, zero
//     8    8 the whole tensor's element count
//    16    . payload: kinds 0 and 1 the chunk's elements, raw; kind 2 the owner's whole shard
//              as one lossy frame (strait/codec.h: float32 elements, the shard's count), sent
//              under the tag of the shard's first chunk and standing for all of its chunks
// A part whose dtype, op, count or size differs from this gateway's request fails the operation
// with kInvalidArgument naming both requests (the node heads did not issue the same
// all-reduce); an unknown version or kind, or a frame that does not decode to the shard, is
// kDataLoss.
//
// Failure: every wait ends by request.deadline (phase 2 by a moment earlier: a tenth of the time
// left, at most 2 s, so that a gateway whose cross-region phase times out can still tell its
// region). A gateway that fails aborts the operation (Transport::Abort) on both transports,
// except on the one whose abort made it fail: its region peers and its shard's peers in the other
// regions then stop at once with kAborted naming it and its reason, and the failure spreads
// through the whole cluster instead of each gateway waiting for its deadline. The aborts carry
// RegionSide::abort_note and request.abort_note. On error the contents of `data` are unspecified.
//
// Threads: everything runs on the calling thread (plus AllReduce's helper thread in phase 2).
// Thread-safe with respect to other operations on the same transports when their op ids differ.
//
// Phases 1 and 3 are public too (RegionOperation, RegionReduceScatter, RegionAllGather): library
// mode's host backend (lib/api/host_backend.h) runs them around its own phase 2, which goes
// through its straitd instead of a cross-region transport, with this message format.
#ifndef STRAIT_LIB_COLLECTIVE_HIERARCHICAL_H_
#define STRAIT_LIB_COLLECTIVE_HIERARCHICAL_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "collective/allreduce.h"
#include "collective/plan.h"
#include "collective/transport.h"
#include "common/clock.h"
#include "strait/status.h"
#include "strait/types.h"

namespace strait::collective {

inline constexpr uint8_t kHierarchicalVersion = 2;
inline constexpr size_t kHierarchicalHeaderSize = 16;

// What a HierarchicalAllReduce did, for metrics and logs.
struct HierarchicalStats {
  Shard shard;                     // the part of the tensor this gateway reduced across regions
  AllReduceStats cross;            // phase 2
  uint64_t region_bytes_sent = 0;  // phases 1 and 3, headers included
  uint64_t region_bytes_received = 0;
  // Wall time of phase 1 (the region's reduce-scatter) and of phase 3 (its all-gather, and the
  // wait for this gateway's sends of both to arrive): what the region adds to the cross-region
  // phase, which no byte of the tensor skips.
  int64_t region_scatter_ns = 0;
  int64_t region_gather_ns = 0;
};

// The m shards of a tensor of `count` elements, as phase 1 cuts them (the same on every gateway).
std::vector<Shard> RegionShards(size_t count, int gateways);

// The error-feedback key of the cross-region phase (see the file comment).
std::string RegionShardKey(const std::string& tensor_key, int shard, int gateways);

// Whether phase 1 reduces in fp32 (sum or avg of float32, bfloat16 or float16) rather than
// exactly in the element type. The lossy codecs apply to exactly these pairs.
bool IsFloatReduction(DataType dtype, ReduceOp op);

// The region plan of phases 1 and 3: a mesh plan of `count` elements over `members` ranks with
// equal weights (shard g belongs to rank g; RegionShards are its shards), cut into chunks of at
// most `chunk_elements`. Every member of the region must use the same three numbers. Errors:
// MakePlan's kInvalidArgument (members < 1, chunk_elements 0).
StatusOr<Plan> RegionPlan(size_t count, int members, size_t chunk_elements);

// The deadline of phase 2 for an operation that ends by `deadline` in a region of `members`:
// a tenth of the time left earlier, at most 2 s (see "Failure" above), so that a member whose
// phase 2 times out can still abort the region before the others' waits end. `deadline` itself
// when members is 1 (nobody to tell) or the deadline is infinite.
Deadline CrossPhaseDeadline(Deadline deadline, int members);

// One member's side of an intra-region operation: what RegionReduceScatter and RegionAllGather
// need, and what they report. Members are gateways (HierarchicalAllReduce) or library-mode ranks
// (the host backend); only the wording of errors differs (`names`).
struct RegionOperation {
  // Inputs, the same on every member of the region except for the transport's rank.
  Transport* transport = nullptr;  // the region's m members; this one is transport->rank()
  uint64_t op_id = 0;              // the operation's id on `transport` (see RegionSide::op_id)
  const Plan* plan = nullptr;      // RegionPlan(count, m, ...): outlives the calls
  uint8_t* data = nullptr;         // the whole tensor: plan->count elements of dtype, in place
  DataType dtype = DataType::kFloat32;
  ReduceOp op = ReduceOp::kSum;
  Deadline deadline = Deadline::Infinite();  // ends every wait
  // Called once per message sent; returns the send's completion (Transport::Send's `done`). The
  // phases never wait for their sends: the caller decides whether to (HierarchicalAllReduce
  // waits on success; the host backend only checks for failures). Empty: completions ignored.
  std::function<SendDone()> track_send;
  // Phase 3 only: when set, this member's shard goes to the others as this frame (kind 2: a
  // lossy frame of the shard's elements whose decoding is exactly the shard's bytes in `data`,
  // as AllReduce's result_frame is) instead of raw chunks. Members decide this each on their
  // own: a receiver takes either form from every member.
  const std::vector<uint8_t>* shard_frame = nullptr;
  // How errors word things. A member that differs from this one in dtype, op or count fails with
  // `mismatch_code` and "every <members> must issue the same all-reduces in the same order, but
  // <peer(g)> runs one of ... and <self> one of ...".
  struct Names {
    std::function<std::string(int)> peer;  // empty: "region gateway " + transport->PeerName(g)
    std::string self = "this gateway";
    std::string members = "node head of the region";
    StatusCode mismatch_code = StatusCode::kInvalidArgument;
  } names;

  // Outputs, added to by both phases.
  uint64_t bytes_sent = 0;  // message bytes handed to the transport, headers included
  uint64_t bytes_received = 0;
  // A wait ended with kAborted: another member aborted the operation, so the region has heard of
  // the failure already (aborting it again would only repeat the cause under this name).
  bool peer_aborted = false;
};

// Phase 1, intra-region reduce-scatter: sends this member's part of every other shard to its
// owner (round-robin over owners, so that every member gets its first parts early), then reduces
// its own shard, plan->shards[rank], in member order 0..m-1 into `data` (fp32 where
// IsFloatReduction, avg dividing by m; exactly in the element type otherwise, avg summing). The
// other shards of `data` are left as they were. Preconditions: transport, plan and data (unless
// plan->count is 0) set; plan made for transport->size() members; dtype and op valid. Blocks
// until done or the deadline. Errors: the transport's (kDeadlineExceeded, kUnavailable,
// kAborted naming the peer and the chunk); kDataLoss for a malformed message (short, unknown
// version or kind, wrong size); names.mismatch_code when a member runs another all-reduce;
// kInvalidArgument, before any message, when a precondition does not hold.
// Does not abort the operation on failure: the caller does (Transport::Abort) unless
// peer_aborted. Thread-safe for operations with different op ids.
Status RegionReduceScatter(RegionOperation& op);

// Phase 3, intra-region all-gather: sends this member's shard of `data` (or op.shard_frame) to
// every other member and copies (or decodes) every other member's shard into `data`, so that
// all members end with the same bytes. Preconditions, blocking, errors and aborts as
// RegionReduceScatter's.
Status RegionAllGather(RegionOperation& op);

// The intra-region side of a HierarchicalAllReduce.
struct RegionSide {
  // The region's m gateways; this gateway is rank transport->rank() (its shard index).
  Transport* transport = nullptr;
  // The operation's id on `transport`: equal on the region's gateways, different from every
  // other operation in flight on it. May differ from request.op_id, which is the id on the
  // cross-region transport (each side numbers operations among its own peers).
  uint64_t op_id = 0;
  // Carried with this gateway's abort of the region operation (Transport::Abort).
  std::string abort_note;
};

// Runs the hierarchical all-reduce of `request.data` (request.count elements: the whole tensor)
// on this gateway: rank region.transport->rank() of the region's m gateways and rank
// cross.rank() of the n regions' gateways of its shard index. Every gateway of every region
// calls it with the same request (op ids per transport). Blocks until done or the deadline.
// Errors: kInvalidArgument for a bad request (names the field) or differing requests; the
// transports' errors (kDeadlineExceeded, kUnavailable) naming the gateway or region; kAborted
// naming the gateway that failed first and why; AllReduce's errors for phase 2.
Status HierarchicalAllReduce(const RegionSide& region, Transport& cross,
                             const AllReduceRequest& request, HierarchicalStats* stats = nullptr);

}  // namespace strait::collective

#endif  // STRAIT_LIB_COLLECTIVE_HIERARCHICAL_H_

// Cross-region all-reduce among the gateways that hold the same shard index in every region.
//
// Mesh algorithm (the default; see plan.h for when the ring runs instead):
//   The tensor is split into one shard per rank (the shard's owner), sized in proportion to the
//   owners' link bandwidths, and each shard into chunks that are pipelined.
//   Phase 1: every rank encodes its part of shard i (with its sender error-feedback residual)
//   and sends it to owner i; its own part of its own shard goes through the same encode path.
//   Phase 2: owner i decodes the n frames in fixed rank order 0..n-1, accumulating in fp32,
//   encodes the result once (with its owner residual), sends that one frame to every rank and
//   decodes it for itself too. Every rank therefore ends with bit-identical data, lossy codecs
//   included, and the result does not depend on which rank owns which shard.
//   Chunks overlap: the calling thread encodes and sends chunk after chunk while a second thread
//   reduces and answers for the shard this rank owns; all receives are buffered by the transport.
//
// Numerics:
//   sum/avg of float32/bfloat16/float16: the fp32 path above, with any codec (lossy or
//     lossless). With a lossless codec the result is the fp32 sum in rank order, rounded once to
//     the element type; avg divides the fp32 sum by n before that rounding (and before encoding).
//   every other (op, type) pair (max/min/prod, integers, float64, fp8): lossless codecs only,
//     reduced exactly with strait::ReduceInPlace in rank order in the element type; avg on
//     those types sums and then calls DivideInPlace (integers truncate).
//
// Error feedback (lossy codecs, error_feedback = true): residuals live in `feedback` under
// (job, tensor_key + ":send") for what this rank sent and (job, tensor_key + ":own") for the
// results it encoded as owner, each `count` floats. Keep the same plan (weights, world) from step
// to step: a residual is indexed by element, so a changed split still works but loses the part
// of the residual that moved to another owner.
//
// Failure: every wait is bounded by `deadline`. A peer that never answers makes AllReduce return
// kDeadlineExceeded naming the peer, phase and chunk. A rank whose operation fails once it has
// started (deadline, a failed peer, a corrupt frame; not a request rejected before it touched
// the transport) calls Transport::Abort, so the other ranks' waits end at once with kAborted
// naming that rank and its reason instead of each waiting for its deadline; a rank that failed
// because of such an abort does not echo it. The transport then drops the operation's messages,
// buffered and late. Nothing is ever left half-written silently: on error the contents of `data`
// are unspecified (partly reduced) and the caller must not use them.
#ifndef STRAIT_LIB_COLLECTIVE_ALLREDUCE_H_
#define STRAIT_LIB_COLLECTIVE_ALLREDUCE_H_

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "collective/plan.h"
#include "collective/transport.h"
#include "common/clock.h"
#include "strait/codec.h"
#include "strait/status.h"
#include "strait/types.h"

namespace strait::collective {

struct AllReduceRequest {
  // Keys of the error-feedback residuals; also named in errors.
  std::string job;
  std::string tensor_key;
  // Distinguishes this operation's messages from those of any other operation in flight on the
  // same transport: equal on every rank, different for concurrent operations (e.g. a per-job
  // step counter combined with the job's index). Only the low 38 bits are used. Never reuse the
  // id of an operation that failed: its abort makes every rank drop that id's messages (Mailbox).
  uint64_t op_id = 0;

  DataType dtype = DataType::kFloat32;
  ReduceOp op = ReduceOp::kSum;
  size_t count = 0;
  // In: this rank's contribution; out: the reduction. count elements of dtype; may be unaligned.
  void* data = nullptr;

  // The wire codec. Lossy codecs need op sum/avg on float32/bfloat16/float16. For stochastic
  // rounding, `seed` should identify (job, tensor, step); the algorithm derives per-rank and
  // per-phase streams from it and sets index_offset to each chunk's position.
  CodecOptions codec;
  bool error_feedback = false;
  // Where the residuals live; required when error_feedback is on and the codec is lossy. Not
  // shared with other ranks' threads (each gateway has its own store).
  ErrorFeedbackStore* feedback = nullptr;

  // Per-link codecs (optional; the gateway's `auto` policy fills them: see gateway/policy.h).
  // Indexed by rank, this rank included; empty = `codec` for every frame. The other fields of
  // CodecOptions come from `codec`, which still fixes the plan's chunk alignment and so must be
  // the same on every rank.
  //   send_codecs[p]    this rank's input frames (and ring partial sums) to rank p.
  //   result_codecs[p]  this rank's owner results to rank p (the ring: to the next rank, which
  //                     forwards the same frame). Either one lossy codec in every entry (one
  //                     frame for all: bit-identity) or lossless entries, which may differ (they
  //                     decode to the same values). The owner decodes its own result from the
  //                     frame of result_codecs[rank].
  //   accept_codecs     the codecs a received frame may use (frames name their codec); empty =
  //                     only codec.codec. Anything else fails the operation: codec mismatch.
  std::vector<CodecId> send_codecs;
  std::vector<CodecId> result_codecs;
  std::vector<CodecId> accept_codecs;

  // Per-owner bandwidth estimates (any unit, > 0); empty = equal shards. Same on every rank.
  std::vector<uint64_t> shard_weights;
  // Elements per pipelined chunk (rounded up to the codec block size).
  size_t chunk_elements = kDefaultChunkElements;
  // Mesh, ring, or automatic from `links` (see plan.h). Same on every rank.
  Algorithm algorithm = Algorithm::kAuto;
  std::vector<uint8_t> links;

  // Every wait ends by then. The default is taken when the request is built, not when
  // AllReduce is called: set it per call.
  Deadline deadline = Deadline::AfterSeconds(60);

  // Pre-encoded input (library mode: the rank quantized its contribution itself, on its GPU or
  // CPU, with its own error-feedback residual). When non-empty, `data` is not read: this rank's
  // input is this stage -- the ScaleCount(count, codec.block_size) fp32 scales, then the codes,
  // of `count` elements of `dtype` in the lossy codec.codec (strait/codec.h, "Lossy stage
  // layout"; the payload of an unchained frame). The chunks are cut at block boundaries, so each
  // chunk frame sent to an owner is a slice of it wrapped in a frame header (dtype `dtype`), and
  // the owner decodes its own slice for its own contribution: the same bytes the normal path
  // would send had it encoded `data` with the same options. No sender residual is kept for the
  // input (the rank keeps its own); the owner residual, and the ring's residual for the partial
  // sums it re-encodes, still apply. (On the mesh the result is therefore byte-identical to the
  // normal path's when the rank's frame equals what that path's sender encoding would produce,
  // e.g. round-to-nearest with the same residual; the ring adds a rank's own input from its
  // frame, not exactly, so there it is only as close.) Needs: a lossy codec.codec with
  // chain_zstd off, op sum or avg of float32/bfloat16/float16, send_codecs empty or all
  // codec.codec, and count >= world x block_size (otherwise the plan's shards fall back to
  // element alignment and a block would straddle two owners: kInvalidArgument).
  std::span<const uint8_t> input_stage;
  // Optional out: the result as ONE lossy frame -- codec.codec, block codec.block_size, dtype
  // float32 (owners quantize the fp32 sum), `count` elements, flags kFrameFlagStochastic when
  // codec.rounding is stochastic, never zstd -- whose stage is the owners' result stages in
  // element order. Each owner's result frame goes to every rank, so this frame is byte-identical
  // on every rank, and decoding it gives exactly what `data` receives. Needs a lossy codec.codec,
  // result_codecs empty or all codec.codec, chain_zstd off. With it and input_stage, `data` may
  // be null (nothing is decoded); otherwise `data` receives the decoded result as usual.
  std::vector<uint8_t>* result_frame = nullptr;

  // Carried verbatim with this rank's abort if the operation fails here (Transport::Abort); the
  // gateway puts the job's numbering in it. At most 4 KiB.
  std::string abort_note;
};

// What an AllReduce did, for metrics and logs.
struct AllReduceStats {
  Algorithm algorithm = Algorithm::kMesh;
  uint64_t bytes_sent = 0;      // frame bytes handed to the transport, self-sends excluded
  uint64_t bytes_received = 0;  // frame bytes taken from the transport, self-sends excluded
  uint64_t chunks = 0;          // chunks in the plan
  // Where the time went, summed over the operation's two threads (so they may add up to more
  // than the wall time): codec work (encoding inputs, partials and results; decoding frames into
  // the accumulator, own input added; decoding results), waiting for frames from the transport,
  // and, once done, checking the sends for a failure (it no longer waits for their acks, so
  // ack_wait_ns stays near 0; see AllReduce's end).
  int64_t encode_ns = 0;
  int64_t reduce_ns = 0;
  int64_t decode_ns = 0;
  int64_t wait_ns = 0;
  int64_t ack_wait_ns = 0;
  // wait_ns split by the rank waited for (index = rank; this rank's own entry is the time its
  // frames to itself took, near 0). Frames are taken in a fixed rank order, so a rank whose
  // frames come late collects the wait and the ranks after it find theirs already there: a
  // persistently large entry names a slow peer or link (gateway/straggler.h).
  std::vector<int64_t> peer_wait_ns;
  // Per rank, how much later its frames arrived than the earliest other rank's frame of the same
  // chunk (reduce-scatter) or round (all-gather), summed (the mesh only; the ring leaves zeros).
  // Unlike peer_wait_ns this does not depend on the order frames are taken in: with two or more
  // peers it is what names a slow one (gateway/straggler.h).
  std::vector<int64_t> peer_late_ns;
};

// The PlanOptions AllReduce uses for `request` on a world of `world` ranks (for inspection and
// tests; AllReduce calls MakePlan(PlanFor(...)) itself).
PlanOptions PlanFor(const AllReduceRequest& request, int world);

// Runs the all-reduce of `request.data` across every rank of `transport`. Every rank must call
// it with the same op_id, dtype, op, count, codec, weights, chunk size and algorithm. Blocks
// until done or the deadline; uses the calling thread and one helper thread. Thread-safe with
// respect to other AllReduce calls on the same transport when their op_ids differ.
// Errors: kInvalidArgument for a bad request (names the field); kDeadlineExceeded or the
// transport's error naming the peer; the codec's error for a corrupt frame (kDataLoss).
Status AllReduce(Transport& transport, const AllReduceRequest& request,
                 AllReduceStats* stats = nullptr);

}  // namespace strait::collective

#endif  // STRAIT_LIB_COLLECTIVE_ALLREDUCE_H_

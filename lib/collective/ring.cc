// The ring reduce-scatter and all-gather. Each step interleaves sending chunk c of the outgoing
// segment with receiving chunk c of the incoming one, so a chunk moves on as soon as it arrived
// and the link carries the next chunk while this one is being reduced.
#include "collective/ring.h"

#include <algorithm>
#include <vector>

namespace strait::collective::internal {

Status RunRing(OpContext& ctx) {
  const int n = ctx.world;
  const int r = ctx.rank;
  const int next = (r + 1) % n;
  const int prev = (r + n - 1) % n;
  const uint64_t op = ctx.request->op_id;
  const Plan& plan = ctx.plan;
  Worker w;
  // Accumulators for the whole tensor: a segment's partial sum arrives in one step and leaves in
  // the next, so it must outlive the step.
  std::vector<float> facc(ctx.float_path ? plan.count : 0);
  std::vector<uint8_t> tacc(ctx.float_path ? 0 : plan.count * ctx.elem);
  auto fat = [&](const Chunk& c) { return ctx.float_path ? facc.data() + c.begin : nullptr; };
  auto tat = [&](const Chunk& c) {
    return ctx.float_path ? nullptr : tacc.data() + c.begin * ctx.elem;
  };
  std::vector<std::vector<uint8_t>> finals(plan.chunks.size());
  std::vector<uint8_t> frame;

  // Reduce-scatter: at step s this rank sends segment r-1-s and receives segment r-2-s.
  for (int s = 0; s + 1 < n; ++s) {
    const int send_seg = ((r - 1 - s) % n + n) % n;
    const int recv_seg = ((r - 2 - s) % n + n) % n;
    const size_t rounds = std::max(plan.ChunkCount(send_seg), plan.ChunkCount(recv_seg));
    for (size_t c = 0; c < rounds; ++c) {
      if (ctx.cancelled()) return CancelledError("stopped: the all-reduce failed elsewhere");
      if (c < plan.ChunkCount(send_seg)) {
        const Chunk& chunk = plan.ChunkOf(send_seg, c);
        if (s == 0) {
          STRAIT_RETURN_IF_ERROR(EncodeInput(ctx, w, chunk, next, &frame));
        } else {
          STRAIT_RETURN_IF_ERROR(
              EncodePartial(ctx, w, chunk, next, fat(chunk), tat(chunk), &frame));
        }
        SendFrame(ctx, next, MakeTag(op, TagPhase::kRingScatter, chunk.id), std::move(frame));
        frame = {};
      }
      if (c < plan.ChunkCount(recv_seg)) {
        const Chunk& chunk = plan.ChunkOf(recv_seg, c);
        STRAIT_RETURN_IF_ERROR(RecvFrame(ctx, prev, MakeTag(op, TagPhase::kRingScatter, chunk.id),
                                         "ring reduce-scatter", chunk, &frame));
        STRAIT_RETURN_IF_ERROR(
            AccumulateFrame(ctx, w, frame, chunk, /*first=*/true, fat(chunk), tat(chunk)));
        STRAIT_RETURN_IF_ERROR(AddOwnInput(ctx, w, chunk, fat(chunk), tat(chunk)));
        if (recv_seg == r) {
          // The segment is complete here: encode it once, for everyone.
          STRAIT_RETURN_IF_ERROR(
              EncodeResult(ctx, w, chunk, fat(chunk), tat(chunk), ResultCodec(ctx, next),
                           &finals[chunk.id]));
          STRAIT_RETURN_IF_ERROR(DecodeResult(ctx, w, finals[chunk.id], chunk));
        }
      }
    }
  }

  // All-gather: at step s this rank forwards segment r-s and receives segment r-1-s.
  for (int s = 0; s + 1 < n; ++s) {
    const int send_seg = ((r - s) % n + n) % n;
    const int recv_seg = ((r - 1 - s) % n + n) % n;
    const size_t rounds = std::max(plan.ChunkCount(send_seg), plan.ChunkCount(recv_seg));
    for (size_t c = 0; c < rounds; ++c) {
      if (ctx.cancelled()) return CancelledError("stopped: the all-reduce failed elsewhere");
      if (c < plan.ChunkCount(send_seg)) {
        const Chunk& chunk = plan.ChunkOf(send_seg, c);
        SendFrame(ctx, next, MakeTag(op, TagPhase::kRingGather, chunk.id),
                  std::move(finals[chunk.id]));
        finals[chunk.id] = {};
      }
      if (c < plan.ChunkCount(recv_seg)) {
        const Chunk& chunk = plan.ChunkOf(recv_seg, c);
        STRAIT_RETURN_IF_ERROR(RecvFrame(ctx, prev, MakeTag(op, TagPhase::kRingGather, chunk.id),
                                         "ring all-gather", chunk, &frame));
        STRAIT_RETURN_IF_ERROR(DecodeResult(ctx, w, frame, chunk));
        // The last rank of the chain (the one before the owner) needs not forward it.
        if (s + 2 < n) finals[chunk.id] = std::move(frame);
        frame = {};
      }
    }
  }
  return Status::Ok();
}

}  // namespace strait::collective::internal

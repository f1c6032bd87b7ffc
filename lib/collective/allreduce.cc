// AllReduce: request checks, the plan, the mesh algorithm, and the dispatch to the ring.
//
// Mesh threads: the calling thread encodes and sends this rank's parts of every shard, chunk
// by chunk (round-robin over owners so that every owner gets work early), then receives and
// decodes the other owners' results. A helper thread does the owner's work for this rank's
// shard as the frames arrive. The two touch disjoint parts of the caller's buffer at any time:
// the owner thread overwrites a chunk of its shard only after receiving this rank's own frame of
// that chunk, which the calling thread sent after it had read the chunk.
#include "collective/allreduce.h"

#include <algorithm>
#include <string>
#include <thread>

#include "codec/crc32c.h"
#include "codec/frame.h"
#include "collective/engine.h"
#include "collective/ring.h"

namespace strait::collective {
namespace {

using internal::OpContext;
using internal::Worker;

bool IsFloatPath(DataType dtype, ReduceOp op) {
  return IsLossyCodableType(dtype) && (op == ReduceOp::kSum || op == ReduceOp::kAvg);
}

// The per-link codec vectors: sized to the world, lossy entries only where the request could
// use the codec itself, and one lossy codec for all results or none.
Status ValidateLinkCodecs(const Transport& transport, const AllReduceRequest& r) {
  const size_t world = static_cast<size_t>(transport.size());
  const std::pair<const char*, const std::vector<CodecId>*> lists[] = {
      {"send_codecs", &r.send_codecs}, {"result_codecs", &r.result_codecs}};
  for (const auto& [name, list] : lists) {
    if (list->empty()) continue;
    if (list->size() != world) {
      return InvalidArgumentError(std::string(name) + " has " + std::to_string(list->size()) +
                                  " entries for a world of " + std::to_string(world));
    }
    for (CodecId c : *list) {
      if (static_cast<int>(c) >= kNumCodecs) {
        return InvalidArgumentError(std::string(name) + ": invalid codec " +
                                    std::to_string(static_cast<int>(c)));
      }
      if (!IsLossyCodec(c)) continue;
      if (!IsFloatPath(r.dtype, r.op)) {
        return InvalidArgumentError(std::string(name) + ": codec " + CodecName(c) +
                                    " is lossy and applies only to sum or avg of float32, "
                                    "bfloat16 or float16, not " + ReduceOpName(r.op) + " of " +
                                    DataTypeName(r.dtype));
      }
      CodecOptions o = r.codec;
      o.codec = c;
      STRAIT_RETURN_IF_ERROR(ValidateCodecOptions(o, DataType::kFloat32).WithContext(name));
    }
  }
  if (!r.result_codecs.empty()) {
    const CodecId first = r.result_codecs[0];
    for (CodecId c : r.result_codecs) {
      if ((IsLossyCodec(c) || IsLossyCodec(first)) && c != first) {
        return InvalidArgumentError(
            std::string("result_codecs mixes ") + CodecName(first) + " and " + CodecName(c) +
            ": a lossy result must be one frame, in one codec, for every rank");
      }
    }
  }
  return Status::Ok();
}

// Pre-encoded input and the result as one frame: both move lossy stages around unchanged, so
// they need one lossy codec for every frame, unchained.
Status ValidateFrameModes(const AllReduceRequest& r) {
  const bool pre = !r.input_stage.empty();
  if (!pre && r.result_frame == nullptr) return Status::Ok();
  const char* what = pre ? "input_stage" : "result_frame";
  const CodecId c = r.codec.codec;
  if (!IsLossyCodec(c)) {
    return InvalidArgumentError(std::string(what) + " needs a lossy codec (int8, int4, fp8), not " +
                                CodecName(c));
  }
  if (r.codec.chain_zstd) {
    return InvalidArgumentError(std::string(what) +
                                " needs unchained frames: set codec.chain_zstd off");
  }
  auto all_same = [c](const std::vector<CodecId>& v) {
    return std::all_of(v.begin(), v.end(), [c](CodecId x) { return x == c; });
  };
  if (pre && !all_same(r.send_codecs)) {
    return InvalidArgumentError(std::string("input_stage is one codec's stage: send_codecs must "
                                            "be empty or all ") +
                                CodecName(c));
  }
  if (r.result_frame != nullptr && !all_same(r.result_codecs)) {
    return InvalidArgumentError(std::string("result_frame is one frame: result_codecs must be "
                                            "empty or all ") +
                                CodecName(c));
  }
  if (pre) {
    const auto stage = codec_internal::ExpectedStageSize(c, r.dtype, r.count, r.codec.block_size);
    if (!stage.has_value() || *stage != r.input_stage.size()) {
      return InvalidArgumentError(
          "input_stage has " + std::to_string(r.input_stage.size()) + " bytes; " +
          std::to_string(r.count) + " elements of " + CodecName(c) + " with block size " +
          std::to_string(r.codec.block_size) + " take " +
          (stage.has_value() ? std::to_string(*stage) : std::string("(invalid options)")));
    }
  }
  return Status::Ok();
}

Status Validate(const Transport& transport, const AllReduceRequest& r) {
  if (transport.size() < 1 || transport.rank() < 0 || transport.rank() >= transport.size()) {
    return InvalidArgumentError("transport reports rank " + std::to_string(transport.rank()) +
                                " of " + std::to_string(transport.size()));
  }
  if (!IsValidDataType(static_cast<uint8_t>(r.dtype))) {
    return InvalidArgumentError("dtype: invalid value " +
                                std::to_string(static_cast<int>(r.dtype)));
  }
  if (!IsValidReduceOp(static_cast<uint8_t>(r.op))) {
    return InvalidArgumentError("op: invalid value " + std::to_string(static_cast<int>(r.op)));
  }
  // With a pre-encoded input and a result frame nothing reads or writes `data`.
  const bool data_unused = !r.input_stage.empty() && r.result_frame != nullptr;
  if (r.count > 0 && r.data == nullptr && !data_unused) {
    return InvalidArgumentError("data is null for " + std::to_string(r.count) + " elements");
  }
  const bool lossy = IsLossyCodec(r.codec.codec);
  if (lossy && !IsFloatPath(r.dtype, r.op)) {
    return InvalidArgumentError(
        std::string("codec ") + CodecName(r.codec.codec) +
        " is lossy and applies only to sum or avg of float32, bfloat16 or float16, not " +
        ReduceOpName(r.op) + " of " + DataTypeName(r.dtype) + "; use codec none or zstd");
  }
  STRAIT_RETURN_IF_ERROR(ValidateCodecOptions(r.codec, r.dtype).WithContext("codec"));
  if (lossy) {
    STRAIT_RETURN_IF_ERROR(ValidateCodecOptions(r.codec, DataType::kFloat32).WithContext("codec"));
  }
  STRAIT_RETURN_IF_ERROR(ValidateLinkCodecs(transport, r));
  STRAIT_RETURN_IF_ERROR(ValidateFrameModes(r));
  if (internal::AnyLossy(r) && r.error_feedback && r.feedback == nullptr) {
    return InvalidArgumentError("error_feedback is on but no ErrorFeedbackStore was given");
  }
  if (r.chunk_elements == 0 || r.chunk_elements > kMaxFrameElements) {
    return InvalidArgumentError("chunk_elements must lie in [1, 2^40], not " +
                                std::to_string(r.chunk_elements));
  }
  return Status::Ok();
}

Status OwnerLoop(OpContext& ctx) {
  const int owner = ctx.rank;
  const size_t chunks = ctx.plan.ChunkCount(owner);
  if (chunks == 0) return Status::Ok();
  Worker w;
  std::vector<float> facc;
  std::vector<uint8_t> tacc;
  std::vector<uint8_t> frame;
  // The result's codecs: one per distinct entry of result_codecs (lossless ones may differ per
  // rank), and which of them each rank gets; the owner decodes its own entry's frame.
  std::vector<CodecId> codecs;
  std::vector<size_t> frame_of(static_cast<size_t>(ctx.world));
  for (int p = 0; p < ctx.world; ++p) {
    const CodecId c = internal::ResultCodec(ctx, p);
    auto it = std::find(codecs.begin(), codecs.end(), c);
    frame_of[static_cast<size_t>(p)] = static_cast<size_t>(it - codecs.begin());
    if (it == codecs.end()) codecs.push_back(c);
  }
  std::vector<std::vector<uint8_t>> results;
  std::vector<int64_t> arrivals(static_cast<size_t>(ctx.world), 0);
  for (size_t k = 0; k < chunks; ++k) {
    const Chunk& chunk = ctx.plan.ChunkOf(owner, k);
    if (ctx.float_path) {
      facc.resize(chunk.count);
    } else {
      tacc.resize(chunk.count * ctx.elem);
    }
    // Fixed rank order: the sum does not depend on which frame arrived first.
    for (int r = 0; r < ctx.world; ++r) {
      int64_t* arrived = r == owner ? nullptr : &arrivals[static_cast<size_t>(r)];
      STRAIT_RETURN_IF_ERROR(
          internal::RecvFrame(ctx, r, MakeTag(ctx.request->op_id, TagPhase::kMeshScatter, chunk.id),
                              "reduce-scatter", chunk, &frame, arrived));
      STRAIT_RETURN_IF_ERROR(
          internal::AccumulateFrame(ctx, w, frame, chunk, r == 0, facc.data(), tacc.data()));
    }
    internal::AddLateness(ctx, arrivals);
    STRAIT_RETURN_IF_ERROR(internal::EncodeResults(ctx, w, chunk, facc.data(), tacc.data(),
                                                   codecs, &results));
    const uint64_t tag = MakeTag(ctx.request->op_id, TagPhase::kMeshGather, chunk.id);
    for (int j = 1; j < ctx.world; ++j) {
      const int peer = (owner + j) % ctx.world;
      // A copy per peer (the owner keeps its own), with the transport's headroom.
      const std::vector<uint8_t>& result = results[frame_of[static_cast<size_t>(peer)]];
      std::vector<uint8_t> copy;
      copy.reserve(result.size() + kSendHeadroom);
      copy.assign(result.begin(), result.end());
      internal::SendFrame(ctx, peer, tag, std::move(copy));
    }
    // The owner keeps exactly what it sent, not its fp32 accumulator.
    STRAIT_RETURN_IF_ERROR(
        internal::DecodeResult(ctx, w, results[frame_of[static_cast<size_t>(owner)]], chunk));
  }
  return Status::Ok();
}

Status SenderLoop(OpContext& ctx) {
  const int n = ctx.world;
  size_t rounds = 0;
  for (int i = 0; i < n; ++i) rounds = std::max(rounds, ctx.plan.ChunkCount(i));
  Worker w;
  std::vector<uint8_t> frame;
  for (size_t k = 0; k < rounds; ++k) {
    // This rank's own shard comes last in each round: the owner thread works on it meanwhile.
    for (int j = 1; j <= n; ++j) {
      const int owner = (ctx.rank + j) % n;
      if (k >= ctx.plan.ChunkCount(owner)) continue;
      if (ctx.cancelled()) return CancelledError("stopped: the all-reduce failed elsewhere");
      const Chunk& chunk = ctx.plan.ChunkOf(owner, k);
      STRAIT_RETURN_IF_ERROR(internal::EncodeInput(ctx, w, chunk, owner, &frame));
      internal::SendFrame(ctx, owner, MakeTag(ctx.request->op_id, TagPhase::kMeshScatter, chunk.id),
                          std::move(frame));
      frame = {};
    }
  }
  std::vector<int64_t> arrivals(static_cast<size_t>(n), 0);
  for (size_t k = 0; k < rounds; ++k) {
    std::fill(arrivals.begin(), arrivals.end(), 0);
    for (int j = 1; j < n; ++j) {
      const int owner = (ctx.rank + j) % n;
      if (k >= ctx.plan.ChunkCount(owner)) continue;
      const Chunk& chunk = ctx.plan.ChunkOf(owner, k);
      STRAIT_RETURN_IF_ERROR(internal::RecvFrame(
          ctx, owner, MakeTag(ctx.request->op_id, TagPhase::kMeshGather, chunk.id), "all-gather",
          chunk, &frame, &arrivals[static_cast<size_t>(owner)]));
      STRAIT_RETURN_IF_ERROR(internal::DecodeResult(ctx, w, frame, chunk));
    }
    internal::AddLateness(ctx, arrivals);
  }
  return Status::Ok();
}

Status RunMesh(OpContext& ctx) {
  std::thread owner;
  if (ctx.plan.ChunkCount(ctx.rank) > 0) {
    owner = std::thread([&ctx] { ctx.Fail(OwnerLoop(ctx)); });
  }
  ctx.Fail(SenderLoop(ctx));
  if (owner.joinable()) owner.join();
  return ctx.first_error();
}

// The header of request.result_frame, once every chunk's stage is in place.
void WriteResultHeader(const AllReduceRequest& request, const OpContext& ctx) {
  std::vector<uint8_t>& frame = *request.result_frame;
  FrameInfo info;
  info.codec = request.codec.codec;
  info.dtype = DataType::kFloat32;  // owners quantize the fp32 sum
  info.flags = request.codec.rounding == Rounding::kStochastic ? kFrameFlagStochastic : 0;
  info.block_size = request.codec.block_size;
  info.element_count = request.count;
  info.payload_size = frame.size() - kFrameHeaderSize;
  info.stage_size = info.payload_size;
  codec_internal::WriteFrameHeader(info, Crc32c(ctx.result_stage, info.payload_size), frame.data());
}

}  // namespace

PlanOptions PlanFor(const AllReduceRequest& request, int world) {
  PlanOptions o;
  o.count = request.count;
  o.world = world;
  o.weights = request.shard_weights;
  o.align = IsLossyCodec(request.codec.codec) ? std::max<uint32_t>(request.codec.block_size, 1) : 1;
  o.chunk_elements = request.chunk_elements;
  o.algorithm = request.algorithm;
  o.links = request.links;
  return o;
}

Status AllReduce(Transport& transport, const AllReduceRequest& request, AllReduceStats* stats) {
  const std::string what = "all-reduce " + request.job + "/" + request.tensor_key;
  STRAIT_RETURN_IF_ERROR(Validate(transport, request).WithContext(what));
  auto plan = MakePlan(PlanFor(request, transport.size()));
  if (!plan.ok()) return plan.status().WithContext(what);

  OpContext ctx;
  ctx.request = &request;
  ctx.transport = &transport;
  ctx.plan = std::move(plan).value();
  ctx.rank = transport.rank();
  ctx.world = transport.size();
  ctx.elem = DataTypeSize(request.dtype);
  ctx.data = static_cast<uint8_t*>(request.data);
  ctx.float_path = IsFloatPath(request.dtype, request.op);
  ctx.lossy = internal::AnyLossy(request);
  ctx.exact_op = request.op == ReduceOp::kAvg ? ReduceOp::kSum : request.op;
  ctx.input_stage = request.input_stage;
  if ((!request.input_stage.empty() || request.result_frame != nullptr) && request.count > 0 &&
      ctx.plan.align != request.codec.block_size) {
    // The plan fell back to element alignment: fewer blocks than ranks.
    return InvalidArgumentError(std::to_string(request.count) + " elements are fewer than " +
                                std::to_string(ctx.world) + " ranks x block size " +
                                std::to_string(request.codec.block_size) +
                                ": a pre-encoded input or a result frame needs whole blocks "
                                "per owner (use a smaller block size, or the plain all-reduce "
                                "for tensors this small)")
        .WithContext(what);
  }
  if (request.result_frame != nullptr) {
    // Sized now; DecodeResult fills the payload chunk by chunk, the header is written last.
    const uint32_t block = request.codec.block_size;
    const size_t codes =
        request.codec.codec == CodecId::kInt4 ? (request.count + 1) / 2 : request.count;
    ctx.result_codes_at = (request.count + block - 1) / block * sizeof(float);
    request.result_frame->assign(kFrameHeaderSize + ctx.result_codes_at + codes, 0);
    ctx.result_stage = request.result_frame->data() + kFrameHeaderSize;
  }
  if (ctx.lossy && request.error_feedback && request.count > 0) {
    // A pre-encoded input carries the rank's own feedback: no sender residual for it here; the
    // ring's partial sums, which this rank encodes, still keep theirs.
    if (request.input_stage.empty() || ctx.plan.algorithm == Algorithm::kRing) {
      ctx.send_residual =
          request.feedback->Residual(request.job, request.tensor_key + ":send", request.count);
    }
    ctx.own_residual =
        request.feedback->Residual(request.job, request.tensor_key + ":own", request.count);
  }
  if (stats != nullptr) {
    ctx.peer_wait_ns = std::make_unique<std::atomic<int64_t>[]>(static_cast<size_t>(ctx.world));
    ctx.peer_late_ns = std::make_unique<std::atomic<int64_t>[]>(static_cast<size_t>(ctx.world));
    *stats = AllReduceStats{};
    stats->algorithm = ctx.plan.algorithm;
    stats->chunks = ctx.plan.chunks.size();
  }
  if (request.count == 0) {
    if (request.result_frame != nullptr) WriteResultHeader(request, ctx);
    return Status::Ok();
  }

  // A one-rank ring is the mesh (the owner talks only to itself).
  Status status = ctx.plan.algorithm == Algorithm::kRing && ctx.world > 1 ? internal::RunRing(ctx)
                                                                          : RunMesh(ctx);
  // On success this rank's result is complete, and the operation is done here without waiting
  // for the acknowledgements of its last sends (one round trip and more behind busy streams,
  // 40-200 ms per step over a WAN). Waiting would protect nothing of this rank: the transport
  // owns the bytes and the completions hold only shared state, so they may run later; every
  // result came back, so every owner had this rank's inputs; what may still be in flight are
  // frames other ranks need (this rank's owner results, the ring's forwards), and a rank that
  // does not get them fails on its own (the link's failure or its deadline, naming this rank)
  // and aborts, which restarts the numbering everywhere, as for any failure of a peer. A send
  // that has already failed still fails the operation here. (The gateway flushes its links
  // before it shuts down, so that a result in flight is not cut off by a SIGTERM.)
  const int64_t ack_wait_start = MonotonicNanos();
  if (status.ok()) {
    // An expired deadline: Wait reports a send that failed already and does not block; pending
    // sends alone give kDeadlineExceeded, which is not a failure while the operation's own
    // deadline holds (a send that failed by its deadline means that one has passed).
    Status sent = ctx.sends.Wait(Deadline::After(0));
    if (!sent.ok() &&
        (sent.code() != StatusCode::kDeadlineExceeded || request.deadline.Expired())) {
      status = std::move(sent);
    }
  }
  const int64_t ack_wait_ns = MonotonicNanos() - ack_wait_start;
  if (status.ok() && request.result_frame != nullptr) WriteResultHeader(request, ctx);
  // Tell the other ranks, unless this failure is their abort reaching us (kAborted): echoing it
  // would only repeat the cause under this rank's name.
  if (!status.ok() && status.code() != StatusCode::kAborted) {
    transport.Abort(request.op_id, status.WithContext(what), request.abort_note);
  }
  if (stats != nullptr) {
    stats->bytes_sent = ctx.bytes_sent.load();
    stats->bytes_received = ctx.bytes_received.load();
    stats->encode_ns = ctx.encode_ns.load();
    stats->reduce_ns = ctx.reduce_ns.load();
    stats->decode_ns = ctx.decode_ns.load();
    stats->wait_ns = ctx.wait_ns.load();
    stats->ack_wait_ns = ack_wait_ns;
    stats->peer_wait_ns.resize(static_cast<size_t>(ctx.world));
    stats->peer_late_ns.resize(static_cast<size_t>(ctx.world));
    for (size_t p = 0; p < stats->peer_wait_ns.size(); ++p) {
      stats->peer_wait_ns[p] = ctx.peer_wait_ns[p].load();
      stats->peer_late_ns[p] = ctx.peer_late_ns[p].load();
    }
  }
  return status.WithContext(what);
}

}  // namespace strait::collective

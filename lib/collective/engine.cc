// The chunk-level steps of the all-reduce. The fp32 path decodes and accumulates in float; the
// exact path decodes into the element type and reduces with strait::ReduceInPlace. Every step
// that encodes derives its stochastic-rounding stream from the request's seed, a salt for who
// encodes, and the chunk's position, so a chunk's bytes do not depend on timing.
#include "collective/engine.h"

#include <algorithm>
#include <cstring>
#include <optional>
#include <string>

#include "codec/crc32c.h"
#include "codec/frame.h"
#include "common/hash.h"
#include "common/strings.h"
#include "strait/reduce.h"

namespace strait::collective::internal {
namespace {

// How long one wait on the transport lasts before checking whether the operation was cancelled
// by a failure on another thread.
constexpr int64_t kCancelPollNanos = 50'000'000;

// Salt 0 is an owner's result; 1 + rank is what that rank encodes of its input or partial sums.
CodecOptions OptionsFor(const OpContext& ctx, const Chunk& chunk, uint64_t salt, CodecId codec) {
  CodecOptions o = ctx.request->codec;
  o.codec = codec;
  o.seed = Mix64(o.seed ^ Mix64(salt));  // distinct salts give unrelated seeds
  o.index_offset = o.index_offset + chunk.begin;
  return o;
}

std::string ChunkText(const Chunk& chunk) {
  return "chunk " + std::to_string(chunk.id) + " (elements " + std::to_string(chunk.begin) + ".." +
         std::to_string(chunk.begin + chunk.count) + " of shard " + std::to_string(chunk.owner) +
         ")";
}

// Codec errors carry the step and chunk, so that a corrupt frame can be traced to its sender.
Status InChunk(Status status, const char* step, const Chunk& chunk) {
  if (status.ok()) return status;
  return status.WithContext(std::string(step) + " " + ChunkText(chunk));
}

// The codec a received frame is held to: the request's codec, or (with accept_codecs) the
// frame's own codec if it is one of them. A frame too short to name one is left to the decoder,
// which reports it truncated; a corrupt header is reported as corrupt, not as a mismatch.
Status ExpectedCodec(const OpContext& ctx, std::span<const uint8_t> frame, const char* step,
                     const Chunk& chunk, CodecId* codec) {
  const AllReduceRequest& r = *ctx.request;
  *codec = r.codec.codec;
  if (r.accept_codecs.empty() || frame.size() < kFrameHeaderSize) return Status::Ok();
  const CodecId named = static_cast<CodecId>(frame[8]);  // the header's codec byte
  if (std::find(r.accept_codecs.begin(), r.accept_codecs.end(), named) !=
      r.accept_codecs.end()) {
    *codec = named;
    return Status::Ok();
  }
  STRAIT_RETURN_IF_ERROR(InChunk(InspectFrame(frame).status(), step, chunk));
  std::string accepted;
  for (CodecId c : r.accept_codecs) {
    AppendToList(accepted, CodecName(c));
  }
  return InChunk(InvalidArgumentError(std::string("codec mismatch: the frame is ") +
                                      CodecName(named) + ", this operation accepts " + accepted +
                                      " (do the regions' policies for the job differ?)"),
                 step, chunk);
}

// Bytes of `count` codes of a lossy codec (int4 packs two per byte, element 2i low).
size_t CodeBytesOf(CodecId codec, size_t count) {
  return codec == CodecId::kInt4 ? (count + 1) / 2 : count;
}

// The chunk's slice of a pre-encoded input stage, wrapped in a frame of the request's dtype:
// the bytes Encoder would write for the chunk had it quantized the same values itself. The
// chunk starts on a block boundary (AllReduce checks the plan's alignment), so its scales and
// codes are contiguous runs of the stage.
void SliceInput(const OpContext& ctx, const Chunk& chunk, std::vector<uint8_t>* out) {
  const AllReduceRequest& r = *ctx.request;
  const size_t block = r.codec.block_size;
  const size_t scale_bytes = (chunk.count + block - 1) / block * sizeof(float);
  const size_t code_bytes = CodeBytesOf(r.codec.codec, chunk.count);
  const size_t codes_at = (r.count + block - 1) / block * sizeof(float);
  const size_t payload = scale_bytes + code_bytes;
  out->reserve(kFrameHeaderSize + payload + kSendHeadroom);
  out->resize(kFrameHeaderSize + payload);
  uint8_t* p = out->data() + kFrameHeaderSize;
  std::memcpy(p, ctx.input_stage.data() + chunk.begin / block * sizeof(float), scale_bytes);
  std::memcpy(p + scale_bytes,
              ctx.input_stage.data() + codes_at + CodeBytesOf(r.codec.codec, chunk.begin),
              code_bytes);
  FrameInfo info;
  info.codec = r.codec.codec;
  info.dtype = r.dtype;
  info.flags = r.codec.rounding == Rounding::kStochastic ? kFrameFlagStochastic : 0;
  info.block_size = r.codec.block_size;
  info.element_count = chunk.count;
  info.payload_size = payload;
  info.stage_size = payload;
  codec_internal::WriteFrameHeader(info, Crc32c(p, payload), out->data());
}

}  // namespace

SendDone SendTracker::Track() {
  {
    std::lock_guard<std::mutex> lock(state_->mu);
    ++state_->pending;
  }
  return [state = state_](Status status) {
    std::lock_guard<std::mutex> lock(state->mu);
    if (!status.ok() && state->first_error.ok()) state->first_error = std::move(status);
    --state->pending;
    state->cv.notify_all();
  };
}

Status SendTracker::Wait(Deadline deadline) {
  std::unique_lock<std::mutex> lock(state_->mu);
  while (state_->pending > 0 && !deadline.Expired()) {
    const int64_t wait_ns = std::min<int64_t>(deadline.RemainingNanos(), 1'000'000'000);
    state_->cv.wait_for(lock, std::chrono::nanoseconds(wait_ns));
  }
  if (!state_->first_error.ok()) return state_->first_error;
  if (state_->pending > 0) {
    return DeadlineExceededError(std::to_string(state_->pending) +
                                 " sends were not delivered before the deadline");
  }
  return Status::Ok();
}

void OpContext::Fail(Status status) {
  if (status.ok()) return;
  {
    std::lock_guard<std::mutex> lock(mu_);
    // A kCancelled status is only the echo of another thread's failure: keep the cause.
    if (first_error_.ok() || (first_error_.code() == StatusCode::kCancelled &&
                              status.code() != StatusCode::kCancelled)) {
      first_error_ = std::move(status);
    }
  }
  cancelled_.store(true, std::memory_order_release);
}

Status OpContext::first_error() const {
  std::lock_guard<std::mutex> lock(mu_);
  return first_error_;
}

void SendFrame(OpContext& ctx, int peer, uint64_t tag, std::vector<uint8_t> frame) {
  if (peer != ctx.rank) ctx.bytes_sent.fetch_add(frame.size(), std::memory_order_relaxed);
  ctx.transport->Send(peer, tag, std::move(frame), ctx.request->deadline, ctx.sends.Track());
}

Status RecvFrame(OpContext& ctx, int peer, uint64_t tag, const char* phase, const Chunk& chunk,
                 std::vector<uint8_t>* out, int64_t* arrived_ns) {
  const PhaseTimer timer(ctx.wait_ns);
  std::optional<PhaseTimer> peer_timer;
  if (ctx.peer_wait_ns != nullptr) peer_timer.emplace(ctx.peer_wait_ns[static_cast<size_t>(peer)]);
  const Deadline deadline = ctx.request->deadline;
  while (true) {
    if (ctx.cancelled()) return CancelledError("stopped: the all-reduce failed elsewhere");
    const int64_t slice = std::min<int64_t>(deadline.RemainingNanos(), kCancelPollNanos);
    const bool last_slice = slice >= deadline.RemainingNanos();
    Status s = ctx.transport->RecvStamped(peer, tag, Deadline::After(slice), out, arrived_ns);
    if (s.ok()) {
      if (peer != ctx.rank) ctx.bytes_received.fetch_add(out->size(), std::memory_order_relaxed);
      return s;
    }
    if (s.code() == StatusCode::kDeadlineExceeded && !last_slice && !deadline.Expired()) {
      continue;
    }
    return s.WithContext(std::string(phase) + ": waiting for " + ctx.transport->PeerName(peer) +
                         "'s frame of " + ChunkText(chunk));
  }
}

void AddLateness(OpContext& ctx, const std::vector<int64_t>& arrivals) {
  if (ctx.peer_late_ns == nullptr) return;
  int64_t first = 0;
  for (int64_t a : arrivals) {
    if (a != 0 && (first == 0 || a < first)) first = a;
  }
  for (size_t p = 0; p < arrivals.size(); ++p) {
    if (arrivals[p] != 0) ctx.peer_late_ns[p].fetch_add(arrivals[p] - first);
  }
}

bool AnyLossy(const AllReduceRequest& r) {
  auto lossy = [](const std::vector<CodecId>& v) {
    return std::any_of(v.begin(), v.end(), [](CodecId c) { return IsLossyCodec(c); });
  };
  return IsLossyCodec(r.codec.codec) || lossy(r.send_codecs) || lossy(r.result_codecs);
}

CodecId SendCodec(const OpContext& ctx, int peer) {
  const auto& v = ctx.request->send_codecs;
  return v.empty() ? ctx.request->codec.codec : v[static_cast<size_t>(peer)];
}

CodecId ResultCodec(const OpContext& ctx, int peer) {
  const auto& v = ctx.request->result_codecs;
  return v.empty() ? ctx.request->codec.codec : v[static_cast<size_t>(peer)];
}

Status EncodeInput(OpContext& ctx, Worker& w, const Chunk& chunk, int to,
                   std::vector<uint8_t>* out) {
  const PhaseTimer timer(ctx.encode_ns);
  if (!ctx.input_stage.empty()) {
    SliceInput(ctx, chunk, out);
    return Status::Ok();
  }
  const CodecOptions o =
      OptionsFor(ctx, chunk, 1 + static_cast<uint64_t>(ctx.rank), SendCodec(ctx, to));
  const uint8_t* src = ctx.data + chunk.begin * ctx.elem;
  const DataType dtype = ctx.request->dtype;
  if (!ctx.send_residual.empty()) {
    return InChunk(w.encoder.EncodeWithFeedback(src, chunk.count, dtype, o,
                                                ctx.send_residual.data() + chunk.begin, out),
                   "encoding input", chunk);
  }
  return InChunk(w.encoder.Encode(src, chunk.count, dtype, o, out), "encoding input", chunk);
}

Status AccumulateFrame(OpContext& ctx, Worker& w, std::span<const uint8_t> frame,
                       const Chunk& chunk, bool first, float* facc, uint8_t* tacc) {
  const PhaseTimer timer(ctx.reduce_ns);
  DecodeExpectations expect;
  CodecId codec;
  STRAIT_RETURN_IF_ERROR(ExpectedCodec(ctx, frame, "accumulating", chunk, &codec));
  expect.codec = codec;
  expect.element_count = chunk.count;
  if (ctx.float_path) {
    // Partial sums of the ring travel as fp32 frames, inputs in the element type; both decode
    // into the fp32 accumulator.
    if (first) std::fill(facc, facc + chunk.count, 0.0f);
    return InChunk(w.decoder.DecodeAccumulate(frame, facc, chunk.count, expect), "accumulating",
                   chunk);
  }
  expect.dtype = ctx.request->dtype;
  if (first) {
    return InChunk(w.decoder.Decode(frame, tacc, chunk.count, ctx.request->dtype, expect),
                   "accumulating", chunk);
  }
  w.bytes.resize(chunk.count * ctx.elem);
  STRAIT_RETURN_IF_ERROR(
      InChunk(w.decoder.Decode(frame, w.bytes.data(), chunk.count, ctx.request->dtype, expect),
              "accumulating", chunk));
  return ReduceInPlace(ctx.request->dtype, ctx.exact_op, w.bytes.data(), tacc, chunk.count);
}

Status AddOwnInput(OpContext& ctx, Worker& w, const Chunk& chunk, float* facc, uint8_t* tacc) {
  const PhaseTimer timer(ctx.reduce_ns);
  if (!ctx.input_stage.empty()) {
    // Own contribution = what the rank's frame decodes to, exactly as for the other ranks'.
    SliceInput(ctx, chunk, &w.bytes);
    return InChunk(w.decoder.DecodeAccumulate(w.bytes, facc, chunk.count), "adding own input",
                   chunk);
  }
  const uint8_t* src = ctx.data + chunk.begin * ctx.elem;
  if (ctx.float_path) {
    w.floats.resize(chunk.count);
    STRAIT_RETURN_IF_ERROR(ConvertToFloat(src, ctx.request->dtype, w.floats.data(), chunk.count));
    for (size_t i = 0; i < chunk.count; ++i) facc[i] += w.floats[i];
    return Status::Ok();
  }
  return ReduceInPlace(ctx.request->dtype, ctx.exact_op, src, tacc, chunk.count);
}

Status EncodePartial(OpContext& ctx, Worker& w, const Chunk& chunk, int to, const float* facc,
                     const uint8_t* tacc, std::vector<uint8_t>* out) {
  const PhaseTimer timer(ctx.encode_ns);
  const CodecOptions o =
      OptionsFor(ctx, chunk, 1 + static_cast<uint64_t>(ctx.rank), SendCodec(ctx, to));
  if (!ctx.float_path) {
    return InChunk(w.encoder.Encode(tacc, chunk.count, ctx.request->dtype, o, out),
                   "encoding partial", chunk);
  }
  if (!ctx.send_residual.empty()) {
    return InChunk(w.encoder.EncodeWithFeedback(facc, chunk.count, DataType::kFloat32, o,
                                                ctx.send_residual.data() + chunk.begin, out),
                   "encoding partial", chunk);
  }
  return InChunk(w.encoder.Encode(facc, chunk.count, DataType::kFloat32, o, out),
                 "encoding partial", chunk);
}

Status EncodeResults(OpContext& ctx, Worker& w, const Chunk& chunk, float* facc, uint8_t* tacc,
                     std::span<const CodecId> codecs, std::vector<std::vector<uint8_t>>* outs) {
  const PhaseTimer timer(ctx.encode_ns);
  const AllReduceRequest& r = *ctx.request;
  outs->resize(codecs.size());
  if (!ctx.float_path) {
    if (r.op == ReduceOp::kAvg) {
      STRAIT_RETURN_IF_ERROR(
          DivideInPlace(r.dtype, tacc, chunk.count, static_cast<uint64_t>(ctx.world)));
    }
    for (size_t i = 0; i < codecs.size(); ++i) {
      STRAIT_RETURN_IF_ERROR(InChunk(w.encoder.Encode(tacc, chunk.count, r.dtype,
                                                      OptionsFor(ctx, chunk, 0, codecs[i]),
                                                      &(*outs)[i]),
                                     "encoding result", chunk));
    }
    return Status::Ok();
  }
  if (r.op == ReduceOp::kAvg) {
    const float n = static_cast<float>(ctx.world);
    for (size_t i = 0; i < chunk.count; ++i) facc[i] = facc[i] / n;
  }
  bool converted = false;
  for (size_t i = 0; i < codecs.size(); ++i) {
    const CodecOptions o = OptionsFor(ctx, chunk, 0, codecs[i]);
    std::vector<uint8_t>* out = &(*outs)[i];
    if (IsLossyCodec(codecs[i])) {
      // The result is quantized from fp32: rounding to a 16-bit type first would add a second
      // error for nothing (the frame's size depends only on the element count).
      if (!ctx.own_residual.empty()) {
        STRAIT_RETURN_IF_ERROR(
            InChunk(w.encoder.EncodeWithFeedback(facc, chunk.count, DataType::kFloat32, o,
                                                 ctx.own_residual.data() + chunk.begin, out),
                    "encoding result", chunk));
      } else {
        STRAIT_RETURN_IF_ERROR(
            InChunk(w.encoder.Encode(facc, chunk.count, DataType::kFloat32, o, out),
                    "encoding result", chunk));
      }
      continue;
    }
    if (r.dtype == DataType::kFloat32) {
      STRAIT_RETURN_IF_ERROR(InChunk(w.encoder.Encode(facc, chunk.count, r.dtype, o, out),
                                     "encoding result", chunk));
      continue;
    }
    if (!converted) {
      w.bytes.resize(chunk.count * ctx.elem);
      STRAIT_RETURN_IF_ERROR(ConvertFromFloat(facc, w.bytes.data(), r.dtype, chunk.count));
      converted = true;
    }
    STRAIT_RETURN_IF_ERROR(InChunk(w.encoder.Encode(w.bytes.data(), chunk.count, r.dtype, o, out),
                                   "encoding result", chunk));
  }
  return Status::Ok();
}

Status EncodeResult(OpContext& ctx, Worker& w, const Chunk& chunk, float* facc, uint8_t* tacc,
                    CodecId codec, std::vector<uint8_t>* out) {
  std::vector<std::vector<uint8_t>> outs;
  STRAIT_RETURN_IF_ERROR(EncodeResults(ctx, w, chunk, facc, tacc, {&codec, 1}, &outs));
  *out = std::move(outs[0]);
  return Status::Ok();
}

Status DecodeResult(OpContext& ctx, Worker& w, std::span<const uint8_t> frame, const Chunk& chunk) {
  const PhaseTimer timer(ctx.decode_ns);
  DecodeExpectations expect;
  CodecId codec;
  STRAIT_RETURN_IF_ERROR(ExpectedCodec(ctx, frame, "decoding result", chunk, &codec));
  expect.codec = codec;
  expect.element_count = chunk.count;
  expect.dtype = IsLossyCodec(codec) ? DataType::kFloat32 : ctx.request->dtype;
  if (ctx.result_stage != nullptr) {
    // One frame for the whole result: this chunk's scales and codes go to their places in it.
    auto info = InspectFrame(frame, expect);
    if (!info.ok()) return InChunk(info.status(), "decoding result", chunk);
    const AllReduceRequest& r = *ctx.request;
    if ((info->flags & kFrameFlagZstd) != 0 || info->block_size != r.codec.block_size) {
      return InChunk(InvalidArgumentError("result frame is zstd-chained or has block size " +
                                          std::to_string(info->block_size) + ", not " +
                                          std::to_string(r.codec.block_size) +
                                          " (do the regions' policies for the job differ?)"),
                     "decoding result", chunk);
    }
    const size_t block = r.codec.block_size;
    const size_t scale_bytes = (chunk.count + block - 1) / block * sizeof(float);
    const uint8_t* payload = frame.data() + kFrameHeaderSize;
    std::memcpy(ctx.result_stage + chunk.begin / block * sizeof(float), payload, scale_bytes);
    std::memcpy(ctx.result_stage + ctx.result_codes_at + CodeBytesOf(codec, chunk.begin),
                payload + scale_bytes, CodeBytesOf(codec, chunk.count));
    if (ctx.data == nullptr) return Status::Ok();
  }
  return InChunk(w.decoder.Decode(frame, ctx.data + chunk.begin * ctx.elem, chunk.count,
                                  ctx.request->dtype, expect),
                 "decoding result", chunk);
}

}  // namespace strait::collective::internal

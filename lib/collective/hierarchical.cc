// HierarchicalAllReduce: intra-region reduce-scatter, the cross-region AllReduce of this
// gateway's shard, intra-region all-gather (see hierarchical.h).
#include "collective/hierarchical.h"

#include <algorithm>
#include <cstring>
#include <span>
#include <string>
#include <vector>

#include "collective/engine.h"
#include "common/endian.h"
#include "strait/codec.h"
#include "strait/reduce.h"

namespace strait::collective {
namespace {

enum class Kind : uint8_t {
  kPart = 0,    // phase 1: a member's input for a chunk of another member's shard
  kResult = 1,  // phase 3: a chunk of a finished shard
  kResultFrame = 2,  // phase 3: a whole finished shard as one lossy frame
};

// The phase-2 deadline ends this long before the operation's (at most), so that a member whose
// cross-region phase fails at its deadline still has time to tell its region (an abort) before
// their own waits end: they then report its reason, not a bare timeout.
constexpr int64_t kMaxAbortMarginNanos = 2'000'000'000;

std::string Describe(uint64_t count, uint8_t dtype, uint8_t op) {
  const bool known = IsValidDataType(dtype) && IsValidReduceOp(op);
  if (!known) {
    return std::to_string(count) + " elements of dtype " + std::to_string(dtype) + " (op " +
           std::to_string(op) + ")";
  }
  return std::to_string(count) + " " + DataTypeName(static_cast<DataType>(dtype)) + " (" +
         ReduceOpName(static_cast<ReduceOp>(op)) + ")";
}

std::string PeerOf(const RegionOperation& o, int g) {
  return o.names.peer ? o.names.peer(g) : "region gateway " + o.transport->PeerName(g);
}

size_t ElemOf(const RegionOperation& o) {
  return DataTypeSize(o.dtype);
}

// Header and payload appended into a buffer with the transport's headroom (kSendHeadroom): one
// fresh buffer per message, written once, never zero-filled first.
std::vector<uint8_t> Message(const RegionOperation& o, Kind kind, const uint8_t* payload,
                             size_t size) {
  std::vector<uint8_t> out;
  out.reserve(kHierarchicalHeaderSize + size + kSendHeadroom);
  out.resize(kHierarchicalHeaderSize);
  out[0] = kHierarchicalVersion;
  out[1] = static_cast<uint8_t>(kind);
  out[2] = static_cast<uint8_t>(o.dtype);
  out[3] = static_cast<uint8_t>(o.op);
  PutU64(&out[8], o.plan->count);
  if (size > 0) out.insert(out.end(), payload, payload + size);
  return out;
}

void Send(RegionOperation& o, int peer, uint64_t tag, std::vector<uint8_t> message) {
  o.bytes_sent += message.size();
  o.transport->Send(peer, tag, std::move(message), o.deadline,
                    o.track_send ? o.track_send() : SendDone([](const Status&) {}));
}

// Receives member g's message for `chunk` of `phase` and checks its header against this
// member's operation; the payload follows the header in *out. In phase 3 a member's first chunk
// may come as its whole shard's frame (kind 2, *framed set; the frame is checked by decoding).
Status Receive(RegionOperation& o, int g, TagPhase phase, const Chunk& chunk, const char* what,
               std::vector<uint8_t>* out, bool* framed = nullptr) {
  const uint64_t tag = MakeTag(o.op_id, phase, chunk.id);
  Status s = o.transport->Recv(g, tag, o.deadline, out);
  if (!s.ok()) {
    o.peer_aborted = s.code() == StatusCode::kAborted;
    return s.WithContext("waiting for " + PeerOf(o, g) + "'s " + what + " of chunk " +
                         std::to_string(chunk.id) + " (elements " + std::to_string(chunk.begin) +
                         ".." + std::to_string(chunk.begin + chunk.count) + ")");
  }
  o.bytes_received += out->size();
  const std::vector<uint8_t>& msg = *out;
  if (msg.size() < kHierarchicalHeaderSize) {
    return DataLossError(PeerOf(o, g) + " sent a " + std::to_string(msg.size()) +
                         "-byte message, shorter than the " +
                         std::to_string(kHierarchicalHeaderSize) + "-byte header");
  }
  if (msg[0] != kHierarchicalVersion) {
    return DataLossError(PeerOf(o, g) + " sent intra-region message version " +
                         std::to_string(msg[0]) + "; this build speaks " +
                         std::to_string(kHierarchicalVersion) + " (upgrade the older side)");
  }
  const Kind expect = phase == TagPhase::kMeshScatter ? Kind::kPart : Kind::kResult;
  const bool frame = framed != nullptr && msg[1] == static_cast<uint8_t>(Kind::kResultFrame);
  if (framed != nullptr) *framed = frame;
  if (msg[1] != static_cast<uint8_t>(expect) && !frame) {
    return DataLossError(PeerOf(o, g) + " sent message kind " + std::to_string(msg[1]) +
                         " where a " + what + " belongs");
  }
  const uint64_t count = GetU64(&msg[8]);
  if (msg[2] != static_cast<uint8_t>(o.dtype) || msg[3] != static_cast<uint8_t>(o.op) ||
      count != o.plan->count) {
    return Status(
        o.names.mismatch_code,
        "every " + o.names.members + " must issue the same all-reduces in the same order, but " +
            PeerOf(o, g) + " runs one of " + Describe(count, msg[2], msg[3]) + " and " +
            o.names.self + " one of " +
            Describe(o.plan->count, static_cast<uint8_t>(o.dtype), static_cast<uint8_t>(o.op)));
  }
  const size_t elem = ElemOf(o);
  if (!frame && msg.size() - kHierarchicalHeaderSize != chunk.count * elem) {
    return DataLossError(PeerOf(o, g) + " sent " +
                         std::to_string(msg.size() - kHierarchicalHeaderSize) +
                         " bytes for chunk " + std::to_string(chunk.id) + ", which needs " +
                         std::to_string(chunk.count * elem));
  }
  return Status::Ok();
}

Status CheckOperation(const RegionOperation& o) {
  if (o.transport == nullptr) return InvalidArgumentError("region operation: no transport");
  if (o.plan == nullptr) return InvalidArgumentError("region operation: no plan");
  const int m = o.transport->size();
  const int me = o.transport->rank();
  if (m < 1 || me < 0 || me >= m || o.plan->shards.size() != static_cast<size_t>(m)) {
    return InvalidArgumentError("region operation: the plan has " +
                                std::to_string(o.plan->shards.size()) +
                                " shards but the transport reports rank " + std::to_string(me) +
                                " of " + std::to_string(m));
  }
  if (!IsValidDataType(static_cast<uint8_t>(o.dtype)) ||
      !IsValidReduceOp(static_cast<uint8_t>(o.op))) {
    return InvalidArgumentError("region operation: invalid dtype or op");
  }
  if (o.plan->count > 0 && o.data == nullptr) {
    return InvalidArgumentError("region operation: data is null for " +
                                std::to_string(o.plan->count) + " elements");
  }
  return Status::Ok();
}

Status Validate(const Transport& region, const Transport& cross, const AllReduceRequest& r) {
  for (const Transport* t : {&region, &cross}) {
    if (t->size() < 1 || t->rank() < 0 || t->rank() >= t->size()) {
      return InvalidArgumentError(std::string(t == &region ? "region" : "cross-region") +
                                  " transport reports rank " + std::to_string(t->rank()) + " of " +
                                  std::to_string(t->size()));
    }
  }
  if (!IsValidDataType(static_cast<uint8_t>(r.dtype))) {
    return InvalidArgumentError("dtype: invalid value " +
                                std::to_string(static_cast<int>(r.dtype)));
  }
  if (!IsValidReduceOp(static_cast<uint8_t>(r.op))) {
    return InvalidArgumentError("op: invalid value " + std::to_string(static_cast<int>(r.op)));
  }
  if (r.count > 0 && r.data == nullptr) {
    return InvalidArgumentError("data is null for " + std::to_string(r.count) + " elements");
  }
  // Checked here as well as in phase 2, so that no gateway starts phase 1 with a request that
  // phase 2 refuses.
  if (IsLossyCodec(r.codec.codec) && !IsFloatReduction(r.dtype, r.op)) {
    return InvalidArgumentError(
        std::string("codec ") + CodecName(r.codec.codec) +
        " is lossy and applies only to sum or avg of float32, bfloat16 or float16, not " +
        ReduceOpName(r.op) + " of " + DataTypeName(r.dtype) + "; use codec none or zstd");
  }
  if (r.chunk_elements == 0) return InvalidArgumentError("chunk_elements must be at least 1");
  return Status::Ok();
}

// Whether phase 2 can give its result as one frame for phase 3, on AllReduceRequest::
// result_frame's terms: one lossy codec for every result, unchained, whole blocks per owner.
bool CanFrameResult(const AllReduceRequest& sub, int regions) {
  if (sub.count == 0 || sub.result_frame != nullptr || !sub.input_stage.empty()) return false;
  const CodecId codec = sub.codec.codec;
  if (!IsLossyCodec(codec) || sub.codec.chain_zstd) return false;
  if (std::any_of(sub.result_codecs.begin(), sub.result_codecs.end(),
                  [codec](CodecId c) { return c != codec; })) {
    return false;
  }
  auto plan = MakePlan(PlanFor(sub, regions));
  return plan.ok() && plan->align == sub.codec.block_size;
}

}  // namespace

bool IsFloatReduction(DataType dtype, ReduceOp op) {
  return IsLossyCodableType(dtype) && (op == ReduceOp::kSum || op == ReduceOp::kAvg);
}

Deadline CrossPhaseDeadline(Deadline deadline, int members) {
  if (members <= 1 || deadline.IsInfinite()) return deadline;
  const int64_t left = deadline.RemainingNanos();
  return Deadline::After(left - std::min(left / 10, kMaxAbortMarginNanos));
}

StatusOr<Plan> RegionPlan(size_t count, int members, size_t chunk_elements) {
  PlanOptions o;
  o.count = count;
  o.world = members;
  o.chunk_elements = chunk_elements;
  o.algorithm = Algorithm::kMesh;
  return MakePlan(o);
}

Status RegionReduceScatter(RegionOperation& o) {
  STRAIT_RETURN_IF_ERROR(CheckOperation(o));
  const Plan& plan = *o.plan;
  const int m = o.transport->size();
  const int me = o.transport->rank();
  const size_t elem = ElemOf(o);
  size_t rounds = 0;
  for (int g = 0; g < m; ++g) rounds = std::max(rounds, plan.ChunkCount(g));
  // Round-robin over owners, so that every member gets its first parts early.
  for (size_t k = 0; k < rounds; ++k) {
    for (int j = 1; j < m; ++j) {
      const int owner = (me + j) % m;
      if (k >= plan.ChunkCount(owner)) continue;
      const Chunk& chunk = plan.ChunkOf(owner, k);
      Send(o, owner, MakeTag(o.op_id, TagPhase::kMeshScatter, chunk.id),
           Message(o, Kind::kPart, o.data + chunk.begin * elem, chunk.count * elem));
    }
  }
  const bool float_path = IsFloatReduction(o.dtype, o.op);
  const ReduceOp exact_op = o.op == ReduceOp::kAvg ? ReduceOp::kSum : o.op;
  // Every member's part of a chunk is received first, then reduced block by block in member
  // order 0..m-1 through small scratch buffers: the sum is the same as over whole chunks, and no
  // chunk-sized buffer is allocated (and faulted in) per operation.
  constexpr size_t kBlock = 8192;
  std::vector<std::vector<uint8_t>> msgs(static_cast<size_t>(m));
  std::vector<const uint8_t*> parts(static_cast<size_t>(m));
  std::vector<float> facc(float_path ? kBlock : 0), in(float_path ? kBlock : 0);
  std::vector<uint8_t> tacc(float_path ? 0 : kBlock * elem);
  for (size_t k = 0; k < plan.ChunkCount(me); ++k) {
    const Chunk& chunk = plan.ChunkOf(me, k);
    uint8_t* const mine = o.data + chunk.begin * elem;
    for (int g = 0; g < m; ++g) {
      const size_t gi = static_cast<size_t>(g);
      parts[gi] = mine;
      if (g == me) continue;
      STRAIT_RETURN_IF_ERROR(Receive(o, g, TagPhase::kMeshScatter, chunk, "part", &msgs[gi]));
      parts[gi] = msgs[gi].data() + kHierarchicalHeaderSize;
    }
    for (size_t at = 0; at < chunk.count; at += kBlock) {
      const size_t n = std::min(kBlock, chunk.count - at);
      const size_t off = at * elem;
      if (float_path) {
        for (int g = 0; g < m; ++g) {
          float* dst = g == 0 ? facc.data() : in.data();
          STRAIT_RETURN_IF_ERROR(ConvertToFloat(parts[static_cast<size_t>(g)] + off, o.dtype, dst, n));
          if (g > 0) {
            for (size_t i = 0; i < n; ++i) facc[i] += in[i];
          }
        }
        if (o.op == ReduceOp::kAvg) {
          const float divisor = static_cast<float>(m);
          for (size_t i = 0; i < n; ++i) facc[i] /= divisor;
        }
        STRAIT_RETURN_IF_ERROR(ConvertFromFloat(facc.data(), mine + off, o.dtype, n));
      } else {
        std::memcpy(tacc.data(), parts[0] + off, n * elem);
        for (int g = 1; g < m; ++g) {
          STRAIT_RETURN_IF_ERROR(
              ReduceInPlace(o.dtype, exact_op, parts[static_cast<size_t>(g)] + off, tacc.data(), n));
        }
        std::memcpy(mine + off, tacc.data(), n * elem);
      }
    }
  }
  return Status::Ok();
}

Status RegionAllGather(RegionOperation& o) {
  STRAIT_RETURN_IF_ERROR(CheckOperation(o));
  const Plan& plan = *o.plan;
  const int m = o.transport->size();
  const int me = o.transport->rank();
  const size_t elem = ElemOf(o);
  if (o.shard_frame != nullptr && plan.ChunkCount(me) > 0) {
    // The whole shard in one message, under its first chunk's tag.
    const uint64_t tag = MakeTag(o.op_id, TagPhase::kMeshGather, plan.ChunkOf(me, 0).id);
    for (int j = 1; j < m; ++j) {
      Send(o, (me + j) % m, tag,
           Message(o, Kind::kResultFrame, o.shard_frame->data(), o.shard_frame->size()));
    }
  } else {
    for (size_t k = 0; k < plan.ChunkCount(me); ++k) {
      const Chunk& chunk = plan.ChunkOf(me, k);
      const uint64_t tag = MakeTag(o.op_id, TagPhase::kMeshGather, chunk.id);
      for (int j = 1; j < m; ++j) {
        Send(o, (me + j) % m, tag,
             Message(o, Kind::kResult, o.data + chunk.begin * elem, chunk.count * elem));
      }
    }
  }
  std::vector<uint8_t> msg;
  Decoder decoder;
  for (int j = 1; j < m; ++j) {
    const int owner = (me + j) % m;
    for (size_t k = 0; k < plan.ChunkCount(owner); ++k) {
      const Chunk& chunk = plan.ChunkOf(owner, k);
      bool framed = false;
      STRAIT_RETURN_IF_ERROR(Receive(o, owner, TagPhase::kMeshGather, chunk, "result", &msg,
                                     k == 0 ? &framed : nullptr));
      const std::span<const uint8_t> payload =
          std::span<const uint8_t>(msg).subspan(kHierarchicalHeaderSize);
      if (!framed) {
        std::memcpy(o.data + chunk.begin * elem, payload.data(), chunk.count * elem);
        continue;
      }
      const Shard shard = plan.shards[static_cast<size_t>(owner)];
      DecodeExpectations expect;
      expect.dtype = DataType::kFloat32;
      expect.element_count = shard.count;
      auto info = InspectFrame(payload, expect);
      Status s = info.status();
      if (s.ok() && !IsLossyCodec(info->codec)) {
        s = InvalidArgumentError(std::string("a ") + CodecName(info->codec) +
                                 " frame, where only a lossy one belongs");
      }
      if (s.ok()) s = decoder.Decode(payload, o.data + shard.begin * elem, shard.count, o.dtype, expect);
      if (!s.ok()) {
        return DataLossError(PeerOf(o, owner) + " sent its shard (elements " +
                             std::to_string(shard.begin) + ".." +
                             std::to_string(shard.begin + shard.count) +
                             ") as a frame that does not decode to it: " + s.ToString());
      }
      break;  // the frame stood for every chunk of the shard
    }
  }
  return Status::Ok();
}

std::vector<Shard> RegionShards(size_t count, int gateways) {
  auto plan = RegionPlan(count, gateways, std::max<size_t>(count, 1));
  if (!plan.ok()) return {};
  return plan->shards;
}

std::string RegionShardKey(const std::string& tensor_key, int shard, int gateways) {
  if (gateways <= 1) return tensor_key;
  return tensor_key + ":region-shard" + std::to_string(shard) + "/" + std::to_string(gateways);
}

Status HierarchicalAllReduce(const RegionSide& region_side, Transport& cross,
                             const AllReduceRequest& request, HierarchicalStats* stats) {
  const std::string what = "region all-reduce " + request.job + "/" + request.tensor_key;
  if (stats != nullptr) *stats = HierarchicalStats{};
  if (region_side.transport == nullptr) {
    return InvalidArgumentError(what + ": no region transport");
  }
  Transport& region = *region_side.transport;
  STRAIT_RETURN_IF_ERROR(Validate(region, cross, request).WithContext(what));
  auto plan = RegionPlan(request.count, region.size(), request.chunk_elements);
  if (!plan.ok()) return plan.status().WithContext(what + ": region plan");
  const int me = region.rank();
  const int m = region.size();
  const size_t elem = DataTypeSize(request.dtype);
  const bool float_path = IsFloatReduction(request.dtype, request.op);
  internal::SendTracker sends;
  RegionOperation c;
  c.transport = &region;
  c.op_id = region_side.op_id;
  c.plan = &*plan;
  c.data = static_cast<uint8_t*>(request.data);
  c.dtype = request.dtype;
  c.op = request.op;
  c.deadline = request.deadline;
  c.track_send = [&sends] { return sends.Track(); };
  const Shard shard = plan->shards[static_cast<size_t>(me)];
  if (stats != nullptr) stats->shard = shard;

  // Who has heard of a failure: each transport's peers learn it from this gateway's abort,
  // unless the failure is an abort that came over that transport (echoing it would only repeat
  // the cause under this gateway's name).
  bool cross_told = false;
  Stopwatch phase;
  Status status = RegionReduceScatter(c).WithContext("intra-region reduce-scatter");
  if (stats != nullptr) stats->region_scatter_ns = phase.ElapsedNanos();
  if (status.ok()) {
    AllReduceRequest sub = request;
    sub.tensor_key = RegionShardKey(request.tensor_key, me, m);
    sub.count = shard.count;
    sub.data = c.data + shard.begin * elem;
    sub.codec.index_offset += shard.begin;
    const bool exact_avg = !float_path && request.op == ReduceOp::kAvg;
    if (exact_avg) sub.op = ReduceOp::kSum;  // divided by m x n once, below
    sub.deadline = CrossPhaseDeadline(request.deadline, m);
    // The shard's result as the frame phase 2 decoded it, for phase 3 (see the file comment).
    std::vector<uint8_t> frame;
    if (m > 1 && CanFrameResult(sub, cross.size())) sub.result_frame = &frame;
    AllReduceStats cross_stats;
    status = AllReduce(cross, sub, &cross_stats);
    cross_told = !status.ok();  // AllReduce aborted (or heard the abort) itself
    if (stats != nullptr) stats->cross = cross_stats;
    if (status.ok() && exact_avg && shard.count > 0) {
      status = DivideInPlace(request.dtype, sub.data, shard.count,
                             static_cast<uint64_t>(m) * static_cast<uint64_t>(cross.size()));
      if (!status.ok()) {
        cross.Abort(request.op_id, status.WithContext(what), request.abort_note);
        cross_told = true;
      }
    }
    status = status.WithContext("cross-region phase of shard " + std::to_string(me));
    if (sub.result_frame == &frame) c.shard_frame = &frame;
    phase.Restart();
    if (status.ok()) status = RegionAllGather(c).WithContext("intra-region all-gather");
  }
  // On success the sends must have arrived too; after a failure nothing waits for them (the
  // tracker's state is shared with the completions, and the transport owns the bytes).
  if (status.ok()) status = sends.Wait(request.deadline);
  if (stats != nullptr && status.ok()) stats->region_gather_ns = phase.ElapsedNanos();
  if (!status.ok()) {
    const Status why = status.WithContext(what);
    if (!c.peer_aborted) region.Abort(c.op_id, why, region_side.abort_note);
    // The shard's peers in the other regions wait for this gateway's part otherwise. After a
    // successful phase 2 they are done with the operation, but the abort still tells them it
    // failed (the gateway restarts the job's numbering on either side of an abort).
    if (!cross_told) cross.Abort(request.op_id, why, request.abort_note);
  }
  if (stats != nullptr) {
    stats->region_bytes_sent = c.bytes_sent;
    stats->region_bytes_received = c.bytes_received;
  }
  return status.WithContext(what);
}

}  // namespace strait::collective

// HierarchicalAllReduce: intra-region reduce-scatter, the cross-region AllReduce of this
// gateway's shard, intra-region all-gather (see hierarchical.h).
#include "collective/hierarchical.h"

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "collective/engine.h"
#include "common/endian.h"
#include "strait/codec.h"
#include "strait/reduce.h"

namespace strait::collective {
namespace {

enum class Kind : uint8_t {
  kPart = 0,    // phase 1: a gateway's input for a chunk of another gateway's shard
  kResult = 1,  // phase 3: a chunk of a finished shard
};

// The phase-2 deadline ends this long before the operation's (at most), so that a gateway whose
// cross-region phase fails at its deadline still has time to tell its region (an abort) before
// their own waits end: they then report its reason, not a bare timeout.
constexpr int64_t kMaxAbortMarginNanos = 2'000'000'000;

bool IsFloatPath(DataType dtype, ReduceOp op) {
  return IsLossyCodableType(dtype) && (op == ReduceOp::kSum || op == ReduceOp::kAvg);
}

std::string Describe(uint64_t count, uint8_t dtype, uint8_t op) {
  const bool known = IsValidDataType(dtype) && IsValidReduceOp(op);
  if (!known) {
    return std::to_string(count) + " elements of dtype " + std::to_string(dtype) + " (op " +
           std::to_string(op) + ")";
  }
  return std::to_string(count) + " " + DataTypeName(static_cast<DataType>(dtype)) + " (" +
         ReduceOpName(static_cast<ReduceOp>(op)) + ")";
}

struct Context {
  const AllReduceRequest* request = nullptr;
  Transport* region = nullptr;
  uint64_t op_id = 0;  // of the region operation
  Plan plan;           // the region plan: shard g belongs to gateway g
  int me = 0;
  int m = 1;
  size_t elem = 4;
  uint8_t* data = nullptr;
  bool float_path = false;
  internal::SendTracker sends;
  uint64_t bytes_sent = 0;
  uint64_t bytes_received = 0;
  // A region wait failed because another gateway of the region aborted the operation: it told
  // the region already.
  bool region_aborted = false;

  std::string Peer(int g) const { return "region gateway " + region->PeerName(g); }

  std::vector<uint8_t> Message(Kind kind, const uint8_t* payload, size_t size) const {
    std::vector<uint8_t> out(kHierarchicalHeaderSize + size);
    out[0] = kHierarchicalVersion;
    out[1] = static_cast<uint8_t>(kind);
    out[2] = static_cast<uint8_t>(request->dtype);
    out[3] = static_cast<uint8_t>(request->op);
    PutU64(&out[8], request->count);
    if (size > 0) std::memcpy(out.data() + kHierarchicalHeaderSize, payload, size);
    return out;
  }

  void Send(int peer, uint64_t tag, std::vector<uint8_t> message) {
    bytes_sent += message.size();
    region->Send(peer, tag, std::move(message), request->deadline, sends.Track());
  }

  // Receives gateway g's message for `chunk` of `phase` and checks its header against this
  // gateway's request; the payload follows the header in *out.
  Status Receive(int g, TagPhase phase, const Chunk& chunk, const char* what,
                 std::vector<uint8_t>* out) {
    const uint64_t tag = MakeTag(op_id, phase, chunk.id);
    Status s = region->Recv(g, tag, request->deadline, out);
    if (!s.ok()) {
      region_aborted = s.code() == StatusCode::kAborted;
      return s.WithContext("waiting for " + Peer(g) + "'s " + what + " of chunk " +
                           std::to_string(chunk.id) + " (elements " + std::to_string(chunk.begin) +
                           ".." + std::to_string(chunk.begin + chunk.count) + ")");
    }
    bytes_received += out->size();
    const std::vector<uint8_t>& msg = *out;
    if (msg.size() < kHierarchicalHeaderSize) {
      return DataLossError(Peer(g) + " sent a " + std::to_string(msg.size()) +
                           "-byte message, shorter than the " +
                           std::to_string(kHierarchicalHeaderSize) + "-byte header");
    }
    if (msg[0] != kHierarchicalVersion) {
      return DataLossError(Peer(g) + " sent intra-region message version " +
                           std::to_string(msg[0]) + "; this build speaks " +
                           std::to_string(kHierarchicalVersion) + " (upgrade the older side)");
    }
    const Kind expect = phase == TagPhase::kMeshScatter ? Kind::kPart : Kind::kResult;
    if (msg[1] != static_cast<uint8_t>(expect)) {
      return DataLossError(Peer(g) + " sent message kind " + std::to_string(msg[1]) + " where a " +
                           what + " belongs");
    }
    const uint64_t count = GetU64(&msg[8]);
    if (msg[2] != static_cast<uint8_t>(request->dtype) ||
        msg[3] != static_cast<uint8_t>(request->op) || count != request->count) {
      return InvalidArgumentError(
          "every node head of the region must issue the same all-reduces in the same order, "
          "but " +
          Peer(g) + " runs one of " + Describe(count, msg[2], msg[3]) +
          " and this gateway one of " +
          Describe(request->count, static_cast<uint8_t>(request->dtype),
                   static_cast<uint8_t>(request->op)));
    }
    if (msg.size() - kHierarchicalHeaderSize != chunk.count * elem) {
      return DataLossError(Peer(g) + " sent " +
                           std::to_string(msg.size() - kHierarchicalHeaderSize) +
                           " bytes for chunk " + std::to_string(chunk.id) + ", which needs " +
                           std::to_string(chunk.count * elem));
    }
    return Status::Ok();
  }
};

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
  if (IsLossyCodec(r.codec.codec) && !IsFloatPath(r.dtype, r.op)) {
    return InvalidArgumentError(
        std::string("codec ") + CodecName(r.codec.codec) +
        " is lossy and applies only to sum or avg of float32, bfloat16 or float16, not " +
        ReduceOpName(r.op) + " of " + DataTypeName(r.dtype) + "; use codec none or zstd");
  }
  if (r.chunk_elements == 0) return InvalidArgumentError("chunk_elements must be at least 1");
  return Status::Ok();
}

// Phase 1: send this gateway's parts of the other shards, then reduce its own shard in fixed
// gateway order into the caller's buffer.
Status ReduceScatter(Context& c) {
  const int m = c.m;
  size_t rounds = 0;
  for (int g = 0; g < m; ++g) rounds = std::max(rounds, c.plan.ChunkCount(g));
  // Round-robin over owners, so that every gateway gets its first parts early.
  for (size_t k = 0; k < rounds; ++k) {
    for (int j = 1; j < m; ++j) {
      const int owner = (c.me + j) % m;
      if (k >= c.plan.ChunkCount(owner)) continue;
      const Chunk& chunk = c.plan.ChunkOf(owner, k);
      c.Send(owner, MakeTag(c.op_id, TagPhase::kMeshScatter, chunk.id),
             c.Message(Kind::kPart, c.data + chunk.begin * c.elem, chunk.count * c.elem));
    }
  }
  const DataType dtype = c.request->dtype;
  const ReduceOp exact_op = c.request->op == ReduceOp::kAvg ? ReduceOp::kSum : c.request->op;
  std::vector<uint8_t> msg;
  std::vector<float> facc, in;
  std::vector<uint8_t> tacc;
  for (size_t k = 0; k < c.plan.ChunkCount(c.me); ++k) {
    const Chunk& chunk = c.plan.ChunkOf(c.me, k);
    uint8_t* const mine = c.data + chunk.begin * c.elem;
    const size_t n = chunk.count;
    facc.resize(c.float_path ? n : 0);
    in.resize(c.float_path ? n : 0);
    tacc.resize(c.float_path ? 0 : n * c.elem);
    for (int g = 0; g < m; ++g) {
      const uint8_t* part = mine;
      if (g != c.me) {
        STRAIT_RETURN_IF_ERROR(c.Receive(g, TagPhase::kMeshScatter, chunk, "part", &msg));
        part = msg.data() + kHierarchicalHeaderSize;
      }
      if (c.float_path) {
        STRAIT_RETURN_IF_ERROR(ConvertToFloat(part, dtype, g == 0 ? facc.data() : in.data(), n));
        if (g > 0) {
          for (size_t i = 0; i < n; ++i) facc[i] += in[i];
        }
      } else if (g == 0) {
        std::memcpy(tacc.data(), part, n * c.elem);
      } else {
        STRAIT_RETURN_IF_ERROR(ReduceInPlace(dtype, exact_op, part, tacc.data(), n));
      }
    }
    if (c.float_path) {
      if (c.request->op == ReduceOp::kAvg) {
        const float divisor = static_cast<float>(m);
        for (float& x : facc) x /= divisor;
      }
      STRAIT_RETURN_IF_ERROR(ConvertFromFloat(facc.data(), mine, dtype, n));
    } else {
      std::memcpy(mine, tacc.data(), n * c.elem);
    }
  }
  return Status::Ok();
}

// Phase 3: send the finished shard to the region, then take every other gateway's.
Status AllGather(Context& c) {
  const int m = c.m;
  for (size_t k = 0; k < c.plan.ChunkCount(c.me); ++k) {
    const Chunk& chunk = c.plan.ChunkOf(c.me, k);
    const uint64_t tag = MakeTag(c.op_id, TagPhase::kMeshGather, chunk.id);
    for (int j = 1; j < m; ++j) {
      c.Send((c.me + j) % m, tag,
             c.Message(Kind::kResult, c.data + chunk.begin * c.elem, chunk.count * c.elem));
    }
  }
  std::vector<uint8_t> msg;
  for (int j = 1; j < m; ++j) {
    const int owner = (c.me + j) % m;
    for (size_t k = 0; k < c.plan.ChunkCount(owner); ++k) {
      const Chunk& chunk = c.plan.ChunkOf(owner, k);
      STRAIT_RETURN_IF_ERROR(c.Receive(owner, TagPhase::kMeshGather, chunk, "result", &msg));
      std::memcpy(c.data + chunk.begin * c.elem, msg.data() + kHierarchicalHeaderSize,
                  chunk.count * c.elem);
    }
  }
  return Status::Ok();
}

}  // namespace

std::vector<Shard> RegionShards(size_t count, int gateways) {
  PlanOptions o;
  o.count = count;
  o.world = gateways;
  o.chunk_elements = std::max<size_t>(count, 1);
  o.algorithm = Algorithm::kMesh;
  auto plan = MakePlan(o);
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
  Context c;
  c.request = &request;
  c.region = &region;
  c.op_id = region_side.op_id;
  c.me = region.rank();
  c.m = region.size();
  c.elem = DataTypeSize(request.dtype);
  c.data = static_cast<uint8_t*>(request.data);
  c.float_path = IsFloatPath(request.dtype, request.op);
  PlanOptions po;
  po.count = request.count;
  po.world = c.m;
  po.chunk_elements = request.chunk_elements;
  po.algorithm = Algorithm::kMesh;
  auto plan = MakePlan(po);
  if (!plan.ok()) return plan.status().WithContext(what + ": region plan");
  c.plan = std::move(plan).value();
  const Shard shard = c.plan.shards[static_cast<size_t>(c.me)];
  if (stats != nullptr) stats->shard = shard;

  // Who has heard of a failure: each transport's peers learn it from this gateway's abort,
  // unless the failure is an abort that came over that transport (echoing it would only repeat
  // the cause under this gateway's name).
  bool cross_told = false;
  Status status = ReduceScatter(c).WithContext("intra-region reduce-scatter");
  if (status.ok()) {
    AllReduceRequest sub = request;
    sub.tensor_key = RegionShardKey(request.tensor_key, c.me, c.m);
    sub.count = shard.count;
    sub.data = c.data + shard.begin * c.elem;
    sub.codec.index_offset += shard.begin;
    const bool exact_avg = !c.float_path && request.op == ReduceOp::kAvg;
    if (exact_avg) sub.op = ReduceOp::kSum;  // divided by m x n once, below
    if (c.m > 1 && !request.deadline.IsInfinite()) {
      const int64_t left = request.deadline.RemainingNanos();
      sub.deadline = Deadline::After(left - std::min(left / 10, kMaxAbortMarginNanos));
    }
    AllReduceStats cross_stats;
    status = AllReduce(cross, sub, &cross_stats);
    cross_told = !status.ok();  // AllReduce aborted (or heard the abort) itself
    if (stats != nullptr) stats->cross = cross_stats;
    if (status.ok() && exact_avg && shard.count > 0) {
      status = DivideInPlace(request.dtype, sub.data, shard.count,
                             static_cast<uint64_t>(c.m) * static_cast<uint64_t>(cross.size()));
      if (!status.ok()) {
        cross.Abort(request.op_id, status.WithContext(what), request.abort_note);
        cross_told = true;
      }
    }
    status = status.WithContext("cross-region phase of shard " + std::to_string(c.me));
    if (status.ok()) status = AllGather(c).WithContext("intra-region all-gather");
  }
  // On success the sends must have arrived too; after a failure nothing waits for them (the
  // tracker's state is shared with the completions, and the transport owns the bytes).
  if (status.ok()) status = c.sends.Wait(request.deadline);
  if (!status.ok()) {
    const Status why = status.WithContext(what);
    if (!c.region_aborted) region.Abort(c.op_id, why, region_side.abort_note);
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

// The host backend: region rendezvous, region links, and the three-phase all-reduce (see
// host_backend.h).
#include "api/host_backend.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <map>
#include <optional>
#include <thread>
#include <utility>

#include "api/bootstrap.h"
#include "api/frame_policy.h"
#include "collective/hierarchical.h"
#include "collective/net_transport.h"
#include "collective/plan.h"
#include "common/clock.h"
#include "common/strings.h"
#include "gateway/client.h"
#include "net/link.h"
#include "strait/codec.h"
#include "strait/reduce.h"

namespace strait::api {
namespace {

enum class Kind : uint8_t {
  kPart = 0,    // phase 1: a rank's input for a chunk of another rank's shard
  kResult = 1,  // phase 3: a chunk of a finished shard
};

// Phase 2 ends this long before the operation (at most) so that a rank whose gateway times out
// can still abort the region before the other ranks' own waits end.
constexpr int64_t kMaxAbortMarginNanos = 2'000'000'000;

bool IsFloatPath(DataType dtype, ReduceOp op) {
  return IsLossyCodableType(dtype) && (op == ReduceOp::kSum || op == ReduceOp::kAvg);
}

void PutU64(uint8_t* p, uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
}
uint64_t GetU64(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= static_cast<uint64_t>(p[i]) << (8 * i);
  return v;
}

std::string Describe(uint64_t count, uint8_t dtype, uint8_t op) {
  if (!IsValidDataType(dtype) || !IsValidReduceOp(op)) {
    return std::to_string(count) + " elements of dtype " + std::to_string(dtype) + " (op " +
           std::to_string(op) + ")";
  }
  return std::to_string(count) + " " + DataTypeName(static_cast<DataType>(dtype)) + " (" +
         ReduceOpName(static_cast<ReduceOp>(op)) + ")";
}

// The first failed send of an operation; sends are not waited for (a rank that received
// everything it needs is done: what it sent is the receivers' concern, and they wait for it).
struct SendErrors {
  std::mutex mu;
  Status first;
};

// Phase 2 under a fixed lossy policy (FramePolicyOf the policy the gateway resolved): the rank
// quantizes its shard itself (with its own error-feedback residual per tensor key, as the GPU
// backend does on the device) and the gateway all-reduces the frame (kAllReduceFrame), so that
// the host backend runs the pipeline the GPU backend runs. Per-comm state of that frame path;
// used under HostComm::mu_.
struct FramePath {
  std::optional<FramePolicy> policy;
  Encoder encoder;
  Decoder decoder;
  std::map<std::string, std::vector<float>> residuals;  // by tensor key
  // Keys (and their counts) the gateway refused as frames (kFailedPrecondition: the regions'
  // agreed policy gives another codec for them, e.g. below min_lossy_bytes): sent raw from then
  // on, without asking again.
  std::map<std::string, size_t> refused;

  // All-reduces `n` elements at `data` in place as a frame; false when the gateway refused the
  // frame before the operation started (the caller sends the tensor raw instead: every region's
  // gateway refuses alike, so every rank falls back alike).
  StatusOr<bool> Run(gateway::Client& client, const std::string& job, const std::string& key,
                     DataType dtype, ReduceOp op, uint8_t* data, size_t n, Deadline deadline) {
    if (auto it = refused.find(key); it != refused.end() && it->second == n) return false;
    CodecOptions o;
    o.codec = policy->codec;  // the default block size, round to nearest
    std::vector<float>* residual = nullptr;
    std::vector<float> saved;
    if (policy->error_feedback) {
      residual = &residuals[key];
      if (residual->size() != n) residual->assign(n, 0.0f);
      saved = *residual;
    }
    std::vector<uint8_t> frame;
    STRAIT_RETURN_IF_ERROR(residual != nullptr ? encoder.EncodeWithFeedback(
                                                     data, n, dtype, o, residual->data(), &frame)
                                               : encoder.Encode(data, n, dtype, o, &frame));
    std::vector<uint8_t> result;
    Status s = client.AllReduceFrame(job, key, op, frame, &result, deadline);
    if (s.code() == StatusCode::kFailedPrecondition) {
      if (residual != nullptr) *residual = std::move(saved);  // this step was not sent so
      refused[key] = n;
      return false;
    }
    STRAIT_RETURN_IF_ERROR(s);
    STRAIT_RETURN_IF_ERROR(decoder.Decode(result, data, n, dtype));
    return true;
  }
};

}  // namespace

struct HostComm::Impl {
  std::unique_ptr<collective::NetTransport> transport;
  std::vector<collective::NetTransport::Receiver> receivers;
  std::unique_ptr<net::Endpoint> endpoint;
  std::vector<std::shared_ptr<net::Link>> links;
  std::unique_ptr<gateway::Client> client;
  std::unique_ptr<FramePath> frames = std::make_unique<FramePath>();
};

HostComm::HostComm(HostCommOptions options)
    : options_(std::move(options)), impl_(std::make_unique<Impl>()) {}

HostComm::~HostComm() {
  // Close the links with a flush (what is queued still goes out and is acknowledged) before the
  // endpoint goes, so that peers finishing their last operation are not cut off.
  for (const auto& l : impl_->links) {
    if (l != nullptr) l->Close();
  }
  const Deadline grace = Deadline::AfterSeconds(1);
  for (const auto& l : impl_->links) {
    while (l != nullptr && !grace.Expired()) {
      const net::LinkEstimates e = l->Estimates();
      if (e.ended || e.streams_up == 0) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
  }
  impl_->client.reset();
  impl_->endpoint.reset();
  impl_->links.clear();
  impl_->transport.reset();
}

StatusOr<std::unique_ptr<HostComm>> HostComm::Create(const HostCommOptions& options) {
  const Deadline deadline = Deadline::After(options.timeout_ns);
  const std::string me = "rank " + std::to_string(options.rank) + " of region " + options.region;
  std::unique_ptr<HostComm> comm(new HostComm(options));
  Impl& g = *comm->impl_;

  // The gateway first: a rank whose straitd is missing fails at once with that reason.
  auto client = gateway::Client::Connect(
      options.gateway, deadline,
      "strait-api " + options.region + "/rank" + std::to_string(options.rank));
  if (!client.ok()) return client.status().WithContext(me + ": gateway " + options.gateway);
  g.client = std::move(client).value();
  auto policy = g.client->RegisterJob(options.job, options.compression, deadline);
  if (!policy.ok()) {
    return policy.status().WithContext(me + ": registering job '" + options.job +
                                       "' with compression '" + options.compression + "'");
  }
  comm->policy_ = std::move(policy).value();
  g.frames->policy = FramePolicyOf(comm->policy_);

  const int m = options.nranks;
  std::vector<std::string> names;
  for (int i = 0; i < m; ++i) names.push_back(options.region + "/rank" + std::to_string(i));
  g.transport = std::make_unique<collective::NetTransport>(options.rank, m, names);
  for (int i = 0; i < m; ++i) g.receivers.push_back(g.transport->ReceiverFor(i));
  g.links.resize(static_cast<size_t>(m));

  uint16_t data_port = 0;
  if (m > 1) {
    net::EndpointOptions eo;
    eo.region = options.region;
    eo.transport = net::Transport::kPlainTcp;  // the region's LAN, as the gateways' region phase
    eo.peer_regions = {options.region};
    eo.link.streams = 2;
    eo.link.unreachable_after_ns = std::max<int64_t>(options.timeout_ns, 1'000'000'000);
    // Links are dialled both ways (each rank dials every other): an accepted link's messages
    // go to the receiver of the rank its NetTransport header names.
    const int self = options.rank;
    std::vector<collective::NetTransport::Receiver> receivers = g.receivers;
    auto endpoint = net::Endpoint::Create(eo, [receivers, self](std::shared_ptr<net::Link>) {
      return net::MessageCallback([receivers, self](uint32_t channel, std::vector<uint8_t> msg) {
        if (msg.size() >= collective::kNetTransportHeaderSize) {
          const uint32_t sender = uint32_t{msg[4]} | uint32_t{msg[5]} << 8 |
                                  uint32_t{msg[6]} << 16 | uint32_t{msg[7]} << 24;
          if (sender < receivers.size() && static_cast<int>(sender) != self) {
            receivers[sender](channel, std::move(msg));
          }
        }
      });
    });
    if (!endpoint.ok()) return endpoint.status().WithContext(me + ": region links");
    g.endpoint = std::move(endpoint).value();
    const bool v6 = options.root_host.find(':') != std::string::npos;
    auto port = g.endpoint->Listen(v6 ? "::" : "0.0.0.0", 0);
    if (!port.ok()) return port.status().WithContext(me + ": listening for the region's ranks");
    data_port = *port;
  }

  BootstrapOptions bo;
  bo.root_host = options.root_host;
  bo.root_port = options.root_port;
  bo.rank = options.rank;
  bo.nranks = m;
  bo.job = options.job;
  bo.region = options.region;
  bo.data_port = data_port;
  auto table = Rendezvous(bo, deadline);
  if (!table.ok()) return table.status().WithContext(me + ": rendezvous");

  for (int p = 0; p < m; ++p) {
    if (p == options.rank) continue;
    const RankAddress& a = (*table)[static_cast<size_t>(p)];
    auto link =
        g.endpoint->Connect(options.region, a.host, a.port, g.receivers[static_cast<size_t>(p)]);
    if (!link.ok()) {
      return link.status().WithContext(me + ": link to rank " + std::to_string(p) + " at " +
                                       a.host + ":" + std::to_string(a.port));
    }
    g.links[static_cast<size_t>(p)] = *link;
    g.transport->SetLink(p, *link);
  }
  // Every rank's hello arrived: the links work both ways before the first all-reduce.
  for (;;) {
    std::string missing;
    for (int p = 0; p < m; ++p) {
      if (p != options.rank && g.transport->PeerIncarnation(p) == 0) {
        AppendToList(missing, std::to_string(p));
      }
    }
    if (missing.empty()) break;
    if (deadline.Expired()) {
      return DeadlineExceededError(me + ": no link from rank(s) " + missing +
                                   " of the region came up in time (a firewall between the "
                                   "ranks, or a rank that died after the rendezvous?)");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  return comm;
}

Status HostComm::Failure() {
  std::lock_guard<std::mutex> lock(mu_);
  return failed_;
}

Status HostComm::AllReduce(const void* send, void* recv, size_t count, DataType dtype, ReduceOp op,
                           const std::string& tensor_key, CUstream_st* stream) {
  if (stream != nullptr) {
    return InvalidArgumentError(
        "stream must be NULL for a host-backend comm (it runs on the calling thread; streams "
        "belong to the NCCL backend)");
  }
  std::lock_guard<std::mutex> lock(mu_);
  if (!failed_.ok()) {
    return FailedPreconditionError("an earlier all-reduce on this comm failed (" +
                                   failed_.ToString() +
                                   "); destroy the comm and create a new one on every rank");
  }
  if (count == 0) return Status::Ok();
  auto* data = static_cast<uint8_t*>(recv);
  if (send != recv) std::memmove(data, send, count * DataTypeSize(dtype));
  Status s = RunAllReduce(data, count, dtype, op, tensor_key);
  if (!s.ok()) failed_ = s;
  return s;
}

Status HostComm::RunAllReduce(uint8_t* data, size_t count, DataType dtype, ReduceOp op,
                              const std::string& tensor_key) {
  Impl& g = *impl_;
  const int m = options_.nranks;
  const int me = options_.rank;
  const size_t elem = DataTypeSize(dtype);
  const uint64_t op_id = next_op_++ & collective::kOpIdMask;
  const Deadline deadline = Deadline::After(options_.timeout_ns);
  const bool float_path = IsFloatPath(dtype, op);
  const std::string what = "all-reduce of " + std::to_string(count) + " " + DataTypeName(dtype) +
                           " (" + ReduceOpName(op) + ", tensor '" + tensor_key + "') on rank " +
                           std::to_string(me) + " of region " + options_.region;

  collective::PlanOptions po;
  po.count = count;
  po.world = m;
  po.chunk_elements = std::max<size_t>(1, kRegionChunkBytes / elem);
  po.algorithm = collective::Algorithm::kMesh;
  auto plan_or = collective::MakePlan(po);
  if (!plan_or.ok()) return plan_or.status().WithContext(what);
  const collective::Plan plan = std::move(plan_or).value();
  const collective::Shard shard = plan.shards[static_cast<size_t>(me)];

  auto errors = std::make_shared<SendErrors>();
  const auto message = [&](Kind kind, const uint8_t* payload, size_t size) {
    std::vector<uint8_t> out(kHostMessageHeaderSize + size);
    out[0] = kHostMessageVersion;
    out[1] = static_cast<uint8_t>(kind);
    out[2] = static_cast<uint8_t>(dtype);
    out[3] = static_cast<uint8_t>(op);
    PutU64(&out[8], count);
    if (size > 0) std::memcpy(out.data() + kHostMessageHeaderSize, payload, size);
    return out;
  };
  const auto send_to = [&](int peer, uint64_t tag, std::vector<uint8_t> bytes) {
    g.transport->Send(peer, tag, std::move(bytes), deadline, [errors](Status s) {
      if (s.ok()) return;
      std::lock_guard<std::mutex> l(errors->mu);
      if (errors->first.ok()) errors->first = s;
    });
  };
  bool aborted_by_peer = false;
  std::vector<uint8_t> msg;
  const auto receive = [&](int peer, collective::TagPhase phase, const collective::Chunk& chunk,
                           const char* part) -> Status {
    const uint64_t tag = collective::MakeTag(op_id, phase, chunk.id);
    Status s = g.transport->Recv(peer, tag, deadline, &msg);
    if (!s.ok()) {
      aborted_by_peer = s.code() == StatusCode::kAborted;
      return s.WithContext("waiting for rank " + std::to_string(peer) + "'s " + part +
                           " of elements " + std::to_string(chunk.begin) + ".." +
                           std::to_string(chunk.begin + chunk.count));
    }
    const std::string from = "rank " + std::to_string(peer) + " of region " + options_.region;
    if (msg.size() < kHostMessageHeaderSize || msg[0] != kHostMessageVersion ||
        msg[1] != static_cast<uint8_t>(
                      phase == collective::TagPhase::kMeshScatter ? Kind::kPart : Kind::kResult)) {
      return DataLossError(from + " sent a malformed " + part + " message (" +
                           std::to_string(msg.size()) + " bytes, version " +
                           std::to_string(msg.empty() ? 0 : msg[0]) +
                           "): run the same Strait version on every rank");
    }
    const uint64_t n = GetU64(&msg[8]);
    if (msg[2] != static_cast<uint8_t>(dtype) || msg[3] != static_cast<uint8_t>(op) || n != count) {
      return FailedPreconditionError(
          "every rank must issue the same all-reduces in the same order, but " + from +
          " runs one of " + Describe(n, msg[2], msg[3]) + " and this rank one of " +
          Describe(count, static_cast<uint8_t>(dtype), static_cast<uint8_t>(op)));
    }
    if (msg.size() - kHostMessageHeaderSize != chunk.count * elem) {
      return DataLossError(from + " sent " + std::to_string(msg.size() - kHostMessageHeaderSize) +
                           " bytes for a chunk of " + std::to_string(chunk.count * elem));
    }
    return Status::Ok();
  };

  // Phase 1: send my parts of the other shards (round-robin over owners so that every rank
  // gets its first parts early), then reduce my shard in fixed rank order.
  const auto reduce_scatter = [&]() -> Status {
    size_t rounds = 0;
    for (int o = 0; o < m; ++o) rounds = std::max(rounds, plan.ChunkCount(o));
    for (size_t k = 0; k < rounds; ++k) {
      for (int j = 1; j < m; ++j) {
        const int owner = (me + j) % m;
        if (k >= plan.ChunkCount(owner)) continue;
        const collective::Chunk& c = plan.ChunkOf(owner, k);
        send_to(owner, collective::MakeTag(op_id, collective::TagPhase::kMeshScatter, c.id),
                message(Kind::kPart, data + c.begin * elem, c.count * elem));
      }
    }
    const ReduceOp exact_op = op == ReduceOp::kAvg ? ReduceOp::kSum : op;
    std::vector<float> facc, in;
    std::vector<uint8_t> tacc;
    for (size_t k = 0; k < plan.ChunkCount(me); ++k) {
      const collective::Chunk& c = plan.ChunkOf(me, k);
      uint8_t* const mine = data + c.begin * elem;
      const size_t n = c.count;
      facc.resize(float_path ? n : 0);
      in.resize(float_path ? n : 0);
      tacc.resize(float_path ? 0 : n * elem);
      for (int r = 0; r < m; ++r) {
        const uint8_t* part = mine;
        if (r != me) {
          STRAIT_RETURN_IF_ERROR(receive(r, collective::TagPhase::kMeshScatter, c, "part"));
          part = msg.data() + kHostMessageHeaderSize;
        }
        if (float_path) {
          STRAIT_RETURN_IF_ERROR(ConvertToFloat(part, dtype, r == 0 ? facc.data() : in.data(), n));
          if (r > 0) {
            for (size_t i = 0; i < n; ++i) facc[i] += in[i];
          }
        } else if (r == 0) {
          std::memcpy(tacc.data(), part, n * elem);
        } else {
          STRAIT_RETURN_IF_ERROR(ReduceInPlace(dtype, exact_op, part, tacc.data(), n));
        }
      }
      if (float_path) {
        if (op == ReduceOp::kAvg) {
          const float divisor = static_cast<float>(m);
          for (float& x : facc) x /= divisor;
        }
        STRAIT_RETURN_IF_ERROR(ConvertFromFloat(facc.data(), mine, dtype, n));
      } else {
        std::memcpy(mine, tacc.data(), n * elem);
      }
    }
    return Status::Ok();
  };

  // Phase 2: my shard across the regions, through my gateway.
  const auto cross = [&]() -> Status {
    if (shard.count == 0) return Status::Ok();
    const std::string key = collective::RegionShardKey(tensor_key, me, m);
    Deadline sub = deadline;
    if (m > 1 && !deadline.IsInfinite()) {
      const int64_t left = deadline.RemainingNanos();
      sub = Deadline::After(left - std::min(left / 10, kMaxAbortMarginNanos));
    }
    const size_t piece = std::max<size_t>(1, kMaxCrossBytes / elem);
    const size_t pieces = (shard.count + piece - 1) / piece;
    for (size_t k = 0; k < pieces; ++k) {
      const size_t begin = shard.begin + k * piece;
      const size_t n = std::min(piece, shard.begin + shard.count - begin);
      const std::string piece_key = pieces == 1 ? key : key + ":part" + std::to_string(k);
      if (float_path && g.frames->policy.has_value()) {
        auto sent = g.frames->Run(*g.client, options_.job, piece_key, dtype, op,
                                  data + begin * elem, n, sub);
        if (!sent.ok()) {
          return sent.status().WithContext("cross-region phase of shard " + std::to_string(me) +
                                           " through " + options_.gateway + " (as a frame)");
        }
        if (*sent) continue;
      }
      STRAIT_RETURN_IF_ERROR(
          g.client->AllReduce(options_.job, piece_key, dtype, op, data + begin * elem, n, sub)
              .WithContext("cross-region phase of shard " + std::to_string(me) + " through " +
                           options_.gateway));
    }
    if (!float_path && op == ReduceOp::kAvg) {
      STRAIT_RETURN_IF_ERROR(
          DivideInPlace(dtype, data + shard.begin * elem, shard.count, static_cast<uint64_t>(m)));
    }
    return Status::Ok();
  };

  // Phase 3: send my finished shard to the region, take every other rank's.
  const auto all_gather = [&]() -> Status {
    for (size_t k = 0; k < plan.ChunkCount(me); ++k) {
      const collective::Chunk& c = plan.ChunkOf(me, k);
      const uint64_t tag = collective::MakeTag(op_id, collective::TagPhase::kMeshGather, c.id);
      for (int j = 1; j < m; ++j) {
        send_to((me + j) % m, tag, message(Kind::kResult, data + c.begin * elem, c.count * elem));
      }
    }
    for (int j = 1; j < m; ++j) {
      const int owner = (me + j) % m;
      for (size_t k = 0; k < plan.ChunkCount(owner); ++k) {
        const collective::Chunk& c = plan.ChunkOf(owner, k);
        STRAIT_RETURN_IF_ERROR(receive(owner, collective::TagPhase::kMeshGather, c, "result"));
        std::memcpy(data + c.begin * elem, msg.data() + kHostMessageHeaderSize, c.count * elem);
      }
    }
    return Status::Ok();
  };

  Status status = reduce_scatter().WithContext("intra-region reduce-scatter");
  if (status.ok()) status = cross();
  if (status.ok()) status = all_gather().WithContext("intra-region all-gather");
  if (status.ok()) {
    std::lock_guard<std::mutex> l(errors->mu);
    if (!errors->first.ok()) status = errors->first.WithContext("sending to the region");
  }
  if (!status.ok()) {
    status = status.WithContext(what);
    // Tell the region at once, unless the failure is a peer's abort (echoing it adds nothing).
    if (!aborted_by_peer && m > 1) g.transport->Abort(op_id, status);
  }
  return status;
}

}  // namespace strait::api

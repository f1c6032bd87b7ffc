// The host backend: region rendezvous, region links, and the three-phase all-reduce (see
// host_backend.h).
#include "api/host_backend.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <functional>
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
#include "common/endian.h"
#include "common/log.h"
#include "common/strings.h"
#include "localproto/client.h"
#include "net/link.h"
#include "strait/codec.h"
#include "strait/reduce.h"

namespace strait::api {
namespace {

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
  // `recover`: what to do when the gateway went away during the step (HostComm::RecoverStep).
  StatusOr<bool> Run(localproto::Client& client, const std::string& job, const std::string& key,
                     DataType dtype, ReduceOp op, uint8_t* data, size_t n, Deadline deadline,
                     const std::function<StatusOr<std::vector<uint8_t>>(const Status&)>& recover) {
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
    if (!s.ok() && client.broken()) {
      auto recovered = recover(s);
      if (recovered.ok()) {
        result = std::move(recovered).value();
        s = Status::Ok();
      } else {
        s = recovered.status();
      }
    }
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

// All-reduce calls of each job this process completed, over all its comms: the step the job's
// ranks go on from, which a new comm's join compares across the regions (gateway/generation.h,
// "Resume positions"). Never freed: comms of any thread read it until exit.
std::mutex g_steps_mu;
std::map<std::string, uint64_t>& CompletedSteps() {
  static auto* steps = new std::map<std::string, uint64_t>();
  return *steps;
}

}  // namespace

struct HostComm::Impl {
  std::unique_ptr<collective::NetTransport> transport;
  std::vector<collective::NetTransport::Receiver> receivers;
  std::unique_ptr<net::Endpoint> endpoint;
  std::vector<std::shared_ptr<net::Link>> links;
  std::unique_ptr<localproto::Client> client;
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
  auto client = localproto::Client::Connect(
      options.gateway, deadline,
      "strait-api " + options.region + "/rank" + std::to_string(options.rank), options.shard);
  if (!client.ok()) return client.status().WithContext(me + ": gateway " + options.gateway);
  g.client = std::move(client).value();
  g.client->UseSharedMemory(options.shared_memory);
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
    // go to the receiver of the rank its NetTransport trailer names.
    const int self = options.rank;
    std::vector<collective::NetTransport::Receiver> receivers = g.receivers;
    auto endpoint = net::Endpoint::Create(eo, [receivers, self](std::shared_ptr<net::Link>) {
      return net::MessageCallback([receivers, self](uint32_t channel, std::vector<uint8_t> msg) {
        const int sender = collective::NetMessageSender(msg);
        if (sender >= 0 && static_cast<size_t>(sender) < receivers.size() && sender != self) {
          receivers[static_cast<size_t>(sender)](channel, std::move(msg));
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
  // Last, once the region is complete (its own problems are named first): the comm's
  // generation, agreed with every region's gateway of this shard (localproto/protocol.h, "Operation
  // identity"). This comm's all-reduces are numbered within it, so no step of an earlier comm
  // (before a failure or a gateway restart) can ever pair with them.
  uint64_t completed = 0;
  {
    std::lock_guard<std::mutex> lock(g_steps_mu);
    completed = CompletedSteps()[options.job];
  }
  if (auto generation = g.client->JoinJob(options.job, deadline, 1 + completed);
      !generation.ok()) {
    return generation.status().WithContext(me + ": joining job '" + options.job +
                                           "' with the other regions");
  }
  return comm;
}

StatusOr<std::vector<uint8_t>> HostComm::RecoverStep(const Status& failure, Deadline deadline) {
  Impl& g = *impl_;
  const auto [generation, sequence] = g.client->LastIdentity(options_.job);
  if (generation == 0) return failure;
  recovered_ = true;  // whatever comes of it, this comm's generation is over
  STRAIT_LOG(kInfo, "api") << "gateway " << options_.gateway << " went away during step "
                           << sequence << " of generation " << generation << " (" << failure
                           << "); asking the restarted gateway for its committed result";
  Status last = failure;
  while (!deadline.Expired()) {
    auto client = localproto::Client::Connect(
        options_.gateway, deadline, "strait-api " + options_.region + "/rank" +
                                        std::to_string(options_.rank) + " (recovery)",
        options_.shard);
    if (client.ok()) {
      auto policy = (*client)->RegisterJob(options_.job, options_.compression, deadline);
      if (!policy.ok()) return failure.WithContext(policy.status().ToString());
      auto data = (*client)->FetchResult(options_.job, generation, sequence, deadline);
      g.client = std::move(client).value();
      g.client->UseSharedMemory(options_.shared_memory);
      if (data.ok()) return data;
      return failure.WithContext("and its result could not be recovered: " +
                                 data.status().ToString());
    }
    last = client.status();
    // The daemon restarts (systemd, Kubernetes): a fifth of a second between tries.
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  return failure.WithContext("the gateway did not come back in time: " + last.ToString());
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
    Status s = FailedPreconditionError("an earlier all-reduce on this comm failed (" +
                                       failed_.ToString() +
                                       "); destroy the comm and create a new one on every rank");
    // The region's other ranks are in this step: end it for them at once, not at its deadline.
    if (options_.nranks > 1) impl_->transport->Abort(next_op_++ & collective::kOpIdMask, s);
    return s;
  }
  Status s;
  if (count > 0) {
    auto* data = static_cast<uint8_t*>(recv);
    if (send != recv) std::memmove(data, send, count * DataTypeSize(dtype));
    s = RunAllReduce(data, count, dtype, op, tensor_key);
  }
  if (!s.ok()) {
    failed_ = s;
    return s;
  }
  if (recovered_) {
    // This step's result came back from the other regions after the gateway restarted; the
    // comm's generation is gone with it, so the next call fails (every region's next step
    // fails alike) and the new comms start together.
    failed_ = UnavailableError("the gateway " + options_.gateway +
                               " restarted during the previous step (its result was recovered "
                               "from the other regions)");
  }
  std::lock_guard<std::mutex> steps(g_steps_mu);
  ++CompletedSteps()[options_.job];
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
  const bool float_path = collective::IsFloatReduction(dtype, op);
  const std::string what = "all-reduce of " + std::to_string(count) + " " + DataTypeName(dtype) +
                           " (" + ReduceOpName(op) + ", tensor '" + tensor_key + "') on rank " +
                           std::to_string(me) + " of region " + options_.region;

  auto plan = collective::RegionPlan(count, m, std::max<size_t>(1, kRegionChunkBytes / elem));
  if (!plan.ok()) return plan.status().WithContext(what);
  const collective::Shard shard = plan->shards[static_cast<size_t>(me)];

  // Phases 1 and 3 are the gateways' region phases (collective/hierarchical.h) among the ranks.
  // Sends are not waited for (see SendErrors): only their failures are kept.
  auto errors = std::make_shared<SendErrors>();
  collective::RegionOperation region;
  region.transport = g.transport.get();
  region.op_id = op_id;
  region.plan = &*plan;
  region.data = data;
  region.dtype = dtype;
  region.op = op;
  region.deadline = deadline;
  region.track_send = [errors] {
    return collective::SendDone([errors](Status s) {
      if (s.ok()) return;
      std::lock_guard<std::mutex> l(errors->mu);
      if (errors->first.ok()) errors->first = std::move(s);
    });
  };
  region.names.peer = [this](int peer) {
    return "rank " + std::to_string(peer) + " of region " + options_.region;
  };
  region.names.self = "this rank";
  region.names.members = "rank";
  region.names.mismatch_code = StatusCode::kFailedPrecondition;

  // Phase 2: my shard across the regions, through my gateway.
  const auto cross = [&]() -> Status {
    if (shard.count == 0) return Status::Ok();
    const std::string key = collective::RegionShardKey(tensor_key, me, m);
    const Deadline sub = collective::CrossPhaseDeadline(deadline, m);
    const size_t piece = std::max<size_t>(1, kMaxCrossBytes / elem);
    const size_t pieces = (shard.count + piece - 1) / piece;
    for (size_t k = 0; k < pieces; ++k) {
      const size_t begin = shard.begin + k * piece;
      const size_t n = std::min(piece, shard.begin + shard.count - begin);
      const std::string piece_key = pieces == 1 ? key : key + ":part" + std::to_string(k);
      if (recovered_) {
        // The gateway restarted during an earlier piece of this step: the rest cannot go on in
        // the old generation, so the step fails here as in every other region.
        return UnavailableError("the gateway " + options_.gateway +
                                " restarted during this step; destroy the comm and create a new "
                                "one on every rank");
      }
      const auto recover = [&](const Status& failure) { return RecoverStep(failure, sub); };
      if (float_path && g.frames->policy.has_value()) {
        auto sent = g.frames->Run(*g.client, options_.job, piece_key, dtype, op,
                                  data + begin * elem, n, sub, recover);
        if (!sent.ok()) {
          return sent.status().WithContext("cross-region phase of shard " + std::to_string(me) +
                                           " through " + options_.gateway + " (as a frame)");
        }
        if (*sent) continue;
      }
      Status s =
          g.client->AllReduce(options_.job, piece_key, dtype, op, data + begin * elem, n, sub);
      if (!s.ok() && g.client->broken()) {
        auto recovered = recover(s);
        if (recovered.ok() && recovered->size() == n * elem) {
          std::memcpy(data + begin * elem, recovered->data(), recovered->size());
          s = Status::Ok();
        } else if (recovered.ok()) {
          s = DataLossError("the recovered result is " + std::to_string(recovered->size()) +
                            " bytes, not " + std::to_string(n * elem));
        } else {
          s = recovered.status();
        }
      }
      STRAIT_RETURN_IF_ERROR(s.WithContext("cross-region phase of shard " + std::to_string(me) +
                                           " through " + options_.gateway));
    }
    if (!float_path && op == ReduceOp::kAvg) {
      STRAIT_RETURN_IF_ERROR(
          DivideInPlace(dtype, data + shard.begin * elem, shard.count, static_cast<uint64_t>(m)));
    }
    return Status::Ok();
  };

  Status status =
      collective::RegionReduceScatter(region).WithContext("intra-region reduce-scatter");
  if (status.ok()) status = cross();
  if (status.ok()) {
    status = collective::RegionAllGather(region).WithContext("intra-region all-gather");
  }
  if (status.ok()) {
    std::lock_guard<std::mutex> l(errors->mu);
    if (!errors->first.ok()) status = errors->first.WithContext("sending to the region");
  }
  if (!status.ok()) {
    status = status.WithContext(what);
    // Tell the region at once, unless the failure is a peer's abort (echoing it adds nothing).
    if (!region.peer_aborted && m > 1) g.transport->Abort(op_id, status);
  }
  return status;
}

}  // namespace strait::api

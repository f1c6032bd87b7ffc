// straitd's all-reduce as named stages (see allreduce_service.h): Admit -> ResolveCodecs ->
// Prepare -> Number -> Run -> Commit -> Reply.
#include "gateway/allreduce_service.h"

#include <algorithm>
#include <mutex>
#include <span>
#include <utility>

#include "collective/hierarchical.h"
#include "common/log.h"
#include "gateway/gateway_impl.h"
#include "gateway/numbering.h"

namespace strait::gateway {
namespace {

constexpr const char* kLog = "gateway";

// kAllReduceFrame: the rank's frame must be a valid, unchained lossy frame; its header gives the
// request's dtype and count.
Status InspectRequestFrame(Message& request, FrameInfo* info) {
  auto inspected = InspectFrame(request.data);
  if (!inspected.ok()) return inspected.status().WithContext("the rank's frame");
  if (!IsLossyCodec(inspected->codec)) {
    return InvalidArgumentError(std::string("the rank's frame is ") + CodecName(inspected->codec) +
                                ", not a lossy codec (int8, int4, fp8): send lossless tensors "
                                "raw with all-reduce");
  }
  if ((inspected->flags & kFrameFlagZstd) != 0) {
    return InvalidArgumentError(
        "the rank's frame is zstd-chained; send the quantized frame "
        "without chain_zstd (the gateway forwards its blocks as they are)");
  }
  *info = *inspected;
  request.dtype = info->dtype;
  request.count = info->element_count;
  return Status::Ok();
}

// kAllReduceFrame: the job's policy must give the frame's codec for this tensor, fixed (auto
// chooses codecs per link inside the gateway, which a pre-quantized frame cannot follow).
Status CheckFramePolicy(const std::string& job, const std::string& policy_text, bool automatic,
                        const TensorCodec& tc, CodecId frame_codec, const char* whose) {
  const std::string frame = CodecName(frame_codec);
  if (automatic || !tc.send_codecs.empty() || !tc.result_codecs.empty()) {
    return FailedPreconditionError(
        std::string(whose) + " policy for job \"" + job + "\" is " + policy_text +
        ": auto chooses codecs per link, but this frame is " + frame +
        " already; register the job with policy \"" + frame + "\" to send quantized frames");
  }
  if (tc.codec.codec != frame_codec) {
    return FailedPreconditionError(
        std::string(whose) + " policy for job \"" + job + "\" (" + policy_text + ") gives " +
        CodecName(tc.codec.codec) + " for this tensor, but the frame is " + frame +
        "; register the job with policy \"" + frame + "\" (and let it allow " + frame +
        " for tensors this size), or quantize with " + CodecName(tc.codec.codec));
  }
  return Status::Ok();
}

// ", name=a,b,c": how the tensor was divided (elements per part), for clients and tests.
std::string CountsText(const char* name, const std::vector<collective::Shard>& parts) {
  std::string text = std::string(" ") + name + "=";
  for (size_t i = 0; i < parts.size(); ++i) {
    text += (i ? "," : "") + std::to_string(parts[i].count);
  }
  return text;
}

}  // namespace

Message AllReduceService::Handle(Message& request) {
  StatusOr<Admission> admitted = Admit(request);
  if (!admitted.ok()) return Refused(request.type, admitted.status());
  const Admission& a = *admitted;
  Message reply = gateway::Reply(request.type, Status::Ok());
  reply.data = std::move(request.data);
  Operation op;  // points into `reply`: both live until the reply is returned
  collective::AllReduceStats stats;
  const StatusOr<TensorCodec> codecs = ResolveCodecs(request, a);
  Status s = codecs.status();
  if (s.ok()) s = Prepare(request, a, *codecs, reply, &op);
  // From here on the step's identity is used: a failure now spends it in every region.
  const bool spent = s.ok();
  if (spent) {
    s = Number(request, a, &op);
    if (s.ok()) s = Run(request, &op, &stats);
    s = Commit(op, std::move(s));
  }
  --g_.in_flight;
  g_.RecordAllReduce(request, s, MonotonicNanos() - a.start_ns, stats);
  if (!s.ok()) return Failed(request, s, spent);
  return Reply(request, a, *codecs, op, stats, std::move(reply));
}

StatusOr<AllReduceService::Admission> AllReduceService::Admit(Message& request) {
  Admission a{MonotonicNanos(), {}, std::nullopt, Deadline::Infinite()};
  {
    std::lock_guard<std::mutex> lock(g_.mu);
    const JobPolicy* policy = g_.jobs.Find(request.job);
    if (policy == nullptr) {
      ++g_.bad_requests;
      return JobTable::NotRegistered(request.job);
    }
    // Under `mu`, as Shutdown sets `stopping`: either it refuses here, or Shutdown waits for it.
    if (g_.stopping.load()) return UnavailableError("the gateway is shutting down");
    if (Status owner = g_.jobs.CheckOwner(request.job, request.client_uid); !owner.ok()) {
      ++g_.refused_requests;
      STRAIT_LOG(kWarn, kLog) << "refused all-reduce: " << owner.message();
      return owner;
    }
    a.policy = *policy;
    ++g_.in_flight;
  }
  if (request.type == MessageType::kAllReduceFrame) {
    // Refused before the operation is numbered: the other regions never hear of it. Checked
    // against this gateway's own policy; ResolveCodecs checks the regions' agreed one.
    FrameInfo frame;
    Status fs = InspectRequestFrame(request, &frame);
    if (fs.ok()) {
      fs = CheckFramePolicy(request.job, a.policy.ToString(), a.policy.automatic,
                            ChooseTensorCodec(a.policy, request.dtype, request.op,
                                              static_cast<size_t>(request.count)),
                            frame.codec, "this gateway's");
    }
    if (!fs.ok()) {
      --g_.in_flight;
      ++g_.bad_requests;
      STRAIT_LOG(kWarn, kLog) << "refused all-reduce-frame " << request.job << "/"
                              << request.tensor_key << ": " << fs;
      return fs.WithContext("all-reduce-frame of " + request.job + "/" + request.tensor_key);
    }
    a.frame = frame;
  }
  int64_t budget = g_.config.allreduce_deadline_ns;
  if (request.timeout_ms > 0) budget = std::min<int64_t>(budget, request.timeout_ms * 1'000'000ll);
  a.deadline = Deadline::After(budget);
  return a;
}

StatusOr<TensorCodec> AllReduceService::ResolveCodecs(const Message& request, const Admission& a) {
  STRAIT_RETURN_IF_ERROR(g_.WaitForLinks(a.deadline));
  // The policy the regions agreed on for the job, and per link under `auto` (see policy.h).
  STRAIT_ASSIGN_OR_RETURN(const JobPolicy policy, g_.AgreedPolicy(request.job, a.deadline));
  std::vector<net::LinkEstimates> estimates(g_.world.size());
  if (policy.automatic) {
    std::vector<std::shared_ptr<net::Link>> peers;
    {
      std::lock_guard<std::mutex> lock(g_.mu);
      peers = g_.links;
    }
    for (size_t p = 0; p < peers.size(); ++p) {
      if (peers[p]) estimates[p] = peers[p]->Estimates();
    }
  }
  TensorCodec tc =
      ChooseLinkCodecs(policy, request.dtype, request.op, static_cast<size_t>(request.count),
                       g_.rank, estimates, g_.peer_control.codec_profiles);
  if (a.frame.has_value()) {
    STRAIT_RETURN_IF_ERROR(CheckFramePolicy(request.job, tc.ToString(), false, tc, a.frame->codec,
                                            "the regions' agreed"));
  }
  return tc;
}

Status AllReduceService::Prepare(const Message& request, const Admission& a, const TensorCodec& tc,
                                 Message& reply, Operation* op) {
  collective::AllReduceRequest& req = op->req;
  req.job = request.job;
  req.tensor_key = request.tensor_key;
  req.dtype = request.dtype;
  req.op = request.op;
  req.count = static_cast<size_t>(request.count);
  // kAllReduceShm, kRegionAllReduceShm: the tensor lies in the rank's shared region and is reduced there in place;
  // the reply carries no data.
  req.data = localproto::InSharedRegion(request.type) ? request.shm_data.data()
                                                       : reply.data.data();
  req.feedback = &feedback_;
  req.shard_weights = g_.config.ShardWeights();  // empty (equal shards) unless configured
  req.chunk_elements = g_.config.chunk_elements != 0
                           ? g_.config.chunk_elements
                           : collective::ChunkElementsFor(req.count, IsLossyCodec(tc.codec.codec));
  req.deadline = a.deadline;
  req.codec = tc.codec;
  req.error_feedback = tc.error_feedback;
  req.send_codecs = tc.send_codecs;
  req.result_codecs = tc.result_codecs;
  req.accept_codecs = tc.accept_codecs;
  if (!a.frame.has_value()) return Status::Ok();
  // Frame mode: the rank's frame is the input, and the reply's data becomes the result frame.
  op->input_frame = std::exchange(reply.data, {});
  req.codec.block_size = a.frame->block_size;
  const size_t blocks = (req.count + a.frame->block_size - 1) / a.frame->block_size;
  if (blocks >= g_.world.size() || req.count == 0) {
    // The frame's blocks go to their owners as they are (AllReduceRequest::input_stage).
    req.data = nullptr;
    req.input_stage = std::span<const uint8_t>(op->input_frame).subspan(kFrameHeaderSize);
    req.result_frame = &reply.data;
    return Status::Ok();
  }
  // Fewer blocks than regions: a block would straddle two owners. The tensor is tiny, so it is
  // all-reduced exactly in fp32 from the decoded frames, and every gateway quantizes the
  // identical fp32 result the same way afterwards (round to nearest, in Reply): identical frames.
  op->tiny_values.resize(req.count);
  Decoder decoder;
  STRAIT_RETURN_IF_ERROR(
      decoder.Decode(op->input_frame, op->tiny_values.data(), req.count, DataType::kFloat32));
  req.dtype = DataType::kFloat32;
  req.data = op->tiny_values.data();
  req.codec = CodecOptions{};
  req.error_feedback = false;
  return Status::Ok();
}

Status AllReduceService::Number(const Message& request, const Admission& a, Operation* op) {
  // The operation's identity (see "Operation identity" in localproto/protocol.h): its op id
  // hashes all of it, so steps of different comms or positions never meet; the announcement
  // (Begin) makes a disagreement between regions a clear error instead of a wait for the
  // deadline.
  op->identity = IdentityText(request, a.frame.has_value() ? &*a.frame : nullptr) +
                 GatewayIdentityText(op->req.chunk_elements);
  const uint64_t word = IdentityWord(request.generation, request.sequence);
  op->req.op_id = TransportOpId(request, op->identity, word);
  op->region_op_id = RegionSideOpId(request.job, request.tensor_key, request.scope, word);
  STRAIT_RETURN_IF_ERROR(Weigh(request, word, op));
  return Begin(request, op);
}

uint64_t AllReduceService::TransportOpId(const Message& request, const std::string& identity,
                                         uint64_t word) const {
  const uint64_t op_id = OperationId(request.job, identity, word);
  if (!localproto::IsRegionAllReduce(request.type)) return op_id;
  // The one id the operation has everywhere: it runs under it on the cross-region transport,
  // Generations knows it by it (EndOp, and a peer's mismatch aborts it), and failures abort it.
  return RegionCrossOpId(request.job, request.tensor_key, g_.config.RegionSize(), op_id);
}

Status AllReduceService::Weigh(const Message& request, uint64_t word, Operation* op) {
  // Shard weights from the regions' measured link rates (see "Shard weights" in gateway.h),
  // when every region's gateway measures (none configured allreduce.shard_weights).
  const auto agreed = g_.peer_control.agreement->Agreed(request.job);
  if (!op->req.shard_weights.empty() || !agreed.has_value() || !agreed->ok() ||
      !(*agreed)->measured_weights) {
    return Status::Ok();
  }
  auto weights =
      g_.MeasuredWeights(request.job, request.generation, request.sequence, op->req.deadline);
  if (!weights.ok()) {
    // The peers run this operation too: tell them, so that every region fails this step.
    g_.transport->Abort(op->req.op_id, weights.status());
    return weights.status();
  }
  if (weights->empty()) return Status::Ok();
  // Operations cut differently never meet, and the announcement names both splits.
  op->identity += kWeightsIdentityMarker;
  for (size_t i = 0; i < weights->size(); ++i) {
    op->identity += (i ? "/" : "") + std::to_string((*weights)[i]);
  }
  op->req.op_id = TransportOpId(request, op->identity, word);
  op->req.shard_weights = *std::move(weights);
  return Status::Ok();
}

Status AllReduceService::Begin(const Message& request, Operation* op) {
  std::vector<uint8_t> announce;
  Status s = g_.generations->BeginOp(GenerationKey(request.job, request.scope), request.generation,
                                     request.sequence, op->identity, op->req.op_id, &announce);
  if (!s.ok()) {
    // Refused here (another region announced another identity, or a newer generation): the
    // peers that run this step must not wait for it -- this region's other gateways included.
    g_.transport->Abort(op->req.op_id, s);
    if (localproto::IsRegionAllReduce(request.type)) {
      g_.region_state.transport->Abort(op->region_op_id, s);
    }
    // A disagreement: the peers run the step under another op id, which the abort above never
    // reaches; this region's announcement makes them find the mismatch themselves.
    if (!announce.empty()) g_.SendToPeers(kGenerationChannel, announce);
    return s;
  }
  op->began = true;
  g_.SendToPeers(kGenerationChannel, announce);
  return Status::Ok();
}

Status AllReduceService::Run(const Message& request, Operation* op,
                             collective::AllReduceStats* stats) {
  const int64_t started = MonotonicNanos();
  Status s;
  if (localproto::IsRegionAllReduce(request.type)) {
    s = g_.RunRegionAllReduce(op->req, op->region_op_id, stats);
  } else {
    s = collective::AllReduce(*g_.transport, op->req, stats);
    // Every region's gateway confirms it holds the result before any answers its rank.
    if (s.ok()) s = g_.ConfirmCommit(op->req.op_id, request.job, op->req.deadline);
  }
  if (s.ok()) counters_.allreduce_ns += MonotonicNanos() - started;
  return s;
}

Status AllReduceService::Commit(const Operation& op, Status run) {
  if (!op.began) return run;
  // A peer's announcement of another identity for this step aborted it: that is the error.
  if (Status mismatch = g_.generations->EndOp(op.req.op_id); !run.ok() && !mismatch.ok()) {
    return mismatch;
  }
  return run;
}

Message AllReduceService::Failed(const Message& request, const Status& s, bool spent) {
  ++counters_.failed;
  const std::string step = "generation " + std::to_string(request.generation) + " step " +
                           std::to_string(request.sequence);
  STRAIT_LOG(kWarn, kLog) << "all-reduce " << request.job << "/" << request.tensor_key << " "
                          << step << " failed: " << s;
  const Status failed =
      s.WithContext("all-reduce of " + request.job + "/" + request.tensor_key + " (" + step + ")");
  return spent ? gateway::Reply(request.type, failed) : Refused(request.type, failed);
}

Message AllReduceService::Reply(const Message& request, const Admission& a, const TensorCodec& tc,
                                Operation& op, const collective::AllReduceStats& stats,
                                Message reply) {
  ++counters_.ok;
  counters_.bytes_sent += stats.bytes_sent;
  counters_.bytes_received += stats.bytes_received;
  counters_.encode_ns += stats.encode_ns;
  counters_.reduce_ns += stats.reduce_ns;
  counters_.decode_ns += stats.decode_ns;
  counters_.wait_ns += stats.wait_ns;
  counters_.ack_wait_ns += stats.ack_wait_ns;
  counters_.handle_ns += MonotonicNanos() - a.start_ns;
  if (!op.tiny_values.empty()) {
    CodecOptions o;
    o.codec = a.frame->codec;
    o.block_size = a.frame->block_size;
    Encoder encoder;
    if (Status e = encoder.Encode(op.tiny_values.data(), op.tiny_values.size(), DataType::kFloat32,
                                  o, &reply.data);
        !e.ok()) {
      return gateway::Reply(request.type, e.WithContext("encoding the result frame"));
    }
  }
  reply.text = tc.ToString();
  if (localproto::IsRegionAllReduce(request.type)) {
    // The split among the region's gateways (each all-reduces its shard across the regions),
    // e.g. "zstd region_shards=334,333,333".
    reply.text +=
        CountsText("region_shards", collective::RegionShards(op.req.count, g_.config.RegionSize()));
    return reply;
  }
  // Kept until the job's next step commits: what a rank whose gateway dies before it read this
  // reply gets back from the other regions (HandleFetch).
  g_.peer_control.results.Keep(
      GenerationKey(request.job, request.scope), request.generation, request.sequence,
      localproto::InSharedRegion(request.type) ? std::span<const uint8_t>(request.shm_data)
                                               : std::span<const uint8_t>(reply.data));
  // The shard split (elements per owner, in rank order), e.g. "int8 shards=400,300,300".
  if (auto plan =
          collective::MakePlan(collective::PlanFor(op.req, static_cast<int>(g_.world.size())));
      plan.ok()) {
    reply.text += CountsText("shards", plan->shards);
  }
  return reply;
}

}  // namespace strait::gateway

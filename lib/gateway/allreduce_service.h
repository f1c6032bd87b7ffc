// Internal to lib/gateway: straitd's all-reduce (kAllReduce, kAllReduceFrame, kRegionAllReduce)
// as a service of named stages, each a function with one input and one output:
//
//   Admit          request -> Admission (the job's local policy, frame header, deadline);
//                  refused here, the step is not used and the comm may issue it again.
//   ResolveCodecs  Admission -> TensorCodec, once: the regions' agreed policy (and, under
//                  `auto`, the per-link choice). Immutable from here on.
//   Prepare        codecs -> Operation: the collective request over the reply's buffer (in frame
//                  mode the rank's frame as input stage, or the tiny-tensor fp32 path).
//   Number         Operation -> op ids (numbering.h), measured shard weights, the generation's
//                  BeginOp and its announcement to the peers. From here on a failure spends the
//                  step in every region.
//   Run            the cross-region all-reduce and the peers' commit confirmation, or the
//                  hierarchical region all-reduce (region.cc).
//   Commit         ends the operation in the job's generation (a peer's other identity for the
//                  step is the error then).
//   Reply          metrics and counters, the tiny path's result frame, the committed result
//                  kept for result recovery, the reply text.
//
// Threads: Handle runs on the client connection's thread and blocks up to the request's
// deadline; any number run at once. The service's own state (error feedback, counters) is
// thread-safe; everything else it reaches through Gateway::Impl under that struct's locking.
#ifndef STRAIT_LIB_GATEWAY_ALLREDUCE_SERVICE_H_
#define STRAIT_LIB_GATEWAY_ALLREDUCE_SERVICE_H_

#include <atomic>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "collective/allreduce.h"
#include "common/clock.h"
#include "gateway/gateway.h"
#include "gateway/policy.h"
#include "localproto/protocol.h"
#include "strait/codec.h"
#include "strait/status.h"

namespace strait::gateway {

// Where successful all-reduces spent their time (collective::AllReduceStats, summed; the wall
// time of the cross-region operation itself) and what they carried, for the stats request and
// `strait-bench allreduce`.
struct AllReduceCounters {
  std::atomic<uint64_t> ok{0}, failed{0}, bytes_sent{0}, bytes_received{0};
  std::atomic<int64_t> handle_ns{0}, allreduce_ns{0}, encode_ns{0}, reduce_ns{0}, decode_ns{0},
      wait_ns{0}, ack_wait_ns{0};
};

class AllReduceService {
 public:
  explicit AllReduceService(Gateway::Impl& gateway) : g_(gateway) {}
  AllReduceService(const AllReduceService&) = delete;
  AllReduceService& operator=(const AllReduceService&) = delete;

  // Runs the stages for `request`, taking its data (the reply carries the result in the same
  // buffer). Blocks up to the request's deadline.
  localproto::Message Handle(localproto::Message& request);

  const AllReduceCounters& counters() const { return counters_; }

 private:
  // Admit's output: what the later stages need from the request's admission.
  struct Admission {
    int64_t start_ns = 0;
    JobPolicy policy;                // this gateway's registered policy for the job
    std::optional<FrameInfo> frame;  // kAllReduceFrame: the rank's frame's header
    Deadline deadline;
  };
  // The operation as Prepare and Number build it. `req` points into the reply's buffer and
  // into `input_frame` / `tiny_values`, so an Operation lives until the reply is sent.
  struct Operation {
    collective::AllReduceRequest req;
    std::vector<uint8_t> input_frame;  // frame mode: the rank's frame
    std::vector<float> tiny_values;    // frame mode with fewer blocks than regions
    std::string identity;              // IdentityText (+ weights), announced to the peers
    uint64_t region_op_id = 0;         // kRegionAllReduce: pairs the region's gateways
    bool began = false;                // registered with Generations (EndOp pending)
  };

  // Each returns an error for the reply (counted and logged where it arises).
  StatusOr<Admission> Admit(localproto::Message& request);
  StatusOr<TensorCodec> ResolveCodecs(const localproto::Message& request, const Admission& a);
  Status Prepare(const localproto::Message& request, const Admission& a, const TensorCodec& tc,
                 localproto::Message& reply, Operation* op);
  Status Number(const localproto::Message& request, const Admission& a, Operation* op);
  // The op id the operation runs under on the cross-region transport (Number's output).
  uint64_t TransportOpId(const localproto::Message& request, const std::string& identity,
                         uint64_t word) const;
  Status Weigh(const localproto::Message& request, uint64_t word, Operation* op);
  Status Begin(const localproto::Message& request, Operation* op);
  Status Run(const localproto::Message& request, Operation* op, collective::AllReduceStats* stats);
  Status Commit(const Operation& op, Status run);
  localproto::Message Reply(const localproto::Message& request, const Admission& a,
                            const TensorCodec& tc, Operation& op,
                            const collective::AllReduceStats& stats, localproto::Message reply);
  localproto::Message Failed(const localproto::Message& request, const Status& s, bool spent);

  Gateway::Impl& g_;
  AllReduceCounters counters_;
  // The error-feedback residuals of lossy codecs, by (job, tensor key); thread-safe.
  ErrorFeedbackStore feedback_;
};

}  // namespace strait::gateway

#endif  // STRAIT_LIB_GATEWAY_ALLREDUCE_SERVICE_H_

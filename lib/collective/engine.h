// Internal to strait::collective: what the mesh and ring algorithms share. The per-operation
// context (request, plan, residuals, first error, send accounting), per-thread codec state, and
// the chunk-level steps: encode an input, accumulate a frame, add this rank's own input, encode a
// partial or a final result, decode a result into the caller's buffer.
#ifndef STRAIT_LIB_COLLECTIVE_ENGINE_H_
#define STRAIT_LIB_COLLECTIVE_ENGINE_H_

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <vector>

#include "collective/allreduce.h"
#include "collective/plan.h"
#include "collective/transport.h"
#include "strait/codec.h"

namespace strait::collective::internal {

// Counts sends in flight and keeps the first failure. Shared with the completion callbacks,
// which may run after the operation returned (on a transport's I/O thread).
class SendTracker {
 public:
  SendDone Track();
  // Waits until every tracked send completed or the deadline passed.
  Status Wait(Deadline deadline);

 private:
  struct State {
    std::mutex mu;
    std::condition_variable cv;
    size_t pending = 0;
    Status first_error;
  };
  std::shared_ptr<State> state_ = std::make_shared<State>();
};

struct OpContext {
  const AllReduceRequest* request = nullptr;
  Transport* transport = nullptr;
  Plan plan;
  int rank = 0;
  int world = 1;
  size_t elem = 4;          // bytes per element of request->dtype
  uint8_t* data = nullptr;  // request->data
  bool float_path = false;  // sum/avg of a float type: fp32 accumulation
  bool lossy = false;       // some frame may be lossy (codec or a per-link codec)
  ReduceOp exact_op = ReduceOp::kSum;  // the op of the exact path (avg reduces as sum)
  std::span<float> send_residual;      // empty: no error feedback
  std::span<float> own_residual;
  // request->input_stage (pre-encoded input: EncodeInput and AddOwnInput slice it).
  std::span<const uint8_t> input_stage;
  // Where DecodeResult copies each chunk's result stage (the payload of request->result_frame,
  // scales at 0, codes at result_codes_at), or null.
  uint8_t* result_stage = nullptr;
  size_t result_codes_at = 0;
  SendTracker sends;
  std::atomic<uint64_t> bytes_sent{0};
  std::atomic<uint64_t> bytes_received{0};
  // AllReduceStats' time split, added to by both threads (PhaseTimer).
  std::atomic<int64_t> encode_ns{0}, reduce_ns{0}, decode_ns{0}, wait_ns{0};
  // wait_ns split by the peer waited for (index = rank; sized `world` by AllReduce): what the
  // gateway's straggler detection reads (AllReduceStats::peer_wait_ns).
  std::unique_ptr<std::atomic<int64_t>[]> peer_wait_ns;
  // Per peer, how much later its frames arrived than the earliest other peer's frame of the same
  // chunk (AllReduceStats::peer_late_ns; sized like peer_wait_ns).
  std::unique_ptr<std::atomic<int64_t>[]> peer_late_ns;

  // Records the first failure and tells every thread of the operation to stop.
  void Fail(Status status);
  bool cancelled() const { return cancelled_.load(std::memory_order_acquire); }
  Status first_error() const;

 private:
  mutable std::mutex mu_;
  Status first_error_;
  std::atomic<bool> cancelled_{false};
};

// Adds the time from construction to destruction to `sum` (for AllReduceStats).
class PhaseTimer {
 public:
  explicit PhaseTimer(std::atomic<int64_t>& sum) noexcept : sum_(sum), start_(MonotonicNanos()) {}
  ~PhaseTimer() { sum_.fetch_add(MonotonicNanos() - start_, std::memory_order_relaxed); }
  PhaseTimer(const PhaseTimer&) = delete;
  PhaseTimer& operator=(const PhaseTimer&) = delete;

 private:
  std::atomic<int64_t>& sum_;
  int64_t start_;
};

// One thread's codec state and scratch buffers.
struct Worker {
  Encoder encoder;
  Decoder decoder;
  std::vector<float> floats;
  std::vector<uint8_t> bytes;
};

// Sends `frame` to `peer` under `tag`, counted by ctx.sends.
void SendFrame(OpContext& ctx, int peer, uint64_t tag, std::vector<uint8_t> frame);
// Receives the frame from `peer` under `tag`, waiting until the deadline or until the operation
// fails elsewhere (kCancelled). Errors say which phase and chunk was awaited.
// `arrived_ns`, when not null, receives when the frame arrived (Transport::RecvStamped).
Status RecvFrame(OpContext& ctx, int peer, uint64_t tag, const char* phase, const Chunk& chunk,
                 std::vector<uint8_t>* out, int64_t* arrived_ns = nullptr);
// Adds each remote peer's lateness among `arrivals` (rank -> arrival, 0 = not from a remote
// peer) to ctx.peer_late_ns: its arrival minus the earliest remote arrival of the set.
void AddLateness(OpContext& ctx, const std::vector<int64_t>& arrivals);

// Whether the request may make a lossy frame anywhere (codec or a per-link codec).
bool AnyLossy(const AllReduceRequest& request);
// The codec of this rank's input (or ring partial) frames to `peer`, and of its owner results to
// `peer` (see AllReduceRequest::send_codecs / result_codecs).
CodecId SendCodec(const OpContext& ctx, int peer);
CodecId ResultCodec(const OpContext& ctx, int peer);

// This rank's input for `chunk` as a frame of the request's dtype (sender residual applied), in
// the codec for rank `to`; with a pre-encoded input, the chunk's slice of the stage, wrapped.
Status EncodeInput(OpContext& ctx, Worker& w, const Chunk& chunk, int to,
                   std::vector<uint8_t>* out);
// acc (fp32 path: `facc`, chunk.count floats; exact path: `tacc`, chunk.count elements) =
// decoded frame when `first`, else acc op= decoded frame.
Status AccumulateFrame(OpContext& ctx, Worker& w, std::span<const uint8_t> frame,
                       const Chunk& chunk, bool first, float* facc, uint8_t* tacc);
// acc op= this rank's input for `chunk` (exactly; the ring's middle hops; a pre-encoded input
// is decoded from its slice).
Status AddOwnInput(OpContext& ctx, Worker& w, const Chunk& chunk, float* facc, uint8_t* tacc);
// A ring partial sum as a frame: fp32 (lossy codec with the sender residual, or lossless) on the
// fp32 path, the element type on the exact path.
Status EncodePartial(OpContext& ctx, Worker& w, const Chunk& chunk, int to, const float* facc,
                     const uint8_t* tacc, std::vector<uint8_t>* out);
// The owner's final frames for `chunk`, one per entry of `codecs` (avg divided here, once;
// owner residual applied to the lossy one, of which there is at most one). Modifies acc.
Status EncodeResults(OpContext& ctx, Worker& w, const Chunk& chunk, float* facc, uint8_t* tacc,
                     std::span<const CodecId> codecs, std::vector<std::vector<uint8_t>>* outs);
// EncodeResults for one codec.
Status EncodeResult(OpContext& ctx, Worker& w, const Chunk& chunk, float* facc, uint8_t* tacc,
                    CodecId codec, std::vector<uint8_t>* out);
// Decodes a final frame into the caller's buffer at the chunk's place (skipped when the request
// has no data), and copies its stage into ctx.result_stage when there is one.
Status DecodeResult(OpContext& ctx, Worker& w, std::span<const uint8_t> frame, const Chunk& chunk);

}  // namespace strait::collective::internal

#endif  // STRAIT_LIB_COLLECTIVE_ENGINE_H_

// The GPU backend: NCCL inside the region, the GPU quantizer and a worker thread that talks to
// straitd, all ordered on the caller's stream (see nccl_backend.h).
#include "api/nccl_backend.h"

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <exception>
#include <map>
#include <mutex>
#include <optional>
#include <span>
#include <thread>
#include <utility>
#include <vector>

#include "api/frame_policy.h"
#include "api/host_backend.h"
#include "collective/hierarchical.h"
#include "common/clock.h"
#include "cuda/quantize.h"
#include "cuda/stage_frame.h"
#include "localproto/client.h"
#include "strait/codec.h"

namespace strait::api {
namespace {

Status CudaError(cudaError_t err, const std::string& what) {
  if (err == cudaSuccess) return Status::Ok();
  return InternalError(what + " failed: " + cudaGetErrorString(err) +
                       " (check the device, the buffers and the stream)");
}

Status NcclError(ncclResult_t r, ncclComm_t comm, const std::string& what) {
  if (r == ncclSuccess || r == ncclInProgress) return Status::Ok();
  const char* last = ncclGetLastError(comm);
  return InternalError(what + " failed: " + ncclGetErrorString(r) +
                       (last != nullptr && last[0] != '\0' ? std::string(": ") + last : "") +
                       " (NCCL_DEBUG=WARN says more)");
}

// Makes `device` current for a scope and restores the caller's device after.
class DeviceScope {
 public:
  explicit DeviceScope(int device) {
    if (cudaGetDevice(&saved_) != cudaSuccess) saved_ = -1;
    if (saved_ != device) (void)cudaSetDevice(device);
  }
  ~DeviceScope() {
    int now = -1;
    if (saved_ >= 0 && cudaGetDevice(&now) == cudaSuccess && now != saved_) {
      (void)cudaSetDevice(saved_);
    }
  }
  DeviceScope(const DeviceScope&) = delete;
  DeviceScope& operator=(const DeviceScope&) = delete;

 private:
  int saved_ = -1;
};

// One tensor key's buffers, allocated at its first call (or when its count or dtype changes).
struct KeyState {
  size_t count = 0;
  DataType dtype = DataType::kFloat32;
  ReduceOp op = ReduceOp::kSum;  // decides the path with dtype
  size_t shard = 0;              // elements per rank: ceil(count / m)
  bool padded = false;           // m does not divide count
  bool lossy = false;            // the frame path
  CodecOptions options;          // lossy path
  size_t stage_bytes = 0;        // lossy path: all pieces' stages, back to back
  // The shard goes as pieces of at most kMaxCrossBytes raw bytes (one gateway request each,
  // keys suffixed ":part<k>" when there are several, as in the host backend).
  size_t piece = 0;                     // elements per piece (the last may be shorter)
  std::vector<size_t> stage_offsets;    // lossy path: piece k's stage at dev_stage/host + this
  std::vector<uint8_t> refused_pieces;  // lossy path: the gateway refused piece k's frame once
  void* dev_pad = nullptr;              // shard * m elements, when padded
  void* dev_shard = nullptr;
  float* dev_residual = nullptr;  // lossy path with error feedback
  uint8_t* dev_stage = nullptr;   // lossy path
  uint8_t* host = nullptr;        // pinned: the stage or raw shard, out and back
  size_t host_bytes = 0;

  void Free() {
    (void)cudaFree(dev_pad);
    (void)cudaFree(dev_shard);
    (void)cudaFree(dev_residual);
    (void)cudaFree(dev_stage);
    (void)cudaFreeHost(host);
    dev_pad = dev_shard = nullptr;
    dev_residual = nullptr;
    dev_stage = host = nullptr;
  }
};

}  // namespace

// One cross-region step handed from the stream to the worker.
struct Job {
  NcclComm::Impl* impl = nullptr;
  KeyState* key_state = nullptr;
  std::string key;  // the region shard key at the gateway (pieces add ":part<k>")
  ReduceOp op = ReduceOp::kSum;
  bool done = false;    // the worker finished it (under Impl::mu)
  bool orphan = false;  // no waiting host function was enqueued: the worker frees it
};

struct NcclComm::Impl {
  NcclCommOptions options;
  ncclComm_t nccl = nullptr;
  int rank = 0;
  int nranks = 1;
  int device = 0;
  std::string policy;
  std::optional<FramePolicy> frame_policy;
  std::unique_ptr<localproto::Client> client;  // used by the worker only after Create
  Encoder encoder;                          // worker only
  Decoder decoder;                          // worker only
  std::map<std::string, KeyState> keys;     // under call_mu
  cudaEvent_t last = nullptr;               // the end of the previous call (under call_mu)
  std::mutex call_mu;                       // serialises AllReduce calls

  std::mutex mu;  // guards what follows
  std::condition_variable cv;
  std::deque<Job*> queue;
  size_t outstanding = 0;  // jobs submitted whose waiting host function has not finished
  bool stop = false;
  Status failed;
  std::thread worker;

  void Fail(Status s) {
    std::lock_guard<std::mutex> lock(mu);
    if (failed.ok()) failed = std::move(s);
  }

  // Host functions (CUDA's host-function thread; no CUDA calls allowed there).
  static void CUDART_CB Submit(void* arg) {
    auto* job = static_cast<Job*>(arg);
    Impl* impl = job->impl;
    {
      std::lock_guard<std::mutex> lock(impl->mu);
      impl->queue.push_back(job);
    }
    impl->cv.notify_all();
  }
  static void CUDART_CB Wait(void* arg) {
    auto* job = static_cast<Job*>(arg);
    Impl* impl = job->impl;
    {
      std::unique_lock<std::mutex> lock(impl->mu);
      impl->cv.wait(lock, [&] { return job->done; });
      --impl->outstanding;
    }
    impl->cv.notify_all();
    delete job;
  }

  void WorkerLoop() {
    std::unique_lock<std::mutex> lock(mu);
    for (;;) {
      cv.wait(lock, [&] { return stop || !queue.empty(); });
      if (queue.empty()) return;  // stop, nothing left
      Job* job = queue.front();
      queue.pop_front();
      const bool skip = !failed.ok();
      lock.unlock();
      Status s;
      try {  // the worker must not die: a stream would wait for it forever
        if (!skip) s = Run(*job);
      } catch (const std::exception& e) {
        s = InternalError(std::string("the cross-region step threw: ") + e.what());
      }
      lock.lock();
      if (!s.ok() && failed.ok()) {
        failed = s.WithContext("cross-region phase of shard " + std::to_string(rank) +
                               " of region " + options.region + " through " + options.gateway);
      }
      job->done = true;
      if (job->orphan) {
        --outstanding;
        delete job;
      }
      cv.notify_all();
    }
  }

  // The cross-region step of one job, on the worker thread, from and into ks.host.
  Status Run(Job& job) {
    KeyState& ks = *job.key_state;
    const Deadline deadline = Deadline::After(options.timeout_ns);
    const size_t pieces = ks.stage_offsets.size();
    for (size_t k = 0; k < pieces; ++k) {
      const size_t begin = k * ks.piece;
      const size_t n = std::min(ks.piece, ks.shard - begin);
      const std::string key = pieces == 1 ? job.key : job.key + ":part" + std::to_string(k);
      if (!ks.lossy) {
        STRAIT_RETURN_IF_ERROR(client->AllReduce(options.job, key, ks.dtype, job.op,
                                                 ks.host + begin * DataTypeSize(ks.dtype), n,
                                                 deadline));
        continue;
      }
      const size_t stage_bytes = cuda::LossyStageBytes(n, ks.options);
      uint8_t* const stage = ks.host + ks.stage_offsets[k];
      STRAIT_RETURN_IF_ERROR(RunPiece(ks, key, job.op, n, std::span<uint8_t>(stage, stage_bytes),
                                      &ks.refused_pieces[k], deadline));
    }
    return Status::Ok();
  }

  // One lossy piece: its stage (n elements) out as a frame, the result's stage back in place.
  Status RunPiece(const KeyState& ks, const std::string& key, ReduceOp op, size_t n,
                  std::span<uint8_t> stage, uint8_t* refused, Deadline deadline) {
    std::vector<uint8_t> frame(cuda::MaxWrappedFrameSize(n, ks.dtype, ks.options));
    auto size = cuda::WrapStage(stage, n, ks.dtype, ks.options, frame);
    STRAIT_RETURN_IF_ERROR(size.status());
    frame.resize(*size);
    std::vector<uint8_t> result;
    if (*refused == 0) {
      Status s = client->AllReduceFrame(options.job, key, op, frame, &result, deadline);
      if (s.code() == StatusCode::kFailedPrecondition) {
        *refused = 1;  // every region's gateway refuses alike, so every rank falls back
      } else {
        STRAIT_RETURN_IF_ERROR(s);
      }
    }
    if (*refused != 0) {
      // The GPU work after this step expects a stage: send what the frame holds raw (fp32) and
      // quantize the result on the CPU (round to nearest: the same bytes on every rank).
      std::vector<float> values(n);
      STRAIT_RETURN_IF_ERROR(decoder.Decode(frame, values.data(), n, DataType::kFloat32));
      STRAIT_RETURN_IF_ERROR(
          client->AllReduce(options.job, key, DataType::kFloat32, op, values.data(), n, deadline));
      CodecOptions o = ks.options;
      o.rounding = Rounding::kNearest;
      o.chain_zstd = false;
      STRAIT_RETURN_IF_ERROR(encoder.Encode(values.data(), n, DataType::kFloat32, o, &result));
    }
    auto out = cuda::StageOf(result);
    STRAIT_RETURN_IF_ERROR(out.status());
    if (out->size() != stage.size()) {
      return DataLossError("the gateway's result frame for " + key + " holds " +
                           std::to_string(out->size()) + " stage bytes, expected " +
                           std::to_string(stage.size()));
    }
    std::memcpy(stage.data(), out->data(), out->size());
    return Status::Ok();
  }

  // (Re)allocates ks for `count` elements of `dtype` with `op` (first use of the key, or a new
  // size, dtype or op).
  Status Prepare(KeyState& ks, size_t count, DataType dtype, ReduceOp op) {
    if (ks.host != nullptr && ks.count == count && ks.dtype == dtype && ks.op == op) {
      return Status::Ok();
    }
    if (ks.host != nullptr) {
      // The previous call's work may still use the buffers.
      STRAIT_RETURN_IF_ERROR(CudaError(cudaEventSynchronize(last), "cudaEventSynchronize"));
      ks.Free();
    }
    const size_t elem = DataTypeSize(dtype);
    const auto m = static_cast<size_t>(nranks);
    ks.count = count;
    ks.dtype = dtype;
    ks.op = op;
    ks.shard = (count + m - 1) / m;
    ks.padded = ks.shard * m != count;
    ks.lossy = frame_policy.has_value() && IsLossyCodableType(dtype) &&
               (op == ReduceOp::kSum || op == ReduceOp::kAvg);
    ks.options = CodecOptions{};
    ks.stage_bytes = 0;
    // Piece boundaries are multiples of every block size (kMaxCrossBytes / 8 is a power of two
    // far above kMaxBlockSize), so the pieces' blocks are the whole shard's.
    ks.piece = std::max<size_t>(1, kMaxCrossBytes / elem);
    const size_t pieces = (ks.shard + ks.piece - 1) / ks.piece;
    ks.stage_offsets.assign(pieces, 0);
    ks.refused_pieces.assign(pieces, 0);
    if (ks.lossy) {
      ks.options.codec = frame_policy->codec;  // the default block size, round to nearest
      for (size_t k = 0; k < pieces; ++k) {
        ks.stage_offsets[k] = ks.stage_bytes;
        ks.stage_bytes +=
            cuda::LossyStageBytes(std::min(ks.piece, ks.shard - k * ks.piece), ks.options);
      }
    }
    ks.host_bytes = std::max(ks.stage_bytes, ks.shard * elem);
    STRAIT_RETURN_IF_ERROR(CudaError(cudaMallocHost(&ks.host, ks.host_bytes), "cudaMallocHost"));
    STRAIT_RETURN_IF_ERROR(
        CudaError(cudaMalloc(&ks.dev_shard, ks.shard * elem), "cudaMalloc (shard)"));
    if (ks.padded) {
      STRAIT_RETURN_IF_ERROR(
          CudaError(cudaMalloc(&ks.dev_pad, ks.shard * m * elem), "cudaMalloc (padded tensor)"));
    }
    if (ks.lossy) {
      STRAIT_RETURN_IF_ERROR(
          CudaError(cudaMalloc(reinterpret_cast<void**>(&ks.dev_stage), ks.stage_bytes),
                    "cudaMalloc (stage)"));
      if (frame_policy->error_feedback) {
        STRAIT_RETURN_IF_ERROR(CudaError(
            cudaMalloc(reinterpret_cast<void**>(&ks.dev_residual), ks.shard * sizeof(float)),
            "cudaMalloc (residual)"));
        STRAIT_RETURN_IF_ERROR(CudaError(cudaMemset(ks.dev_residual, 0, ks.shard * sizeof(float)),
                                         "cudaMemset (residual)"));
      }
    }
    return Status::Ok();
  }
};

NcclComm::NcclComm(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

StatusOr<std::unique_ptr<NcclComm>> NcclComm::Create(const NcclCommOptions& options) {
  auto impl = std::make_unique<Impl>();
  impl->options = options;
  impl->nccl = options.nccl;
  STRAIT_RETURN_IF_ERROR(NcclError(ncclCommCount(impl->nccl, &impl->nranks), impl->nccl,
                                   "ncclCommCount on nccl_comm"));
  STRAIT_RETURN_IF_ERROR(NcclError(ncclCommUserRank(impl->nccl, &impl->rank), impl->nccl,
                                   "ncclCommUserRank on nccl_comm"));
  STRAIT_RETURN_IF_ERROR(NcclError(ncclCommCuDevice(impl->nccl, &impl->device), impl->nccl,
                                   "ncclCommCuDevice on nccl_comm"));
  const Deadline deadline = Deadline::After(options.timeout_ns);
  // Rank r of the region's NCCL comm all-reduces shard r at its straitd.
  STRAIT_ASSIGN_OR_RETURN(const uint32_t shard, ShardOf(-1, impl->rank, impl->nranks, "shard"));
  auto client = localproto::Client::Connect(options.gateway, deadline, "libstrait-nccl", shard);
  STRAIT_RETURN_IF_ERROR(
      client.status().WithContext("connecting to the gateway " + options.gateway));
  impl->client = std::move(client).value();
  auto policy = impl->client->RegisterJob(options.job, options.compression, deadline);
  STRAIT_RETURN_IF_ERROR(policy.status().WithContext("registering job " + options.job));
  impl->policy = *policy;
  impl->frame_policy = FramePolicyOf(impl->policy);
  // The comm's generation, agreed with every region (localproto/protocol.h, "Operation identity"):
  // its all-reduces are numbered within it, so no step of an earlier comm can pair with them.
  STRAIT_RETURN_IF_ERROR(impl->client->JoinJob(options.job, deadline)
                             .status()
                             .WithContext("joining job " + options.job + " with the other regions"));
  {
    DeviceScope scope(impl->device);
    STRAIT_RETURN_IF_ERROR(CudaError(cudaEventCreateWithFlags(&impl->last, cudaEventDisableTiming),
                                     "cudaEventCreate"));
  }
  Impl* raw = impl.get();
  impl->worker = std::thread([raw] { raw->WorkerLoop(); });
  return std::unique_ptr<NcclComm>(new NcclComm(std::move(impl)));
}

NcclComm::~NcclComm() {
  Impl& g = *impl_;
  const Deadline deadline = Deadline::After(g.options.timeout_ns);
  bool drained = false;
  {
    std::unique_lock<std::mutex> lock(g.mu);
    drained = g.cv.wait_for(
        lock, std::chrono::nanoseconds(std::max<int64_t>(0, deadline.RemainingNanos())),
        [&] { return g.outstanding == 0; });
  }
  // The GPU work after the last waiting host function (copies, dequantize, all-gather) still
  // uses the buffers: wait for it, by the same deadline.
  DeviceScope scope(g.device);
  while (drained && g.last != nullptr && cudaEventQuery(g.last) == cudaErrorNotReady) {
    if (deadline.RemainingNanos() <= 0) {
      drained = false;
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  if (!drained) {
    // Work still queued on a stream would run host functions on freed state: keep the state and
    // the worker (a leak beats a crash or a stream that never ends); the worker completes late
    // jobs without calling the gateway, so their streams finish.
    g.Fail(DeadlineExceededError("the comm was destroyed with all-reduces still outstanding"));
    g.worker.detach();
    (void)impl_.release();
    return;
  }
  {
    std::lock_guard<std::mutex> lock(g.mu);
    g.stop = true;
  }
  g.cv.notify_all();
  g.worker.join();
  for (auto& [key, ks] : g.keys) ks.Free();
  if (g.last != nullptr) (void)cudaEventDestroy(g.last);
}

Status NcclComm::Failure() {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->failed;
}

int NcclComm::rank() const {
  return impl_->rank;
}
int NcclComm::nranks() const {
  return impl_->nranks;
}
const std::string& NcclComm::policy() const {
  return impl_->policy;
}

Status NcclComm::AllReduce(const void* send, void* recv, size_t count, DataType dtype, ReduceOp op,
                           const std::string& tensor_key, CUstream_st* stream) {
  Impl& g = *impl_;
  std::lock_guard<std::mutex> call_lock(g.call_mu);
  if (Status failed = Failure(); !failed.ok()) {
    return FailedPreconditionError("an earlier all-reduce on this comm failed: " +
                                   failed.message());
  }
  if (count == 0) return Status::Ok();
  DeviceScope scope(g.device);
  const std::string key = collective::RegionShardKey(tensor_key, g.rank, g.nranks);
  KeyState& ks = g.keys[key];
  Status status = [&]() -> Status {
    STRAIT_RETURN_IF_ERROR(g.Prepare(ks, count, dtype, op));
    const size_t elem = DataTypeSize(dtype);
    const auto m = static_cast<size_t>(g.nranks);
    const auto nccl_type = static_cast<ncclDataType_t>(static_cast<int>(dtype));
    const auto nccl_op = static_cast<ncclRedOp_t>(static_cast<int>(op));
    cudaStream_t s = stream;
    STRAIT_RETURN_IF_ERROR(
        CudaError(cudaStreamWaitEvent(s, g.last, 0), "cudaStreamWaitEvent (previous call)"));
    // 1. Reduce-scatter in the region.
    const void* rs_in = send;
    if (ks.padded) {
      auto* pad = static_cast<uint8_t*>(ks.dev_pad);
      STRAIT_RETURN_IF_ERROR(CudaError(
          cudaMemcpyAsync(pad, send, count * elem, cudaMemcpyDeviceToDevice, s), "copy to pad"));
      STRAIT_RETURN_IF_ERROR(CudaError(
          cudaMemsetAsync(pad + count * elem, 0, (ks.shard * m - count) * elem, s), "pad"));
      rs_in = pad;
    }
    STRAIT_RETURN_IF_ERROR(
        NcclError(ncclReduceScatter(rs_in, ks.dev_shard, ks.shard, nccl_type, nccl_op, g.nccl, s),
                  g.nccl, "ncclReduceScatter"));
    // 2. Quantize (lossy) and copy out; the worker does the gateway step.
    if (ks.lossy) {
      for (size_t k = 0; k < ks.stage_offsets.size(); ++k) {
        const size_t begin = k * ks.piece;
        const size_t n = std::min(ks.piece, ks.shard - begin);
        STRAIT_RETURN_IF_ERROR(cuda::QuantizeAsync(
            static_cast<const uint8_t*>(ks.dev_shard) + begin * elem, dtype, n, ks.options,
            ks.dev_residual != nullptr ? ks.dev_residual + begin : nullptr,
            ks.dev_stage + ks.stage_offsets[k], cuda::LossyStageBytes(n, ks.options), s));
      }
      STRAIT_RETURN_IF_ERROR(CudaError(
          cudaMemcpyAsync(ks.host, ks.dev_stage, ks.stage_bytes, cudaMemcpyDeviceToHost, s),
          "cudaMemcpyAsync (stage to host)"));
    } else {
      STRAIT_RETURN_IF_ERROR(CudaError(
          cudaMemcpyAsync(ks.host, ks.dev_shard, ks.shard * elem, cudaMemcpyDeviceToHost, s),
          "cudaMemcpyAsync (shard to host)"));
    }
    auto* job = new Job{&g, &ks, key, op};
    if (Status e = CudaError(cudaLaunchHostFunc(s, &Impl::Submit, job), "cudaLaunchHostFunc");
        !e.ok()) {
      delete job;
      return e;
    }
    {
      std::lock_guard<std::mutex> lock(g.mu);
      ++g.outstanding;
    }
    if (Status e = CudaError(cudaLaunchHostFunc(s, &Impl::Wait, job), "cudaLaunchHostFunc");
        !e.ok()) {
      std::lock_guard<std::mutex> lock(g.mu);
      if (job->done) {
        --g.outstanding;
        delete job;
      } else {
        job->orphan = true;
      }
      return e;
    }
    // 3. Back to the device, dequantize, all-gather in the region.
    if (ks.lossy) {
      STRAIT_RETURN_IF_ERROR(CudaError(
          cudaMemcpyAsync(ks.dev_stage, ks.host, ks.stage_bytes, cudaMemcpyHostToDevice, s),
          "cudaMemcpyAsync (result stage to device)"));
      for (size_t k = 0; k < ks.stage_offsets.size(); ++k) {
        const size_t begin = k * ks.piece;
        const size_t n = std::min(ks.piece, ks.shard - begin);
        STRAIT_RETURN_IF_ERROR(cuda::DequantizeAsync(
            ks.dev_stage + ks.stage_offsets[k], ks.options.codec, ks.options.block_size, n,
            static_cast<uint8_t*>(ks.dev_shard) + begin * elem, dtype, s));
      }
    } else {
      STRAIT_RETURN_IF_ERROR(CudaError(
          cudaMemcpyAsync(ks.dev_shard, ks.host, ks.shard * elem, cudaMemcpyHostToDevice, s),
          "cudaMemcpyAsync (result to device)"));
    }
    void* ag_out = ks.padded ? ks.dev_pad : recv;
    STRAIT_RETURN_IF_ERROR(
        NcclError(ncclAllGather(ks.dev_shard, ag_out, ks.shard, nccl_type, g.nccl, s), g.nccl,
                  "ncclAllGather"));
    if (ks.padded) {
      STRAIT_RETURN_IF_ERROR(
          CudaError(cudaMemcpyAsync(recv, ks.dev_pad, count * elem, cudaMemcpyDeviceToDevice, s),
                    "cudaMemcpyAsync (result to recvbuf)"));
    }
    return CudaError(cudaEventRecord(g.last, s), "cudaEventRecord");
  }();
  if (!status.ok()) g.Fail(status);
  return status;
}

}  // namespace strait::api

// The GPU (NCCL) backend of library mode (strait.h: strait_comm_init_nccl): device buffers, a
// region-local NCCL communicator, and an all-reduce ordered on the caller's CUDA stream that never
// blocks the calling thread. Compiled only where STRAIT_HAVE_CUDA and nccl.h/libnccl are found
// (STRAIT_HAVE_NCCL_BACKEND); this header needs neither CUDA nor NCCL headers, so api.cc includes
// it in every build and creates an NcclComm only under that macro (and then uses it only through
// the Backend interface, backend.h).
//
// A region runs m ranks (the NCCL communicator's size, the same m in every region); rank r (its
// NCCL rank) talks to its own straitd, whose shard_index must be r. One all-reduce of `count`
// elements is enqueued on `stream` as:
//   1. Reduce-scatter in the region (ncclReduceScatter on the region communicator) into a device
//      shard of s = ceil(count / m) elements. When m does not divide count, `send` is first copied
//      into a padded device buffer of s*m elements (tail zeroed) -- simpler than NCCL's equal-shard
//      rule allows otherwise, and the padding never reaches `recv`; the last shard then carries up
//      to m-1 zero elements across the regions (every region alike). NCCL reduces in the element
//      type (bf16/fp16 sums are not widened to fp32 as in the host backend); avg is ncclAvg.
//   2. Cross-region, under a fixed lossy policy (int8/int4/fp8, sum or avg of fp32/bf16/fp16):
//      cuda::QuantizeAsync of the shard with the rank's error-feedback residual (on the GPU, per
//      tensor key) into a device stage, cudaMemcpyAsync of the stage into pinned host memory;
//      otherwise (lossless or auto policy, see frame_policy.h; other dtypes or ops)
//      cudaMemcpyAsync of the raw shard.
//      Then a host function (cudaLaunchHostFunc) hands the job to the comm's worker thread and
//      returns at once; the worker WrapStage()s the stage and calls Client::AllReduceFrame (or
//      Client::AllReduce on the raw shard in place), and StageOf()s the result frame into a pinned
//      result buffer. A second host function, enqueued right after, waits for the worker to
//      finish that job. This is the chosen way to make the stream wait without blocking the
//      caller: the waiting host function stalls only this stream's later work (and CUDA's
//      host-function thread, so other streams' host functions in this process queue behind it)
//      for as long as the gateway takes; the GPU keeps running other streams' kernels. The tensor
//      key at the gateway is collective::RegionShardKey(key, r, m), as in the host backend; a
//      shard beyond kMaxCrossBytes (host_backend.h) goes as several requests (quantized as
//      pieces on the boundaries of its blocks), keys suffixed ":part<k>", as there too.
//      A key whose frame the gateway refuses (kFailedPrecondition, e.g. below min_lossy_bytes)
//      is decoded by the worker, sent raw as fp32 with Client::AllReduce, and the result
//      re-quantized by the CPU encoder (round to nearest, the same bytes on every rank), so the
//      already-enqueued GPU work stays valid; the key is not offered as a frame again.
//   3. cudaMemcpyAsync of the result (stage or raw shard) back to the device, cuda::DequantizeAsync
//      into the shard in the element type (lossy path), and ncclAllGather in the region into
//      `recv` (or into the padded buffer, then copied to `recv`).
// Per-key state (the GPU residual, shard/padded/stage device buffers, pinned host buffers) is
// allocated at the first call with a key (or when its count changes) -- that first call
// allocates and synchronises the device (cudaMalloc); later calls with the key do not allocate.
// Successive calls are chained by an event, so that a call on another stream waits for the
// previous one (their buffers and the NCCL communicator's ordering require it).
//
// Errors: argument errors are returned before anything is enqueued. A failure of the worker
// (gateway error, deadline) or of an enqueue fails the comm: later calls return kFailedPrecondition
// (STRAIT_ERROR_COMM_FAILED) naming the first reason; the failed call's `recv` is unspecified.
// Because the worker runs after the call returned, a failure shows at the next call (or at
// destroy). The destructor waits for outstanding work up to the deadline (timeout_ns) and then
// frees everything; the NCCL communicator stays the caller's.
#ifndef STRAIT_LIB_API_NCCL_BACKEND_H_
#define STRAIT_LIB_API_NCCL_BACKEND_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "api/backend.h"
#include "strait/status.h"
#include "strait/types.h"

struct ncclComm;
struct CUstream_st;

namespace strait::api {

struct NcclCommOptions {
  ncclComm* nccl = nullptr;  // region-local, the caller's; must outlive the Strait comm
  std::string region;
  std::string gateway;  // straitd socket path
  std::string job;
  std::string compression;  // policy text ("" = the gateway's default)
  int64_t timeout_ns = int64_t{60'000'000'000};
};

class NcclComm final : public Backend {
 public:
  // Reads rank, size and device from the NCCL communicator, connects to the gateway, registers
  // the job and starts the worker thread. Blocks until done or the deadline.
  static StatusOr<std::unique_ptr<NcclComm>> Create(const NcclCommOptions& options);
  ~NcclComm() override;
  NcclComm(const NcclComm&) = delete;
  NcclComm& operator=(const NcclComm&) = delete;

  // Every all-reduce is ordered on the caller's stream (NULL: the legacy default stream).
  bool UsesStreams() const override { return true; }

  // Enqueues the all-reduce on `stream` (see the file comment) and returns. `send` may equal
  // `recv`; both are device memory of the communicator's device. count 0 enqueues nothing.
  Status AllReduce(const void* send, void* recv, size_t count, DataType dtype, ReduceOp op,
                   const std::string& tensor_key, CUstream_st* stream) override;

  // The first failure on this comm (OK while none). Thread-safe.
  Status Failure() override;

  int rank() const override;
  int nranks() const override;
  const std::string& policy() const override;

  struct Impl;

 private:
  explicit NcclComm(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace strait::api

#endif  // STRAIT_LIB_API_NCCL_BACKEND_H_

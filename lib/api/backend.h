// The one shape of a library-mode comm (strait.h's strait_comm_t), whatever runs it: the host
// backend (host_backend.h: CPU buffers, the calling thread) and the GPU backend (nccl_backend.h:
// device buffers, the caller's CUDA stream) both implement it, and the C boundary (api.cc) holds
// a comm as a std::unique_ptr<Backend> and calls it only through this interface -- which backend
// a comm has is decided once, by the strait_comm_init_* that created it.
//
// This header needs neither CUDA nor NCCL headers (a stream is only an opaque pointer here), so
// every build compiles it.
#ifndef STRAIT_LIB_API_BACKEND_H_
#define STRAIT_LIB_API_BACKEND_H_

#include <cstddef>
#include <cstdint>
#include <string>

#include "strait/status.h"
#include "strait/types.h"

struct CUstream_st;

namespace strait::api {

// The shard a rank names to its straitd (strait_host_config_t::shard; api.cc): `given` when >= 0,
// `rank` when the region has several ranks, else $STRAIT_SHARD, else none
// (localproto::kAnyShard). kInvalidArgument naming `what` or STRAIT_SHARD for a bad value.
StatusOr<uint32_t> ShardOf(int given, int rank, int nranks, const char* what);

class Backend {
 public:
  virtual ~Backend() = default;

  // Whether all-reduces are ordered on a caller's CUDA stream. A backend without streams runs
  // each all-reduce on the calling thread and refuses a non-NULL stream; api.cc asks first, so
  // that a stream passed to a host comm is reported as that argument error before any other.
  virtual bool UsesStreams() const = 0;

  // All-reduces `count` elements of `dtype` from `send` into `recv` (which may equal `send`)
  // across every rank of every region, under `tensor_key` at the gateway. The arguments are
  // checked by the caller (api.cc) except what only the backend knows. Whether it blocks until
  // the result is in `recv` or only until the work is enqueued on `stream` is the backend's
  // (see its header); either way a failure fails the comm: later calls return
  // kFailedPrecondition naming the first reason. Thread-safe (calls are serialised).
  virtual Status AllReduce(const void* send, void* recv, size_t count, DataType dtype, ReduceOp op,
                           const std::string& tensor_key, CUstream_st* stream) = 0;

  // The first failure on this comm (OK while none). Thread-safe; does not block on all-reduces.
  virtual Status Failure() = 0;

  // This rank's index in its region and the region's number of ranks.
  virtual int rank() const = 0;
  virtual int nranks() const = 0;
  // The policy the gateway resolved for the job (see frame_policy.h), e.g. "int8+ef (...)".
  virtual const std::string& policy() const = 0;
};

}  // namespace strait::api

#endif  // STRAIT_LIB_API_BACKEND_H_

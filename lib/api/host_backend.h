// The host backend of library mode (strait.h): one comm per rank process, CPU buffers.
//
// A region runs m ranks (the same m in every region); rank r's local straitd holds shard index
// r. An all-reduce of `count` elements runs three phases on every rank:
//   1. Intra-region reduce-scatter over the region's links (net::Endpoint links, plain TCP, one
//      collective::NetTransport): the tensor is cut into m shards as evenly as possible
//      (collective::RegionShards: the first count % m shards get one element more); every rank
//      sends its part of shard j to rank j, raw; rank r reduces shard r over ranks 0..m-1 in that
//      fixed order: in fp32 for sum/avg of float32/bfloat16/float16 (rounded once to the element
//      type; avg divides by m first), exactly in the element type otherwise.
//   2. Cross-region: rank r all-reduces its shard through its straitd (localproto::Client) under
//      the job's policy. Under a fixed lossy policy (frame_policy.h) the rank quantizes its
//      shard itself (codec library, its own error-feedback residual per key) and sends it with
//      kAllReduceFrame, the pipeline the GPU backend runs; a key the gateway refuses that way
//      (kFailedPrecondition: e.g. below min_lossy_bytes) goes raw with kAllReduce from then on.
//      Either way the tensor key is collective::RegionShardKey(key, r, m) (the key the CollNet
//      region all-reduce uses, so that error-feedback residuals are per shard). A shard beyond
//      kMaxCrossBytes goes as several requests, keys suffixed ":part<k>". Empty shards
//      (count < m) skip this phase on every rank alike. The gateway's result is bit-identical in
//      every region.
//   3. Intra-region all-gather: rank r sends its finished shard, raw, to every other rank.
// avg of a non-float type: phase 1 sums, the gateway averages over regions, and phase 3 divides
// by m first (integers truncate twice, which equals truncating once: trunc(trunc(x/n)/m) =
// trunc(x/(n m))).
//
// Phases 1 and 3 are the gateways' region phases (collective::RegionReduceScatter and
// collective::RegionAllGather over a collective::RegionPlan with chunks of kRegionChunkBytes),
// so their messages are the ones collective/hierarchical.h documents: a 16-byte header (version
// kHierarchicalVersion, kind 0 = part / 1 = result, dtype, op, the whole tensor's count) and
// the chunk's elements, raw (never kind 2: the gateway returns this rank's shard decoded). They travel only between the ranks of one comm (this backend
// on every rank; no gateway reads them). A message whose dtype, op or count differ from this
// rank's call fails the operation with kFailedPrecondition naming both (the ranks did not issue
// the same all-reduces).
//
// Failure: every wait ends by the operation's deadline; a rank that fails aborts the operation
// on the region transport (its peers stop at once, naming it). A failed operation fails the
// comm: later calls return kFailedPrecondition with the first reason (the ranks' numbering of
// operations may no longer agree). Threads: calls are serialised by a mutex; each blocks the
// calling thread until done. Links and the gateway connection live as long as the comm.
#ifndef STRAIT_LIB_API_HOST_BACKEND_H_
#define STRAIT_LIB_API_HOST_BACKEND_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "api/backend.h"
#include "common/clock.h"
#include "strait/status.h"
#include "strait/types.h"

namespace strait::api {

// Phase 2 sends a shard in requests of at most this many bytes (the local protocol's frames are
// limited to 256 MiB).
inline constexpr size_t kMaxCrossBytes = size_t{64} << 20;
// Elements per intra-region chunk: chunks of about this many bytes pipeline the LAN phases.
inline constexpr size_t kRegionChunkBytes = size_t{4} << 20;

struct HostCommOptions {
  std::string region;
  int rank = 0;
  int nranks = 1;
  std::string root_host;  // numeric
  uint16_t root_port = 0;
  std::string gateway;  // straitd socket path
  std::string job;
  std::string compression;  // policy text ("" = the gateway's default)
  int64_t timeout_ns = int64_t{60'000'000'000};
  // The shard named to the straitd (localproto::kAnyShard: none; see strait_host_config_t).
  uint32_t shard = 0xFFFFFFFFu;
  // Tensors of 64 KiB and more move through a region shared with straitd (localproto/shm.h)
  // rather than the socket; STRAIT_LOCAL_SHM=0 turns it off.
  bool shared_memory = true;
};

class HostComm final : public Backend {
 public:
  // Connects to the gateway and registers the job, runs the region rendezvous and brings up the
  // links to every other rank. Blocks until done or options.timeout_ns passed.
  static StatusOr<std::unique_ptr<HostComm>> Create(const HostCommOptions& options);
  ~HostComm() override;
  HostComm(const HostComm&) = delete;
  HostComm& operator=(const HostComm&) = delete;

  // No streams: every all-reduce runs on the calling thread.
  bool UsesStreams() const override { return false; }

  // See the file comment. `send` may equal `recv`; count 0 returns at once. `tensor_key` names
  // the tensor at the gateway. `stream` must be NULL (kInvalidArgument otherwise). Blocks until
  // the result is in `recv`; thread-safe (serialised).
  Status AllReduce(const void* send, void* recv, size_t count, DataType dtype, ReduceOp op,
                   const std::string& tensor_key, CUstream_st* stream) override;

  // The first failure of an all-reduce on this comm (OK while none failed). Thread-safe.
  Status Failure() override;

  int rank() const override { return options_.rank; }
  int nranks() const override { return options_.nranks; }
  // The policy the gateway resolved for the job, e.g. "int8+ef (...)".
  const std::string& policy() const override { return policy_; }

  struct Impl;

 private:
  explicit HostComm(HostCommOptions options);
  Status RunAllReduce(uint8_t* data, size_t count, DataType dtype, ReduceOp op,
                      const std::string& tensor_key);
  // The gateway went away during this rank's cross-region step (`failure`): reconnects (its
  // restart may take a while; until `deadline`) and asks it for the step's committed result,
  // which it gets from the other regions (kFetchResult; a step the regions committed). Returns
  // that reply data, or the step's failure. The comm is failed after the call either way.
  StatusOr<std::vector<uint8_t>> RecoverStep(const Status& failure, Deadline deadline);

  const HostCommOptions options_;
  std::string policy_;
  std::unique_ptr<Impl> impl_;
  std::mutex mu_;
  uint64_t next_op_ = 1;
  Status failed_;  // the first failure; set once
  bool recovered_ = false;  // RecoverStep ran: this comm's generation is over
};

}  // namespace strait::api

#endif  // STRAIT_LIB_API_HOST_BACKEND_H_

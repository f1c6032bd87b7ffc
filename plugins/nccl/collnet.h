// CollNet: the plugin's hierarchical all-reduce (NCCL_COLLNET_ENABLE=1). NCCL reduces inside each
// node, hands every node head's data to iallreduce, and the plugin runs it through the node's own
// straitd as a region all-reduce (local protocol kRegionAllReduce, gateway.h "Region
// all-reduce"): the region's gateways reduce-scatter over the LAN, all-reduce their shards across
// regions with the job's codec, and all-gather, so every node head of every region gets the same
// bytes.
//
// How NCCL's calls map onto straitd:
//   listen   reads STRAIT_GATEWAY, STRAIT_JOB_ID and STRAIT_COMPRESSION, asks the local straitd
//            (one short round trip) which region and shard index it serves and registers the job
//            with its policy (CollNetPolicy: error feedback off where it may go lossy); the
//            128-byte handle carries that (see CollNetHandle).
//   connect  (a blocking collective of every node head) checks that the heads form a valid
//            group from the handles alone: one job, one compression policy, every region with
//            the same number m of heads, each on its own straitd with shard indices 0..m-1.
//            Every head decides the same from the same handles. It then derives the comm id from
//            the handles' nonces and runs a one-element region all-reduce as a barrier that
//            proves the whole path (every gateway up, linked, and the job registered everywhere)
//            before NCCL commits to CollNet. Any error: no comm, NCCL falls back.
//   iallreduce  the k-th call of a comm becomes a region all-reduce with tensor key
//            "collnet/<comm id>/<k mod kSlots>" on slot k mod kSlots: one Unix connection per
//            slot, driven by the plugin's one libuv loop (collnet_pipe.h; no thread per slot or
//            per comm), operations of a slot in posting order. straitd numbers a
//            key's operations 0, 1, 2, ... (numbering.h), so operation k is number k / kSlots of
//            its key on every gateway: matched by posting order without any extra message, with
//            a bounded number of keys per comm, and kSlots operations in flight at the gateway.
//            Tensors larger than kPieceBytes go as several region all-reduces on the same slot.
//   test     polls the request (an atomic the loop sets); never blocks.
//
// Numerics are straitd's (collective/hierarchical.h): every (type, op) of NCCL's 12 types and
// sum/prod/max/min is reduced; lossless policies exactly (sum of fp types in fp32, rounded once
// per level), lossy policies (int8/int4/fp8) only ever apply to sum of float32/bfloat16/float16,
// every other pair stays lossless. Avg is refused (reduceSupport 0): straitd would divide by the
// number of node heads, NCCL by the number of ranks; NCCL sends Avg as Sum anyway.
//
// Failure: an operation that fails (gateway gone, deadline, a peer region's abort) fails its
// request with straitd's reason, and every later operation of that comm fails with the same
// reason (straitd's numbering has moved on; NCCL aborts the communicator anyway).
//
// Threading: every function may be called from any thread; only listen (one round trip) and
// connect (a collective) wait, for the loop, bounded by their deadlines. Ownership: comms and requests handed
// to NCCL stay owned by the plugin; a request is released by the test() that reports it done (or
// failed); closeColl releases the comm and any request NCCL has not tested.
#ifndef STRAIT_PLUGINS_NCCL_COLLNET_H_
#define STRAIT_PLUGINS_NCCL_COLLNET_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "plugins/nccl/nccl_net.h"
#include "strait/status.h"

namespace strait::nccl {

inline constexpr int kCollNetSlots = 8;         // region all-reduces in flight per comm
inline constexpr int kCollNetMaxRequests = 64;  // iallreduce requests outstanding per comm
// One region all-reduce carries at most this much; larger tensors go as several on one slot.
// NCCL's CollNet chunks are a few MiB at most; the bound keeps a frame far below the local
// protocol's 256 MiB cap (a gateway may configure less) and a gateway's memory per operation small.
inline constexpr size_t kCollNetPieceBytes = 16u << 20;

// CollNet listen handle, wire version 2 (little-endian, 128 bytes, never renumbered):
//   0 u32 magic "STCN" · 4 u16 version · 6 u8 region length · 7 u8 policy length ·
//   8 u64 nonce · 16 u32 gateway shard index · 20 u32 zero · 24 u64 FNV-1a of STRAIT_JOB_ID ·
//   32 [64] the gateway's region (NUL padded) · 96 [28] the compression policy CollNet registers,
//   as its canonical text (localproto/policy_grammar.h, NUL padded) · 124 u32 FNV-1a checksum of
//   bytes 0-123.
// Version 1 carried the policy as a code of its own (auto 0, none 1, zstd 2, int8 3, int4 4,
// fp8 5); version 2 carries the grammar's text, so that every policy the gateway accepts (zstd:3,
// auto:int8, ...) works in CollNet too, with no codec numbering but strait::CodecId's. A version-1
// handle is refused, naming both versions.
inline constexpr uint32_t kCollNetHandleMagic = 0x4E435453;  // "STCN"
inline constexpr uint16_t kCollNetHandleVersion = 2;
inline constexpr size_t kCollNetRegionMax = 63;  // bytes of a region name a handle carries
struct CollNetHandle {
  uint64_t nonce = 0;
  uint32_t shard = 0;
  uint64_t job_hash = 0;
  std::string policy = "auto";  // canonical policy text (CollNetPolicy), 1-27 bytes
  std::string region;           // 1-63 bytes
};
void EncodeCollNetHandle(const CollNetHandle& handle, void* out);  // writes 128 bytes
// kInvalidArgument naming the check that failed (magic, version, checksum, region, policy).
StatusOr<CollNetHandle> DecodeCollNetHandle(const void* in);

uint64_t CollNetJobHash(std::string_view job);
// The policy CollNet registers for a STRAIT_COMPRESSION value, as canonical text: the value with
// error feedback off wherever it may go lossy (a CollNet tensor key carries a different chunk each
// time, so an error-feedback residual would land on unrelated data). kInvalidArgument for a value
// the grammar refuses.
StatusOr<std::string> CollNetPolicy(std::string_view compression);

// What every node head derives from the same handles (rank order).
struct CollNetGroup {
  uint64_t comm_id = 0;  // a hash of every nonce in rank order
  int regions = 0;
  int heads_per_region = 0;
};
// kInvalidArgument with a message that names the heads at fault and what to set.
StatusOr<CollNetGroup> PlanCollNetGroup(const std::vector<CollNetHandle>& handles);

// Whether a CollNet listen comm or comm is open, or a listen/connect is under way: they use the
// plugin's loop, which the last finalize() must then leave running (Transport::Finalize).
bool CollNetInUse();

// True for the (type, op) pairs reduceSupport claims: every NCCL type with sum, prod, max, min.
bool CollNetReduceSupported(int dtype, int op);

// The C boundary of the CollNet tables (nccl_interface.cc adapts each version to these). Each
// validates its pointers, catches everything, WARNs errors through NCCL's logger and maps them
// with api::ToNcclResult. init, devices, getProperties and finalize are the net tables' (api.h).
namespace collnet {
ncclResult_t Listen(int dev, void* handle, void** listen_comm);
ncclResult_t Connect(void* handles[], int nranks, int rank, void* listen_comm, void** coll_comm);
ncclResult_t ReduceSupport(int dtype, int op, int* supported);
ncclResult_t RegMr(void* coll_comm, void* data, size_t size, int type, void** mhandle);
ncclResult_t DeregMr(void* coll_comm, void* mhandle);
ncclResult_t Iallreduce(void* coll_comm, void* send_data, void* recv_data, size_t count, int dtype,
                        int op, void** request);
// Host memory needs no flush: a request that is already done.
ncclResult_t Iflush(void* coll_comm, void** request);
ncclResult_t Test(void* request, int* done, int* size);
ncclResult_t CloseColl(void* coll_comm);
ncclResult_t CloseListen(void* listen_comm);
}  // namespace collnet

}  // namespace strait::nccl

#endif  // STRAIT_PLUGINS_NCCL_COLLNET_H_

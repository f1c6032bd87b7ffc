/* The Strait C API (library mode): a hierarchical all-reduce across regions that the caller runs
 * explicitly, instead of through the NCCL plugin. Plain C99; no C++, NCCL or CUDA header needed.
 * Link libstrait.so (CMake: strait::api), which exports only the strait_* functions below.
 *
 * Usage (host backend: CPU buffers, one process per rank, every rank of every region):
 *
 *   strait_host_config_t cfg;
 *   strait_host_config_init(&cfg);
 *   cfg.region = "us-east";            // this rank's region
 *   cfg.rank = rank; cfg.nranks = 2;   // within the region
 *   cfg.root_address = "10.0.0.1:29400";         // rank 0 of the region listens there
 *   cfg.gateway = "/run/strait/straitd.sock";    // this rank's straitd (shard_index = rank)
 *   cfg.job_id = "job-42"; cfg.compression = "int8";
 *   strait_comm_t comm;
 *   if (strait_comm_init_host(&comm, &cfg) != STRAIT_SUCCESS)
 *     fprintf(stderr, "strait: %s\n", strait_last_error());
 *   strait_allreduce(grad, grad, n, STRAIT_FLOAT32, STRAIT_SUM, comm, NULL);
 *   strait_comm_destroy(comm);
 *
 * What an all-reduce does (host backend): the region's ranks reduce-scatter the tensor among
 * themselves over the project's own TCP links (rank r ends with shard r, reduced in fixed rank
 * order: in fp32 for sum/avg of float32/bfloat16/float16, exactly in the element type
 * otherwise); rank r all-reduces its shard across the regions through its local straitd, whose
 * shard_index must be r (the gateway's job policy, codec and error feedback apply there); then
 * the region's ranks all-gather the shards. Every rank of every region ends with bit-identical
 * results, lossy codecs included. Every region must run the same number of ranks, and every
 * rank must issue the same all-reduces (count, dtype, op, tensor key) in the same order.
 *
 * Errors: every function returns a strait_result_t; on failure strait_last_error() says what is
 * wrong and what to do. Bad arguments (NULL pointers, unknown dtype or op, an unknown or
 * destroyed comm, a stream with the host backend, ...) are rejected before any work starts and
 * the message names the argument. No function throws, aborts or exits the process.
 *
 * Threads: a comm may be used from any thread, but by one at a time in the order every rank
 * agrees on (calls on one comm are serialised); different comms are independent. */
#ifndef STRAIT_STRAIT_H_
#define STRAIT_STRAIT_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The API level of this header; bumped when functions or fields are added. */
#define STRAIT_API_VERSION 1

/* C++ sees the enums below with their int underlying type spelled out (C99 cannot), so that a
 * value outside the list -- which C allows and the API rejects -- is not undefined behaviour in
 * the library. Same size and ABI either way. */
#ifdef __cplusplus
#define STRAIT_ENUM_INT : int
#else
#define STRAIT_ENUM_INT
#endif

/* Result codes. Values are explicit and never renumbered. */
typedef enum strait_result_t STRAIT_ENUM_INT {
  STRAIT_SUCCESS = 0,
  STRAIT_ERROR_INVALID_ARGUMENT = 1,   /* a bad argument; nothing was done */
  STRAIT_ERROR_UNSUPPORTED = 2,        /* not implemented in this build (e.g. the NCCL backend) */
  STRAIT_ERROR_UNAVAILABLE = 3,        /* a peer rank or the gateway is unreachable or gone */
  STRAIT_ERROR_TIMEOUT = 4,            /* the deadline (timeout_ms) passed */
  STRAIT_ERROR_ABORTED = 5,            /* another rank or region failed the operation */
  STRAIT_ERROR_MISMATCH = 6,           /* ranks or regions disagree (job, sizes, calls) */
  STRAIT_ERROR_PERMISSION_DENIED = 7,  /* the gateway refused this process or job */
  STRAIT_ERROR_DATA_LOSS = 8,          /* a corrupt or malformed message arrived */
  STRAIT_ERROR_RESOURCE_EXHAUSTED = 9, /* out of memory, or a gateway limit (size, queue) */
  STRAIT_ERROR_COMM_FAILED = 10,       /* an earlier operation on this comm failed: destroy it */
  STRAIT_ERROR_INTERNAL = 11           /* a bug in Strait: please report it with the message */
} strait_result_t;

/* Element types; values equal NCCL's ncclDataType_t. */
typedef enum strait_datatype_t STRAIT_ENUM_INT {
  STRAIT_INT8 = 0,
  STRAIT_UINT8 = 1,
  STRAIT_INT32 = 2,
  STRAIT_UINT32 = 3,
  STRAIT_INT64 = 4,
  STRAIT_UINT64 = 5,
  STRAIT_FLOAT16 = 6,
  STRAIT_FLOAT32 = 7,
  STRAIT_FLOAT64 = 8,
  STRAIT_BFLOAT16 = 9,
  STRAIT_FLOAT8_E4M3 = 10,
  STRAIT_FLOAT8_E5M2 = 11
} strait_datatype_t;

/* Reduction operations; values equal NCCL's ncclRedOp_t. */
typedef enum strait_redop_t STRAIT_ENUM_INT {
  STRAIT_SUM = 0,
  STRAIT_PROD = 1,
  STRAIT_MAX = 2,
  STRAIT_MIN = 3,
  STRAIT_AVG = 4
} strait_redop_t;

/* A communicator: opaque, created by strait_comm_init_*, freed by strait_comm_destroy. */
typedef struct strait_comm* strait_comm_t;

/* NCCL's and CUDA's handle types, declared here so that no NCCL or CUDA header is needed:
 * ncclComm_t is `struct ncclComm*` and cudaStream_t is `struct CUstream_st*`. */
struct ncclComm;
struct CUstream_st;

/* Host backend configuration. Always start from strait_host_config_init(), which sets
 * struct_size and the defaults, so that fields added later keep their defaults. */
typedef struct strait_host_config_t {
  size_t struct_size; /* sizeof(strait_host_config_t); set by strait_host_config_init */
  const char* region; /* this rank's region; NULL: $STRAIT_REGION */
  int rank;           /* 0..nranks-1 within the region */
  int nranks;         /* ranks in the region (the same in every region), >= 1 */
  /* "host:port" (numeric host, "[v6]:port" for IPv6) where rank 0 of the region listens for the
   * other ranks while the comm is created, like a TCP store / MASTER_ADDR:MASTER_PORT. Every
   * rank of the region passes the same address; rank 0 must be able to bind it. Not used (may
   * be NULL) when nranks is 1. */
  const char* root_address;
  const char* gateway; /* absolute path of this rank's straitd socket; NULL: $STRAIT_GATEWAY */
  const char* job_id;  /* the job's id at the gateways; NULL: $STRAIT_JOB_ID */
  /* The job's compression policy, as STRAIT_COMPRESSION: "auto", "none", "zstd[:level]",
   * "int8", "int4", "fp8", optionally followed by ",ef" or ",noef". NULL: $STRAIT_COMPRESSION,
   * and when that is unset too, "" (the gateway's default). The gateway clamps it to its
   * operator's limits. */
  const char* compression;
  /* Deadline in milliseconds for creating the comm (rendezvous, links, gateway) and for each
   * all-reduce. Default 60000. */
  int timeout_ms;
  /* The shard this rank all-reduces through its straitd (one straitd may serve several: its
   * config's `shards`). -1 (the default): rank when nranks > 1; with nranks 1, $STRAIT_SHARD
   * when set (a 1-rank comm per process, as the PyTorch hook makes, passes its rank in the
   * region), else none named: the straitd's only shard. */
  int shard;
} strait_host_config_t;

/* Fills *config with the defaults (rank 0, nranks 1, timeout 60 s, every string NULL).
 * STRAIT_ERROR_INVALID_ARGUMENT when config is NULL. Never blocks; thread-safe. */
strait_result_t strait_host_config_init(strait_host_config_t* config);

/* Creates a host-backend comm in *comm: every rank of the region calls it with the same
 * root_address, nranks and job_id. Blocks until every rank of the region joined, the links
 * among them are up and the gateway registered the job (or timeout_ms passed). On failure *comm
 * is left NULL. Thread-safe. */
strait_result_t strait_comm_init_host(strait_comm_t* comm, const strait_host_config_t* config);

/* The GPU backend: device buffers, the caller's CUDA stream and a region-local NCCL communicator.
 * `nccl_comm` holds this region's ranks only (every region the same number m); its rank r is this
 * rank's, and `gateway` must be the socket of the straitd whose shard_index is r. region, gateway,
 * job_id and compression mean what they mean in strait_host_config_t (NULL: $STRAIT_REGION,
 * $STRAIT_GATEWAY, $STRAIT_JOB_ID, $STRAIT_COMPRESSION); the deadline is 60 s. Blocks until the
 * gateway registered the job. nccl_comm stays the caller's: destroy it after the Strait comm.
 *
 * strait_allreduce on such a comm takes device pointers of nccl_comm's device and a stream (NULL:
 * the legacy default stream) and returns once the work is enqueued; the result is in recvbuf
 * when the stream gets there: ncclReduceScatter in the region (a count that m does not divide is
 * padded in a scratch copy), the GPU quantizer with the error-feedback residual on the GPU (a
 * fixed lossy policy, sum/avg of float32/bfloat16/float16; otherwise the raw shard), a copy to
 * pinned memory, the cross-region all-reduce by this comm's worker thread through straitd, a
 * copy back, dequantize, ncclAllGather in the region. A host function waits on the stream for
 * the worker: while the gateway works, only that stream's later work waits (and CUDA's host
 * functions of the process queue behind it); the calling thread never blocks. The first call
 * with a tensor key (or a new count or dtype for it) allocates device and pinned buffers, which
 * synchronises the device; later calls do not allocate. Every rank of every region must issue
 * the same all-reduces in the same order, as with NCCL itself. A failure in the cross-region
 * step shows at the next call (STRAIT_ERROR_COMM_FAILED, the last error says why); recvbuf of
 * the failed all-reduce is unspecified. strait_comm_destroy waits (up to the deadline) for the
 * comm's outstanding work.
 *
 * Returns STRAIT_ERROR_UNSUPPORTED, *comm NULL, in a library built without CUDA and NCCL (the
 * last error says so; such a build needs neither at run time). A library built with them links
 * the CUDA runtime statically and libnccl.so.2 dynamically. */
strait_result_t strait_comm_init_nccl(strait_comm_t* comm, struct ncclComm* nccl_comm,
                                      const char* region, const char* gateway, const char* job_id,
                                      const char* compression);

/* All-reduces `count` elements of `dtype` from `sendbuf` into `recvbuf` with `op` across every
 * rank of every region. sendbuf == recvbuf works in place; otherwise the buffers must not
 * overlap. count 0 does nothing (the buffers may then be NULL). The tensor key is derived from
 * dtype and count, so error-feedback residuals (a lossy policy with ",ef") are shared by tensors
 * of the same dtype and count: use strait_allreduce_keyed to keep them apart.
 * Host backend: `stream` must be NULL; the call blocks the calling thread until the result is
 * in recvbuf or the deadline passed. On failure recvbuf's contents are unspecified and the comm
 * is failed (later calls return STRAIT_ERROR_COMM_FAILED): destroy it and create a new one. */
strait_result_t strait_allreduce(const void* sendbuf, void* recvbuf, size_t count,
                                 strait_datatype_t dtype, strait_redop_t op, strait_comm_t comm,
                                 struct CUstream_st* stream);

/* strait_allreduce with an explicit tensor key (1-200 bytes, e.g. "layer3.weight.grad"): the
 * gateway keeps error-feedback residuals per (job, tensor key). */
strait_result_t strait_allreduce_keyed(const void* sendbuf, void* recvbuf, size_t count,
                                       strait_datatype_t dtype, strait_redop_t op,
                                       const char* tensor_key, strait_comm_t comm,
                                       struct CUstream_st* stream);

/* This comm's rank within its region and the region's number of ranks. */
strait_result_t strait_comm_rank(strait_comm_t comm, int* rank, int* nranks);

/* Frees the comm and closes its links and gateway connection. Every rank should destroy its comm
 * after its last all-reduce. Blocks briefly (outstanding sends get at most about a second to be
 * acknowledged). `comm` must not be used afterwards. */
strait_result_t strait_comm_destroy(strait_comm_t comm);

/* The library's version (e.g. 0.1.0); any pointer may be NULL to skip it, but not all three. */
strait_result_t strait_version(int* major, int* minor, int* patch);

/* The message of the last failed call on this thread ("" when none failed yet). The string stays
 * valid until the next strait_* call on this thread. Never NULL; never fails. */
const char* strait_last_error(void);

/* A short name for a result code, e.g. "STRAIT_ERROR_TIMEOUT"; "unknown" for other values. */
const char* strait_result_string(strait_result_t result);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* STRAIT_STRAIT_H_ */

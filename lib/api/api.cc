// The C API's one boundary (strait.h): every exported function checks its arguments, runs the
// C++ code inside a catch-all, and maps a Status to a strait_result_t through ResultOf (the only
// mapping). Comm handles are checked against a registry of live comms before they are used, so
// that a destroyed, foreign or garbage handle is an error, not a crash.
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <memory>
#include <mutex>
#include <new>
#include <optional>
#include <set>
#include <string>

#include "api/backend.h"
#include "api/host_backend.h"
#include "api/nccl_backend.h"
#include "common/strings.h"
#include "gateway/config.h"
#include "localproto/policy_grammar.h"
#include "localproto/protocol.h"
#include "strait/status.h"
#include "strait/strait.h"
#include "strait/types.h"

#define STRAIT_API_EXPORT extern "C" __attribute__((visibility("default")))

// The comm behind a strait_comm_t: its backend, whichever strait_comm_init_* chose (backend.h).
struct strait_comm {
  std::unique_ptr<strait::api::Backend> backend;
};

namespace strait::api {

namespace {

constexpr size_t kMaxTensorKeyBytes = 200;

thread_local std::string t_last_error;

std::mutex g_comms_mu;
std::set<const strait_comm*>& LiveComms() {
  static auto* comms = new std::set<const strait_comm*>();  // never destroyed: used at exit
  return *comms;
}

// The one mapping from Status codes to C result codes.
strait_result_t ResultOf(StatusCode code) {
  switch (code) {
    case StatusCode::kOk: return STRAIT_SUCCESS;
    case StatusCode::kInvalidArgument:
    case StatusCode::kOutOfRange: return STRAIT_ERROR_INVALID_ARGUMENT;
    case StatusCode::kUnimplemented: return STRAIT_ERROR_UNSUPPORTED;
    case StatusCode::kUnavailable:
    case StatusCode::kNotFound:
    case StatusCode::kCancelled: return STRAIT_ERROR_UNAVAILABLE;
    case StatusCode::kDeadlineExceeded: return STRAIT_ERROR_TIMEOUT;
    case StatusCode::kAborted: return STRAIT_ERROR_ABORTED;
    case StatusCode::kFailedPrecondition:
    case StatusCode::kAlreadyExists: return STRAIT_ERROR_MISMATCH;
    case StatusCode::kPermissionDenied: return STRAIT_ERROR_PERMISSION_DENIED;
    case StatusCode::kDataLoss: return STRAIT_ERROR_DATA_LOSS;
    case StatusCode::kResourceExhausted: return STRAIT_ERROR_RESOURCE_EXHAUSTED;
    case StatusCode::kUnknown:
    case StatusCode::kInternal: return STRAIT_ERROR_INTERNAL;
  }
  return STRAIT_ERROR_INTERNAL;
}

strait_result_t Fail(strait_result_t result, std::string message) {
  t_last_error = std::move(message);
  return result;
}

strait_result_t Report(const Status& s) {
  if (s.ok()) return STRAIT_SUCCESS;
  return Fail(ResultOf(s.code()), s.message());
}

strait_result_t BadArgument(const std::string& function, const std::string& message) {
  return Fail(STRAIT_ERROR_INVALID_ARGUMENT, function + ": " + message);
}

// Runs `body` (returning strait_result_t) with every exception mapped to a result.
template <typename F>
strait_result_t Guard(const char* function, F&& body) noexcept {
  try {
    return body();
  } catch (const std::bad_alloc&) {
    return Fail(STRAIT_ERROR_RESOURCE_EXHAUSTED, std::string(function) + ": out of memory");
  } catch (const std::exception& e) {
    return Fail(STRAIT_ERROR_INTERNAL,
                std::string(function) + ": internal error: " + e.what() + " (please report this)");
  } catch (...) {
    return Fail(STRAIT_ERROR_INTERNAL,
                std::string(function) + ": internal error: unknown exception (please report this)");
  }
}

bool IsLive(const strait_comm* comm) {
  std::lock_guard<std::mutex> lock(g_comms_mu);
  return LiveComms().count(comm) != 0;
}

// A string argument, or the environment variable when it is NULL; nullopt when both are unset.
std::optional<std::string> ArgOrEnv(const char* arg, const char* env) {
  if (arg != nullptr) return std::string(arg);
  const char* v = std::getenv(env);
  if (v != nullptr) return std::string(v);
  return std::nullopt;
}

bool ValidJobId(const std::string& s) {
  if (s.empty() || s.size() > 64) return false;
  for (char c : s) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    c == '-' || c == '_' || c == '.';
    if (!ok) return false;
  }
  return true;
}

bool ValidRegion(const std::string& s) {
  if (s.empty() || s.size() > 63) return false;
  for (char c : s) {
    const bool ok =
        (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-' || c == '_' || c == '.';
    if (!ok) return false;
  }
  return true;
}

// Checks the arguments of strait_comm_init_host and builds the options, or says which argument
// is wrong (kInvalidArgument).
StatusOr<HostCommOptions> HostOptions(const strait_host_config_t* c) {
  if (c->struct_size != sizeof(strait_host_config_t)) {
    return InvalidArgumentError("config->struct_size is " + std::to_string(c->struct_size) +
                                ", expected " + std::to_string(sizeof(strait_host_config_t)) +
                                ": initialise the config with strait_host_config_init()");
  }
  HostCommOptions o;
  auto region = ArgOrEnv(c->region, "STRAIT_REGION");
  if (!region) return InvalidArgumentError("config->region is NULL and STRAIT_REGION is unset");
  if (!ValidRegion(*region)) {
    return InvalidArgumentError("config->region " + QuotedForError(*region) +
                                " is not a region name (1-63 of a-z 0-9 . _ -)");
  }
  o.region = *region;
  if (c->nranks < 1) {
    return InvalidArgumentError("config->nranks is " + std::to_string(c->nranks) +
                                "; it must be at least 1 (the ranks in this region)");
  }
  if (c->rank < 0 || c->rank >= c->nranks) {
    return InvalidArgumentError("config->rank " + std::to_string(c->rank) + " is outside 0.." +
                                std::to_string(c->nranks - 1) + " (config->nranks - 1)");
  }
  o.rank = c->rank;
  o.nranks = c->nranks;
  // One rank alone has no rendezvous: its root address is not used.
  if (c->nranks > 1) {
    if (c->root_address == nullptr) {
      return InvalidArgumentError("config->root_address is NULL: give rank 0's \"host:port\"");
    }
    auto root = gateway::ParseHostPort(c->root_address);
    if (!root.ok()) {
      return InvalidArgumentError("config->root_address " + QuotedForError(c->root_address) +
                                  ": " + root.status().message());
    }
    o.root_host = root->host;
    o.root_port = root->port;
  }
  auto gw = ArgOrEnv(c->gateway, "STRAIT_GATEWAY");
  if (!gw) return InvalidArgumentError("config->gateway is NULL and STRAIT_GATEWAY is unset");
  if (gw->empty() || (*gw)[0] != '/' || gw->size() > 107) {
    return InvalidArgumentError("config->gateway " + QuotedForError(*gw) +
                                " is not the absolute path of a straitd socket (at most 107 "
                                "bytes)");
  }
  o.gateway = *gw;
  auto job = ArgOrEnv(c->job_id, "STRAIT_JOB_ID");
  if (!job) return InvalidArgumentError("config->job_id is NULL and STRAIT_JOB_ID is unset");
  if (!ValidJobId(*job)) {
    return InvalidArgumentError("config->job_id " + QuotedForError(*job) +
                                " is not a job id (1-64 of letters, digits, - _ .)");
  }
  o.job = *job;
  o.compression = ArgOrEnv(c->compression, "STRAIT_COMPRESSION").value_or("");
  if (!o.compression.empty()) {
    auto parsed = localproto::ParsePolicyRequest(o.compression);
    if (!parsed.ok()) {
      return InvalidArgumentError("config->compression " + QuotedForError(o.compression) +
                                  ": " + parsed.status().message());
    }
  }
  if (c->timeout_ms <= 0) {
    return InvalidArgumentError("config->timeout_ms is " + std::to_string(c->timeout_ms) +
                                "; it must be positive (milliseconds)");
  }
  o.timeout_ns = int64_t{c->timeout_ms} * 1'000'000;
  const std::optional<std::string> shm = ArgOrEnv(nullptr, "STRAIT_LOCAL_SHM");
  if (shm && *shm != "0" && *shm != "1") {
    return InvalidArgumentError("STRAIT_LOCAL_SHM=" + QuotedForError(*shm) +
                                ": allowed 1 (tensors through shared memory, the default) or "
                                "0 (through the socket)");
  }
  o.shared_memory = !shm || *shm == "1";
  auto shard = ShardOf(c->shard, c->rank, c->nranks, "config->shard");
  if (!shard.ok()) return shard.status();
  o.shard = *shard;
  return o;
}

// Checks the arguments of strait_comm_init_nccl (NULL strings fall back to the environment, as
// for the host backend) and builds the options, or says which argument is wrong. Runs in every
// build, so a CPU-only library rejects bad arguments before it says UNSUPPORTED.
StatusOr<NcclCommOptions> NcclOptions(ncclComm* nccl, const char* region_arg,
                                      const char* gateway_arg, const char* job_arg,
                                      const char* compression_arg) {
  NcclCommOptions o;
  o.nccl = nccl;
  auto region = ArgOrEnv(region_arg, "STRAIT_REGION");
  if (!region) return InvalidArgumentError("region is NULL and STRAIT_REGION is unset");
  if (!ValidRegion(*region)) {
    return InvalidArgumentError("region " + QuotedForError(*region) +
                                " is not a region name (1-63 of a-z 0-9 . _ -)");
  }
  o.region = *region;
  auto gw = ArgOrEnv(gateway_arg, "STRAIT_GATEWAY");
  if (!gw) return InvalidArgumentError("gateway is NULL and STRAIT_GATEWAY is unset");
  if (gw->empty() || (*gw)[0] != '/' || gw->size() > 107) {
    return InvalidArgumentError("gateway " + QuotedForError(*gw) +
                                " is not the absolute path of a straitd socket (at most 107 "
                                "bytes)");
  }
  o.gateway = *gw;
  auto job = ArgOrEnv(job_arg, "STRAIT_JOB_ID");
  if (!job) return InvalidArgumentError("job_id is NULL and STRAIT_JOB_ID is unset");
  if (!ValidJobId(*job)) {
    return InvalidArgumentError("job_id " + QuotedForError(*job) +
                                " is not a job id (1-64 of letters, digits, - _ .)");
  }
  o.job = *job;
  o.compression = ArgOrEnv(compression_arg, "STRAIT_COMPRESSION").value_or("");
  if (!o.compression.empty()) {
    auto parsed = localproto::ParsePolicyRequest(o.compression);
    if (!parsed.ok()) {
      return InvalidArgumentError("compression " + QuotedForError(o.compression) +
                                  ": " + parsed.status().message());
    }
  }
  return o;
}

strait_result_t AllReduceImpl(const char* fn, const void* sendbuf, void* recvbuf, size_t count,
                              strait_datatype_t dtype, strait_redop_t op, const char* tensor_key,
                              bool keyed, strait_comm_t comm, CUstream_st* stream) {
  if (comm == nullptr) return BadArgument(fn, "comm is NULL");
  if (!IsLive(comm)) {
    return BadArgument(fn,
                       "comm is not a live Strait comm (destroyed, or not created by "
                       "strait_comm_init_*)");
  }
  if (stream != nullptr && !comm->backend->UsesStreams()) {
    return BadArgument(fn,
                       "stream must be NULL for a host-backend comm (it runs on the calling "
                       "thread; streams belong to the NCCL backend)");
  }
  // Range first: a C caller may pass any int, and 263 must not pass as 263 % 256.
  const int raw_dtype = static_cast<int>(dtype);
  const int raw_op = static_cast<int>(op);
  if (raw_dtype < 0 || raw_dtype > 255 || !IsValidDataType(static_cast<uint8_t>(raw_dtype))) {
    return BadArgument(fn, "dtype " + std::to_string(static_cast<int>(dtype)) +
                               " is not a strait_datatype_t (STRAIT_INT8..STRAIT_FLOAT8_E5M2)");
  }
  if (raw_op < 0 || raw_op > 255 || !IsValidReduceOp(static_cast<uint8_t>(raw_op))) {
    return BadArgument(fn, "op " + std::to_string(static_cast<int>(op)) +
                               " is not a strait_redop_t (STRAIT_SUM..STRAIT_AVG)");
  }
  if (Status failed = comm->backend->Failure(); !failed.ok()) {
    return Fail(STRAIT_ERROR_COMM_FAILED,
                std::string(fn) + ": an earlier all-reduce on this comm failed (" +
                    failed.message() + "); destroy the comm and create a new one on every rank");
  }
  std::string key;
  if (keyed) {
    if (tensor_key == nullptr) return BadArgument(fn, "tensor_key is NULL");
    key = tensor_key;
    if (key.empty() || key.size() > kMaxTensorKeyBytes) {
      return BadArgument(fn, "tensor_key must be 1-" + std::to_string(kMaxTensorKeyBytes) +
                                 " bytes, not " + std::to_string(key.size()));
    }
  }
  const DataType type = static_cast<DataType>(dtype);
  const size_t elem = DataTypeSize(type);
  if (count > 0) {
    if (sendbuf == nullptr)
      return BadArgument(fn, "sendbuf is NULL for " + std::to_string(count) + " elements");
    if (recvbuf == nullptr)
      return BadArgument(fn, "recvbuf is NULL for " + std::to_string(count) + " elements");
    if (count > SIZE_MAX / elem)
      return BadArgument(fn, "count " + std::to_string(count) + " overflows the address space");
    const auto s = reinterpret_cast<uintptr_t>(sendbuf);
    const auto r = reinterpret_cast<uintptr_t>(recvbuf);
    const uintptr_t bytes = count * elem;
    if (s != r && s < r + bytes && r < s + bytes) {
      return BadArgument(fn,
                         "sendbuf and recvbuf overlap without being equal (pass the same "
                         "pointer for an in-place all-reduce)");
    }
  }
  if (!keyed) {
    key = std::string("allreduce.") + DataTypeName(type) + "x" + std::to_string(count);
  }
  // The host backend returns when the result is in recvbuf, the NCCL backend once the work is
  // enqueued on `stream`; either way a failure fails the comm.
  Status s = comm->backend->AllReduce(sendbuf, recvbuf, count, type, static_cast<ReduceOp>(op), key,
                                      stream);
  return Report(s.WithContext(fn));
}

// Registers a created backend as a live comm and hands it to the caller as a strait_comm_t.
strait_result_t Publish(std::unique_ptr<Backend> backend, strait_comm_t* comm) {
  auto c = std::make_unique<strait_comm>();
  c->backend = std::move(backend);
  {
    std::lock_guard<std::mutex> lock(g_comms_mu);
    LiveComms().insert(c.get());
  }
  *comm = c.release();  // taken back by strait_comm_destroy
  return STRAIT_SUCCESS;
}

}  // namespace

// The shard a rank names to its straitd (strait_host_config_t::shard): `given` when >= 0, rank r
// of a region of several ranks, else $STRAIT_SHARD, else none (localproto::kAnyShard).
StatusOr<uint32_t> ShardOf(int given, int rank, int nranks, const char* what) {
  if (given >= 0) {
    if (given > gateway::kMaxConfigShard) {
      return InvalidArgumentError(std::string(what) + " is " + std::to_string(given) +
                                  "; a shard index is 0.." +
                                  std::to_string(gateway::kMaxConfigShard) + ", or -1");
    }
    return static_cast<uint32_t>(given);
  }
  if (given != -1) {
    return InvalidArgumentError(std::string(what) + " is " + std::to_string(given) +
                                "; give a shard index, or -1 (the default) for the rank's");
  }
  if (nranks > 1) return static_cast<uint32_t>(rank);
  const std::optional<std::string> env = ArgOrEnv(nullptr, "STRAIT_SHARD");
  if (!env || env->empty()) return localproto::kAnyShard;
  const std::string& text = *env;
  if (text.size() > 4 || !std::all_of(text.begin(), text.end(), ::isdigit) ||
      std::stoi(text) > gateway::kMaxConfigShard) {
    return InvalidArgumentError("STRAIT_SHARD is " + QuotedForError(text) + "; it must be a shard index 0.." +
                                std::to_string(gateway::kMaxConfigShard) +
                                " (the rank's index in its region), or unset");
  }
  return static_cast<uint32_t>(std::stoi(text));
}

}  // namespace strait::api

using strait::api::BadArgument;
using strait::api::Guard;

STRAIT_API_EXPORT strait_result_t strait_host_config_init(strait_host_config_t* config) {
  const char* const fn = __func__;
  return Guard(fn, [&] {
    if (config == nullptr) return BadArgument(fn, "config is NULL");
    std::memset(static_cast<void*>(config), 0, sizeof(*config));
    config->struct_size = sizeof(*config);
    config->rank = 0;
    config->nranks = 1;
    config->timeout_ms = 60000;
    config->shard = -1;
    return STRAIT_SUCCESS;
  });
}

STRAIT_API_EXPORT strait_result_t strait_comm_init_host(strait_comm_t* comm,
                                                        const strait_host_config_t* config) {
  const char* const fn = __func__;
  return Guard(fn, [&] {
    if (comm == nullptr) return BadArgument(fn, "comm is NULL (pass &comm)");
    *comm = nullptr;
    if (config == nullptr) return BadArgument(fn, "config is NULL");
    auto options = strait::api::HostOptions(config);
    if (!options.ok()) return BadArgument(fn, options.status().message());
    auto host = strait::api::HostComm::Create(*options);
    if (!host.ok()) return strait::api::Report(host.status().WithContext(fn));
    return strait::api::Publish(std::move(host).value(), comm);
  });
}

STRAIT_API_EXPORT strait_result_t strait_comm_init_nccl(strait_comm_t* comm,
                                                        struct ncclComm* nccl_comm,
                                                        const char* region, const char* gateway,
                                                        const char* job_id,
                                                        const char* compression) {
  const char* const fn = __func__;
  return Guard(fn, [&] {
    if (comm == nullptr) return BadArgument(fn, "comm is NULL (pass &comm)");
    *comm = nullptr;
    if (nccl_comm == nullptr) return BadArgument(fn, "nccl_comm is NULL");
    auto options = strait::api::NcclOptions(nccl_comm, region, gateway, job_id, compression);
    if (!options.ok()) return BadArgument(fn, options.status().message());
#if STRAIT_HAVE_NCCL_BACKEND
    auto backend = strait::api::NcclComm::Create(*options);
    if (!backend.ok()) return strait::api::Report(backend.status().WithContext(fn));
    return strait::api::Publish(std::move(backend).value(), comm);
#else
    return strait::api::Fail(
        STRAIT_ERROR_UNSUPPORTED,
        "strait_comm_init_nccl: this libstrait was built without CUDA/NCCL (no nvcc, nccl.h or "
        "libnccl at build time), so it has no GPU backend; rebuild with the CUDA Toolkit and "
        "NCCL (-DSTRAIT_CUDA=ON), copy the tensor to host memory and use "
        "strait_comm_init_host, or use the NCCL plugin (NCCL_NET_PLUGIN=strait)");
#endif
  });
}

STRAIT_API_EXPORT strait_result_t strait_allreduce(const void* sendbuf, void* recvbuf, size_t count,
                                                   strait_datatype_t dtype, strait_redop_t op,
                                                   strait_comm_t comm, struct CUstream_st* stream) {
  const char* const fn = __func__;
  return Guard(fn, [&] {
    return strait::api::AllReduceImpl(fn, sendbuf, recvbuf, count, dtype, op, nullptr, false, comm,
                                      stream);
  });
}

STRAIT_API_EXPORT strait_result_t strait_allreduce_keyed(const void* sendbuf, void* recvbuf,
                                                         size_t count, strait_datatype_t dtype,
                                                         strait_redop_t op, const char* tensor_key,
                                                         strait_comm_t comm,
                                                         struct CUstream_st* stream) {
  const char* const fn = __func__;
  return Guard(fn, [&] {
    return strait::api::AllReduceImpl(fn, sendbuf, recvbuf, count, dtype, op, tensor_key, true,
                                      comm, stream);
  });
}

STRAIT_API_EXPORT strait_result_t strait_comm_rank(strait_comm_t comm, int* rank, int* nranks) {
  const char* const fn = __func__;
  return Guard(fn, [&] {
    if (comm == nullptr) return BadArgument(fn, "comm is NULL");
    if (rank == nullptr && nranks == nullptr) {
      return BadArgument(fn, "rank and nranks are both NULL");
    }
    if (!strait::api::IsLive(comm)) {
      return BadArgument(fn,
                         "comm is not a live Strait comm (destroyed, or not created "
                         "by strait_comm_init_*)");
    }
    if (rank != nullptr) *rank = comm->backend->rank();
    if (nranks != nullptr) *nranks = comm->backend->nranks();
    return STRAIT_SUCCESS;
  });
}

STRAIT_API_EXPORT strait_result_t strait_comm_destroy(strait_comm_t comm) {
  const char* const fn = __func__;
  return Guard(fn, [&] {
    if (comm == nullptr) return BadArgument(fn, "comm is NULL");
    {
      std::lock_guard<std::mutex> lock(strait::api::g_comms_mu);
      if (strait::api::LiveComms().erase(comm) == 0) {
        return BadArgument(fn,
                           "comm is not a live Strait comm (destroyed twice, or not "
                           "created by strait_comm_init_*)");
      }
    }
    std::unique_ptr<strait_comm> owned(comm);  // released by Publish (strait_comm_init_*)
    return STRAIT_SUCCESS;
  });
}

STRAIT_API_EXPORT strait_result_t strait_version(int* major, int* minor, int* patch) {
  const char* const fn = __func__;
  return Guard(fn, [&] {
    if (major == nullptr && minor == nullptr && patch == nullptr) {
      return BadArgument(fn, "major, minor and patch are all NULL");
    }
    if (major != nullptr) *major = STRAIT_VERSION_MAJOR;
    if (minor != nullptr) *minor = STRAIT_VERSION_MINOR;
    if (patch != nullptr) *patch = STRAIT_VERSION_PATCH;
    return STRAIT_SUCCESS;
  });
}

STRAIT_API_EXPORT const char* strait_last_error(void) {
  return strait::api::t_last_error.c_str();
}

STRAIT_API_EXPORT const char* strait_result_string(strait_result_t result) {
  switch (result) {
    case STRAIT_SUCCESS: return "STRAIT_SUCCESS";
    case STRAIT_ERROR_INVALID_ARGUMENT: return "STRAIT_ERROR_INVALID_ARGUMENT";
    case STRAIT_ERROR_UNSUPPORTED: return "STRAIT_ERROR_UNSUPPORTED";
    case STRAIT_ERROR_UNAVAILABLE: return "STRAIT_ERROR_UNAVAILABLE";
    case STRAIT_ERROR_TIMEOUT: return "STRAIT_ERROR_TIMEOUT";
    case STRAIT_ERROR_ABORTED: return "STRAIT_ERROR_ABORTED";
    case STRAIT_ERROR_MISMATCH: return "STRAIT_ERROR_MISMATCH";
    case STRAIT_ERROR_PERMISSION_DENIED: return "STRAIT_ERROR_PERMISSION_DENIED";
    case STRAIT_ERROR_DATA_LOSS: return "STRAIT_ERROR_DATA_LOSS";
    case STRAIT_ERROR_RESOURCE_EXHAUSTED: return "STRAIT_ERROR_RESOURCE_EXHAUSTED";
    case STRAIT_ERROR_COMM_FAILED: return "STRAIT_ERROR_COMM_FAILED";
    case STRAIT_ERROR_INTERNAL: return "STRAIT_ERROR_INTERNAL";
  }
  return "unknown";
}

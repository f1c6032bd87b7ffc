// A thin header-only C++ wrapper over the C API (strait.h): an RAII communicator whose methods
// return strait::Status and never throw. Link strait::api (libstrait.so); the CMake target also
// brings strait::common, where strait::Status lives.
//
// Usage:
//   strait::HostConfig cfg;                   // strait_host_config_t with its defaults
//   cfg.region = "us-east"; cfg.rank = rank; cfg.nranks = 2; cfg.root_address = "10.0.0.1:29400";
//   cfg.gateway = "/run/strait/straitd.sock"; cfg.job_id = "job-42"; cfg.compression = "int8";
//   auto comm = strait::Comm::InitHost(cfg);  // StatusOr<Comm>
//   if (!comm.ok()) { std::cerr << comm.status() << "\n"; return 1; }
//   strait::Status s = comm->AllReduce(grad.data(), grad.data(), grad.size(), STRAIT_FLOAT32,
//                                      STRAIT_SUM);
// Threading and blocking as documented in strait.h for the functions each method calls.
#ifndef STRAIT_STRAIT_HPP_
#define STRAIT_STRAIT_HPP_

#include <cstddef>
#include <string>
#include <utility>

#include "strait/status.h"
#include "strait/strait.h"

namespace strait {

// strait_host_config_t, initialised with its defaults.
struct HostConfig : strait_host_config_t {
  HostConfig() : strait_host_config_t{} { strait_host_config_init(this); }
};

// The Status for a strait_result_t, with strait_last_error() as its message.
inline Status StatusFromResult(strait_result_t result) {
  if (result == STRAIT_SUCCESS) return Status::Ok();
  StatusCode code = StatusCode::kUnknown;
  switch (result) {
    case STRAIT_SUCCESS: code = StatusCode::kOk; break;
    case STRAIT_ERROR_INVALID_ARGUMENT: code = StatusCode::kInvalidArgument; break;
    case STRAIT_ERROR_UNSUPPORTED: code = StatusCode::kUnimplemented; break;
    case STRAIT_ERROR_UNAVAILABLE: code = StatusCode::kUnavailable; break;
    case STRAIT_ERROR_TIMEOUT: code = StatusCode::kDeadlineExceeded; break;
    case STRAIT_ERROR_ABORTED: code = StatusCode::kAborted; break;
    case STRAIT_ERROR_MISMATCH: code = StatusCode::kFailedPrecondition; break;
    case STRAIT_ERROR_PERMISSION_DENIED: code = StatusCode::kPermissionDenied; break;
    case STRAIT_ERROR_DATA_LOSS: code = StatusCode::kDataLoss; break;
    case STRAIT_ERROR_RESOURCE_EXHAUSTED: code = StatusCode::kResourceExhausted; break;
    case STRAIT_ERROR_COMM_FAILED: code = StatusCode::kFailedPrecondition; break;
    case STRAIT_ERROR_INTERNAL: code = StatusCode::kInternal; break;
  }
  return Status(code, std::string(strait_result_string(result)) + ": " + strait_last_error());
}

// Owns one strait_comm_t; movable, not copyable. The destructor destroys the comm.
class Comm {
 public:
  Comm() noexcept = default;
  explicit Comm(strait_comm_t comm) noexcept : comm_(comm) {}
  Comm(Comm&& other) noexcept : comm_(std::exchange(other.comm_, nullptr)) {}
  Comm& operator=(Comm&& other) noexcept {
    if (this != &other) {
      Reset();
      comm_ = std::exchange(other.comm_, nullptr);
    }
    return *this;
  }
  Comm(const Comm&) = delete;
  Comm& operator=(const Comm&) = delete;
  ~Comm() { Reset(); }

  // strait_comm_init_host.
  static StatusOr<Comm> InitHost(const strait_host_config_t& config) {
    strait_comm_t comm = nullptr;
    Status s = StatusFromResult(strait_comm_init_host(&comm, &config));
    if (!s.ok()) return s;
    return Comm(comm);
  }

  // strait_comm_init_nccl (the GPU backend; nullptr strings come from the environment).
  static StatusOr<Comm> InitNccl(struct ncclComm* nccl_comm, const char* region = nullptr,
                                 const char* gateway = nullptr, const char* job_id = nullptr,
                                 const char* compression = nullptr) {
    strait_comm_t comm = nullptr;
    Status s = StatusFromResult(
        strait_comm_init_nccl(&comm, nccl_comm, region, gateway, job_id, compression));
    if (!s.ok()) return s;
    return Comm(comm);
  }

  // strait_allreduce / strait_allreduce_keyed (tensor_key non-empty).
  Status AllReduce(const void* sendbuf, void* recvbuf, size_t count, strait_datatype_t dtype,
                   strait_redop_t op, const std::string& tensor_key = "",
                   CUstream_st* stream = nullptr) {
    if (tensor_key.empty()) {
      return StatusFromResult(strait_allreduce(sendbuf, recvbuf, count, dtype, op, comm_, stream));
    }
    return StatusFromResult(strait_allreduce_keyed(sendbuf, recvbuf, count, dtype, op,
                                                   tensor_key.c_str(), comm_, stream));
  }

  // The rank within the region and the region's number of ranks (-1 on error).
  int rank() const noexcept {
    int r = -1, n = -1;
    return strait_comm_rank(comm_, &r, &n) == STRAIT_SUCCESS ? r : -1;
  }
  int nranks() const noexcept {
    int r = -1, n = -1;
    return strait_comm_rank(comm_, &r, &n) == STRAIT_SUCCESS ? n : -1;
  }

  strait_comm_t get() const noexcept { return comm_; }
  explicit operator bool() const noexcept { return comm_ != nullptr; }

  // Destroys the comm now (as the destructor does); returns its result.
  Status Destroy() {
    if (comm_ == nullptr) return Status::Ok();
    return StatusFromResult(strait_comm_destroy(std::exchange(comm_, nullptr)));
  }

 private:
  void Reset() noexcept {
    if (comm_ != nullptr) (void)strait_comm_destroy(std::exchange(comm_, nullptr));
  }
  strait_comm_t comm_ = nullptr;
};

}  // namespace strait

#endif  // STRAIT_STRAIT_HPP_

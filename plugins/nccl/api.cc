// The C boundary: argument checks, exception barrier, logging and the one error mapping.
#include "plugins/nccl/api.h"

#include <atomic>
#include <cstdio>
#include <exception>
#include <memory>
#include <new>
#include <string>

namespace strait::nccl::api {
namespace {

std::atomic<ncclDebugLogger_t> g_logger{nullptr};

constexpr uint32_t kContextMagic = 0x58544353;  // "SCTX"
struct Context {
  uint32_t magic = kContextMagic;
};

void Emit(ncclDebugLogLevel level, const std::string& message) {
  ncclDebugLogger_t logger = g_logger.load(std::memory_order_acquire);
  if (logger != nullptr) {
    logger(level, kNcclSubsysNet, __FILE__, __LINE__, "NET/Strait : %s", message.c_str());
  } else if (level == NCCL_LOG_WARN) {
    std::fprintf(stderr, "NET/Strait WARN %s\n", message.c_str());
  }
}

Status Missing(const char* what) {
  return InvalidArgumentError(std::string(what) + " is NULL");
}

// Runs `fn` (returning Status), never letting an exception or an unmapped error out.
template <typename F>
ncclResult_t Guard(const char* call, F&& fn) {
  try {
    Status s = fn();
    if (s.ok()) return ncclSuccess;
    Warn(call, s.message());
    return ToNcclResult(s);
  } catch (const std::bad_alloc&) {
    Warn(call, "out of memory");
    return ncclSystemError;
  } catch (const std::exception& e) {
    Warn(call, std::string("internal error: ") + e.what());
    return ncclInternalError;
  } catch (...) {
    Warn(call, "internal error: unknown exception");
    return ncclInternalError;
  }
}

Transport& T() {
  return Transport::Get();
}

}  // namespace

ncclResult_t ToNcclResult(const Status& status) {
  switch (status.code()) {
    case StatusCode::kOk: return ncclSuccess;
    case StatusCode::kInvalidArgument: return ncclInvalidArgument;
    case StatusCode::kFailedPrecondition:
    case StatusCode::kUnimplemented: return ncclInvalidUsage;
    case StatusCode::kUnavailable:
    case StatusCode::kAborted:
    case StatusCode::kDataLoss: return ncclRemoteError;
    case StatusCode::kInternal: return ncclInternalError;
    default: return ncclSystemError;
  }
}

void Warn(const char* call, const std::string& message) {
  Emit(NCCL_LOG_WARN, std::string(call) + ": " + message);
}
void Info(const std::string& message) {
  Emit(NCCL_LOG_INFO, message);
}

ncclResult_t Init(void** ctx, ncclDebugLogger_t logger) {
  if (logger != nullptr) g_logger.store(logger, std::memory_order_release);
  return Guard("init", [&]() -> Status {
    STRAIT_RETURN_IF_ERROR(T().Init(ProcessEnv(), [](LogKind kind, const std::string& m) {
      Emit(kind == LogKind::kWarn ? NCCL_LOG_WARN : NCCL_LOG_INFO, m);
    }));
    if (ctx != nullptr) *ctx = std::make_unique<Context>().release();
    return Status::Ok();
  });
}

ncclResult_t Finalize(void* ctx) {
  return Guard("finalize", [&]() -> Status {
    if (ctx == nullptr || static_cast<Context*>(ctx)->magic != kContextMagic) {
      return InvalidArgumentError("finalize() with a context that init() did not return");
    }
    std::unique_ptr<Context> owned(static_cast<Context*>(ctx));
    owned->magic = 0;
    T().Finalize();
    return Status::Ok();
  });
}

ncclResult_t Devices(int* ndev) {
  return Guard("devices", [&]() -> Status {
    if (ndev == nullptr) return Missing("ndev");
    *ndev = T().Devices();
    return Status::Ok();
  });
}

ncclResult_t GetProperties(int dev, DeviceProperties* props) {
  return Guard("getProperties", [&]() -> Status {
    if (props == nullptr) return Missing("props");
    STRAIT_ASSIGN_OR_RETURN(*props, T().GetProperties(dev));
    return Status::Ok();
  });
}

ncclResult_t Listen(int dev, void* handle, void** listen_comm) {
  return Guard("listen", [&]() -> Status {
    if (handle == nullptr) return Missing("handle");
    if (listen_comm == nullptr) return Missing("listenComm");
    *listen_comm = nullptr;
    STRAIT_ASSIGN_OR_RETURN(*listen_comm, T().Listen(dev, handle));
    return Status::Ok();
  });
}

ncclResult_t Connect(int dev, void* handle, void** send_comm, ncclNetDeviceHandle_t** dev_comm) {
  return Guard("connect", [&]() -> Status {
    if (handle == nullptr) return Missing("handle");
    if (send_comm == nullptr) return Missing("sendComm");
    *send_comm = nullptr;
    // Host plugin: no device offload, whatever NCCL asked for.
    if (dev_comm != nullptr) *dev_comm = nullptr;
    STRAIT_ASSIGN_OR_RETURN(*send_comm, T().Connect(dev, handle));
    return Status::Ok();
  });
}

ncclResult_t Accept(void* listen_comm, void** recv_comm, ncclNetDeviceHandle_t** dev_comm) {
  return Guard("accept", [&]() -> Status {
    if (recv_comm == nullptr) return Missing("recvComm");
    *recv_comm = nullptr;
    if (dev_comm != nullptr) *dev_comm = nullptr;
    STRAIT_ASSIGN_OR_RETURN(*recv_comm, T().Accept(listen_comm));
    return Status::Ok();
  });
}

ncclResult_t RegMr(void* comm, void* data, size_t size, int type, void** mhandle) {
  return Guard("regMr", [&]() -> Status {
    if (mhandle == nullptr) return Missing("mhandle");
    STRAIT_ASSIGN_OR_RETURN(*mhandle, T().RegMr(comm, data, size, type));
    return Status::Ok();
  });
}

ncclResult_t DeregMr(void* comm, void* mhandle) {
  return Guard("deregMr", [&]() -> Status { return T().DeregMr(comm, mhandle); });
}

ncclResult_t Isend(void* send_comm, void* data, size_t size, int tag, void** request) {
  return Guard("isend", [&]() -> Status {
    if (request == nullptr) return Missing("request");
    *request = nullptr;
    STRAIT_ASSIGN_OR_RETURN(*request, T().Isend(send_comm, data, size, tag));
    return Status::Ok();
  });
}

ncclResult_t Irecv(void* recv_comm, int n, void** data, const size_t* sizes, const int* int_sizes,
                   int* tags, void** request) {
  return Guard("irecv", [&]() -> Status {
    if (request == nullptr) return Missing("request");
    // NCCL may preset *request to 0x1 (LL/LL128): it is overwritten with a real request or NULL.
    *request = nullptr;
    if (data == nullptr) return Missing("data");
    if (sizes == nullptr && int_sizes == nullptr) return Missing("sizes");
    if (tags == nullptr) return Missing("tags");
    if (n < 1 || n > kMaxRecvs) {
      return InvalidArgumentError("irecv of " + std::to_string(n) + " buffers; allowed: 1-" +
                                  std::to_string(kMaxRecvs) + " (maxRecvs)");
    }
    size_t converted[kMaxRecvs] = {};
    if (sizes == nullptr) {
      for (int i = 0; i < n; ++i) {
        if (int_sizes[i] < 0) {
          return InvalidArgumentError("irecv size " + std::to_string(int_sizes[i]) +
                                      " is negative");
        }
        converted[i] = static_cast<size_t>(int_sizes[i]);
      }
      sizes = converted;
    }
    STRAIT_ASSIGN_OR_RETURN(*request, T().Irecv(recv_comm, n, data, sizes, tags));
    return Status::Ok();
  });
}

ncclResult_t Iflush(void* recv_comm, int n, void** request) {
  return Guard("iflush", [&]() -> Status {
    if (request == nullptr) return Missing("request");
    *request = nullptr;
    if (n < 0 || n > kMaxRecvs)
      return InvalidArgumentError("iflush of " + std::to_string(n) + " buffers");
    STRAIT_ASSIGN_OR_RETURN(*request, T().Iflush(recv_comm));
    return Status::Ok();
  });
}

ncclResult_t Test(void* request, int* done, int* sizes) {
  return Guard("test", [&]() -> Status {
    if (done == nullptr) return Missing("done");
    *done = 0;
    bool finished = false;
    size_t got[kMaxRecvs] = {};
    int count = 0;
    Status s = T().Test(request, &finished, got, &count);
    *done = finished ? 1 : 0;
    if (finished && sizes != nullptr) {
      for (int i = 0; i < count; ++i) sizes[i] = static_cast<int>(got[i]);
    }
    return s;
  });
}

ncclResult_t CloseSend(void* send_comm) {
  return Guard("closeSend", [&]() -> Status { return T().CloseSend(send_comm); });
}
ncclResult_t CloseRecv(void* recv_comm) {
  return Guard("closeRecv", [&]() -> Status { return T().CloseRecv(recv_comm); });
}
ncclResult_t CloseListen(void* listen_comm) {
  return Guard("closeListen", [&]() -> Status { return T().CloseListen(listen_comm); });
}

ncclResult_t GetDeviceMr(void*, void*, void**) {
  return Guard("getDeviceMr", []() -> Status {
    return UnimplementedError(
        "device memory handles need device offload, which this host-only "
        "plugin does not offer");
  });
}

ncclResult_t IrecvConsumed(void*, int, void*) {
  // Only device-offload (UNPACK) plugins get this call; for a host plugin it has nothing to do.
  return ncclSuccess;
}

ncclResult_t SetNetAttr(void*, ncclNetAttr_v11_t* attr) {
  return Guard("setNetAttr", [&]() -> Status {
    if (attr == nullptr) return Missing("netAttr");
    return Status::Ok();  // hints only; the plugin has no per-operation tuning yet
  });
}

}  // namespace strait::nccl::api

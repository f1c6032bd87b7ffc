// The plugin's C boundary: one function per NCCL entry point, shared by every table version.
//
// Each function validates its pointer arguments, calls the Transport (transport.h), catches every
// exception, WARNs any error through the logger NCCL gave to init (subsystem NET, prefix
// "NET/Strait") and maps it through ToNcclResult, the one place where a Status becomes an
// ncclResult_t. The per-version adapters (nccl_interface.cc) only convert argument types.
// Thread-safe; blocking behaviour is the Transport's (see nccl_net.h).
#ifndef STRAIT_PLUGINS_NCCL_API_H_
#define STRAIT_PLUGINS_NCCL_API_H_

#include <cstddef>
#include <cstdint>

#include "plugins/nccl/nccl_net.h"
#include "plugins/nccl/transport.h"
#include "strait/status.h"

namespace strait::nccl::api {

// kInvalidArgument -> ncclInvalidArgument (bad handle, argument or configuration);
// kFailedPrecondition, kUnimplemented -> ncclInvalidUsage (called too early; asks for what this
// build cannot do); kUnavailable, kAborted, kDataLoss -> ncclRemoteError (peer gone, bad bytes
// from it); kInternal -> ncclInternalError; everything else -> ncclSystemError.
ncclResult_t ToNcclResult(const Status& status);

// Emits one line through NCCL's logger (stderr when init got none).
void Warn(const char* call, const std::string& message);
void Info(const std::string& message);

// `ctx` may be null (v8-v10 have none); when given it receives a context for Finalize.
ncclResult_t Init(void** ctx, ncclDebugLogger_t logger);
ncclResult_t Finalize(void* ctx);
ncclResult_t Devices(int* ndev);
ncclResult_t GetProperties(int dev, DeviceProperties* props);
ncclResult_t Listen(int dev, void* handle, void** listen_comm);
ncclResult_t Connect(int dev, void* handle, void** send_comm, ncclNetDeviceHandle_t** dev_comm);
ncclResult_t Accept(void* listen_comm, void** recv_comm, ncclNetDeviceHandle_t** dev_comm);
ncclResult_t RegMr(void* comm, void* data, size_t size, int type, void** mhandle);
ncclResult_t DeregMr(void* comm, void* mhandle);
ncclResult_t Isend(void* send_comm, void* data, size_t size, int tag, void** request);
// `int_sizes` (v8) or `sizes` (v9+): exactly one is non-null.
ncclResult_t Irecv(void* recv_comm, int n, void** data, const size_t* sizes, const int* int_sizes,
                   int* tags, void** request);
ncclResult_t Iflush(void* recv_comm, int n, void** request);
ncclResult_t Test(void* request, int* done, int* sizes);
ncclResult_t CloseSend(void* send_comm);
ncclResult_t CloseRecv(void* recv_comm);
ncclResult_t CloseListen(void* listen_comm);
ncclResult_t GetDeviceMr(void* comm, void* mhandle, void** dptr_mhandle);
ncclResult_t IrecvConsumed(void* recv_comm, int n, void* request);
ncclResult_t SetNetAttr(void* ctx, ncclNetAttr_v11_t* attr);

}  // namespace strait::nccl::api

#endif  // STRAIT_PLUGINS_NCCL_API_H_

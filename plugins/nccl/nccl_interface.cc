// The exported NCCL net tables (v12, v11, v10, v9, v8): thin adapters that only convert each
// version's argument and property types and call the one internal API (api.h). Nothing else in the
// library is visible (hidden visibility plus exports.map).
//
// The CollNet tables (v11, v10, v8) adapt to collnet.h the same way; they share init, devices,
// getProperties and finalize with the net tables, so NCCL sees the same device list under the
// same names (it merges CollNet and net devices by name). The tuner table is in tuner_interface.cc.
// makeVDevice is NULL (one device; NCCL then does not merge devices).
#include <cstring>
#include <mutex>
#include <string>

#include "plugins/nccl/api.h"
#include "plugins/nccl/collnet.h"
#include "plugins/nccl/nccl_net.h"

namespace strait::nccl {
namespace {

constexpr const char* kPluginName = "Strait";

// Device names must outlive the call: NCCL keeps the pointer.
char* StableName(const std::string& name) {
  static std::mutex mu;
  static std::string* stored = new std::string();
  std::lock_guard<std::mutex> lock(mu);
  if (*stored != name) *stored = name;
  return stored->data();
}

template <typename Props>
void FillCommon(const DeviceProperties& p, Props* out) {
  std::memset(out, 0, sizeof(*out));
  out->name = StableName(p.name);
  out->pciPath = nullptr;  // a virtual NIC on the first CPU: no GPUDirect
  out->guid = p.guid;
  out->ptrSupport = kNcclPtrHost;
  out->regIsGlobal = 0;
  out->speed = p.speed_mbps;
  out->port = 0;
  out->latency = p.latency_us;
  out->maxComms = p.max_comms;
  out->maxRecvs = p.max_recvs;
  out->netDeviceType = NCCL_NET_DEVICE_HOST;
  out->netDeviceVersion = kNcclNetDeviceInvalidVersion;
}

template <typename Props>
void FillV9Up(const DeviceProperties& p, Props* out) {
  FillCommon(p, out);
  out->forceFlush = 0;
  out->vProps.ndevs = 1;
  out->vProps.devs[0] = 0;
  out->maxP2pBytes = p.max_p2p_bytes;
  out->maxCollBytes = p.max_coll_bytes;
}

// ---- shared by several versions ----
ncclResult_t Devices(int* ndev) {
  return api::Devices(ndev);
}
ncclResult_t Accept(void* listen_comm, void** recv_comm, ncclNetDeviceHandle_t** dev_comm) {
  return api::Accept(listen_comm, recv_comm, dev_comm);
}
ncclResult_t RegMr(void* comm, void* data, size_t size, int type, void** mhandle) {
  return api::RegMr(comm, data, size, type, mhandle);
}
ncclResult_t RegMrDmaBuf(void* comm, void* data, size_t size, int type, uint64_t /*offset*/,
                         int /*fd*/, void** mhandle) {
  return api::RegMr(comm, data, size, type, mhandle);
}
ncclResult_t DeregMr(void* comm, void* mhandle) {
  return api::DeregMr(comm, mhandle);
}
ncclResult_t Iflush(void* recv_comm, int n, void** /*data*/, int* /*sizes*/, void** /*mh*/,
                    void** request) {
  return api::Iflush(recv_comm, n, request);
}
ncclResult_t Test(void* request, int* done, int* sizes) {
  return api::Test(request, done, sizes);
}
ncclResult_t CloseSend(void* c) {
  return api::CloseSend(c);
}
ncclResult_t CloseRecv(void* c) {
  return api::CloseRecv(c);
}
ncclResult_t CloseListen(void* c) {
  return api::CloseListen(c);
}
ncclResult_t GetDeviceMr(void* comm, void* mhandle, void** dptr) {
  return api::GetDeviceMr(comm, mhandle, dptr);
}
ncclResult_t IrecvConsumed(void* c, int n, void* r) {
  return api::IrecvConsumed(c, n, r);
}
ncclResult_t ListenNoCtx(int dev, void* handle, void** listen_comm) {
  return api::Listen(dev, handle, listen_comm);
}
ncclResult_t ConnectNoCtx(int dev, void* handle, void** send_comm,
                          ncclNetDeviceHandle_t** dev_comm) {
  return api::Connect(dev, handle, send_comm, dev_comm);
}
ncclResult_t IsendP(void* c, void* data, size_t size, int tag, void* /*mh*/, void* /*ph*/,
                    void** request) {
  return api::Isend(c, data, size, tag, request);
}
ncclResult_t IrecvP(void* c, int n, void** data, size_t* sizes, int* tags, void** /*mh*/,
                    void** /*ph*/, void** request) {
  return api::Irecv(c, n, data, sizes, nullptr, tags, request);
}

// ---- v12 (NCCL 2.30) ----
// Everything but getProperties is v11's adapter: the signatures are the same (the comm config,
// net attributes and device handle did not change), and makeVDevice stays NULL.
ncclResult_t GetPropertiesV12(int dev, ncclNetProperties_v12_t* props) {
  if (props == nullptr) return api::GetProperties(dev, nullptr);
  DeviceProperties p;
  const ncclResult_t r = api::GetProperties(dev, &p);
  if (r != ncclSuccess) return r;
  FillV9Up(p, props);  // vProps = {1, {0}}: one physical device, itself
  props->maxMultiRequestSize = 1;
  // Rail and plane ids describe how a cluster's physical NICs are cabled: NICs on the same rail
  // reach the same leaf switch, and different planes are separate fabrics NCCL must never pair.
  // Strait's device is one virtual NIC per process (a TCP or tunnel transport on
  // STRAIT_SOCKET_IFNAME, no pciPath), not a port on a rail, so it has neither. A single-device
  // NIC reports its own ids or none, and "none" is NCCL_NET_ID_UNDEF: NCCL then matches NICs by
  // guid and port exactly as it does for a v11 plugin (its own v11-to-v12 shim fills the same
  // value). Claiming rail 0 / plane 0 instead would tell NCCL that every host's Strait device
  // sits on one rail and one fabric, which nothing here knows.
  props->railId = kNcclNetIdUndef;
  props->planeId = kNcclNetIdUndef;
  return ncclSuccess;
}

// ---- v11 ----
ncclResult_t InitV11(void** ctx, uint64_t /*comm_id*/, ncclNetCommConfig_t* /*config*/,
                     ncclDebugLogger_t logger, ncclProfilerCallback_t /*prof*/) {
  if (ctx == nullptr) {
    api::Warn("init", "ctx is NULL");
    return ncclInvalidArgument;
  }
  return api::Init(ctx, logger);
}
ncclResult_t GetPropertiesV11(int dev, ncclNetProperties_v11_t* props) {
  if (props == nullptr) return api::GetProperties(dev, nullptr);
  DeviceProperties p;
  const ncclResult_t r = api::GetProperties(dev, &p);
  if (r != ncclSuccess) return r;
  FillV9Up(p, props);
  props->maxMultiRequestSize = 1;
  return ncclSuccess;
}
ncclResult_t ListenV11(void* /*ctx*/, int dev, void* handle, void** listen_comm) {
  return api::Listen(dev, handle, listen_comm);
}
ncclResult_t ConnectV11(void* /*ctx*/, int dev, void* handle, void** send_comm,
                        ncclNetDeviceHandle_t** dev_comm) {
  return api::Connect(dev, handle, send_comm, dev_comm);
}
ncclResult_t FinalizeV11(void* ctx) {
  return api::Finalize(ctx);
}
ncclResult_t SetNetAttrV11(void* ctx, ncclNetAttr_v11_t* attr) {
  return api::SetNetAttr(ctx, attr);
}

// ---- v10 ----
ncclResult_t InitV10(ncclDebugLogger_t logger, ncclProfilerCallback_t /*prof*/) {
  return api::Init(nullptr, logger);
}
ncclResult_t GetPropertiesV10(int dev, ncclNetProperties_v10_t* props) {
  if (props == nullptr) return api::GetProperties(dev, nullptr);
  DeviceProperties p;
  const ncclResult_t r = api::GetProperties(dev, &p);
  if (r != ncclSuccess) return r;
  FillV9Up(p, props);
  return ncclSuccess;
}
ncclResult_t ConnectV10(int dev, ncclNetCommConfig_t* /*config*/, void* handle, void** send_comm,
                        ncclNetDeviceHandle_t** dev_comm) {
  return api::Connect(dev, handle, send_comm, dev_comm);
}

// ---- v9 ----
ncclResult_t InitV9(ncclDebugLogger_t logger) {
  return api::Init(nullptr, logger);
}
ncclResult_t IsendV9(void* c, void* data, size_t size, int tag, void* /*mh*/, void** request) {
  return api::Isend(c, data, size, tag, request);
}
ncclResult_t IrecvV9(void* c, int n, void** data, size_t* sizes, int* tags, void** /*mh*/,
                     void** request) {
  return api::Irecv(c, n, data, sizes, nullptr, tags, request);
}

// ---- v8 ----
ncclResult_t GetPropertiesV8(int dev, ncclNetProperties_v8_t* props) {
  if (props == nullptr) return api::GetProperties(dev, nullptr);
  DeviceProperties p;
  const ncclResult_t r = api::GetProperties(dev, &p);
  if (r != ncclSuccess) return r;
  FillCommon(p, props);
  return ncclSuccess;
}
ncclResult_t IsendV8(void* c, void* data, int size, int tag, void* /*mh*/, void** request) {
  if (size < 0) {
    api::Warn("isend", "negative size " + std::to_string(size));
    return ncclInvalidArgument;
  }
  return api::Isend(c, data, static_cast<size_t>(size), tag, request);
}
ncclResult_t IrecvV8(void* c, int n, void** data, int* sizes, int* tags, void** /*mh*/,
                     void** request) {
  return api::Irecv(c, n, data, nullptr, sizes, tags, request);
}

// ---- CollNet (all versions) ----
ncclResult_t CollInitV11(void** ctx, uint64_t /*comm_id*/, ncclDebugLogger_t logger) {
  if (ctx == nullptr) {
    api::Warn("CollNet init", "ctx is NULL");
    return ncclInvalidArgument;
  }
  return api::Init(ctx, logger);
}
ncclResult_t CollInitNoCtx(ncclDebugLogger_t logger) {
  return api::Init(nullptr, logger);
}
ncclResult_t CollListenV11(void* /*ctx*/, int dev, void* handle, void** listen_comm) {
  return collnet::Listen(dev, handle, listen_comm);
}
ncclResult_t CollListenNoCtx(int dev, void* handle, void** listen_comm) {
  return collnet::Listen(dev, handle, listen_comm);
}
ncclResult_t CollConnect(void* handles[], int nranks, int rank, void* listen_comm,
                         void** coll_comm) {
  return collnet::Connect(handles, nranks, rank, listen_comm, coll_comm);
}
ncclResult_t CollReduceSupport(ncclDataType_t dtype, ncclRedOp_t op, int* supported) {
  return collnet::ReduceSupport(static_cast<int>(dtype), static_cast<int>(op), supported);
}
ncclResult_t CollRegMr(void* comm, void* data, size_t size, int type, void** mhandle) {
  return collnet::RegMr(comm, data, size, type, mhandle);
}
ncclResult_t CollRegMrDmaBuf(void* comm, void* data, size_t size, int type, uint64_t /*offset*/,
                             int /*fd*/, void** mhandle) {
  return collnet::RegMr(comm, data, size, type, mhandle);
}
ncclResult_t CollDeregMr(void* comm, void* mhandle) {
  return collnet::DeregMr(comm, mhandle);
}
ncclResult_t CollIallreduce(void* comm, void* send, void* recv, size_t count, ncclDataType_t dtype,
                            ncclRedOp_t op, void* /*send_mh*/, void* /*recv_mh*/, void** request) {
  return collnet::Iallreduce(comm, send, recv, count, static_cast<int>(dtype), static_cast<int>(op),
                             request);
}
ncclResult_t CollIallreduceV8(void* comm, void* send, void* recv, int count, ncclDataType_t dtype,
                              ncclRedOp_t op, void* /*send_mh*/, void* /*recv_mh*/,
                              void** request) {
  if (count < 0) {
    api::Warn("CollNet iallreduce", "negative count " + std::to_string(count));
    return ncclInvalidArgument;
  }
  return collnet::Iallreduce(comm, send, recv, static_cast<size_t>(count), static_cast<int>(dtype),
                             static_cast<int>(op), request);
}
ncclResult_t CollIflush(void* comm, void* /*data*/, int /*size*/, void* /*mh*/, void** request) {
  return collnet::Iflush(comm, request);
}
ncclResult_t CollTest(void* request, int* done, int* size) {
  return collnet::Test(request, done, size);
}
ncclResult_t CollClose(void* comm) {
  return collnet::CloseColl(comm);
}
ncclResult_t CollCloseListen(void* listen_comm) {
  return collnet::CloseListen(listen_comm);
}

}  // namespace
}  // namespace strait::nccl

using namespace strait::nccl;  // NOLINT: the tables below name the adapters above

extern "C" {

// Designated initializers: a slot put in the wrong place fails to compile (several slots share a
// signature, so positional initialisation would not catch it).
__attribute__((visibility("default"))) ncclNet_v12_t ncclNetPlugin_v12 = {
    .name = kPluginName,
    .init = InitV11,
    .devices = Devices,
    .getProperties = GetPropertiesV12,
    .listen = ListenV11,
    .connect = ConnectV11,
    .accept = Accept,
    .regMr = RegMr,
    .regMrDmaBuf = RegMrDmaBuf,
    .deregMr = DeregMr,
    .isend = IsendP,
    .irecv = IrecvP,
    .iflush = Iflush,
    .test = Test,
    .closeSend = CloseSend,
    .closeRecv = CloseRecv,
    .closeListen = CloseListen,
    .getDeviceMr = GetDeviceMr,
    .irecvConsumed = IrecvConsumed,
    .makeVDevice = nullptr,
    .finalize = FinalizeV11,
    .setNetAttr = SetNetAttrV11,
};

__attribute__((visibility("default"))) ncclNet_v11_t ncclNetPlugin_v11 = {
    .name = kPluginName,
    .init = InitV11,
    .devices = Devices,
    .getProperties = GetPropertiesV11,
    .listen = ListenV11,
    .connect = ConnectV11,
    .accept = Accept,
    .regMr = RegMr,
    .regMrDmaBuf = RegMrDmaBuf,
    .deregMr = DeregMr,
    .isend = IsendP,
    .irecv = IrecvP,
    .iflush = Iflush,
    .test = Test,
    .closeSend = CloseSend,
    .closeRecv = CloseRecv,
    .closeListen = CloseListen,
    .getDeviceMr = GetDeviceMr,
    .irecvConsumed = IrecvConsumed,
    .makeVDevice = nullptr,
    .finalize = FinalizeV11,
    .setNetAttr = SetNetAttrV11,
};

__attribute__((visibility("default"))) ncclNet_v10_t ncclNetPlugin_v10 = {
    .name = kPluginName,
    .init = InitV10,
    .devices = Devices,
    .getProperties = GetPropertiesV10,
    .listen = ListenNoCtx,
    .connect = ConnectV10,
    .accept = Accept,
    .regMr = RegMr,
    .regMrDmaBuf = RegMrDmaBuf,
    .deregMr = DeregMr,
    .isend = IsendP,
    .irecv = IrecvP,
    .iflush = Iflush,
    .test = Test,
    .closeSend = CloseSend,
    .closeRecv = CloseRecv,
    .closeListen = CloseListen,
    .getDeviceMr = GetDeviceMr,
    .irecvConsumed = IrecvConsumed,
    .makeVDevice = nullptr,
};

__attribute__((visibility("default"))) ncclNet_v9_t ncclNetPlugin_v9 = {
    .name = kPluginName,
    .init = InitV9,
    .devices = Devices,
    .getProperties = GetPropertiesV10,
    .listen = ListenNoCtx,
    .connect = ConnectNoCtx,
    .accept = Accept,
    .regMr = RegMr,
    .regMrDmaBuf = RegMrDmaBuf,
    .deregMr = DeregMr,
    .isend = IsendV9,
    .irecv = IrecvV9,
    .iflush = Iflush,
    .test = Test,
    .closeSend = CloseSend,
    .closeRecv = CloseRecv,
    .closeListen = CloseListen,
    .getDeviceMr = GetDeviceMr,
    .irecvConsumed = IrecvConsumed,
    .makeVDevice = nullptr,
};

__attribute__((visibility("default"))) ncclNet_v8_t ncclNetPlugin_v8 = {
    .name = kPluginName,
    .init = InitV9,
    .devices = Devices,
    .getProperties = GetPropertiesV8,
    .listen = ListenNoCtx,
    .connect = ConnectNoCtx,
    .accept = Accept,
    .regMr = RegMr,
    .regMrDmaBuf = RegMrDmaBuf,
    .deregMr = DeregMr,
    .isend = IsendV8,
    .irecv = IrecvV8,
    .iflush = Iflush,
    .test = Test,
    .closeSend = CloseSend,
    .closeRecv = CloseRecv,
    .closeListen = CloseListen,
    .getDeviceMr = GetDeviceMr,
    .irecvConsumed = IrecvConsumed,
};

// CollNet: iallgather and ireducescatter are NULL (NCCL then uses CollNet for all-reduce only).
__attribute__((visibility("default"))) ncclCollNet_v11_t ncclCollNetPlugin_v11 = {
    .name = kPluginName,
    .init = CollInitV11,
    .devices = Devices,
    .getProperties = GetPropertiesV11,
    .listen = CollListenV11,
    .connect = CollConnect,
    .reduceSupport = CollReduceSupport,
    .regMr = CollRegMr,
    .regMrDmaBuf = CollRegMrDmaBuf,
    .deregMr = CollDeregMr,
    .iallreduce = CollIallreduce,
    .iallgather = nullptr,
    .ireducescatter = nullptr,
    .iflush = CollIflush,
    .test = CollTest,
    .closeColl = CollClose,
    .closeListen = CollCloseListen,
    .makeVDevice = nullptr,
    .finalize = FinalizeV11,
};

__attribute__((visibility("default"))) ncclCollNet_v10_t ncclCollNetPlugin_v10 = {
    .name = kPluginName,
    .init = CollInitNoCtx,
    .devices = Devices,
    .getProperties = GetPropertiesV10,
    .listen = CollListenNoCtx,
    .connect = CollConnect,
    .reduceSupport = CollReduceSupport,
    .regMr = CollRegMr,
    .regMrDmaBuf = CollRegMrDmaBuf,
    .deregMr = CollDeregMr,
    .iallreduce = CollIallreduce,
    .iallgather = nullptr,
    .ireducescatter = nullptr,
    .iflush = CollIflush,
    .test = CollTest,
    .closeColl = CollClose,
    .closeListen = CollCloseListen,
    .makeVDevice = nullptr,
};

__attribute__((visibility("default"))) ncclCollNet_v8_t ncclCollNetPlugin_v8 = {
    .name = kPluginName,
    .init = CollInitNoCtx,
    .devices = Devices,
    .getProperties = GetPropertiesV8,
    .listen = CollListenNoCtx,
    .connect = CollConnect,
    .reduceSupport = CollReduceSupport,
    .regMr = CollRegMr,
    .regMrDmaBuf = CollRegMrDmaBuf,
    .deregMr = CollDeregMr,
    .iallreduce = CollIallreduceV8,
    .iallgather = nullptr,
    .ireducescatter = nullptr,
    .iflush = CollIflush,
    .test = CollTest,
    .closeColl = CollClose,
    .closeListen = CollCloseListen,
};

}  // extern "C"

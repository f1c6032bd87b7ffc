// Layout of our own NCCL ABI declarations (plugins/nccl/nccl_net.h) against NCCL 2.28.9 (v8-v11)
// and NCCL 2.30.7 (v12, offsets as in docs/nccl-net-v12.md): every
// field offset of every struct NCCL reads or writes, and every function's slot in each table.
// These are compile-time checks; a slip fails the build. The one runtime test keeps the file in
// the test list and checks the constants NCCL compares against.
#include <gtest/gtest.h>

#include <cstddef>

#include "plugins/nccl/nccl_net.h"

namespace {

#define SLOT(table, field, index) \
  static_assert(offsetof(table, field) == (index) * sizeof(void*), #table "." #field)

// Properties v12: v11's fields up to vProps, which now holds 8 devices (36 bytes, not 20), so
// everything after it moves by 16; the two 16-bit ids sit where v11 had tail padding.
static_assert(offsetof(ncclNetProperties_v12_t, name) == 0);
static_assert(offsetof(ncclNetProperties_v12_t, pciPath) == 8);
static_assert(offsetof(ncclNetProperties_v12_t, guid) == 16);
static_assert(offsetof(ncclNetProperties_v12_t, ptrSupport) == 24);
static_assert(offsetof(ncclNetProperties_v12_t, regIsGlobal) == 28);
static_assert(offsetof(ncclNetProperties_v12_t, forceFlush) == 32);
static_assert(offsetof(ncclNetProperties_v12_t, speed) == 36);
static_assert(offsetof(ncclNetProperties_v12_t, port) == 40);
static_assert(offsetof(ncclNetProperties_v12_t, latency) == 44);
static_assert(offsetof(ncclNetProperties_v12_t, maxComms) == 48);
static_assert(offsetof(ncclNetProperties_v12_t, maxRecvs) == 52);
static_assert(offsetof(ncclNetProperties_v12_t, netDeviceType) == 56);
static_assert(offsetof(ncclNetProperties_v12_t, netDeviceVersion) == 60);
static_assert(offsetof(ncclNetProperties_v12_t, vProps) == 64);
static_assert(offsetof(ncclNetProperties_v12_t, maxP2pBytes) == 104);
static_assert(offsetof(ncclNetProperties_v12_t, maxCollBytes) == 112);
static_assert(offsetof(ncclNetProperties_v12_t, maxMultiRequestSize) == 120);
static_assert(offsetof(ncclNetProperties_v12_t, railId) == 124);
static_assert(offsetof(ncclNetProperties_v12_t, planeId) == 126);
static_assert(sizeof(ncclNetProperties_v12_t::railId) == 2 &&
              sizeof(ncclNetProperties_v12_t::planeId) == 2);
static_assert(sizeof(ncclNetProperties_v12_t) == 128);
static_assert(offsetof(ncclNetVDeviceProps_v12_t, devs) == 4);
static_assert(sizeof(ncclNetVDeviceProps_v12_t) == 36);

// Properties v11 (v10/v9 are its prefix without maxMultiRequestSize).
static_assert(offsetof(ncclNetProperties_v11_t, name) == 0);
static_assert(offsetof(ncclNetProperties_v11_t, pciPath) == 8);
static_assert(offsetof(ncclNetProperties_v11_t, guid) == 16);
static_assert(offsetof(ncclNetProperties_v11_t, ptrSupport) == 24);
static_assert(offsetof(ncclNetProperties_v11_t, regIsGlobal) == 28);
static_assert(offsetof(ncclNetProperties_v11_t, forceFlush) == 32);
static_assert(offsetof(ncclNetProperties_v11_t, speed) == 36);
static_assert(offsetof(ncclNetProperties_v11_t, port) == 40);
static_assert(offsetof(ncclNetProperties_v11_t, latency) == 44);
static_assert(offsetof(ncclNetProperties_v11_t, maxComms) == 48);
static_assert(offsetof(ncclNetProperties_v11_t, maxRecvs) == 52);
static_assert(offsetof(ncclNetProperties_v11_t, netDeviceType) == 56);
static_assert(offsetof(ncclNetProperties_v11_t, netDeviceVersion) == 60);
static_assert(offsetof(ncclNetProperties_v11_t, vProps) == 64);
static_assert(offsetof(ncclNetProperties_v11_t, maxP2pBytes) == 88);
static_assert(offsetof(ncclNetProperties_v11_t, maxCollBytes) == 96);
static_assert(offsetof(ncclNetProperties_v11_t, maxMultiRequestSize) == 104);
static_assert(sizeof(ncclNetProperties_v11_t) == 112);

static_assert(offsetof(ncclNetProperties_v10_t, forceFlush) == 32);
static_assert(offsetof(ncclNetProperties_v10_t, vProps) == 64);
static_assert(offsetof(ncclNetProperties_v10_t, maxP2pBytes) == 88);
static_assert(offsetof(ncclNetProperties_v10_t, maxCollBytes) == 96);
static_assert(sizeof(ncclNetProperties_v10_t) == 104);

// v8: no forceFlush, so everything after regIsGlobal moves up by 4.
static_assert(offsetof(ncclNetProperties_v8_t, regIsGlobal) == 28);
static_assert(offsetof(ncclNetProperties_v8_t, speed) == 32);
static_assert(offsetof(ncclNetProperties_v8_t, port) == 36);
static_assert(offsetof(ncclNetProperties_v8_t, latency) == 40);
static_assert(offsetof(ncclNetProperties_v8_t, maxComms) == 44);
static_assert(offsetof(ncclNetProperties_v8_t, maxRecvs) == 48);
static_assert(offsetof(ncclNetProperties_v8_t, netDeviceType) == 52);
static_assert(offsetof(ncclNetProperties_v8_t, netDeviceVersion) == 56);
static_assert(sizeof(ncclNetProperties_v8_t) == 64);

static_assert(offsetof(ncclNetVDeviceProps_t, devs) == 4);
static_assert(offsetof(ncclNetDeviceHandle_t, handle) == 8);
static_assert(offsetof(ncclNetDeviceHandle_t, size) == 16);
static_assert(offsetof(ncclNetDeviceHandle_t, needsProxyProgress) == 24);
static_assert(offsetof(ncclNetAttr_v11_t, recvCommAttr) == 16);
static_assert(offsetof(ncclNetAttr_v11_t, op) == 32);
static_assert(offsetof(ncclNetAttr_v11_t, proto) == 40);

SLOT(ncclNet_v12_t, name, 0);
SLOT(ncclNet_v12_t, init, 1);
SLOT(ncclNet_v12_t, devices, 2);
SLOT(ncclNet_v12_t, getProperties, 3);
SLOT(ncclNet_v12_t, listen, 4);
SLOT(ncclNet_v12_t, connect, 5);
SLOT(ncclNet_v12_t, accept, 6);
SLOT(ncclNet_v12_t, regMr, 7);
SLOT(ncclNet_v12_t, regMrDmaBuf, 8);
SLOT(ncclNet_v12_t, deregMr, 9);
SLOT(ncclNet_v12_t, isend, 10);
SLOT(ncclNet_v12_t, irecv, 11);
SLOT(ncclNet_v12_t, iflush, 12);
SLOT(ncclNet_v12_t, test, 13);
SLOT(ncclNet_v12_t, closeSend, 14);
SLOT(ncclNet_v12_t, closeRecv, 15);
SLOT(ncclNet_v12_t, closeListen, 16);
SLOT(ncclNet_v12_t, getDeviceMr, 17);
SLOT(ncclNet_v12_t, irecvConsumed, 18);
SLOT(ncclNet_v12_t, makeVDevice, 19);
SLOT(ncclNet_v12_t, finalize, 20);
SLOT(ncclNet_v12_t, setNetAttr, 21);
static_assert(sizeof(ncclNet_v12_t) == 22 * sizeof(void*));

SLOT(ncclNet_v11_t, name, 0);
SLOT(ncclNet_v11_t, init, 1);
SLOT(ncclNet_v11_t, devices, 2);
SLOT(ncclNet_v11_t, getProperties, 3);
SLOT(ncclNet_v11_t, listen, 4);
SLOT(ncclNet_v11_t, connect, 5);
SLOT(ncclNet_v11_t, accept, 6);
SLOT(ncclNet_v11_t, regMr, 7);
SLOT(ncclNet_v11_t, regMrDmaBuf, 8);
SLOT(ncclNet_v11_t, deregMr, 9);
SLOT(ncclNet_v11_t, isend, 10);
SLOT(ncclNet_v11_t, irecv, 11);
SLOT(ncclNet_v11_t, iflush, 12);
SLOT(ncclNet_v11_t, test, 13);
SLOT(ncclNet_v11_t, closeSend, 14);
SLOT(ncclNet_v11_t, closeRecv, 15);
SLOT(ncclNet_v11_t, closeListen, 16);
SLOT(ncclNet_v11_t, getDeviceMr, 17);
SLOT(ncclNet_v11_t, irecvConsumed, 18);
SLOT(ncclNet_v11_t, makeVDevice, 19);
SLOT(ncclNet_v11_t, finalize, 20);
SLOT(ncclNet_v11_t, setNetAttr, 21);

SLOT(ncclNet_v10_t, init, 1);
SLOT(ncclNet_v10_t, listen, 4);
SLOT(ncclNet_v10_t, connect, 5);
SLOT(ncclNet_v10_t, isend, 10);
SLOT(ncclNet_v10_t, irecv, 11);
SLOT(ncclNet_v10_t, test, 13);
SLOT(ncclNet_v10_t, closeListen, 16);
SLOT(ncclNet_v10_t, makeVDevice, 19);

SLOT(ncclNet_v9_t, init, 1);
SLOT(ncclNet_v9_t, connect, 5);
SLOT(ncclNet_v9_t, isend, 10);
SLOT(ncclNet_v9_t, irecv, 11);
SLOT(ncclNet_v9_t, irecvConsumed, 18);
SLOT(ncclNet_v9_t, makeVDevice, 19);

SLOT(ncclNet_v8_t, init, 1);
SLOT(ncclNet_v8_t, connect, 5);
SLOT(ncclNet_v8_t, isend, 10);
SLOT(ncclNet_v8_t, irecv, 11);
SLOT(ncclNet_v8_t, test, 13);
SLOT(ncclNet_v8_t, irecvConsumed, 18);

TEST(NcclNetAbi, ConstantsMatchNccl) {
  EXPECT_EQ(kNcclNetHandleMaxSize, 128);
  EXPECT_EQ(kNcclPtrHost, 1);
  EXPECT_EQ(kNcclPtrCuda, 2);
  EXPECT_EQ(kNcclPtrDmabuf, 4);
  EXPECT_EQ(static_cast<int>(ncclRemoteError), 6);
  EXPECT_EQ(static_cast<int>(ncclInProgress), 7);
  EXPECT_EQ(static_cast<int>(NCCL_LOG_WARN), 2);
  EXPECT_EQ(kNcclSubsysNet, 0x10u);
  EXPECT_EQ(kNcclNetMaxDevsPerNic, 4);
  EXPECT_EQ(kNcclNetMaxDevsPerNicV12, 8);
  EXPECT_EQ(kNcclNetIdUndef, -1);
}

}  // namespace

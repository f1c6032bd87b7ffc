// Pre-opened listeners for cross-region listen() (STRAIT_GATEWAY set); internal to the
// transport. Why they exist:
//
// NCCL calls listen() on its own thread and needs the handle filled before the call returns, and
// a cross-region handle must carry the listen id that only the gateway hands out (in its answer
// to a tunnel listen). Instead of asking the gateway inside listen(), the loop keeps
// kListenPoolSize listeners opened ahead: each has its TCP listener bound and its tunnel listen
// answered. listen() takes a ready one (no round trip: its handle is filled from what the plugin
// already holds) and the loop opens a replacement in the background. listen() waits only when no
// pre-opened listener is ready (the first listen right after init, a burst of listens faster
// than the local gateway answers, or an unhealthy gateway), and then for kGatewayListenWaitNs at
// most; a gateway that is not there at all fails it at once.
//
// Threading: Activate/Take/Notify from any thread; Fill and Close on the loop thread.
#ifndef STRAIT_PLUGINS_NCCL_LISTEN_POOL_H_
#define STRAIT_PLUGINS_NCCL_LISTEN_POOL_H_

#include <sys/socket.h>

#include <cstdint>
#include <string>
#include <utility>

#include "plugins/nccl/listen_comm.h"
#include "strait/status.h"

namespace strait::nccl {

// Any thread (init): the pool serves listeners bound to `addr` with tunnel listens on the gateway
// at `gateway`; the loop then fills it (FillListenPool).
void ActivateListenPool(const std::string& gateway, const sockaddr_storage& addr);

// Loop side: opens listeners until the pool holds its size opening or ready.
void FillListenPool();

// NCCL side: a ready listener out of the pool (claimed: the caller owns it), waiting up to
// `wait_ns` when none is ready yet. Blocks.
StatusOr<std::pair<ListenComm*, ListenComm::TunnelInfo>> TakeFromListenPool(int64_t wait_ns);

// Loop side (the last finalize): closes every pre-opened listener.
void CloseListenPool();

}  // namespace strait::nccl

#endif  // STRAIT_PLUGINS_NCCL_LISTEN_POOL_H_

// The pool of pre-opened listeners (see listen_pool.h for why listen() does not wait for straitd).
#include "plugins/nccl/listen_pool.h"

#include <chrono>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <vector>

#include "common/units.h"

namespace strait::nccl {

namespace {

constexpr size_t kListenPoolSize = 4;

struct ListenPool {
  std::mutex mu;
  std::condition_variable cv;  // a pooled listener changed state, or the pool was refilled
  bool active = false;         // the loop runs with a gateway; false once finalize closes the pool
  std::string gateway;
  sockaddr_storage addr{};
  std::deque<ListenComm*> entries;  // not registered: NCCL has not seen them
};

ListenPool& Pool() {
  static ListenPool* pool = new ListenPool();  // never destroyed, like the transport
  return *pool;
}

}  // namespace

void ActivateListenPool(const std::string& gateway, const sockaddr_storage& addr) {
  std::lock_guard<std::mutex> pool_lock(Pool().mu);
  Pool().active = true;
  Pool().gateway = gateway;
  Pool().addr = addr;
}

void NotifyListenPool() {
  std::lock_guard<std::mutex> lock(Pool().mu);
  Pool().cv.notify_all();
}

// Loop side: opens listeners until kListenPoolSize are opening or ready.
void FillListenPool() {
  ListenPool& pool = Pool();
  std::string gateway;
  sockaddr_storage addr{};
  size_t live = 0;
  {
    std::lock_guard<std::mutex> lock(pool.mu);
    if (!pool.active) return;
    gateway = pool.gateway;
    addr = pool.addr;
    for (ListenComm* e : pool.entries) {
      if (e->pool_state() != ListenComm::PoolState::kFailed) ++live;
    }
  }
  std::vector<ListenComm*> fresh;
  for (size_t i = live; i < kListenPoolSize; ++i) {
    auto comm = std::make_unique<ListenComm>(RandomId());
    comm->MarkPooled();
    sockaddr_storage bound{};
    const Status st = comm->Open(addr, &bound);
    if (st.ok()) {
      comm->StartTunnel(gateway);
    } else {
      comm->FailTunnel(st);
    }
    fresh.push_back(comm.release());
  }
  std::lock_guard<std::mutex> lock(pool.mu);
  pool.entries.insert(pool.entries.end(), fresh.begin(), fresh.end());
  pool.cv.notify_all();
}

// NCCL side: a ready listener out of the pool, waiting up to `wait_ns` when none is ready yet.
StatusOr<std::pair<ListenComm*, ListenComm::TunnelInfo>> TakeFromListenPool(int64_t wait_ns) {
  ListenPool& pool = Pool();
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::nanoseconds(wait_ns);
  bool refilled = false;
  Status last_error;
  std::unique_lock<std::mutex> lock(pool.mu);
  for (;;) {
    bool opening = false;
    for (auto it = pool.entries.begin(); it != pool.entries.end();) {
      ListenComm* e = *it;
      ListenComm::TunnelInfo info;
      if (e->Claim(&info)) {
        pool.entries.erase(it);
        lock.unlock();
        Loop().Post(FillListenPool);
        return std::make_pair(e, info);
      }
      if (e->pool_state() == ListenComm::PoolState::kFailed) {
        last_error = e->tunnel_error();
        it = pool.entries.erase(it);
        Loop().Post([e] { e->BeginClose(); });
        continue;
      }
      opening = true;
      ++it;
    }
    if (!opening) {
      if (refilled || !pool.active) {
        if (!last_error.ok()) return last_error;
        return FailedPreconditionError("no listener could be opened: the plugin is finalizing");
      }
      // Every pre-opened listener failed (straitd was down, or restarted since): try afresh
      // once, so a gateway that is back now is used; one that is still down fails at once.
      lock.unlock();
      Loop().RunSync(FillListenPool);
      lock.lock();
      refilled = true;
      continue;
    }
    if (pool.cv.wait_until(lock, deadline) == std::cv_status::timeout) {
      return DeadlineExceededError(
          "the local gateway at " + pool.gateway + " did not answer a tunnel listen within " +
          FormatDuration(wait_ns) +
          ": is straitd there healthy? (listen runs on NCCL's thread and waits no longer)");
    }
  }
}

// Loop side (the last finalize): closes every pre-opened listener.
void CloseListenPool() {
  std::deque<ListenComm*> entries;
  {
    std::lock_guard<std::mutex> lock(Pool().mu);
    Pool().active = false;
    entries.swap(Pool().entries);
    Pool().cv.notify_all();
  }
  for (ListenComm* e : entries) e->BeginClose();
}

}  // namespace strait::nccl

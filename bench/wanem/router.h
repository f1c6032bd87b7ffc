// The user-space router at the centre of strait-wanem: one thread reads IPv4 packets from every
// region's TUN device, passes each through the Link of its (source region, destination region)
// pair, and writes it to the destination's TUN device when the link releases it. A schedule
// changes link settings at given times.
//
// Usage: auto r = Router::Create(options); std::thread t([&] { status = (*r)->Run(); });
//        ... (*r)->Stop(); t.join();
// Run() blocks, at real-time priority (SCHED_FIFO) where it may; Stop() and Snapshot() are
// thread-safe. The router does not own the TUN fds.
#ifndef STRAIT_BENCH_WANEM_ROUTER_H_
#define STRAIT_BENCH_WANEM_ROUTER_H_

#include <atomic>
#include <memory>
#include <mutex>
#include <vector>

#include "bench/wanem/config.h"
#include "bench/wanem/link_model.h"
#include "bench/wanem/netns.h"

namespace strait::wanem {

struct RouterOptions {
  std::vector<int> tun_fds;  // Index = region; not owned, non-blocking.
  LinkTable table;
  std::vector<ScheduleEvent> schedule;  // Sorted by time (ParseSchedule's order).
  uint64_t seed = 1;
};

struct RouterStats {
  int regions = 0;
  std::vector<std::vector<LinkStats>> links;  // [src][dst]
  std::vector<std::vector<LinkParams>> params;  // Current settings, [src][dst].
  uint64_t packets_in = 0;
  uint64_t invalid = 0;        // Not IPv4, wrong source, or no such destination region.
  uint64_t write_errors = 0;
  size_t max_packet_bytes = 0;  // Largest packet read: at most the MTU when offloads are off.
  size_t schedule_applied = 0;
};

class Router {
 public:
  static StatusOr<std::unique_ptr<Router>> Create(RouterOptions options);
  ~Router();

  // Routes until Stop(); returns the error that ended it early, if any.
  Status Run();
  void Stop() noexcept;
  RouterStats Snapshot() const;
  // Changes the (src, dst) link now (a test degrading a link mid-run; a schedule is the way for
  // planned changes). Thread-safe; applied by the routing thread before its next packet.
  // kInvalidArgument for a pair out of range or src == dst.
  Status SetLink(int src, int dst, const LinkParams& params);

 private:
  explicit Router(RouterOptions options);
  void HandleReadable(int src, int64_t& now);
  void Release(int64_t now);
  void Publish();

  RouterOptions options_;
  int regions_ = 0;
  std::vector<std::unique_ptr<Link>> links_;  // [src * regions_ + dst]
  UniqueFd epoll_;
  UniqueFd stop_event_;
  std::vector<std::vector<uint8_t>> pool_;
  std::vector<uint8_t> scratch_;
  size_t next_event_ = 0;
  uint64_t packets_in_ = 0;
  uint64_t invalid_ = 0;
  uint64_t write_errors_ = 0;
  size_t max_packet_bytes_ = 0;

  mutable std::mutex mu_;
  RouterStats published_;
  std::vector<ScheduleEvent> pending_;  // from SetLink, under mu_
};

}  // namespace strait::wanem

#endif  // STRAIT_BENCH_WANEM_ROUTER_H_

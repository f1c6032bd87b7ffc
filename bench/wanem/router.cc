// The router's epoll loop: read from TUN devices, shape through the links, write when released.
#include "bench/wanem/router.h"

#include <arpa/inet.h>
#include <pthread.h>
#include <sched.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "common/clock.h"
#include "common/log.h"
#include "common/units.h"

namespace strait::wanem {
namespace {

constexpr size_t kScratchBytes = 65536;
// Packets read from one device before looking at the others and at due releases, so one busy
// sender can neither starve the rest nor delay releases by more than a burst.
constexpr int kReadBurst = 64;
// Releases this close to due are sent now: waking up for each of them costs more than the
// error, which stays far below a packet's serialisation time at 1 Gbit/s and MTU 1500.
constexpr int64_t kReleaseSlackNanos = 5'000;
constexpr size_t kMaxPooled = 8192;
constexpr int64_t kPublishEveryNanos = 50'000'000;
// Above every normal thread, below the kernel's own real-time threads (50 and up).
constexpr int kRealtimePriority = 10;
// At real-time priority a router that woke for every packet would preempt a gateway some 50k
// times a second (six 100 Mbit/s links); reading what arrived in the last 250 us at once costs
// that much latency jitter at most, against links of milliseconds, and keeps the emulator's
// share of the CPU small. A TUN queue (500 packets) holds 250 us of 20 Gbit/s.
constexpr int64_t kMinWakeGapNanos = 250'000;

}  // namespace

Router::Router(RouterOptions options) : options_(std::move(options)) {}

Router::~Router() = default;

StatusOr<std::unique_ptr<Router>> Router::Create(RouterOptions options) {
  const int n = static_cast<int>(options.tun_fds.size());
  if (n < 2 || n != options.table.regions) {
    return InvalidArgumentError("router needs one TUN device per region (" +
                                std::to_string(options.table.regions) + "), got " +
                                std::to_string(n));
  }
  std::unique_ptr<Router> r(new Router(std::move(options)));  // Private constructor.
  r->regions_ = n;
  r->links_.resize(size_t(n) * size_t(n));
  for (int s = 0; s < n; ++s) {
    for (int d = 0; d < n; ++d) {
      if (s == d) continue;
      // Distinct seeds per pair so that two links never drop the same packet numbers.
      r->links_[size_t(s) * n + d] = std::make_unique<Link>(
          r->options_.table.at(s, d), r->options_.seed * 1000003u + uint64_t(s) * 257u + d);
    }
  }
  r->epoll_.Reset(epoll_create1(EPOLL_CLOEXEC));
  r->stop_event_.Reset(eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));
  if (!r->epoll_.valid() || !r->stop_event_.valid()) {
    return InternalError(std::string("epoll/eventfd: ") + std::strerror(errno));
  }
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.u32 = static_cast<uint32_t>(n);
  if (epoll_ctl(r->epoll_.get(), EPOLL_CTL_ADD, r->stop_event_.get(), &ev) != 0) {
    return InternalError(std::string("epoll_ctl: ") + std::strerror(errno));
  }
  for (int s = 0; s < n; ++s) {
    ev.data.u32 = static_cast<uint32_t>(s);
    if (epoll_ctl(r->epoll_.get(), EPOLL_CTL_ADD, r->options_.tun_fds[s], &ev) != 0) {
      return InternalError(std::string("epoll_ctl TUN: ") + std::strerror(errno));
    }
  }
  r->scratch_.resize(kScratchBytes);
  r->Publish();
  return r;
}

void Router::Stop() noexcept {
  const uint64_t one = 1;
  [[maybe_unused]] ssize_t rc = ::write(stop_event_.get(), &one, sizeof(one));
}

void Router::HandleReadable(int src, int64_t& now) {
  const int fd = options_.tun_fds[src];
  for (int i = 0; i < kReadBurst; ++i) {
    const ssize_t n = ::read(fd, scratch_.data(), scratch_.size());
    if (n < 0) {
      if (errno == EINTR) continue;
      return;  // EAGAIN: drained.
    }
    now = MonotonicNanos();
    ++packets_in_;
    const size_t len = static_cast<size_t>(n);
    max_packet_bytes_ = std::max(max_packet_bytes_, len);
    auto key = ParseFlowKey(scratch_.data(), len);
    // Only 10.201.<src>.x -> 10.201.<dst>.x between distinct regions is routed; anything else
    // (stray protocols, spoofed sources) is dropped here and never leaves the emulation.
    const uint32_t src_h = key ? ntohl(key->src) : 0;
    const uint32_t dst_h = key ? ntohl(key->dst) : 0;
    const int dst = static_cast<int>((dst_h >> 8) & 0xff);
    if (!key || (src_h >> 16) != ((10u << 8) | 201u) || (dst_h >> 16) != ((10u << 8) | 201u) ||
        static_cast<int>((src_h >> 8) & 0xff) != src || dst >= regions_ || dst == src) {
      ++invalid_;
      continue;
    }
    std::vector<uint8_t> buf;
    if (!pool_.empty()) {
      buf = std::move(pool_.back());
      pool_.pop_back();
    }
    buf.assign(scratch_.begin(), scratch_.begin() + static_cast<ptrdiff_t>(len));
    Link& link = *links_[size_t(src) * regions_ + dst];
    if (link.Enqueue(now, buf, &*key) != Verdict::kQueued && pool_.size() < kMaxPooled) {
      pool_.push_back(std::move(buf));
    }
  }
}

void Router::Release(int64_t now) {
  const int64_t horizon = now + kReleaseSlackNanos;
  for (int s = 0; s < regions_; ++s) {
    for (int d = 0; d < regions_; ++d) {
      if (s == d) continue;
      Link& link = *links_[size_t(s) * regions_ + d];
      while (auto p = link.PopDue(horizon)) {
        ssize_t w;
        do {
          w = ::write(options_.tun_fds[d], p->data.data(), p->data.size());
        } while (w < 0 && errno == EINTR);
        if (w < 0) ++write_errors_;
        if (pool_.size() < kMaxPooled) pool_.push_back(std::move(p->data));
      }
    }
  }
}

void Router::Publish() {
  RouterStats s;
  s.regions = regions_;
  s.links.assign(regions_, std::vector<LinkStats>(regions_));
  s.params.assign(regions_, std::vector<LinkParams>(regions_));
  const int64_t now = MonotonicNanos();
  for (int a = 0; a < regions_; ++a) {
    for (int b = 0; b < regions_; ++b) {
      if (a == b) continue;
      s.links[a][b] = links_[size_t(a) * regions_ + b]->stats();
      s.links[a][b].backlog_bytes = links_[size_t(a) * regions_ + b]->BacklogBytes(now);
      s.params[a][b] = links_[size_t(a) * regions_ + b]->params();
    }
  }
  s.packets_in = packets_in_;
  s.invalid = invalid_;
  s.write_errors = write_errors_;
  s.max_packet_bytes = max_packet_bytes_;
  s.schedule_applied = next_event_;
  std::lock_guard<std::mutex> lock(mu_);
  published_ = std::move(s);
}

Status Router::SetLink(int src, int dst, const LinkParams& params) {
  if (src < 0 || dst < 0 || src >= regions_ || dst >= regions_ || src == dst) {
    return InvalidArgumentError("no link " + std::to_string(src) + ">" + std::to_string(dst) +
                                " among " + std::to_string(regions_) + " regions");
  }
  std::lock_guard<std::mutex> lock(mu_);
  pending_.push_back(ScheduleEvent{0, src, dst, params});
  return Status::Ok();
}

RouterStats Router::Snapshot() const {
  std::lock_guard<std::mutex> lock(mu_);
  return published_;
}

Status Router::Run() {
  // A WAN link does not pause when the machine is busy, but a router thread that waits for a
  // core does: packets pile up in the TUN queue meanwhile, the link idles, then they all arrive
  // at once and overflow its queue. On a 2-core machine running six gateways and six ranks that
  // cost ~10% of an all-reduce's time and hundreds of drops per run (bench/README.md,
  // 2026-12-06). Real-time priority lets the router preempt them; the kernel's RT throttling
  // (sched_rt_runtime_us) still leaves the others a share should it ever spin.
  sched_param sp{};
  sp.sched_priority = kRealtimePriority;
  if (const int rc = pthread_setschedparam(pthread_self(), SCHED_FIFO, &sp); rc != 0) {
    STRAIT_LOG(kWarn, "wanem") << "router at normal priority (SCHED_FIFO: " << std::strerror(rc)
                               << "): under CPU load the emulated links stall and burst";
  }
  const int64_t start = MonotonicNanos();
  int64_t last_publish = start;
  int64_t last_wake = 0;
  bool use_pwait2 = true;
  epoll_event events[72];
  while (true) {
    int64_t now = MonotonicNanos();
    // Apply every schedule change that is due.
    while (next_event_ < options_.schedule.size() &&
           start + options_.schedule[next_event_].at_ns <= now) {
      const ScheduleEvent& e = options_.schedule[next_event_];
      links_[size_t(e.src) * regions_ + e.dst]->SetParams(e.params, now);
      STRAIT_LOG(kInfo, "wanem") << "schedule t=" << FormatDuration(e.at_ns) << " " << e.src
                                 << ">" << e.dst << ": " << e.params.ToString();
      ++next_event_;
    }
    std::vector<ScheduleEvent> changes;
    {
      std::lock_guard<std::mutex> lock(mu_);
      changes.swap(pending_);
    }
    for (const ScheduleEvent& e : changes) {
      links_[size_t(e.src) * regions_ + e.dst]->SetParams(e.params, now);
      STRAIT_LOG(kInfo, "wanem") << "set " << e.src << ">" << e.dst << ": "
                                 << e.params.ToString();
    }
    Release(now);
    int64_t next = INT64_MAX;
    for (const auto& l : links_) {
      if (l) next = std::min(next, l->NextReleaseNanos());
    }
    if (next_event_ < options_.schedule.size()) {
      next = std::min(next, start + options_.schedule[next_event_].at_ns);
    }
    next = std::min(next, now + kPublishEveryNanos);
    // Under load, read in batches at most kMinWakeGapNanos apart (the first packet after a quiet
    // spell still goes at once).
    if (const int64_t until = last_wake + kMinWakeGapNanos; MonotonicNanos() < until) {
      const timespec ts{static_cast<time_t>(until / 1'000'000'000),
                        static_cast<long>(until % 1'000'000'000)};
      while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, nullptr) == EINTR) {
      }
    }
    last_wake = MonotonicNanos();
    const int64_t wait_ns = std::max<int64_t>(0, next - MonotonicNanos());
    int ready;
    if (use_pwait2) {
      timespec ts{static_cast<time_t>(wait_ns / 1'000'000'000),
                  static_cast<long>(wait_ns % 1'000'000'000)};
      ready = epoll_pwait2(epoll_.get(), events, 72, &ts, nullptr);
      if (ready < 0 && errno == ENOSYS) {
        use_pwait2 = false;
        continue;
      }
    } else {
      ready = epoll_wait(epoll_.get(), events, 72, static_cast<int>((wait_ns + 999'999) /
                                                                    1'000'000));
    }
    if (ready < 0) {
      if (errno == EINTR) continue;
      Publish();
      return InternalError(std::string("epoll_wait: ") + std::strerror(errno));
    }
    now = MonotonicNanos();
    for (int i = 0; i < ready; ++i) {
      const uint32_t id = events[i].data.u32;
      if (id == static_cast<uint32_t>(regions_)) {
        Publish();
        return Status::Ok();
      }
      if (events[i].events & (EPOLLERR | EPOLLHUP)) {
        Publish();
        return InternalError("TUN device of region " + std::to_string(id) + " failed");
      }
      HandleReadable(static_cast<int>(id), now);
    }
    if (now - last_publish >= kPublishEveryNanos) {
      Publish();
      last_publish = now;
    }
  }
}

}  // namespace strait::wanem

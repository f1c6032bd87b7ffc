// UDP echo, TCP goodput and UDP loss probes between region namespaces (see probe.h).
#include "bench/wanem/probe.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <linux/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstddef>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <functional>
#include <future>
#include <thread>

#include "bench/wanem/netns.h"
#include "common/clock.h"

namespace strait::wanem {
namespace {

constexpr uint16_t kEchoPort = 7001;
constexpr uint16_t kLossPort = 7002;
constexpr uint16_t kTcpBasePort = 5201;

std::string Errno(std::string_view what) {
  return std::string(what) + ": " + std::strerror(errno);
}

sockaddr_in Addr(int region, uint16_t port) {
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  a.sin_addr.s_addr = RegionAddressBe(region);
  return a;
}

Status CheckRegion(const RegionNamespaces& ns, int r) {
  if (r < 0 || r >= static_cast<int>(ns.size())) {
    return InvalidArgumentError("no region " + std::to_string(r) + " (there are " +
                                std::to_string(ns.size()) + ")");
  }
  return Status::Ok();
}

// Runs fn on a new thread inside namespace `ns`; the future carries its status.
std::future<Status> InNamespace(std::vector<std::thread>& threads, const std::string& ns,
                                std::function<Status()> fn) {
  auto task = std::make_shared<std::packaged_task<Status()>>([ns, fn = std::move(fn)]() {
    auto guard = NetnsGuard::Enter(ns);
    if (!guard.ok()) return guard.status();
    return fn();
  });
  std::future<Status> f = task->get_future();
  threads.emplace_back([task] { (*task)(); });
  return f;
}

// Waits until fd is ready for `events` or the deadline passes.
bool WaitFd(int fd, short events, const Deadline& deadline) {
  while (!deadline.Expired()) {
    pollfd p{fd, events, 0};
    const int ms = static_cast<int>(std::min<int64_t>(deadline.RemainingNanos() / 1'000'000 + 1,
                                                      100));
    const int rc = poll(&p, 1, ms);
    if (rc > 0) return true;
    if (rc < 0 && errno != EINTR) return false;
  }
  return false;
}

// tcpi_bytes_received of a TCP socket, or `fallback` where the kernel lacks it.
uint64_t KernelBytesReceived(int fd, uint64_t fallback) {
  tcp_info info{};
  socklen_t len = sizeof(info);
  if (getsockopt(fd, IPPROTO_TCP, TCP_INFO, &info, &len) != 0 ||
      len < offsetof(tcp_info, tcpi_bytes_received) + sizeof(info.tcpi_bytes_received)) {
    return fallback;
  }
  return info.tcpi_bytes_received;
}

Status JoinAll(std::vector<std::thread>& threads, std::vector<std::future<Status>>& results) {
  for (auto& t : threads) t.join();
  Status first;
  for (auto& f : results) {
    Status s = f.get();
    if (!s.ok() && first.ok()) first = s;
  }
  return first;
}

}  // namespace

StatusOr<RttResult> MeasureUdpRtt(const RegionNamespaces& ns, int from, int to, int count,
                                  int64_t interval_ns) {
  STRAIT_RETURN_IF_ERROR(CheckRegion(ns, from));
  STRAIT_RETURN_IF_ERROR(CheckRegion(ns, to));
  if (count < 1 || count > 100000) return InvalidArgumentError("RTT probe count out of range");
  std::atomic<bool> done{false};
  std::promise<void> ready;
  std::future<void> ready_f = ready.get_future();
  std::vector<std::thread> threads;
  std::vector<std::future<Status>> results;
  const Deadline overall =
      Deadline::After(int64_t(count) * (interval_ns + 1'000'000'000) + 5'000'000'000);
  results.push_back(InNamespace(threads, ns[to], [&]() -> Status {
    UniqueFd s(socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0));
    sockaddr_in a = Addr(to, kEchoPort);
    if (!s.valid() || bind(s.get(), reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) {
      done = true;
      ready.set_value();
      return InternalError(Errno("echo server bind"));
    }
    ready.set_value();
    char buf[2048];
    while (!done.load() && !overall.Expired()) {
      if (!WaitFd(s.get(), POLLIN, Deadline::After(50'000'000))) continue;
      sockaddr_in peer{};
      socklen_t len = sizeof(peer);
      const ssize_t n = recvfrom(s.get(), buf, sizeof(buf), MSG_DONTWAIT,
                                 reinterpret_cast<sockaddr*>(&peer), &len);
      if (n > 0) {
        sendto(s.get(), buf, size_t(n), 0, reinterpret_cast<sockaddr*>(&peer), len);
      }
    }
    return Status::Ok();
  }));
  ready_f.wait();
  std::vector<double> rtts;
  int lost = 0;
  results.push_back(InNamespace(threads, ns[from], [&]() -> Status {
    UniqueFd s(socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0));
    sockaddr_in a = Addr(to, kEchoPort);
    if (!s.valid() || connect(s.get(), reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) {
      done = true;
      return InternalError(Errno("echo client connect"));
    }
    for (int i = 0; i < count && !done.load(); ++i) {
      const int64_t sent = MonotonicNanos();
      uint64_t msg[8] = {uint64_t(i), uint64_t(sent)};
      if (send(s.get(), msg, sizeof(msg), 0) < 0) {
        done = true;
        return InternalError(Errno("echo send"));
      }
      const Deadline wait = Deadline::After(1'000'000'000);
      bool got = false;
      while (!got && WaitFd(s.get(), POLLIN, wait)) {
        uint64_t reply[8];
        const ssize_t n = recv(s.get(), reply, sizeof(reply), MSG_DONTWAIT);
        if (n == sizeof(reply) && reply[0] == uint64_t(i)) {
          rtts.push_back(double(MonotonicNanos() - sent) * 1e-6);
          got = true;
        }
      }
      if (!got) ++lost;
      const int64_t next = sent + interval_ns;
      while (MonotonicNanos() < next) {
        usleep(static_cast<useconds_t>(std::max<int64_t>(1, (next - MonotonicNanos()) / 1000)));
      }
    }
    done = true;
    return Status::Ok();
  }));
  STRAIT_RETURN_IF_ERROR(JoinAll(threads, results));
  RttResult r;
  r.samples = static_cast<int>(rtts.size());
  r.lost = lost;
  if (rtts.empty()) return UnavailableError("no UDP echo came back (all " +
                                            std::to_string(count) + " lost)");
  std::sort(rtts.begin(), rtts.end());
  r.min_ms = rtts.front();
  r.max_ms = rtts.back();
  r.median_ms = rtts[rtts.size() / 2];
  return r;
}

StatusOr<std::vector<GoodputResult>> MeasureTcpGoodput(const RegionNamespaces& ns,
                                                       const std::vector<Flow>& flows,
                                                       int64_t warmup_ns, int64_t window_ns) {
  if (flows.empty() || flows.size() > 256) return InvalidArgumentError("need 1..256 flows");
  for (const Flow& f : flows) {
    STRAIT_RETURN_IF_ERROR(CheckRegion(ns, f.src));
    STRAIT_RETURN_IF_ERROR(CheckRegion(ns, f.dst));
    if (f.src == f.dst) return InvalidArgumentError("a flow needs two different regions");
  }
  const size_t n = flows.size();
  std::vector<GoodputResult> out(n);
  std::vector<std::promise<void>> ready(n);
  std::vector<std::thread> threads;
  std::vector<std::future<Status>> results;
  std::vector<std::atomic<bool>> receiver_done(n);
  const Deadline overall = Deadline::After(warmup_ns + window_ns + 10'000'000'000);

  for (size_t k = 0; k < n; ++k) {
    const Flow f = flows[k];
    const uint16_t port = static_cast<uint16_t>(kTcpBasePort + k);
    out[k].flow = f;
    results.push_back(InNamespace(threads, ns[f.dst], [&, f, k, port]() -> Status {
      UniqueFd l(socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
      const int one = 1;
      setsockopt(l.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
      sockaddr_in a = Addr(f.dst, port);
      if (!l.valid() || bind(l.get(), reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 ||
          listen(l.get(), 4) != 0) {
        ready[k].set_value();
        receiver_done[k] = true;
        return InternalError(Errno("goodput receiver listen"));
      }
      ready[k].set_value();
      if (!WaitFd(l.get(), POLLIN, Deadline::After(10'000'000'000))) {
        receiver_done[k] = true;
        return DeadlineExceededError("goodput receiver: no connection within 10 s");
      }
      UniqueFd c(accept4(l.get(), nullptr, nullptr, SOCK_CLOEXEC));
      if (!c.valid()) {
        receiver_done[k] = true;
        return InternalError(Errno("accept"));
      }
      std::vector<char> buf(256 * 1024);
      uint64_t total = 0;
      int64_t t0 = 0, t1 = 0, t2 = 0;
      uint64_t b1 = 0, b2 = 0;
      while (!overall.Expired()) {
        if (!WaitFd(c.get(), POLLIN, overall)) break;
        const ssize_t got = recv(c.get(), buf.data(), buf.size(), MSG_DONTWAIT);
        if (got == 0) break;
        if (got < 0) {
          if (errno == EAGAIN || errno == EINTR) continue;
          break;
        }
        total += uint64_t(got);
        const int64_t now = MonotonicNanos();
        if (t0 == 0) t0 = now;
        // The kernel's count of bytes received, not what this thread has read so far: a reader
        // that was descheduled for a while must not make the window look faster than the link.
        if (t1 == 0 && now >= t0 + warmup_ns) {
          t1 = now;
          b1 = KernelBytesReceived(c.get(), total);
        }
        if (t1 != 0 && now >= t1 + window_ns) {
          t2 = now;
          b2 = KernelBytesReceived(c.get(), total);
          break;
        }
      }
      receiver_done[k] = true;
      if (t2 == 0) {
        return DeadlineExceededError("flow " + std::to_string(f.src) + ">" +
                                     std::to_string(f.dst) + " ended early after " +
                                     std::to_string(total) + " bytes");
      }
      out[k].bytes = b2 - b1;
      out[k].seconds = double(t2 - t1) * 1e-9;
      out[k].bits_per_second = double(b2 - b1) * 8.0 / out[k].seconds;
      return Status::Ok();
    }));
  }
  for (auto& r : ready) r.get_future().wait();
  for (size_t k = 0; k < n; ++k) {
    const Flow f = flows[k];
    const uint16_t port = static_cast<uint16_t>(kTcpBasePort + k);
    results.push_back(InNamespace(threads, ns[f.src], [&, f, k, port]() -> Status {
      UniqueFd s(socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
      sockaddr_in a = Addr(f.dst, port);
      if (!s.valid()) return InternalError(Errno("socket"));
      if (connect(s.get(), reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 &&
          errno != EINPROGRESS) {
        return InternalError(Errno("goodput connect"));
      }
      std::vector<char> buf(256 * 1024, 'x');
      while (!receiver_done[k].load() && !overall.Expired()) {
        if (!WaitFd(s.get(), POLLOUT, Deadline::After(100'000'000))) continue;
        const ssize_t w = send(s.get(), buf.data(), buf.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
        if (w < 0 && errno != EAGAIN && errno != EINTR) break;  // Receiver closed.
      }
      return Status::Ok();
    }));
  }
  STRAIT_RETURN_IF_ERROR(JoinAll(threads, results));
  return out;
}

StatusOr<UdpLossResult> MeasureUdpLoss(const RegionNamespaces& ns, int from, int to, int packets,
                                       int payload, int packets_per_second) {
  STRAIT_RETURN_IF_ERROR(CheckRegion(ns, from));
  STRAIT_RETURN_IF_ERROR(CheckRegion(ns, to));
  if (packets < 1 || packets > 10'000'000 || payload < 8 || payload > 1400 ||
      packets_per_second < 1) {
    return InvalidArgumentError("UDP loss probe: packets 1..1e7, payload 8..1400, rate >= 1");
  }
  std::promise<void> ready;
  std::future<void> ready_f = ready.get_future();
  std::atomic<int64_t> sender_finished{0};
  std::vector<uint8_t> seen(size_t(packets), 0);
  std::vector<std::thread> threads;
  std::vector<std::future<Status>> results;
  const Deadline overall =
      Deadline::After(int64_t(packets) * 1'000'000'000 / packets_per_second + 10'000'000'000);
  results.push_back(InNamespace(threads, ns[to], [&]() -> Status {
    UniqueFd s(socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0));
    sockaddr_in a = Addr(to, kLossPort);
    const int big = 8 << 20;
    setsockopt(s.get(), SOL_SOCKET, SO_RCVBUF, &big, sizeof(big));
    if (!s.valid() || bind(s.get(), reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) {
      ready.set_value();
      return InternalError(Errno("loss receiver bind"));
    }
    ready.set_value();
    std::vector<char> buf(2048);
    while (!overall.Expired()) {
      const int64_t fin = sender_finished.load();
      // Stragglers get one second after the last datagram left (delays here are < 1 s).
      if (fin != 0 && MonotonicNanos() > fin + 1'000'000'000) break;
      if (!WaitFd(s.get(), POLLIN, Deadline::After(50'000'000))) continue;
      const ssize_t n = recv(s.get(), buf.data(), buf.size(), MSG_DONTWAIT);
      if (n >= 8) {
        uint64_t seq;
        std::memcpy(&seq, buf.data(), 8);
        if (seq < seen.size()) seen[seq] = 1;
      }
    }
    return Status::Ok();
  }));
  ready_f.wait();
  results.push_back(InNamespace(threads, ns[from], [&]() -> Status {
    UniqueFd s(socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0));
    sockaddr_in a = Addr(to, kLossPort);
    if (!s.valid() || connect(s.get(), reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) {
      sender_finished = MonotonicNanos();
      return InternalError(Errno("loss sender connect"));
    }
    std::vector<char> buf(size_t(payload), 0);
    const int64_t start = MonotonicNanos();
    for (int i = 0; i < packets && !overall.Expired(); ++i) {
      const int64_t due = start + int64_t(i) * 1'000'000'000 / packets_per_second;
      while (MonotonicNanos() < due) {
        usleep(static_cast<useconds_t>(std::max<int64_t>(1, (due - MonotonicNanos()) / 1000)));
      }
      const uint64_t seq = uint64_t(i);
      std::memcpy(buf.data(), &seq, 8);
      send(s.get(), buf.data(), buf.size(), 0);
    }
    sender_finished = MonotonicNanos();
    return Status::Ok();
  }));
  STRAIT_RETURN_IF_ERROR(JoinAll(threads, results));
  UdpLossResult r;
  r.sent = uint64_t(packets);
  for (uint8_t v : seen) r.received += v;
  r.loss = 1.0 - double(r.received) / double(r.sent);
  return r;
}

}  // namespace strait::wanem

// `strait-bench allreduce`'s baseline (`--baseline ring`, hidden `--rank-role ring`): an
// uncompressed flat ring all-reduce over plain TCP between the rank processes, on the same
// links as the mesh. See allreduce_internal.h.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <iostream>
#include <thread>

#include "bench/allreduce_internal.h"
#include "common/hash.h"
#include "bench/gradient.h"

namespace strait::bench::allreduce {

namespace {

StatusOr<sockaddr_in> ToSockaddr(const std::string& host_port) {
  StatusOr<gateway::HostPort> hp = gateway::ParseHostPort(host_port);
  if (!hp.ok()) return std::move(hp).status();
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(hp->port);
  if (::inet_pton(AF_INET, hp->host.c_str(), &a.sin_addr) != 1) {
    return InvalidArgumentError("not an IPv4 address: " + hp->host);
  }
  return a;
}

bool SendAll(int fd, const void* p, size_t n) {
  const auto* b = static_cast<const uint8_t*>(p);
  while (n > 0) {
    const ssize_t k = ::send(fd, b, n, MSG_NOSIGNAL);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) return false;
    b += k;
    n -= static_cast<size_t>(k);
  }
  return true;
}

bool RecvAll(int fd, void* p, size_t n) {
  auto* b = static_cast<uint8_t*>(p);
  while (n > 0) {
    const ssize_t k = ::recv(fd, b, n, 0);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) return false;
    b += k;
    n -= static_cast<size_t>(k);
  }
  return true;
}

// Accepts the previous rank and connects to the next; returns {prev_fd, next_fd}.
StatusOr<std::pair<int, int>> ConnectRing(const std::vector<std::string>& addrs, int pos) {
  const int p = static_cast<int>(addrs.size());
  StatusOr<sockaddr_in> self = ToSockaddr(addrs[static_cast<size_t>(pos)]);
  StatusOr<sockaddr_in> next = ToSockaddr(addrs[static_cast<size_t>((pos + 1) % p)]);
  if (!self.ok()) return std::move(self).status();
  if (!next.ok()) return std::move(next).status();
  const int lfd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  const int one = 1;
  ::setsockopt(lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (::bind(lfd, reinterpret_cast<const sockaddr*>(&*self), sizeof(*self)) != 0 ||
      ::listen(lfd, 4) != 0) {
    const std::string why = std::strerror(errno);
    ::close(lfd);
    return UnavailableError("ring: cannot listen on " + addrs[static_cast<size_t>(pos)] + ": " +
                            why);
  }
  int nfd = -1;
  const Deadline deadline = Deadline::AfterSeconds(60);
  std::thread dialer([&] {
    while (!deadline.Expired()) {
      nfd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
      if (::connect(nfd, reinterpret_cast<const sockaddr*>(&*next), sizeof(*next)) == 0) return;
      ::close(nfd);
      nfd = -1;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  });
  const int pfd = ::accept4(lfd, nullptr, nullptr, SOCK_CLOEXEC);
  dialer.join();
  ::close(lfd);
  if (pfd < 0 || nfd < 0) {
    if (pfd >= 0) ::close(pfd);
    if (nfd >= 0) ::close(nfd);
    return UnavailableError("ring: cannot connect the ring at position " + std::to_string(pos));
  }
  ::setsockopt(nfd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  return std::make_pair(pfd, nfd);
}

// In-place ring all-reduce (reduce-scatter then all-gather) of fp32 sums: each chunk is summed
// along the ring once and then copied, so every rank ends with the same bits.
bool RingAllReduce(float* data, size_t count, int p, int pos, int prev_fd, int next_fd,
                   std::vector<float>& scratch) {
  auto chunk = [&](int c) { return Slice(count, p, ((c % p) + p) % p); };
  for (int phase = 0; phase < 2; ++phase) {
    for (int s = 0; s < p - 1; ++s) {
      const auto [sb, se] = chunk(phase == 0 ? pos - s : pos + 1 - s);
      const auto [rb, re] = chunk(phase == 0 ? pos - s - 1 : pos - s);
      bool sent = false;
      std::thread sender(
          [&, sb = sb, se = se] { sent = SendAll(next_fd, data + sb, (se - sb) * 4); });
      float* dst = phase == 0 ? scratch.data() : data + rb;
      const bool got = RecvAll(prev_fd, dst, (re - rb) * 4);
      sender.join();
      if (!sent || !got) return false;
      if (phase == 0) {
        for (size_t i = 0; i < re - rb; ++i) data[rb + i] += scratch[i];
      }
    }
  }
  return true;
}

}  // namespace

int RunRingRank(const Flags& f) {
  const std::vector<std::string> addrs = SplitList(f.ring_addrs);
  const int p = static_cast<int>(addrs.size());
  const int pos = f.rank_region * f.ranks_per_region + f.rank_index;
  StatusOr<std::pair<int, int>> fds = ConnectRing(addrs, pos);
  if (!fds.ok()) {
    std::cerr << fds.status() << '\n';
    return kExitFailure;
  }
  const size_t count = f.size / 4;
  // The same data as the mesh run: this rank holds slice rank_index of its region's tensor
  // (zeros elsewhere), so the ring's sum equals the mesh's.
  std::vector<float> input(count, 0.0f), data(count), scratch(count / static_cast<size_t>(p) + 1);
  {
    std::vector<float> full(count);
    FillGradient(RegionSeed(f.rank_region), full);
    const auto [b, e] = Slice(count, f.ranks_per_region, f.rank_index);
    std::copy(full.begin() + static_cast<ptrdiff_t>(b), full.begin() + static_cast<ptrdiff_t>(e),
              input.begin() + static_cast<ptrdiff_t>(b));
  }
  Json times = Json::array(), starts = Json::array();
  for (int it = 0; it < f.warmup + f.iters; ++it) {
    data = input;
    if (!f.barrier.empty()) {
      const Status b = IterationBarrier(f.barrier, pos, p, it, Deadline::AfterSeconds(f.timeout_s));
      if (!b.ok()) {
        std::cerr << "ring rank " << pos << ": " << b << '\n';
        return kExitFailure;
      }
    }
    const int64_t t0 = MonotonicNanos();
    if (!RingAllReduce(data.data(), count, p, pos, fds->first, fds->second, scratch)) {
      std::cerr << "ring rank " << pos << ": connection lost in iteration " << it << '\n';
      return kExitFailure;
    }
    const int64_t t1 = MonotonicNanos();
    if (it >= f.warmup) {
      times.push_back(t1 - t0);
      starts.push_back(t0);
    }
    Emit("progress " + std::to_string(it + 1));
  }
  ::close(fds->first);
  ::close(fds->second);
  const Check c =
      CheckAgainstReference(data.data(), count, 0, count, f.regions, 0, DataType::kFloat32);
  Json out;
  out["region"] = f.rank_region;
  out["rank"] = f.rank_index;
  out["policy"] = "none (flat ring, plain TCP)";
  out["times_ns"] = times;
  out["starts_ns"] = starts;
  out["wan_bytes_sent"] = 0;
  out["max_error"] = c.max_error;
  out["wrong"] = c.wrong;
  out["hash"] = Hex(Fnv1a64(data.data(), data.size() * 4));
  Emit("result " + out.dump());
  return kExitOk;
}

}  // namespace strait::bench::allreduce

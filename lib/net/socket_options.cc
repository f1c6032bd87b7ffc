// setsockopt/getsockopt wrappers for WAN streams (see socket_options.h).
#include "net/socket_options.h"

// <linux/tcp.h> rather than <netinet/tcp.h>: glibc's struct tcp_info stops before tcpi_min_rtt.
#include <linux/tcp.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstring>
#include <fstream>
#include <string>

namespace strait::net {
namespace {

Status Errno(const std::string& what) {
  return InternalError(what + ": " + std::strerror(errno));
}

}  // namespace

std::string AvailableCongestionControls() {
  std::ifstream in("/proc/sys/net/ipv4/tcp_available_congestion_control");
  std::string line;
  std::getline(in, line);
  return line;
}

Status SetCongestionControl(int fd, std::string_view name) {
  if (name.empty()) return Status::Ok();
  const std::string n(name);
  if (setsockopt(fd, IPPROTO_TCP, TCP_CONGESTION, n.data(), static_cast<socklen_t>(n.size())) ==
      0) {
    return Status::Ok();
  }
  if (errno == ENOENT || errno == EPERM) {
    return InvalidArgumentError("congestion control '" + n +
                                "' is not available in this kernel; it offers: " +
                                AvailableCongestionControls());
  }
  return Errno("setsockopt(TCP_CONGESTION, " + n + ")");
}

Status CheckCongestionControl(std::string_view name) {
  if (name.empty()) return Status::Ok();
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return Errno("socket");
  Status status = SetCongestionControl(fd, name);
  close(fd);
  return status;
}

Status SetNotSentLowat(int fd, uint32_t bytes) {
  if (bytes == 0) return Status::Ok();
  const int value = static_cast<int>(bytes);
  if (setsockopt(fd, IPPROTO_TCP, TCP_NOTSENT_LOWAT, &value, sizeof(value)) != 0) {
    return Errno("setsockopt(TCP_NOTSENT_LOWAT)");
  }
  return Status::Ok();
}

// Linux 6.15's <linux/tcp.h>; Debian 12's headers predate it.
#ifndef TCP_RTO_MAX_MS
#define TCP_RTO_MAX_MS 44
#endif

Status SetTcpRtoMax(int fd, int64_t nanos) {
  if (nanos == 0) return Status::Ok();
  if (nanos < kMinTcpRtoMaxNs || nanos > kMaxTcpRtoMaxNs) {
    return InvalidArgumentError("TCP_RTO_MAX_MS: " + std::to_string(nanos) +
                                " ns is outside 1 s .. 120 s");
  }
  const int ms = static_cast<int>(nanos / 1'000'000);
  if (setsockopt(fd, IPPROTO_TCP, TCP_RTO_MAX_MS, &ms, sizeof(ms)) == 0 || errno == ENOPROTOOPT) {
    return Status::Ok();
  }
  return Errno("setsockopt(TCP_RTO_MAX_MS)");
}

StatusOr<int64_t> GetTcpRtoMax(int fd) {
  int ms = 0;
  socklen_t len = sizeof(ms);
  if (getsockopt(fd, IPPROTO_TCP, TCP_RTO_MAX_MS, &ms, &len) != 0) {
    if (errno == ENOPROTOOPT) return UnimplementedError("this kernel has no TCP_RTO_MAX_MS");
    return Errno("getsockopt(TCP_RTO_MAX_MS)");
  }
  return int64_t{ms} * 1'000'000;
}

Status SetMaxPacingRate(int fd, uint64_t bytes_per_second) {
  // The kernel's "no cap" is all ones (~0UL); it takes an unsigned long since Linux 4.20.
  const unsigned long value = bytes_per_second == 0 ? ~0UL : bytes_per_second;
  if (setsockopt(fd, SOL_SOCKET, SO_MAX_PACING_RATE, &value, sizeof(value)) != 0) {
    return Errno("setsockopt(SO_MAX_PACING_RATE)");
  }
  return Status::Ok();
}

Status SetNoDelay(int fd) {
  const int one = 1;
  if (setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one)) != 0) {
    return Errno("setsockopt(TCP_NODELAY)");
  }
  return Status::Ok();
}

StatusOr<TcpInfo> ReadTcpInfo(int fd) {
  tcp_info info{};
  socklen_t len = sizeof(info);
  if (getsockopt(fd, IPPROTO_TCP, TCP_INFO, &info, &len) != 0) return Errno("TCP_INFO");
  TcpInfo out;
  out.rtt_ns = static_cast<int64_t>(info.tcpi_rtt) * 1000;
  // Older kernels return a shorter struct: the field is then absent, not zero. Before its
  // first sample the kernel reports ~0U.
  if (len >= offsetof(tcp_info, tcpi_min_rtt) + sizeof(info.tcpi_min_rtt) &&
      info.tcpi_min_rtt != 0 && info.tcpi_min_rtt != ~0u) {
    out.min_rtt_ns = static_cast<int64_t>(info.tcpi_min_rtt) * 1000;
  }
  out.total_retrans = info.tcpi_total_retrans;
  if (len >= offsetof(tcp_info, tcpi_max_pacing_rate) + sizeof(info.tcpi_max_pacing_rate) &&
      info.tcpi_max_pacing_rate != ~uint64_t{0}) {
    out.max_pacing_bytes_per_s = info.tcpi_max_pacing_rate;
  }
  return out;
}

std::string WanHostTuningAdvice() {
  std::ifstream in("/proc/sys/net/ipv4/tcp_slow_start_after_idle");
  int value = 0;
  if (!(in >> value) || value == 0) return "";
  return "net.ipv4.tcp_slow_start_after_idle=1: every all-reduce after an idle gap (a compute "
         "phase) restarts TCP slow start on the WAN links and runs below the link rate; set it "
         "to 0 on gateway hosts (sysctl -w net.ipv4.tcp_slow_start_after_idle=0, or "
         "/etc/sysctl.d/; in Kubernetes with hostNetwork it is the node's setting, not a pod "
         "sysctl: see deploy/README.md)";
}

}  // namespace strait::net

// TCP socket options a WAN stream needs, on a raw file descriptor, reported as Status.
#ifndef STRAIT_LIB_NET_SOCKET_OPTIONS_H_
#define STRAIT_LIB_NET_SOCKET_OPTIONS_H_

#include <cstdint>
#include <string>
#include <string_view>

#include "strait/status.h"

namespace strait::net {

// Checks that the kernel offers congestion control `name` (e.g. "bbr", "cubic", "reno") by
// setting it on a throwaway socket; the error lists what the kernel has. "" is always OK (the
// system default). Does not block.
Status CheckCongestionControl(std::string_view name);
// Sets TCP_CONGESTION on `fd`; "" leaves the default.
Status SetCongestionControl(int fd, std::string_view name);
// Sets TCP_NOTSENT_LOWAT so that the socket reports writable only while less than `bytes` wait
// unsent in the kernel; 0 leaves it unset. Keeps per-stream queues short so that chunks go to
// the streams that are actually moving.
Status SetNotSentLowat(int fd, uint32_t bytes);
// The bounds the kernel takes for TCP_RTO_MAX_MS.
inline constexpr int64_t kMinTcpRtoMaxNs = 1'000'000'000;
inline constexpr int64_t kMaxTcpRtoMaxNs = 120'000'000'000;
// Caps the socket's retransmission timeout at `nanos` (TCP_RTO_MAX_MS, whole milliseconds within
// the bounds above); 0 leaves the kernel's. A kernel without the option (before Linux 6.15) is
// not an error: the cap is a recovery speed-up, and the kernel's 120 s still works.
Status SetTcpRtoMax(int fd, int64_t nanos);
// The socket's TCP_RTO_MAX_MS in nanoseconds; kUnimplemented on a kernel without it.
StatusOr<int64_t> GetTcpRtoMax(int fd);
Status SetNoDelay(int fd);

struct TcpInfo {
  int64_t rtt_ns = 0;      // smoothed (tcpi_rtt)
  int64_t min_rtt_ns = 0;  // windowed minimum (tcpi_min_rtt; Linux 4.6+)
  uint64_t total_retrans = 0;
  uint64_t max_pacing_bytes_per_s = 0;  // tcpi_max_pacing_rate; 0 = no cap (or not reported)
};
// SO_MAX_PACING_RATE: the socket sends at most this many bytes per second, spread evenly
// (TCP's own pacing, whatever the congestion control); 0 removes the cap.
Status SetMaxPacingRate(int fd, uint64_t bytes_per_second);
// Reads TCP_INFO; zeros where the kernel does not say.
StatusOr<TcpInfo> ReadTcpInfo(int fd);

// The kernel's list, e.g. "reno bbr cubic"; "" if unreadable.
std::string AvailableCongestionControls();

// Host settings that cost a WAN link throughput, one line each ("" when none is found), for
// the gateway to warn about at start. Today: net.ipv4.tcp_slow_start_after_idle=1 (the Linux
// default), which drops a stream's congestion window back to its initial 10 packets after one
// retransmission timeout of silence -- i.e. before every all-reduce that follows a compute
// phase, so each one begins in slow start (a 12 MiB int8 all-reduce over 3 regions at
// 100 Mbit/s and 40 ms RTT: 406 ms with it, 300 ms without). Reads the calling thread's
// network namespace.
std::string WanHostTuningAdvice();

}  // namespace strait::net

#endif  // STRAIT_LIB_NET_SOCKET_OPTIONS_H_

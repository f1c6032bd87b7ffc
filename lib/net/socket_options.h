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
Status SetNoDelay(int fd);

struct TcpInfo {
  int64_t rtt_ns = 0;      // smoothed (tcpi_rtt)
  int64_t min_rtt_ns = 0;  // windowed minimum (tcpi_min_rtt; Linux 4.6+)
  uint64_t total_retrans = 0;
};
// Reads TCP_INFO; zeros where the kernel does not say.
StatusOr<TcpInfo> ReadTcpInfo(int fd);

// The kernel's list, e.g. "reno bbr cubic"; "" if unreadable.
std::string AvailableCongestionControls();

}  // namespace strait::net

#endif  // STRAIT_LIB_NET_SOCKET_OPTIONS_H_
